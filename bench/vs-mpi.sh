#!/usr/bin/env bash
# bench/vs-mpi.sh — braid's process backend against OpenMPI's MPI_Allreduce on this host, in one run,
# in three settings (issue 15):
#   quiet2   2 processes, nothing else started;
#   hog2     2 processes beside a CPU hog: a busy loop the script starts (pinned to the last CPU,
#            nice HOG_NICE) before the setting's runs and kills after them;
#   four     4 processes (on this 2-CPU machine: 2 ranks per core).
#
#   bench/vs-mpi.sh [BUILD_DIR]          (default: build/; needs braid-bench and braid-mpi-allreduce)
#
# Float sum, out-of-place, sizes MIN..MAX bytes (factor FACTOR), both timed the same way: per size,
# WARMUP untimed calls, a barrier, ITERS timed calls; time = mean per call on each rank, the maximum
# over ranks (us). braid: `braid-bench all_reduce --backend procs` (the tuning table's algorithm,
# results checked); MPI: `mpirun -np N braid-mpi-allreduce`. PASSES passes, braid and MPI alternating
# first; a pass runs every setting. Per setting it prints, per size, the medians over passes of
# braid's and MPI's time and busbw, and the median of the per-pass ratios MPI/braid (> 1: braid is
# faster) with their range. bench/plot-vs-mpi.py draws the log.
#
# The floor (issue 15): at the start of every pass, braid-micro's memcpy of 64 MiB runs on every CPU at
# once (taskset, one copy per CPU); the per-CPU rate is the mean of their rates (bytes read + written
# per second). For quiet2 the log then gives, from 16 MiB up, the floor: the bytes an out-of-place
# all_reduce must move through memory on each rank, its input read once and its output written once
# (2 x size), over the per-CPU rate of the same pass, all ranks at once, one per CPU. two_shot moves
# 2 x size more on each rank (the input chunks peers read copied into staging, the reduced chunk into
# the window, both read back by the peer), but through the 8 MiB staging segment, a 4 MiB half per
# round: both ranks' segments fit the 32 MiB L3 of the VM this was written on, so those bytes are
# cache traffic, not memory traffic. braid/floor is the median over passes of braid's time over it.
# The staged floor counts those bytes too (4 x size per rank over the same rate): with buffers private
# to each process, every byte a rank contributes to another must be written to shared memory and read
# back, so no algorithm over private buffers moves less (only one that reads the peer's buffer in
# place, registered with the communicator or through the kernel, could reach the first floor). Where
# the staging traffic is not cheaper than memory traffic (the 2-vCPU Xeon VM of 2026-11-27, whose
# memcpy rate is its L3's), braid's time is near the staged floor, not the first one.
#
# Environment: SETTINGS ("quiet2 hog2 four"), PASSES (3), MIN (4), MAX (64M), FACTOR (4), ITERS (20),
# WARMUP (5), HOG_NICE (19: the issue's measurement was beside a nice'd compile; 0 for an equal job),
# MPIRUN_ARGS (extra mpirun flags; --oversubscribe is always passed, --allow-run-as-root as root),
# BRAID_BENCH_ARGS (extra braid-bench flags, e.g. "--bind none"; braid-bench binds rank r to the r-th
# CPU when every rank can have one, as mpirun binds 2 ranks to cores by default).
set -euo pipefail
source "$(dirname "$0")/env-defaults.sh"

build=${1:-build}
bench="$build/bench/braid-bench"
mpi="$build/bench/braid-mpi-allreduce"
micro="$build/bench/braid-micro"
env_defaults "SETTINGS=quiet2 hog2 four" PASSES=3 HOG_NICE=19 MIN=4 MAX=64M FACTOR=4 ITERS=20 \
  WARMUP=5

for exe in "$bench" "$mpi" "$micro"; do
  if [[ ! -x "$exe" ]]; then
    echo "vs-mpi.sh: $exe not found; build it first (braid-mpi-allreduce needs MPI at configure time, braid-micro Google Benchmark)" >&2
    exit 2
  fi
done
if ! command -v mpirun >/dev/null 2>&1; then
  echo "vs-mpi.sh: mpirun not found" >&2
  exit 2
