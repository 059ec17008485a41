// braid/core/types.hpp — element types: the run-time tag (dtype), compile-time traits and the default
// accumulator used when reducing each type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "config.hpp"
#include "float16.hpp"
#include "fp8.hpp"

namespace braid {

// Run-time tag of the element types braid knows by name. Names follow nccl-tests' -d flag.
enum class dtype : std::uint8_t {
  int8, uint8, int16, uint16, int32, uint32, int64, uint64,
  float16, bfloat16, float32, float64, fp8_e4m3, fp8_e5m2,
  custom, // any other trivially copyable type, reduced by a user functor
};

inline constexpr dtype all_dtypes[] = {dtype::int8,    dtype::uint8,    dtype::int16,   dtype::uint16,
                                       dtype::int32,   dtype::uint32,   dtype::int64,   dtype::uint64,
                                       dtype::float16, dtype::bfloat16, dtype::float32, dtype::float64,
                                       dtype::fp8_e4m3, dtype::fp8_e5m2};

namespace detail {
struct dtype_name {
  std::string_view n;
  dtype t;
};
// The names of the element types: nccl-tests' -d names and a few aliases. A type's first name here is
// the one name() gives it.
inline constexpr dtype_name dtype_names[] = {
    {"int8", dtype::int8},       {"char", dtype::int8},        {"uint8", dtype::uint8},
    {"int16", dtype::int16},     {"uint16", dtype::uint16},    {"int32", dtype::int32},
    {"int", dtype::int32},       {"uint32", dtype::uint32},    {"int64", dtype::int64},
    {"uint64", dtype::uint64},   {"half", dtype::float16},     {"float16", dtype::float16},
    {"fp16", dtype::float16},    {"bfloat16", dtype::bfloat16}, {"bf16", dtype::bfloat16},
    {"float", dtype::float32},   {"float32", dtype::float32},  {"fp32", dtype::float32},
    {"double", dtype::float64},  {"float64", dtype::float64},  {"fp64", dtype::float64},
    {"f8e4m3", dtype::fp8_e4m3}, {"fp8_e4m3", dtype::fp8_e4m3}, {"f8e5m2", dtype::fp8_e5m2},
    {"fp8_e5m2", dtype::fp8_e5m2}};
} // namespace detail

constexpr std::string_view name(dtype t) noexcept {
  if (t == dtype::custom) return "custom";
  for (const detail::dtype_name& a : detail::dtype_names)
    if (a.t == t) return a.n;
  return "?";
}
namespace detail {
constexpr bool every_dtype_named() noexcept {
  for (dtype t : all_dtypes)
    if (name(t) == "?") return false;
  return true;
}
static_assert(every_dtype_named(), "every dtype has a name in detail::dtype_names");
} // namespace detail

// Parses nccl-tests' names (and a few aliases); returns false for an unknown name.
constexpr bool parse_dtype(std::string_view s, dtype& out) noexcept {
  for (const detail::dtype_name& a : detail::dtype_names)
    if (a.n == s) { out = a.t; return true; }
  return false;
}

constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
  case dtype::int8: case dtype::uint8: case dtype::fp8_e4m3: case dtype::fp8_e5m2: return 1;
  case dtype::int16: case dtype::uint16: case dtype::float16: case dtype::bfloat16: return 2;
  case dtype::int32: case dtype::uint32: case dtype::float32: return 4;
  case dtype::int64: case dtype::uint64: case dtype::float64: return 8;
  case dtype::custom: return 0;
  }
  return 0;
}

template <class T> struct dtype_of : std::integral_constant<dtype, dtype::custom> {};
#define BRAID_DTYPE_OF(T, tag) template <> struct dtype_of<T> : std::integral_constant<dtype, dtype::tag> {};
BRAID_DTYPE_OF(std::int8_t, int8)
BRAID_DTYPE_OF(std::uint8_t, uint8)
BRAID_DTYPE_OF(std::int16_t, int16)
BRAID_DTYPE_OF(std::uint16_t, uint16)
BRAID_DTYPE_OF(std::int32_t, int32)
BRAID_DTYPE_OF(std::uint32_t, uint32)
BRAID_DTYPE_OF(std::int64_t, int64)
BRAID_DTYPE_OF(std::uint64_t, uint64)
BRAID_DTYPE_OF(half, float16)
BRAID_DTYPE_OF(bfloat16, bfloat16)
BRAID_DTYPE_OF(float, float32)
BRAID_DTYPE_OF(double, float64)
BRAID_DTYPE_OF(fp8_e4m3, fp8_e4m3)
BRAID_DTYPE_OF(fp8_e5m2, fp8_e5m2)
#undef BRAID_DTYPE_OF
template <class T> inline constexpr dtype dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

// Maps a dtype back to its C++ type: visit(t, f) calls f(type_tag<T>{}) for the matching T.
template <class T> struct type_tag { using type = T; };
template <class F> constexpr decltype(auto) visit(dtype t, F&& f) {
  switch (t) {
  case dtype::int8: return f(type_tag<std::int8_t>{});
  case dtype::uint8: return f(type_tag<std::uint8_t>{});
  case dtype::int16: return f(type_tag<std::int16_t>{});
  case dtype::uint16: return f(type_tag<std::uint16_t>{});
  case dtype::int32: return f(type_tag<std::int32_t>{});
  case dtype::uint32: return f(type_tag<std::uint32_t>{});
  case dtype::int64: return f(type_tag<std::int64_t>{});
  case dtype::uint64: return f(type_tag<std::uint64_t>{});
  case dtype::float16: return f(type_tag<half>{});
  case dtype::bfloat16: return f(type_tag<bfloat16>{});
  case dtype::float32: return f(type_tag<float>{});
  case dtype::float64: return f(type_tag<double>{});
  case dtype::fp8_e4m3: return f(type_tag<fp8_e4m3>{});
  case dtype::fp8_e5m2: case dtype::custom: break;
  }
  return f(type_tag<fp8_e5m2>{});
}

// An element is anything trivially copyable: braid moves bytes and reduces them with a functor.
template <class T>
concept element = std::is_trivially_copyable_v<T> && !std::is_const_v<T> && !std::is_volatile_v<T>;

template <class T>
inline constexpr bool is_low_precision_float_v =
    std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, fp8_e4m3> ||
    std::is_same_v<T, fp8_e5m2>;

// The type reductions of T accumulate in unless the operator asks for another: float for the 8- and
// 16-bit float types (so bf16 sums do not lose bits at every addition), T itself otherwise.
template <class T>
using default_accumulator_t = std::conditional_t<is_low_precision_float_v<T>, float, T>;

} // namespace braid
