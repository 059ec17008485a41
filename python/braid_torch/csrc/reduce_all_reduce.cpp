// The typed all_reduce: one instantiation of braid::communicator::all_reduce per type and operator.
#include "dispatch.hpp"
#include "types.hpp"

namespace braid_torch {

void typed_all_reduce(braid::communicator& c, const reduce_plan& p, const void* in, void* out) {
  detail::with_type_op(p, [&](auto* type, auto op) {
    using T = std::remove_pointer_t<decltype(type)>;
    c.all_reduce(static_cast<const T*>(in), static_cast<T*>(out), p.count, op);
  });
}

} // namespace braid_torch
