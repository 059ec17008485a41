// braid/nn/ops/common.hpp — what every op file shares: BRAID_HD (core/config.hpp), the unroll pragma
// for loops of a fixed trip count, and the host loop that runs an op over its elements.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../core/config.hpp"

#if !defined(BRAID_HD_UNROLL)
#if defined(__CUDA_ARCH__) // nvcc's device pass
#define BRAID_HD_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__) // nvcc's host pass: its host compiler may not know the pragma
#define BRAID_HD_UNROLL
#elif defined(__clang__)
#define BRAID_HD_UNROLL _Pragma("unroll")
#else
#define BRAID_HD_UNROLL _Pragma("GCC unroll 16")
#endif
#endif

namespace braid::nn::ops {

// Host: runs op(i) for i in [0, n).
template <class Op> inline void for_each_host(std::int64_t n, const Op& op) {
  for (std::int64_t i = 0; i < n; ++i) op(i);
}

} // namespace braid::nn::ops
