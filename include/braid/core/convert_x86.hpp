// braid/core/convert_x86.hpp — the host reduction loop for half, bfloat16 and fp8 data with a float
// accumulator, eight lanes at a time with AVX2 (and F16C for half), chosen at run time.
//
// Contract: for every input, the bits these functions produce are those of the element-by-element
// conversions in float16.hpp and fp8.hpp (the scalar path): widen() is exact, NaN payloads included
// (F16C quiets signalling NaNs; the quiet bit is put back as it was); narrow() rounds to nearest,
// ties to even, with the same infinities, saturation, signed zeros, subnormals and NaN rules. The
// reduction loop computes the operator's float arithmetic between them in the same order (sources
// 0, 1, ..., ns-1) and stores the scalar loop's bits. None of it depends on MXCSR: conversions take
// their rounding from the instruction, not from MXCSR, and ignore DAZ/FTZ; the float sums, products,
// quotients, min and max are the same IEEE operations as the scalar loop's, under the same MXCSR.
// So a rank with AVX2 and a rank without agree bit for bit, with one exception that the scalar loop
// has too: where two NaNs meet in a sum or product, x86 returns the first operand's payload and sign,
// and C++ lets the compiler put either operand of a + b first (g++'s and clang++'s scalar loops
// differ), so which NaN comes out is the compiler's choice.
//
// Compiled only by GCC or Clang for x86-64, outside nvcc and hipcc (whose host passes keep the scalar
// loop); nothing here needs -mavx2: the functions carry target attributes and run only when CPUID
// reports AVX2 and F16C and the OS saves the AVX state. Define BRAID_X86_CONVERSIONS to 0 to leave
// them out.
#pragma once

#include "config.hpp"

#if !defined(BRAID_X86_CONVERSIONS)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__HIPCC__) && !defined(__NVCOMPILER) && !defined(__INTEL_COMPILER)
#define BRAID_X86_CONVERSIONS 1
#else
#define BRAID_X86_CONVERSIONS 0
#endif
#endif

#if BRAID_X86_CONVERSIONS

#include <cpuid.h>
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "float16.hpp"
#include "fp8.hpp"
#include "ops.hpp"

#define BRAID_X86_AVX2 __attribute__((target("avx2,f16c")))

namespace braid::detail::x86 {

// True when this CPU and OS can run the AVX2 + F16C functions below; CPUID is read once.
inline bool has_avx2_f16c() noexcept {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u, f16c = (c >> 29) & 1u;
    if (!osxsave || !avx || !f16c) return false;
    unsigned xcr0 = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0u));
    if ((xcr0 & 6u) != 6u) return false; // the OS saves XMM and YMM state
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return ((b >> 5) & 1u) != 0; // AVX2
  }();
  return yes;
}

template <class T>
inline constexpr bool convertible_v = std::is_same_v<T, half> || std::is_same_v<T, bfloat16> ||
                                      std::is_same_v<T, fp8_e4m3> || std::is_same_v<T, fp8_e5m2>;

// The built-in operators whose float arithmetic the vector loop reproduces.
template <class Op> struct builtin_op : std::false_type {};
template <class Acc> struct builtin_op<sum<Acc>> : std::true_type {};
template <class Acc> struct builtin_op<prod<Acc>> : std::true_type {};
template <class Acc> struct builtin_op<min<Acc>> : std::true_type {};
template <class Acc> struct builtin_op<max<Acc>> : std::true_type {};
template <class Acc> struct builtin_op<avg<Acc>> : std::true_type {};

// reduce_n takes the vector loop for these (T, Op) when has_avx2_f16c().
template <class T, class Op>
inline constexpr bool reducible_v =
    convertible_v<T> && builtin_op<Op>::value && std::is_same_v<accumulator_t<T, Op>, float>;

BRAID_X86_AVX2 inline __m256i splat(std::uint32_t v) noexcept {
  return _mm256_set1_epi32(static_cast<int>(v));
}

// ---------------------------------------------------------------- widening: 8 elements to 8 floats

// Eight halves (raw encodings) to float. vcvtph2ps is exact but quiets signalling NaNs (sets float
// bit 22); decode() keeps the payload as it is, so with ExactNaN, for NaN lanes bit 22 is copied from
// half bit 9. Without, a signalling NaN comes out quiet: the reduction loop, whose floats only meet
// float arithmetic (which quiets NaNs), comparisons (where all NaNs are alike) and narrowing (which
// sets the quiet bit), gives the same bits either way.
template <bool ExactNaN = true> BRAID_X86_AVX2 inline __m256 widen_half_bits(__m128i raw) noexcept {
  if constexpr (!ExactNaN) return _mm256_cvtph_ps(raw);
  const __m256i h = _mm256_cvtepu16_epi32(raw);
  const __m256i f = _mm256_castps_si256(_mm256_cvtph_ps(raw));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(h, splat(0x7fffu)), splat(0x7c00u));
  const __m256i fix = _mm256_and_si256(_mm256_andnot_si256(_mm256_slli_epi32(h, 13), splat(0x400000u)), nan);
  return _mm256_castsi256_ps(_mm256_xor_si256(f, fix));
}

