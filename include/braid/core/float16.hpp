// braid/core/float16.hpp — braid::half (IEEE 754 binary16) and braid::bfloat16.
//
// Both are 2-byte, trivially copyable, standard-layout value types whose only data member is the
// encoding `bits`. Conversions are done in integer arithmetic, so they give the same bits on the host,
// on the device and in constant evaluation:
//   float/double -> half, bfloat16: round to nearest, ties to even, in one step (a double is not
//     rounded to float first); finite values beyond the largest finite round to infinity; ±inf stays
//     ±inf; NaN becomes a quiet NaN with the same sign and the top bits of the payload; subnormal
//     results are exact (half has subnormals down to 2^-24; bfloat16 has float's exponent range and
//     float's subnormals).
//   half, bfloat16 -> float: exact (NaN payloads are widened, not changed).
// Arithmetic converts to float, computes in float and rounds back; comparisons compare the float values
// (so NaN != NaN and +0 == -0). Under nvcc the device pass may use the CUDA conversion instructions,
// which are IEEE round-to-nearest-even and so give the same bits; NaNs always take the integer path.
#pragma once

#include "config.hpp"

#include <cstdint>
#include <limits>
#include <type_traits>
#if !defined(__CUDACC__)
#include <bit>
#endif

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace braid {
namespace detail {

// std::bit_cast is a host-only constexpr function to nvcc; the builtin it is made of is not.
template <class To, class From>
BRAID_HD constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From));
#if defined(__CUDACC__)
  return __builtin_bit_cast(To, from);
#else
  return std::bit_cast<To>(from);
#endif
}

// True in the device pass outside constant evaluation: where CUDA conversion intrinsics may be used.
#if BRAID_DEVICE_PASS
#define BRAID_DETAIL_RUNTIME_DEVICE (!__builtin_is_constant_evaluated())
#else
#define BRAID_DETAIL_RUNTIME_DEVICE false
#endif

// Describes a binary floating-point format of at most 16 bits: sign, ExpBits, ManBits, bias
// 2^(ExpBits-1)-1. Magnitudes (encodings without the sign bit):
//   MaxFinite   the largest finite value;
//   OnOverflow  what a finite value that rounds above MaxFinite, and an infinite input, become
//               (the infinity, or MaxFinite for a saturating conversion);
//   QuietNaN    the NaN a conversion produces;
//   IeeeSpecial true: the all-ones exponent holds infinity (mantissa 0) and NaNs (mantissa != 0);
//               false: the only NaN is all ones (S.1111.111) and there is no infinity;
//   KeepPayload true: a NaN keeps the top bits of its payload; false: every NaN becomes QuietNaN.
template <int ExpBits, int ManBits, std::uint32_t MaxFinite, std::uint32_t OnOverflow,
          std::uint32_t QuietNaN, bool IeeeSpecial, bool KeepPayload>
struct minifloat_format {
  static constexpr int exp_bits = ExpBits;
  static constexpr int man_bits = ManBits;
  static constexpr int bias = (1 << (ExpBits - 1)) - 1;
  static constexpr int emin = 1 - bias; // exponent of the smallest normal
  static constexpr std::uint32_t sign_bit = 1u << (ExpBits + ManBits);
  static constexpr std::uint32_t man_mask = (1u << ManBits) - 1;
  static constexpr std::uint32_t max_finite = MaxFinite;
  static constexpr std::uint32_t on_overflow = OnOverflow;
  static constexpr std::uint32_t quiet_nan = QuietNaN;
  static constexpr bool ieee_special = IeeeSpecial;
  static constexpr bool keep_payload = KeepPayload;

  BRAID_HD static constexpr bool is_nan(std::uint32_t mag) noexcept {
    if constexpr (IeeeSpecial) {
      return (mag >> ManBits) == (1u << ExpBits) - 1 && (mag & man_mask) != 0;
    } else {
      return mag == sign_bit - 1;
    }
  }
};

using half_format = minifloat_format<5, 10, 0x7bffu, 0x7c00u, 0x7e00u, true, true>;
using bfloat16_format = minifloat_format<8, 7, 0x7f7fu, 0x7f80u, 0x7fc0u, true, true>;

