#!/usr/bin/env bash
# tests/examples/gpu_processes.sh BINARY — starts examples/gpu_processes the way torchrun and mpirun
# do (their environment variables; the processes are plain background children of this shell), on
# braid's emulated CUDA device, and checks every rank's exit status and which path it reports:
#   torchrun-style, 4 processes on 4 emulated GPUs: the device path;
#   mpirun-style (OpenMPI's variables), 3 processes on 4 emulated GPUs: the device path;
#   torchrun-style, 2 processes on 1 emulated GPU: the host path.
set -u
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

launch() { # style nprocs devices expected-path
  local style=$1 n=$2 devices=$3 want=$4 r pids=() status
  local tag="$style-$n-$devices-$$-$RANDOM"
  for ((r = 0; r < n; r++)); do
    local -a vars=(BRAID_TIMEOUT=60s BRAID_EMU_DEVICES="$devices" BRAID_EMU_MACHINE="example-$tag")
    if [[ $style == torchrun ]]; then
      vars+=(RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=29500
             TORCHELASTIC_RUN_ID="$tag")
    else
      vars+=(OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$n OMPI_COMM_WORLD_LOCAL_RANK=$r OMPI_COMM_WORLD_LOCAL_SIZE=$n
             OMPI_MCA_ess_base_jobid="$tag")
    fi
    env "${vars[@]}" timeout 300 "$bin" > "$work/$tag.$r" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < n; r++)); do
    wait "${pids[$r]}"
    status=$?
    sed "s/^/  [$style, $n processes, $devices GPUs] /" "$work/$tag.$r"
    if [[ $status -ne 0 ]]; then
      echo "FAIL: $style, rank $r exited with $status"
      fail=1
    elif ! grep -q "0 of 1048576 elements wrong" "$work/$tag.$r" || ! grep -q "$want" "$work/$tag.$r"; then
      echo "FAIL: $style, rank $r: expected '0 of 1048576 elements wrong' and '$want'"
      fail=1
    fi
  done
}

launch torchrun 4 4 "device path"
launch mpirun 3 4 "device path"
launch torchrun 2 1 "host path"
[[ $fail -eq 0 ]] && echo "gpu_processes: every rank correct, paths as expected"
exit $fail
