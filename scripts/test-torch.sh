#!/usr/bin/env bash
# The PyTorch backend's tests: sets up the pinned torch and builds braid_torch (scripts/torch-env.sh),
# then runs python/tests (the dtype x op sweep, the API, faults, DDP against gloo) and PyTorch's own
# distributed test suite with backend braid at world sizes 2 and 3 (python/tests/torch_suite.py), and
# the DDP example under torchrun (examples/torch_ddp, its quick check).
# Usage: scripts/test-torch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# Without a GPU the extension's CUDA sources are only compiled, never run: build them as PTX at -O0
# (python/setup.py, BRAID_TORCH_DEVICE_CODE=check), 442 -> 58 s for cuda_path.cu on the 2-vCPU VM.
if ! nvidia-smi -L >/dev/null 2>&1; then
  export BRAID_TORCH_DEVICE_CODE=${BRAID_TORCH_DEVICE_CODE-check}
fi
py=$(bash scripts/torch-env.sh | tail -1)
status=0
"$py" -m pytest -q python/tests || status=$?
"$(dirname "$py")/torchrun" --nproc-per-node 2 examples/torch_ddp/train.py --backend braid \
  --limit-train 512 --limit-test 256 --epochs 1 || status=$?
# Last, so that CI's closing line is the suite's "torch_suite: N passed, N failed, N skipped". Every
# selected test at world sizes 2 and 3; at 4 those that need exactly 4 ranks, at 8 the subgroup
# tests (torch skips them below 8 ranks). Ranks are forked from the driver (spawned, each imports torch
# again: 375 s against 22 s at world size 2 on the 2-core VM: bench/results/torch-suite-spawn-2026-12-02-epyc-cpu.txt, emu-ci-2026-12-02-run1-epyc-cpu.txt).
suite=("$py" python/tests/torch_suite.py --backend braid --module braid_torch --start-method fork)
"${suite[@]}" --world-size 2 || status=$?
"${suite[@]}" --world-size 3 || status=$?
"${suite[@]}" --world-size 4 -k '*object*' -k 'test_new_subgroups*' || status=$?
"${suite[@]}" --world-size 8 -k '*_group*' || status=$?
exit $status
