#!/usr/bin/env bash
# Builds braid's CPU tests with a sanitizer and runs them (issue 6). Usage:
#   scripts/sanitize.sh asan|tsan [build-dir]
# asan: AddressSanitizer + UndefinedBehaviorSanitizer (any report fails the test). tsan: ThreadSanitizer,
# with the suppressions in scripts/tsan.supp (each one explained there). CUDA, benchmarks and examples
# are off; the reference sweep (reduced: BRAID_SWEEP=quick) only with BRAID_SANITIZE_SWEEP=1.
# test_schedule is left out: a pure single-threaded simulation (minutes under ASan) whose schedules
# the reference sweep runs for real.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh asan\|tsan [build-dir]}
build=${2:-build-$kind}
case "$kind" in
  asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" ;;
  tsan) flags="-fsanitize=thread" ;;
  *) echo "sanitize.sh: unknown sanitizer '$kind' (asan or tsan)" >&2; exit 2 ;;
esac
tests=(test_core test_bad_args test_p2p test_failures test_bootstrap test_custom_types test_hygiene test_mismatch test_alloc_free)
# TSan looks for races between threads: the single-threaded tests (number formats, argument checks
# that raise before any rank waits) give it nothing to find and cost the longest builds; ASan runs them.
if [ "$kind" = tsan ]; then tests=(test_p2p test_failures test_bootstrap test_custom_types test_hygiene test_mismatch); fi
# The emulated CUDA device under ThreadSanitizer (docs/reliability.md): braid's one-process device
# protocol as a C++ memory-model program (test_gpu_emu_protocol), a build with the progress post
# weakened to relaxed that must be reported (test_gpu_emu_mutant_detected), and the emulator's own
# tests. BRAID_SANITIZE_EMU=0 leaves them out. CTest names differ from target names here.
emu_targets=()
emu_ctest=()
if [ "$kind" = tsan ] && [ "${BRAID_SANITIZE_EMU:-1}" = 1 ]; then
  emu_targets=(test_gpu_emu test_emu)
  emu_ctest=(test_gpu_emu_protocol test_gpu_emu_mutant_detected test_emu test_emu_processes test_emu_launch_blocking)
fi
# The reference sweep (BRAID_SWEEP=quick) passes under both sanitizers but its build alone takes
# minutes with sanitizer instrumentation: opt in with BRAID_SANITIZE_SWEEP=1 (CI leaves it out).
if [ "${BRAID_SANITIZE_SWEEP:-0}" = 1 ] &&
   grep -q 'quick' tests/comm/test_reference_sweep.cpp tests/comm/sweep.hpp 2>/dev/null; then
  tests+=(test_reference_sweep)
  export BRAID_SWEEP=quick
fi
# ASan+UBSan at -O0: every load and store is still there to be checked (-O1 may remove some), and its
# build took 222 s of CI's 2 cores at -O1 against 81 s at -O0, for a ctest of 30 s against 65 s
# (2026-11-28); test_core, the 65 s, keeps -O1 (tests/CMakeLists.txt), and the phase took 128 s.
# TSan stays at -O1: its emulated-device protocol runs would take far longer at -O0.
opt="-O1 -g"
if [ "$kind" = asan ]; then opt="-O0 -g"; fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=$opt" \
  "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$flags" \
  -DBRAID_CUDA=OFF -DBRAID_BUILD_BENCH=OFF -DBRAID_BUILD_EXAMPLES=OFF >/dev/null
# braid::nn's device pool on the emulated device (where braid::nn exists): its two-thread case finds a
# missing lock only under ThreadSanitizer.
if [ ${#emu_targets[@]} -gt 0 ] && grep -q '^build test_nn_device_pool:' "$build/build.ninja"; then
  emu_targets+=(test_nn_device_pool)
  emu_ctest+=(test_nn_device_pool)
fi
present=()
for t in "${tests[@]}"; do
  if grep -q "^build $t:" "$build/build.ninja" 2>/dev/null || grep -q "build tests/$t:" "$build/build.ninja"; then present+=("$t"); fi
done
cmake --build "$build" -j "$(nproc)" --target "${present[@]}" "${emu_targets[@]}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}
regex="^($(IFS='|'; echo "${present[*]} ${emu_ctest[*]}" | sed 's/test_reference_sweep/test_reference_sweep_threads|test_reference_sweep_processes/; s/ \{1,\}/|/g; s/|$//'))\$"
cd "$build"
# TSan from g++ 12 cannot map its shadow memory under kernels with 32 bits of mmap randomisation
# ("unexpected memory mapping"): run it without address-space randomisation.
run=()
if [ "$kind" = tsan ] && command -v setarch >/dev/null 2>&1; then run=(setarch "$(uname -m)" -R); fi
"${run[@]}" ctest --output-on-failure -j "$(nproc)" --timeout 900 -R "$regex"
