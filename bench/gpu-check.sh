#!/usr/bin/env bash
# shellcheck disable=SC2317 # the functions below are run through step(), which shellcheck cannot see
# bench/gpu-check.sh — the one script to run on a GPU machine (Hopper: H100/H200, sm_90).
#
# Configures a fresh build for the GPU (CUDA architectures $CUDAARCHS, default 90), builds it, and runs
# and logs: the machine (UTC date, hostname, commit and whether the tree is dirty, nvidia-smi, nvcc),
# every GPU test (ctest -L gpu -V: test_gpu and test_gpu_procs), the one-process GPU test under
# compute-sanitizer memcheck and racecheck and the cross-process one under memcheck (reduced sweeps:
# sanitizers are slow), and, when they were built, braid-bench --backend cuda (one process, and
# --procs N for processes; --backend nccl beside it where NCCL is found) and the Google Benchmark micro
# binaries. Every command's exit status is recorded; a failing step does not stop the ones after it.
# Everything goes to ONE plain-text log:
#     <out-dir>/gpu-check-<UTC date>-<short commit>.log
#
# Usage: bench/gpu-check.sh [out-dir]              (default out-dir: bench/results)
# On a lent machine whose minutes are counted, build elsewhere and carry the binaries:
# bench/gpu-prebuilt.sh pack (here), then bench/gpu-prebuilt.sh run STEPS SECONDS (there).
#
# Environment:
#   CUDAARCHS          CUDA architectures to build for                          [90]
#   BUILD_DIR          build directory, wiped and configured afresh              [build-gpu-check]
#   DOCTEST_DIR        directory holding doctestConfig.cmake, where doctest is not installed
#   benchmark_DIR      directory holding benchmarkConfig.cmake (Google Benchmark; optional)
#   CMAKE_ARGS         extra arguments for the configure step
#   JOBS               build parallelism                                          [nproc]
#   GPU_CHECK_STEPS    comma list of: build,test,memcheck,racecheck,bench        [all of them]
#                      (without "build" the existing BUILD_DIR is used as it is)
#   SANITIZER_LARGE    BRAID_GPU_SWEEP_LARGE under the sanitizers                 [10007]
#   SANITIZER_NRANKS   BRAID_GPU_SWEEP_NRANKS under memcheck                     [1,2,4,8]
#   SANITIZER_TIMEOUT  seconds allowed per sanitizer run                          [3600]
#   GPU_CHECK_NO_GPU_OK=1  go on without a GPU (only to try the script itself: the GPU tests will
#                      then report skipped, and the run counts as failed)
#
# Near the start it prints the driver's and the toolkit's CUDA versions (nvidia-smi, nvcc, and
# cudaDriverGetVersion/cudaRuntimeGetVersion from a tiny program built with that nvcc) and stops when
# the driver is too old for the toolkit (a CUDA 13 build on a driver for CUDA 12 cannot start), saying
# what to do: bench/cuda-versions.sh, tests/bench/test_gpu_check_versions.sh.
#
# Exit status: 0 when the build, the GPU tests and both sanitizer runs passed (benchmarks are recorded,
# not judged); 1 when one of them failed; 2 when there is no GPU, a prerequisite is missing or the
# driver is too old for the toolkit.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_dir=${1:-$repo/bench/results}
build=${BUILD_DIR:-$repo/build-gpu-check}
archs=${CUDAARCHS:-90}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
steps=",${GPU_CHECK_STEPS:-build,test,memcheck,racecheck,bench},"
san_large=${SANITIZER_LARGE:-10007}
san_nranks=${SANITIZER_NRANKS:-1,2,4,8}
san_timeout=${SANITIZER_TIMEOUT:-3600}
export PATH="$PATH:${CUDA_HOME:-/usr/local/cuda}/bin:/usr/local/cuda/bin"

want() { [[ $steps == *",$1,"* ]]; }

