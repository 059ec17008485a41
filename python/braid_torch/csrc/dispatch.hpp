// braid_torch/csrc/dispatch.hpp — calls f(T*, Op) for a plan's element type and operator. Only the
// combinations plan_reduction accepts are instantiated: bitwise operators for integers only. Free of
// torch's headers: nvcc's translation unit (cuda_path.cu) uses with_op too.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>

#include <braid/core/ops.hpp>

#include "plan.hpp"

namespace braid_torch::detail {

struct bit_and {
  template <class A> constexpr A operator()(const A& a, const A& b) const { return static_cast<A>(a & b); }
};
struct bit_or {
  template <class A> constexpr A operator()(const A& a, const A& b) const { return static_cast<A>(a | b); }
};
struct bit_xor {
  template <class A> constexpr A operator()(const A& a, const A& b) const { return static_cast<A>(a ^ b); }
};

// bitwise = false: the five arithmetic operators only (the device path's kernels).
template <class T, bool bitwise = true, class F> void with_op(reduction r, F&& f) {
  switch (r) {
  case reduction::sum: return f(static_cast<T*>(nullptr), braid::sum<>{});
  case reduction::avg: return f(static_cast<T*>(nullptr), braid::avg<>{});
  case reduction::prod: return f(static_cast<T*>(nullptr), braid::prod<>{});
  case reduction::min: return f(static_cast<T*>(nullptr), braid::min<>{});
  case reduction::max: return f(static_cast<T*>(nullptr), braid::max<>{});
  case reduction::band: case reduction::bor: case reduction::bxor:
    if constexpr (bitwise && std::is_integral_v<T>) {
      if (r == reduction::band) return f(static_cast<T*>(nullptr), bit_and{});
      if (r == reduction::bor) return f(static_cast<T*>(nullptr), bit_or{});
      return f(static_cast<T*>(nullptr), bit_xor{});
    }
    break;
  }
  throw std::logic_error(std::string("braid: internal error: operator ") + name(r) + " reached a type it was not planned for");
}

template <class F> void with_type_op(const reduce_plan& p, F&& f) {
  braid::visit(p.type, [&](auto tag) { with_op<typename decltype(tag)::type>(p.op, f); });
}

} // namespace braid_torch::detail
