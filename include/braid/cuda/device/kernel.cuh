// braid/cuda/device/kernel.cuh — the vocabulary braid's kernels are written in, defined once for each
// executor: the GPU (nvcc) and the emulated device (a host compiler with BRAID_CUDA_EMULATOR).
// Kernels use only this, so one kernel text serves both:
//
//   BRAID_KERNEL void k(args...)      a kernel (__global__ on the GPU)
//   BRAID_KERNEL_BOUNDED(n) void k(...)   a kernel launched with at most n threads per block
//                                     (__global__ __launch_bounds__(n): ptxas keeps it within
//                                     65536 / n registers; nothing on the emulator)
//   BRAID_DEVICE T f(...)             a device function (braid/core/config.hpp)
//   BRAID_SHARED T x;                 a block-shared variable, at block scope in a kernel
//   const BRAID_GRID_CONSTANT T p     a kernel parameter whose address may be taken and indexed: it
//                                     stays in the parameter space (__grid_constant__), never copied
//                                     to a per-thread (local memory) copy
//   device::thread_index(), block_index(), block_size(), grid_size()     x coordinates (1-D launches)
//   device::sync_block()                 __syncthreads
//   device::atomic_ref<T, device::scope::device / system>   load, store, fetch_add, fetch_max, exchange,
//                                     compare_exchange_strong, with device::memory_order
//   device::fence_system()               __threadfence_system (see below for the emulator)
//   device::clock_ns()                   %globaltimer (ns)
//   device::sleep_ns(ns)                 __nanosleep; on the emulator a yield point
//   device::bytes<N>                     N bytes (1, 2, 4, 8, 16) aligned to N, held in registers
//   device::load_global<N>(p), device::store_global<N>(p, v)   one N-byte access to global memory, p aligned
//                                     to N: ld.global / st.global (LDG / STG), weak (no order: the
//                                     protocol's acquire and block barriers order them), never the
//                                     non-coherent path (.nc), so data written during the kernel is
//                                     read as it is; a plain copy on the emulator
//   BRAID_UNROLL                      before a loop with a constant trip count: unroll it fully
//   BRAID_NO_UNROLL                   before a loop: keep it rolled (its body is unrolled already)
//   device::launch(kernel, grid, block, shared_bytes, stream, args...)   instead of <<<...>>>; returns
//                                     the launch's cudaError_t (what cudaGetLastError would say)
//   device::launch_cooperative(...)      the same as a cooperative launch (cudaLaunchCooperativeKernel):
//                                     every block resident at once, or cudaErrorCooperativeLaunchTooLarge
//
// Memory ordering on the emulator: atomic_ref is std::atomic_ref with the same orders (scopes are
// all system scope on a CPU), so the cross-rank protocol is a C++ memory-model program there. fence_system
// is std::atomic_thread_fence(seq_cst), except under ThreadSanitizer, which does not model fences:
// there it is nothing, and a protocol that needs it is reported (so the protocol must not rely on
// fences for what ThreadSanitizer checks; release/acquire atomics carry braid's ordering).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../../core/config.hpp"
#include "../runtime.cuh"

#if defined(__CUDACC__)
#include <cuda/atomic>
#elif defined(BRAID_CUDA_EMULATOR)
#include <atomic>

#include "../../emu/kernel.hpp"
#include "../../emu/runtime.hpp"
#else
#error "braid's CUDA kernels compile with nvcc, or with a host compiler and BRAID_CUDA_EMULATOR (CMake: link braid::emu)"
#endif

namespace braid::cuda::device {

enum class scope { device, system };
enum class memory_order { relaxed, acquire, release, acq_rel, seq_cst };

namespace detail {
template <int N> struct bytes_word { using type = unsigned int; static constexpr int count = N / 4; };
template <> struct bytes_word<2> { using type = unsigned short; static constexpr int count = 1; };
template <> struct bytes_word<1> { using type = unsigned char; static constexpr int count = 1; };
} // namespace detail

template <int N> struct alignas(N) bytes {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8 || N == 16, "braid::cuda::device::bytes: 1, 2, 4, 8 or 16 bytes");
  typename detail::bytes_word<N>::type w[detail::bytes_word<N>::count];
};

#if defined(__CUDACC__)

#define BRAID_KERNEL __global__
#define BRAID_KERNEL_BOUNDED(max_threads) __global__ __launch_bounds__(max_threads)
#define BRAID_SHARED __shared__
#define BRAID_GRID_CONSTANT __grid_constant__
#define BRAID_UNROLL _Pragma("unroll")
#define BRAID_NO_UNROLL _Pragma("unroll 1")

