// braid/core/reduce.hpp — the host reduction loops: reduce n inputs element-wise in a fixed order and
// write the result to one or two outputs. Written so that the compiler vectorises the common cases
// (two inputs, arithmetic types): tiles of accumulators in A, one pass per input. half, bfloat16 and
// fp8 with a float accumulator and a built-in operator take, where the CPU has AVX2 and F16C, the
// vector loop of convert_x86.hpp: the same bits, converted eight at a time.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "config.hpp"
#include "convert_x86.hpp"
#include "ops.hpp"

namespace braid {
namespace detail {

// reduce_n element by element, each conversion by T's own operators: the loop every type and operator
// can take, and the reference the vector loop is tested against.
template <class T, class Op>
void reduce_n_scalar(const T* const* src, int ns, T* dst, T* dst2, std::size_t count, const Op& op, bool final,
                     int nranks) {
  using A = accumulator_t<T, Op>;
  if (ns == 1 && !(final && has_finalize<Op, A>)) {
    if (dst != src[0]) std::memmove(dst, src[0], count * sizeof(T));
    if (dst2) std::memcpy(dst2, src[0], count * sizeof(T));
    return;
  }
  if constexpr (!std::is_invocable_v<const Op&, const A&, const A&>) {
    return; // copy-only operator (broadcast, all_gather): schedules never reduce with it
  } else {
  auto fin = [&](const A& x) -> A {
    if constexpr (has_finalize<Op, A>) return final ? static_cast<A>(op.finalize(x, nranks)) : x;
    else return x;
  };
  if (ns == 2) {
    const T* a = src[0];
    const T* b = src[1];
    if (dst2) {
      for (std::size_t i = 0; i < count; ++i) {
        const T v = static_cast<T>(fin(op(static_cast<A>(a[i]), static_cast<A>(b[i]))));
        dst[i] = v;
        dst2[i] = v;
      }
    } else {
      for (std::size_t i = 0; i < count; ++i) dst[i] = static_cast<T>(fin(op(static_cast<A>(a[i]), static_cast<A>(b[i]))));
    }
    return;
  }
  constexpr std::size_t tile = 512;
  alignas(64) A acc[tile];
  for (std::size_t base = 0; base < count; base += tile) {
    const std::size_t m = count - base < tile ? count - base : tile;
    const T* s0 = src[0] + base;
    for (std::size_t i = 0; i < m; ++i) acc[i] = static_cast<A>(s0[i]);
    for (int s = 1; s < ns; ++s) {
      const T* p = src[s] + base;
      for (std::size_t i = 0; i < m; ++i) acc[i] = op(acc[i], static_cast<A>(p[i]));
    }
    T* d = dst + base;
    for (std::size_t i = 0; i < m; ++i) d[i] = static_cast<T>(fin(acc[i]));
    if (dst2) std::memcpy(dst2 + base, d, m * sizeof(T));
  }
  }
}

// True when reduce_n<T>(..., op, ...) takes the vector loop on this machine.
template <class T, class Op> bool reduce_n_vectorised() noexcept {
#if BRAID_X86_CONVERSIONS
  if constexpr (x86::reducible_v<T, Op>) return x86::has_avx2_f16c();
#endif
  return false;
}

} // namespace detail

// dst[i] (and dst2[i] when dst2 != nullptr) = T(finalize?(op(...op(op(A(src[0][i]), A(src[1][i])), ...)))).
// The order of reduction is src[0], src[1], ..., src[ns-1] for every element: the same on every rank,
// and the same bits whichever loop (scalar or vector) a rank's CPU takes.
// Sources may alias dst (in-place, the same pointer): each element is read before it is written.
template <class T, class Op>
void reduce_n(const T* const* src, int ns, T* dst, T* dst2, std::size_t count, const Op& op, bool final,
              int nranks) {
#if BRAID_X86_CONVERSIONS
  if constexpr (detail::x86::reducible_v<T, Op>) {
    // One source and nothing to finalize is a copy (NaN payloads untouched): the scalar loop's memmove.
    if (!(ns == 1 && !(final && has_finalize<Op, float>)) && detail::reduce_n_vectorised<T, Op>()) {
      detail::x86::reduce_n_avx2(src, ns, dst, dst2, count, op, final, nranks);
      return;
    }
  }
#endif
  detail::reduce_n_scalar(src, ns, dst, dst2, count, op, final, nranks);
}

} // namespace braid
