// braid/core/fp8.hpp — braid::fp8_e4m3 and braid::fp8_e5m2, the OCP 8-bit float formats that NVIDIA
// GPUs implement.
//
//   fp8_e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; the only NaNs are S.1111.111.
//             Max finite 448, min normal 2^-6, min subnormal 2^-9.
//   fp8_e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: ±inf and NaNs.
//             Max finite 57344, min normal 2^-14, min subnormal 2^-16.
//
// Both are 1-byte, trivially copyable, standard-layout value types whose only data member is `bits`.
// Conversions are integer arithmetic: the same bits on host, device and in constant evaluation.
//   float/double -> fp8: round to nearest, ties to even, in one step; saturating, as CUDA's
//     __NV_SATFINITE conversions: a finite value that rounds beyond max finite, and ±inf, become
//     ±max finite; NaN becomes NaN with the same sign (e4m3: S.1111.111 = 0x7f; e5m2: S.11111.10 =
//     0x7e); signed zero is kept; subnormal results are exact.
//   fp8 -> float: exact.
// Arithmetic converts to float, computes and rounds back (so it saturates too); comparisons compare the
// float values (NaN != NaN, +0 == -0).
#pragma once

#include "config.hpp"
#include "float16.hpp"

#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace braid {
namespace detail {
using fp8_e4m3_format = minifloat_format<4, 3, 0x7eu, 0x7eu, 0x7fu, false, false>;
using fp8_e5m2_format = minifloat_format<5, 2, 0x7bu, 0x7bu, 0x7eu, true, false>;
} // namespace detail

struct fp8_e4m3 : detail::float_arithmetic<fp8_e4m3> {
  std::uint8_t bits;
  static constexpr std::uint8_t sign_mask = 0x80u;

  fp8_e4m3() = default;
  BRAID_HD constexpr explicit fp8_e4m3(float f) noexcept
      : bits(static_cast<std::uint8_t>(detail::encode<detail::fp8_e4m3_format>(f))) {}
  BRAID_HD constexpr explicit fp8_e4m3(double d) noexcept
      : bits(static_cast<std::uint8_t>(detail::encode<detail::fp8_e4m3_format>(d))) {}

  BRAID_HD static constexpr fp8_e4m3 from_bits(std::uint8_t b) noexcept {
    fp8_e4m3 r;
    r.bits = b;
    return r;
  }

  BRAID_HD constexpr operator float() const noexcept { return detail::decode<detail::fp8_e4m3_format>(bits); }

#if defined(__CUDACC__)
  // Bit copies to and from CUDA's __nv_fp8_e4m3.
  BRAID_HD fp8_e4m3(const __nv_fp8_e4m3& x) noexcept : bits(x.__x) {}
  BRAID_HD operator __nv_fp8_e4m3() const noexcept {
    __nv_fp8_e4m3 r;
    r.__x = bits;
    return r;
  }
#endif
};

struct fp8_e5m2 : detail::float_arithmetic<fp8_e5m2> {
  std::uint8_t bits;
  static constexpr std::uint8_t sign_mask = 0x80u;

  fp8_e5m2() = default;
  BRAID_HD constexpr explicit fp8_e5m2(float f) noexcept
      : bits(static_cast<std::uint8_t>(detail::encode<detail::fp8_e5m2_format>(f))) {}
  BRAID_HD constexpr explicit fp8_e5m2(double d) noexcept
      : bits(static_cast<std::uint8_t>(detail::encode<detail::fp8_e5m2_format>(d))) {}

  BRAID_HD static constexpr fp8_e5m2 from_bits(std::uint8_t b) noexcept {
    fp8_e5m2 r;
    r.bits = b;
    return r;
  }

  BRAID_HD constexpr operator float() const noexcept { return detail::decode<detail::fp8_e5m2_format>(bits); }

#if defined(__CUDACC__)
  // Bit copies to and from CUDA's __nv_fp8_e5m2.
  BRAID_HD fp8_e5m2(const __nv_fp8_e5m2& x) noexcept : bits(x.__x) {}
  BRAID_HD operator __nv_fp8_e5m2() const noexcept {
    __nv_fp8_e5m2 r;
    r.__x = bits;
    return r;
  }
#endif
};

