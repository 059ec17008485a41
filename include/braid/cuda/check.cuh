// braid/cuda/check.cuh — CUDA runtime errors as braid::cuda_error (needs nvcc or the CUDA runtime headers).
#pragma once

#include "runtime.cuh"

#include <string>

#include "../core/error.hpp"

namespace braid::cuda::detail {

[[noreturn]] inline void raise_cuda(cudaError_t e, const char* call, const char* file, int line,
                                    const error_context& ctx = {}) {
  (void)cudaGetLastError(); // clear a non-sticky error so it cannot leak into an unrelated call
  raise(errc::cuda, std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e), ctx, call, file, line,
        static_cast<int>(e));
}

// A CUDA driver function by name (no libcuda link: the runtime hands it out), or nullptr when the
// driver does not provide it. The ABI version asked for is 12.0's.
inline void* driver_symbol(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(name, &f, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return q == cudaDriverEntryPointSuccess ? f : nullptr;
}

// Makes `dev` the current device for a scope, and restores the previous one.
struct device_guard {
  int saved = 0;
  bool changed = false; // the current device was not `dev`: restored at the end
  explicit device_guard(int dev) {
    const cudaError_t e = cudaGetDevice(&saved);
    if (e != cudaSuccess) raise_cuda(e, "cudaGetDevice", __FILE__, __LINE__);
    if (dev != saved) {
      if (const cudaError_t f = cudaSetDevice(dev); f != cudaSuccess) raise_cuda(f, "cudaSetDevice", __FILE__, __LINE__);
      changed = true;
    }
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (changed) cudaSetDevice(saved);
  }
};

} // namespace braid::cuda::detail

#define BRAID_CUDA_CHECK(expr)                                                                       \
  do {                                                                                              \
    const cudaError_t braid_e_ = (expr);                                                            \
    if (braid_e_ != cudaSuccess) ::braid::cuda::detail::raise_cuda(braid_e_, #expr, __FILE__, __LINE__); \
  } while (0)
