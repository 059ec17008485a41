#!/usr/bin/env bash
# resnet_fmnist --backend cuda end to end on braid's emulated CUDA device (CTest:
# example_resnet_fmnist_cuda_emu). A tiny run: ResNet-8 at width 4 on the first 512 training images,
# 200 test images, batch 32, 2 epochs. Checks:
#   1. the CUDA run prints what the host run prints (the same kinds of lines, in the same order);
#   2. the loss falls (the last progress line's running loss is below the first's);
#   3. resume is bit-identical: 1 epoch, stop, --resume for the second gives the same checkpoint bytes
#      after epoch 2 and the same loss and accuracy columns in the CSV as 2 epochs in one go;
#   4. --ranks 2 (two emulated GPUs: bucket averages on a communication stream beside backward) trains
#      and its loss falls too.
# Usage: resnet_fmnist_cuda.sh <resnet_fmnist_emu> <resnet_fmnist>   (BRAID_EMU_DEVICES=2 for check 4)
set -euo pipefail
emu=$1
host=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--train-subset 512 --test-subset 200 --batch 32 --blocks 1 --width 4 --log-every 4 --seed 3)
fail() { echo "FAIL: $*" >&2; exit 1; }

# The shape of a run's output: each line with its numbers replaced by N.
shape() { sed -E 's/[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?/N/g; s#/[^ ]*#P#g' "$1" | grep -v -E '^(device )?pool:|^data:'; }

"$host" --backend host --ranks 1 --epochs 2 "${common[@]}" --csv "$dir/host.csv" --checkpoint "$dir/host.ck" >"$dir/host.out"
"$emu" --backend cuda --ranks 1 --epochs 2 "${common[@]}" --csv "$dir/full.csv" --checkpoint "$dir/full.ck" >"$dir/full.out"
cat "$dir/full.out"
# 1. The same lines, apart from the numbers and the "as threads"/"as GPUs" wording.
diff <(shape "$dir/host.out" | sed 's/as threads/as X/') <(shape "$dir/full.out" | sed 's/as GPUs of this process/as X/') ||
  fail "the CUDA run's output differs in shape from the host run's"

# 2. The loss falls.
first=$(grep -m1 ' step ' "$dir/full.out" | sed -E 's/.* loss ([0-9.]+) .*/\1/')
last=$(grep ' step ' "$dir/full.out" | tail -1 | sed -E 's/.* loss ([0-9.]+) .*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.05) }' || fail "the loss did not fall: first $first, last $last"
echo "loss: first progress line $first, last $last"

# 3. Resume: epoch 1, stop; epoch 2 from the checkpoint.
"$emu" --backend cuda --ranks 1 --epochs 2 --stop-after 1 "${common[@]}" --csv "$dir/a.csv" --checkpoint "$dir/a.ck" >"$dir/a.out"
"$emu" --backend cuda --ranks 1 --epochs 2 --resume "$dir/a.ck" "${common[@]}" --csv "$dir/b.csv" --checkpoint "$dir/b.ck" >"$dir/b.out"
grep -q 'resumed from' "$dir/b.out" || fail "the second half did not resume"
cmp "$dir/full.ck" "$dir/b.ck" || fail "the resumed run's checkpoint after epoch 2 differs from the straight run's"
cols() { awk -F, '$1 != "kind" && $2 == 2 { print $1, $2, $3, $4, $5 }' "$1"; }
diff <(cols "$dir/full.csv") <(cols "$dir/b.csv") || fail "epoch 2's losses differ between the straight and the resumed run"
[ -n "$(cols "$dir/b.csv")" ] || fail "no epoch-2 rows to compare"
echo "resume: checkpoint after epoch 2 identical ($(stat -c %s "$dir/b.ck") bytes), epoch-2 CSV rows identical"

# 4. Two GPUs.
"$emu" --backend cuda --ranks 2 --epochs 2 "${common[@]}" --csv "$dir/two.csv" >"$dir/two.out"
cat "$dir/two.out"
first=$(grep -m1 ' step ' "$dir/two.out" | sed -E 's/.* loss ([0-9.]+) .*/\1/')
last=$(grep ' step ' "$dir/two.out" | tail -1 | sed -E 's/.* loss ([0-9.]+) .*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.05) }' || fail "2 GPUs: the loss did not fall: first $first, last $last"
grep -q 'test accuracy' "$dir/two.out" || fail "2 GPUs: no test line"
echo "2 GPUs: loss first $first, last $last"
echo "PASS"
