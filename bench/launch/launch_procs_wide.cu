// bench/launch/launch_procs_wide.cu — braid::cuda::process_communicator's collectives for half, bfloat16,
// float and double with braid::sum, and float with prod, min, max and avg (procs.cuh). Under nvcc it
// shares a translation unit with launch_float.cu, which instantiates the same kernels for the
// one-process group (launch.cmake).
#include "procs.cuh"

namespace braid::gpu_procs::detail {

bool enqueue_wide(comm& c, const gpu_launch::call& k) {
  if (k.op == op_kind::sum || !reduces(k)) {
    switch (k.type) {
    case dtype::float16: run_typed<half>(c, k, sum<>{}); return true;
    case dtype::bfloat16: run_typed<bfloat16>(c, k, sum<>{}); return true;
    case dtype::float32: run_typed<float>(c, k, sum<>{}); return true;
    case dtype::float64: run_typed<double>(c, k, sum<>{}); return true;
    default: return false;
    }
  }
  if (k.type != dtype::float32) return false;
  switch (k.op) {
  case op_kind::prod: run_typed<float>(c, k, prod<>{}); return true;
  case op_kind::min: run_typed<float>(c, k, min<>{}); return true;
  case op_kind::max: run_typed<float>(c, k, max<>{}); return true;
  case op_kind::avg: run_typed<float>(c, k, avg<>{}); return true;
  default: return false;
  }
}

} // namespace braid::gpu_procs::detail
