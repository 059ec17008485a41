#!/usr/bin/env bash
# bench/mpi-check-ab.sh — two builds of braid-bench-mpi, alternating pass by pass, and the medians of
# each row's braid::mpi time (and, as the noise yardstick, the plain MPI time, which neither build
# changes). Written for the inter-host call check (issue 18): before and after on one machine.
#
#   bench/mpi-check-ab.sh BEFORE_EXE AFTER_EXE [OUT]
#
# Environment: PASSES (8: pairs of runs, before first in odd passes, after first in even ones), NP (4),
# HOSTS (2; BRAID_HOST_ID = rank / (NP/HOSTS)), COLLS (all), MIN (8), MAX (64K), FACTOR (8), ITERS
# (500), WARMUP (50). Every mpirun gets --oversubscribe and mpi_yield_when_idle=1 (ranks may
# outnumber cores, as in tests/mpi/launch.sh). OUT: the log (default
# bench/results/mpi-check-ab-DATE-cpu.txt): a header, every run's full output, then the summary.
set -euo pipefail
source "$(dirname "$0")/env-defaults.sh"

repo=$(cd "$(dirname "$0")/.." && pwd)
before=$1 after=$2
OUT=${3:-$repo/bench/results/mpi-check-ab-$(date -u +%Y-%m-%d)-cpu.txt}
env_defaults PASSES=8 NP=4 HOSTS=2 COLLS=all MIN=8 MAX=64K FACTOR=8 ITERS=500 WARMUP=50
per_host=$(( NP / HOSTS ))

flags=(--oversubscribe --mca mpi_yield_when_idle 1)
if [[ $(id -u) -eq 0 ]]; then
  flags+=(--allow-run-as-root)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
args=($COLLS -d float -b "$MIN" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")
run() { # label exe
  echo "## run $1 pass $pass load $(cut -d' ' -f1-3 /proc/loadavg)"
  mpirun "${flags[@]}" -np "$NP" sh -c 'export BRAID_HOST_ID=$(( OMPI_COMM_WORLD_RANK / '"$per_host"' )); exec "$0" "$@"' "$2" "${args[@]}"
}

mkdir -p "$(dirname "$OUT")"
{
  echo "# braid-bench-mpi, two builds alternating (bench/mpi-check-ab.sh)"
  echo "# date     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "# machine  $(nproc) cpus, $(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo), $(uname -sr)"
  echo "# before   $before"
  echo "# after    $after"
  echo "# layout   $NP ranks, BRAID_HOST_ID = rank / $per_host; passes $PASSES; args ${args[*]}"
  for pass in $(seq 1 "$PASSES"); do
    if (( pass % 2 )); then run before "$before"; run after "$after"; else run after "$after"; run before "$before"; fi
  done
} > "$OUT.raw" 2>&1
python3 - "$OUT.raw" > "$OUT.summary" <<'EOF'
import re, statistics, sys
runs = {}  # (label, coll, size) -> ([braid times], [mpi times])
label = coll = None
for line in open(sys.argv[1]):
    m = re.match(r"## run (\w+) pass", line)
    if m: label = m.group(1); continue
    m = re.match(r"# (\w+): braid::mpi", line)
    if m: coll = m.group(1); continue
    f = line.split()
    if label and coll and len(f) == 13 and not line.startswith("#"):
        size = int(float(f[0]))
        b, p = runs.setdefault((label, coll, size), ([], []))
        b.append(float(f[5])); p.append(float(f[9]))
def ratio(a, b):
    return statistics.median(a) / statistics.median(b) if statistics.median(b) > 0 else float("nan")
def fmt(xs):
    return "%8.2f [%7.2f-%8.2f]" % (statistics.median(xs), min(xs), max(xs))
print("# median [min-max] over passes, us per call (max over ranks); ratio = median after / median before")
print("# %-14s %8s   %-27s %-27s %6s   %-27s %-27s %6s" % ("collective", "size(B)", "braid::mpi before", "braid::mpi after", "ratio",
                                                          "MPI (before's run)", "MPI (after's run)", "ratio"))
for (label, coll, size) in sorted(k for k in runs if k[0] == "before"):
    b0, p0 = runs[("before", coll, size)]
    b1, p1 = runs.get(("after", coll, size), ([float("nan")], [float("nan")]))
    print("  %-14s %8d   %s %s %6.2f   %s %s %6.2f" % (coll, size, fmt(b0), fmt(b1), ratio(b1, b0),
                                                     fmt(p0), fmt(p1), ratio(p1, p0)))
EOF
cat "$OUT.summary" "$OUT.raw" > "$OUT"
rm -f "$OUT.raw" "$OUT.summary"
sed -n '1,/^# braid-bench-mpi, two/p' "$OUT" | head -n -1
