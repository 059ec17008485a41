#!/usr/bin/env bash
# bench/vs-gloo-torch.sh — PyTorch's torch.distributed over the backend braid (package braid_torch)
# beside gloo, on the CPU, in one run:
#   1. bench/torch_allreduce.py: all_reduce for world sizes 2 and 4, float32 and bfloat16, 4 B to
#      64 MiB (factor 4), 3 interleaved passes (braid gloo braid gloo ...), medians, ratio gloo/braid,
#      busbw; log bench/results/torch-allreduce-braid-vs-gloo-<date>-<cpu>-cpu.txt;
#   2. bench/plot-torch-allreduce.py: that log drawn to docs/img/torch-allreduce-vs-gloo.png;
#   3. bench/torch_ddp_resnet.py: DDP training of bench/vs_pytorch_resnet.py's ResNet-20, 2 processes,
#      5 warmup + 20 timed steps, runs braid gloo braid gloo braid gloo, median images/s;
#      log bench/results/torch-ddp-resnet-braid-vs-gloo-<date>-<cpu>-cpu.txt.
# About 6-10 minutes on a 2-vCPU VM. Not run in CI.
#
#   bench/vs-gloo-torch.sh [--backends braid,gloo] [--skip-allreduce] [--skip-plot] [--skip-resnet] [--quick]
#
# --backends gloo: without braid_torch (e.g. to try the scripts before it is installed; the logs are then
#   named torch-*-gloo-<date>-... and the picture goes beside the log, not to docs/img/).
# --quick: a smoke run (1 pass, world 2, up to 1 MiB; 1 ResNet run of 5 steps per backend), logs and
#   picture in a temporary directory that is printed, not under bench/results/ or docs/img/.
# Environment: PYTHON (default: the pinned torch's environment, set up and braid_torch built by
#   scripts/torch-env.sh), AR_ARGS (more arguments for
#   torch_allreduce.py, e.g. "--passes 5 --factor 2"), RESNET_ARGS (more for torch_ddp_resnet.py),
#   PLOT_PYTHON (the interpreter for the plot; default $PYTHON, which re-runs it under /usr/bin/python3
#   where matplotlib is missing, as bench/plotlib.py does).
set -euo pipefail
cd "$(dirname "$0")/.."

backends=braid,gloo
do_ar=1 do_plot=1 do_resnet=1 quick=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --backends) backends=$2; shift 2 ;;
    --backends=*) backends=${1#*=}; shift ;;
    --skip-allreduce) do_ar=0; shift ;;
    --skip-plot) do_plot=0; shift ;;
    --skip-resnet) do_resnet=0; shift ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "vs-gloo-torch.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=$(bash scripts/torch-env.sh | tail -1)
fi
PLOT_PYTHON=${PLOT_PYTHON:-$PYTHON}
if ! "$PYTHON" -c "import torch, numpy" 2>/dev/null; then
  echo "vs-gloo-torch.sh: $PYTHON lacks torch or numpy (set PYTHON)" >&2
  exit 2
fi
if [[ ",$backends," == *,braid,* ]] && ! "$PYTHON" -c "import braid_torch" 2>/dev/null; then
  echo "vs-gloo-torch.sh: braid_torch is not importable by $PYTHON (pip install --no-build-isolation ./python; or --backends gloo)" >&2
  exit 2
fi
if [[ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz && -z "${FASHION_MNIST_DIR:-}" && $do_resnet -eq 1 ]]; then
  echo "vs-gloo-torch.sh: Fashion-MNIST not found (apt-get install dataset-fashion-mnist, or FASHION_MNIST_DIR)" >&2
  exit 2
fi

tmp=$(mktemp -d)
if [[ $quick -eq 1 ]]; then
  echo "# --quick: logs under $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
start=$(date +%s)
status=0

if [[ $do_ar -eq 1 ]]; then
  ar_args=(--backends "$backends")
  [[ $quick -eq 1 ]] && ar_args+=(--passes 1 --world-sizes 2 --max 1M --log "$tmp/torch-allreduce.txt")
  # shellcheck disable=SC2206
  [[ -n "${AR_ARGS:-}" ]] && ar_args+=(${AR_ARGS})
  "$PYTHON" bench/torch_allreduce.py "${ar_args[@]}" | tee "$tmp/ar.out" || status=1
  log=$(sed -n 's/^# log: //p' "$tmp/ar.out" | tail -1)
  if [[ $do_plot -eq 1 && -n "$log" ]]; then
    if [[ $quick -eq 0 && ",$backends," == *,braid,* && ",$backends," == *,gloo,* ]]; then
      png=docs/img/torch-allreduce-vs-gloo.png
    else
      png=${log%.txt}.png
    fi
    "$PLOT_PYTHON" bench/plot-torch-allreduce.py "$log" "$png" || echo "vs-gloo-torch.sh: the plot failed (matplotlib?)" >&2
  fi
fi

if [[ $do_resnet -eq 1 ]]; then
  rn_args=(--backends "$backends")
  [[ $quick -eq 1 ]] && rn_args+=(--runs 1 --warmup 2 --steps 5 --log "$tmp/torch-ddp-resnet.txt")
  # shellcheck disable=SC2206
  [[ -n "${RESNET_ARGS:-}" ]] && rn_args+=(${RESNET_ARGS})
  echo
  "$PYTHON" bench/torch_ddp_resnet.py "${rn_args[@]}" || status=1
fi

echo "# vs-gloo-torch.sh: $(( $(date +%s) - start )) s, status $status"
exit $status
