// The collectives of CUDA tensors over braid::cuda::process_communicator (see cuda_path.hpp).
#include "cuda_path.hpp"
#include "dispatch.hpp"

#include <stdexcept>
#include <string>
#include <type_traits>

#include <braid/cuda/process/communicator.cuh>

namespace braid_torch::gpu {

class group {
public:
  group(braid::communicator host, int device, std::chrono::milliseconds timeout) : comm(std::move(host), device, options(timeout)) {}
  braid::cuda::process_communicator comm;

private:
  static braid::cuda::process_options options(std::chrono::milliseconds timeout) {
    braid::cuda::process_options o;
    if (timeout.count() > 0) o.base.timeout = timeout;
    return o;
  }
};

std::shared_ptr<group> join(braid::communicator host, int device, std::chrono::milliseconds timeout) {
  return std::make_shared<group>(std::move(host), device, timeout);
}

namespace {

// f(T*, Op) for the types and operators the device path instantiates (serves()).
template <class F> void with_type_op(const reduce_plan& p, F&& f) {
  using detail::with_op;
  switch (p.type) {
  case braid::dtype::float32: return with_op<float, false>(p.op, f);
  case braid::dtype::float64: return with_op<double, false>(p.op, f);
  case braid::dtype::float16: return with_op<braid::half, false>(p.op, f);
  case braid::dtype::bfloat16: return with_op<braid::bfloat16, false>(p.op, f);
  case braid::dtype::int32: return with_op<std::int32_t, false>(p.op, f);
  case braid::dtype::int64: return with_op<std::int64_t, false>(p.op, f);
  case braid::dtype::uint8: return with_op<std::uint8_t, false>(p.op, f);
  default: break;
  }
  throw std::logic_error("braid: internal error: a type the device path does not serve reached it");
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

} // namespace

bool serves(const reduce_plan& p) {
  if (p.premul) return false;
  switch (p.op) {
  case reduction::sum: case reduction::avg: case reduction::prod: case reduction::min: case reduction::max: break;
  default: return false;
  }
  switch (p.type) {
  case braid::dtype::float32: case braid::dtype::float64: case braid::dtype::float16: case braid::dtype::bfloat16:
  case braid::dtype::int32: case braid::dtype::int64: case braid::dtype::uint8: return true;
  default: return false;
  }
}

void all_reduce(group& g, const reduce_plan& p, const void* in, void* out, void* stream) {
  with_type_op(p, [&](auto* type, auto op) {
    using T = std::remove_pointer_t<decltype(type)>;
    g.comm.all_reduce(static_cast<const T*>(in), static_cast<T*>(out), p.count, op, as_stream(stream));
  });
}

void reduce(group& g, const reduce_plan& p, const void* in, void* out, int root, void* stream) {
  with_type_op(p, [&](auto* type, auto op) {
    using T = std::remove_pointer_t<decltype(type)>;
    g.comm.reduce(static_cast<const T*>(in), static_cast<T*>(out), p.count, root, op, as_stream(stream));
  });
}

void reduce_scatter(group& g, const reduce_plan& p, const void* in, void* out, void* stream) {
  with_type_op(p, [&](auto* type, auto op) {
    using T = std::remove_pointer_t<decltype(type)>;
    g.comm.reduce_scatter(static_cast<const T*>(in), static_cast<T*>(out), p.count, op, as_stream(stream));
  });
}

void broadcast(group& g, void* data, std::size_t bytes, int root, void* stream) {
  auto* b = static_cast<std::uint8_t*>(data);
  g.comm.broadcast(b, b, bytes, root, as_stream(stream));
}

void all_gather(group& g, const void* in, void* out, std::size_t bytes, void* stream) {
  g.comm.all_gather(static_cast<const std::uint8_t*>(in), static_cast<std::uint8_t*>(out), bytes, as_stream(stream));
}

void abort(group& g) noexcept {
  try {
    g.comm.abort();
  } catch (...) {
  }
}

} // namespace braid_torch::gpu
