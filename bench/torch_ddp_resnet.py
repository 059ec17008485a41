#!/usr/bin/env python3
"""bench/torch_ddp_resnet.py — DistributedDataParallel training of bench/vs_pytorch_resnet.py's
ResNet-20 (imported from there, not copied) with the process-group backend braid (package
braid_torch) beside gloo, on the CPU: R processes (default 2), interleaved runs (braid, gloo, braid,
gloo, ...), images/s per run, medians per backend (bench/vs-gloo-torch.sh runs it).

    python bench/torch_ddp_resnet.py [--backends braid,gloo] [--runs 3] [--warmup 5] [--steps 20] ...

Every run: --ranks fresh processes (torch.multiprocessing, spawn), init_process_group(backend) once,
torch.set_num_threads(--threads, default 1) per rank, the same seed (so the same initial weights),
the same batches: global batch --batch (each rank batch/ranks images) from the first --train-subset
Fashion-MNIST training images, rank r taking every ranks-th image of a seeded permutation, with
vs_pytorch_resnet.py's crop + flip augmentation and normalisation, prepared before the clock starts.
SGD with Nesterov momentum 0.9, weight decay 5e-4, constant lr --lr. WARMUP untimed steps, a
barrier, STEPS timed steps, a barrier: images/s = STEPS x batch / that time (rank 0's clock). Each
run also checks that all ranks end with bitwise the same parameters (an all_gather of a SHA-256 of
their bytes; not the BatchNorm running statistics, which DDP syncs before each forward, so they
differ after the last) and prints the mean loss of its first and last 5 steps. Log: --log (default
bench/results/torch-ddp-resnet-<backends>-<date>-<cpu>-cpu.txt).
"""
import argparse
import datetime
import hashlib
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vs_pytorch_resnet as vpr  # noqa: E402  the ResNet-20, read_idx, make_batch of bench/vs-pytorch.sh
from torch_allreduce import braid_version, cpu_tag, machine_info, run_ranks, write_log  # noqa: E402


def digest(model):
    h = hashlib.sha256()
    for t in model.parameters():
        h.update(t.detach().contiguous().numpy().tobytes())
    return torch.from_numpy(np.frombuffer(h.digest(), dtype=np.int32).copy())


def worker(rank, port, backend, a, queue):
    try:
        torch.set_num_threads(a.threads)
        if backend == "braid":
            import braid_torch  # noqa: F401  registers the backend "braid"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ranks,
                                timeout=datetime.timedelta(seconds=300))
        x_all = vpr.read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"))[: a.train_subset]
        y_all = vpr.read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))[: a.train_subset].astype(np.int64)
        mean = float(x_all.mean()) / 255.0
        std = float((x_all.astype(np.float64) / 255.0).std())
        local = a.batch // a.ranks
        nsteps = a.warmup + a.steps
        rng = np.random.default_rng(a.seed + rank)
        batches, perm = [], np.array([], dtype=np.int64)
        epoch = 0
        for _ in range(nsteps):
            if len(perm) < local:  # a new epoch of the subset, the same permutation on every rank
                p = np.random.default_rng(a.seed * 1000 + epoch).permutation(len(x_all))
                perm = p[rank::a.ranks]
                epoch += 1
            idx, perm = perm[:local], perm[local:]
            batches.append((vpr.make_batch(x_all, idx, mean, std, rng), torch.from_numpy(y_all[idx])))
        torch.manual_seed(a.seed)
        model = vpr.ResNet()
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
        losses = []
        t0 = None
        for s, (x, y) in enumerate(batches):
            if s == a.warmup:
                dist.barrier()
                t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        dist.barrier()
        dt = time.perf_counter() - t0
        d = digest(model)
        gathered = [torch.empty_like(d) for _ in range(a.ranks)]
        dist.all_gather(gathered, d)
        same = all(torch.equal(g, gathered[0]) for g in gathered)
        dist.destroy_process_group()
        queue.put((rank, {"seconds": dt, "same": same, "loss_first": float(np.mean(losses[:5])),
                          "loss_last": float(np.mean(losses[-5:]))}, None))
    except Exception:
        queue.put((rank, None, traceback.format_exc()))
        raise


