"""torch.distributed through braid: init methods, subgroups, asynchrony, Work.wait(timeout),
refusals before any data moves, non-contiguous tensors, send/recv with tags."""

import datetime
import os
import tempfile
import time

import pytest
import torch

from common import init, run_world


def subgroups(rank, size):
    dist = init()
    odd = dist.new_group([1, 2])  # group-local ranks 0 and 1
    every = dist.new_group(list(range(size)))
    out = {}
    if rank in (1, 2):
        t = torch.full((5,), float(rank))
        dist.all_reduce(t, group=odd)
        out["odd_sum"] = t.tolist()
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=2, group=odd)  # global rank 2 is the root
        out["odd_bcast"] = b.tolist()
        out["group_rank"] = dist.get_rank(odd)
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t, group=every)
    out["every"] = t.tolist()
    dist.destroy_process_group()
    return out


def test_new_group_has_its_own_communicator_and_local_ranks():
    out = run_world(subgroups, 3)
    for r in (1, 2):
        assert out[r]["odd_sum"] == [3.0] * 5
        assert out[r]["odd_bcast"] == [2.0] * 3
        assert out[r]["group_rank"] == r - 1
    assert all(o["every"] == [6.0] * 4 for o in out)


def with_init_method(rank, size, method):
    import braid_torch  # noqa: F401
    import torch.distributed as dist

    dist.init_process_group("braid", init_method=method, rank=rank, world_size=size)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


@pytest.mark.parametrize("kind", ["env", "tcp", "file"])
def test_every_init_method(kind, tmp_path):
    from common import free_port

    if kind == "env":
        method = "env://"
    elif kind == "tcp":
        method = f"tcp://127.0.0.1:{free_port()}"
    else:
        method = f"file://{tmp_path}/rendezvous"
    assert run_world(with_init_method, 3, method) == [6.0, 6.0, 6.0]


def asynchrony(rank, size):
    dist = init()
    ts = [torch.full((1000,), float(rank + k)) for k in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    chained = futs[3].then(lambda f: f.value()[0].sum().item())
    for w in reversed(works):
        w.wait()
    ok = all(bool((ts[k] == sum(r + k for r in range(size))).all()) for k in range(8))
    val = chained.wait()
    # Work.wait(timeout) honours its argument: rank 1 joins the call 3 s late.
    late = torch.ones(10)
    if rank == 1:
        time.sleep(3)
    w = dist.all_reduce(late, async_op=True)
    waited, msg = None, ""
    if rank == 0:
        t0 = time.monotonic()
        try:
            w.wait(datetime.timedelta(milliseconds=300))
        except RuntimeError as e:
            msg = str(e)
        waited = time.monotonic() - t0
    w.wait()
    dist.destroy_process_group()
    return {"ok": ok, "chained": val, "waited": waited, "msg": msg, "late": late.tolist()}


def test_async_work_future_and_wait_timeout():
    out = run_world(asynchrony, 2)
    assert all(o["ok"] for o in out)
    assert out[0]["chained"] == 1000 * (3 + 4)
    assert 0.25 < out[0]["waited"] < 2.0, out[0]["waited"]
    assert "300 ms" in out[0]["msg"] and "all_reduce" in out[0]["msg"], out[0]["msg"]
    assert out[0]["late"] == [2.0] * 10 and out[1]["late"] == [2.0] * 10


def refusals(rank, size):
    dist = init()
    msgs = {}
    cases = {
        "band_float": lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND),
        "avg_bool": lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG),
        "max_complex": lambda: dist.all_reduce(torch.ones(3, dtype=torch.complex64), op=dist.ReduceOp.MAX),
        "min_complex_reduce": lambda: dist.reduce(torch.ones(3, dtype=torch.complex64), 0, op=dist.ReduceOp.MIN),
        "premul_int": lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0)),
        "uneven_all_gather": lambda: dist.all_gather([torch.ones(2), torch.ones(3)], torch.ones(2)),
        "bad_root": lambda: dist.broadcast(torch.ones(2), 7),
    }
    for k, f in cases.items():
        t0 = time.monotonic()
        try:
            f()
            msgs[k] = None
        except (RuntimeError, ValueError) as e:  # torch itself refuses some (MAX on complex) with ValueError
            msgs[k] = (str(e), time.monotonic() - t0)
    # The group still works, with a non-contiguous tensor too.
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    dist.all_reduce(t)
    want = (torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * size).tolist()
    dist.destroy_process_group()
    return {"msgs": msgs, "ok": t.tolist() == want}


