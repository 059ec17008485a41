// braid/cuda.cuh — the CUDA backend (compile with nvcc): braid::cuda::create_group and
// braid::cuda::communicator. Includes everything braid.hpp does.
#pragma once

#include "braid.hpp"
#include "cuda/communicator.cuh"
