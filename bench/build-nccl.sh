#!/usr/bin/env bash
# bench/build-nccl.sh — build NCCL from source for sm_90 only, for braid-bench --backend nccl.
#
#   NCCL_SRC=/path/to/nccl bench/build-nccl.sh [PREFIX]
#
# NCCL_SRC is a checkout of github.com/NVIDIA/nccl at a release tag, 2.30 or later (the first that
# puts two ranks on one GPU, behind NCCL_MULTI_RANK_GPU_ENABLE=1). PREFIX (default
# .deps/nccl-<version>-sm90, git-ignored) receives include/, lib/ and braid-nccl-funcs.txt.
#
# Why from source: PyPI's NCCL wheel carries every architecture (libnccl.so.2 ~299 MB), while at most
# 64 MiB travel to a GPU machine at a time. One architecture and only the functions braid-bench
# compares make a library small enough to pack beside braid's binaries (bench/gpu-prebuilt.sh).
#
# NCCL_ONLY_FUNCS (NCCL's ONLY_FUNCS, src/device/generate.py) names the device functions built: each
# keeps every algorithm and protocol (the trailing "* *"), because NCCL indexes its kernel table by
# (function, algorithm, protocol) and a filtered-out algorithm would index past it. The pattern is
# written to PREFIX/braid-nccl-funcs.txt; bench/CMakeLists.txt compiles it into braid-bench, whose NCCL
# engine then refuses (as "not compared") every call this build has no kernel for.
#
# Prints the build's wall time and the library's size. NCCL_JOBS (default nproc) parallel jobs.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
src=${NCCL_SRC:?set NCCL_SRC to a checkout of github.com/NVIDIA/nccl at a release tag (2.30 or later)}
src=$(cd "$src" && pwd -P)
[ -f "$src/makefiles/version.mk" ] || { echo "build-nccl: $src is not an NCCL checkout" >&2; exit 2; }
ver() { sed -n "s/^NCCL_$1 *:= *//p" "$src/makefiles/version.mk"; }
version="$(ver MAJOR).$(ver MINOR).$(ver PATCH)"
major=$(ver MAJOR) minor=$(ver MINOR)
if [ "$major" -lt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -lt 30 ]; }; then
  echo "build-nccl: NCCL $version puts at most one rank on a GPU; 2.30 or later is needed" >&2
  exit 2
fi
prefix=${1:-$repo/.deps/nccl-$version-sm90}
funcs=${NCCL_ONLY_FUNCS:-"AllReduce Sum f32 * *|AllReduce Sum bf16 * *|AllReduce Sum f16 * *|AllGather * *|ReduceScatter Sum f32 * *|Broadcast * *|Reduce Sum f32 * *|SendRecv"}
jobs=${NCCL_JOBS:-$(nproc)}
cuda=${CUDA_HOME:-/usr/local/cuda}
build=$prefix/build
mkdir -p "$build"
# The CUDA toolkit may carry an older NCCL's headers (nccl.h, nccl_device/) in its include folder,
# which NCCL's makefiles put ahead of its own: build against a copy of that folder without them.
inc=$prefix/cuda-include
rm -rf "$inc" && mkdir -p "$inc"
for f in "$cuda"/include/*; do
  case "$(basename "$f")" in nccl*) ;; *) ln -s "$f" "$inc/" ;; esac
done
echo "build-nccl: NCCL $version from $src ($(git -C "$src" describe --tags 2>/dev/null || echo 'no tag')), sm_90, $jobs jobs"
echo "build-nccl: ONLY_FUNCS=\"$funcs\""
start=$(date +%s)
make -C "$src" -j "$jobs" src.build BUILDDIR="$build" CUDA_HOME="$cuda" CUDA_INC="$inc" \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" ONLY_FUNCS="$funcs" >"$prefix/build.log" 2>&1 ||
  { tail -40 "$prefix/build.log" >&2; echo "build-nccl: make failed (log: $prefix/build.log)" >&2; exit 1; }
end=$(date +%s)
rm -rf "$prefix/include" "$prefix/lib"
cp -r "$build/include" "$prefix/include"
mkdir -p "$prefix/lib"
cp -a "$build"/lib/libnccl.so* "$prefix/lib/"
printf '%s\n' "$funcs" >"$prefix/braid-nccl-funcs.txt"
lib=$(ls "$prefix"/lib/libnccl.so.*.*.* | head -1)
strip --strip-unneeded "$lib"
echo "build-nccl: built in $((end - start)) s; $(basename "$lib") $(du -k "$lib" | cut -f1) KiB stripped," \
  "$(gzip -c "$lib" | wc -c | awk '{printf "%.1f MiB", $1 / 1048576}') gzipped"
echo "build-nccl: NCCL_HOME=$prefix"
