#!/usr/bin/env bash
# The main job: installs what it needs, builds, and runs braid-bench over every collective and every
# algorithm with checking on (#wrong must be 0): on CUDA (one process, and all_reduce with ranks as
# processes) when a GPU is present, and on
# the CPU (ranks as threads and as processes) always; then the Fashion-MNIST trainer briefly.
# Usage: scripts/bench.sh [build-dir]   (default build-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
# A build folder of its own: its cache says BRAID_BUILD_TESTS=OFF, which must not reach the folder
# scripts/test.sh builds and runs the tests from.
build=${1:-build-bench}
bash scripts/deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRAID_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target braid-bench
bench="$build/bench/braid-bench"
status=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  # On CUDA: ranks are GPUs driven by one process (several ranks share a GPU where there are fewer).
  # The GPU tests and sanitizers are bench/gpu-check.sh.
  echo "# GPU present: $(nvidia-smi -L | head -1)"
  for np in 2 4 8; do
    "$bench" all -a all -d float -o sum -c 1 -b 8 -e 256M -f 8 -n 20 -w 5 -np "$np" --backend cuda || status=$?
  done
  # Ranks as processes over CUDA IPC (braid::cuda::process_communicator).
  for np in 2 4; do
    "$bench" all_reduce -d float -o sum -c 1 -b 8 -e 256M -f 8 -n 20 -w 5 --backend cuda --procs "$np" || status=$?
  done
fi
for backend in threads procs; do
  for np in 2 4 8; do
    "$bench" all -a all -d float -o sum -c 1 -b 8 -e 16M -f 8 -n 5 -w 1 -np "$np" --backend "$backend" || status=$?
  done
done
# Training (issue 5), on the CPU (the CUDA trainer is not built yet): ResNet-20 on Fashion-MNIST,
# 2 ranks as threads, 1 epoch over the first 2048 training images, tested on the first 1000 test images.
# The target exists where BLAS and zlib were found (deps.sh installs them); a build error fails the job.
if grep -q "resnet_fmnist" "$build/build.ninja" 2>/dev/null; then
  cmake --build "$build" -j "$(nproc)" --target resnet_fmnist
  echo "# resnet_fmnist: ResNet-20, 2 thread ranks, batch 64, 1 epoch on training images 0..2047, test images 0..999"
  "$build/examples/resnet_fmnist/resnet_fmnist" --ranks 2 --epochs 1 --batch 64 --train-subset 2048 \
    --test-subset 1000 --log-every 8 --csv "$build/resnet_fmnist.csv" || status=$?
else
  echo "# resnet_fmnist not built: it needs libopenblas-dev and zlib1g-dev (and dataset-fashion-mnist to run)"
fi
exit $status
