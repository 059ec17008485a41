#!/usr/bin/env bash
# Sets up and runs every test: installs the Debian packages, configures, builds (CUDA sources too when
# nvcc exists, for sm_90 unless CUDAARCHS says otherwise) and runs CTest. GPU tests report skipped
# where there is no GPU. Then the CPU tests under sanitizers, and the PyTorch backend's tests with the
# pinned torch (scripts/test-torch.sh; BRAID_TORCH=0 skips them). Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bash scripts/deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
# Release, but the host compiler at -O2 instead of CMake's -O3: the tests are template instantiations
# by the thousand, and -O3 compiles the biggest (test_reference_sweep.cpp) in 122 s against -O2's 89 s
# (2-core VM, 2026-11-27); -O2 is also what most users build with. scripts/bench.sh builds at -O3.
# For .cu files nvcc's -O is the host side only: launch_procs.cu's host compile 45 -> 34 s, and its
# PTX and SASS are byte-identical (cuobjdump), so static_kernel_checks reads the same kernels. Where
# configure finds no GPU, tests/cuda sets those objects' host side to -O0 (tests/cuda/CMakeLists.txt).
# BRAID_BUILD_TESTS=ON explicitly: a folder configured by scripts/bench.sh (tests off) builds them again.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRAID_BUILD_TESTS=ON "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" \
  "-DCMAKE_CUDA_FLAGS_RELEASE=-O2 -DNDEBUG"
cmake --build "$build" -j "$(nproc)"
# ctest starts the longest tests first when it knows their times (Testing/Temporary/CTestCostData.txt,
# which every run rewrites). A fresh build tree has none and runs the tests in declaration order, which
# left long tests running alone at the end: the main ctest took 904 s in a fresh-clone CI and 751 s when
# rerun in the same tree (2-core Xeon VM, 2026-11-28). So a fresh tree starts from tests/ctest-costs.txt,
# the times of such a run; tests missing from it only lose their place in the order.
costs="$build/Testing/Temporary/CTestCostData.txt"
if [ ! -f "$costs" ]; then
  mkdir -p "$(dirname "$costs")"
  cp tests/ctest-costs.txt "$costs"
fi
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 1800)
# The CPU tests under ASan+UBSan and under TSan, each in its own build directory (docs/reliability.md).
# BRAID_SANITIZERS=0 skips them.
if [ "${BRAID_SANITIZERS:-1}" != 0 ]; then
  bash scripts/sanitize.sh asan "$build-asan"
  bash scripts/sanitize.sh tsan "$build-tsan"
fi
# The PyTorch backend (python/): the pinned torch into .deps/, braid_torch built against it, its own
# tests and PyTorch's distributed test suite with backend braid (docs/torch.md).
if [ "${BRAID_TORCH:-1}" != 0 ]; then
  bash scripts/test-torch.sh
fi