// Sixteen elements at p to float, in order: out[0] gets elements 0..7, out[1] elements 8..15.
// ExactNaN: as widen_half_bits (only half and e5m2 have signalling NaNs to quiet).
template <class T, bool ExactNaN = true> BRAID_X86_AVX2 inline void widen16(const T* p, __m256* out) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    out[0] = widen_half_bits<ExactNaN>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    out[1] = widen_half_bits<ExactNaN>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    for (std::size_t j = 0; j < 2; ++j) {
      const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * j)));
      out[j] = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    }
  } else {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    __m256i h;
    if constexpr (std::is_same_v<T, fp8_e5m2>) {
      // e5m2 is the top byte of a half: same exponent field and bias, two of its mantissa bits.
      h = _mm256_slli_epi16(b, 8);
    } else {
      static_assert(std::is_same_v<T, fp8_e4m3>);
      // S.EEEE.MMM as the half S.0EEEE.MMM0000000 is the value times 2^-8 (bias 15 instead of 7),
      // subnormals included, and times 256 is exact. The NaNs S.1111.111 get the half exponent
      // 11111 as well: the quiet half NaN S.11111.1110000000, which widens to S.0x7ff00000 (the
      // scalar decode's NaN) and stays that NaN when multiplied.
      const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7f));
      const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7c00));
      h = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(b, 8), _mm256_set1_epi16(-0x8000)),
                                          _mm256_slli_epi16(mag, 7)),
                          nan);
      const __m256 scale = _mm256_set1_ps(256.0f);
      out[0] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), scale);
      out[1] = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), scale);
      return;
    }
    out[0] = widen_half_bits<ExactNaN>(_mm256_castsi256_si128(h));
    out[1] = widen_half_bits<ExactNaN>(_mm256_extracti128_si256(h, 1));
  }
}

// ---------------------------------------------------------------- narrowing: floats to encodings

// Eight floats to bfloat16 encodings in the low 16 bits of each lane: encode<bfloat16_format> is, for
// a non-NaN, the float bits rounded to nearest-even at bit 16 (overflow lands on infinity by itself),
// and for a NaN the top half with the quiet bit set.
BRAID_X86_AVX2 inline __m256i narrow_bfloat16_lanes(__m256 x) noexcept {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), splat(1u));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, splat(0x7fffu)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), splat(0x40u));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, splat(0x7fffffffu)), splat(0x7f800000u));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

// Eight floats to encodings of the saturating fp8 format F in the low 8 bits of each lane, as
// encode<F>. Results in F's normal range: the float bits re-biased and rounded to nearest-even at bit
// 23 - M in integer arithmetic. Below it (subnormals and zeros, quantum 2^(emin - M)): |x| times
// 2^(M - emin), a power of two, so exact (a float subnormal under DAZ reads as 0 and rounds to 0
// anyway), then rounded to an integer by vroundps with the rounding in the instruction (nearest-even,
// not MXCSR's), which is the magnitude. Then magnitudes above max finite (±inf included) saturate,
// and NaNs become F's NaN; the sign is the float's.
template <class F> BRAID_X86_AVX2 inline __m256i narrow_fp8_lanes(__m256 x) noexcept {
  static_assert(F::on_overflow == F::max_finite && !F::keep_payload, "saturating fp8 formats only");
  constexpr int M = F::man_bits;
  constexpr int normal_ef = 127 + F::emin; // smallest float exponent field of an F normal
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, splat(0x7fffffffu));
  // Normal results.
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 23 - M), splat(1u));
  const __m256i up = _mm256_add_epi32(_mm256_add_epi32(a, splat((1u << (22 - M)) - 1u)), lsb);
  const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(up, 23 - M), splat(std::uint32_t(127 - F::bias) << M));
  // Subnormal results.
  constexpr float to_quanta = static_cast<float>(1u << (M - F::emin)); // 2^(M - emin)
  const __m256 y = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(to_quanta));
  const __m256i sub = _mm256_cvtps_epi32(_mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i is_normal = _mm256_cmpgt_epi32(a, splat((std::uint32_t(normal_ef) << 23) - 1u));
  const __m256i mag = _mm256_min_epu32(_mm256_blendv_epi8(sub, normal, is_normal), splat(F::max_finite));
  const __m256i nan = _mm256_cmpgt_epi32(a, splat(0x7f800000u));
  const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(u, 31), F::exp_bits + M);
  return _mm256_or_si256(sign, _mm256_blendv_epi8(mag, splat(F::quiet_nan), nan));
}

