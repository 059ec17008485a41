#!/usr/bin/env python3
"""bench/plot-vs-mpi.py — draws a bench/vs-mpi.sh log: per setting (one column each), time per call and
busbw against message size, braid beside MPI_Allreduce, log-log; the floor where the log gives one.

    python3 bench/plot-vs-mpi.py LOG [OUT.png]      (default OUT: LOG with .png)

Needs matplotlib (Debian: apt-get install python3-matplotlib)."""
import re
import sys

import plotlib

plt = plotlib.pyplot()


def parse(path):
    settings, cur, title = [], None, ""
    for line in open(path):
        if line.startswith("# date"):
            title = line[len("# date"):].strip()
        m = re.match(r"# setting (\w+): (.*)", line)
        if m:
            cur = {"name": m.group(1), "what": m.group(2).strip(), "rows": [], "floor": []}
            settings.append(cur)
            floor = False
            continue
        if cur is not None and re.match(r"# \w+, the floor", line):
            floor = True  # the setting's floor table follows: size, floor (us), braid/floor, range
            continue
        if cur is not None and line.strip() and not line.startswith("#"):
            f = line.split()
            if floor:
                # size, floor (us), braid/floor, range[, staged floor (us), braid/staged, range]
                cur["floor"].append((int(f[0]), float(f[1]), float(f[4]) if len(f) > 4 else None))
            else:
                # size braid_us mpi_us ratio range braid_busbw mpi_busbw passes
                cur["rows"].append((int(f[0]), float(f[1]), float(f[2]), float(f[5]), float(f[6])))
    return title, [s for s in settings if s["rows"]]


def size_label(b):
    for unit, k in (("Mi", 1 << 20), ("Ki", 1 << 10)):
        if b >= k:
            return f"{b // k} {unit}"
    return f"{b}"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    log = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else re.sub(r"\.[^.]*$", "", log) + ".png"
    title, settings = parse(log)
    if not settings:
        sys.exit(f"plot-vs-mpi.py: no setting tables in {log}")
    fig, axes = plt.subplots(2, len(settings), figsize=(5 * len(settings), 8), squeeze=False)
    for j, s in enumerate(settings):
        size = [r[0] for r in s["rows"]]
        for i, (bi, mi, label) in enumerate(((1, 2, "time per call (µs)"), (3, 4, "busbw (GB/s)"))):
            ax = axes[i][j]
            nan = float("nan")  # a busbw printed as 0 (below the log's resolution) is left out, not drawn at 0
            ax.plot(size, [r[bi] if r[bi] > 0 else nan for r in s["rows"]], "o-", label="braid")
            ax.plot(size, [r[mi] if r[mi] > 0 else nan for r in s["rows"]], "s--", label="MPI_Allreduce (OpenMPI)")
            if i == 0 and s["floor"]:
                ax.plot([f[0] for f in s["floor"]], [f[1] for f in s["floor"]], "k:", marker="x",
                        label="floor (input + output once, memcpy rate)")
                staged = [f for f in s["floor"] if f[2] is not None]
                if staged:
                    ax.plot([f[0] for f in staged], [f[2] for f in staged], "k--", marker="+",
                            label="staged floor (4 x size per rank, memcpy rate)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(size[::2])
            ax.set_xticklabels([size_label(x) for x in size[::2]], rotation=45)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_ylabel(label)
            if i == 0:
                ax.set_title(f"{s['name']}: {s['what']}", fontsize=9)
            else:
                ax.set_xlabel("message size (bytes)")
            ax.legend(fontsize=8)
    fig.suptitle(f"braid vs MPI_Allreduce, float sum — {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
