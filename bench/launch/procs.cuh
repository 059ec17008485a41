// bench/launch/procs.cuh — the typed half of launch_procs.cu: the process communicator and stream behind
// launch_procs.hpp's `comm`, and run_typed, which calls one collective for one element type and
// operator. Included by launch_procs.cu and by the two files that instantiate run_typed:
// launch_procs_narrow.cu (the 8 integer types and both fp8 types with sum) and launch_procs_wide.cu
// (half, bfloat16, float and double with sum; float with prod, min, max and avg). Under nvcc those two
// are compiled in one translation unit with launch_sum.cu and launch_float.cu respectively
// (launch.cmake), which instantiate the same kernels for the one-process group: each kernel is then
// compiled once, not twice.
#pragma once

#include "launch_procs.hpp"

#include <braid/cuda.cuh>

namespace braid::gpu_procs {

struct comm {
  braid::cuda::process_communicator pc;
  cudaStream_t stream = nullptr;
  comm() = default;
  comm(const comm&) = delete;
  comm& operator=(const comm&) = delete;
  ~comm() {
    // Close first: a failed communicator's close waits for its last call's stream, which must still
    // be alive then.
    pc = braid::cuda::process_communicator{};
    if (stream) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }
};

namespace detail {

template <class T, class Op> void run_typed(comm& c, const gpu_launch::call& k, Op op) {
  const T* in = static_cast<const T*>(k.in);
  T* out = static_cast<T*>(k.out);
  const call_options co{k.algorithm};
  switch (k.coll) {
  case collective::all_reduce: c.pc.all_reduce(in, out, k.count, op, c.stream, co); return;
  case collective::reduce_scatter: c.pc.reduce_scatter(in, out, k.count, op, c.stream, co); return;
  case collective::reduce: c.pc.reduce(in, out, k.count, k.root, op, c.stream, co); return;
  case collective::all_gather: c.pc.all_gather(in, out, k.count, c.stream, co); return;
  case collective::broadcast: c.pc.broadcast(in, out, k.count, k.root, c.stream, co); return;
  default: raise(errc::unsupported, "gpu_procs::run: not a collective of the communicator");
  }
}

// True when the call's type and operator are the file's: launch_procs_narrow.cu, launch_procs_wide.cu.
bool enqueue_narrow(comm& c, const gpu_launch::call& k);
bool enqueue_wide(comm& c, const gpu_launch::call& k);

// Whether the call reduces (then its operator picks the kernel) or only moves data (any operator: sum's).
inline bool reduces(const gpu_launch::call& k) {
  return k.coll == collective::all_reduce || k.coll == collective::reduce_scatter || k.coll == collective::reduce;
}

} // namespace detail
} // namespace braid::gpu_procs
