// The step between hosts: every host's partial result, reduced in host order in the accumulator type,
// so every host computes the same bits from the same blocks.
#include "dispatch.hpp"
#include "types.hpp"

namespace braid_torch {

void typed_combine(const reduce_plan& p, const void* blocks, std::size_t parts, void* out, int divisor) {
  detail::with_type_op(p, [&](auto* type, auto op) {
    using T = std::remove_pointer_t<decltype(type)>;
    using Op = decltype(op);
    using A = braid::accumulator_t<T, Op>;
    const T* b = static_cast<const T*>(blocks);
    T* o = static_cast<T*>(out);
    for (std::size_t i = 0; i < p.count; ++i) {
      A acc = static_cast<A>(b[i]);
      for (std::size_t h = 1; h < parts; ++h) acc = op(acc, static_cast<A>(b[h * p.count + i]));
      if constexpr (braid::has_finalize<Op, A>) acc = op.finalize(acc, divisor);
      o[i] = static_cast<T>(acc);
    }
  });
}

void typed_scale(const reduce_plan& p, const void* in, void* out) {
  braid::visit(p.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = braid::default_accumulator_t<T>;
    const T* i = static_cast<const T*>(in);
    T* o = static_cast<T*>(out);
    const A f = static_cast<A>(p.factor);
    for (std::size_t k = 0; k < p.count; ++k) o[k] = static_cast<T>(static_cast<A>(i[k]) * f);
  });
}

} // namespace braid_torch
