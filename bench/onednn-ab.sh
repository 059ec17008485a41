#!/usr/bin/env bash
# A/B of the resnet_fmnist trainer between two builds (issue 17: braid::nn's layers on oneDNN), run
# interleaved (A B A B ...) so that the other load of a shared machine falls on both alike.
# Usage: bench/onednn-ab.sh BEFORE_BINARY AFTER_BINARY [passes=5] [images=4096]
# Each run: one epoch on the first `images` training images, batch 128, SGD, fp32, crop+flip, the
# test pass on the first 1000 test images; --log-every is the whole epoch, so the one progress line's
# images/s is the epoch's training throughput (primitive creation included). Prints one line per
# run: config, binary, images/s, test accuracy, CPU seconds (user+sys), wall seconds, load average.
# Configurations: 1 rank with the trainer's default thread count (cores / ranks: 2 here), 1 rank with
# --blas-threads 1, 2 thread ranks (default: 1 thread each).
set -euo pipefail
before=${1:?usage: bench/onednn-ab.sh BEFORE AFTER [passes] [images]}
after=${2:?usage: bench/onednn-ab.sh BEFORE AFTER [passes] [images]}
passes=${3:-5}
images=${4:-4096}
steps=$((images / 128))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(date -u) $(uname -n) $(nproc) cores; before=$before after=$after passes=$passes images=$images"
for pass in $(seq 1 "$passes"); do
  for cfg in "1" "1 --blas-threads 1" "2"; do
    read -r -a extra <<< "$cfg"
    ranks=${extra[0]}
    for which in before after; do
      bin=$before
      [ "$which" = after ] && bin=$after
      load=$(cut -d' ' -f1 /proc/loadavg)
      /usr/bin/time -f "%U %S %e" -o "$tmp/time" "$bin" --ranks "${extra[@]}" --epochs 1 --batch 128 \
        --train-subset "$images" --test-subset 1000 --log-every "$steps" --csv "$tmp/c.csv" > "$tmp/out" 2>&1
      ips=$(grep -o 'images/s [0-9.]*' "$tmp/out" | tail -1 | cut -d' ' -f2)
      acc=$(grep -o 'test accuracy [0-9.]*%' "$tmp/out" | tail -1 | cut -d' ' -f3)
      read -r u s e < "$tmp/time"
      cpu=$(echo "$u + $s" | bc)
      echo "pass $pass ranks $ranks threads ${extra[2]:-default} $which images/s $ips test_acc $acc cpu_s $cpu wall_s $e load1 $load"
    done
  done
done
