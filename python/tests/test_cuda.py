"""CUDA tensors through braid: every collective against torch's own reference, bit-identical on every
rank, the device path (braid::cuda::process_communicator) and the staged path (types and operators
it has no kernel for), asynchrony through a CUDA-aware future, DDP with device_ids, and the refusals.

Without a GPU every test here but the first reports skipped: they need CUDA devices to run."""

import pytest
import torch

import braid_torch
from common import init, run_world

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")


def test_build_serves_cuda_where_torch_and_nvcc_have_it():
    import shutil
    import torch.distributed as dist

    from torch.utils import cpp_extension

    nvcc = cpp_extension.CUDA_HOME and shutil.which("nvcc", path=f"{cpp_extension.CUDA_HOME}/bin")
    if torch.version.cuda and nvcc:
        assert braid_torch.has_cuda, "built beside a CUDA torch and nvcc, yet without CUDA"
        assert "cuda" in dist.Backend.backend_capability["braid"]
    else:
        assert "cuda" not in dist.Backend.backend_capability["braid"]


def device(rank):
    return torch.device("cuda", rank % torch.cuda.device_count())


def collectives(rank, size):
    dist = init()
    dev = device(rank)
    torch.cuda.set_device(dev)
    out = {}
    gen = torch.Generator().manual_seed(1234)
    inputs = [torch.randn(1000, generator=gen) for _ in range(size)]  # every rank's input, known to all
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for name in ("SUM", "MAX", "AVG"):
            t = inputs[rank].to(dtype).to(dev)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
            out[f"all_reduce {dtype} {name}"] = t.cpu()
    for dtype in (torch.int64, torch.int32, torch.int8, torch.int16):
        t = (torch.arange(100, dtype=torch.int64) * (rank + 1)).to(dtype).to(dev)
        dist.all_reduce(t)
        out[f"all_reduce {dtype}"] = t.cpu()
    t = torch.tensor([0b1100 | rank], dtype=torch.int32, device=dev)  # BXOR: staged through the host
    dist.all_reduce(t, op=dist.ReduceOp.BXOR)
    out["bxor"] = t.cpu()
    b = torch.full((257,), float(rank), device=dev)
    dist.broadcast(b, src=size - 1)
    out["broadcast"] = b.cpu()
    g = torch.empty(size * 3, device=dev)
    dist.all_gather_into_tensor(g, torch.full((3,), float(rank), device=dev))
    out["all_gather_into_tensor"] = g.cpu()
    lst = [torch.empty(2, 2, device=dev) for _ in range(size)]
    dist.all_gather(lst, torch.full((2, 2), float(rank + 10), device=dev))
    out["all_gather"] = [x.cpu() for x in lst]
    rs = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(4 * size, dtype=torch.float32, device=dev) * (rank + 1))
    out["reduce_scatter_tensor"] = rs.cpu()
    r = torch.full((5,), float(rank + 1), device=dev)
    dist.reduce(r, dst=0)
    out["reduce"] = r.cpu()
    nc = torch.ones(4, 6, device=dev)[:, ::2]  # not contiguous
    dist.all_reduce(nc)
    out["non_contiguous"] = nc.cpu()
    # async: the future completes with the result, and a kernel the caller queues after wait() sees it.
    a = torch.full((1 << 20,), float(rank), device=dev)
    w = dist.all_reduce(a, async_op=True)
    fut = w.get_future().then(lambda f: f.value()[0] * 2)
    w.wait()
    out["async_sum"] = a[:4].cpu()
    out["then"] = fut.wait()[:4].cpu()
    with pytest.raises(RuntimeError, match="not in send/recv"):
        dist.send(torch.ones(1, device=dev), dst=(rank + 1) % size)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return out, [x for x in inputs]


@gpu
@pytest.mark.parametrize("size", [2, 3])
def test_collectives_match_torch_and_every_rank(size):
    results = run_world(collectives, size)
    inputs = results[0][1]
    outs = [o for o, _ in results]
    for key in outs[0]:
        for r in range(1, size):
            a, b = outs[0][key], outs[r][key]
            if key in ("reduce",) or isinstance(a, list):
                continue
            assert torch.equal(a.view(torch.uint8) if a.is_floating_point() else a, b.view(torch.uint8) if b.is_floating_point() else b), key
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        xs = [x.to(dtype) for x in inputs]
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        total = sum(x.to(acc) for x in xs)  # rank order, in the accumulator: braid's order
        tol = dict(rtol=1e-2, atol=1e-2) if dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(outs[0][f"all_reduce {dtype} SUM"].to(acc), total.to(dtype).to(acc), **tol)
        torch.testing.assert_close(outs[0][f"all_reduce {dtype} MAX"], torch.stack(xs).max(0).values)
        torch.testing.assert_close(outs[0][f"all_reduce {dtype} AVG"].to(acc), (total / size).to(dtype).to(acc), **tol)
    tri = size * (size + 1) // 2
    for dtype in (torch.int64, torch.int32, torch.int8, torch.int16):
        assert torch.equal(outs[0][f"all_reduce {dtype}"], (torch.arange(100) * tri).to(dtype)), dtype
    x = 0
    for r in range(size):
        x ^= 0b1100 | r
    assert outs[0]["bxor"].item() == x
    assert torch.equal(outs[0]["broadcast"], torch.full((257,), float(size - 1)))
    assert torch.equal(outs[0]["all_gather_into_tensor"], torch.arange(size).float().repeat_interleave(3))
    for r in range(size):
        assert torch.equal(outs[1]["all_gather"][r], torch.full((2, 2), float(r + 10)))
        full = torch.arange(4 * size, dtype=torch.float32) * tri
        assert torch.equal(outs[r]["reduce_scatter_tensor"], full[4 * r : 4 * r + 4])
    assert torch.equal(outs[0]["reduce"], torch.full((5,), float(tri)))
    assert torch.equal(outs[0]["non_contiguous"], torch.full((4, 3), float(size)))
    s = float(sum(range(size)))
    assert torch.equal(outs[0]["async_sum"], torch.full((4,), s))
    assert torch.equal(outs[0]["then"], torch.full((4,), 2 * s))


def ddp(rank, size, backend):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist = init(backend)
    dev = device(rank)
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    m = DDP(model, device_ids=[dev.index])
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(5):
        x = torch.randn(16, 32, generator=gen).to(dev)
        y = torch.randint(0, 10, (16,), generator=gen).to(dev)
        opt.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    w = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    dist.destroy_process_group()
    return w


@gpu
def test_ddp_with_device_ids_matches_gloo_and_is_identical_across_ranks():
    braid = run_world(ddp, 2, "braid")
    gloo = run_world(ddp, 2, "gloo")
    assert torch.equal(braid[0], braid[1])
    torch.testing.assert_close(braid[0], gloo[0], rtol=1e-5, atol=1e-6)
