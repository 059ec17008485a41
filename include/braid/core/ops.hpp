// braid/core/ops.hpp — reduction operators.
//
// An operator is any type with a const call operator `A operator()(const A&, const A&)` callable on
// the host (and, for the CUDA backend, on the device: mark it BRAID_HD or __host__ __device__) for its
// accumulator type A. It must be associative and commutative up to rounding; braid fixes the order
// of every reduction so that all ranks get identical bits whatever the operator. Optional members:
//   using accumulator_type = A;           // reduce in A (e.g. float for bf16 data); void = default
//   A finalize(const A& x, int nranks) const;  // applied once to each fully reduced value (avg)
// Elements are converted T -> A when loaded and A -> T when stored (static_cast). Built-ins: sum,
// prod, min, max, avg, each templated on the accumulator (void picks default_accumulator_t<T>).
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "config.hpp"
#include "types.hpp"

namespace braid {

enum class op_kind : std::uint8_t { sum, prod, min, max, avg, custom };

namespace detail {
struct op_name {
  op_kind k;
  std::string_view n;
};
// Every operator kind's name; parse_op reads those of the built-in ones (all but custom).
inline constexpr op_name op_names[] = {{op_kind::sum, "sum"}, {op_kind::prod, "prod"}, {op_kind::min, "min"},
                                       {op_kind::max, "max"}, {op_kind::avg, "avg"},   {op_kind::custom, "custom"}};
} // namespace detail

constexpr std::string_view name(op_kind k) noexcept {
  for (const detail::op_name& o : detail::op_names)
    if (o.k == k) return o.n;
  return "?";
}
namespace detail {
constexpr bool every_op_kind_named() noexcept {
  for (int k = 0; k <= int(op_kind::custom); ++k)
    if (name(op_kind(k)) == "?") return false;
  return true;
}
static_assert(every_op_kind_named(), "every op_kind has a name in detail::op_names");
} // namespace detail

constexpr bool parse_op(std::string_view s, op_kind& out) noexcept {
  for (const detail::op_name& o : detail::op_names)
    if (o.k != op_kind::custom && o.n == s) { out = o.k; return true; }
  return false;
}

namespace detail {
// Signed overflow is undefined in C++; integer sums and products wrap modulo 2^bits instead, which
// keeps them exact, associative and commutative (so any reduction order gives the same bits).
template <class A> BRAID_HD constexpr A wrap_add(const A& a, const A& b) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(a + b);
  } else {
    return a + b;
  }
}
template <class A> BRAID_HD constexpr A wrap_mul(const A& a, const A& b) {
  if constexpr (std::is_integral_v<A>) {
    // Promote through unsigned of at least int width: uint16*uint16 would overflow int otherwise.
    using U = std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}
} // namespace detail

template <class Acc = void> struct sum {
  using accumulator_type = Acc;
  static constexpr op_kind kind = op_kind::sum;
  template <class A> BRAID_HD constexpr A operator()(const A& a, const A& b) const { return detail::wrap_add(a, b); }
};

template <class Acc = void> struct prod {
  using accumulator_type = Acc;
  static constexpr op_kind kind = op_kind::prod;
  template <class A> BRAID_HD constexpr A operator()(const A& a, const A& b) const { return detail::wrap_mul(a, b); }
};

// min/max return the first argument unless the second compares strictly smaller/greater: with a NaN
// the result depends on position, but the position is fixed, so all ranks still agree bit for bit.
template <class Acc = void> struct min {
  using accumulator_type = Acc;
  static constexpr op_kind kind = op_kind::min;
  template <class A> BRAID_HD constexpr A operator()(const A& a, const A& b) const { return b < a ? b : a; }
};

template <class Acc = void> struct max {
  using accumulator_type = Acc;
  static constexpr op_kind kind = op_kind::max;
  template <class A> BRAID_HD constexpr A operator()(const A& a, const A& b) const { return a < b ? b : a; }
};

// Sum, then one division by the number of ranks (integers: truncating toward zero).
template <class Acc = void> struct avg {
  using accumulator_type = Acc;
  static constexpr op_kind kind = op_kind::avg;
  template <class A> BRAID_HD constexpr A operator()(const A& a, const A& b) const { return detail::wrap_add(a, b); }
  template <class A> BRAID_HD constexpr A finalize(const A& x, int nranks) const {
    if constexpr (std::is_integral_v<A> && std::is_signed_v<A>)
      return static_cast<A>(static_cast<long long>(x) / nranks); // nranks may not fit A
    else if constexpr (std::is_integral_v<A>)
      return static_cast<A>(static_cast<unsigned long long>(x) / static_cast<unsigned>(nranks));
    else if constexpr (std::is_floating_point_v<A>) return x / static_cast<A>(nranks);
    else return static_cast<A>(static_cast<float>(x) / static_cast<float>(nranks));
  }
};

namespace detail {
// Passed where a collective only moves data (broadcast, all_gather): it reduces nothing, so it works
// for any element type, including user structs with no arithmetic.
struct copy_only {
  static constexpr op_kind kind = op_kind::custom;
};
} // namespace detail

// Deduction guides let users write braid::sum{} for the default accumulator.
sum() -> sum<void>;
prod() -> prod<void>;
min() -> min<void>;
max() -> max<void>;
avg() -> avg<void>;

namespace detail {
template <class Op, class = void> struct op_acc { using type = void; };
template <class Op> struct op_acc<Op, std::void_t<typename Op::accumulator_type>> {
  using type = typename Op::accumulator_type;
};
template <class Op, class = void> struct op_kind_of : std::integral_constant<op_kind, op_kind::custom> {};
template <class Op> struct op_kind_of<Op, std::void_t<decltype(Op::kind)>>
    : std::integral_constant<op_kind, Op::kind> {};
} // namespace detail

// The accumulator type a reduction of T with Op uses.
template <class T, class Op>
using accumulator_t = std::conditional_t<std::is_void_v<typename detail::op_acc<Op>::type>,
                                         default_accumulator_t<T>, typename detail::op_acc<Op>::type>;

template <class Op> inline constexpr op_kind op_kind_v = detail::op_kind_of<Op>::value;

template <class Op, class A>
concept has_finalize = requires(const Op& op, const A& a) {
  { op.finalize(a, 1) } -> std::convertible_to<A>;
};

// What the library requires of an operator for element type T (checked where a reduction is called,
// so a bad functor fails with this sentence rather than deep inside a kernel).
template <class Op, class T>
concept reduction_for = element<T> && std::is_trivially_copyable_v<Op> &&
    requires(const Op& op, const accumulator_t<T, Op>& a, const T& t) {
      { op(a, a) } -> std::convertible_to<accumulator_t<T, Op>>;
      static_cast<accumulator_t<T, Op>>(t);
      static_cast<T>(a);
    };

// Runs f(op) with the built-in operator object for a run-time op_kind (benchmarks, tests).
template <class F> constexpr decltype(auto) visit(op_kind k, F&& f) {
  switch (k) {
  case op_kind::prod: return f(prod<>{});
  case op_kind::min: return f(min<>{});
  case op_kind::max: return f(max<>{});
  case op_kind::avg: return f(avg<>{});
  case op_kind::sum: case op_kind::custom: break;
  }
  return f(sum<>{});
}

} // namespace braid