// Encodes x in format F, rounding to nearest, ties to even (see minifloat_format for overflow and NaN).
// Src is float or double; every format here has emin >= float's, so float subnormals need no
// normalisation: they are quantised on the same grid as the smallest normals.
template <class F, class Src>
BRAID_HD constexpr std::uint32_t encode(Src x) noexcept {
  static_assert(std::is_same_v<Src, float> || std::is_same_v<Src, double>);
  using U = std::conditional_t<sizeof(Src) == 4, std::uint32_t, std::uint64_t>;
  constexpr int src_bits = int(sizeof(Src)) * 8;
  constexpr int src_man = sizeof(Src) == 4 ? 23 : 52;
  constexpr int src_bias = sizeof(Src) == 4 ? 127 : 1023;
  constexpr U src_inf = U(2 * src_bias + 1) << src_man;

  const U u = detail::bit_cast<U>(x);
  const std::uint32_t sign = (u >> (src_bits - 1)) != 0 ? F::sign_bit : 0u;
  const U a = u & ~(U(1) << (src_bits - 1));

  if (a > src_inf) { // NaN: quiet, same sign
    std::uint32_t nan = F::quiet_nan;
    if constexpr (F::keep_payload) {
      nan |= static_cast<std::uint32_t>(a >> (src_man - F::man_bits)) & F::man_mask;
    }
    return sign | nan;
  }
  if (a == src_inf) return sign | F::on_overflow;

  // |x| = m * 2^(e - src_man), with m < 2^(src_man + 1).
  int e = int(a >> src_man) - src_bias;
  U m = a & ((U(1) << src_man) - 1);
  if ((a >> src_man) == 0) {
    e = 1 - src_bias; // source subnormal or zero: no hidden bit
  } else {
    m |= U(1) << src_man;
  }
  // Quantum of the result: 2^(eq - man_bits); below emin the grid stays that of the smallest normals.
  const int eq = e > F::emin ? e : F::emin;
  const int shift = src_man - F::man_bits + (eq - e);
  if (shift > src_man + 1) return sign; // |x| < quantum / 2: rounds to a signed zero
  const U q0 = m >> shift;
  const U rest = m & ((U(1) << shift) - 1);
  const U halfway = U(1) << (shift - 1);
  const U q = q0 + ((rest > halfway || (rest == halfway && (q0 & 1u) != 0)) ? 1u : 0u);
  // q carries the hidden bit for normal results, so adding it to the exponent field eq - 1 gives the
  // encoding; a carry out of the mantissa moves into the exponent, as rounding up should.
  const U mag = (U(eq + F::bias - 1) << F::man_bits) + q;
  return sign | (mag > F::max_finite ? F::on_overflow : static_cast<std::uint32_t>(mag));
}

// Decodes an encoding of format F to float, exactly. Formats whose exponent range lies inside float's
// normal range; bfloat16 is decoded by a shift instead.
template <class F>
BRAID_HD constexpr float decode(std::uint32_t b) noexcept {
  const std::uint32_t sign = (b & F::sign_bit) != 0 ? 0x80000000u : 0u;
  const std::uint32_t mag = b & (F::sign_bit - 1);
  const std::uint32_t ef = mag >> F::man_bits;
  std::uint32_t m = mag & F::man_mask;
  constexpr int to_float = 23 - F::man_bits;
  if (F::is_nan(mag) || (F::ieee_special && ef == (1u << F::exp_bits) - 1)) {
    return detail::bit_cast<float>(sign | 0x7f800000u | (m << to_float)); // inf or NaN (payload kept)
  }
  if (ef == 0) {
    if (m == 0) return detail::bit_cast<float>(sign);
    int e = F::emin;
    while ((m >> F::man_bits) == 0) {
      m <<= 1;
      --e;
    }
    return detail::bit_cast<float>(sign | (std::uint32_t(e + 127) << 23) | ((m & F::man_mask) << to_float));
  }
  const int e = int(ef) - F::bias;
  return detail::bit_cast<float>(sign | (std::uint32_t(e + 127) << 23) | (m << to_float));
}

