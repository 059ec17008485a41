#!/usr/bin/env bash
# braid's resnet_fmnist beside the same ResNet-20 in PyTorch (bench/vs_pytorch_resnet.py), on the CPU,
# same data, batch and settings, 1 and 2 ranks, interleaved passes (braid 1, PyTorch 1, braid 2,
# PyTorch 2, then again), printing images/s and test accuracy of both and the ratio. Not run in CI.
#
#   bench/vs-pytorch.sh [passes=3] [images=4096]
#
# 1 rank: braid 1 rank with its default threads (cores), PyTorch 1 process with as many threads.
# 2 ranks: braid 2 thread ranks with 1 thread each, PyTorch DDP over gloo, 2 processes x 1 thread.
# Installs PyTorch into a virtualenv ($VENV, default .venv-bench in the repository root): from
# PyTorch's CPU wheel index where that answers, else from PyPI (whose torch pulls about 3 GB of CUDA
# wheels even for CPU use). BRAID_BIN: the trainer (default build/examples/resnet_fmnist/resnet_fmnist).
# TORCH_ARGS: more arguments for bench/vs_pytorch_resnet.py (e.g. --no-mkldnn: PyTorch without oneDNN).
set -euo pipefail
cd "$(dirname "$0")/.."
passes=${1:-3}
images=${2:-4096}
venv=${VENV:-.venv-bench}
bin=${BRAID_BIN:-build/examples/resnet_fmnist/resnet_fmnist}
[ -x "$bin" ] || { echo "vs-pytorch.sh: build the trainer first ($bin)" >&2; exit 2; }
if ! "$venv/bin/python" -c "import torch, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  timeout 120 "$venv/bin/pip" install -q torch numpy --index-url https://download.pytorch.org/whl/cpu ||
    "$venv/bin/pip" install -q torch numpy
fi
cores=$(nproc)
steps=$((images / 128))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(date -u) $(nproc) cores; braid $bin ($(git log --oneline -1 | cut -c1-60)); $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
[ -n "${TORCH_ARGS:-}" ] && echo "# PyTorch with: $TORCH_ARGS"
echo "# each run: 1 epoch on the first $images training images, batch 128, test on the first 1000 test images"
for pass in $(seq 1 "$passes"); do
  for ranks in 1 2; do
    threads=$((ranks == 1 ? cores : 1))
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$bin" --ranks "$ranks" --blas-threads "$threads" --epochs 1 --batch 128 --train-subset "$images" \
      --test-subset 1000 --log-every "$steps" --csv "$tmp/c.csv" > "$tmp/braid" 2>&1
    b_ips=$(grep -o 'images/s [0-9.]*' "$tmp/braid" | tail -1 | cut -d' ' -f2)
    b_acc=$(grep -o 'test accuracy [0-9.]*%' "$tmp/braid" | tail -1 | cut -d' ' -f3)
    echo "pass $pass ranks $ranks threads/rank $threads braid images/s $b_ips test_accuracy $b_acc load1 $load"
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$venv/bin/python" bench/vs_pytorch_resnet.py --ranks "$ranks" --threads "$threads" --batch 128 \
      --train-subset "$images" --test-subset 1000 ${TORCH_ARGS:-} > "$tmp/torch" 2>&1 || { cat "$tmp/torch" >&2; exit 1; }
    t_ips=$(grep -o 'images/s [0-9.]*' "$tmp/torch" | cut -d' ' -f2)
    t_acc=$(grep -o 'test_accuracy [0-9.]*%' "$tmp/torch" | cut -d' ' -f2)
    params=$(grep -o 'params [0-9]*' "$tmp/torch" | cut -d' ' -f2)
    echo "pass $pass ranks $ranks threads/rank $threads pytorch images/s $t_ips test_accuracy $t_acc params $params load1 $load ratio braid/pytorch $(echo "scale=2; $b_ips / $t_ips" | bc)"
  done
done
