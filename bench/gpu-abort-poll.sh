#!/usr/bin/env bash
# bench/gpu-abort-poll.sh — on a GPU: does the read of the host-mapped abort flag make a step slow?
#
# The question (docs/architecture.md, "What the GPU runs showed"): inside collective_kernel a step
# costs 15-25 us where braid-gpu-sync-probe's costs 2-3. ncu's samples (2026-11-25) charged 25-30 us
# to each read of the abort flag, which lives in host-mapped memory and which every waiting thread read
# every 64 polls. With 33 blocks per rank waiting, one of them is nearly always inside such a read when
# the peer posts, and the step ends only when the last block has seen the post. BRAID_CUDA_ABORT_POLL
# (wait_ge's abort_every_ns) bounds how often a waiting thread reads the flag: "0.001us" is the old
# behaviour (every 64 polls), "100us" (the default since) and "1ms" read it only in waits that last
# that long. First run, the answer (4-10x): bench/results/h100-2026-11-26/README.md.
#
# Runs braid-bench (one process, every rank on GPU 0, 32 MiB float, -c 1: every result checked) for
# the schedules that take many steps per round, with each setting in turn, PASSES times (A B C A B C:
# the machine's drift falls on every setting alike). Prints the lines of braid-bench's table.
#
# Usage: bench/gpu-abort-poll.sh [BENCH]   (default build-gpu-check/bench/braid-bench)
# Environment: VALUES (settings, default "0.001us 100us 1ms"), PASSES (default 2), NP (ranks, default "2 4")
set -uo pipefail
bench=${1:-build-gpu-check/bench/braid-bench}
values=${VALUES:-0.001us 100us 1ms}
passes=${PASSES:-2}
nps=${NP:-2 4}
configs=("broadcast -a tree" "broadcast -a ring" "reduce -a tree" "all_reduce -a tree" "all_reduce -a direct"
         "all_reduce -a ring" "all_reduce -a one_shot")
echo "# gpu-abort-poll: $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
echo "# columns: size count type redop root | out-of-place time(us) algbw busbw #wrong | in-place time algbw busbw #wrong"
for pass in $(seq "$passes"); do
  for np in $nps; do
    for cfg in "${configs[@]}"; do
      for v in $values; do
        # shellcheck disable=SC2086 # $cfg is several words
        line=$(BRAID_CUDA_ABORT_POLL=$v BRAID_TIMEOUT=30 timeout 60 "$bench" $cfg -d float -b 32M -e 32M -n 10 -w 2 -c 1 \
                 -np "$np" --backend cuda 2>&1 | grep -E '^ +[0-9]' | head -n1)
        printf 'pass %s  np %s  %-22s poll %-6s %s\n' "$pass" "$np" "$cfg" "$v" "${line:-FAILED}"
      done
    done
  done
done
# Small calls: the tuned all_reduce, where waits are short.
for v in $values; do
  echo "== poll $v: all_reduce float sum, tuned, 2 ranks, 8 B - 1 MiB"
  BRAID_CUDA_ABORT_POLL=$v BRAID_TIMEOUT=30 timeout 60 "$bench" all_reduce -d float -o sum -b 8 -e 1M -f 8 -n 50 -w 5 -c 1 \
    -np 2 --backend cuda 2>&1 | grep -E '^ +[0-9]'
done
