// Tests for core/convert_x86.hpp: the AVX2/F16C conversions give the scalar conversions' bits
// (float16.hpp, fp8.hpp) for every encoding widened and for a million floats narrowed per type, also
// with MXCSR's rounding mode, DAZ and FTZ changed; and reduce_n takes the vector loop exactly where it
// should. The reduction loop itself is tested against the scalar one in test_reduce.cpp.
#include <braid/core/convert_x86.hpp>
#include <braid/core/float16.hpp>
#include <braid/core/fp8.hpp>
#include <braid/core/ops.hpp>
#include <braid/core/reduce.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ios>
#include <random>
#include <vector>

#if BRAID_X86_CONVERSIONS
#include <xmmintrin.h>
#endif

namespace {

struct plus_one_op { // a user operator: never the vector loop
  using accumulator_type = float;
  float operator()(float a, float b) const { return a + b; }
};

TEST_CASE("reduce_n takes the vector loop for half, bfloat16 and fp8 with built-in float operators") {
#if BRAID_X86_CONVERSIONS
  // Every CPU with AVX2 has F16C; __builtin_cpu_supports("f16c") is GCC's only.
  const bool cpu = __builtin_cpu_supports("avx2") != 0;
  MESSAGE("AVX2 on this CPU: " << cpu);
  CHECK(braid::detail::x86::has_avx2_f16c() == cpu);
#else
  const bool cpu = false;
  MESSAGE("braid's x86 conversions are not compiled for this compiler/architecture: scalar loop only");
#endif
  using braid::detail::reduce_n_vectorised;
  CHECK(reduce_n_vectorised<braid::half, braid::sum<>>() == cpu);
  CHECK(reduce_n_vectorised<braid::half, braid::sum<float>>() == cpu);
  CHECK(reduce_n_vectorised<braid::bfloat16, braid::prod<>>() == cpu);
  CHECK(reduce_n_vectorised<braid::fp8_e4m3, braid::min<>>() == cpu);
  CHECK(reduce_n_vectorised<braid::fp8_e5m2, braid::max<>>() == cpu);
  CHECK(reduce_n_vectorised<braid::bfloat16, braid::avg<>>() == cpu);
  // Not for a double accumulator, a user operator, or types that convert nothing.
  CHECK_FALSE(reduce_n_vectorised<braid::half, braid::sum<double>>());
  CHECK_FALSE(reduce_n_vectorised<braid::half, plus_one_op>());
  CHECK_FALSE(reduce_n_vectorised<float, braid::sum<>>());
  CHECK_FALSE(reduce_n_vectorised<std::int8_t, braid::sum<>>());
}

#if BRAID_X86_CONVERSIONS

template <class T> std::uint32_t bits_of(T x) { return x.bits; }
std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// MXCSR set to round toward zero with DAZ and FTZ for the scope: the conversions must not notice.
struct odd_mxcsr {
  unsigned saved = _mm_getcsr();
  odd_mxcsr() { _mm_setcsr((saved & ~0x6000u) | 0x6000u | 0x8040u); }
  ~odd_mxcsr() { _mm_setcsr(saved); }
  odd_mxcsr(const odd_mxcsr&) = delete;
  odd_mxcsr& operator=(const odd_mxcsr&) = delete;
};

// Every encoding of T, widened by the vector code and by T's conversion operator.
template <class T> void check_widen_all() {
  constexpr std::size_t n = std::size_t{1} << (8 * sizeof(T));
  std::vector<T> in(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = T::from_bits(static_cast<decltype(T::bits)>(i));
  std::vector<float> out(n, 0.0f);
  braid::detail::x86::widen(in.data(), out.data(), n);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t want = bits_of(static_cast<float>(in[i]));
    if (bits_of(out[i]) != want && ++wrong <= 5)
      FAIL_CHECK("widen 0x" << std::hex << i << ": 0x" << bits_of(out[i]) << ", scalar 0x" << want);
  }
  CHECK(wrong == 0);
}

// Floats covering every exponent field and sign (all 65536 top halves), each with low halves at and
// around the rounding points of every format (bit 12 for half, 15 for bfloat16, 19/20 for fp8: ties,
// one either side, sticky bits) plus random ones: NaNs with payloads, ±inf, float subnormals, values
// that overflow or saturate, and every tie. Then a million random floats.
std::vector<float> narrowing_inputs() {
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x2000, 0x3000, 0x2fff,
                                0x7fff, 0x8000, 0x8001, 0xefff, 0xf000, 0xffff};
  std::vector<float> v;
  std::mt19937 rng(15);
  for (std::uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (std::uint32_t lo : lows) v.push_back(float_of(hi << 16 | lo));
    v.push_back(float_of(hi << 16 | (rng() & 0xffffu)));
    v.push_back(float_of(hi << 16 | (rng() & 0xffffu)));
  }
  for (int i = 0; i < 1000000; ++i) v.push_back(float_of(static_cast<std::uint32_t>(rng())));
  return v;
}

template <class T> void check_narrow(const std::vector<float>& in) {
  const std::size_t n = in.size();
  std::vector<T> out(n, T::from_bits(0));
  braid::detail::x86::narrow(in.data(), out.data(), n);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t want = static_cast<T>(in[i]).bits;
    if (out[i].bits != want && ++wrong <= 5)
      FAIL_CHECK("narrow 0x" << std::hex << bits_of(in[i]) << ": 0x" << unsigned(out[i].bits) << ", scalar 0x" << want);
  }
  CHECK(wrong == 0);
}

TEST_CASE_TEMPLATE("vector widening: every encoding gives the scalar bits", T, braid::half, braid::bfloat16,
                   braid::fp8_e4m3, braid::fp8_e5m2) {
  if (!braid::detail::x86::has_avx2_f16c()) return;
  check_widen_all<T>();
  odd_mxcsr mx;
  check_widen_all<T>();
}

TEST_CASE_TEMPLATE("vector narrowing: the scalar bits for every exponent, tie, NaN, infinity and subnormal", T,
                   braid::half, braid::bfloat16, braid::fp8_e4m3, braid::fp8_e5m2) {
  if (!braid::detail::x86::has_avx2_f16c()) return;
  static const std::vector<float> in = narrowing_inputs();
  check_narrow<T>(in);
  odd_mxcsr mx;
  check_narrow<T>(in);
}

TEST_CASE("vector conversions: lengths that are not a multiple of the block, unaligned") {
  if (!braid::detail::x86::has_avx2_f16c()) return;
  std::vector<float> f(200);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.37f - 20.0f;
  for (std::size_t off : {0u, 1u, 3u})
    for (std::size_t len : {0u, 1u, 15u, 16u, 17u, 31u, 33u, 100u}) {
      std::vector<braid::half> h(len + off, braid::half::from_bits(0x1234));
      braid::detail::x86::narrow(f.data() + off, h.data() + off, len);
      for (std::size_t i = 0; i < off; ++i) CHECK(h[i].bits == 0x1234); // nothing before is touched
      std::vector<float> back(len + 1, -1.0f);
      braid::detail::x86::widen(h.data() + off, back.data(), len);
      CHECK(back[len] == -1.0f); // nor after
      for (std::size_t i = 0; i < len; ++i) {
        CHECK(h[off + i].bits == braid::half(f[off + i]).bits);
        CHECK(bits_of(back[i]) == bits_of(static_cast<float>(h[off + i])));
      }
    }
}

#endif // BRAID_X86_CONVERSIONS

} // namespace
