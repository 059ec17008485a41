// bench/launch/group.cuh — the test's group (shared by the two .cu files behind launch.hpp).
#pragma once

#include <braid/cuda.cuh>

#include <vector>

#include "launch.hpp"

namespace braid::gpu_launch {

struct group {
  std::vector<braid::cuda::communicator> comms;
  std::vector<cudaStream_t> streams;
  group() = default;
  group(const group&) = delete;
  group& operator=(const group&) = delete;
  ~group() {
    // Streams go first (after any work on them is done); the communicators free their memory last.
    for (std::size_t r = 0; r < streams.size(); ++r) {
      cudaSetDevice(comms[r].device());
      cudaStreamSynchronize(streams[r]);
      cudaStreamDestroy(streams[r]);
    }
  }
};

// Runs rank's collective for element type T and operator Op (only the collectives that take one).
template <class T, class Op> void enqueue_typed(group& g, int rank, const call& c, Op op) {
  braid::cuda::communicator& comm = g.comms.at(static_cast<std::size_t>(rank));
  cudaStream_t s = c.stream ? static_cast<cudaStream_t>(c.stream) : g.streams.at(static_cast<std::size_t>(rank));
  const call_options co{c.algorithm};
  const T* in = static_cast<const T*>(c.in);
  T* out = static_cast<T*>(c.out);
  switch (c.coll) {
  case collective::all_reduce: comm.all_reduce(in, out, c.count, op, s, co); return;
  case collective::reduce_scatter: comm.reduce_scatter(in, out, c.count, op, s, co); return;
  case collective::reduce: comm.reduce(in, out, c.count, c.root, op, s, co); return;
  default: raise(errc::internal, "enqueue_typed: not a reduction");
  }
}

} // namespace braid::gpu_launch
