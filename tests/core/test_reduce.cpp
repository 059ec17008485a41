// Tests for core/reduce.hpp: braid::reduce_n (the vector loop for half, bfloat16 and fp8 where the CPU
// has AVX2 and F16C) against detail::reduce_n_scalar, bit for bit, for every type x built-in operator,
// 1, 2 and 5 sources, counts around the 32-element block, out of place with a second output and in
// place, on random encodings (NaNs, infinities, subnormals included), on values whose sums tie, and
// with MXCSR's rounding mode, DAZ and FTZ changed (both loops then round their float arithmetic the
// same way; the conversions round as always).
//
// The one thing not compared bit for bit: when two NaNs meet in a sum or a product, x86 returns the
// first operand, and C++ lets the compiler write a + b with either operand first, so which NaN survives
// is the compiler's choice, in the scalar loop too (g++ and clang++ differ). There the result must be a
// NaN; everything else must match exactly.
#include <braid/core/fp8.hpp>
#include <braid/core/float16.hpp>
#include <braid/core/ops.hpp>
#include <braid/core/reduce.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ios>
#include <random>
#include <string>
#include <vector>

#if BRAID_X86_CONVERSIONS
#include <xmmintrin.h>
#endif

namespace {

enum class data { random_bits, ties };

template <class T> std::vector<T> make_input(std::size_t n, data kind, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (kind == data::random_bits) {
      v[i] = T::from_bits(static_cast<decltype(T::bits)>(rng()));
    } else {
      // Small multiples of a power of two: sums land on ties of T's grid, and some overflow.
      const int k = static_cast<int>(rng() % 64) - 32;
      const int e = static_cast<int>(rng() % 24) - 12;
      v[i] = static_cast<T>(std::ldexp(static_cast<float>(k), e));
    }
  }
  return v;
}

// True when, reducing element i in order, two NaNs meet in op (sum, prod, avg only).
template <class T, class Op> bool nans_meet(const std::vector<std::vector<T>>& in, std::size_t i, const Op& op) {
  constexpr braid::op_kind k = braid::op_kind_v<Op>;
  if (k == braid::op_kind::min || k == braid::op_kind::max) return false;
  float acc = static_cast<float>(in[0][i]);
  for (std::size_t s = 1; s < in.size(); ++s) {
    const float x = static_cast<float>(in[s][i]);
    if (std::isnan(acc) && std::isnan(x)) return true;
    acc = op(acc, x);
  }
  return false;
}

enum class place { out, out2, in_first, in_last };

template <class T, class Run, class Loop, class Op>
void compare(Run& run, Loop how, const std::vector<T>& want, const std::vector<T>& want2,
             const std::vector<std::vector<T>>& in, const Op& op, std::size_t count, place where) {
  CAPTURE(static_cast<int>(how));
  std::vector<T> got, got2;
  run(how, got, got2);
  std::size_t wrong = 0, nan_meets = 0;
  for (std::size_t i = 0; i < count; ++i) {
    bool ok = got[i].bits == want[i].bits && got2[i].bits == want2[i].bits;
    if (!ok && nans_meet(in, i, op)) {
      ++nan_meets;
      const float g = static_cast<float>(got[i]);
      ok = std::isnan(g) && std::isnan(static_cast<float>(want[i])) &&
           (where != place::out2 || got2[i].bits == got[i].bits);
    }
    if (!ok && ++wrong <= 3)
      FAIL_CHECK("element " << i << ": 0x" << std::hex << unsigned(got[i].bits) << ", scalar 0x"
                            << unsigned(want[i].bits));
  }
  CHECK(wrong == 0);
  CHECK(nan_meets <= count / 8 + 1); // the exception stays an exception
}

