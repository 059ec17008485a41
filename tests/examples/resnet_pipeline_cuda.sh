#!/usr/bin/env bash
# resnet_pipeline --backend cuda on braid's emulated CUDA device (CTest: example_resnet_pipeline_cuda_emu).
# ResNet-8 at width 4, the first 256 training and 200 test images, batch 32 in 4 micro-batches,
# 2 epochs, the loss of every step printed. Checks:
#   1. the CUDA run prints what the host run prints (the same lines, numbers aside);
#   2. 2 stages on 2 emulated GPUs (fused::pipeline over braid::cuda send/recv) and the unsplit network
#      on one GPU with its micro-batches in the pipeline's order (--reverse-micro) print the same loss
#      at every step, to 9 digits (their weights are the same bits: tests/nn/device/test_pipeline_device.cpp);
#   3. against the unsplit network in the usual order: the first 3 steps' losses within 1e-6, every
#      step's within 5e-3, and the final test accuracy within 1.5 points (the same number of epochs
#      on the same subset). The two sum the micro-batches' gradients in another order: they part at
#      the rounding level, then drift as any two such runs do, how fast depending on the CPU's BLAS.
#      Measured: 2.6e-8 over all 16 steps on an AMD EPYC VM (2026-11-27); on a Xeon VM whose CPU
#      OpenBLAS 0.3.21 does not know (it falls back to its generic Prescott kernels) 9e-8 over 3
#      steps and 4.1e-4 over 16, and 2.5e-8 over 16 there with OPENBLAS_CORETYPE=Haswell (2026-11-27);
#      (the bound was 1e-4 over every step until then);
#   4. against the host pipeline: the first 3 steps' losses within 1e-6, every step's within 5e-3 (the
#      GEMMs sum in another order, and the host layers run oneDNN: the runs part at the rounding level,
#      then drift as two such runs do);
#   5. the loss falls;
#   6. both stages on one GPU (--gpus 1: send/recv between two ranks sharing a device) print the same
#      loss at every step as the stages on two GPUs.
# Usage: resnet_pipeline_cuda.sh <resnet_pipeline_emu> <resnet_pipeline>   (BRAID_EMU_DEVICES=2)
set -euo pipefail
emu=$1
host=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--train-subset 256 --test-subset 200 --batch 32 --micro 4 --blocks 1 --width 4 --epochs 2 --log-every 1 --seed 5)
fail() { echo "FAIL: $*" >&2; exit 1; }
shape() { sed -E 's/[0-9]+(\.[0-9]+)?/N/g' "$1" | grep -v -E '^(data:|emulated device:)'; }
losses() { grep '^step ' "$1" | awk '{ print $4 }'; }

"$host" --stages 2 "${common[@]}" >"$dir/host.out"
"$emu" --backend cuda --stages 2 "${common[@]}" >"$dir/two.out"
"$emu" --backend cuda --stages 1 --reverse-micro "${common[@]}" >"$dir/rev.out"
"$emu" --backend cuda --stages 1 "${common[@]}" >"$dir/one.out"
"$emu" --backend cuda --stages 2 --gpus 1 "${common[@]}" >"$dir/shared.out"
grep -v '^step ' "$dir/two.out"

# 1.
diff <(shape "$dir/host.out" | sed 's/(threads)/(X)/') <(shape "$dir/two.out" | sed 's/(GPUs of this process)/(X)/') ||
  fail "the CUDA run's output differs in shape from the host run's"
[ "$(losses "$dir/two.out" | wc -l)" -eq 16 ] || fail "expected 16 step losses"
# 2.
diff <(losses "$dir/two.out") <(losses "$dir/rev.out") >/dev/null ||
  fail "2 stages and the unsplit network in the pipeline's order printed other losses"
diff <(losses "$dir/two.out") <(losses "$dir/shared.out") >/dev/null ||
  fail "2 stages sharing one GPU (--gpus 1) printed other losses than 2 stages on 2 GPUs"
# 3, 4.
maxdiff() { # a b [steps]
  paste <(losses "$1" | head -n "${3:-1000}") <(losses "$2" | head -n "${3:-1000}") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.3g", m }'
}
d_one=$(maxdiff "$dir/two.out" "$dir/one.out")
d_one3=$(maxdiff "$dir/two.out" "$dir/one.out" 3)
d_host=$(maxdiff "$dir/two.out" "$dir/host.out")
d_host3=$(maxdiff "$dir/two.out" "$dir/host.out" 3)
awk -v d="$d_host3" 'BEGIN { exit !(d <= 1e-6) }' || fail "CUDA vs host pipeline: the first 3 steps' losses differ by $d_host3"
awk -v d="$d_one3" 'BEGIN { exit !(d <= 1e-6) }' || fail "2 stages vs unsplit in the usual order: the first 3 steps' losses differ by $d_one3"
awk -v d="$d_one" 'BEGIN { exit !(d <= 5e-3) }' || fail "2 stages vs unsplit in the usual order: a step's loss differs by $d_one"
awk -v d="$d_host" 'BEGIN { exit !(d <= 5e-3) }' || fail "CUDA vs host pipeline: a step's loss differs by $d_host"
acc() { grep '^epoch 2/2' "$1" | sed -E 's/.*test accuracy ([0-9.]+)%.*/\1/'; }
awk -v a="$(acc "$dir/two.out")" -v b="$(acc "$dir/one.out")" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1.5) }' ||
  fail "test accuracy: 2 stages $(acc "$dir/two.out")%, unsplit $(acc "$dir/one.out")%"
# 5.
first=$(losses "$dir/two.out" | head -1)
last=$(losses "$dir/two.out" | tail -4 | awk '{ s += $1 } END { print s / NR }')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.05) }' || fail "the loss did not fall: first $first, last 4 steps $last"
echo "2 stages = unsplit in the pipeline's order = 2 stages on one GPU at all 16 steps (9 digits); vs the usual order: max step-loss difference $d_one3 over 3 steps, $d_one over 16;" \
     "vs the host pipeline: $d_host3 over 3 steps, $d_host over 16; test accuracy after 2 epochs: 2 stages $(acc "$dir/two.out")%, unsplit $(acc "$dir/one.out")%," \
     "host $(acc "$dir/host.out")%; loss $first -> $last (mean of the last 4 steps)"
echo "PASS"
