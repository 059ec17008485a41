#!/usr/bin/env bash
# bench/vs-mpi.sh — braid's process backend against OpenMPI's MPI_Allreduce on this host, in one run.
#
#   bench/vs-mpi.sh [BUILD_DIR]          (default: build/; needs braid-bench and braid-mpi-allreduce)
#
# For N = 2 and 4 ranks, float sum, sizes MIN..MAX bytes (factor FACTOR), both timed the same way:
# per size, WARMUP untimed calls, a barrier, ITERS timed calls; time = mean per call on each rank, the
# maximum over ranks (us). braid: `braid-bench all_reduce --backend procs` (out-of-place column, the
# tuning table's algorithm, results checked); MPI: `mpirun -np N braid-mpi-allreduce` (out-of-place).
# Prints one table per N: size, braid time, MPI time, MPI/braid (> 1: braid is faster), with the
# machine, date and commit above them.
#
# Environment: RANKS ("2 4"), MIN (4), MAX (64M), FACTOR (4), ITERS (20), WARMUP (5),
# MPIRUN_ARGS (extra mpirun flags; --oversubscribe is always passed, --allow-run-as-root as root).
set -euo pipefail

build=${1:-build}
bench="$build/bench/braid-bench"
mpi="$build/bench/braid-mpi-allreduce"
RANKS=${RANKS:-"2 4"}
MIN=${MIN:-4}
MAX=${MAX:-64M}
FACTOR=${FACTOR:-4}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}

for exe in "$bench" "$mpi"; do
  if [[ ! -x "$exe" ]]; then
    echo "vs-mpi.sh: $exe not found; build it first (braid-mpi-allreduce needs MPI at configure time)" >&2
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
trap 'rm -rf "$tmp"' EXIT

echo "# braid (processes backend) vs OpenMPI MPI_Allreduce, float sum, out-of-place"
echo "# date     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "# machine  $(nproc) cpus, ${cpu:-unknown cpu}, $(uname -sr)"
echo "# commit   $commit"
echo "# mpi      $(mpirun --version 2>&1 | head -1)"
echo "# method   per size: $WARMUP warmup calls, barrier, $ITERS timed calls; mean per call, max over ranks (us)"
echo "#          mpirun ${mpirun_flags[*]}"

status=0
for n in $RANKS; do
  if ! "$bench" all_reduce --backend procs -np "$n" -d float -o sum -b "$MIN" -e "$MAX" -f "$FACTOR" \
         -n "$ITERS" -w "$WARMUP" -c 1 --csv "$tmp/braid.csv" >"$tmp/braid.log" 2>&1; then
    echo "vs-mpi.sh: braid-bench failed for $n ranks:" >&2
    cat "$tmp/braid.log" >&2
    status=1
    continue
  fi
  if ! mpirun "${mpirun_flags[@]}" -np "$n" "$mpi" -b "$MIN" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" \
         >"$tmp/mpi.csv" 2>"$tmp/mpi.err"; then
    echo "vs-mpi.sh: mpirun failed for $n ranks:" >&2
    cat "$tmp/mpi.err" >&2
    status=1
    continue
  fi
  echo "#"
  echo "# $n ranks"
  # braid.csv: collective,algorithm,backend,nranks,size,count,type,redop,root,time_us,algbw,busbw,wrong,...
  # mpi.csv:   size,count,time_us,algbw,busbw,wrong
  awk -F, '
    FNR == 1 { next }
    FILENAME == ARGV[1] { t[$5] = $10; w[$5] = $13; next }
    ($1 in t) {
      ratio = t[$1] > 0 ? $3 / t[$1] : 0
      printf "%12s  %14.2f  %14.2f  %10.2f%s\n", $1, t[$1], $3, ratio,
             (w[$1] != "0" || $6 != "0") ? "  (wrong values: braid " w[$1] ", mpi " $6 ")" : ""
    }
    BEGIN { printf "# %10s  %14s  %14s  %10s\n", "size (B)", "braid (us)", "MPI (us)", "MPI/braid" }
  ' "$tmp/braid.csv" "$tmp/mpi.csv"
done
exit $status
