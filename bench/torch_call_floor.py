#!/usr/bin/env python3
"""What torch's own path costs a small call: all_reduce of one float on a world of one rank (no peer,
so no communication), braid and gloo interleaved twice, 20000 calls each after 100 warm-up calls.

    .deps/torch-2.11.0/bin/python bench/torch_call_floor.py
"""
import os
import platform
import subprocess
import time

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401

torch.set_num_threads(1)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29601")
dist.init_process_group("gloo", rank=0, world_size=1)
groups = {"braid": dist.new_group(backend="braid"), "gloo": None}
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, nproc {os.cpu_count()}, commit {commit}, "
      f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load1 {os.getloadavg()[0]:.2f}")
t = torch.ones(1)
for name in ["braid", "gloo", "braid", "gloo"]:
    g = groups[name]
    for _ in range(100):
        dist.all_reduce(t, group=g)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t, group=g)
    print(f"{name:6} world 1, 4 B all_reduce: {(time.perf_counter() - t0) / n * 1e6:6.2f} us per call")
dist.destroy_process_group()