static_assert(sizeof(fp8_e4m3) == 1 && sizeof(fp8_e5m2) == 1);
static_assert(std::is_trivially_copyable_v<fp8_e4m3> && std::is_trivially_copyable_v<fp8_e5m2>);
static_assert(std::is_standard_layout_v<fp8_e4m3> && std::is_standard_layout_v<fp8_e5m2>);

} // namespace braid

template <>
struct std::numeric_limits<braid::fp8_e4m3> : braid::detail::minifloat_limits_base<braid::fp8_e4m3> {
  static constexpr bool has_infinity = false;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = false;
  static constexpr int digits = 4;
  static constexpr int digits10 = 0;
  static constexpr int max_digits10 = 3;
  static constexpr int min_exponent = -5;
  static constexpr int min_exponent10 = -1;
  static constexpr int max_exponent = 9;
  static constexpr int max_exponent10 = 2;
  BRAID_HD static constexpr braid::fp8_e4m3 min() noexcept { return braid::fp8_e4m3::from_bits(0x08u); }
  BRAID_HD static constexpr braid::fp8_e4m3 max() noexcept { return braid::fp8_e4m3::from_bits(0x7eu); }
  BRAID_HD static constexpr braid::fp8_e4m3 lowest() noexcept { return braid::fp8_e4m3::from_bits(0xfeu); }
  BRAID_HD static constexpr braid::fp8_e4m3 epsilon() noexcept { return braid::fp8_e4m3::from_bits(0x20u); }
  BRAID_HD static constexpr braid::fp8_e4m3 round_error() noexcept { return braid::fp8_e4m3::from_bits(0x30u); }
  // No infinity and no signaling NaN: these return +0, as the standard asks.
  BRAID_HD static constexpr braid::fp8_e4m3 infinity() noexcept { return braid::fp8_e4m3::from_bits(0x00u); }
  BRAID_HD static constexpr braid::fp8_e4m3 quiet_NaN() noexcept { return braid::fp8_e4m3::from_bits(0x7fu); }
  BRAID_HD static constexpr braid::fp8_e4m3 signaling_NaN() noexcept { return braid::fp8_e4m3::from_bits(0x00u); }
  BRAID_HD static constexpr braid::fp8_e4m3 denorm_min() noexcept { return braid::fp8_e4m3::from_bits(0x01u); }
};

template <>
struct std::numeric_limits<braid::fp8_e5m2> : braid::detail::minifloat_limits_base<braid::fp8_e5m2> {
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr int digits = 3;
  static constexpr int digits10 = 0;
  static constexpr int max_digits10 = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  BRAID_HD static constexpr braid::fp8_e5m2 min() noexcept { return braid::fp8_e5m2::from_bits(0x04u); }
  BRAID_HD static constexpr braid::fp8_e5m2 max() noexcept { return braid::fp8_e5m2::from_bits(0x7bu); }
  BRAID_HD static constexpr braid::fp8_e5m2 lowest() noexcept { return braid::fp8_e5m2::from_bits(0xfbu); }
  BRAID_HD static constexpr braid::fp8_e5m2 epsilon() noexcept { return braid::fp8_e5m2::from_bits(0x34u); }
  BRAID_HD static constexpr braid::fp8_e5m2 round_error() noexcept { return braid::fp8_e5m2::from_bits(0x38u); }
  BRAID_HD static constexpr braid::fp8_e5m2 infinity() noexcept { return braid::fp8_e5m2::from_bits(0x7cu); }
  BRAID_HD static constexpr braid::fp8_e5m2 quiet_NaN() noexcept { return braid::fp8_e5m2::from_bits(0x7eu); }
  BRAID_HD static constexpr braid::fp8_e5m2 signaling_NaN() noexcept { return braid::fp8_e5m2::from_bits(0x7du); }
  BRAID_HD static constexpr braid::fp8_e5m2 denorm_min() noexcept { return braid::fp8_e5m2::from_bits(0x01u); }
};