fi

mpirun_flags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then
  mpirun_flags+=(--allow-run-as-root)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# shellcheck disable=SC2206
[[ -n "${MPIRUN_ARGS:-}" ]] && mpirun_flags+=(${MPIRUN_ARGS})

repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(GIT_OPTIONAL_LOCKS=0 git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n "$(GIT_OPTIONAL_LOCKS=0 git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  commit="$commit (with uncommitted changes)"
fi
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)

tmp=$(mktemp -d)

echo "# braid (processes backend) vs OpenMPI MPI_Allreduce, float sum, out-of-place"
echo "# date     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "# machine  $(nproc) cpus, ${cpu:-unknown cpu}, $(uname -sr)"
echo "# commit   $commit"
echo "# mpi      $(mpirun --version 2>&1 | head -1)"
echo "# method   per size: $WARMUP warmup calls, barrier, $ITERS timed calls; mean per call, max over ranks (us);"
echo "#          $PASSES passes (braid and MPI alternate going first), medians over passes"
echo "#          mpirun ${mpirun_flags[*]}"
echo "#          braid-bench ${bench}${BRAID_BENCH_ARGS:+ $BRAID_BENCH_ARGS}"
echo "# load     $(cut -d' ' -f1-3 /proc/loadavg) at the start"

hog_pid=
stop_hog() { if [[ -n $hog_pid ]]; then kill "$hog_pid" 2>/dev/null || true; wait "$hog_pid" 2>/dev/null || true; hog_pid=; fi; }
trap 'stop_hog; rm -rf "$tmp"' EXIT
start_hog() {
  local cpu_last=$(($(nproc) - 1))
  nice -n "$HOG_NICE" taskset -c "$cpu_last" bash -c 'while :; do :; done' &
  hog_pid=$!
  sleep 0.2
}

# memcpy of 64 MiB on every CPU at once: one rate per CPU (bytes read + written per second) to $1.
memcpy_rates() {
  local cpu pids=()
  for ((cpu = 0; cpu < $(nproc); cpu++)); do
    taskset -c "$cpu" "$micro" --benchmark_filter='^memcpy/67108864$' --benchmark_min_time=1 \
      --benchmark_format=csv >"$tmp/memcpy-$cpu.csv" 2>/dev/null &
    pids+=($!)
  done
  wait "${pids[@]}"
  for ((cpu = 0; cpu < $(nproc); cpu++)); do
    awk -F, '/^"memcpy\/67108864"/ {print $6}' "$tmp/memcpy-$cpu.csv"
  done >"$1"
}

status=0
for ((p = 1; p <= PASSES; p++)); do
  memcpy_rates "$tmp/memcpy-pass-$p.txt"
  for setting in $SETTINGS; do
    case $setting in
      quiet2) n=2 ;;
      hog2) n=2; start_hog ;;
      four) n=4 ;;
      *) echo "vs-mpi.sh: unknown setting '$setting' (quiet2, hog2, four)" >&2; exit 2 ;;
    esac
    run_braid() {
      "$bench" all_reduce --backend procs -np "$n" -d float -o sum -b "$MIN" -e "$MAX" -f "$FACTOR" \
        -n "$ITERS" -w "$WARMUP" -c 1 --csv "$tmp/$setting-$p-braid.csv" ${BRAID_BENCH_ARGS:-} >"$tmp/braid.log" 2>&1 ||
        { echo "vs-mpi.sh: braid-bench failed ($setting, pass $p):" >&2; cat "$tmp/braid.log" >&2; status=1; }
    }
    run_mpi() {
      mpirun "${mpirun_flags[@]}" -np "$n" "$mpi" -b "$MIN" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" \
        >"$tmp/$setting-$p-mpi.csv" 2>"$tmp/mpi.err" ||
        { echo "vs-mpi.sh: mpirun failed ($setting, pass $p):" >&2; cat "$tmp/mpi.err" >&2; status=1; }
    }
    if ((p % 2)); then run_braid; run_mpi; else run_mpi; run_braid; fi
    stop_hog
  done
done