BRAID_DEVICE unsigned thread_index() { return threadIdx.x; }
BRAID_DEVICE unsigned block_index() { return blockIdx.x; }
BRAID_DEVICE unsigned block_size() { return blockDim.x; }
BRAID_DEVICE unsigned grid_size() { return gridDim.x; }
BRAID_DEVICE void sync_block() { __syncthreads(); }
BRAID_DEVICE void fence_system() { __threadfence_system(); }
BRAID_DEVICE std::uint64_t clock_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
BRAID_DEVICE void sleep_ns(unsigned ns) { __nanosleep(ns); }

// Volatile asm with a memory clobber: the compiler keeps these in program order with every other
// memory access (a barrier or acquire before a load stays before it); the hardware may still overlap
// them, which is the point of issuing several.
template <int N> BRAID_DEVICE bytes<N> load_global(const void* p) {
  bytes<N> v;
  const std::size_t g = __cvta_generic_to_global(p);
  if constexpr (N == 16) {
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(g) : "memory");
  } else if constexpr (N == 8) {
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.w[0]), "=r"(v.w[1]) : "l"(g) : "memory");
  } else if constexpr (N == 4) {
    asm volatile("ld.global.u32 %0, [%1];" : "=r"(v.w[0]) : "l"(g) : "memory");
  } else if constexpr (N == 2) {
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(v.w[0]) : "l"(g) : "memory");
  } else {
    unsigned x;
    asm volatile("ld.global.u8 %0, [%1];" : "=r"(x) : "l"(g) : "memory");
    v.w[0] = static_cast<unsigned char>(x);
  }
  return v;
}
template <int N> BRAID_DEVICE void store_global(void* p, const bytes<N>& v) {
  const std::size_t g = __cvta_generic_to_global(p);
  if constexpr (N == 16) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(g), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]) : "memory");
  } else if constexpr (N == 8) {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(g), "r"(v.w[0]), "r"(v.w[1]) : "memory");
  } else if constexpr (N == 4) {
    asm volatile("st.global.u32 [%0], %1;" :: "l"(g), "r"(v.w[0]) : "memory");
  } else if constexpr (N == 2) {
    asm volatile("st.global.u16 [%0], %1;" :: "l"(g), "h"(v.w[0]) : "memory");
  } else {
    asm volatile("st.global.u8 [%0], %1;" :: "l"(g), "r"(static_cast<unsigned>(v.w[0])) : "memory");
  }
}

namespace detail {
template <scope S> struct cuda_scope;
template <> struct cuda_scope<scope::device> { static constexpr ::cuda::thread_scope value = ::cuda::thread_scope_device; };
template <> struct cuda_scope<scope::system> { static constexpr ::cuda::thread_scope value = ::cuda::thread_scope_system; };
BRAID_HD constexpr ::cuda::std::memory_order order(memory_order o) {
  switch (o) {
  case memory_order::relaxed: return ::cuda::std::memory_order_relaxed;
  case memory_order::acquire: return ::cuda::std::memory_order_acquire;
  case memory_order::release: return ::cuda::std::memory_order_release;
  case memory_order::acq_rel: return ::cuda::std::memory_order_acq_rel;
  case memory_order::seq_cst: break;
  }
  return ::cuda::std::memory_order_seq_cst;
}
} // namespace detail

// Host and device: the host uses it on host-mapped memory the kernels share (the abort record).
template <class T, scope S> class atomic_ref {
public:
  BRAID_HD explicit atomic_ref(T& x) : r_(x) {}
  BRAID_HD T load(memory_order o) const { return r_.load(detail::order(o)); }
  BRAID_HD void store(T v, memory_order o) const { r_.store(v, detail::order(o)); }
  BRAID_HD T fetch_add(T v, memory_order o) const { return r_.fetch_add(v, detail::order(o)); }
  BRAID_HD T fetch_max(T v, memory_order o) const { return r_.fetch_max(v, detail::order(o)); }
  BRAID_HD T exchange(T v, memory_order o) const { return r_.exchange(v, detail::order(o)); }
  BRAID_HD bool compare_exchange_strong(T& expected, T desired, memory_order o) const {
    return r_.compare_exchange_strong(expected, desired, detail::order(o));
  }

private:
  ::cuda::atomic_ref<T, detail::cuda_scope<S>::value> r_;
};