// Arithmetic and comparisons for a type T that converts to float and is explicitly constructible from
// it: compute in float, round back to T. Negation flips the sign bit (exact, also for NaN).
template <class T>
struct float_arithmetic {
  friend BRAID_HD constexpr T operator+(T a) noexcept { return a; }
  friend BRAID_HD constexpr T operator-(T a) noexcept {
    return T::from_bits(static_cast<decltype(a.bits)>(a.bits ^ T::sign_mask));
  }
  friend BRAID_HD constexpr T operator+(T a, T b) noexcept { return T(float(a) + float(b)); }
  friend BRAID_HD constexpr T operator-(T a, T b) noexcept { return T(float(a) - float(b)); }
  friend BRAID_HD constexpr T operator*(T a, T b) noexcept { return T(float(a) * float(b)); }
  friend BRAID_HD constexpr T operator/(T a, T b) noexcept { return T(float(a) / float(b)); }
  friend BRAID_HD constexpr T& operator+=(T& a, T b) noexcept { return a = a + b; }
  friend BRAID_HD constexpr T& operator-=(T& a, T b) noexcept { return a = a - b; }
  friend BRAID_HD constexpr T& operator*=(T& a, T b) noexcept { return a = a * b; }
  friend BRAID_HD constexpr T& operator/=(T& a, T b) noexcept { return a = a / b; }
  friend BRAID_HD constexpr bool operator==(T a, T b) noexcept { return float(a) == float(b); }
  friend BRAID_HD constexpr bool operator!=(T a, T b) noexcept { return float(a) != float(b); }
  friend BRAID_HD constexpr bool operator<(T a, T b) noexcept { return float(a) < float(b); }
  friend BRAID_HD constexpr bool operator<=(T a, T b) noexcept { return float(a) <= float(b); }
  friend BRAID_HD constexpr bool operator>(T a, T b) noexcept { return float(a) > float(b); }
  friend BRAID_HD constexpr bool operator>=(T a, T b) noexcept { return float(a) >= float(b); }
};

// The storage and the format-independent members of a small float type T of format F: the encoding
// `bits` (its only data member), sign_mask, from_bits, the conversions from float and double and to
// float in integer arithmetic (T declares its own where the device has a faster path), and under nvcc
// bit copies to and from CUDA's type of the same format, Twin.
template <class T, class F, class Bits, class Twin>
struct minifloat_value : float_arithmetic<T> {
  Bits bits;
  static constexpr Bits sign_mask = static_cast<Bits>(F::sign_bit);

  minifloat_value() = default;
  BRAID_HD constexpr explicit minifloat_value(float f) noexcept : bits(static_cast<Bits>(encode<F>(f))) {}
  BRAID_HD constexpr explicit minifloat_value(double d) noexcept : bits(static_cast<Bits>(encode<F>(d))) {}

  BRAID_HD static constexpr T from_bits(Bits b) noexcept {
    T r;
    r.bits = b;
    return r;
  }

  BRAID_HD constexpr operator float() const noexcept { return decode<F>(bits); }

#if defined(__CUDACC__)
  template <class C, std::enable_if_t<std::is_same_v<C, Twin>, int> = 0>
  BRAID_HD minifloat_value(const C& x) noexcept : bits(detail::bit_cast<Bits>(x)) {}
  template <class C, std::enable_if_t<std::is_same_v<C, Twin>, int> = 0>
  BRAID_HD operator C() const noexcept {
    return detail::bit_cast<C>(bits);
  }
#endif
};

// CUDA's types of the formats, the Twin of minifloat_value; without nvcc there are none.
#if defined(__CUDACC__)
using cuda_half = __half;
using cuda_bfloat16 = __nv_bfloat16;
#else
struct no_cuda_twin;
using cuda_half = no_cuda_twin;
using cuda_bfloat16 = no_cuda_twin;
#endif

// floor(n * log10(2)) for |n| < 2^14, in integer arithmetic (log10(2) to 9 digits).
BRAID_HD constexpr int floor_log10_pow2(int n) noexcept {
  const long long p = static_cast<long long>(n) * 301029996LL;
  const long long q = p / 1000000000LL;
  return static_cast<int>(p < 0 && q * 1000000000LL != p ? q - 1 : q);
}

// The numeric_limits specialisation of a small float type T of format F, every member derived from
// the format. A format without infinity (and so without signaling NaN) gives +0 for those, as the
// standard asks; an IEEE format's signaling NaN has the quiet bit clear and the next payload bit set.
template <class T, class F>
struct minifloat_limits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool is_iec559 = false;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;
  static constexpr int radix = 2;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