# braid csv: collective,algorithm,backend,nranks,size,count,type,redop,root,time_us,algbw,busbw,wrong,...
# mpi csv:   size,count,time_us,algbw,busbw,wrong
python3 - "$tmp" "$PASSES" "$HOG_NICE" $SETTINGS <<'PY' || status=1
import csv, os, statistics as st, sys
tmp, passes, hog_nice, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
rate = {}  # pass -> mean per-CPU memcpy rate (bytes/s, read + written) with every CPU copying
for p in range(1, passes + 1):
    try:
        v = [float(x) for x in open(f"{tmp}/memcpy-pass-{p}.txt").read().split()]
    except (OSError, ValueError):
        v = []
    if v:
        rate[p] = sum(v) / len(v)
print("#")
print("# memcpy of 64 MiB on every CPU at once (braid-micro), per CPU, GB/s read + written, by pass: "
      + ", ".join(f"{rate[p] / 1e9:.2f}" for p in sorted(rate)))
what = {"quiet2": "2 processes, nothing else started",
        "hog2": f"2 processes beside a busy loop pinned to the last CPU (nice {hog_nice})",
        "four": "4 processes"}
for s in settings:
    rows = {}  # size -> list of (braid_t, braid_busbw, mpi_t, mpi_busbw, wrong)
    floors = {}  # size -> list of (floor_us, braid_t / floor_us), quiet2 from 16 MiB up
    for p in range(1, passes + 1):
        fb, fm = f"{tmp}/{s}-{p}-braid.csv", f"{tmp}/{s}-{p}-mpi.csv"
        if not (os.path.exists(fb) and os.path.exists(fm)): continue
        b = {int(r["size"]): r for r in csv.DictReader(open(fb))}
        for r in csv.DictReader(open(fm)):
            z = int(r["size"])
            if z in b:
                rows.setdefault(z, []).append((float(b[z]["time_us"]), float(b[z]["busbw"]), float(r["time_us"]),
                                               float(r["busbw"]), int(b[z]["wrong"]) + int(r["wrong"])))
                if s == "quiet2" and z >= 16 << 20 and p in rate:
                    fl = 2 * z / rate[p] * 1e6
                    t = float(b[z]["time_us"])
                    floors.setdefault(z, []).append((fl, t / fl, 2 * fl, t / (2 * fl)))
    print("#")
    print(f"# setting {s}: {what[s]}")
    print(f"# {'size (B)':>10}  {'braid (us)':>11}  {'MPI (us)':>11}  {'MPI/braid':>9}  {'range':>11}  {'braid busbw':>11}  {'MPI busbw':>10}  passes")
    for z in sorted(rows):
        v = rows[z]
        r = [m / b for b, _, m, _, _ in v if b > 0]
        wrong = sum(x[4] for x in v)
        print(f"{z:12d}  {st.median(x[0] for x in v):11.2f}  {st.median(x[2] for x in v):11.2f}  {st.median(r):9.2f}"
              f"  {min(r):5.2f}-{max(r):<5.2f}  {st.median(x[1] for x in v):11.3f}  {st.median(x[3] for x in v):10.3f}  {len(v)}"
              + (f"  (wrong values: {wrong})" if wrong else ""))
    if floors:
        print(f"# {s}, the floor (input read and output written once per rank, 2 x size, / the same pass's per-CPU memcpy rate),")
        print(f"# and the staged floor (two_shot's bytes with private buffers, 4 x size per rank: see the top of this script):")
        print(f"# {'size (B)':>10}  {'floor (us)':>11}  {'braid/floor':>11}  {'range':>11}  {'staged (us)':>11}  {'braid/staged':>12}  {'range':>11}")
        for z in sorted(floors):
            f = floors[z]
            print(f"{z:12d}  {st.median(x[0] for x in f):11.1f}  {st.median(x[1] for x in f):11.2f}"
                  f"  {min(x[1] for x in f):5.2f}-{max(x[1] for x in f):<5.2f}"
                  f"  {st.median(x[2] for x in f):11.1f}  {st.median(x[3] for x in f):12.2f}"
                  f"  {min(x[3] for x in f):5.2f}-{max(x[3] for x in f):<5.2f}")
PY
exit $status
