#!/bin/sh
# tests/mpi/launch.sh — runs a program under mpirun with BRAID_HOST_ID set per rank, so that one
# machine plays several hosts.
#
#   launch.sh MPIEXEC NP HOSTMAP PROGRAM [ARGS...]
#
# HOSTMAP is a shell arithmetic expression of `rank` (the MPI rank) giving the rank's BRAID_HOST_ID,
# e.g. 'rank % 2' (two interleaved hosts) or 'rank / 2' (hosts of two consecutive ranks); a negative
# value leaves BRAID_HOST_ID unset on that rank; 'none' leaves it unset everywhere (real hosts).
# Where BRAID_EMU_MACHINE is set (braid's emulated CUDA device), each simulated host gets a machine
# of its own (BRAID_EMU_MACHINE-host<id>): its own emulated GPUs, as real hosts have.
# Works as root and not (--allow-run-as-root only as root) and on fewer cores than ranks
# (--oversubscribe).
set -eu
mpiexec=$1 np=$2 map=$3
shift 3
flags="--oversubscribe"
if [ "$(id -u)" -eq 0 ]; then
  flags="$flags --allow-run-as-root"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Ranks outnumber cores here: let idle MPI ranks yield the CPU instead of spinning.
export OMPI_MCA_mpi_yield_when_idle=1
export BRAID_TEST_HOSTMAP="$map"
# shellcheck disable=SC2016,SC2086
exec "$mpiexec" $flags -np "$np" sh -c '
  rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
  if [ "$BRAID_TEST_HOSTMAP" != none ]; then
    id=$(( $BRAID_TEST_HOSTMAP ))
    if [ "$id" -ge 0 ]; then export BRAID_HOST_ID=$id; else unset BRAID_HOST_ID; fi
    if [ -n "${BRAID_EMU_MACHINE:-}" ] && [ "$id" -ge 0 ]; then export BRAID_EMU_MACHINE="$BRAID_EMU_MACHINE-host$id"; fi
  fi
  exec "$@"' sh "$@"
