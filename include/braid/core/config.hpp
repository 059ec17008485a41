// braid/core/config.hpp — compiler and host/device configuration.
// Compiles with any C++20 host compiler; under nvcc the BRAID_HD functions become __host__ __device__.
#pragma once

// Below C++20 one sentence, then stop: without the missing include the compiler would go on and bury
// the sentence under every C++20 construct that follows. Every braid header includes this file before
// any code of its own.
#if !defined(__cplusplus) || __cplusplus < 202002L
#error "braid needs C++20: compile with -std=c++20 or later"
#include "braid needs C++20, compilation stops here"
#endif

#define BRAID_VERSION_MAJOR 0
#define BRAID_VERSION_MINOR 1
#define BRAID_VERSION_PATCH 0

#if defined(__CUDACC__) || defined(__HIPCC__)
#define BRAID_HD __host__ __device__ inline
#define BRAID_DEVICE __device__ inline
#define BRAID_HAS_DEVICE_COMPILER 1
#else
#define BRAID_HD inline
#define BRAID_DEVICE inline
#define BRAID_HAS_DEVICE_COMPILER 0
#endif

// Before a BRAID_HD template that calls the callables it is handed: nvcc checks a __host__ __device__
// function's calls per instantiation, and an instantiation with host-only lambdas (the host executor's)
// is never called on the device; the pragma lets nvcc accept it.
#if defined(__NVCC__)
#define BRAID_HD_CALLS_ANY _Pragma("nv_exec_check_disable")
#else
#define BRAID_HD_CALLS_ANY
#endif

#if defined(__CUDA_ARCH__)
#define BRAID_DEVICE_PASS 1
#else
#define BRAID_DEVICE_PASS 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define BRAID_RESTRICT __restrict__
#define BRAID_LIKELY(x) __builtin_expect(!!(x), 1)
#define BRAID_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define BRAID_RESTRICT
#define BRAID_LIKELY(x) (x)
#define BRAID_UNLIKELY(x) (x)
#endif

namespace braid {
// Bytes between independently written control words: two cache lines, so that adjacent-line
// prefetch on x86 does not make two ranks' flags share traffic.
inline constexpr unsigned control_stride = 128;

namespace detail {
// Bytes in each of a rank's two staging halves for `staging_bytes` of staging (options::staging_bytes:
// both halves together): half of it, at least `min_half`, in whole 4 KiB pages. The one rule of every
// backend's layout (host::segment_layout, cuda::device::rank_segment).
constexpr unsigned long long staging_half_bytes(unsigned long long staging_bytes, unsigned long long min_half = 0) {
  const unsigned long long half = staging_bytes / 2 > min_half ? staging_bytes / 2 : min_half;
  return (half + 4095) / 4096 * 4096;
}
} // namespace detail
} // namespace braid
