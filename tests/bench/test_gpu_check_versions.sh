#!/usr/bin/env bash
# bench/gpu-check.sh's driver check without a GPU: the version arithmetic and the verdict of
# bench/cuda-versions.sh with made-up numbers, then gpu-check.sh itself run against a fake nvidia-smi
# and a fake nvcc (whose "compiled" probe prints made-up versions): with a driver for CUDA 12.4 and a
# CUDA 13.0 toolkit it must stop early (exit 2, before configuring anything) with the plain sentence;
# with a driver for CUDA 13.0 it must go on. Prints "N passed, N failed"; exit status 1 on any failure.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=../../bench/cuda-versions.sh
. "$repo/bench/cuda-versions.sh"

pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAILED: $*"; }
expect_eq() { # WHAT GOT WANT
  if [ "$2" = "$3" ]; then ok; else bad "$1: got '$2', want '$3'"; fi
}
expect_has() { # WHAT TEXT NEEDLE
  if [[ $2 == *"$3"* ]]; then ok; else bad "$1: '$3' not in: $2"; fi
}
expect_lacks() { # WHAT TEXT NEEDLE
  if [[ $2 != *"$3"* ]]; then ok; else bad "$1: '$3' should not be in: $2"; fi
}
# verdict DRIVER RUNTIME WANT_STATUS [NEEDLE...]
verdict() {
  local d=$1 r=$2 want=$3 out rc
  shift 3
  out=$(cuda_driver_verdict "$d" "$r")
  rc=$?
  expect_eq "cuda_driver_verdict $d $r: status" "$rc" "$want"
  for n in "$@"; do expect_has "cuda_driver_verdict $d $r" "$out" "$n"; done
}

# ---- the arithmetic ---------------------------------------------------------------------------------
expect_eq "12040 as a string" "$(cuda_version_string 12040)" 12.4
expect_eq "13000 as a string" "$(cuda_version_string 13000)" 13.0
expect_eq "12090 as a string" "$(cuda_version_string 12090)" 12.9
expect_eq "13.0 as a number" "$(cuda_version_number 13.0)" 13000
expect_eq "12.4.131 as a number" "$(cuda_version_number 12.4.131)" 12040
expect_eq "garbage as a number" "$(cuda_version_number none)" 0

# ---- the verdict ------------------------------------------------------------------------------------
# The case this exists for: an H100 host whose driver is for CUDA 12.4, braid built with CUDA 13.0.
verdict 12040 13000 1 "the driver supports CUDA 12.4 but braid was built with CUDA 13.0" "CUDA 12.x toolkit" \
  "nvcc 12.4 or later" "cuda-compat"
verdict 12080 13050 1 "supports CUDA 12.8" "built with CUDA 13.5"
# A driver older than braid's minimum toolkit: a 12.x toolkit would not start either.
verdict 11080 13000 1 "update the driver" "12.4 or later"
verdict 11080 12040 1 "supports CUDA 11.8" "built with CUDA 12.4" "update the driver"
# Same major version: starts (minor version compatibility when the driver's minor is older).
verdict 13000 13000 0 "it can start"
verdict 13020 13000 0 "it can start"
verdict 12090 12040 0 "it can start"
verdict 12020 12040 0 "minor version compatibility"
verdict 13000 13050 0 "minor version compatibility"
# Newer major driver than toolkit: backward compatibility.
verdict 13000 12040 0 "it can start"
# Unknown: no driver, or nothing read.
verdict 0 13000 2 "no CUDA driver"
verdict "" 13000 2 "no CUDA driver"
verdict 12040 0 2 "could not be read"
verdict 12040 junk 2 "could not be read"

# ---- gpu-check.sh end to end, with fakes on PATH ------------------------------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/out"
cat >"$work/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# fake nvidia-smi: one H100 and a driver for CUDA $FAKE_SMI_CUDA
case "$*" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-fake)" ;;
  *driver_version*) echo "${FAKE_SMI_DRIVER}" ;;
  *compute_cap*noheader*) echo "9.0" ;;
  --query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, ${FAKE_SMI_DRIVER}, 9.0, 81559 MiB" ;;
  *) echo "| NVIDIA-SMI ${FAKE_SMI_DRIVER}    Driver Version: ${FAKE_SMI_DRIVER}    CUDA Version: ${FAKE_SMI_CUDA}   |" ;;
esac
EOF
cat >"$work/bin/nvcc" <<'EOF'
#!/usr/bin/env bash
# fake nvcc: --version says $FAKE_NVCC; "-o X" writes X as a program printing the fake versions
if [ "${1:-}" = --version ]; then
  echo "Cuda compilation tools, release ${FAKE_NVCC}, V${FAKE_NVCC}.88"
  exit 0
