"""DistributedDataParallel over braid: the same model trained with braid and with gloo ends with the
same weights within float tolerance, and with the same bits on every braid rank; no_sync; a killed
rank. (SyncBatchNorm is not tested here: torch refuses it for CPU modules.)"""

import hashlib

import pytest
import torch

from common import run_world

STEPS = 6


def model(sync_bn=False):
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 8 * 8, 10),
    )
    if sync_bn:
        m = torch.nn.SyncBatchNorm.convert_sync_batchnorm(m)
    return m


def train(rank, size, backend, mode):
    import torch.distributed as dist

    if backend == "braid":
        import braid_torch  # noqa: F401
    dist.init_process_group(backend)
    m = model(mode == "syncbn")
    ddp = torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.01)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(STEPS):
        micro = 2 if mode == "no_sync" else 1
        opt.zero_grad()
        for k in range(micro):
            x = torch.randn(16, 1, 8, 8, generator=g)
            y = torch.randint(0, 10, (16,), generator=g)
            if k < micro - 1:
                with ddp.no_sync():
                    torch.nn.functional.cross_entropy(ddp(x), y).backward()
            else:
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    # Parameters only: DDP broadcasts BatchNorm's running statistics before each forward, so after the
    # last forward they are each rank's own.
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    dist.destroy_process_group()
    return {"weights": flat.tolist(), "digest": hashlib.sha256(flat.numpy().tobytes()).hexdigest()}


@pytest.mark.parametrize("mode", ["plain", "no_sync"])
def test_ddp_matches_gloo(mode):
    b = run_world(train, 2, "braid", mode)
    g = run_world(train, 2, "gloo", mode)
    assert b[0]["digest"] == b[1]["digest"], "braid ranks ended with different weights"
    wb, wg = torch.tensor(b[0]["weights"]), torch.tensor(g[0]["weights"])
    assert torch.allclose(wb, wg, rtol=1e-4, atol=1e-5), (wb - wg).abs().max().item()


def killed_in_training(rank, size):
    import datetime
    import os
    import signal
    import time

    import braid_torch  # noqa: F401
    import torch.distributed as dist

    dist.init_process_group("braid", timeout=datetime.timedelta(seconds=5))
    ddp = torch.nn.parallel.DistributedDataParallel(model(False))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(20):
        if step == 3 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            opt.zero_grad()
            ddp(torch.randn(4, 1, 8, 8)).sum().backward()
            opt.step()
        except RuntimeError as e:
            return {"step": step, "msg": str(e), "secs": time.monotonic() - t0}
    return {"step": None}


def test_ddp_with_a_killed_rank_raises():
    out = run_world(killed_in_training, 2, may_die=(1,))
    assert out[0]["step"] == 3, out[0]
    assert "rank 1" in out[0]["msg"], out[0]["msg"]
    assert out[0]["secs"] < 5 + 2
