// The typed reduce and reduce_scatter.
#include "dispatch.hpp"
#include "types.hpp"

namespace braid_torch {

void typed_reduce(braid::communicator& c, const reduce_plan& p, const void* in, void* out, int root) {
  detail::with_type_op(p, [&](auto* type, auto op) {
    using T = std::remove_pointer_t<decltype(type)>;
    c.reduce(static_cast<const T*>(in), static_cast<T*>(out), p.count, root, op);
  });
}

void typed_reduce_scatter(braid::communicator& c, const reduce_plan& p, const void* in, void* out) {
  detail::with_type_op(p, [&](auto* type, auto op) {
    using T = std::remove_pointer_t<decltype(type)>;
    c.reduce_scatter(static_cast<const T*>(in), static_cast<T*>(out), p.count, op);
  });
}

} // namespace braid_torch
