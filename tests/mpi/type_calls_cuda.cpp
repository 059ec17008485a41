// braid::mpi::cuda_communicator with every promised type (tests/headers/type_calls.hpp: api.md's
// promises), compiled by the host compiler for braid's emulated CUDA device (braid::mpi + braid::emu,
// the same kernel text as under nvcc). Compiled, never run (braid_mpi_cuda_header_check).
#include <braid/mpi/cuda.cuh>

#include "../headers/type_calls.hpp"

namespace braid_type_check {
void mpi_cuda_calls(braid::mpi::cuda_communicator& c, void* mem, cudaStream_t s) { all_types(c, mem, s); }
} // namespace braid_type_check