def test_unsupported_input_raises_before_any_data_moves():
    out = run_world(refusals, 2)
    for o in out:
        assert o["ok"]
        for k, v in o["msgs"].items():
            assert v is not None, f"{k} did not raise"
            msg, secs = v
            assert "braid" in msg or k in ("bad_root", "max_complex"), (k, msg)
            assert secs < 1.0, (k, secs)
    assert "BAND" in out[0]["msgs"]["band_float"][0] and "Float" in out[0]["msgs"]["band_float"][0]


def point_to_point(rank, size):
    dist = init()
    got = {}
    # isend/irecv both ways at once, two tags, posted in opposite orders: no rank waits for the other's order.
    peer = 1 - rank
    a = torch.full((100,), float(rank))
    b = torch.full((100000,), float(10 + rank))
    ra, rb = torch.empty(100), torch.empty(100000)
    if rank == 0:
        ws = [dist.isend(a, peer, tag=1), dist.isend(b, peer, tag=2), dist.irecv(rb, peer, tag=2), dist.irecv(ra, peer, tag=1)]
    else:
        ws = [dist.irecv(rb, peer, tag=2), dist.irecv(ra, peer, tag=1), dist.isend(b, peer, tag=2), dist.isend(a, peer, tag=1)]
    for w in ws:
        w.wait()
    got["a"] = bool((ra == peer).all())
    got["b"] = bool((rb == 10 + peer).all())
    ops = [dist.P2POp(dist.isend, torch.full((7,), float(rank)), peer), dist.P2POp(dist.irecv, torch.empty(7), peer)]
    reqs = dist.batch_isend_irecv(ops)
    for r in reqs:
        r.wait()
    got["batch"] = ops[1].tensor.tolist() == [float(peer)] * 7
    dist.destroy_process_group()
    return got


@pytest.mark.parametrize("hosts", [None, [0, 1]], ids=["one-host", "two-hosts"])
def test_send_recv_with_tags(hosts):
    out = run_world(point_to_point, 2, hosts=hosts)
    assert all(all(o.values()) for o in out), out


def coalesced(rank, size):
    dist = init()
    ts = [torch.full((n,), float(rank + 1)) for n in (3, 1000, 1)]
    dist.all_reduce_coalesced(ts)
    ok = all(bool((t == size * (size + 1) / 2).all()) for t in ts)
    outs = [[torch.empty(n) for n in (3, 5)] for _ in range(size)]
    dist.all_gather_coalesced(outs, [torch.full((3,), float(rank)), torch.full((5,), float(-rank))])
    ok2 = all(outs[r][0].tolist() == [float(r)] * 3 and outs[r][1].tolist() == [float(-r)] * 5 for r in range(size))
    dist.destroy_process_group()
    return ok and ok2


def test_coalesced_forms():
    assert all(run_world(coalesced, 3))


def any_source(rank, size):
    dist = init()
    got = []
    if rank == 0:
        # One receive naming rank 1 first, then receives from any source for the rest.
        t = torch.empty(3)
        dist.recv(t, src=1, tag=5)
        got.append(("named", 1, t[0].item()))
        for _ in range(2 * (size - 1) - 1):
            t = torch.empty(3)
            src = dist.recv(t, tag=5)
            got.append(("any", src, t[0].item()))
    else:
        for k in range(2):
            dist.send(torch.full((3,), float(10 * rank + k)), 0, tag=5)
    dist.barrier()
    dist.destroy_process_group()
    return got


def test_recv_from_any_source():
    out = run_world(any_source, 3, env={"BRAID_ANY_SOURCE": "1"})
    got = out[0]
    assert got[0] == ("named", 1, 10.0)
    assert sorted((s, v) for _, s, v in got[1:]) == [(1, 11.0), (2, 20.0), (2, 21.0)], got
    # Messages of one sender arrive in the order it sent them.
    from_2 = [v for _, s, v in got if s == 2]
    assert from_2 == [20.0, 21.0]


def any_source_refused(rank, size):
    dist = init()
    msg = None
    if rank == 0:
        try:
            dist.recv(torch.empty(1))
        except RuntimeError as e:
            msg = str(e)
    dist.destroy_process_group()
    return msg


def test_recv_from_any_source_without_the_opt_in_is_refused():
    out = run_world(any_source_refused, 2)
    assert "BRAID_ANY_SOURCE=1" in out[0], out[0]
