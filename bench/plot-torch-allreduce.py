#!/usr/bin/env python3
"""bench/plot-torch-allreduce.py — draws a bench/torch_allreduce.py log: per world size (one column
each), time per call and busbw against message size, every backend and dtype in the log, log-log.

    python3 bench/plot-torch-allreduce.py LOG [OUT.png]   (default OUT: docs/img/torch-allreduce-vs-gloo.png)

Needs matplotlib (Debian: apt-get install python3-matplotlib; bench/plotlib.py runs this again under
/usr/bin/python3 where the interpreter at hand lacks it)."""
import os
import re
import sys

import plotlib

plt = plotlib.pyplot()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(path):
    """{world: {dtype: {"cols": [...], "rows": [[size, {backend: time_us or None}], ...]}}}, title."""
    tables, cur, title = {}, None, ""
    for line in open(path):
        m = re.match(r"# date (.*)", line)
        if m:
            title = m.group(1).split("; python")[0]
            continue
        m = re.match(r"# world (\d+), dtype (\w+)", line)
        if m:
            cur = {"cols": None, "rows": []}
            tables.setdefault(int(m.group(1)), {})[m.group(2)] = cur
            continue
        if cur is None:
            continue
        if line.startswith("#") and cur["cols"] is None and "size" in line:
            cur["cols"] = line.lstrip("#").split()
            continue
        if line.strip() and not line.startswith("#") and cur["cols"]:
            f = line.split()
            times = {}
            for c, v in zip(cur["cols"], f):
                if c.endswith("_us"):
                    try:
                        times[c[:-3]] = float(v)
                    except ValueError:  # "unsupported", "wrong", "missing"
                        times[c[:-3]] = None
            cur["rows"].append((int(f[0]), times))
    return title, tables


def size_label(b):
    for unit, k in (("Mi", 1 << 20), ("Ki", 1 << 10)):
        if b >= k:
            return f"{b // k} {unit}"
    return f"{b}"


STYLE = {"braid": ("o", "-"), "gloo": ("s", "--")}
COLOR = {"float32": "C0", "bfloat16": "C1", "float16": "C2", "float64": "C3", "int32": "C4", "int64": "C5"}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    log = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "docs", "img", "torch-allreduce-vs-gloo.png")
    title, tables = parse(log)
    if not tables:
        sys.exit(f"plot-torch-allreduce.py: no tables in {log}")
    worlds = sorted(tables)
    fig, axes = plt.subplots(2, len(worlds), figsize=(6 * len(worlds), 9), squeeze=False)
    for j, w in enumerate(worlds):
        sizes_all = []
        for d, t in tables[w].items():
            backends = [c[:-3] for c in t["cols"] if c.endswith("_us")]
            for b in backends:
                pts = [(s, tm[b]) for s, tm in t["rows"] if tm.get(b)]
                if not pts:
                    continue  # unsupported: not drawn (the log says so)
                sizes_all += [s for s, _ in pts]
                marker, ls = STYLE.get(b, ("^", ":"))
                kw = dict(marker=marker, linestyle=ls, color=COLOR.get(d, None), label=f"{b} {d}", markersize=4)
                axes[0][j].plot([s for s, _ in pts], [v for _, v in pts], **kw)
                bw = [(s, 2 * (w - 1) / w * s / (v * 1e-6) / 1e9) for s, v in pts]
                axes[1][j].plot([s for s, _ in bw], [v for _, v in bw], **kw)
        ticks = sorted(set(sizes_all))[::2]
        for i, label in enumerate(("time per call (µs)", "busbw (GB/s)")):
            ax = axes[i][j]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(ticks)
            ax.set_xticklabels([size_label(x) for x in ticks], rotation=45)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_ylabel(label)
            ax.legend(fontsize=8)
            if i == 0:
                ax.set_title(f"world size {w}: torch.distributed.all_reduce (sum, CPU)", fontsize=10)
            else:
                ax.set_xlabel("message size (bytes)")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
