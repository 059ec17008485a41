#!/usr/bin/env python3
"""examples/torch_ddp/train.py — a small CNN trained on Fashion-MNIST with PyTorch's
DistributedDataParallel over the process-group backend braid (package braid_torch) or gloo.

    torchrun --nproc-per-node 2 examples/torch_ddp/train.py --backend braid
    torchrun --nproc-per-node 2 examples/torch_ddp/train.py --backend gloo
    # the quick check (CI): well under a minute, exit status 1 if the test loss did not fall or the
    # ranks' parameters differ (bitwise) at the end
    torchrun --nproc-per-node 2 examples/torch_ddp/train.py --backend braid \
        --limit-train 512 --limit-test 256 --epochs 1

Data: the gzipped IDX files of the Debian package dataset-fashion-mnist (/usr/share/datasets/
fashion-mnist, the default of braid::nn's load_fashion_mnist; --data DIR or $FASHION_MNIST_DIR for
another directory), read with numpy. Every epoch each rank takes its shard of a permutation of the
training images, as torch.utils.data.DistributedSampler gives it (same seed and epoch on every rank,
rank r takes every world-th index from r, the permutation padded to a multiple of the world size).
--batch-size is per rank (the global batch is world x that). Without torchrun (no RANK in the
environment) it runs as a world of 1.
"""
import argparse
import gzip
import hashlib
import os
import struct
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzipped or not) as a numpy array: magic 0 0 type ndim, ndim big-endian sizes, data."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} bytes of data, the header says {dims}")
    return data.reshape(dims)


def load_split(data_dir, train, limit):
    stem = os.path.join(data_dir, "train" if train else "t10k")
    paths = []
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        p = f"{stem}-{kind}"
        paths.append(p + ".gz" if os.path.exists(p + ".gz") or not os.path.exists(p) else p)
    for p in paths:
        if not os.path.exists(p):
            sys.exit(f"train.py: {p} not found (Fashion-MNIST: apt-get install dataset-fashion-mnist, or --data DIR)")
    x, y = read_idx(paths[0]), read_idx(paths[1])
    if limit:
        x, y = x[:limit], y[:limit]
    return x, y.astype(np.int64)


