#!/usr/bin/env python3
"""bench/vs_pytorch_resnet.py — the PyTorch side of bench/vs-pytorch.sh: the model, data and settings
of examples/resnet_fmnist in PyTorch, on the CPU (bench/vs-pytorch.sh) or with --device cuda on GPUs
(rank r on GPU r, DDP over NCCL; bench/gpu-train.sh), for a side-by-side throughput comparison.

ResNet-20 for 1-channel 28x28 images (conv3x3 16 + BN + ReLU, three stages of 3 basic blocks with
16/32/64 channels, the 2nd and 3rd starting with stride 2, 1x1 conv + BN projection shortcuts, global
average pooling, linear to 10; no conv biases: 272,186 parameters, as braid's resnet<float>(3, 10)),
batch B split over R ranks (DDP over gloo, R processes with T threads each), SGD with Nesterov
momentum 0.9 and weight decay 5e-4, lr 0.1 with a cosine schedule and 3% linear warmup, crop (pad 2)
+ flip augmentation, inputs normalised with the training subset's pixel mean and std.

    python3 vs_pytorch_resnet.py --ranks R --threads T --batch 128 --train-subset N --test-subset M

Prints one line: "pytorch device D ranks R threads T images/s X test_accuracy Y% params P" (images/s: the
epoch's training images over its wall time on rank 0, the batch preparation included, as braid's
progress line counts them).
"""
import argparse
import gzip
import math
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (self.short(x) if self.short is not None else x))


class ResNet(nn.Module):
    def __init__(self, n=3, classes=10, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks, ch = [], width
        for stage in range(3):
            out = width << stage
            for b in range(n):
                blocks.append(Block(ch, out, 2 if stage > 0 and b == 0 else 1))
                ch = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(ch, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def make_batch(images, idx, mean, std, rng):
    x = (images[idx].astype(np.float32) / 255.0 - mean) / std
    k = len(idx)
    padded = np.zeros((k, 32, 32), dtype=np.float32)
    padded[:, 2:30, 2:30] = x
    out = np.empty((k, 28, 28), dtype=np.float32)
    oy = rng.integers(0, 5, k)
    ox = rng.integers(0, 5, k)
    flip = rng.random(k) < 0.5
    for i in range(k):
        c = padded[i, oy[i]:oy[i] + 28, ox[i]:ox[i] + 28]
        out[i] = c[:, ::-1] if flip[i] else c
    return torch.from_numpy(out).unsqueeze(1)


def run(rank, a, port, result):
    torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    dev = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    if a.no_mkldnn:  # PyTorch's own (non-oneDNN) CPU convolutions, as the comparison did
        torch.backends.mkldnn.enabled = False
    if a.ranks > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.ranks)
    torch.manual_seed(a.seed)
    train_x = read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz"))[: a.train_subset]
    train_y = read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz"))[: a.train_subset].astype(np.int64)
    test_x = read_idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz"))[: a.test_subset]
    test_y = read_idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz"))[: a.test_subset].astype(np.int64)
    mean = float(train_x.mean()) / 255.0
    std = float((train_x.astype(np.float64) / 255.0).std())
    model = ResNet().to(dev)
    params = sum(p.numel() for p in model.parameters())
    net = nn.parallel.DistributedDataParallel(model, device_ids=[rank] if cuda else None) if a.ranks > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    local = a.batch // a.ranks
    steps = (len(train_x) // a.ranks) // local
    total = steps * a.epochs
    warmup = max(1, total * 3 // 100)

    def lr_at(t):
        if t < warmup:
            return a.lr * (t + 1) / warmup
        return 0.5 * a.lr * (1 + math.cos(math.pi * (t - warmup) / max(1, total - warmup)))

    rng = np.random.default_rng(a.seed + rank)
    t = 0
    ips = 0.0
    for epoch in range(a.epochs):
        perm = np.random.default_rng(a.seed * 1000 + epoch).permutation(len(train_x))
        shard = perm[rank: steps * local * a.ranks: a.ranks]
        net.train()
        if a.ranks > 1:
            dist.barrier()
        t0 = time.perf_counter()
        for s in range(steps):
            idx = shard[s * local:(s + 1) * local]
            x = make_batch(train_x, idx, mean, std, rng).to(dev, non_blocking=True)
            y = torch.from_numpy(train_y[idx]).to(dev, non_blocking=True)
            for g in opt.param_groups:
                g["lr"] = lr_at(t)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            t += 1
        if cuda:
            torch.cuda.synchronize(dev)
        if a.ranks > 1:
            dist.barrier()
        ips = steps * local * a.ranks / (time.perf_counter() - t0)
    if rank == 0:
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(test_x), 500):
                x = torch.from_numpy(((test_x[i:i + 500].astype(np.float32) / 255.0 - mean) / std)).unsqueeze(1).to(dev)
                correct += int((model(x).argmax(1).cpu() == torch.from_numpy(test_y[i:i + 500])).sum())
        result.put((ips, 100.0 * correct / len(test_x), params))
    if a.ranks > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--train-subset", type=int, default=4096)
    p.add_argument("--test-subset", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--data", default=DATA)
    p.add_argument("--no-mkldnn", action="store_true", help="torch.backends.mkldnn.enabled = False")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: rank r on GPU r, DDP over NCCL")
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    if a.ranks == 1:
        run(0, a, a.port, result)
    else:
        procs = [ctx.Process(target=run, args=(r, a, a.port, result)) for r in range(a.ranks)]
        for q in procs:
            q.start()
        for q in procs:
            q.join()
            if q.exitcode != 0:
                raise SystemExit(f"rank process exited with {q.exitcode}")
    ips, acc, params = result.get()
    print(f"pytorch device {a.device} ranks {a.ranks} threads {a.threads} images/s {ips:.1f} test_accuracy {acc:.2f}% params {params}")


if __name__ == "__main__":
    main()
