"""Every dtype x operator x collective braid_torch serves, against references computed by torch, with
the same bits on every rank, for each algorithm braid can be told to use (BRAID_ALGO), at world sizes
2 and 3, on one host and on hosts simulated on this machine (BRAID_HOST_ID)."""

import hashlib

import pytest
import torch

from common import init, run_world

R = torch.distributed.ReduceOp if hasattr(torch.distributed, "ReduceOp") else None

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64]
COMPLEX = [torch.complex64, torch.complex128]
COUNTS = [1, 13, 1000, 70001]


def ops_for(dtype):
    import torch.distributed as dist

    O = dist.ReduceOp
    premul = dist._make_nccl_premul_sum(0.5)
    if dtype in FLOATS:
        return {"SUM": O.SUM, "AVG": O.AVG, "PRODUCT": O.PRODUCT, "MIN": O.MIN, "MAX": O.MAX, "PREMUL_SUM": premul}
    if dtype in INTS:
        return {n: getattr(O, n) for n in ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]}
    if dtype == torch.bool:
        return {n: getattr(O, n) for n in ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]}
    return {"SUM": O.SUM, "AVG": O.AVG, "PREMUL_SUM": premul}


def make_input(dtype, count, rank, salt):
    """Small integer values (products stay small), so every reduction is exact in every dtype and order."""
    g = torch.Generator().manual_seed(1000003 * rank + 7919 * count + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=g).to(torch.bool)
    v = torch.randint(1, 3, (count,), generator=g, dtype=torch.int64)
    if dtype.is_complex:
        im = torch.randint(0, 3, (count,), generator=g, dtype=torch.int64)
        return torch.complex(v.double(), im.double()).to(dtype)
    return v.to(dtype)


def wide(t):
    """The exact value of t in a type every reference op supports."""
    if t.dtype == torch.bool:
        return t.to(torch.int64)
    if t.dtype.is_complex:
        return t.to(torch.complex128)
    if t.dtype.is_floating_point:
        return t.to(torch.float64)
    return t.to(torch.int64)


def reference(dtype, op, xs):
    """The rank-ordered reduction of xs, exact, then rounded to dtype as braid stores it."""
    w = [wide(x) for x in xs]
    n = len(w)
    if op == "PREMUL_SUM":
        w = [x * 0.5 for x in w]
    acc = w[0].clone()
    for x in w[1:]:
        if op in ("SUM", "AVG", "PREMUL_SUM"):
            acc = acc + x
        elif op == "PRODUCT":
            acc = acc * x
        elif op == "MIN":
            acc = torch.minimum(acc, x)
        elif op == "MAX":
            acc = torch.maximum(acc, x)
        elif op == "BAND":
            acc = acc & x
        elif op == "BOR":
            acc = acc | x
        elif op == "BXOR":
            acc = acc ^ x
    if dtype == torch.bool:
        return acc != 0
    if op == "AVG":
        if dtype.is_complex:  # braid divides each real part by n (complex division would round otherwise)
            acc = torch.complex(acc.real / n, acc.imag / n)
        elif dtype.is_floating_point:
            acc = acc / n
        else:
            acc = torch.div(acc, n, rounding_mode="trunc")
    return acc.to(dtype)


