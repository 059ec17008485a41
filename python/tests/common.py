"""Starts a world of processes for a test: one process per rank, as torchrun starts them."""

import os
import socket
import sys
import tempfile
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, size, port, fn, args, env, hosts, results):
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    if hosts is not None:
        os.environ["BRAID_HOST_ID"] = f"simulated-host-{hosts[rank]}"
    import torch

    torch.set_num_threads(1)
    try:
        results.put((rank, "ok", fn(rank, size, *args)))
    except BaseException as e:  # reported to the parent, which fails the test
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        sys.exit(1)


def run_world(fn, size, *args, env=None, hosts=None, timeout=300, may_die=()):
    """Runs fn(rank, size, *args) in `size` fresh processes; returns their results by rank.

    hosts: a host number per rank; ranks with one number are a simulated host (BRAID_HOST_ID).
    may_die: ranks the test itself kills or freezes: they report nothing (None) and are killed at
    the end. Raises AssertionError with every other failing rank's traceback."""
    import time

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, size, port, fn, args, env or {}, hosts, results)) for r in range(size)]
    for p in procs:
        p.start()
    # Results are read while the ranks run: a rank blocks in put() until its result is read.
    got = {}
    expected = [r for r in range(size) if r not in may_die]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(r in got for r in expected):
        if results._reader.poll(0.05):
            rank, status, value = results.get()
            got[rank] = (status, value)
        elif not any(p.is_alive() for r, p in enumerate(procs) if r not in got and r not in may_die):
            while not results.empty():
                rank, status, value = results.get()
                got[rank] = (status, value)
            break
    for r, p in enumerate(procs):
        if r not in may_die and r in got:
            p.join(max(1.0, deadline - time.monotonic()))
    alive = [r for r, p in enumerate(procs) if p.is_alive() and r not in may_die]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    errors = [f"rank {r}: {v}" for r, (s, v) in sorted(got.items()) if s != "ok"]
    if alive:
        errors.append(f"ranks {alive} still running after {timeout} s (killed)")
    missing = [r for r in range(size) if r not in got and r not in alive and r not in may_die]
    if missing:
        errors.append(f"ranks {missing} exited without a result (codes {[procs[r].exitcode for r in missing]})")
    assert not errors, "\n".join(errors)
    return [got[r][1] if r in got else None for r in range(size)]


def init(backend="braid", **kw):
    """init_process_group with a 60 s deadline unless told otherwise: a hang fails the test with braid's error."""
    import datetime

    import torch.distributed as dist

    kw.setdefault("timeout", datetime.timedelta(seconds=60))
    if backend == "braid":
        import braid_torch  # noqa: F401  registers the backend
    dist.init_process_group(backend, **kw)
    return dist
