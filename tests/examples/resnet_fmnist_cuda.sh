#!/usr/bin/env bash
# resnet_fmnist --backend cuda end to end on braid's emulated CUDA device (CTest:
# example_resnet_fmnist_cuda_emu). A tiny run: ResNet-8 at width 4 on the first 256 training images,
# 100 test images, batch 32, 2 epochs (512 and 200 until 2026-11-28: the test took 61 s alone on the
# 2-core VM, 34 s now; the first loss still falls by 0.12, the bar is 0.05). Checks:
#   1. the CUDA run prints what the host run prints (the same kinds of lines, in the same order);
#   2. the loss falls (the last progress line's running loss is below the first's);
#   3. resume is bit-identical: 1 epoch, stop, --resume for the second gives the same checkpoint bytes
#      after epoch 2 and the same loss and accuracy columns in the CSV as 2 epochs in one go;
#   4. --ranks 2 (two emulated GPUs: bucket averages on a communication stream beside backward) trains
#      and its loss falls too;
#   5. the first progress line's loss agrees with the host run's (within 0.01: the GEMMs sum in
#      another order, so not to the bit);
#   6. mixed precision: --precision bf16 prints what the host bf16 run prints (with the loss scale),
#      its loss falls and its first loss agrees with the host's; --precision fp16 resumes bit-identically
#      (fp32 masters and the device loss scaler go through the checkpoint);
#   7. --launch env, one process per GPU (process_communicator, started as torchrun would: RANK,
#      WORLD_SIZE, BRAID_UNIQUE_ID): 2 processes write the same checkpoint bytes and CSV losses as the
#      2 GPUs of one process in check 4; the host backend's 2 processes likewise match its 2 threads;
#   8. a rank killed mid-run: the other process exits with an error naming the dead peer, within 20 s
#      (braid's dead-peer detection; the collective timeout here is 60 s).
# Usage: resnet_fmnist_cuda.sh <resnet_fmnist_emu> <resnet_fmnist>   (BRAID_EMU_DEVICES=2 for check 4)
set -euo pipefail
emu=$1
host=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
net=(--batch 32 --blocks 1 --width 4 --log-every 4 --seed 3)
common=(--train-subset 256 --test-subset 100 "${net[@]}")
# The killed run (check 8) keeps 512 images over 4 epochs, so that rank 0 is still training when rank 1 dies.
long=(--train-subset 512 --test-subset 200 "${net[@]}")
fail() { echo "FAIL: $*" >&2; exit 1; }

# The shape of a run's output: each line with its numbers replaced by N.
shape() { sed -E 's/[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?/N/g; s#/[^ ]*#P#g' "$1" | grep -v -E '^(device )?pool:|^data:|^emulated device:'; }

"$host" --backend host --ranks 1 --epochs 2 "${common[@]}" --csv "$dir/host.csv" --checkpoint "$dir/host.ck" >"$dir/host.out"
"$emu" --backend cuda --ranks 1 --epochs 2 "${common[@]}" --csv "$dir/full.csv" --checkpoint "$dir/full.ck" >"$dir/full.out"
cat "$dir/full.out"
grep -q "^emulated device: .*not a GPU's" "$dir/full.out" || fail "the emulated run does not say that its images/s are the emulator's"
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
"$emu" --backend cuda --ranks 2 --epochs 2 "${common[@]}" --csv "$dir/two.csv" --checkpoint "$dir/two.ck" >"$dir/two.out"
cat "$dir/two.out"
first=$(grep -m1 ' step ' "$dir/two.out" | sed -E 's/.* loss ([0-9.]+) .*/\1/')
last=$(grep ' step ' "$dir/two.out" | tail -1 | sed -E 's/.* loss ([0-9.]+) .*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.05) }' || fail "2 GPUs: the loss did not fall: first $first, last $last"
grep -q 'test accuracy' "$dir/two.out" || fail "2 GPUs: no test line"
echo "2 GPUs: loss first $first, last $last"

# 5. The first loss against the host's.
first_loss() { grep -m1 ' step ' "$1" | sed -E 's/.* loss ([0-9.]+) .*/\1/'; }
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; }
near "$(first_loss "$dir/host.out")" "$(first_loss "$dir/full.out")" 0.01 ||
  fail "fp32: first loss $(first_loss "$dir/full.out") on the device, $(first_loss "$dir/host.out") on the host"
echo "fp32 first loss: host $(first_loss "$dir/host.out"), device $(first_loss "$dir/full.out")"

# 6. Mixed precision.
"$host" --backend host --ranks 1 --epochs 2 --precision bf16 "${common[@]}" --csv "$dir/hb.csv" >"$dir/hb.out"
"$emu" --backend cuda --ranks 1 --epochs 2 --precision bf16 "${common[@]}" --csv "$dir/db.csv" >"$dir/db.out"
cat "$dir/db.out"
grep -q ' scale 65536 skipped 0' "$dir/db.out" || fail "bf16: no loss scale on the progress line"
diff <(shape "$dir/hb.out" | sed 's/as threads/as X/') <(shape "$dir/db.out" | sed 's/as GPUs of this process/as X/') ||
  fail "the CUDA bf16 run's output differs in shape from the host bf16 run's"
