// Both CUDA communicators with every promised type (type_calls.hpp), compiled by the host compiler
// for the emulated CUDA device (braid::emu: the same kernel text as under nvcc), and, where braid::mpi
// exists (BRAID_TYPE_CALLS_MPI, set by tests/headers/CMakeLists.txt), braid::mpi::cuda_communicator
// too: in this one translation unit the kernels it shares with the CUDA communicators are instantiated
// once. Compiled, never run.
#include <braid/cuda.cuh>
#if BRAID_TYPE_CALLS_MPI
#include <braid/mpi/cuda.cuh>
#endif

#include "type_calls.hpp"

namespace braid_type_check {
void cuda_calls(braid::cuda::communicator& c, braid::cuda::process_communicator& p, void* mem, cudaStream_t s) {
  all_types(c, mem, s);
  all_types(p, mem, s);
  // Point to point on the one-process group: any trivially copyable type.
  c.send(static_cast<const float*>(mem), 1, 1, s);
  c.recv(static_cast<float*>(mem), 1, 1, s);
  c.send(static_cast<std::int8_t*>(mem), 1, 1, s);
  c.recv(static_cast<braid::half*>(mem), 1, 1, s);
  c.send(static_cast<rgb*>(mem), 1, 1, s);
  c.recv(static_cast<val_idx*>(mem), 1, 1, s);
}
#if BRAID_TYPE_CALLS_MPI
void mpi_cuda_calls(braid::mpi::cuda_communicator& c, void* mem, cudaStream_t s) { all_types(c, mem, s); }
#endif
} // namespace braid_type_check
