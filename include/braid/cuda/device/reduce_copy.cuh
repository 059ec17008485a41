// braid/cuda/device/reduce_copy.cuh — the device loop that moves a collective's data: dst[i] (and dst2[i]) =
// src[0][i] op src[1][i] op ... op src[ns-1][i], finalised when asked, for i in [0, count), shared by
// the grid's threads; or, when nothing is reduced, a copy of the bytes. Written in
// braid/cuda/device/kernel.cuh's vocabulary: the same text runs on a GPU (nvcc) and on the emulated device.
//
// Shape (that of NCCL's reduce-copy loop, written anew for braid's contract):
// - Data moves in packs of 16 bytes when every pointer of the call can be aligned to 16 bytes at once
//   (a few elements one by one first, the head, when they share a misalignment; the remainder one by
//   one last, the tail). Otherwise a copy moves the widest power-of-two words (8, 4, 2, 1 bytes) the
//   pointers allow together, and a reduction moves single elements: still U per thread per iteration.
// - Each thread handles U packs per iteration: packs k, k + N, ..., k + (U-1)N of the grid's N threads,
//   so each of a warp's U accesses is one coalesced span. It issues the U loads of source 0 and the U
//   loads of source 1 before any arithmetic (2U packs in flight), reduces, then U loads per further
//   source, then U stores per destination. Sources 0 and 1 stay in registers for the whole call; the
//   pointers of further sources are read from `src` once per iteration (block-shared memory or kernel
//   parameters: `src` must point there, never to a per-thread array, which would be local memory).
// - Accesses are global-space and weak (device::load_global / store_global: LDG/STG on the GPU). Their
//   order against other ranks comes from the protocol (a progress word acquired, then a block
//   barrier), never from these accesses; and never the non-coherent path, since data changes during
//   a kernel.
// - The last iteration has the same shape: its packs past the end are not stored, and are loaded from
//   the thread's first pack instead (so loads stay unconditional and issue back to back).
//
// Results: for every element, A(src[0][i]) op A(src[1][i]) op ... in source order, in the accumulator
// type A, then finalize once when `final` (avg), then T: the order and rounding of braid::reduce_n on
// the host, so the bits do not depend on W, U, the grid or the alignment. A copy (one source and no
// finalisation, or an operator that reduces nothing: braid::detail::copy_only) moves the bytes
// unchanged, for any element type. Sources may alias dst elementwise (in place): a thread reads every
// source of an element before it writes the element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../core/ops.hpp"
#include "../../core/types.hpp"
#include "kernel.cuh"

