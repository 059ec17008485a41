#!/usr/bin/env bash
# bench/floor-pairs.sh — the latency floor of several revisions side by side, on a noisy machine.
#   bash bench/floor-pairs.sh [-p PASSES] [-s BYTES] REV_A REV_B ...   (a REV may be "work": the working tree,
#                                                                      or a directory holding an include/)
# Builds bench/floor_latency.cpp (this tree's copy) against each revision's include/ (g++ -O2), then runs
# PASSES passes; a pass runs every build once, in alternating order, and starts only after the machine
# was at least 95% idle for 0.3 s (a pass then takes well under a second). Prints the raw passes, then
# per build the median per-call time and the quartiles of its ratio to REV_A in the same pass. Run it
# twice with the same revision named twice to see the noise band of identical binaries.
set -euo pipefail
passes=30 bytes=4
while getopts "p:s:" o; do case $o in p) passes=$OPTARG ;; s) bytes=$OPTARG ;; *) exit 2 ;; esac; done
shift $((OPTIND - 1))
(($# >= 2)) || { echo "usage: $0 [-p passes] [-s bytes] REV_A REV_B ..." >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
names=()
for i in $(seq 1 $#); do
  rev=${!i}; name="$i-${rev//\//_}"; names+=("$name"); mkdir -p "$tmp/$name"
  if [[ $rev == work ]]; then cp -r "$root/include" "$tmp/$name/"
  elif [[ -d $rev/include ]]; then cp -r "$rev/include" "$tmp/$name/"
  else git -C "$root" archive "$rev" include | tar -x -C "$tmp/$name"; fi
  g++ -std=c++20 -O2 -I"$tmp/$name/include" "$root/bench/floor_latency.cpp" -o "$tmp/$name/probe" -lpthread
done
idle() {
  local a b; read -r _ u n s i w q sq st _ < /proc/stat; a=$((u + n + s + i + w + q + sq + st)); b=$i; sleep 0.3
  read -r _ u n s i w q sq st _ < /proc/stat; (( (i - b) * 100 >= (u + n + s + i + w + q + sq + st - a) * 95 ))
}
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $bytes B, $passes passes"
got=0 tries=0
while ((got < passes && tries < 100 * passes)); do
  tries=$((tries + 1)); idle || continue
  order=("${names[@]}"); ((got % 2)) && order=($(printf '%s\n' "${names[@]}" | tac))
  for nm in "${order[@]}"; do echo "$got $nm $("$tmp/$nm/probe" "$bytes")"; done
  got=$((got + 1))
done | tee "$tmp/raw"
python3 - "$tmp/raw" "${names[0]}" <<'PY'
import sys, collections, statistics as st
d = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    p, name, _, _, med, _ = line.split(); d[p][name] = float(med)
base = sys.argv[2]
for name in sorted({n for x in d.values() for n in x}, key=lambda n: int(n.split('-')[0])):
    r = [x[name] / x[base] for x in d.values() if name in x and base in x]
    q = st.quantiles(r, n=4) if len(r) > 1 else r * 3
    print(f"# {name:24s} passes {len(r):3d}  median {st.median([x[name] for x in d.values() if name in x]):.4f} us"
          f"  ratio to {base}: p25 {q[0]:.3f} median {st.median(r):.3f} p75 {q[2]:.3f}")
PY
