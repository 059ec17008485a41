#!/usr/bin/env bash
# The main job: braid beside its peers, in one run. Installs what it needs, builds what it runs in its
# own build folder (build-bench by default, configured without the tests, so it never shares a CMake
# cache with scripts/test.sh's build/), then:
#   1. braid-bench over every collective and every algorithm, results checked (#wrong must be 0):
#      where a GPU is present, on CUDA (one process; and all_reduce with ranks as processes) and, where
#      the build found NCCL (NCCL_HOME, or the CUDA toolkit's), NCCL in the same harness (--backend
#      nccl); on the CPU (ranks as threads and as processes) always;
#   2. braid's processes backend beside OpenMPI's MPI_Allreduce (bench/vs-mpi.sh, setting quiet2:
#      2 processes, 3 passes, 4 B to 64 MiB): time per size, the ratio MPI/braid, and the picture
#      (bench/plot-vs-mpi.py), both in the build folder;
#   3. PyTorch's all_reduce and DDP over the backend braid beside gloo (bench/vs-gloo-torch.sh --quick),
#      only where the pinned torch environment .deps/torch-<TORCH_VERSION> exists (scripts/test.sh
#      makes it; this script does not download torch); otherwise it says it skipped them;
#   4. the trainer examples/resnet_fmnist (ResNet-20 on Fashion-MNIST, 2 thread ranks x 1 thread,
#      1 epoch on 4096 images, batch 128: bench/vs-pytorch.sh's settings), its images/s beside the
#      PyTorch figure of the same model and settings read from a bench/vs-pytorch.sh log ($PYTORCH_LOG).
#      The CUDA trainer (resnet_fmnist_cuda) beside PyTorch on GPUs is bench/gpu-train.sh.
# Wall time on a 2-vCPU VM (Xeon, 2026-12-02, no GPU): 86 and 114 s for two runs once built (the
# second installing matplotlib); the first build of build-bench about 3 min (3 of its 16 steps are
# nvcc compiles where a CUDA toolkit is present).
# Usage: scripts/bench.sh [build-dir]          (default: build-bench)
# Environment: PYTORCH_LOG (default bench/results/vs-pytorch-quiet-2026-11-26-cpu.txt), BENCH_JOBS
# (build jobs, default nproc), BRAID_TORCH=0 skips step 3.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
jobs=${BENCH_JOBS:-$(nproc)}
pytorch_log=${PYTORCH_LOG:-bench/results/vs-pytorch-quiet-2026-11-26-cpu.txt}
start=$(date +%s)
bash scripts/deps.sh python3-matplotlib # the plots
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBRAID_BUILD_TESTS=OFF >/dev/null
has_target() { grep -q "^build $1: phony" "$build/build.ninja"; }
targets=(braid-bench)
for t in braid-mpi-allreduce braid-micro resnet_fmnist; do
  if has_target "$t"; then targets+=("$t"); fi
done
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
bench="$build/bench/braid-bench"
status=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  # On CUDA: ranks are GPUs driven by one process (several ranks share a GPU where there are fewer).
  # The GPU tests and sanitizers are bench/gpu-check.sh.
  echo "# GPU present: $(nvidia-smi -L | head -1)"
  for np in 2 4 8; do
    "$bench" all -a all -d float -o sum -c 1 -b 8 -e 256M -f 8 -n 20 -w 5 -np "$np" --backend cuda || status=$?
  done
  # Ranks as processes over CUDA IPC (braid::cuda::process_communicator).
  for np in 2 4; do
    "$bench" all_reduce -d float -o sum -c 1 -b 8 -e 256M -f 8 -n 20 -w 5 --backend cuda --procs "$np" || status=$?
  done
  # NCCL in the same harness, same sizes, timed and checked the same way (ranks sharing a GPU need
  # NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1).
  if grep -q BRAID_BENCH_NCCL "$build/build.ninja"; then
    for np in 2 4 8; do
      NCCL_MULTI_RANK_GPU_ENABLE=1 "$bench" all -d float -o sum -c 1 -b 8 -e 256M -f 8 -n 20 -w 5 -np "$np" \
        --backend nccl || status=$?
    done
  else
    echo "# NCCL skipped: the build found no nccl.h and libnccl (set NCCL_HOME, e.g. bench/build-nccl.sh's)"
  fi
else
  echo "# no GPU (nvidia-smi lists none): the CUDA and NCCL runs are skipped"
fi
for backend in threads procs; do
  for np in 2 4 8; do
    "$bench" all -a all -d float -o sum -c 1 -b 8 -e 16M -f 8 -n 5 -w 1 -np "$np" --backend "$backend" || status=$?
  done
