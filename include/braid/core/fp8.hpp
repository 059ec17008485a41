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
#if defined(__CUDACC__)
using cuda_fp8_e4m3 = __nv_fp8_e4m3;
using cuda_fp8_e5m2 = __nv_fp8_e5m2;
#else
using cuda_fp8_e4m3 = no_cuda_twin;
using cuda_fp8_e5m2 = no_cuda_twin;
#endif
} // namespace detail

struct fp8_e4m3 : detail::minifloat_value<fp8_e4m3, detail::fp8_e4m3_format, std::uint8_t, detail::cuda_fp8_e4m3> {
  using minifloat_value::minifloat_value;
  fp8_e4m3() = default;
};

struct fp8_e5m2 : detail::minifloat_value<fp8_e5m2, detail::fp8_e5m2_format, std::uint8_t, detail::cuda_fp8_e5m2> {
  using minifloat_value::minifloat_value;
  fp8_e5m2() = default;
};

static_assert(sizeof(fp8_e4m3) == 1 && sizeof(fp8_e5m2) == 1);
static_assert(std::is_trivially_copyable_v<fp8_e4m3> && std::is_trivially_copyable_v<fp8_e5m2>);
static_assert(std::is_standard_layout_v<fp8_e4m3> && std::is_standard_layout_v<fp8_e5m2>);

} // namespace braid

template <>
struct std::numeric_limits<braid::fp8_e4m3>
    : braid::detail::minifloat_limits<braid::fp8_e4m3, braid::detail::fp8_e4m3_format> {};
template <>
struct std::numeric_limits<braid::fp8_e5m2>
    : braid::detail::minifloat_limits<braid::fp8_e5m2, braid::detail::fp8_e5m2_format> {};