# ---- the log ---------------------------------------------------------------------------------------
commit=unknown
short=nogit
dirty="unknown (not a git checkout)"
if git -C "$repo" rev-parse HEAD >/dev/null 2>&1; then
  commit=$(git -C "$repo" rev-parse HEAD)
  short=$(git -C "$repo" rev-parse --short HEAD)
  # --no-optional-locks: only look, never refresh the index.
  if [ -n "$(git -C "$repo" --no-optional-locks status --porcelain --untracked-files=normal 2>/dev/null)" ]; then
    dirty="yes (uncommitted changes or untracked files; see git status below)"
  else
    dirty="no"
  fi
fi
stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out_dir" || { echo "gpu-check: cannot create $out_dir" >&2; exit 2; }
log="$out_dir/gpu-check-$stamp-$short.log"
: >"$log" || { echo "gpu-check: cannot write $log" >&2; exit 2; }

say() { printf '%s\n' "$*" | tee -a "$log"; }
section() { say ""; say "==== $* ===="; }

summary=()   # "status  name" lines for the end
failed=0     # a required step failed

# step REQUIRED|INFO NAME CMD... : runs CMD with stdout and stderr into the log (and the terminal),
# records its exit status. REQUIRED steps decide the script's exit status.
step() {
  local kind=$1 name=$2
  shift 2
  section "$name"
  say "\$ $*"
  local t0=$SECONDS
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  say "---- exit status $rc ($((SECONDS - t0)) s): $name"
  summary+=("$(printf '%-4s %-8s %s' "$rc" "$kind" "$name")")
  if [ "$rc" -ne 0 ] && [ "$kind" = REQUIRED ]; then failed=1; fi
  return "$rc"
}

finish() {
  section "summary"
  say "exit  kind     step"
  for s in "${summary[@]}"; do say "$s"; done
  say ""
  say "log: $log"
  exit "$1"
}

# A time limit (timeout -s INT, as gpu-prebuilt.sh runs it) still leaves the summary in the log.
trap 'say ""; say "INTERRUPTED by a signal: the step that was running and the steps after it did not finish"; finish 1' INT TERM

section "braid gpu-check"
say "date (UTC):  $(date -u '+%Y-%m-%d %H:%M:%S')"
say "hostname:    $(hostname 2>/dev/null || cat /etc/hostname 2>/dev/null || echo unknown)"
say "commit:      $commit"
say "dirty tree:  $dirty"
say "build dir:   $build"
say "CUDA archs:  $archs"
say "steps:       ${steps//,/ }"
if [ "$commit" != unknown ]; then
  step INFO "git status" git -C "$repo" --no-optional-locks status --short
fi

# ---- the machine -------------------------------------------------------------------------------------
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  step INFO "nvidia-smi (name, driver)" nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total --format=csv
  step INFO "nvidia-smi" nvidia-smi
  step INFO "nvidia-smi topo -m" nvidia-smi topo -m
  if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -gt 0 ]; then have_gpu=1; fi
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
  if [ -n "${cap:-}" ] && [[ ";$archs;" != *";$cap;"* ]] && [[ ";$archs;" != *";$cap-real;"* ]]; then
    say "WARNING: GPU 0 is sm_$cap but the build targets '$archs' (set CUDAARCHS=$cap)"
  fi
else
  say "nvidia-smi: not found"
fi
if command -v nvcc >/dev/null 2>&1; then
  step INFO "nvcc --version" nvcc --version
else
  say "MISSING: nvcc (the CUDA toolkit): put its bin/ on PATH or set CUDA_HOME"
  finish 2
fi

