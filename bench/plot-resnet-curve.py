#!/usr/bin/env python3
"""bench/plot-resnet-curve.py — draws resnet_fmnist's --csv curves: training loss (per progress
window) and test accuracy after each epoch against elapsed minutes, one run or several side by side
(each labelled by its file name).

    python3 bench/plot-resnet-curve.py OUT.png RUN.csv [RUN2.csv ...]

Needs matplotlib (Debian: apt-get install python3-matplotlib)."""
import csv
import os
import sys

import plotlib

plt = plotlib.pyplot()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, runs = sys.argv[1], sys.argv[2:]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    for path in runs:
        train, test = [], []
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                t = float(row["elapsed_s"]) / 60
                (train if row["kind"] == "train" else test).append((t, float(row["loss"]), float(row["accuracy"])))
        label = os.path.basename(path)
        if test:
            label += f": {100 * test[-1][2]:.2f}% at {test[-1][0]:.1f} min"
        ax_loss.plot([r[0] for r in train], [r[1] for r in train], label=label)
        ax_acc.plot([r[0] for r in test], [100 * r[2] for r in test], marker="o", label=label)
    ax_loss.set_xlabel("elapsed (min)")
    ax_loss.set_ylabel("training loss (progress window)")
    ax_loss.set_yscale("log")
    ax_acc.set_xlabel("elapsed (min)")
    ax_acc.set_ylabel("test accuracy after each epoch (%)")
    ax_acc.axhline(92, color="grey", linestyle=":", linewidth=1)
    for ax in (ax_loss, ax_acc):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("resnet_fmnist: ResNet-20 on Fashion-MNIST, CPU")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