fi
while [ $# -gt 0 ]; do
  if [ "$1" = -o ]; then
    printf '#!/usr/bin/env bash\necho "driver=%s runtime=%s"\n' "$FAKE_DRIVER" "$FAKE_RUNTIME" >"$2"
    chmod +x "$2"
    exit 0
  fi
  shift
done
exit 1
EOF
chmod +x "$work/bin/nvidia-smi" "$work/bin/nvcc"

# run_check NAME [VAR=value...]: runs gpu-check.sh with the fakes; sets rc and out (stdout+stderr).
run_check() {
  local name=$1
  shift
  out=$(env PATH="$work/bin:$PATH" BUILD_DIR="$work/build-$name" "$@" \
        bash "$repo/bench/gpu-check.sh" "$work/out/$name" 2>&1)
  rc=$?
}

# A driver for CUDA 12.4 (nvidia-smi and cudaDriverGetVersion agree), a CUDA 13.0 toolkit: stop.
# GPU_CHECK_STEPS=test: should the stop fail, the script runs no build (ctest in a missing directory).
run_check old FAKE_SMI_DRIVER=550.54.15 FAKE_SMI_CUDA=12.4 FAKE_NVCC=13.0 FAKE_DRIVER=12040 FAKE_RUNTIME=13000 \
  GPU_CHECK_STEPS=test
expect_eq "gpu-check, driver for 12.4, toolkit 13.0: exit status" "$rc" 2
expect_has "gpu-check, old driver" "$out" "driver (nvidia-smi):    550.54.15, supports CUDA 12.4"
expect_has "gpu-check, old driver" "$out" "cudaDriverGetVersion:   12040 (CUDA 12.4)"
expect_has "gpu-check, old driver" "$out" "cudaRuntimeGetVersion:  13000 (CUDA 13.0)"
expect_has "gpu-check, old driver" "$out" "STOP: the driver supports CUDA 12.4 but braid was built with CUDA 13.0"
expect_has "gpu-check, old driver" "$out" "driver supports the toolkit: no"
expect_lacks "gpu-check, old driver: stopped before the prerequisites" "$out" "==== prerequisites ===="
expect_lacks "gpu-check, old driver: stopped before the GPU tests" "$out" "GPU tests: ctest"
log=$(cat "$work"/out/old/gpu-check-*.log 2>/dev/null)
expect_has "gpu-check, old driver: the log" "$log" "STOP: the driver supports CUDA 12.4 but braid was built with CUDA 13.0"

# cuda-compat: nvidia-smi still says 12.4, but the process sees a driver for 13.0: the probe decides.
run_check compat FAKE_SMI_DRIVER=550.54.15 FAKE_SMI_CUDA=12.4 FAKE_NVCC=13.0 FAKE_DRIVER=13000 FAKE_RUNTIME=13000 \
  GPU_CHECK_STEPS=none
expect_eq "gpu-check, cuda-compat: exit status" "$rc" 0
expect_has "gpu-check, cuda-compat" "$out" "verdict:                the driver supports CUDA 13.0, braid is built with CUDA 13.0: it can start"
expect_lacks "gpu-check, cuda-compat" "$out" "STOP:"

# A driver for CUDA 13.0: it goes on (no steps selected, so it ends after the prerequisites, exit 0).
run_check new FAKE_SMI_DRIVER=580.65.06 FAKE_SMI_CUDA=13.0 FAKE_NVCC=13.0 FAKE_DRIVER=13000 FAKE_RUNTIME=13000 \
  GPU_CHECK_STEPS=none
expect_eq "gpu-check, driver for 13.0: exit status" "$rc" 0
expect_has "gpu-check, new driver" "$out" "it can start"
expect_has "gpu-check, new driver: went on" "$out" "==== prerequisites ===="

# The probe fails to build: nvidia-smi's and nvcc's versions decide instead.
run_check noprobe FAKE_SMI_DRIVER=550.54.15 FAKE_SMI_CUDA=12.4 FAKE_NVCC=13.0 FAKE_DRIVER= FAKE_RUNTIME= \
  GPU_CHECK_STEPS=test
expect_eq "gpu-check, no probe, driver for 12.4, nvcc 13.0: exit status" "$rc" 2
expect_has "gpu-check, no probe" "$out" "STOP: the driver supports CUDA 12.4 but braid was built with CUDA 13.0"

echo "test_gpu_check_versions: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
