#!/usr/bin/env bash
# bench/gpu-plan.sh — one lent GPU window (15 minutes of device time, the 1-2 minute start included),
# prepared: every step has its own time limit, and the log is written as the steps run, so a step cut
# by its limit (or the window's end) keeps the earlier steps' lines.
#
# Here (no GPU), first:
#   NCCL_SRC=.deps/nccl-src bench/build-nccl.sh                     # NCCL 2.30+ for sm_90 (about 5 min)
#   NCCL_HOME=$PWD/.deps/nccl-2.30.7-sm90 bench/gpu-prebuilt.sh pack .gpu   # braid's GPU binaries + NCCL
# There, with .gpu carried (device tool: carry [".gpu"]):
#   bash bench/gpu-plan.sh [STEPS]        # STEPS: comma list of the names below (default: all)
# The log goes to $OUT/gpu-plan.log (the device tool's output folder), else bench/results/.
#
# Step (limit, expected):
#   test    the GPU regression: test_gpu, test_gpu_procs (170 s; 2.5 min: 2026-11-27's H200 run)
#   nccl    braid and NCCL, all_reduce float sum, 2 ranks on the one GPU, 8 B-256 MiB, -c 1, and braid
#           with --order streams (call_order::streams) to 16 MiB (150 s + 2 x 20 s; 2.5 min)
#   ranks   braid alone at 4 and 8 ranks, same sizes (120 s; 1.5 min)
#   rounds  braid at 2 ranks, 32-256 MiB, default staging (8 MiB) against 64 MiB: out-of-place calls of
#           ranks on one GPU run one round now, so the two should match (docs/gpu-kernels.md predicts
#           71 us at 32 MiB, 506 us at 256 MiB); in place stays staged (40 s; 0.5 min)
#   torch   braid_torch built there against the image's torch (16 cores), its CUDA tests:
#           python/tests/test_cuda.py (240 s; 3 min, the build about 1 of them: 3 on 2 cores here)
#   mps     the process device path on the one GPU under CUDA MPS, where nvidia-cuda-mps-control
#           exists: the daemon started with its pipe and log folders under /tmp, braid-bench
#           --procs 2 and 4 with BRAID_TEST_SHARED_GPU_DEVICE_PATH=1 (the test-only opt-in that takes
#           the device path where processes share a GPU), -c 1, BRAID_TIMEOUT=20; the daemon quit on
#           every exit path; compute mode read before and after, never set (120 s; 1.5 min)
# Every timed row also prints --enqueue-time's host time and --graph's replay time per call.
# Sum of the expected minutes: 12, plus the start: about 13.5 of the window's 15 (drop torch or mps
# if the start is slow).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$repo" || exit 2
steps=",${1:-test,nccl,ranks,rounds,torch,mps},"
out=${OUT:-$repo/bench/results}
mkdir -p "$out"
log=$out/gpu-plan.log
dir=$(realpath -m "${GPU_PREBUILT_DIR:-.gpu}")
say() { printf '%s\n' "$*" | tee -a "$log"; }
# run NAME SECONDS CMD...: CMD's output into the log as it comes, its exit status and wall time after.
run() {
  local name=$1 secs=$2
  shift 2
  say "==== $name (limit $secs s): $*"
  local t0=$SECONDS
  timeout -s INT -k 10 "$secs" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  say "---- $name: exit $rc in $((SECONDS - t0)) s$([ "$rc" = 124 ] && echo ' (time limit)')"
}
want() { [[ $steps == *",$1,"* ]]; }

say "# bench/gpu-plan.sh, $(date -u +%FT%TZ), commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?'), steps ${steps//,/ }"
say "# $(nvidia-smi --query-gpu=name,driver_version,compute_mode,mig.mode.current --format=csv,noheader 2>&1 | head -1) (read, not changed)"
[ -f "$dir/root" ] || { say "gpu-plan: $dir is not a pack (bench/gpu-prebuilt.sh pack)"; exit 2; }

if want test; then
  run test 170 bash bench/gpu-prebuilt.sh run test 160 BRAID_TIMEOUT=30 BRAID_GPU_SWEEP_LARGE=100003
fi

