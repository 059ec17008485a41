// A build without CUDA (no nvcc, or a torch without CUDA): device_of() refuses CUDA tensors before
// anything here could run, so these only complete the backend's interface.
#include "backend.hpp"
#include "cuda_path.hpp"

#include <stdexcept>

namespace braid_torch {

struct backend::cuda_state {};

bool backend::cuda_built() { return false; }

c10::intrusive_ptr<c10d::Work> backend::submit_cuda(c10d::OpType, const char* what, std::vector<at::Tensor>, bool, at::Device device,
                                                    body_fn) {
  TORCH_CHECK(false, "braid: ", what, ": a tensor on ", device.str(), " was passed, and this build of braid_torch has no CUDA support");
}

void backend::cuda_abort() noexcept {}
void backend::cuda_close() noexcept {}

namespace gpu {
// Never reached: without CUDA no medium has a device (device_of() refuses CUDA tensors first).
[[noreturn]] static void unbuilt() { throw std::logic_error("braid: internal error: the device path was reached in a build without CUDA"); }
class group {};
bool serves(const reduce_plan&) { return false; }
void all_reduce(group&, const reduce_plan&, const void*, void*, void*) { unbuilt(); }
void reduce(group&, const reduce_plan&, const void*, void*, int, void*) { unbuilt(); }
void reduce_scatter(group&, const reduce_plan&, const void*, void*, void*) { unbuilt(); }
void broadcast(group&, void*, std::size_t, int, void*) { unbuilt(); }
void all_gather(group&, const void*, void*, std::size_t, void*) { unbuilt(); }
} // namespace gpu

} // namespace braid_torch
