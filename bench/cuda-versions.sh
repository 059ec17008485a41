# shellcheck shell=bash
# bench/cuda-versions.sh — sourced by bench/gpu-check.sh (and tests/bench/test_gpu_check_versions.sh):
# which CUDA version the driver supports, which one the toolkit builds for, and whether a program built
# with that toolkit can start on that driver. Versions are CUDA's integers (CUDART_VERSION encoding:
# 1000 * major + 10 * minor, 12040 for 12.4) unless a name says "string".
#
# The rule (NVIDIA's CUDA compatibility guide, docs/toolkits.md): a program built with CUDA X.y starts on
# a driver that supports CUDA X.0 or later (minor version compatibility, X >= 11), and on no driver of
# an older major version unless the cuda-compat package (forward compatibility) is installed, which
# raises what cudaDriverGetVersion reports. braid builds SASS for the GPU (CUDAARCHS, default 90), so
# no PTX needs a newer driver's JIT.

# 12040 -> 12.4
cuda_version_string() {
  local v=$1
  [[ $v =~ ^[0-9]+$ ]] || { echo "?"; return 1; }
  echo "$((v / 1000)).$(((v % 1000) / 10))"
}

# "12.4" or "12.4.131" -> 12040
cuda_version_number() {
  local s=$1
  [[ $s =~ ^([0-9]+)\.([0-9]+) ]] || { echo 0; return 1; }
  echo $((BASH_REMATCH[1] * 1000 + BASH_REMATCH[2] * 10))
}

# cuda_driver_verdict DRIVER RUNTIME: prints one plain sentence and returns
#   0  a program built with CUDA RUNTIME starts on this driver (a NOTE follows when only minor version
#      compatibility allows it);
#   1  it cannot start: the driver is too old for the toolkit;
#   2  unknown: no driver, or a version that could not be read.
cuda_driver_verdict() {
  local drv=${1:-0} rt=${2:-0}
  [[ $drv =~ ^[0-9]+$ ]] || drv=0
  [[ $rt =~ ^[0-9]+$ ]] || rt=0
  if [ "$rt" -eq 0 ]; then
    echo "the CUDA toolkit's runtime version could not be read, so the driver cannot be checked against it"
    return 2
  fi
  local d r
  d=$(cuda_version_string "$drv")
  r=$(cuda_version_string "$rt")
  if [ "$drv" -eq 0 ]; then
    echo "no CUDA driver answered (cudaDriverGetVersion gave 0), so the driver cannot be checked against CUDA $r"
    return 2
  fi
  if ((drv / 1000 < rt / 1000)); then
    if ((drv / 1000 >= 12)); then
      echo "the driver supports CUDA $d but braid was built with CUDA $r, which cannot start on it: build with" \
           "the host's CUDA $((drv / 1000)).x toolkit (nvcc 12.4 or later, first on PATH)" \
           "or install cuda-compat for CUDA $r (datacenter GPUs)"
    else
      echo "the driver supports CUDA $d but braid was built with CUDA $r, which cannot start on it, and braid needs" \
           "CUDA 12.4 or later: update the driver (CUDA 12.x needs 525 or later, 13.x 580 or later) or install cuda-compat for CUDA $r"
    fi
    return 1
  fi
  if ((drv < rt)); then
    echo "the driver supports CUDA $d and braid is built with CUDA $r: NOTE it starts only through CUDA's minor" \
         "version compatibility (same major version; the build carries SASS for the GPU, so no PTX JIT is needed;" \
         "APIs newer than $d return errors)"
    return 0
  fi
  echo "the driver supports CUDA $d, braid is built with CUDA $r: it can start"
  return 0
}

# cuda_versions_probe NVCC DIR: builds and runs a tiny program with NVCC in DIR; prints
# "driver=N runtime=N" (cudaDriverGetVersion, cudaRuntimeGetVersion of the runtime NVCC links).
# Fails when it cannot be built or run.
cuda_versions_probe() {
  local nvcc=$1 dir=$2
  cat >"$dir/cuda_versions.cpp" <<'EOF'
// Written by bench/cuda-versions.sh: the CUDA versions the driver and the linked runtime report.
#include <cuda_runtime_api.h>
#include <cstdio>
int main() {
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  std::printf("driver=%d runtime=%d\n", driver, runtime);
  return 0;
}
EOF
  "$nvcc" -o "$dir/cuda_versions" "$dir/cuda_versions.cpp" >/dev/null 2>&1 || return 1
  "$dir/cuda_versions"
}