def digest(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()[:16]


def same(a, b):
    return torch.equal(wide(a), wide(b))


def sweep(rank, size):
    dist = init()
    report = {}
    bad = []
    root = size - 1
    for dtype in FLOATS + INTS + [torch.bool] + COMPLEX:
        for opname, op in ops_for(dtype).items():
            for count in COUNTS:
                xs = [make_input(dtype, count, r, 0) for r in range(size)]
                ref = reference(dtype, opname, xs)
                key = f"{dtype} {opname} {count}"
                # all_reduce
                t = xs[rank].clone()
                dist.all_reduce(t, op=op)
                if not same(t, ref):
                    bad.append(f"all_reduce {key}")
                report[f"all_reduce {key}"] = digest(t)
                # reduce to the last rank
                t = xs[rank].clone()
                dist.reduce(t, root, op=op)
                if rank == root and not same(t, ref):
                    bad.append(f"reduce {key}")
                # reduce_scatter_tensor: every rank's input is size blocks of count
                big = [torch.cat([make_input(dtype, count, r, 1 + b) for b in range(size)]) for r in range(size)]
                full = reference(dtype, opname, big)
                out = torch.empty(count, dtype=dtype)
                dist.reduce_scatter_tensor(out, big[rank].clone(), op=op)
                if not same(out, full[rank * count:(rank + 1) * count]):
                    bad.append(f"reduce_scatter_tensor {key}")
                # reduce_scatter with a list of inputs
                if count == 13:
                    out = torch.empty(count, dtype=dtype)
                    dist.reduce_scatter(out, list(big[rank].clone().chunk(size)), op=op)
                    if not same(out, full[rank * count:(rank + 1) * count]):
                        bad.append(f"reduce_scatter {key}")
    # Collectives that only move data: every dtype torch has, as bytes.
    for dtype in FLOATS + INTS + [torch.bool] + COMPLEX:
        for count in [0, 1, 1001]:
            xs = [make_input(dtype, count, r, 5) for r in range(size)]
            key = f"{dtype} {count}"
            t = xs[rank].clone()
            dist.broadcast(t, 1 % size)
            if not same(t, xs[1 % size]):
                bad.append(f"broadcast {key}")
            outs = [torch.empty(count, dtype=dtype) for _ in range(size)]
            dist.all_gather(outs, xs[rank])
            if not all(same(outs[r], xs[r]) for r in range(size)):
                bad.append(f"all_gather {key}")
            flat = torch.empty(count * size, dtype=dtype)
            dist.all_gather_into_tensor(flat, xs[rank])
            if not same(flat, torch.cat(xs)):
                bad.append(f"all_gather_into_tensor {key}")
            g = [torch.empty(count, dtype=dtype) for _ in range(size)] if rank == 0 else None
            dist.gather(xs[rank], g, dst=0)
            if rank == 0 and not all(same(g[r], xs[r]) for r in range(size)):
                bad.append(f"gather {key}")
            out = torch.empty(count, dtype=dtype)
            dist.scatter(out, [make_input(dtype, count, 100 + r, 6) for r in range(size)] if rank == 0 else None, src=0)
            if not same(out, make_input(dtype, count, 100 + rank, 6)):
                bad.append(f"scatter {key}")
            blocks = [make_input(dtype, count, 10 * rank + q, 7) for q in range(size)]
            got = torch.empty(count * size, dtype=dtype)
            dist.all_to_all_single(got, torch.cat(blocks))
            want = torch.cat([make_input(dtype, count, 10 * q + rank, 7) for q in range(size)])
            if not same(got, want):
                bad.append(f"all_to_all_single {key}")
            outs = [torch.empty(count, dtype=dtype) for _ in range(size)]
            dist.all_to_all(outs, blocks)
            if not all(same(outs[q], make_input(dtype, count, 10 * q + rank, 7)) for q in range(size)):
                bad.append(f"all_to_all {key}")
    # Random float sums: within the rounding bound of a sum of n terms, and the same bits on every rank.
    for dtype in [torch.float32, torch.float64]:
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(100003, generator=g, dtype=dtype)
        xs = [torch.randn(100003, generator=torch.Generator().manual_seed(r), dtype=dtype) for r in range(size)]
        t = x.clone()
        dist.all_reduce(t)
        exact = sum(v.double() for v in xs)
        bound = size * torch.finfo(dtype).eps * sum(v.double().abs() for v in xs)
        if not bool(((t.double() - exact).abs() <= bound).all()):
            bad.append(f"all_reduce random {dtype} out of bound")
        report[f"random {dtype}"] = digest(t)
    dist.destroy_process_group()
    return {"bad": bad, "digests": report}


WORLDS = [
    # (size, hosts, BRAID_ALGO)
    (2, None, ""),
    (3, None, ""),
    (2, None, "ring"),
    (3, None, "ring"),
    (3, None, "tree"),
    (3, None, "one_shot"),
    (3, None, "two_shot"),
    (3, None, "direct"),
    (3, None, "halving_doubling"),
    (3, [0, 0, 1], ""),
    (4, [0, 1, 0, 1], "ring"),
]


@pytest.mark.parametrize("size,hosts,algo", WORLDS, ids=[f"n{s}-hosts{h and len(set(h)) or 1}-{a or 'auto'}" for s, h, a in WORLDS])
def test_sweep(size, hosts, algo):
    env = {"BRAID_ALGO": algo} if algo else {}
    out = run_world(sweep, size, env=env, hosts=hosts)
    bad = sorted({b for r in out for b in r["bad"]})
    assert not bad, f"{len(bad)} wrong results, e.g. {bad[:10]}"
    differ = [k for k in out[0]["digests"] if len({r["digests"][k] for r in out}) != 1]
    assert not differ, f"results differ between ranks: {differ[:10]}"
