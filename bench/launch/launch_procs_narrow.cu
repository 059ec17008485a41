// bench/launch/launch_procs_narrow.cu — braid::cuda::process_communicator's collectives for the 8 integer
// types and both fp8 types with braid::sum (procs.cuh). Under nvcc it shares a translation unit with
// launch_sum.cu, which instantiates the same kernels for the one-process group (launch.cmake).
#include "procs.cuh"

#include <cstdint>

namespace braid::gpu_procs::detail {

bool enqueue_narrow(comm& c, const gpu_launch::call& k) {
  if (k.op != op_kind::sum && reduces(k)) return false;
  switch (k.type) {
  case dtype::int8: run_typed<std::int8_t>(c, k, sum<>{}); return true;
  case dtype::uint8: run_typed<std::uint8_t>(c, k, sum<>{}); return true;
  case dtype::int16: run_typed<std::int16_t>(c, k, sum<>{}); return true;
  case dtype::uint16: run_typed<std::uint16_t>(c, k, sum<>{}); return true;
  case dtype::int32: run_typed<std::int32_t>(c, k, sum<>{}); return true;
  case dtype::uint32: run_typed<std::uint32_t>(c, k, sum<>{}); return true;
  case dtype::int64: run_typed<std::int64_t>(c, k, sum<>{}); return true;
  case dtype::uint64: run_typed<std::uint64_t>(c, k, sum<>{}); return true;
  case dtype::fp8_e4m3: run_typed<fp8_e4m3>(c, k, sum<>{}); return true;
  case dtype::fp8_e5m2: run_typed<fp8_e5m2>(c, k, sum<>{}); return true;
  default: return false;
  }
}

} // namespace braid::gpu_procs::detail