// 32 floats (v[0..3], in order) to 32 encodings at p.
template <class T> BRAID_X86_AVX2 inline void narrow32(const __m256* v, T* p) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    for (int j = 0; j < 4; ++j)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8 * j), _mm256_cvtps_ph(v[j], _MM_FROUND_TO_NEAREST_INT));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    for (int j = 0; j < 4; j += 2) {
      // packus: lane words v[j][0..3], v[j+1][0..3] | v[j][4..7], v[j+1][4..7]; then qwords 0, 2, 1, 3.
      const __m256i w = _mm256_packus_epi32(narrow_bfloat16_lanes(v[j]), narrow_bfloat16_lanes(v[j + 1]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 8 * j), _mm256_permute4x64_epi64(w, 0xd8));
    }
  } else {
    using F = std::conditional_t<std::is_same_v<T, fp8_e4m3>, fp8_e4m3_format, fp8_e5m2_format>;
    const __m256i w01 = _mm256_packus_epi32(narrow_fp8_lanes<F>(v[0]), narrow_fp8_lanes<F>(v[1]));
    const __m256i w23 = _mm256_packus_epi32(narrow_fp8_lanes<F>(v[2]), narrow_fp8_lanes<F>(v[3]));
    // Dwords now hold v0[0..3], v1[0..3], v2[0..3], v3[0..3] | the same for elements 4..7.
    const __m256i b = _mm256_packus_epi16(w01, w23);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
}

// ---------------------------------------------------------------- bulk conversions (tests)

// out[i] = float(in[i]) for i < n, with the bits of the scalar conversion.
template <class T> BRAID_X86_AVX2 void widen(const T* in, float* out, std::size_t n) noexcept {
  const std::size_t blocks = n - n % 16;
  for (std::size_t i = 0; i < blocks; i += 16) {
    __m256 v[2];
    widen16(in + i, v);
    _mm256_storeu_ps(out + i, v[0]);
    _mm256_storeu_ps(out + i + 8, v[1]);
  }
  for (std::size_t i = blocks; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

// out[i] = T(in[i]) for i < n, with the bits of the scalar conversion.
template <class T> BRAID_X86_AVX2 void narrow(const float* in, T* out, std::size_t n) noexcept {
  const std::size_t blocks = n - n % 32;
  for (std::size_t i = 0; i < blocks; i += 32) {
    const __m256 v[4] = {_mm256_loadu_ps(in + i), _mm256_loadu_ps(in + i + 8), _mm256_loadu_ps(in + i + 16),
                         _mm256_loadu_ps(in + i + 24)};
    narrow32(v, out + i);
  }
  for (std::size_t i = blocks; i < n; ++i) out[i] = static_cast<T>(in[i]);
}

// ---------------------------------------------------------------- the reduction loop

// op(a, b) for the built-in operators, as the scalar loop computes it in float: sum and avg a + b,
// prod a * b, min `b < a ? b : a` (= minps(b, a)), max `a < b ? b : a` (= maxps(b, a)); NaNs and
// signed zeros included.
template <op_kind K> BRAID_X86_AVX2 inline __m256 combine(__m256 a, __m256 b) noexcept {
  if constexpr (K == op_kind::sum || K == op_kind::avg) return _mm256_add_ps(a, b);
  else if constexpr (K == op_kind::prod) return _mm256_mul_ps(a, b);
  else if constexpr (K == op_kind::min) return _mm256_min_ps(b, a);
  else {
    static_assert(K == op_kind::max);
    return _mm256_max_ps(b, a);
  }
}

// reduce_n's contract (core/reduce.hpp) for reducible_v<T, Op>, ns >= 1: blocks of 32 elements, each
// read from every source before it is written. The last count % 32 elements take the scalar loop.
template <class T, class Op>
BRAID_X86_AVX2 void reduce_n_avx2(const T* const* src, int ns, T* dst, T* dst2, std::size_t count, const Op& op,
                                  bool final, int nranks) {
  static_assert(reducible_v<T, Op>);
  constexpr op_kind k = op_kind_v<Op>;
  const bool divide = final && k == op_kind::avg; // avg's finalize: x / float(nranks)
  const __m256 n = _mm256_set1_ps(static_cast<float>(nranks));
  const std::size_t blocks = count - count % 32;
  for (std::size_t i = 0; i < blocks; i += 32) {
    __m256 acc[4]; // signalling NaNs may come out quiet: the same bits at the end (widen_half_bits)
    widen16<T, false>(src[0] + i, acc);
    widen16<T, false>(src[0] + i + 16, acc + 2);
    for (int s = 1; s < ns; ++s) {
      __m256 v[4];
      widen16<T, false>(src[s] + i, v);
      widen16<T, false>(src[s] + i + 16, v + 2);
      for (std::size_t j = 0; j < 4; ++j) acc[j] = combine<k>(acc[j], v[j]);
    }
    if (divide)
      for (std::size_t j = 0; j < 4; ++j) acc[j] = _mm256_div_ps(acc[j], n);
    narrow32(acc, dst + i);
    if (dst2) std::memcpy(dst2 + i, dst + i, 32 * sizeof(T));
  }
  for (std::size_t i = blocks; i < count; ++i) {
    float x = static_cast<float>(src[0][i]);
    for (int s = 1; s < ns; ++s) x = op(x, static_cast<float>(src[s][i]));
    if constexpr (k == op_kind::avg) {
      if (final) x = op.finalize(x, nranks);
    }
    const T v = static_cast<T>(x);
    dst[i] = v;
    if (dst2) dst2[i] = v;
  }
}

} // namespace braid::detail::x86

#undef BRAID_X86_AVX2

#endif // BRAID_X86_CONVERSIONS
