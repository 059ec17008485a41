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
#   BIN_DIR     a folder holding resnet_fmnist_cuda (and resnet_pipeline_cuda) built elsewhere for this
#               GPU (bench/gpu-prebuilt.sh pack-train): no configure or build here
#   DATA        the Fashion-MNIST folder (the four .gz files)   [/usr/share/datasets/fashion-mnist]
#   PYTHON      a python with torch (CUDA build); when set, no venv is made
#   SHORT=1     only the quick steps (one braid epoch, one PyTorch epoch, a bf16 epoch, 2 ranks sharing
#               GPU 0, the 2-stage pipeline sharing GPU 0), not the accuracy run
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
data=()
[ -n "${DATA:-}" ] && data=(--data "$DATA")
if [ -n "${BIN_DIR:-}" ]; then
  say "prebuilt binaries from $BIN_DIR (no build here)"
  bin="$BIN_DIR/resnet_fmnist_cuda"
  pipe="$BIN_DIR/resnet_pipeline_cuda"
else
  step nvcc nvcc --version
  extra=()
  [ -n "${DOCTEST_DIR:-}" ] && extra+=("-Ddoctest_DIR=$DOCTEST_DIR")
  # shellcheck disable=SC2086 # CMAKE_ARGS is a list of arguments
  step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" "${extra[@]}" ${CMAKE_ARGS:-}
  step build cmake --build "$build" --target resnet_fmnist_cuda resnet_pipeline_cuda
  bin="$build/examples/resnet_fmnist/resnet_fmnist_cuda"
  pipe="$build/examples/resnet_pipeline/resnet_pipeline_cuda"
fi
py=${PYTHON:-$venv/bin/python}

# 0. SHORT=1: the quick steps first, so that a short lease sees each path run once.
if [ "${SHORT:-0}" = 1 ] && [ -x "$bin" ]; then
  step braid-epoch "$bin" --backend cuda --ranks 1 --epochs 1 --batch "$batch" --log-every 100 --csv /dev/null "${data[@]}"
  if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    step torch-version "$py" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
    step pytorch-epoch "$py" bench/vs_pytorch_resnet.py --device cuda --ranks 1 --batch "$batch" \
      --epochs 1 --train-subset 60000 --test-subset 10000 "${data[@]}"
  else
    say "SKIPPED pytorch-epoch: $py has no torch with CUDA"
  fi
  step braid-epoch-bf16 "$bin" --backend cuda --ranks 1 --epochs 1 --batch "$batch" --precision bf16 --log-every 100 --csv /dev/null "${data[@]}"
  step braid-2-ranks-gpu0 "$bin" --backend cuda --ranks 2 --gpus 1 --epochs 1 --batch "$batch" --train-subset 8192 --test-subset 2000 \
    --log-every 16 --csv /dev/null "${data[@]}"
  if [ -x "$pipe" ]; then
    step pipeline-2-stages-gpu0 "$pipe" --backend cuda --stages 2 --gpus 1 --micro 4 --epochs 1 --batch "$batch" --train-subset 8192 \
      --test-subset 2000 --log-every 16 "${data[@]}"
  fi
  # The device against the host on the same 8 steps (no augmentation): the step losses side by side.
  cmp=(--ranks 1 --epochs 1 --batch "$batch" --train-subset $((8 * batch)) --test-subset 500 --log-every 1 --no-augment)
  step host-8-steps "$bin" --backend host "${cmp[@]}" --csv "$out/cmp-host.csv" "${data[@]}"
  step cuda-8-steps "$bin" --backend cuda "${cmp[@]}" --csv "$out/cmp-cuda.csv" "${data[@]}"
  if [ -s "$out/cmp-host.csv" ] && [ -s "$out/cmp-cuda.csv" ]; then
    say "step loss: host, GPU, |difference|"
    paste -d, <(grep '^train' "$out/cmp-host.csv" | cut -d, -f3,4) <(grep '^train' "$out/cmp-cuda.csv" | cut -d, -f4) |
      awk -F, '{ d = $2 - $3; if (d < 0) d = -d; if (d > m) m = d; printf "  step %s  %.7f  %.7f  %.2e\n", $1, $2, $3, d }
               END { printf "RESULT device vs host, 8 steps: largest loss difference %.2e\n", m }' | tee -a "$log"
  fi
fi
[ "${SHORT:-0}" = 1 ] && { say "log: $log"; exit 0; }

# 1. Accuracy: the committed CPU runs' recipe (ResNet-20, SGD-Nesterov, cosine, batch 128) on GPUs.
if [ -x "$bin" ]; then
  step train "$bin" --backend cuda --ranks "$ranks" --epochs "$epochs" --batch "$batch" --log-every 100 \
    --csv "$out/gpu-train-$stamp-$rev.csv" "${data[@]}"
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
  step braid-epoch "$bin" --backend cuda --ranks "$ranks" --epochs 1 --batch "$batch" --log-every 100 --csv /dev/null "${data[@]}"
fi
if [ -z "${PYTHON:-}" ] && { [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch' 2>/dev/null; }; then
  python3 -m venv "$venv" 2>&1 | tee -a "$log"
  step pip "$venv/bin/pip" install -q torch numpy
fi
if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  step torch-version "$py" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
  step pytorch-epoch "$py" bench/vs_pytorch_resnet.py --device cuda --ranks "$ranks" --batch "$batch" \
    --epochs 1 --train-subset 60000 --test-subset 10000 "${data[@]}"
  b=$(grep -A1000 '=== braid-epoch' "$log" | grep -o 'images/s [0-9.]*' | tail -1 | cut -d' ' -f2)
  t=$(grep -o 'pytorch device cuda .* images/s [0-9.]*' "$log" | grep -o 'images/s [0-9.]*' | tail -1 | cut -d' ' -f2)
  if [ -n "$b" ] && [ -n "$t" ]; then
    say "RESULT images/s on $ranks GPU(s): braid $b, PyTorch $t, ratio braid/PyTorch $(echo "scale=2; $b / $t" | bc)"
  fi
else
  say "SKIPPED pytorch-epoch: no torch with CUDA in $py (PyPI unreachable, or a CPU-only wheel)"
fi
say "log: $log"