# The packed binaries and NCCL, as gpu-prebuilt.sh run lays them out.
bench_bin="$dir/build-gpu-check/bench/braid-bench"
# shellcheck source=gpu-prebuilt.sh
GPU_PREBUILT_SOURCED=1 . "$repo/bench/gpu-prebuilt.sh"
pack_env "$dir" >>"$log"
sizes=(-d float -o sum -b 8 -e 256M -f 4 -n 20 -w 5 -c 1 --enqueue-time --graph)

if want nccl; then
  # Interleaved: braid, NCCL, braid, NCCL, 2 ranks on GPU 0 (one process; NCCL's ranks share the GPU
  # through NCCL_MULTI_RANK_GPU_ENABLE, 2.30 and later). Never NCCL --procs here: without MPS the
  # kernels of its processes would wait for each other until killed.
  for pass in 1 2; do
    run "braid pass $pass" 35 env BRAID_TIMEOUT=30 "$bench_bin" all_reduce "${sizes[@]}" -np 2 --backend cuda
    # call_order::streams: a call is its launch (no event, no query).
    run "braid streams-order pass $pass" 25 env BRAID_TIMEOUT=30 "$bench_bin" all_reduce -d float -o sum -b 8 -e 16M -f 4 -n 20 -w 5 -c 1 \
      --enqueue-time --graph -np 2 --backend cuda --order streams
    if [ -f "$dir/nccl/libnccl.so.2.gz" ]; then
      run "nccl pass $pass" 35 env NCCL_MULTI_RANK_GPU_ENABLE=1 "$bench_bin" all_reduce "${sizes[@]}" -np 2 --backend nccl
    else
      say "nccl pass $pass: skipped: the pack has no NCCL (pack with NCCL_HOME set)"
    fi
  done
fi

if want ranks; then
  for np in 4 8; do
    run "braid $np ranks" 60 env BRAID_TIMEOUT=30 "$bench_bin" all_reduce "${sizes[@]}" -np "$np" --backend cuda
  done
fi

if want rounds; then
  for staging in 8M 64M; do
    run "braid rounds, staging $staging" 20 env BRAID_TIMEOUT=30 BRAID_STAGING_BYTES=$staging "$bench_bin" all_reduce -d float -o sum \
      -b 32M -e 256M -f 8 -n 20 -w 5 -c 1 -np 2 --backend cuda
  done
fi

if want torch; then
  # The image's python3 and torch (2.11.0, CUDA 13.0); braid_torch built there against them.
  py=${PYTHON:-python3}
  site=${TMPDIR:-/tmp}/braid-torch-site
  run "torch: build braid_torch" 120 env MAX_JOBS="$(nproc)" BRAID_TORCH_CUDA=1 \
    "$py" -m pip install -q --no-build-isolation --no-deps --no-cache-dir --target "$site" ./python
  run "torch: python/tests/test_cuda.py" 120 env PYTHONPATH="$site" PYTHONUNBUFFERED=1 BRAID_TIMEOUT=30 \
    "$py" -m pytest -q -rs -p no:cacheprovider python/tests/test_cuda.py
fi

if want mps; then
  if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    export CUDA_MPS_PIPE_DIRECTORY=${TMPDIR:-/tmp}/braid-mps/pipe CUDA_MPS_LOG_DIRECTORY=${TMPDIR:-/tmp}/braid-mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    say "# mps: before: $(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>&1 | head -1) (read, not changed)"
    quit_mps() { echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true; }
    trap 'quit_mps' EXIT INT TERM
    if nvidia-cuda-mps-control -d; then
      for np in 2 4; do
        run "mps: process device path, $np processes on one GPU" 50 env BRAID_TEST_SHARED_GPU_DEVICE_PATH=1 BRAID_TIMEOUT=20 BRAID_DEBUG=1 \
          "$bench_bin" all_reduce -d float -o sum -b 8 -e 64M -f 8 -n 20 -w 5 -c 1 --backend cuda --procs "$np"
      done
      quit_mps
      say "# mps: daemon quit; its log: $(tail -3 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null | tr '\n' ' ')"
    else
      say "mps: nvidia-cuda-mps-control -d failed: skipped"
    fi
    trap - EXIT INT TERM
    say "# mps: after: $(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>&1 | head -1)"
  else
    say "==== mps: skipped: nvidia-cuda-mps-control is not on this machine"
  fi
fi
say "# gpu-plan: done, $(date -u +%FT%TZ)"
