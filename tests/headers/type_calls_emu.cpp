// Both CUDA communicators with every promised type (type_calls.hpp), compiled by the host compiler
// for the emulated CUDA device (braid::emu: the same kernel text as under nvcc). Compiled, never run.
#include <braid/cuda.cuh>

#include "type_calls.hpp"

namespace braid_type_check {
void cuda_calls(braid::cuda::communicator& c, braid::cuda::process_communicator& p, void* mem, cudaStream_t s) {
  all_types(c, mem, s);
  all_types(p, mem, s);
}
} // namespace braid_type_check
