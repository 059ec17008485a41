// braid/cuda/device.cuh — device-side primitives of the CUDA transport: progress words, bounded waits,
// and the reduce-copy loop.
//
// Memory ordering: a rank's blocks write data, each block then fences (__threadfence_system) and
// arrives on the step's counter; the last block to arrive stores the rank's progress word with
// release at system scope. A reader loads the word with acquire at system scope before it reads
// the data. Peers on other GPUs reach the words and data through peer mappings (NVLink/PCIe).
#pragma once

#include <cuda/atomic>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/types.hpp"

namespace braid::cuda_detail {

using u64 = unsigned long long;

// Written by a kernel that gives up; read by the host after the stream completes. Lives in
// host-mapped (zero-copy) memory shared by every rank of the group.
struct device_error {
  unsigned int code;  // 0 none, else braid::errc
  int rank;           // who gave up
  int peer;           // whom it waited for
  int step;
  u64 waited_ns;
};

struct device_abort {
  unsigned int flag;  // non-zero: every kernel of the group returns at its next check
  unsigned int claim; // the first to claim it writes `first`, then sets flag (release)
  device_error first;
};

__device__ inline u64 globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ inline u64 load_acquire(const u64* p) {
  ::cuda::atomic_ref<u64, ::cuda::thread_scope_system> r(*const_cast<u64*>(p));
  return r.load(::cuda::memory_order_acquire);
}
// Raises *p to v (never lowers it), with release at system scope.
__device__ inline void post_max_release(u64* p, u64 v) {
  ::cuda::atomic_ref<u64, ::cuda::thread_scope_system> r(*p);
  r.fetch_max(v, ::cuda::memory_order_release);
}

// Bounded spin by one thread: waits until *word >= target, or the group is aborted, or timeout_ns
// passes (then records a timeout and raises the abort flag). Returns false if the kernel must stop.
__device__ inline bool wait_ge(const u64* word, u64 target, device_abort* ab, u64 timeout_ns, int rank, int peer,
                               int step) {
  if (load_acquire(word) >= target) return true;
  const u64 start = globaltimer();
  for (unsigned i = 1;; ++i) {
    if (load_acquire(word) >= target) return true;
    if ((i & 63) == 0) {
      if (*reinterpret_cast<volatile unsigned*>(&ab->flag)) return false;
      const u64 now = globaltimer();
      if (now - start > timeout_ns) {
        if (atomicCAS_system(&ab->claim, 0u, 1u) == 0u) {
          ab->first.code = static_cast<unsigned>(errc::timeout);
          ab->first.rank = rank;
          ab->first.peer = peer;
          ab->first.step = step;
          ab->first.waited_ns = now - start;
          __threadfence_system();
        }
        atomicExch_system(&ab->flag, 1u);
        return false;
      }
    }
    __nanosleep(128);
  }
}

// dst[i] (and dst2[i]) = reduction of src[0..ns)[i] in that order, over [begin, end) with a
// grid-stride loop; 16-byte vector accesses when every pointer allows them.
template <class T, class Op>
__device__ inline void reduce_copy(const T* const* src, int ns, T* dst, T* dst2, std::uint64_t count, const Op& op,
                                   bool final, int nranks, std::uint64_t tid, std::uint64_t nthreads) {
  using A = accumulator_t<T, Op>;
  bool copy = ns == 1;
  if constexpr (has_finalize<Op, A>) copy = copy && !final;
  constexpr bool reduces = std::is_invocable_v<const Op&, const A&, const A&>;
  auto combine = [&](std::uint64_t i) {
    if (copy || !reduces) { // bytes move unchanged (no round trip through A)
      const T v = src[0][i];
      if (dst) dst[i] = v;
      if (dst2) dst2[i] = v;
      return;
    }
    if constexpr (reduces) {
      A acc = static_cast<A>(src[0][i]);
      for (int s = 1; s < ns; ++s) acc = op(acc, static_cast<A>(src[s][i]));
      if constexpr (has_finalize<Op, A>)
        if (final) acc = static_cast<A>(op.finalize(acc, nranks));
      const T v = static_cast<T>(acc);
      if (dst) dst[i] = v;
      if (dst2) dst2[i] = v;
    }
  };
  constexpr int V = sizeof(T) <= 16 && 16 % sizeof(T) == 0 ? static_cast<int>(16 / sizeof(T)) : 1;
  bool vec = V > 1;
  if (vec) {
    auto al = [](const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; };
    for (int s = 0; s < ns; ++s) vec = vec && al(src[s]);
    vec = vec && (!dst || al(dst)) && (!dst2 || al(dst2));
  }
  if (!vec) {
    for (std::uint64_t i = tid; i < count; i += nthreads) combine(i);
    return;
  }
  struct alignas(16) pack { T v[V]; };
  const std::uint64_t nvec = count / V;
  for (std::uint64_t k = tid; k < nvec; k += nthreads) {
    pack in[1];
    A acc[V];
    in[0] = reinterpret_cast<const pack*>(src[0])[k];
    if (copy || !reduces) {
      if (dst) reinterpret_cast<pack*>(dst)[k] = in[0];
      if (dst2) reinterpret_cast<pack*>(dst2)[k] = in[0];
      continue;
    }
    if constexpr (reduces) {
    for (int j = 0; j < V; ++j) acc[j] = static_cast<A>(in[0].v[j]);
    for (int s = 1; s < ns; ++s) {
      const pack x = reinterpret_cast<const pack*>(src[s])[k];
      for (int j = 0; j < V; ++j) acc[j] = op(acc[j], static_cast<A>(x.v[j]));
    }
    pack o;
    for (int j = 0; j < V; ++j) {
      A a = acc[j];
      if constexpr (has_finalize<Op, A>)
        if (final) a = static_cast<A>(op.finalize(a, nranks));
      o.v[j] = static_cast<T>(a);
    }
    if (dst) reinterpret_cast<pack*>(dst)[k] = o;
    if (dst2) reinterpret_cast<pack*>(dst2)[k] = o;
    }
  }
  for (std::uint64_t i = nvec * V + tid; i < count; i += nthreads) combine(i);
}

} // namespace braid::cuda_detail
