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
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 1800)
# The CPU tests under ASan+UBSan and under TSan, each in its own build directory (docs/reliability.md).
# BRAID_SANITIZERS=0 skips them.
if [ "${BRAID_SANITIZERS:-1}" != 0 ]; then
  bash scripts/sanitize.sh asan "$build-asan"
  bash scripts/sanitize.sh tsan "$build-tsan"
fi