last=$(grep ' step ' "$dir/db.out" | tail -1 | sed -E 's/.* loss ([0-9.]+) .*/\1/')
awk -v a="$(first_loss "$dir/db.out")" -v b="$last" 'BEGIN { exit !(b < a - 0.05) }' || fail "bf16: the loss did not fall"
near "$(first_loss "$dir/hb.out")" "$(first_loss "$dir/db.out")" 0.02 ||
  fail "bf16: first loss $(first_loss "$dir/db.out") on the device, $(first_loss "$dir/hb.out") on the host"
echo "bf16: first loss host $(first_loss "$dir/hb.out"), device $(first_loss "$dir/db.out"); last $last"
"$emu" --backend cuda --ranks 1 --epochs 2 --precision fp16 "${common[@]}" --csv "$dir/f.csv" --checkpoint "$dir/f.ck" >"$dir/f.out"
"$emu" --backend cuda --ranks 1 --epochs 2 --precision fp16 --stop-after 1 "${common[@]}" --csv "$dir/fa.csv" --checkpoint "$dir/fa.ck" >/dev/null
"$emu" --backend cuda --ranks 1 --epochs 2 --precision fp16 --resume "$dir/fa.ck" "${common[@]}" --csv "$dir/fb.csv" --checkpoint "$dir/fb.ck" >/dev/null
cmp "$dir/f.ck" "$dir/fb.ck" || fail "fp16: the resumed run's checkpoint after epoch 2 differs from the straight run's"
diff <(cols "$dir/f.csv") <(cols "$dir/fb.csv") || fail "fp16: epoch 2's losses differ between the straight and the resumed run"
if "$emu" --backend cuda --ranks 1 --epochs 2 --precision bf16 --resume "$dir/fa.ck" "${common[@]}" --csv "$dir/x.csv" >"$dir/x.out" 2>&1; then
  fail "a fp16 checkpoint resumed a bf16 run"
fi
grep -q 'was written by a run with --backend cuda --ranks 1 --precision fp16' "$dir/x.out" || { cat "$dir/x.out"; fail "no clear refusal of another run's checkpoint"; }
echo "fp16: $(grep ' step ' "$dir/f.out" | tail -1); resume identical"

# 7. One process per rank.
procs() { # binary out-prefix extra-args...: 2 processes, torchrun's variables
  local bin=$1 out=$2 id r pids=()
  shift 2
  id=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  for r in 0 1; do
    BRAID_TIMEOUT=60s BRAID_UNIQUE_ID=$id RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 timeout 300 "$bin" --launch env "$@" >"$out.$r" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || { cat "$out.$r"; fail "--launch env: rank $r of $bin failed"; }; done
}
procs "$emu" "$dir/p" --backend cuda --epochs 2 "${common[@]}" --csv "$dir/p.csv" --checkpoint "$dir/p.ck"
cat "$dir/p.0"
grep -q 'as processes (one GPU each)' "$dir/p.0" || fail "--launch env: the header does not say processes"
grep -q 'process path: device path' "$dir/p.0" || fail "--launch env: not on the device path"
[ ! -s "$dir/p.1" ] || { cat "$dir/p.1"; fail "--launch env: rank 1 printed"; }
cmp "$dir/two.ck" "$dir/p.ck" || fail "2 processes wrote another checkpoint than 2 GPUs of one process"
diff <(cols "$dir/two.csv") <(cols "$dir/p.csv") || fail "2 processes: other losses than 2 GPUs of one process"
"$host" --backend host --ranks 2 --epochs 2 "${common[@]}" --csv "$dir/ht.csv" --checkpoint "$dir/ht.ck" >/dev/null
procs "$host" "$dir/hp" --backend host --epochs 2 "${common[@]}" --csv "$dir/hp.csv" --checkpoint "$dir/hp.ck"
cmp "$dir/ht.ck" "$dir/hp.ck" || fail "host: 2 processes wrote another checkpoint than 2 threads"
echo "--launch env: 2 processes = 2 GPUs of one process (checkpoint $(stat -c %s "$dir/p.ck") bytes identical); host: 2 processes = 2 threads"

# 8. A rank dies.
id=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
BRAID_TIMEOUT=60s BRAID_UNIQUE_ID=$id RANK=0 WORLD_SIZE=2 timeout 300 "$emu" --launch env --backend cuda --epochs 4 "${long[@]}" \
  --csv "$dir/k.csv" >"$dir/k.0" 2>&1 &
p0=$!
BRAID_TIMEOUT=60s BRAID_UNIQUE_ID=$id RANK=1 WORLD_SIZE=2 "$emu" --launch env --backend cuda --epochs 4 "${long[@]}" \
  --csv "$dir/k.csv" >"$dir/k.1" 2>&1 &
p1=$! # the trainer itself (no `timeout` in between), so that kill reaches it
for _ in $(seq 100); do grep -q ' step ' "$dir/k.0" && break; sleep 0.2; done
kill -9 $p1
t0=$(date +%s)
if wait $p0; then fail "rank 0 ended well after rank 1 was killed"; fi
took=$(($(date +%s) - t0))
wait $p1 2>/dev/null || true
grep -q 'peer 1' "$dir/k.0" || { cat "$dir/k.0"; fail "rank 0's error does not name the dead peer"; }
[ "$took" -le 20 ] || fail "rank 0 took $took s to notice the dead peer"
echo "killed rank 1: rank 0 stopped within $took s: $(grep 'peer 1' "$dir/k.0")"
echo "PASS"
