"""braid as a torch.distributed backend.

    import braid_torch                       # registers the backend "braid"
    torch.distributed.init_process_group("braid")

One process per rank, as torchrun or mpirun start them; CPU tensors, and CUDA tensors where the
package was built with CUDA (`braid_torch.has_cuda`). The ranks of one host share
memory through braid; between hosts, braid runs inside each host and a Gloo group carries the step
between hosts. A rank's host is its hostname, or BRAID_HOST_ID when set (the tests use it to
simulate several hosts on one machine; ranks with one host id must be on one machine).
"""

import datetime
import os
import socket

import torch
import torch.distributed as dist

from . import _C

__all__ = ["host_id", "backend_name", "has_cuda"]

backend_name = "braid"
has_cuda = bool(_C.has_cuda)  # whether this build serves CUDA tensors


def host_id() -> str:
    """The name this rank's host goes by: BRAID_HOST_ID, else the hostname."""
    return os.environ.get("BRAID_HOST_ID") or socket.gethostname()


def _host_map(store, rank: int, size: int):
    """Every rank's host number (0.. in order of the host's first rank), through the group's store."""
    store.set(f"braid/host/{rank}", host_id())
    names = [store.get(f"braid/host/{r}").decode() for r in range(size)]
    numbers = {}
    host_of = []
    for name in names:
        if name not in numbers:
            numbers[name] = len(numbers)
        host_of.append(numbers[name])
    return host_of


def _create(dist_opts, backend_opts=None):
    store = dist_opts.store
    rank, size = dist_opts.group_rank, dist_opts.group_size
    timeout = dist_opts.timeout
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    host_of = _host_map(store, rank, size)
    hosts = max(host_of) + 1
    cross = world = None
    if hosts > 1:
        first = host_of.index(host_of[rank]) == rank
        if first:
            cross = dist.ProcessGroupGloo(dist.PrefixStore("braid/cross", store), host_of[rank], hosts, timeout)
        world = dist.ProcessGroupGloo(dist.PrefixStore("braid/world", store), rank, size, timeout)
    return _C.create_backend(store, rank, size, timeout, host_of, cross, world)


def _register():
    """Registers "braid" once (importing the package again, or torch's entry-point loading, is a no-op)."""
    if hasattr(dist.Backend, backend_name.upper()):
        return
    dist.Backend.register_backend(backend_name, _create, extended_api=True, devices=["cpu", "cuda"] if has_cuda else ["cpu"])


_register()


def _autoload():
    """The `torch.distributed.backends` entry point: registers the backend (idempotent)."""
    _register()
