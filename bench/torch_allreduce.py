#!/usr/bin/env python3
"""bench/torch_allreduce.py — torch.distributed.all_reduce through the process-group backend braid
(package braid_torch) beside gloo, in one run, on CPU tensors (bench/vs-gloo-torch.sh runs it).

    python bench/torch_allreduce.py [--backends braid,gloo] [--world-sizes 2,4] [--passes 3] ...

Jobs: per pass, per world size n, per backend (in --backends order, so the backends alternate:
braid gloo braid gloo ...), n fresh processes started with torch.multiprocessing (spawn), each
calling init_process_group(backend, tcp://127.0.0.1:<free port>) once: one process group per
backend per pass, never two alive at once (a backend's idle threads cannot slow the other's run).
torch.set_num_threads(--threads, default 1) in every rank.

Per dtype and size (bytes MIN..MAX, factor FACTOR; count = bytes / element size): one checked call
(rank r contributes r + 1 everywhere; the sum must be n(n+1)/2 everywhere), then WARMUP untimed calls,
a barrier, ITERS timed calls on a zero tensor (in place, SUM); ITERS = TARGET_BYTES / bytes clamped to
[MIN_ITERS, MAX_ITERS], the same for both backends, WARMUP = max(2, ITERS / 10). A rank's time is its
mean per call; a job's time is the maximum over its ranks; the table gives per size the median over
passes of each backend's time, the ratio gloo/braid of those medians (> 1: braid is faster) with the
range of the per-pass ratios, and busbw = 2(n-1)/n * bytes / time (GB/s, GB = 1e9), as nccl-tests.
A backend that refuses a dtype (the call raises) is recorded as "unsupported", not a failure; a wrong
sum is a failure (exit status 1). The table goes to stdout and to --log (default:
bench/results/torch-allreduce-<backends>-<date>-<cpu>-cpu.txt); bench/plot-torch-allreduce.py draws it.
"""
import argparse
import datetime
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
          "int32": torch.int32, "int64": torch.int64, "float8_e4m3fn": torch.float8_e4m3fn}


