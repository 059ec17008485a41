"""A dead, frozen or mismatched peer makes every survivor raise an error naming the rank, the
collective and the call number within the deadline + 2 s; nothing is left in /dev/shm."""

import datetime
import os
import signal
import time

import torch

from common import init, run_world

DEADLINE = 4.0  # the group's timeout in these tests, seconds


def one_dies(rank, size, how):
    dist = init(timeout=datetime.timedelta(seconds=DEADLINE))
    t = torch.ones(1000)
    dist.all_reduce(t)
    if rank == size - 1:
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        msg = None
    except RuntimeError as e:
        msg = f"{type(e).__name__}: {e}"
    return {"msg": msg, "secs": time.monotonic() - t0}


def shm_names():
    return sorted(n for n in os.listdir("/dev/shm") if "braid" in n)


def test_killed_rank_every_survivor_raises_and_nothing_is_left():
    before = shm_names()
    out = run_world(one_dies, 3, "kill", may_die=(2,))
    for r in (0, 1):
        assert out[r]["msg"] is not None, f"rank {r} did not raise"
        assert "rank 2" in out[r]["msg"] and "all_reduce" in out[r]["msg"] and "call 2" in out[r]["msg"], out[r]["msg"]
        assert "DistBackendError" in out[r]["msg"], out[r]["msg"]
        assert out[r]["secs"] < DEADLINE + 2, out[r]["secs"]
    assert shm_names() == before


def test_frozen_rank_every_survivor_raises_within_the_deadline():
    out = run_world(one_dies, 3, "freeze", may_die=(2,))
    for r in (0, 1):
        assert out[r]["msg"] is not None, f"rank {r} did not raise"
        assert "all_reduce" in out[r]["msg"] and "call 2" in out[r]["msg"], out[r]["msg"]
        assert out[r]["secs"] < DEADLINE + 2, out[r]["secs"]


def mismatched(rank, size):
    dist = init(timeout=datetime.timedelta(seconds=DEADLINE))
    t0 = time.monotonic()
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(10))
        else:
            dist.all_reduce(torch.ones(20))
        msg = None
    except RuntimeError as e:
        msg = str(e)
    return {"msg": msg, "secs": time.monotonic() - t0}


def test_mismatched_calls_raise_on_every_rank():
    out = run_world(mismatched, 2)
    for o in out:
        assert o["msg"] is not None and "mismatch" in o["msg"].lower(), o["msg"]
        assert o["secs"] < DEADLINE + 2


def abort_then_again(rank, size):
    dist = init(timeout=datetime.timedelta(seconds=DEADLINE))
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.destroy_process_group()
    # A second process group in the same processes, after the first is gone.
    from common import init as again

    dist = again(timeout=datetime.timedelta(seconds=DEADLINE), init_method=f"file://{os.environ['BRAID_TEST_FILE']}", rank=rank, world_size=size)
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def test_destroy_releases_and_a_new_group_starts(tmp_path):
    out = run_world(abort_then_again, 2, env={"BRAID_TEST_FILE": str(tmp_path / "store")})
    assert out == [[2.0] * 3] * 2
