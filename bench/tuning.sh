#!/usr/bin/env bash
# bench/tuning.sh — the evidence behind include/braid/comm/tuning.hpp (issue 15, item 5): every host
# collective with every algorithm it implements, and the tuning table's own choice ("auto"), side by
# side in one run.
#
#   bench/tuning.sh [BUILD_DIR]          (default: build/; needs bench/braid-bench)
#
# Per setting and collective, one braid-bench run per pass times every algorithm over the sizes
# MIN..MAX (factor FACTOR), float sum, out-of-place and in place, results checked (-c 1); the order of
# the algorithms rotates from pass to pass. Time per call: WARMUP untimed calls, a barrier, ITERS
# timed calls, the mean per call on each rank, the maximum over ranks (braid-bench's table).
#
# Prints, per setting, collective and size, the median over passes of each algorithm's out-of-place
# time (us), the fastest algorithm, how many passes it won, and auto/best: the table's choice against
# the fastest (1.00: the table picks the fastest; > 1: it loses that much).
#
# Environment: SETTINGS ("procs2 procs4 threads2 threads4": 2 or 4 processes, 2 or 4 thread ranks; braid-bench
# binds processes to CPUs when every rank can have one), COLLECTIVES (all five reducing and moving
# collectives), PASSES (3), MIN (64), MAX (64M), FACTOR (4), ITERS (20), WARMUP (5), BENCH_ARGS (extra
# braid-bench flags for every run, e.g. "--zero-copy-min 16K").
set -euo pipefail
source "$(dirname "$0")/env-defaults.sh"

build=${1:-build}
bench="$build/bench/braid-bench"
env_defaults "SETTINGS=procs2 procs4 threads2 threads4" \
  "COLLECTIVES=all_reduce reduce_scatter all_gather broadcast reduce" PASSES=3 MIN=64 MAX=64M \
  FACTOR=4 ITERS=20 WARMUP=5

if [[ ! -x "$bench" ]]; then
  echo "tuning.sh: $bench not found; build it first (cmake --build $build --target braid-bench)" >&2
  exit 2
fi

algos_of() { # the algorithms braid-bench's "-a all" runs for a collective, and auto
  case $1 in
    all_reduce) echo "ring tree one_shot two_shot halving_doubling direct auto" ;;
    reduce_scatter | all_gather) echo "ring halving_doubling direct auto" ;;
    broadcast | reduce) echo "ring tree direct auto" ;;
    *) echo "tuning.sh: unknown collective '$1'" >&2; exit 2 ;;
  esac
}

repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(GIT_OPTIONAL_LOCKS=0 git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n "$(GIT_OPTIONAL_LOCKS=0 git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  commit="$commit (with uncommitted changes)"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "# braid host collectives, every algorithm against the tuning table's choice (auto)"
echo "# date     $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "# machine  $(nproc) cpus, $(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo), $(uname -sr)"
echo "# commit   $commit"
echo "# method   float sum, sizes $MIN..$MAX x$FACTOR; per size $WARMUP warmup calls, barrier, $ITERS timed calls,"
echo "#          mean per call, max over ranks (us), out-of-place; results checked; $PASSES passes, the"
echo "#          algorithms' order rotating; medians over passes"
echo "# load     $(cut -d' ' -f1-3 /proc/loadavg) at the start"
[[ -n "${BENCH_ARGS:-}" ]] && echo "# args     braid-bench ... $BENCH_ARGS"

status=0
for ((p = 1; p <= PASSES; p++)); do
  for setting in $SETTINGS; do
    case $setting in
      procs2) args=(--backend procs -np 2) ;;
      procs4) args=(--backend procs -np 4) ;;
      threads2) args=(--backend threads -np 2) ;;
      threads4) args=(--backend threads -np 4) ;;
      *) echo "tuning.sh: unknown setting '$setting' (procs2, procs4, threads2, threads4)" >&2; exit 2 ;;
    esac
    for c in $COLLECTIVES; do
      read -r -a list <<<"$(algos_of "$c")"
      k=$(((p - 1) % ${#list[@]}))
      order=("${list[@]:k}" "${list[@]:0:k}")
      alist=$(IFS=,; echo "${order[*]}")
      # shellcheck disable=SC2086 # BENCH_ARGS is split into flags on purpose
      if ! "$bench" "$c" "${args[@]}" ${BENCH_ARGS:-} -a "$alist" -d float -o sum -b "$MIN" -e "$MAX" -f "$FACTOR" \
          -n "$ITERS" -w "$WARMUP" -c 1 --csv "$tmp/$setting-$c-$p.csv" >"$tmp/log" 2>&1; then
        echo "tuning.sh: braid-bench failed ($setting, $c, pass $p):" >&2
        cat "$tmp/log" >&2
        status=1
      fi
    done
  done
done

# csv: collective,algorithm,backend,nranks,size,count,type,redop,root,time_us,algbw,busbw,wrong,...
python3 - "$tmp" "$PASSES" "$SETTINGS" "$COLLECTIVES" <<'PY' || status=1
import csv, os, statistics as st, sys
tmp, passes, settings, colls = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
raw = []
what = {"procs2": "2 processes", "procs4": "4 processes", "threads2": "2 thread ranks", "threads4": "4 thread ranks"}
for s in settings:
    for c in colls:
        t = {}  # (size, algo) -> [time per pass]
        wins = {}  # size -> {algo: passes won}
        wrong = 0
        for p in range(1, passes + 1):
            f = f"{tmp}/{s}-{c}-{p}.csv"
            if not os.path.exists(f):
                continue
            rows = list(csv.DictReader(open(f)))
            per = {}
            for r in rows:
                z, a = int(r["size"]), r["algorithm"]
                t.setdefault((z, a), []).append(float(r["time_us"]))
                wrong += int(r["wrong"] or 0) + int(r.get("wrong_ip") or 0)
                if a != "auto":
                    per.setdefault(z, []).append((float(r["time_us"]), a))
            for z, v in per.items():
                w = min(v)[1]
                wins.setdefault(z, {}).setdefault(w, 0)
                wins[z][w] += 1
        raw.append((s, c, t))
        algos = sorted({a for _, a in t if a != "auto"})
        print("#")
        print(f"# setting {s} ({what[s]}), {c}" + (f"  (wrong values: {wrong})" if wrong else ""))
        print("# " + f"{'size (B)':>10}" + "".join(f"  {a:>16}" for a in algos) + f"  {'auto':>10}  {'best':>16}  won  auto/best")
        for z in sorted({z for z, _ in t}):
            med = {a: st.median(t[(z, a)]) for a in algos if (z, a) in t}
            if not med:
                continue
            best = min(med, key=med.get)
            auto = st.median(t[(z, "auto")]) if (z, "auto") in t else float("nan")
            won = wins.get(z, {}).get(best, 0)
            print(f"{z:12d}" + "".join(f"  {med[a]:16.2f}" if a in med else f"  {'-':>16}" for a in algos)
                  + f"  {auto:10.2f}  {best:>16}  {won}/{len(t[(z, best)])}  {auto / med[best]:9.2f}")
print("#")
print("# raw: setting collective algorithm, then per size 'size:time per pass (us)'")
for s, c, t in raw:
    for a in sorted({a for _, a in t}):
        print(f"{s} {c} {a} " + " ".join(f"{z}:" + ",".join(f"{x:.2f}" for x in t[(z, a)]) for z in sorted({z for z, b in t if b == a})))
PY
exit $status
