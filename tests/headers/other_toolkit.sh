#!/usr/bin/env bash
# Compiles braid's public CUDA headers with a toolchain other than the one CMake builds with
# (docs/toolkits.md). Registered as CTest tests by tests/headers/CMakeLists.txt where nvcc exists:
#
#   nvcc-pypi        the pinned newest nvcc from PyPI (scripts/toolkits.env), with its own runtime
#                    headers and CCCL: tests/headers/cuda_calls.cu (it includes every public CUDA header;
#                    every collective of both CUDA communicators and braid::nn's device kernels: some 50
#                    kernels, to compute_90 PTX, -c only). Each *.cuh alone is header_check_cuda's job (the build's
#                    nvcc); doing it again here cost about 120 s of CPU per CI run (2026-11-27) and was
#                    dropped. BRAID_TOOLKIT_EACH_HEADER=1 brings it back.
#   cuda12-headers   the installed nvcc, but with CUDA 12.4's runtime API headers and CCCL 2.3 ahead of
#                    its own: cuda_calls.cu (it includes every public CUDA header). This checks braid
#                    against 12.4's API and CCCL 2.3, device code included; it is not a 12.4 compiler
#                    (the front end, code generator and crt headers are the installed nvcc's).
#
# cuda_calls.cu is compiled first, with a probe in front (-include) that fails unless the compiler and
# headers in use are the pinned ones, so a toolchain that falls back to the installed headers fails.
# A toolchain that is not installed fails the test too (scripts/deps-toolkits.sh installs it;
# scripts/test.sh runs that). Every TU is compiled even after a failure, so one run names them all.
#
# Usage: other_toolkit.sh MODE OUT_DIR INSTALLED_NVCC ARCH [HOST_CXX]
set -uo pipefail

mode=${1:?mode}
out=${2:?out dir}
installed_nvcc=${3:?installed nvcc}
arch=${4:?cuda architecture, e.g. 90}
host_cxx=${5:-}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=../../scripts/toolkits.env
. "$repo/scripts/toolkits.env"

# major.minor[.patch...] -> the CUDART_VERSION / __CUDACC_VER_* encoding, e.g. 13.5.37 -> 13050.
cuda_number() {
  local major=${1%%.*} rest=${1#*.}
  echo $((major * 1000 + ${rest%%.*} * 10))
}

extra=()
case "$mode" in
  nvcc-pypi)
    dir=$repo/.deps/nvcc-$NVCC_PYPI_VERSION
    nvcc=$dir/nvidia/cu13/bin/nvcc
    want=$(cuda_number "$NVCC_PYPI_VERSION")
    probe_defs=(-DBRAID_EXPECT_CUDACC="$want" -DBRAID_EXPECT_CUDART="$want")
    tus=()
    if [ "${BRAID_TOOLKIT_EACH_HEADER:-0}" = 1 ]; then
      while IFS= read -r h; do tus+=("header:$h"); done < <(cd "$repo/include" && find braid -name '*.cuh' -not -path 'braid/mpi/*' | LC_ALL=C sort)
    fi
    ;;
  cuda12-headers)
    dir=$repo/.deps/cuda-$CUDA12_RUNTIME_VERSION-headers
    nvcc=$installed_nvcc
    # Both with -I: nvcc's own -I directory is searched before any -isystem one, and would supply
    # headers (nv/target) that 12.4's CCCL has too. What still comes from the installed toolkit is
    # its crt/ directory, the compiler's own headers.
    extra=(-I "$dir/nvidia/cuda_runtime/include" -I "$dir/nvidia/cuda_cccl/include")
    # CUDA 12.4 Update 1: CUDART_VERSION 12040; its CCCL wheel is 2.3.x (CCCL_VERSION 2003xxx).
    probe_defs=(-DBRAID_EXPECT_CUDART="$(cuda_number "$CUDA12_RUNTIME_VERSION")" -DBRAID_EXPECT_CCCL_MINOR=2003)
    tus=()
    ;;
  *)
    echo "other_toolkit.sh: unknown mode '$mode' (nvcc-pypi or cuda12-headers)" >&2
    exit 2
    ;;
esac
tus=("file:$repo/tests/headers/cuda_calls.cu" "${tus[@]}")

if [ ! -f "$dir/.installed" ] || [ ! -x "$nvcc" ]; then
  echo "MISSING: $dir (or its nvcc): scripts/deps-toolkits.sh installs it from PyPI (scripts/test.sh runs it);"
  echo "         without it this check cannot run, and that is a failure, not a skip"
  exit 1
fi
echo "toolchain: $("$nvcc" --version | grep -m1 release) ($nvcc)"
[ "$mode" = cuda12-headers ] && echo "headers:   $(cat "$dir/.installed")"

mkdir -p "$out"
# shellcheck disable=SC2054 # the commas belong to -Xcompiler
# PTX for compute_ARCH only, with NVVM at -O0: these objects are never run; the toolkit's front end,
# its headers and its code generator are what is checked. ptxas assembles every kernel once, with the
# build's nvcc (header_check_cuda), and the optimised kernels are checked by static_kernel_checks.
# cuda_calls.cu with nvcc 13.0 alone on the 2-core VM, 2026-11-27: 55 s for sm_90 at ptxas -O0
# (cicc 27 s, ptxas 14 s), 17 s so (cicc 5 s, no ptxas).
flags=(-std=c++20 "-arch=compute_$arch" -Xcicc=-O0 -Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror
       "${extra[@]}" -I "$repo/include")
[ -n "$host_cxx" ] && flags+=(-ccbin "$host_cxx")

failed=()
compile() { # NAME TU [defines...]
  local name=$1 tu=$2 t0=$SECONDS
  shift 2
  if "$nvcc" "${flags[@]}" "$@" -c "$tu" -o "$out/$(basename "$tu").o"; then
    echo "ok    $name ($((SECONDS - t0)) s)"
  else
    echo "FAIL  $name"
    failed+=("$name")
  fi
}

start=$SECONDS
cat >"$out/probe.h" <<'EOF'
// Fails unless the compiler and headers are the ones this check pins (tests/headers/other_toolkit.sh).
#include <cuda_runtime_api.h>
#include <cuda/atomic>
#if defined(BRAID_EXPECT_CUDACC) && __CUDACC_VER_MAJOR__ * 1000 + __CUDACC_VER_MINOR__ * 10 != BRAID_EXPECT_CUDACC
#error "not the pinned nvcc"
#endif
#if defined(BRAID_EXPECT_CUDART) && CUDART_VERSION != BRAID_EXPECT_CUDART
#error "not the pinned CUDA runtime headers (CUDART_VERSION)"
#endif
#if defined(BRAID_EXPECT_CCCL_MINOR) && CCCL_VERSION / 1000 != BRAID_EXPECT_CCCL_MINOR
#error "not the pinned CCCL headers (CCCL_VERSION)"
#endif
EOF
for t in "${tus[@]}"; do
  case "$t" in
    header:*)
      h=${t#header:}
      tu="$out/$(echo "$h" | tr / _).cu"
      printf '// Generated by tests/headers/other_toolkit.sh: %s alone, included twice.\n#include <%s>\n#include <%s>\n' \
        "$h" "$h" "$h" >"$tu"
      compile "$h" "$tu"
      ;;
    file:*) compile "${t#file:"$repo"/} (with the version probe)" "${t#file:}" -include "$out/probe.h" "${probe_defs[@]}" ;;
  esac
done
echo "$mode: $((SECONDS - start)) s, ${#failed[@]} failed"
if ((${#failed[@]})); then
  printf 'failed: %s\n' "${failed[@]}"
  exit 1
fi