done

# braid beside OpenMPI's MPI_Allreduce.
echo
if [[ " ${targets[*]} " == *" braid-mpi-allreduce "* && " ${targets[*]} " == *" braid-micro "* ]] &&
  command -v mpirun >/dev/null; then
  SETTINGS=quiet2 bash bench/vs-mpi.sh "$build" | tee "$build/vs-mpi.txt" || status=1
  python3 bench/plot-vs-mpi.py "$build/vs-mpi.txt" "$build/vs-mpi.png" ||
    echo "# the vs-MPI picture was not drawn (matplotlib: apt-get install python3-matplotlib)"
else
  echo "# vs MPI skipped: it needs mpirun, braid-mpi-allreduce (MPI at configure time) and braid-micro (Google Benchmark)"
fi

# PyTorch's collectives over braid beside gloo.
echo
torch_version=$(sed -n 's/^TORCH_VERSION=//p' scripts/toolkits.env)
if [ "${BRAID_TORCH:-1}" = 0 ]; then
  echo "# vs gloo skipped: BRAID_TORCH=0"
elif [ -x ".deps/torch-$torch_version/bin/python" ] && [ -f ".deps/torch-$torch_version/.installed" ]; then
  bash bench/vs-gloo-torch.sh --quick || status=1
else
  echo "# vs gloo skipped: no .deps/torch-$torch_version (scripts/test.sh or scripts/torch-env.sh makes it: ~2.7 GB of wheels)"
fi

# The trainer beside PyTorch.
echo
if [[ " ${targets[*]} " == *" resnet_fmnist "* ]]; then
  echo "# resnet_fmnist: ResNet-20, 2 thread ranks x 1 BLAS thread, batch 128, 1 epoch on training images 0..4095, test images 0..999"
  "$build/examples/resnet_fmnist/resnet_fmnist" --ranks 2 --blas-threads 1 --epochs 1 --batch 128 \
    --train-subset 4096 --test-subset 1000 --log-every 8 --csv "$build/resnet_fmnist.csv" | tee "$build/resnet_fmnist.txt" ||
    status=$?
  braid_ips=$(grep -o 'images/s [0-9.]*' "$build/resnet_fmnist.txt" | tail -1 | cut -d' ' -f2)
  if [ -f "$pytorch_log" ]; then
    # The log's pass lines: "pass P ranks 2 threads/rank 1 {braid|pytorch} images/s X ...".
    python3 - "$pytorch_log" "${braid_ips:-0}" <<'PY' || status=1
import re, statistics as st, sys
log, here = sys.argv[1], float(sys.argv[2])
v = {"braid": [], "pytorch": []}
torch = "?"
for line in open(log):
    m = re.search(r"torch (\S+)", line) if line.startswith("#") else None
    if m: torch = m.group(1)
    m = re.match(r"pass \d+ ranks 2 threads/rank 1 (braid|pytorch) images/s ([0-9.]+)", line)
    if m: v[m.group(1)].append(float(m.group(2)))
if not v["pytorch"]:
    sys.exit(f"# {log} has no 'ranks 2' PyTorch pass lines")
p, b = v["pytorch"], v["braid"]
print("# trainer vs PyTorch, 2 ranks x 1 thread, same model and settings (images/s, higher is faster):")
rows = [("braid resnet_fmnist, this run", f"{here:.1f}", "")]
rows.append((f"PyTorch {torch} DDP over gloo, logged", f"{st.median(p):.1f}",
             f"median of {len(p)} passes, {min(p):.1f}-{max(p):.1f}; {log}"))
if b:
    rows.append(("braid in that log, same passes", f"{st.median(b):.1f}",
                 f"median, {min(b):.1f}-{max(b):.1f}; ratio of the log's medians braid/PyTorch {st.median(b) / st.median(p):.2f}"))
for name, val, note in rows:
    print(f"#   {name:<44} {val:>7}" + (f"  ({note})" if note else ""))
print("#   (the log is from another day and machine; bench/vs-pytorch.sh runs both side by side on this one)")
PY
  else
    echo "# $pytorch_log not found: no PyTorch figure to set beside the trainer's (bench/vs-pytorch.sh measures one)"
  fi
else
  echo "# resnet_fmnist not built: it needs libopenblas-dev and zlib1g-dev (and dataset-fashion-mnist to run)"
fi
echo "# scripts/bench.sh: $(( $(date +%s) - start )) s, status $status"
exit $status