// <<<grid, block, shared_bytes, stream>>> with the arguments converted to the kernel's parameters.
template <class... P, class... A>
cudaError_t launch(void (*kernel)(P...), unsigned grid, unsigned block, std::size_t shared_bytes, cudaStream_t stream,
                   A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "braid::cuda::device::launch: the arguments do not match the kernel's parameters");
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<A>(args)...);
  return cudaGetLastError();
}
template <class... P, class... A>
cudaError_t launch_cooperative(void (*kernel)(P...), unsigned grid, unsigned block, std::size_t shared_bytes,
                               cudaStream_t stream, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "braid::cuda::device::launch: the arguments do not match the kernel's parameters");
  std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  return std::apply(
      [&](auto&... p) {
        void* ptrs[] = {static_cast<void*>(&p)...};
        const cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid), dim3(block), ptrs,
                                                          shared_bytes, stream);
        if (e != cudaSuccess) (void)cudaGetLastError(); // returned here; not left for the next check
        return e;
      },
      params);
}

inline const char* device_kind() { return "CUDA GPU"; }

#else // the emulated device

#define BRAID_KERNEL
#define BRAID_KERNEL_BOUNDED(max_threads)
#define BRAID_SHARED static thread_local // one OS thread runs one block at a time: per-block storage
#define BRAID_GRID_CONSTANT
#if defined(__clang__)
#define BRAID_UNROLL _Pragma("unroll")
#define BRAID_NO_UNROLL _Pragma("unroll 1")
#else
#define BRAID_UNROLL _Pragma("GCC unroll 16")
#define BRAID_NO_UNROLL _Pragma("GCC unroll 1")
#endif

inline unsigned thread_index() { return emu::thread_index(); }
inline unsigned block_index() { return emu::block_index(); }
inline unsigned block_size() { return emu::block_size(); }
inline unsigned grid_size() { return emu::grid_size(); }
inline void sync_block() { emu::sync_block(); }
inline void fence_system() {
#if !BRAID_EMU_TSAN
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}
inline std::uint64_t clock_ns() { return emu::clock_ns(); }
inline void sleep_ns(unsigned) { emu::yield_thread(); }

template <int N> inline bytes<N> load_global(const void* p) {
  bytes<N> v;
  std::memcpy(&v, p, N);
  return v;
}
template <int N> inline void store_global(void* p, const bytes<N>& v) { std::memcpy(p, &v, N); }

namespace detail {
constexpr std::memory_order order(memory_order o) {
  switch (o) {
  case memory_order::relaxed: return std::memory_order_relaxed;
  case memory_order::acquire: return std::memory_order_acquire;
  case memory_order::release: return std::memory_order_release;
  case memory_order::acq_rel: return std::memory_order_acq_rel;
  case memory_order::seq_cst: break;
  }
  return std::memory_order_seq_cst;
}
// The order of a failed compare-exchange: no stronger than the success order allows.
constexpr std::memory_order failure_order(memory_order o) {
  return o == memory_order::acq_rel || o == memory_order::acquire ? std::memory_order_acquire
         : o == memory_order::seq_cst                            ? std::memory_order_seq_cst
                                                                 : std::memory_order_relaxed;
}
} // namespace detail

template <class T, scope S> class atomic_ref {
public:
  explicit atomic_ref(T& x) : r_(x) {}
  T load(memory_order o) const {
    emu::poll();
    return r_.load(detail::order(o));
  }
  void store(T v, memory_order o) const { r_.store(v, detail::order(o)); }
  T fetch_add(T v, memory_order o) const { return r_.fetch_add(v, detail::order(o)); }
  // Always a read-modify-write (as atom.max is): it takes part in release sequences even when the
  // value does not change.
  T fetch_max(T v, memory_order o) const {
    T old = r_.load(std::memory_order_relaxed);
    while (!r_.compare_exchange_weak(old, old < v ? v : old, detail::order(o), detail::failure_order(o))) {
    }
    return old;
  }
  T exchange(T v, memory_order o) const { return r_.exchange(v, detail::order(o)); }
  bool compare_exchange_strong(T& expected, T desired, memory_order o) const {
    return r_.compare_exchange_strong(expected, desired, detail::order(o), detail::failure_order(o));
  }

private:
  std::atomic_ref<T> r_;
};

template <class... P, class... A>
cudaError_t launch(void (*kernel)(P...), unsigned grid, unsigned block, std::size_t shared_bytes, cudaStream_t stream,
                   A&&... args) {
  return emu::launch(kernel, grid, block, shared_bytes, stream, std::forward<A>(args)...);
}
template <class... P, class... A>
cudaError_t launch_cooperative(void (*kernel)(P...), unsigned grid, unsigned block, std::size_t shared_bytes,
                               cudaStream_t stream, A&&... args) {
  return emu::launch_cooperative(kernel, grid, block, shared_bytes, stream, std::forward<A>(args)...);
}

inline const char* device_kind() { return emu::device_kind(); }

#endif

} // namespace braid::cuda::device
