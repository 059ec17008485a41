#!/usr/bin/env bash
# bench/gpu-prebuilt.sh — build braid's GPU binaries on a machine without a GPU, run them on one with.
#
# A lent GPU machine's time is short; building the GPU targets there costs minutes of it. This packs
# a build made here (for sm_90 unless CUDAARCHS says otherwise) into one folder to carry, and runs
# bench/gpu-check.sh on it there, its build step skipped. How it was used first:
# bench/results/h100-2026-11-25/README.md.
#
#   bench/gpu-prebuilt.sh pack [DIR]
#       here (nvcc, doctest and Google Benchmark installed: scripts/deps.sh): configures
#       build-gpu-check (Release, CUDA on, the real-GPU tests registered, NCCL_HOME used when set),
#       builds test_gpu, test_gpu_procs, braid-bench, braid-micro and braid-gpu-sync-probe, and copies
#       into DIR (default .gpu, git-ignored) the stripped binaries gzipped, the CTest files, libbenchmark
#       and the path they were built under. About 5 minutes on 2 cores; it prints the pack's size and
#       what travels with the tracked files (at most 64 MiB may). The binaries need a glibc no older
#       than this machine's. With NCCL_HOME set (an NCCL from bench/build-nccl.sh) braid-bench gets
#       --backend nccl and the library travels in DIR/nccl, gzipped; `run` unpacks the binaries and
#       NCCL, and names NCCL in NCCL_HOME and LD_LIBRARY_PATH.
#   bench/gpu-prebuilt.sh run STEPS SECONDS [VAR=VALUE ...]
#       there, from the repository root with DIR carried: runs gpu-check.sh with GPU_CHECK_STEPS=STEPS
#       (test, memcheck, racecheck, bench; comma separated), at most SECONDS, VAR=VALUE in its
#       environment (e.g. BRAID_TIMEOUT=30 SANITIZER_TIMEOUT=100), the log into $OUT when set (the
#       device tool's output folder), else bench/results. DIR from GPU_PREBUILT_DIR (default .gpu).
#       The CTest files name the build path of the pack machine; that path is made to point here.
#   bench/gpu-prebuilt.sh pack-train [DIR]
#       here: configures $TRAIN_BUILD (default build-gpu-train; Release, CUDA on, examples only), builds
#       resnet_fmnist_cuda and resnet_pipeline_cuda, and copies them stripped into DIR/train with the
#       libraries they need that a CUDA machine may lack (the CBLAS braid::nn links) into DIR/lib.
#       There: `BIN_DIR=DIR/train LD_LIBRARY_PATH=DIR/lib:... bench/gpu-train.sh` (bench/gpu-train.sh).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# The libraries of pack DIR on the loader's path, and its NCCL unpacked and named in NCCL_HOME (the
# machine's own, e.g. a PyTorch wheel's, is never picked up). bench/gpu-plan.sh sources this file for
# it (GPU_PREBUILT_SOURCED=1): nothing below the function runs then.
pack_env() {
  # The binaries travel gzipped (pack): unpacked beside their .gz once, on the first use.
  local z
  while IFS= read -r z; do
    [ -e "${z%.gz}" ] || { gunzip -k "$z" && chmod +x "${z%.gz}"; } || return 1
  done < <(find "$1/build-gpu-check" -name '*.gz' 2>/dev/null)
  export LD_LIBRARY_PATH="$1/lib:${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ -f "$1/nccl/libnccl.so.2.gz" ]; then
    export NCCL_HOME=${TMPDIR:-/tmp}/braid-nccl
    mkdir -p "$NCCL_HOME/lib" && gunzip -c "$1/nccl/libnccl.so.2.gz" >"$NCCL_HOME/lib/libnccl.so.2" || return 1
    export LD_LIBRARY_PATH="$NCCL_HOME/lib:$LD_LIBRARY_PATH"
    echo "gpu-prebuilt: NCCL $(cat "$1/nccl/version") from the pack at $NCCL_HOME"
  fi
}
[ "${GPU_PREBUILT_SOURCED:-}" = 1 ] && return 0
cd "$repo" || exit 2
verb=${1:-}
case "$verb" in
pack)
  dir=${2:-.gpu}
  export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
  build=$repo/build-gpu-check
  args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBRAID_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDAARCHS:-90}" -DBRAID_BUILD_TESTS=ON
        -DBRAID_BUILD_BENCH=ON -DBRAID_BUILD_EXAMPLES=OFF -DBRAID_GPU_TESTS=ON)
  [ -n "${NCCL_HOME:-}" ] && args+=("-DNCCL_HOME=$NCCL_HOME")
  cmake -S "$repo" -B "$build" "${args[@]}" >/dev/null || exit 1
  targets=(test_gpu test_gpu_procs braid-bench braid-micro braid-gpu-sync-probe)
  have=()
  for t in "${targets[@]}"; do
    if ninja -C "$build" -t query "$t" >/dev/null 2>&1; then have+=("$t"); else echo "gpu-prebuilt: no target $t (skipped)"; fi
  done
  ninja -C "$build" -j "$(nproc)" "${have[@]}" || exit 1
  rm -rf "${dir:?}/build-gpu-check" && mkdir -p "$dir/lib" "$dir/build-gpu-check" || exit 1
  (cd "$build" && find . -name CTestTestfile.cmake) | while read -r f; do
    mkdir -p "$dir/build-gpu-check/$(dirname "$f")" && cp "$build/$f" "$dir/build-gpu-check/$f"
  done
  # Stripped and gzipped (about a quarter of their size): with NCCL and the working tree they must fit
  # the 64 MiB that travel to a GPU machine at a time. pack_env unpacks them there.
  for b in tests/cuda/test_gpu tests/cuda/test_gpu_procs bench/braid-bench bench/braid-micro bench/braid-gpu-sync-probe; do
    [ -x "$build/$b" ] && mkdir -p "$dir/build-gpu-check/$(dirname "$b")" && strip -o "$dir/build-gpu-check/$b" "$build/$b" &&
      gzip -9 -f "$dir/build-gpu-check/$b"
  done
  lib=$(ldd "$build/bench/braid-micro" 2>/dev/null | awk '/libbenchmark/ {print $3}')
  [ -n "$lib" ] && cp -L "$lib" "$dir/lib/$(basename "$lib")"
  # NCCL (bench/build-nccl.sh) beside them, gzipped: braid-bench --backend nccl loads it from there.
  rm -rf "${dir:?}/nccl"
  if [ -n "${NCCL_HOME:-}" ]; then
    lib=$(ls "$NCCL_HOME"/lib/libnccl.so.2.* 2>/dev/null | head -1)
    [ -n "$lib" ] || { echo "gpu-prebuilt: NCCL_HOME=$NCCL_HOME has no lib/libnccl.so.2.*"; exit 1; }
    mkdir -p "$dir/nccl" && gzip -9 -c "$lib" >"$dir/nccl/libnccl.so.2.gz" || exit 1
    cp "$NCCL_HOME/braid-nccl-funcs.txt" "$dir/nccl/" 2>/dev/null || true
    basename "$lib" >"$dir/nccl/version"
  fi
  echo "$repo" >"$dir/root"
  echo "gpu-prebuilt: packed $(du -sh "$dir" | cut -f1) ($(du -sb "$dir" | awk '{printf "%.1f MiB", $1 / 1048576}')) into $dir" \
    "(built under $repo, for sm_${CUDAARCHS:-90}${NCCL_HOME:+, with $(cat "$dir/nccl/version")});" \
    "with the tracked files, $(( ($(du -sb "$dir" | cut -f1) + $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)) / 1048576 )) MiB travel (at most 64)"
  ;;
