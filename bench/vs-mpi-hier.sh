#!/usr/bin/env bash
# bench/vs-mpi-hier.sh — braid::mpi's hierarchical collectives beside the plain MPI collective, one
# run of braid-bench-mpi under mpirun, with the log kept under bench/results/.
#
#   bench/vs-mpi-hier.sh [BUILD_DIR]        (default build/; needs braid-bench-mpi, i.e. MPI at configure)
#
# NP ranks (4) in HOSTS simulated hosts (2) of consecutive ranks (BRAID_HOST_ID = rank / (NP/HOSTS)),
# unless REAL_HOSTS=1 (then the real host split: one host on one machine). Environment: COLLS
# ("all"), TYPE (float), MIN (8), MAX (16M), FACTOR (8), ITERS (10), WARMUP (3), OUT (the log:
# bench/results/vs-mpi-hier-DATE-cpu.txt), MPIRUN_ARGS (extra mpirun flags; --oversubscribe is always
# passed, --allow-run-as-root as root). Prints the log as it writes it.
set -euo pipefail
source "$(dirname "$0")/env-defaults.sh"

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
exe="$build/bench/braid-bench-mpi"
env_defaults NP=4 HOSTS=2 COLLS=all TYPE=float MIN=8 MAX=16M FACTOR=8 ITERS=10 WARMUP=3 \
  "OUT=$repo/bench/results/vs-mpi-hier-$(date -u +%Y-%m-%d)-cpu.txt"

if [[ ! -x "$exe" ]]; then
  echo "vs-mpi-hier.sh: $exe not found; build the braid-bench-mpi target (needs MPI at configure time)" >&2
  exit 2
fi
command -v mpirun >/dev/null 2>&1 || { echo "vs-mpi-hier.sh: mpirun not found" >&2; exit 2; }

flags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then
  flags+=(--allow-run-as-root)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# shellcheck disable=SC2206
[[ -n "${MPIRUN_ARGS:-}" ]] && flags+=(${MPIRUN_ARGS})

commit=$(GIT_OPTIONAL_LOCKS=0 git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n "$(GIT_OPTIONAL_LOCKS=0 git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  commit="$commit (with uncommitted changes in the tree)"
fi
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)
per_host=$(( NP / HOSTS ))
if [[ "${REAL_HOSTS:-0}" == 1 ]]; then
  launch=("$exe")
  layout="real host split"
else
  launch=(sh -c 'export BRAID_HOST_ID=$(( OMPI_COMM_WORLD_RANK / '"$per_host"' )); exec "$0" "$@"' "$exe")
  layout="BRAID_HOST_ID = rank / $per_host"
fi
args=($COLLS -d "$TYPE" -b "$MIN" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")

mkdir -p "$(dirname "$OUT")"
{
  echo "# braid::mpi hierarchical collectives vs plain MPI collectives (bench/vs-mpi-hier.sh)"
  echo "# date     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "# machine  $(nproc) cpus, ${cpu:-unknown cpu}, $(uname -sr), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# commit   $commit"
  echo "# mpi      $(mpirun --version 2>&1 | head -1)"
  echo "# layout   $NP ranks, $layout"
  echo "# command  mpirun ${flags[*]} -np $NP ${launch[*]} ${args[*]}"
  mpirun "${flags[@]}" -np "$NP" "${launch[@]}" "${args[@]}"
} 2>&1 | tee "$OUT"
exit "${PIPESTATUS[0]}"