#if __cplusplus < 202302L // deprecated in C++23
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
#endif
  static constexpr bool has_infinity = F::ieee_special;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = F::ieee_special;
  static constexpr int digits = F::man_bits + 1;
  static constexpr int digits10 = floor_log10_pow2(digits - 1);
  static constexpr int max_digits10 = 2 + floor_log10_pow2(digits); // ceil(1 + x) for x not integral
  static constexpr int min_exponent = F::emin + 1;
  static constexpr int min_exponent10 = -floor_log10_pow2(-F::emin); // ceil(emin * log10(2))
  static constexpr int max_exponent = int(F::max_finite >> F::man_bits) - F::bias + 1;
  static constexpr int max_exponent10 = floor_log10_pow2(max_exponent); // max is just below 2^max_exponent
  BRAID_HD static constexpr T min() noexcept { return make<1u << F::man_bits>(); }
  BRAID_HD static constexpr T max() noexcept { return make<F::max_finite>(); }
  BRAID_HD static constexpr T lowest() noexcept { return make<F::sign_bit | F::max_finite>(); }
  BRAID_HD static constexpr T epsilon() noexcept { return make<exponent(-F::man_bits)>(); }
  BRAID_HD static constexpr T round_error() noexcept { return make<exponent(-1)>(); }
  BRAID_HD static constexpr T infinity() noexcept { return make<inf_bits>(); }
  BRAID_HD static constexpr T quiet_NaN() noexcept { return make<F::quiet_nan>(); }
  BRAID_HD static constexpr T signaling_NaN() noexcept {
    return make<(F::ieee_special ? inf_bits | (1u << (F::man_bits - 2)) : 0u)>();
  }
  BRAID_HD static constexpr T denorm_min() noexcept { return make<1u>(); }

private:
  static constexpr std::uint32_t inf_bits =
      F::ieee_special ? ((1u << F::exp_bits) - 1) << F::man_bits : 0u;
  // The encoding of 2^e, a normal power of two.
  BRAID_HD static constexpr std::uint32_t exponent(int e) noexcept { return std::uint32_t(e + F::bias) << F::man_bits; }
  template <std::uint32_t Bits>
  BRAID_HD static constexpr T make() noexcept {
    return T::from_bits(static_cast<decltype(T::bits)>(Bits));
  }
};

} // namespace detail

// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits; max finite 65504, min normal 2^-14,
// min subnormal 2^-24.
struct half : detail::minifloat_value<half, detail::half_format, std::uint16_t, detail::cuda_half> {
  using minifloat_value::minifloat_value;
  half() = default;
  BRAID_HD constexpr explicit half(float f) noexcept { bits = from_float(f); }

  BRAID_HD constexpr operator float() const noexcept {
#if BRAID_DEVICE_PASS
    if (BRAID_DETAIL_RUNTIME_DEVICE && !detail::half_format::is_nan(bits & 0x7fffu)) {
      return __half2float(__ushort_as_half(bits));
    }
#endif
    return detail::decode<detail::half_format>(bits);
  }

private:
  BRAID_HD static constexpr std::uint16_t from_float(float f) noexcept {
#if BRAID_DEVICE_PASS
    if (BRAID_DETAIL_RUNTIME_DEVICE && f == f) return __half_as_ushort(__float2half_rn(f));
#endif
    return static_cast<std::uint16_t>(detail::encode<detail::half_format>(f));
  }
};

// bfloat16: 1 sign, 8 exponent, 7 mantissa bits: the top half of a float. Max finite ≈ 3.39e38.
struct bfloat16 : detail::minifloat_value<bfloat16, detail::bfloat16_format, std::uint16_t, detail::cuda_bfloat16> {
  using minifloat_value::minifloat_value;
  bfloat16() = default;
  BRAID_HD constexpr explicit bfloat16(float f) noexcept { bits = from_float(f); }

  BRAID_HD constexpr operator float() const noexcept {
    return detail::bit_cast<float>(std::uint32_t(bits) << 16);
  }

private:
  BRAID_HD static constexpr std::uint16_t from_float(float f) noexcept {
#if BRAID_DEVICE_PASS
    if (BRAID_DETAIL_RUNTIME_DEVICE && f == f) return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#endif
    return static_cast<std::uint16_t>(detail::encode<detail::bfloat16_format>(f));
  }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<half> && std::is_trivially_copyable_v<bfloat16>);
static_assert(std::is_standard_layout_v<half> && std::is_standard_layout_v<bfloat16>);

} // namespace braid

#undef BRAID_DETAIL_RUNTIME_DEVICE

template <>
struct std::numeric_limits<braid::half> : braid::detail::minifloat_limits<braid::half, braid::detail::half_format> {};
template <>
struct std::numeric_limits<braid::bfloat16>
    : braid::detail::minifloat_limits<braid::bfloat16, braid::detail::bfloat16_format> {};
