// braid/cuda/runtime.cuh — the CUDA runtime braid's host code calls: NVIDIA's (<cuda_runtime.h>) when
// compiled by nvcc or when BRAID_CUDA_EMULATOR is not defined, braid's emulated device
// (<braid/emu/runtime.hpp>: the same names and error codes, executed on CPU threads) when a host
// compiler builds with BRAID_CUDA_EMULATOR (CMake: link braid::emu). Nothing else in braid includes
// either directly.
#pragma once

#if defined(BRAID_CUDA_EMULATOR) && !defined(__CUDACC__)
#include "../emu/runtime.hpp"
#else
#include <cuda_runtime.h>
#endif
