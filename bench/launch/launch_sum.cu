// bench/launch/launch_sum.cu — all_reduce with braid::sum for the 8 integer types and both fp8 types,
// every algorithm (10 x 6 kernels). The other half of the instantiations is in launch_float.cu; the
// split balances nvcc time so the two compile in parallel on CI's 2 cores.
#include "group.cuh"

#include <cstdint>

namespace braid::gpu_launch::detail {

bool enqueue_sum_narrow(group& g, int rank, const call& c) {
  if (c.coll != collective::all_reduce || c.op != op_kind::sum) return false;
  switch (c.type) {
  case dtype::int8: enqueue_typed<std::int8_t>(g, rank, c, sum<>{}); return true;
  case dtype::uint8: enqueue_typed<std::uint8_t>(g, rank, c, sum<>{}); return true;
  case dtype::int16: enqueue_typed<std::int16_t>(g, rank, c, sum<>{}); return true;
  case dtype::uint16: enqueue_typed<std::uint16_t>(g, rank, c, sum<>{}); return true;
  case dtype::int32: enqueue_typed<std::int32_t>(g, rank, c, sum<>{}); return true;
  case dtype::uint32: enqueue_typed<std::uint32_t>(g, rank, c, sum<>{}); return true;
  case dtype::int64: enqueue_typed<std::int64_t>(g, rank, c, sum<>{}); return true;
  case dtype::uint64: enqueue_typed<std::uint64_t>(g, rank, c, sum<>{}); return true;
  case dtype::fp8_e4m3: enqueue_typed<fp8_e4m3>(g, rank, c, sum<>{}); return true;
  case dtype::fp8_e5m2: enqueue_typed<fp8_e5m2>(g, rank, c, sum<>{}); return true;
  default: return false;
  }
}

} // namespace braid::gpu_launch::detail
