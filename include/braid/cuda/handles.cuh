// braid/cuda/handles.cuh — move-only owners of CUDA handles and of grow-only scratch memory, shared
// by the CUDA communicators (cuda/process/communicator.cuh, mpi/cuda.cuh). Destruction releases the handle without
// waiting: CUDA lets a destroyed stream's or event's enqueued work finish; memory that GPU work may
// still read must be awaited by its owner before it is released.
#pragma once

#include "runtime.cuh"

#include <cstddef>
#include <utility>

#include "check.cuh"

namespace braid::cuda::detail {

inline void release(cudaStream_t s) noexcept { (void)cudaStreamDestroy(s); }
inline void release(cudaEvent_t e) noexcept { (void)cudaEventDestroy(e); }

// A stream or an event: `h` is the handle (nullptr: none), created by the owner with CUDA's call.
template <class H> struct owned {
  H h = nullptr;
  owned() = default;
  owned(owned&& o) noexcept : h(std::exchange(o.h, nullptr)) {}
  owned& operator=(owned&& o) noexcept {
    if (this != &o) {
      if (h) release(h);
      h = std::exchange(o.h, nullptr);
    }
    return *this;
  }
  ~owned() {
    if (h) release(h);
  }
};
using owned_stream = owned<cudaStream_t>;
using owned_event = owned<cudaEvent_t>;

// Memory that only grows: pinned host memory (cudaMallocHost) or device memory (cudaMalloc), in
// powers of two from 4 KiB. Growing first waits for `in_use` (an event after the last work that
// reads the old block), since freeing does not wait for GPU work.
enum class memory_kind { pinned, device };
template <memory_kind K> struct grow_only {
  void* p = nullptr;
  std::size_t bytes = 0;
  template <class T> T* get(std::size_t count, cudaEvent_t in_use) {
    const std::size_t want = count * sizeof(T);
    if (want > bytes || !p) {
      if (p) BRAID_CUDA_CHECK(cudaEventSynchronize(in_use));
      reset();
      std::size_t b = 4096;
      while (b < want) b *= 2;
      if constexpr (K == memory_kind::pinned) BRAID_CUDA_CHECK(cudaMallocHost(&p, b));
      else BRAID_CUDA_CHECK(cudaMalloc(&p, b));
      bytes = b;
    }
    return static_cast<T*>(p);
  }
  void reset() noexcept {
    if (p) {
      if constexpr (K == memory_kind::pinned) (void)cudaFreeHost(p);
      else (void)cudaFree(p);
    }
    p = nullptr;
    bytes = 0;
  }
  grow_only() = default;
  grow_only(grow_only&& o) noexcept : p(std::exchange(o.p, nullptr)), bytes(std::exchange(o.bytes, 0)) {}
  grow_only& operator=(grow_only&& o) noexcept {
    if (this != &o) {
      reset();
      p = std::exchange(o.p, nullptr);
      bytes = std::exchange(o.bytes, 0);
    }
    return *this;
  }
  ~grow_only() { reset(); }
};

} // namespace braid::cuda::detail