template <class T, class Op>
void check_one(const Op& op, int ns, std::size_t count, data kind, place where, bool final) {
  std::vector<std::vector<T>> in;
  for (int s = 0; s < ns; ++s) in.push_back(make_input<T>(count, kind, static_cast<std::uint32_t>(100 * s + 7)));
  enum class loop { dispatched, vector, scalar };
  auto run = [&](loop how, std::vector<T>& out, std::vector<T>& out2) {
    std::vector<std::vector<T>> buf = in; // in place overwrites a source
    std::vector<const T*> src;
    for (auto& b : buf) src.push_back(b.data());
    out.assign(count, T::from_bits(0x55));
    out2.assign(count, T::from_bits(0x66));
    T* dst = out.data();
    if (where == place::in_first) dst = buf.front().data();
    if (where == place::in_last) dst = buf.back().data();
    T* dst2 = where == place::out2 ? out2.data() : nullptr;
    if (how == loop::dispatched) braid::reduce_n<T>(src.data(), ns, dst, dst2, count, op, final, ns);
#if BRAID_X86_CONVERSIONS
    else if (how == loop::vector) braid::detail::x86::reduce_n_avx2<T>(src.data(), ns, dst, dst2, count, op, final, ns);
#endif
    else braid::detail::reduce_n_scalar<T>(src.data(), ns, dst, dst2, count, op, final, ns);
    if (dst != out.data()) out.assign(dst, dst + count);
  };
  std::vector<T> want, want2;
  run(loop::scalar, want, want2);
  // reduce_n (whichever loop it takes here: test_convert_x86.cpp checks which), and the vector loop
  // called directly, except for one source and nothing to finalize, which reduce_n copies.
  compare(run, loop::dispatched, want, want2, in, op, count, where);
  const bool copy = ns == 1 && !(final && braid::op_kind_v<Op> == braid::op_kind::avg);
  if (braid::detail::reduce_n_vectorised<T, Op>() && !copy) compare(run, loop::vector, want, want2, in, op, count, where);
}

template <class T> void check_type() {
  const std::size_t counts[] = {0, 1, 7, 31, 32, 33, 511, 512, 513, 100003};
  for (braid::op_kind k : {braid::op_kind::sum, braid::op_kind::prod, braid::op_kind::min, braid::op_kind::max,
                           braid::op_kind::avg})
    braid::visit(k, [&](auto op) {
      for (int ns : {1, 2, 5})
        for (std::size_t count : counts)
          for (data kind : {data::random_bits, data::ties})
            for (place where : {place::out, place::out2, place::in_first, place::in_last})
              for (bool final : {false, true}) {
                CAPTURE(std::string(braid::name(k)));
                CAPTURE(ns);
                CAPTURE(count);
                CAPTURE(static_cast<int>(kind));
                CAPTURE(static_cast<int>(where));
                CAPTURE(final);
                check_one<T>(op, ns, count, kind, where, final);
              }
      return 0;
    });
}

TEST_CASE_TEMPLATE("reduce_n: the vector loop gives the scalar loop's bits", T, braid::half, braid::bfloat16,
                   braid::fp8_e4m3, braid::fp8_e5m2) {
  MESSAGE("vector loop: " << braid::detail::reduce_n_vectorised<T, braid::sum<>>());
  check_type<T>();
}

#if BRAID_X86_CONVERSIONS
TEST_CASE_TEMPLATE("reduce_n: the same bits with MXCSR set to round toward zero, DAZ and FTZ", T, braid::half,
                   braid::bfloat16, braid::fp8_e4m3, braid::fp8_e5m2) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x6000u | 0x8040u);
  for (braid::op_kind k : {braid::op_kind::sum, braid::op_kind::prod, braid::op_kind::avg})
    braid::visit(k, [&](auto op) {
      for (data kind : {data::random_bits, data::ties}) {
        CAPTURE(std::string(braid::name(k)));
        check_one<T>(op, 2, 100003, kind, place::out, true);
        check_one<T>(op, 5, 4099, kind, place::in_first, true);
      }
      return 0;
    });
  _mm_setcsr(saved);
}
#endif

} // namespace