# ---- driver and toolkit: a build for CUDA 13 cannot start on a driver for CUDA 12 (docs/toolkits.md) ----
# shellcheck source-path=SCRIPTDIR source=cuda-versions.sh
. "$repo/bench/cuda-versions.sh"
section "CUDA driver and toolkit versions"
smi_driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ')
smi_cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9][0-9.]*' | head -n1 | grep -o '[0-9][0-9.]*$')
nvcc_release=$(nvcc --version 2>/dev/null | grep -o 'release [0-9][0-9.]*' | head -n1 | cut -d' ' -f2)
say "driver (nvidia-smi):    ${smi_driver:-unknown}, supports CUDA ${smi_cuda:-unknown}"
say "toolkit (nvcc):         CUDA ${nvcc_release:-unknown} ($(command -v nvcc))"
probe_dir=$(mktemp -d)
probe_drv=0 probe_rt=0
if probe_out=$(cuda_versions_probe nvcc "$probe_dir") && [[ $probe_out =~ driver=([0-9]+)\ runtime=([0-9]+) ]]; then
  probe_drv=${BASH_REMATCH[1]} probe_rt=${BASH_REMATCH[2]}
  say "cudaDriverGetVersion:   $probe_drv (CUDA $(cuda_version_string "$probe_drv")), from a program built with this nvcc"
  say "cudaRuntimeGetVersion:  $probe_rt (CUDA $(cuda_version_string "$probe_rt"))"
else
  say "cudaDriverGetVersion:   unknown (the probe program did not build or run: ${probe_out:-no output})"
fi
rm -rf "$probe_dir"
# What the process sees (cuda-compat included) decides; nvidia-smi and nvcc stand in where the probe failed.
drv=$probe_drv rt=$probe_rt
[ "$drv" -gt 0 ] || drv=$(cuda_version_number "${smi_cuda:-}")
[ "$rt" -gt 0 ] || rt=$(cuda_version_number "${nvcc_release:-}")
verdict=$(cuda_driver_verdict "$drv" "$rt")
verdict_rc=$?
say "verdict:                $verdict"
if [ "$verdict_rc" -eq 1 ]; then
  say ""
  say "STOP: $verdict."
  summary+=("$(printf '%-4s %-8s %s' - REQUIRED "driver supports the toolkit: no")")
  finish 2
fi

step INFO "cmake --version" cmake --version
step INFO "c++ --version" c++ --version

if [ "$have_gpu" -eq 0 ]; then
  if [ "${GPU_CHECK_NO_GPU_OK:-0}" = 1 ]; then
    say "NO GPU: nvidia-smi lists no GPU; going on because GPU_CHECK_NO_GPU_OK=1 (GPU tests will skip, and the run counts as failed)"
    failed=1
  else
    say "NO GPU: nvidia-smi is missing or lists no GPU, so there is nothing to check here. Run this on a"
    say "        GPU machine (set GPU_CHECK_NO_GPU_OK=1 to try the build steps anyway)."
    summary+=("$(printf '%-4s %-8s %s' - REQUIRED "GPU present: no")")
    finish 2
  fi
fi