class SmallCNN(nn.Module):
    """conv 3x3 16 - ReLU - maxpool 2 - conv 3x3 32 - ReLU - maxpool 2 - linear 64 - ReLU - linear 10
    (105,866 parameters)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.f1 = nn.Linear(32 * 7 * 7, 64)
        self.f2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.f2(F.relu(self.f1(x.flatten(1))))


def evaluate(model, x, y, rank, world, batch=500):
    """Mean loss and accuracy over the whole test subset: every rank takes every world-th image and the
    sums go through an all_reduce of the backend under test."""
    model.eval()
    xs, ys = x[rank::world], y[rank::world]
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(xs), batch):
            out = model(xs[i:i + batch])
            loss_sum += float(F.cross_entropy(out, ys[i:i + batch], reduction="sum"))
            correct += int((out.argmax(1) == ys[i:i + batch]).sum())
    t = torch.tensor([loss_sum, float(correct), float(len(xs))], dtype=torch.float32)
    if world > 1:
        dist.all_reduce(t)
    model.train()
    return float(t[0] / t[2]), float(100.0 * t[1] / t[2])


def parameter_digest(model):
    """SHA-256 of the bytes of every parameter, in order, as 8 int32 words."""
    h = hashlib.sha256()
    for t in model.parameters():
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return torch.from_numpy(np.frombuffer(h.digest(), dtype=np.int32).copy())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="braid", help="process-group backend: braid (imports braid_torch first) or gloo")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="images per rank per step (default 64)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--limit-train", type=int, default=0, help="use only the first N training images (0: all 60000)")
    p.add_argument("--limit-test", type=int, default=0, help="use only the first N test images (0: all 10000)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("TRAIN_THREADS", "1")),
                   help="torch.set_num_threads per rank (default 1, or $TRAIN_THREADS)")
    p.add_argument("--log-every", type=int, default=50, help="steps between progress lines (0: epoch ends only)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default=os.environ.get("FASHION_MNIST_DIR", DEFAULT_DATA))
    a = p.parse_args()

    if a.backend == "braid":
        import braid_torch  # noqa: F401  registers the process-group backend "braid"

    torch.set_num_threads(a.threads)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if "RANK" not in os.environ:  # a plain `python train.py`: a world of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29541")
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
    dist.init_process_group(a.backend, timeout=timedelta(seconds=120))
    assert dist.get_rank() == rank and dist.get_world_size() == world

    def say(*args):
        if rank == 0:
            print(*args, flush=True)

    train_x, train_y = load_split(a.data, True, a.limit_train)
    test_x, test_y = load_split(a.data, False, a.limit_test)
    mean = float(train_x.mean()) / 255.0
    std = float((train_x.astype(np.float64) / 255.0).std())

    def to_tensor(x):
        return ((torch.from_numpy(x.astype(np.float32)) / 255.0 - mean) / std).unsqueeze(1)

    train_t, train_l = to_tensor(train_x), torch.from_numpy(train_y)
    test_t, test_l = to_tensor(test_x), torch.from_numpy(test_y)

    torch.manual_seed(a.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = SmallCNN()
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    sampler = DistributedSampler(range(len(train_t)), num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    steps = -(-len(sampler) // a.batch_size)
    nparams = sum(t.numel() for t in model.parameters())
    say(f"# backend {a.backend} world {world} threads/rank {a.threads} torch {torch.__version__}; "
        f"{len(train_t)} training images ({len(sampler)} per rank, {steps} steps of {a.batch_size} per rank per epoch), "
        f"{len(test_t)} test images; SmallCNN {nparams} parameters; SGD lr {a.lr} momentum 0.9")

    loss0, acc0 = evaluate(model, test_t, test_l, rank, world)
    say(f"before training: test loss {loss0:.4f} accuracy {acc0:.2f}%")
    tl, ta = loss0, acc0
    t_all = time.perf_counter()
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(sampler), dtype=torch.int64)
        dist.barrier()
        t0 = time.perf_counter()
        tw, seen, run_loss, run_n = t0, 0, 0.0, 0
        for s in range(steps):
            b = idx[s * a.batch_size:(s + 1) * a.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(train_t[b]), train_l[b])
            loss.backward()  # DDP all_reduces the gradients here, bucket by bucket
            opt.step()
            seen += len(b) * world
            run_loss += float(loss.detach())
            run_n += 1
            if a.log_every and (s + 1) % a.log_every == 0 and s + 1 < steps:
                now = time.perf_counter()
                say(f"epoch {epoch + 1}/{a.epochs} step {s + 1}/{steps} loss {run_loss / run_n:.4f} "
                    f"images/s {seen / (now - tw):.0f}")
                tw, seen, run_loss, run_n = now, 0, 0.0, 0
        dist.barrier()
        dt = time.perf_counter() - t0
        msg = f"epoch {epoch + 1}/{a.epochs} step {steps}/{steps} loss {run_loss / max(run_n, 1):.4f} " \
              f"images/s {seen / (time.perf_counter() - tw):.0f}"
        tl, ta = evaluate(model, test_t, test_l, rank, world)
        say(f"{msg} | epoch {epoch + 1} done: {len(idx) * world} images in {dt:.2f} s, "
            f"{len(idx) * world / dt:.0f} images/s; test loss {tl:.4f} accuracy {ta:.2f}%")
    total = time.perf_counter() - t_all

    # The checks: the test loss fell, and every rank holds bitwise the same parameters.
    digest = parameter_digest(model)
    gathered = [torch.empty_like(digest) for _ in range(world)]
    dist.all_gather(gathered, digest)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    fell = tl < loss0
    say(f"final: test loss {tl:.4f} (from {loss0:.4f}) accuracy {ta:.2f}%; {a.epochs} epochs in {total:.1f} s; "
        f"parameters {'identical' if same else 'DIFFER'} on all {world} ranks "
        f"(sha256 {bytes(gathered[0].numpy().tobytes()).hex()[:16]})")
    ok = fell and same
    if not fell:
        say("FAIL: the test loss did not fall")
    if not same:
        say("FAIL: the parameters differ across ranks: " + " ".join(bytes(g.numpy().tobytes()).hex()[:16] for g in gathered))
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
