#!/usr/bin/env bash
# The PyTorch backend's tests: sets up the pinned torch and builds braid_torch (scripts/torch-env.sh),
# then runs python/tests (the dtype x op sweep, the API, faults, DDP against gloo) and PyTorch's own
# distributed test suite with backend braid at world sizes 2 and 3 (python/tests/torch_suite.py), and
# the DDP example under torchrun (examples/torch_ddp, its quick check).
# Usage: scripts/test-torch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/torch-env.sh | tail -1)
status=0
"$py" -m pytest -q python/tests || status=$?
for n in 2 3; do
  "$py" python/tests/torch_suite.py --backend braid --module braid_torch --world-size "$n" || status=$?
done
"$(dirname "$py")/torchrun" --nproc-per-node 2 examples/torch_ddp/train.py --backend braid \
  --limit-train 512 --limit-test 256 --epochs 1 || status=$?
exit $status