# ---- prerequisites -------------------------------------------------------------------------------------
# The directory of the first <name>Config.cmake (or <name>-config.cmake) under $1, if any.
config_dir_under() {
  local root=$1 name=$2 f
  [ -d "$root" ] || return 1
  f=$(find "$root" -maxdepth 5 \( -name "${name}Config.cmake" -o -name "${name}-config.cmake" \) 2>/dev/null | head -n1)
  [ -n "$f" ] && dirname "$f"
}
# Where CMake would look by default (enough to say what is missing before a long configure).
search_roots=(/usr/lib /usr/lib64 /usr/local /opt /usr/share)
prefixes=${CMAKE_PREFIX_PATH:-}
for p in ${prefixes//:/ }; do search_roots+=("$p"); done

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# BRAID_GPU_TESTS=ON: register the real-GPU tests whatever nvidia-smi says.
cmake_args=("${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBRAID_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$archs"
            -DBRAID_BUILD_TESTS=ON -DBRAID_BUILD_BENCH=ON -DBRAID_BUILD_EXAMPLES=OFF -DBRAID_GPU_TESTS=ON)
# locate NAME VAR_VALUE: prints the directory of NAME's package config, from the directory the user named
# (VAR_VALUE, searched) or else from the default roots; fails when none is found.
locate() {
  local name=$1 given=$2 root
  if [ -n "$given" ]; then config_dir_under "$given" "$name"; return; fi
  for root in "${search_roots[@]}"; do config_dir_under "$root" "$name" && return 0; done
  return 1
}
doctest_missing=0
section "prerequisites"
if d=$(locate doctest "${DOCTEST_DIR:-}"); then
  say "doctest: $d${DOCTEST_DIR:+ (DOCTEST_DIR)}"
  [ -n "${DOCTEST_DIR:-}" ] && cmake_args+=("-Ddoctest_DIR=$d")
elif [ -n "${DOCTEST_DIR:-}" ]; then
  say "MISSING: doctest: DOCTEST_DIR=$DOCTEST_DIR holds no doctestConfig.cmake (point it at a doctest"
  say "         install prefix or at the directory of doctestConfig.cmake)"
  summary+=("$(printf '%-4s %-8s %s' - REQUIRED "doctest found: no")")
  finish 2
else
  doctest_missing=1
  say "MISSING?: doctest: no doctestConfig.cmake under ${search_roots[*]}; if configure fails for it,"
  say "          set DOCTEST_DIR to a copy (its install prefix or the directory of doctestConfig.cmake)"
fi
if d=$(locate benchmark "${benchmark_DIR:-}"); then
  say "Google Benchmark: $d${benchmark_DIR:+ (benchmark_DIR)}"
  [ -n "${benchmark_DIR:-}" ] && cmake_args+=("-Dbenchmark_DIR=$d")
else
  say "missing (optional): Google Benchmark${benchmark_DIR:+ (benchmark_DIR=$benchmark_DIR holds no benchmarkConfig.cmake)};"
  say "                    the micro benchmarks will not be built (set benchmark_DIR to a copy)"
fi
sanitizer=$(command -v compute-sanitizer 2>/dev/null || true)
for c in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  if [ -z "$sanitizer" ] && [ -x "$c" ]; then sanitizer=$c; fi
done
if [ -n "$sanitizer" ]; then say "compute-sanitizer: $sanitizer"
else say "MISSING: compute-sanitizer (part of the CUDA toolkit): the memcheck and racecheck steps will fail"; fi
# NCCL for braid-bench --backend nccl: only the one NCCL_HOME names (bench/build-nccl.sh builds 2.30 or
# later, the first that puts two ranks on one GPU; a machine's own, e.g. a PyTorch wheel's 2.28, is
# never picked up by accident).
if [ -n "${NCCL_HOME:-}" ]; then
  say "NCCL: $NCCL_HOME"
  cmake_args+=("-DNCCL_HOME=$NCCL_HOME")
  export LD_LIBRARY_PATH="$NCCL_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  say "missing (optional): NCCL (set NCCL_HOME to a build of bench/build-nccl.sh): no NCCL comparison"
fi
if [ -n "${CMAKE_ARGS:-}" ]; then
  # shellcheck disable=SC2206 # word splitting wanted: several arguments in one variable
  cmake_args+=(${CMAKE_ARGS})
fi

# ---- build ---------------------------------------------------------------------------------------------
if want build; then
  case "$build" in
    "" | / | "$repo" | "$HOME") say "refusing to wipe BUILD_DIR=$build"; finish 2 ;;
  esac
  rm -rf "$build"
  if ! step REQUIRED "configure" cmake -S "$repo" -B "$build" "${cmake_args[@]}"; then
    if [ "$doctest_missing" = 1 ] || grep -q 'doctest' "$build/CMakeFiles/CMakeError.log" 2>/dev/null ||
       tail -n 40 "$log" | grep -qi 'doctest'; then
      say "MISSING: doctest: set DOCTEST_DIR to a copy (its install prefix or the directory of doctestConfig.cmake)"
    fi
    finish 1
  fi
  if ! step REQUIRED "build" cmake --build "$build" -j "$jobs"; then finish 1; fi
else
  say "(build step not selected: using $build as it is)"
fi

test_bin="$build/tests/cuda/test_gpu"

