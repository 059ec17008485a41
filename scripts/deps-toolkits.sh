#!/usr/bin/env bash
# Installs, from PyPI with pip into <repo>/.deps/, the pinned CUDA toolchains of scripts/toolkits.env:
#   .deps/nvcc-<NVCC_PYPI_VERSION>/       a second, newer nvcc (nvidia/cu13/bin/nvcc) with its headers
#   .deps/cuda-<CUDA12_RUNTIME_VERSION>-headers/  CUDA 12.4's runtime headers and CCCL 2.3 (no compiler)
# Only where an nvcc is found (CUDACXX, PATH or /usr/local/cuda/bin): elsewhere the CUDA parts are not
# built and the tests that use these are not registered. pip is Debian's python3-pip where python3 has
# none (--target installs outside any Python environment, so Debian's externally-managed rule does not
# apply). Each directory is installed once, into a temporary directory moved into place when pip
# succeeded, so a half-installed one is never taken for complete.
# Exit status 1 when an install failed: the header tests that need it then fail too (tests/headers).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=toolkits.env
. scripts/toolkits.env
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "deps-toolkits: no nvcc here: the second-toolkit header tests are not built, nothing to install"
  exit 0
fi
pip=(env PIP_ROOT_USER_ACTION=ignore python3 -m pip)
if ! "${pip[@]}" --version >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "deps-toolkits: installing python3-pip"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null; } || true
fi
if ! "${pip[@]}" --version >/dev/null 2>&1; then
  echo "deps-toolkits: FAILED: python3 -m pip is missing (Debian: apt-get install python3-pip)" >&2
  exit 1
fi
mkdir -p .deps
# install DIR PACKAGE==VERSION... : pip install --target DIR (no dependencies: every wheel is pinned).
install() {
  local dir=.deps/$1
  shift
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$*" ]; then
    echo "deps-toolkits: $dir is installed"
    return 0
  fi
  echo "deps-toolkits: installing $* into $dir"
  rm -rf "$dir" "$dir.tmp"
  if ! "${pip[@]}" install --quiet --disable-pip-version-check --no-deps --no-compile --target "$dir.tmp" "$@"; then
    rm -rf "$dir.tmp"
    echo "deps-toolkits: FAILED: pip install $* (the header tests that need $dir will fail)" >&2
    return 1
  fi
  echo "$*" >"$dir.tmp/.installed"
  mv "$dir.tmp" "$dir"
}
rc=0
install "nvcc-$NVCC_PYPI_VERSION" "nvidia-cuda-nvcc==$NVCC_PYPI_VERSION" "nvidia-cuda-crt==$NVCC_PYPI_VERSION" \
  "nvidia-nvvm==$NVCC_PYPI_VERSION" "nvidia-cuda-runtime==$NVCC_PYPI_VERSION" "nvidia-cuda-cccl==$NVCC_PYPI_CCCL_VERSION" || rc=1
install "cuda-$CUDA12_RUNTIME_VERSION-headers" "nvidia-cuda-runtime-cu12==$CUDA12_RUNTIME_VERSION" \
  "nvidia-cuda-cccl-cu12==$CUDA12_CCCL_VERSION" || rc=1
exit "$rc"