pack-train)
  dir=${2:-.gpu}
  export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
  build=$repo/${TRAIN_BUILD:-build-gpu-train}
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRAID_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDAARCHS:-90}" \
    -DBRAID_BUILD_TESTS=OFF -DBRAID_BUILD_BENCH=OFF -DBRAID_BUILD_EXAMPLES=ON >/dev/null || exit 1
  ninja -C "$build" -j "$(nproc)" resnet_fmnist_cuda resnet_pipeline_cuda || exit 1
  mkdir -p "$dir/train" "$dir/lib" || exit 1
  for b in examples/resnet_fmnist/resnet_fmnist_cuda examples/resnet_pipeline/resnet_pipeline_cuda; do
    strip -o "$dir/train/$(basename "$b")" "$build/$b" || exit 1
  done
  # Everything outside glibc, the C++ runtime and CUDA (a CUDA machine has those): the CBLAS and its Fortran runtime.
  ldd "$build/examples/resnet_fmnist/resnet_fmnist_cuda" | awk '/=> \// {print $3}' |
    grep -E 'lib(openblas|blas|cblas|gfortran|quadmath)' | while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  echo "gpu-prebuilt: packed $(du -sh "$dir/train" | cut -f1) of trainers and $(du -sh "$dir/lib" | cut -f1) of libraries into $dir (sm_${CUDAARCHS:-90})"
  ;;
run)
  steps=${2:?usage: gpu-prebuilt.sh run STEPS SECONDS [VAR=VALUE ...]}
  secs=${3:?usage: gpu-prebuilt.sh run STEPS SECONDS [VAR=VALUE ...]}
  shift 3
  dir=$(realpath -m "${GPU_PREBUILT_DIR:-.gpu}")
  for a in "$@"; do
    [[ $a =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "gpu-prebuilt: '$a' is not VAR=VALUE"; exit 2; }
  done
  [ -f "$dir/root" ] || { echo "gpu-prebuilt: $dir/root missing: run 'pack' first and carry $dir"; exit 2; }
  root=$(cat "$dir/root")
  if [ "$(realpath -m "$root")" != "$repo" ]; then
    if [ -e "$root" ]; then echo "gpu-prebuilt: $root exists here and is not this checkout"; exit 2; fi
    mkdir -p "$(dirname "$root")" && ln -s "$repo" "$root" || exit 2
  fi
  if [ ! -e "$repo/build-gpu-check" ]; then
    ln -s "$dir/build-gpu-check" "$repo/build-gpu-check" || exit 2
  elif [ "$(realpath "$repo/build-gpu-check")" != "$(realpath "$dir/build-gpu-check")" ]; then
    echo "gpu-prebuilt: $repo/build-gpu-check exists and is not the packed tree; move it away"
    exit 2
  fi
  pack_env "$dir" || exit 2
  export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin"
  missing=$(ldd "$repo"/build-gpu-check/tests/cuda/test_gpu "$repo"/build-gpu-check/bench/braid-* 2>/dev/null | grep "not found")
  [ -n "$missing" ] && echo "gpu-prebuilt: missing libraries: $missing"
  env "$@" GPU_CHECK_STEPS="$steps" BUILD_DIR="$root/build-gpu-check" timeout -s INT -k 15 "$secs" \
    bash "$repo/bench/gpu-check.sh" "${OUT:-$repo/bench/results}"
  ;;
*)
  sed -n '2,24p' "$0"
  exit 2
  ;;
esac