# ---- GPU tests -----------------------------------------------------------------------------------------
ctest_out=$(mktemp)
trap 'rm -f "$ctest_out"' EXIT
run_gpu_ctest() {
  (cd "$build" && ctest -L gpu -V --output-on-failure) >"$ctest_out" 2>&1
  local rc=$?
  cat "$ctest_out"
  return "$rc"
}
# ctest counts a skipped test as "not failed": on a GPU machine a skip is a failure.
check_not_skipped() {
  if grep -q "SKIPPED: no CUDA device" "$ctest_out"; then
    echo "the GPU tests were SKIPPED: the test executable sees no CUDA device"
    return 1
  fi
  if ! grep -q "Test command: .*test_gpu" "$ctest_out"; then
    echo "ctest ran no GPU test (BRAID_HAVE_CUDA off? see the configure output)"
    return 1
  fi
  echo "the GPU tests ran (not skipped)"
}
if want test; then
  step REQUIRED "GPU tests: ctest -L gpu -V" run_gpu_ctest
  step REQUIRED "GPU tests were not skipped" check_not_skipped
fi

# ---- sanitizers ----------------------------------------------------------------------------------------
# A reduced sweep (BRAID_GPU_SWEEP_LARGE), a per-wait deadline so that a kernel that cannot finish under
# the tool fails instead of hanging, an overall time limit, and the tool's own exit code for anything
# it reports. Usage: sanitize TOOL NRANKS [tool options] -- [test options]
sanitize() {
  local tool=$1 nranks=$2
  shift 2
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  if [ -z "$sanitizer" ]; then echo "compute-sanitizer not found"; return 127; fi
  if [ ! -x "$test_bin" ]; then echo "$test_bin was not built"; return 127; fi
  env BRAID_GPU_SWEEP_LARGE="$san_large" BRAID_GPU_SWEEP_NRANKS="$nranks" BRAID_TIMEOUT=120 \
    timeout --signal=INT --kill-after=60 "$san_timeout" \
    "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 100 "${opts[@]}" "$test_bin" "$@"
}
if want memcheck; then
  step REQUIRED "compute-sanitizer memcheck (GPU tests, sweep large=$san_large, ranks $san_nranks)" \
    sanitize memcheck "$san_nranks" --leak-check full --
fi
if want racecheck; then
  # racecheck sees shared memory only (the kernel's round and stop words) and is the slowest tool:
  # the float sweep (every collective, algorithm and operator) with 2 and 4 ranks, and the graph test.
  step REQUIRED "compute-sanitizer racecheck (float sweep and graph test, large=$san_large, ranks 2,4)" \
    sanitize racecheck 2,4 -- "--test-case=gpu sweep: float*,gpu graph*"
fi

if want memcheck; then
  # The cross-process communicator under memcheck, every forked rank included (reduced sweep, 2 ranks).
  procs_bin="$build/tests/cuda/test_gpu_procs"
  sanitize_procs() {
    if [ -z "$sanitizer" ]; then echo "compute-sanitizer not found"; return 127; fi
    if [ ! -x "$procs_bin" ]; then echo "$procs_bin was not built"; return 127; fi
    env BRAID_GPU_SWEEP_LARGE="$san_large" BRAID_GPU_PROCS_NRANKS=2 BRAID_TIMEOUT=120 \
      timeout --signal=INT --kill-after=60 "$san_timeout" \
      "$sanitizer" --tool memcheck --target-processes all --error-exitcode 86 --print-limit 100 "$procs_bin" \
      "--test-case=reference*,registration*"
  }
  step INFO "compute-sanitizer memcheck (test_gpu_procs: sweep and registration, 2 processes)" sanitize_procs
fi

