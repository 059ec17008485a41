#!/usr/bin/env bash
# bench/gpu-train.sh — issue 16's GPU day: ResNet-20 on Fashion-MNIST trained by resnet_fmnist
# --backend cuda on the GPUs of this machine (rank r on GPU r, one process), to the 92% test accuracy
# of the CPU runs, and the same model in PyTorch on the same GPUs beside it (bench/vs_pytorch_resnet.py
# --device cuda, DDP over NCCL), one epoch each, for images/s side by side. One plain-text log:
#     <out-dir>/gpu-train-<UTC date>-<short commit>.log       (plus the CSV curves beside it)
# Never run in CI (it needs a GPU). Every step's exit status is logged; a failing step does not stop
# the ones after it, and a step that cannot run says SKIPPED with the reason (never a pass).
#
# Usage: bench/gpu-train.sh [out-dir]                       (default: bench/results)
# Environment:
#   CUDAARCHS   CUDA architectures to build for                              [90]
#   BUILD_DIR   build directory (configured afresh)                          [build-gpu-train]
#   RANKS       GPUs to train on                                             [every GPU nvidia-smi lists]
#   EPOCHS      epochs of the accuracy run                                   [6]
#   BATCH       global batch                                                 [128]
#   VENV        a Python venv with torch (CUDA build) and numpy; when it has no torch, the script
#               tries `pip install torch numpy` into it (PyPI must be reachable)  [.venv-gpu]
#   DOCTEST_DIR / CMAKE_ARGS   as for bench/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${1:-bench/results}
mkdir -p "$out"
stamp=$(date -u +%Y-%m-%d)
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
log="$out/gpu-train-$stamp-$rev.log"
build=${BUILD_DIR:-build-gpu-train}
arch=${CUDAARCHS:-90}
epochs=${EPOCHS:-6}
batch=${BATCH:-128}
venv=${VENV:-.venv-gpu}
: >"$log"
say() { echo "$*" | tee -a "$log"; }
step() { # step NAME COMMAND...: runs it, logs its output and exit status
  local name=$1
  shift
  say "=== $name: $*"
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  say "=== $name: exit $rc"
  return "$rc"
}

say "gpu-train.sh $(date -u +%FT%TZ) host $(hostname) commit $rev$(git diff --quiet 2>/dev/null || echo ' (dirty tree)')"
step machine nvidia-smi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
ranks=${RANKS:-$gpus}
if [ "${ranks:-0}" -lt 1 ]; then
  say "SKIPPED everything: no GPU listed by nvidia-smi"
  exit 1
fi
step nvcc nvcc --version

extra=()
[ -n "${DOCTEST_DIR:-}" ] && extra+=("-Ddoctest_DIR=$DOCTEST_DIR")
# shellcheck disable=SC2086 # CMAKE_ARGS is a list of arguments
step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" "${extra[@]}" ${CMAKE_ARGS:-}
step build cmake --build "$build" --target resnet_fmnist_cuda
bin="$build/examples/resnet_fmnist/resnet_fmnist_cuda"

# 1. Accuracy: the committed CPU runs' recipe (ResNet-20, SGD-Nesterov, cosine, batch 128) on GPUs.
if [ -x "$bin" ]; then
  step train "$bin" --backend cuda --ranks "$ranks" --epochs "$epochs" --batch "$batch" --log-every 100 \
    --csv "$out/gpu-train-$stamp-$rev.csv"
  acc=$(grep 'test accuracy' "$log" | tail -1 | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/')
  if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a >= 92.0) }'; then
    say "RESULT accuracy: ${acc}% after $epochs epochs: reached 92%"
  else
    say "RESULT accuracy: ${acc:-none}% after $epochs epochs: did NOT reach 92%"
  fi
else
  say "SKIPPED train: $bin was not built"
fi

# 2. One epoch each, braid then PyTorch, same model, batch, data and GPUs: images/s side by side.
if [ -x "$bin" ]; then
  step braid-epoch "$bin" --backend cuda --ranks "$ranks" --epochs 1 --batch "$batch" --log-every 100 --csv /dev/null
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  python3 -m venv "$venv" 2>&1 | tee -a "$log"
  step pip "$venv/bin/pip" install -q torch numpy
fi
if "$venv/bin/python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  step torch-version "$venv/bin/python" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  step pytorch-epoch "$venv/bin/python" bench/vs_pytorch_resnet.py --device cuda --ranks "$ranks" --batch "$batch" \
    --epochs 1 --train-subset 60000 --test-subset 10000
  b=$(grep -A1000 '=== braid-epoch' "$log" | grep -o 'images/s [0-9.]*' | tail -1 | cut -d' ' -f2)
  t=$(grep -o 'pytorch device cuda .* images/s [0-9.]*' "$log" | grep -o 'images/s [0-9.]*' | tail -1 | cut -d' ' -f2)
  if [ -n "$b" ] && [ -n "$t" ]; then
    say "RESULT images/s on $ranks GPU(s): braid $b, PyTorch $t, ratio braid/PyTorch $(echo "scale=2; $b / $t" | bc)"
  fi
else
  say "SKIPPED pytorch-epoch: no torch with CUDA in $venv (PyPI unreachable, or a CPU-only wheel)"
fi
say "log: $log"