def parse_size(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s[-1].upper() in mult:
        return int(s[:-1]) * mult[s[-1].upper()]
    return int(s)


def sizes_of(a):
    out, b = [], a.min
    while b <= a.max:
        out.append(b)
        b *= a.factor
    return out


def iters_for(a, size):
    it = max(a.min_iters, min(a.max_iters, a.target_bytes // size))
    return it, max(2, it // 10)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, port, world, backend, dtypes, a, queue):
    try:
        torch.set_num_threads(a.threads)
        if backend == "braid":
            import braid_torch  # noqa: F401  registers the backend "braid"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=a.timeout))
        res = {}
        expect = world * (world + 1) // 2
        for dname in dtypes:
            dtype = DTYPES[dname]
            esize = torch.empty(0, dtype=dtype).element_size()
            for size in sizes_of(a):
                if size < esize:
                    continue
                count = size // esize
                try:
                    chk = torch.full((count,), rank + 1, dtype=dtype)
                    dist.all_reduce(chk)
                except Exception as e:  # the backend refuses this dtype: every rank raises alike
                    msg = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
                    for s2 in sizes_of(a):
                        if s2 >= esize:
                            res[(dname, s2)] = ("unsupported", msg)
                    # A failed call may leave the group unusable (gloo can hand the error on to the next
                    # collective of one rank): this job ends here, the parent starts a fresh one for the
                    # dtypes left.
                    queue.put((rank, res, None))
                    try:
                        dist.destroy_process_group()
                    except Exception:
                        pass
                    return
                if not bool((chk == expect).all()):
                    bad = chk[chk != expect][:4].tolist()
                    res[(dname, size)] = ("wrong", f"expected {expect}, got e.g. {bad}")
                    continue
                x = torch.zeros(count, dtype=dtype)
                iters, warm = iters_for(a, size)
                for _ in range(warm):
                    dist.all_reduce(x)
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(x)
                t1 = time.perf_counter()
                res[(dname, size)] = ("ok", (t1 - t0) / iters)
        dist.barrier()
        dist.destroy_process_group()
        queue.put((rank, res, None))
    except Exception:
        queue.put((rank, None, traceback.format_exc()))
        raise


def write_log(path, lines):
    """Writes the lines to path (its folder made if need be) and says where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"# log: {path}", flush=True)


def run_ranks(world, target, args, timeout):
    """Starts `world` spawned processes target(rank, port, *args, queue) and collects what each puts
    on the queue, (rank, result, traceback or None), for at most `timeout` seconds. Returns
    (results by rank, error lines, the processes), every process ended."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    got, errors = {}, []
    deadline = time.time() + timeout
    while len(got) + len(errors) < world and time.time() < deadline:
        try:
            rank, res, err = queue.get(timeout=5)
        except Exception:
            if all(p.exitcode is not None for p in procs) and queue.empty():
                break
            continue
        if err:
            errors.append(f"rank {rank}: {err}")
        else:
            got[rank] = res
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    return got, errors, procs


def run_job(world, backend, dtypes, a):
    got, errors, procs = run_ranks(world, worker, (world, backend, dtypes, a), a.job_timeout)
    if errors or len(got) < world:
        detail = "\n".join(errors) or f"only {len(got)} of {world} ranks reported (exit codes {[p.exitcode for p in procs]})"
        raise SystemExit(f"torch_allreduce.py: world {world} backend {backend} failed:\n{detail}")
    if any(set(got[r]) != set(got[0]) for r in range(world)):
        raise SystemExit(f"torch_allreduce.py: world {world} backend {backend}: the ranks measured different cases")
    merged = {}
    for key in got[0]:
        states = [got[r][key] for r in range(world)]
        if all(s[0] == "ok" for s in states):
            merged[key] = ("ok", max(s[1] for s in states))
        else:
            merged[key] = next(s for s in states if s[0] != "ok")
    return merged


def run_backend(world, backend, a):
    """All dtypes for one backend and world size: one job, or one more after each unsupported dtype."""
    merged, left, jobs = {}, list(a.dtypes), 0
    while left:
        res = run_job(world, backend, left, a)
        jobs += 1
        merged.update(res)
        done = {d for d, _ in res}
        if not done:
            break
        last = max(i for i, d in enumerate(left) if d in done)
        left = left[last + 1:]
    return merged, jobs


def machine_info():
    model = platform.processor() or "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
                break
    except (OSError, subprocess.CalledProcessError):
        pass
    nproc = len(os.sched_getaffinity(0))
    try:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True, env=dict(os.environ, GIT_OPTIONAL_LOCKS="0")).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, env=dict(os.environ, GIT_OPTIONAL_LOCKS="0")).stdout.strip()
        if dirty:
            commit += " (with uncommitted changes)"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return model, nproc, commit


def cpu_tag(model):
    """A short name for the CPU in file names: 'AMD EPYC 7B13' -> 'epyc', 'Intel(R) Xeon(R) ...' -> 'xeon'."""
    for w in model.replace("(R)", " ").replace("(TM)", " ").split():
        lw = w.lower()
        if lw not in ("amd", "intel", "genuine", "cpu", "processor", "@") and lw.isalpha():
            return lw
    return "unknown"


def default_log(backends, model):
    day = datetime.date.today().isoformat()
    name = "torch-allreduce-" + "-vs-".join(backends) + f"-{day}-{cpu_tag(model)}-cpu.txt"
    return os.path.join(REPO, "bench", "results", name)


def backend_info(backends):
    parts = [f"torch {torch.__version__}"]
    if "braid" in backends:
        import braid_torch
        parts.append(f"braid_torch {braid_version(braid_torch)} ({os.path.dirname(braid_torch.__file__)})")
    return ", ".join(parts)


def braid_version(mod):
    v = getattr(mod, "__version__", None)
    if v is None:
        try:
            from importlib.metadata import version
            v = version("braid-torch")
        except Exception:
            v = "?"
    return v


def fmt_us(state):
    if state is None:
        return "-"
    return f"{state * 1e6:.1f}" if isinstance(state, float) else state


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="braid,gloo", help="comma-separated, in pass order (default braid,gloo)")
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--min", type=parse_size, default=4, help="smallest size in bytes (default 4)")
    p.add_argument("--max", type=parse_size, default=64 << 20, help="largest size in bytes (default 64M)")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--target-bytes", type=parse_size, default=16 << 20, help="ITERS = this / size, clamped (default 16M)")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank (default 1)")
    p.add_argument("--timeout", type=int, default=300, help="process-group timeout in seconds")
    p.add_argument("--job-timeout", type=int, default=900, help="seconds one job (pass, world, backend) may take")
    p.add_argument("--log", default=None, help="log file (default under bench/results/; '-' for none)")
    a = p.parse_args()
    a.backends = [b for b in a.backends.split(",") if b]
    a.world_sizes = [int(w) for w in a.world_sizes.split(",") if w]
    a.dtypes = [d for d in a.dtypes.split(",") if d]
    for d in a.dtypes:
        if d not in DTYPES:
            p.error(f"unknown dtype {d} (one of {', '.join(DTYPES)})")
    if "braid" in a.backends:
        try:
            import braid_torch  # noqa: F401
        except ImportError as e:
            sys.exit(f"torch_allreduce.py: backend braid needs braid_torch ({e}); "
                     "pip install --no-build-isolation ./python, or --backends gloo")
    model, nproc, commit = machine_info()
    log_path = None if a.log == "-" else (a.log or default_log(a.backends, model))
    sizes = sizes_of(a)

    header = [
        f"# torch.distributed.all_reduce (SUM, in place, CPU tensors): {' vs '.join(a.backends)}",
        f"# date {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}; machine {model}, "
        f"nproc {nproc}; {backend_info(a.backends)}; python {platform.python_version()}; commit {commit}",
        "# processes: torch.multiprocessing (spawn); one job per (pass, world size, backend), each rank calling "
        "init_process_group(backend) once (one process group per backend per pass, never two alive at once); "
        f"torch.set_num_threads({a.threads}) per rank",
        f"# passes {a.passes}, order per pass: " + ", ".join(f"world {w}: {' '.join(a.backends)}" for w in a.world_sizes),
        f"# per size: 1 checked call, WARMUP = max(2, ITERS/10) calls, a barrier, ITERS = {a.target_bytes}/bytes in "
        f"[{a.min_iters}, {a.max_iters}] timed calls; time: a rank's mean per call, the max over ranks, the median over passes",
        "# ratio = gloo_us / braid_us of the medians (> 1: braid faster), range: min-max of the per-pass ratios; "
        "busbw = 2(n-1)/n * bytes / time, GB/s with GB = 1e9",
    ]
    for line in header:
        print(line, flush=True)

    # results[(world, backend)] = list over passes of {(dtype, size): state}
    results = {(w, b): [] for w in a.world_sizes for b in a.backends}
    progress = []
    t_start = time.time()
    for ps in range(1, a.passes + 1):
        for w in a.world_sizes:
            for b in a.backends:
                load = os.getloadavg()[0]
                t0 = time.time()
                res, jobs = run_backend(w, b, a)
                results[(w, b)].append(res)
                line = f"# pass {ps} world {w} {b}: {time.time() - t0:.1f} s (load1 before {load:.2f})" + \
                    (f", {jobs} jobs (a fresh one after each unsupported dtype)" if jobs > 1 else "")
                progress.append(line)
                print(line, file=sys.stderr, flush=True)

    out = list(header) + progress
    failed = []
    if {"braid", "gloo"} <= set(a.backends):
        ref, other = "braid", "gloo"  # the ratio column: gloo / braid
    else:
        ref, other = (a.backends + [None])[:2]
    for w in a.world_sizes:
        for d in a.dtypes:
            out.append("")
            out.append(f"# world {w}, dtype {d}")
            cols = f"{'size':>10} {'count':>10} {'type':>9} {'redop':>5} {'iters':>5}"
            for b in a.backends:
                cols += f" {b + '_us':>12}"
            if other:
                cols += f" {other + '/' + ref:>11} {'range':>13}"
            for b in a.backends:
                cols += f" {b + '_busbw':>12}"
            out.append("#" + cols[1:])
            esize = torch.empty(0, dtype=DTYPES[d]).element_size()
            for size in sizes:
                if size < esize:
                    continue
                med, per_pass = {}, {}
                for b in a.backends:
                    states = [r.get((d, size)) for r in results[(w, b)]]
                    if all(s and s[0] == "ok" for s in states):
                        per_pass[b] = [s[1] for s in states]
                        med[b] = statistics.median(per_pass[b])
                    else:
                        bad = next(s for s in states if not s or s[0] != "ok")
                        med[b] = bad[0] if bad else "missing"
                        if bad and bad[0] == "wrong":
                            failed.append(f"world {w} {b} {d} {size} B: wrong sum ({bad[1]})")
                row = f"{size:>10} {size // esize:>10} {d:>9} {'sum':>5} {iters_for(a, size)[0]:>5}"
                for b in a.backends:
                    row += f" {fmt_us(med[b]):>12}"
                if other:
                    if isinstance(med[ref], float) and isinstance(med[other], float):
                        rs = [g / r for g, r in zip(per_pass[other], per_pass[ref])]
                        row += f" {med[other] / med[ref]:>11.2f} {f'{min(rs):.2f}-{max(rs):.2f}':>13}"
                    else:
                        row += f" {'-':>11} {'-':>13}"
                for b in a.backends:
                    bw = 2 * (w - 1) / w * size / med[b] / 1e9 if isinstance(med[b], float) else None
                    row += f" {bw:>12.4g}" if bw is not None else f" {'-':>12}"
                out.append(row)
            for b in a.backends:
                msgs = {r[(d, s)][1] for r in results[(w, b)] for s in sizes if (d, s) in r and r[(d, s)][0] == "unsupported"}
                for m in msgs:
                    out.append(f"# {b} {d}: unsupported: {m}")
    out.append("")
    out.append(f"# total {time.time() - t_start:.0f} s" + (f"; FAILED: {'; '.join(failed)}" if failed else "; all sums checked"))
    text = "\n".join(out[len(header):]) + "\n"
    print(text, end="", flush=True)
    if log_path:
        write_log(log_path, out)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
