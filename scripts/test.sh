#!/usr/bin/env bash
# Sets up and runs every test: installs the Debian packages, configures, builds (CUDA sources too when
# nvcc exists, for sm_90 unless CUDAARCHS says otherwise) and runs CTest. GPU tests report skipped
# where there is no GPU. Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bash scripts/deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 1800
