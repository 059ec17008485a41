#!/usr/bin/env bash
# Installs the Debian packages braid's build, tests and benchmarks use (skips what is present).
# The CUDA toolkit is not installed here: the CUDA parts build when nvcc is found. Where nvcc is found,
# scripts/deps-toolkits.sh then installs the pinned second CUDA toolchains the header tests compile with
# (PyPI, into .deps/), and scripts/cuda-tools.sh cuobjdump and nvdisasm (PyPI) for the static kernel
# checks; if either fails, this goes on and those tests fail.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(cmake ninja-build g++ universal-ctags doctest-dev libbenchmark-dev libopenblas-dev libdnnl-dev zlib1g-dev dataset-fashion-mnist clang libclang-rt-14-dev openmpi-bin libopenmpi-dev "$@")
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || [ -n "${CUDACXX:-}" ]; then
  pkgs+=(python3 python3-pip) # the static kernel checks and their tools
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
bash "$(dirname "$0")/deps-toolkits.sh" ||
  echo "deps: the second CUDA toolchains were not installed: the header_check_nvcc_pypi and header_check_cuda12_headers tests will fail" >&2
bash scripts/cuda-tools.sh