def run_job(backend, a):
    got, errors, _ = run_ranks(a.ranks, worker, (backend, a), a.job_timeout)
    if errors or len(got) < a.ranks:
        detail = "\n".join(errors) or f"only {len(got)} of {a.ranks} ranks reported"
        raise SystemExit(f"torch_ddp_resnet.py: backend {backend} failed:\n{detail}")
    return got[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="braid,gloo", help="comma-separated, in run order (default braid,gloo)")
    p.add_argument("--runs", type=int, default=3, help="runs per backend (default 3)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    p.add_argument("--batch", type=int, default=128, help="global batch (default 128)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--train-subset", type=int, default=4096)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default=os.environ.get("FASHION_MNIST_DIR", vpr.DATA))
    p.add_argument("--job-timeout", type=int, default=600)
    p.add_argument("--log", default=None, help="log file (default under bench/results/; '-' for none)")
    a = p.parse_args()
    a.backends = [b for b in a.backends.split(",") if b]
    if "braid" in a.backends:
        try:
            import braid_torch
        except ImportError as e:
            sys.exit(f"torch_ddp_resnet.py: backend braid needs braid_torch ({e}); --backends gloo to run without it")
    if a.batch % a.ranks:
        p.error("--batch must be a multiple of --ranks")
    model, nproc, commit = machine_info()
    day = datetime.date.today().isoformat()
    log_path = None if a.log == "-" else (a.log or os.path.join(
        os.path.dirname(HERE), "bench", "results",
        "torch-ddp-resnet-" + "-vs-".join(a.backends) + f"-{day}-{cpu_tag(model)}-cpu.txt"))
    versions = f"torch {torch.__version__}"
    if "braid" in a.backends:
        versions += f", braid_torch {braid_version(braid_torch)}"
    nparams = sum(t.numel() for t in vpr.ResNet().parameters())
    lines = [
        f"# DDP ResNet-20 ({nparams} parameters, bench/vs_pytorch_resnet.py) on the CPU: {' vs '.join(a.backends)}",
        f"# date {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}; machine {model}, "
        f"nproc {nproc}; {versions}; python {platform.python_version()}; commit {commit}",
        f"# {a.ranks} processes (torch.multiprocessing spawn, one init_process_group per run) x {a.threads} thread(s); "
        f"global batch {a.batch} ({a.batch // a.ranks} per rank) from the first {a.train_subset} Fashion-MNIST training "
        f"images; SGD nesterov lr {a.lr}; {a.warmup} warmup steps, {a.steps} timed steps; runs interleaved "
        f"({', '.join(a.backends)}) x {a.runs}",
    ]
    for line in lines:
        print(line, flush=True)
    ips = {b: [] for b in a.backends}
    failed = []
    for r in range(1, a.runs + 1):
        for b in a.backends:
            load = os.getloadavg()[0]
            res = run_job(b, a)
            v = a.steps * a.batch / res["seconds"]
            ips[b].append(v)
            line = (f"run {r} {b:>6}: images/s {v:8.1f}  step {1e3 * res['seconds'] / a.steps:7.1f} ms  "
                    f"loss {res['loss_first']:.4f} -> {res['loss_last']:.4f}  params "
                    f"{'identical' if res['same'] else 'DIFFER'} on all ranks  load1 {load:.2f}")
            if not res["same"]:
                failed.append(f"run {r} {b}: parameters differ across ranks")
            lines.append(line)
            print(line, flush=True)
    summary = ["", f"# {'backend':>8} {'median images/s':>16} {'min':>8} {'max':>8} {'median step ms':>15}"]
    for b in a.backends:
        m = statistics.median(ips[b])
        summary.append(f"  {b:>8} {m:>16.1f} {min(ips[b]):>8.1f} {max(ips[b]):>8.1f} {1e3 * a.batch / m:>15.1f}")
    if {"braid", "gloo"} <= set(a.backends):
        per_run = [x / y for x, y in zip(ips["braid"], ips["gloo"])]
        summary.append(f"# braid/gloo images/s: {statistics.median(ips['braid']) / statistics.median(ips['gloo']):.3f} "
                       f"(medians; per run {min(per_run):.3f}-{max(per_run):.3f}; > 1: braid faster)")
    if failed:
        summary.append("# FAILED: " + "; ".join(failed))
    for line in summary:
        print(line, flush=True)
    lines += summary
    if log_path:
        write_log(log_path, lines)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
