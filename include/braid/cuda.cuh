// braid/cuda.cuh — the CUDA backend (compile with nvcc): braid::cuda::create_group,
// braid::cuda::communicator (one process) and braid::cuda::process_communicator (across processes).
// Includes everything braid.hpp does.
#pragma once

#include "braid.hpp"
#include "cuda/group/communicator.cuh"
#include "cuda/process/communicator.cuh"