namespace braid::cuda::device {

// Packs (16 bytes) per thread per iteration of a reduction: 8, so that a step with two sources has
// 16 loads in flight per thread, when the running value fits the pack it came in (A is T: 4
// registers a pack); fewer when it is kept in a wider A (half, bfloat16, fp8 summed in float: 8 or 16
// registers a pack), so that the accumulators stay at 32 registers. Registers measured with ptxas
// (nvcc 13.0, sm_90) in docs/gpu-kernels.md. A copy always moves copy_unroll packs.
namespace rc_detail {
template <class T, class A> constexpr int unroll_for() {
  if constexpr (std::is_same_v<A, T> || sizeof(T) >= 16 || 16 % sizeof(T) != 0) {
    return 8;
  } else {
    constexpr int regs = static_cast<int>(16 / sizeof(T)) * static_cast<int>((sizeof(A) + 3) / 4); // per pack
    return 32 / regs < 1 ? 1 : 32 / regs > 8 ? 8 : 32 / regs;
  }
}
} // namespace rc_detail
template <class T, class Op> inline constexpr int reduce_copy_unroll = rc_detail::unroll_for<T, accumulator_t<T, Op>>();
inline constexpr int copy_unroll = 8;
// The collective kernel (executor.cuh) keeps its schedule state live across the loop: with 8 packs
// ptxas needed more than its 128 registers (8 to 24 bytes spilled, measured), so it reduces with 4.
template <class T, class Op>
inline constexpr int collective_unroll = reduce_copy_unroll<T, Op> < 4 ? reduce_copy_unroll<T, Op> : 4;

namespace rc_detail {

using u64 = std::uint64_t;

BRAID_HD std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Element types that a reduction moves in 16-byte packs (when the pointers allow it).
template <class T> inline constexpr bool packs_of_16 = sizeof(T) < 16 && 16 % sizeof(T) == 0;

// The widest power of two up to 16 by which all the pointers whose differences are OR-ed into `diff`
// can be aligned together.
BRAID_HD unsigned common_width(std::uintptr_t diff) {
  diff |= 16;
  return static_cast<unsigned>(diff & (~diff + 1));
}

// Pack k + u * n of a thread's iteration at k, or k itself when that is past the end.
BRAID_DEVICE u64 clamp(u64 k, int u, u64 n, u64 end) {
  const u64 j = k + static_cast<u64>(u) * n;
  return j < end ? j : k;
}

// ---- copy: bytes, any element type ------------------------------------------------------------------

// Words [0, nwords) of W bytes, U per thread per iteration. In the last iteration the words past the
// end are not stored, and are loaded from the thread's first word instead (loads stay unconditional,
// so the compiler issues them back to back; that word is the thread's own: no other thread writes it).
template <int W, int U>
BRAID_DEVICE void copy_words(const unsigned char* s, unsigned char* d, unsigned char* d2, u64 nwords, u64 tid, u64 n) {
  BRAID_NO_UNROLL
  for (u64 k = tid; k < nwords; k += static_cast<u64>(U) * n) {
    device::bytes<W> v[static_cast<std::size_t>(U)];
    BRAID_UNROLL
    for (int u = 0; u < U; ++u) v[u] = device::load_global<W>(s + clamp(k, u, n, nwords) * W);
    BRAID_UNROLL
    for (int u = 0; u < U; ++u)
      if (const u64 j = k + static_cast<u64>(u) * n; j < nwords) {
        device::store_global<W>(d + j * W, v[u]);
        if (d2) device::store_global<W>(d2 + j * W, v[u]);
      }
  }
}

template <int U>
BRAID_DEVICE void copy_bytes(const unsigned char* s, unsigned char* d, unsigned char* d2, u64 nbytes, u64 tid, u64 n) {
  const unsigned w = common_width((addr(s) ^ addr(d)) | (d2 ? addr(s) ^ addr(d2) : 0));
  const u64 lead = (w - (addr(s) & (w - 1))) & (w - 1);
  const u64 head = lead < nbytes ? lead : nbytes;
  const u64 nwords = (nbytes - head) / w;
  for (u64 i = tid; i < head; i += n) {
    d[i] = s[i];
    if (d2) d2[i] = s[i];
  }
  unsigned char* d2h = d2 ? d2 + head : nullptr;
  switch (w) {
  case 16: copy_words<16, U>(s + head, d + head, d2h, nwords, tid, n); break;
  case 8: copy_words<8, U>(s + head, d + head, d2h, nwords, tid, n); break;
  case 4: copy_words<4, U>(s + head, d + head, d2h, nwords, tid, n); break;
  case 2: copy_words<2, U>(s + head, d + head, d2h, nwords, tid, n); break;
  default: copy_words<1, U>(s + head, d + head, d2h, nwords, tid, n); break;
  }
  for (u64 i = head + nwords * w + tid; i < nbytes; i += n) {
    d[i] = s[i];
    if (d2) d2[i] = s[i];
  }
}

// ---- reduction --------------------------------------------------------------------------------------

// E elements of T: one 16-byte access (16 / sizeof(T) elements), or one element accessed as T.
template <class T, std::size_t E> struct pack_io {
  static_assert(E * sizeof(T) == 16);
  using type = device::bytes<16>;
  BRAID_DEVICE static type load(const T* p) { return device::load_global<16>(p); }
  BRAID_DEVICE static void store(T* p, const type& v) { device::store_global<16>(p, v); }
  BRAID_DEVICE static void unpack(const type& v, T (&x)[E]) { __builtin_memcpy(&x[0], &v, 16); }
  BRAID_DEVICE static type pack(const T (&x)[E]) {
    type v;
    __builtin_memcpy(&v, &x[0], 16);
    return v;
  }
};
template <class T> struct pack_io<T, 1> {
  using type = T;
  BRAID_DEVICE static type load(const T* p) { return *p; }
  BRAID_DEVICE static void store(T* p, const type& v) { *p = v; }
  BRAID_DEVICE static void unpack(const type& v, T (&x)[1]) { x[0] = v; }
  BRAID_DEVICE static type pack(const T (&x)[1]) { return x[0]; }
};

template <class T, class Op> struct reduce_args {
  const T* const* src;    // every source (block-shared or parameter memory); add `off`
  std::uint64_t off;      // elements before the packs (the head)
  int ns;
  T* d;                   // at the packs' start
  T* d2;                  // at the packs' start, or null
  Op op;                  // operators are trivially copyable, mostly empty
  bool final;
  int nranks;
};

// acc (op)= the E elements of x.
template <class A, class T, std::size_t E, class Op>
BRAID_DEVICE void accumulate(A (&acc)[E], const T (&x)[E], const Op& op) {
  BRAID_UNROLL
  for (std::size_t j = 0; j < E; ++j) acc[j] = op(acc[j], static_cast<A>(x[j]));
}

// Packs [0, npacks) of E elements, U per thread per iteration (the last iteration as in copy_words).
// Source 0 and 1 pointers stay in registers; further ones are read from a.src per iteration.
// When A is T the running value is kept packed as T (exact: T -> A -> T is the identity then), which
// keeps it in 4 registers a pack whatever the element size; otherwise it is kept in A.
template <int U, int E, class T, class Op>
BRAID_DEVICE void reduce_packs(const T* s0, const T* s1, const reduce_args<T, Op>& a, u64 npacks, u64 tid, u64 n) {
  constexpr std::size_t nu = static_cast<std::size_t>(U), ne = static_cast<std::size_t>(E); // array bounds
  using A = accumulator_t<T, Op>;
  using P = pack_io<T, ne>;
  using R = typename P::type;
  constexpr bool packed = std::is_same_v<A, T>;
  const Op& op = a.op;
  BRAID_NO_UNROLL
  for (u64 k = tid; k < npacks; k += static_cast<u64>(U) * n) {
    R x[nu], y[nu];
    BRAID_UNROLL
    for (int u = 0; u < U; ++u) x[u] = P::load(s0 + clamp(k, u, n, npacks) * E);
    // s1 is s0 for one source (a finalisation only): loaded, not reduced; no branch between the batches
    BRAID_UNROLL
    for (int u = 0; u < U; ++u) y[u] = P::load(s1 + clamp(k, u, n, npacks) * E);
    // acc: x itself (packed), or the elements of x in A
    A acc[packed ? 1 : nu][packed ? 1 : ne]; // unused when packed
    BRAID_UNROLL
    for (int u = 0; u < U; ++u) {
      T v[ne];
      P::unpack(x[u], v);
      if constexpr (packed) {
        if (a.ns > 1) {
          T w[ne];
          P::unpack(y[u], w);
          accumulate(v, w, op);
          x[u] = P::pack(v);
        }
      } else {
        BRAID_UNROLL
        for (int j = 0; j < E; ++j) acc[u][j] = static_cast<A>(v[j]);
        if (a.ns > 1) {
          P::unpack(y[u], v);
          accumulate(acc[u], v, op);
        }
      }
    }
    // Further sources. When the running value stays packed and elements are at most 4 bytes, two at a
    // time: the U loads of both are issued before either is reduced (2U in flight, as for sources 0
    // and 1), then an odd last source alone. Otherwise (wider accumulators, 8-byte elements) one at a
    // time: pairing them spilled registers in the collective kernel, and in reduce_kernel ptxas then
    // cut the first two sources' loads in flight from 8 to 4 (measured with the static checks). In
    // source order either way.
    auto fold = [&](const R (&in)[nu]) {
      BRAID_UNROLL
      for (int u = 0; u < U; ++u) {
        T w[ne];
        P::unpack(in[u], w);
        if constexpr (packed) {
          T v[ne];
          P::unpack(x[u], v);
          accumulate(v, w, op);
          x[u] = P::pack(v);
        } else {
          accumulate(acc[u], w, op);
        }
      }
    };
    if constexpr (packed && sizeof(T) <= 4) {
      int s = 2;
      BRAID_NO_UNROLL
      for (; s + 1 < a.ns; s += 2) {
        const T* p = a.src[s] + a.off;
        const T* q = a.src[s + 1] + a.off;
        R z[nu];
        BRAID_UNROLL
        for (int u = 0; u < U; ++u) y[u] = P::load(p + clamp(k, u, n, npacks) * E);
        BRAID_UNROLL
        for (int u = 0; u < U; ++u) z[u] = P::load(q + clamp(k, u, n, npacks) * E);
        fold(y);
        fold(z);
      }
      if (s < a.ns) {
        const T* p = a.src[s] + a.off;
        BRAID_UNROLL
        for (int u = 0; u < U; ++u) y[u] = P::load(p + clamp(k, u, n, npacks) * E);
        fold(y);
      }
    } else {
      BRAID_NO_UNROLL
      for (int s = 2; s < a.ns; ++s) {
        const T* p = a.src[s] + a.off;
        BRAID_UNROLL
        for (int u = 0; u < U; ++u) y[u] = P::load(p + clamp(k, u, n, npacks) * E);
        fold(y);
      }
    }
    BRAID_UNROLL
    for (int u = 0; u < U; ++u) {
      if (k + static_cast<u64>(u) * n >= npacks) continue;
      T v[ne];
      if constexpr (packed) P::unpack(x[u], v);
      BRAID_UNROLL
      for (int j = 0; j < E; ++j) {
        A r;
        if constexpr (packed) r = static_cast<A>(v[j]);
        else r = acc[u][j];
        if constexpr (has_finalize<Op, A>)
          if (a.final) r = static_cast<A>(op.finalize(r, a.nranks));
        v[j] = static_cast<T>(r);
      }
      const R o = P::pack(v);
      P::store(a.d + (k + static_cast<u64>(u) * n) * E, o);
      if (a.d2) P::store(a.d2 + (k + static_cast<u64>(u) * n) * E, o);
    }
  }
}

// One element, every source: the head and the tail.
template <class T, class Op>
BRAID_DEVICE void reduce_one(const T* const* src, int ns, T* d, T* d2, u64 i, const Op& op, bool final, int nranks) {
  using A = accumulator_t<T, Op>;
  A acc = static_cast<A>(src[0][i]);
  for (int s = 1; s < ns; ++s) acc = op(acc, static_cast<A>(src[s][i]));
  if constexpr (has_finalize<Op, A>)
    if (final) acc = static_cast<A>(op.finalize(acc, nranks));
  const T v = static_cast<T>(acc);
  d[i] = v;
  if (d2) d2[i] = v;
}

// 16-byte packs when every pointer can be aligned to 16 bytes together (after a head of up to 15
// bytes, element by element) and T divides 16; else element by element, still U per thread.
template <int U, class T, class Op>
BRAID_DEVICE void reduce(const T* const* src, int ns, T* d, T* d2, u64 count, const Op& op, bool final, int nranks,
                         u64 tid, u64 n) {
  constexpr bool vec = packs_of_16<T>;
  const T* s0 = src[0];
  u64 head = 0, npacks = count;
  bool packs16 = false;
  if constexpr (vec) {
    std::uintptr_t diff = (d2 ? addr(d2) ^ addr(s0) : 0) | (addr(d) ^ addr(s0)) | (addr(s0) & (sizeof(T) - 1));
    for (int s = 1; s < ns; ++s) diff |= addr(src[s]) ^ addr(s0);
    if (common_width(diff) == 16) {
      packs16 = true;
      const u64 lead = ((16 - (addr(s0) & 15)) & 15) / sizeof(T);
      head = lead < count ? lead : count;
      npacks = (count - head) / (16 / sizeof(T));
    }
  }
  for (u64 i = tid; i < head; i += n) reduce_one(src, ns, d, d2, i, op, final, nranks);
  const reduce_args<T, Op> a{src, head, ns, d + head, d2 ? d2 + head : nullptr, op, final, nranks};
  const T* s1 = ns > 1 ? src[1] : s0;
  if constexpr (vec) {
    if (packs16) {
      reduce_packs<U, static_cast<int>(16 / sizeof(T))>(s0 + head, s1 + head, a, npacks, tid, n);
      for (u64 i = head + npacks * (16 / sizeof(T)) + tid; i < count; i += n) reduce_one(src, ns, d, d2, i, op, final, nranks);
      return;
    }
  }
  reduce_packs<U, 1>(s0, s1, a, count, tid, n);
}

} // namespace rc_detail

// dst[i] (and dst2[i] when not null) for i in [0, count) as described at the top of this file, by
// thread `tid` of `nthreads` (every thread of the call passes the same other arguments). `src` holds
// ns >= 1 pointers in block-shared or kernel-parameter memory. U: packs per thread per iteration of a
// reduction (a copy moves copy_unroll).
template <class T, class Op, int U = reduce_copy_unroll<T, Op>>
BRAID_DEVICE void reduce_copy(const T* const* src, int ns, T* dst, T* dst2, std::uint64_t count, const Op& op, bool final,
                              int nranks, std::uint64_t tid, std::uint64_t nthreads) {
  static_assert(U >= 1 && U <= 16, "reduce_copy: 1 to 16 packs per thread");
  using A = accumulator_t<T, Op>;
  constexpr bool reduces = std::is_invocable_v<const Op&, const A&, const A&>;
  if (!dst) {
    dst = dst2;
    dst2 = nullptr;
  }
  if (!dst || ns < 1 || count == 0) return;
  bool copy = ns == 1;
  if constexpr (has_finalize<Op, A>) copy = copy && !final;
  if (copy || !reduces) { // bytes move unchanged (no round trip through A)
    // In place (the source is the destination: an all_gather's own block): nothing to move there.
    // Skipping it is not only cheaper: a copy of a buffer onto itself still writes it, with another
    // thread-to-byte map than a step that reads it (the widths differ), unordered across blocks.
    if (static_cast<const void*>(src[0]) == static_cast<const void*>(dst)) {
      if (!dst2) return;
      dst = dst2;
      dst2 = nullptr;
    } else if (dst2 && static_cast<const void*>(src[0]) == static_cast<const void*>(dst2)) {
      dst2 = nullptr;
    }
    rc_detail::copy_bytes<copy_unroll>(reinterpret_cast<const unsigned char*>(src[0]), reinterpret_cast<unsigned char*>(dst),
                                       reinterpret_cast<unsigned char*>(dst2), count * sizeof(T), tid, nthreads);
    return;
  }
  if constexpr (reduces) rc_detail::reduce<U>(src, ns, dst, dst2, count, op, final, nranks, tid, nthreads);
}

// Which thread moves which bytes, for callers that order two calls over the same bytes by program
// order alone (cuda/device/executor.cuh: an in-place call's staging copy of its input, then the step that
// overwrites that input). When moves_16_byte_units<T> and every pointer of a call (sources and
// destinations) is 16-byte aligned, reduce_copy, reduction or copy, moves 16-byte unit j of the call's
// bytes (no head) with thread j % nthreads, and its tail (under 16 bytes) with threads below 16.
// Otherwise the widths follow the pointers, and two calls over the same bytes may give them to
// different threads: a copy moves the widest words its pointers allow together (8 bytes from an
// 8-byte-aligned float buffer into an aligned one), a reduction of misaligned data single elements
// (element i by thread i, its 8-byte word by thread i / 2).
template <class T> inline constexpr bool moves_16_byte_units = rc_detail::packs_of_16<T>;

} // namespace braid::cuda::device