# ---- benchmarks (recorded, not judged) ------------------------------------------------------------------
if want bench; then
  # Ordered by what a short lease should see first (a time limit cuts the tail): the loop alone, one
  # step's synchronisation, the tuned all_reduce, what one step costs inside the kernel, NCCL beside,
  # correctness, then the long tables of every algorithm. 2026-11-25 on an H100 the old order spent
  # seven minutes before the 4-rank tuned run, which a 540 s limit then cut (bench/results/h100-2026-11-25/).
  bench_bin="$build/bench/braid-bench"
  probe_bin="$build/bench/braid-gpu-sync-probe"
  if [ -x "$bench_bin" ]; then
    step INFO "braid-bench --kernel: the reduce-copy loop against cudaMemcpy (float, bfloat16)" \
      "$bench_bin" --backend cuda --kernel -d float,bfloat16 -b 1M -e 1G -f 4 -n 20
  fi
  if [ -x "$probe_bin" ]; then
    step INFO "braid-gpu-sync-probe: one step's synchronisation alone, with a copy, and with a step's other parts (us per step)" "$probe_bin"
  fi
  if [ -x "$bench_bin" ]; then
    for np in 2 4 8; do
      step INFO "braid-bench --backend cuda, all_reduce float sum, tuned algorithm, $np ranks" \
        env BRAID_TIMEOUT=60 "$bench_bin" all_reduce -d float -o sum -b 8 -e 256M -f 4 -n 20 -w 5 -c 1 -np "$np" --backend cuda
    done
    # A step inside collective_kernel against the probe's: tree broadcast takes 32 steps a round, one
    # per 64 KiB chunk. Grid and staging varied one at a time (2 ranks, 32 MiB).
    for shape in "" "--blocks 1" "--blocks 8" "--threads 128"; do
      # shellcheck disable=SC2086 # $shape is zero or two words
      step INFO "step cost: tree broadcast 32 MiB, 2 ranks ${shape:-default grid}" \
        env BRAID_TIMEOUT=60 "$bench_bin" broadcast -a tree -d float -b 32M -e 32M -n 10 -w 2 -c 1 -np 2 --backend cuda $shape
    done
    step INFO "step cost: tree broadcast 32 MiB, 2 ranks, BRAID_STAGING_BYTES=64M" \
      env BRAID_TIMEOUT=60 BRAID_STAGING_BYTES=64M "$bench_bin" broadcast -a tree -d float -b 32M -e 32M -n 10 -w 2 -c 1 -np 2 --backend cuda
    for np in 2 4 8; do
      # Same harness, same sizes: NCCL (several ranks per GPU need NCCL 2.30 or later and
      # NCCL_MULTI_RANK_GPU_ENABLE=1; braid-bench says so when NCCL is older).
      step INFO "braid-bench --backend nccl, all_reduce float sum, $np ranks" \
        env NCCL_MULTI_RANK_GPU_ENABLE=1 "$bench_bin" all_reduce -d float -o sum -b 8 -e 256M -f 4 -n 20 -w 5 -c 1 -np "$np" --backend nccl
    done
    step INFO "braid-bench --backend cuda, correctness: every type, operator, algorithm, 4 ranks" \
      env BRAID_TIMEOUT=60 "$bench_bin" all -d all -o all -a all -b 0 -e 16807 -f 7 -n 1 -w 0 -c 1 -np 4 --backend cuda
    for np in 2 4; do
      # Ranks as processes (braid::cuda::process_communicator over CUDA IPC, host-synchronised).
      step INFO "braid-bench --backend cuda --procs $np, all_reduce float sum" \
        env BRAID_TIMEOUT=60 "$bench_bin" all_reduce -d float -o sum -b 128 -e 256M -f 8 -n 20 -w 5 -c 1 --backend cuda --procs "$np"
      step INFO "braid-bench --backend nccl --procs $np, all_reduce float sum" \
        env NCCL_MULTI_RANK_GPU_ENABLE=1 "$bench_bin" all_reduce -d float -o sum -b 128 -e 256M -f 8 -n 20 -w 5 -c 1 --backend nccl --procs "$np"
    done
    for np in 2 4 8; do
      step INFO "braid-bench --backend cuda, all collectives, float sum, every algorithm, $np ranks" \
        env BRAID_TIMEOUT=60 "$bench_bin" all -d float -o sum -a all -b 128 -e 256M -f 8 -n 20 -w 5 -c 1 -np "$np" --backend cuda
    done
  else
    say "braid-bench: not built ($bench_bin)"
  fi
  found_micro=0
  for m in "$build"/bench/braid-micro*; do
    [ -x "$m" ] || continue
    found_micro=1
    step INFO "$(basename "$m") (Google Benchmark)" "$m"
  done
  [ "$found_micro" -eq 1 ] || say "Google Benchmark micro binaries: none built (Google Benchmark missing?)"
fi

finish "$failed"
