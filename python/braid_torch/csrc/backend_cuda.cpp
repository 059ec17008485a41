// The CUDA side of the backend (built with nvcc beside cuda_path.cu): the backend's stream on the
// rank's device, the join of the host's ranks on it, and the operations of CUDA tensors.
#include "backend.hpp"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda_path.hpp"

namespace braid_torch {

struct backend::cuda_state {
  int device = -1;
  std::optional<c10::cuda::CUDAStream> stream; // the backend's, on `device`
  std::mutex m;                                // guards group against abort() from another thread
  std::shared_ptr<gpu::group> group;           // the host's ranks on their devices (one host only)
};

bool backend::cuda_built() { return true; }

c10::intrusive_ptr<c10d::Work> backend::submit_cuda(c10d::OpType type, const char* what, std::vector<at::Tensor> outputs, bool async_op,
                                                    at::Device device, body_fn body) {
  const int dev = device.index();
  if (!cuda_) {
    auto st = std::make_shared<cuda_state>();
    st->device = dev;
    st->stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(dev));
    cuda_ = std::move(st);
  }
  TORCH_CHECK(cuda_->device == dev, "braid: ", what, ": this group's CUDA operations run on cuda:", cuda_->device, "; a tensor on ",
              device.str(), " was passed (one device per rank and group)");
  // The backend's stream starts the operation once the caller's stream has reached this point.
  auto ready = std::make_shared<at::cuda::CUDAEvent>();
  ready->record(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(dev)));
  auto st = cuda_;
  return enqueue(type, what, std::move(outputs), async_op, st->stream->unwrap(), [this, st, ready, body = std::move(body), dev] {
    c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(dev));
    c10::cuda::CUDAStreamGuard on_stream(*st->stream); // torch's own steps (copies, cat) run there too
    ready->block(*st->stream);
    medium m{*this};
    m.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(dev));
    m.stream = st->stream->stream();
    if (map_.hosts == 1) {
      std::shared_ptr<gpu::group> g;
      {
        std::lock_guard<std::mutex> lk(st->m);
        g = st->group;
      }
      if (!g) {
        // The group's first CUDA operation: every rank of the host joins here, in the same call.
        const std::string key = "braid/cuda-uid/" + std::to_string(host_);
        g = gpu::join(join_through_store(store_, key, local_rank_, local_size_, braid_options(timeout_, false), timeout_,
                                         "joining the CUDA ranks of host " + std::to_string(host_)),
                      dev, timeout_);
        std::lock_guard<std::mutex> lk(st->m);
        st->group = g;
      }
      m.g = g.get();
    }
    body(m);
    // Complete only once the device has: the Work's wait() and its future then need no event.
    C10_CUDA_CHECK(cudaStreamSynchronize(st->stream->stream()));
  });
}

void backend::cuda_abort() noexcept {
  if (!cuda_) return;
  std::lock_guard<std::mutex> lk(cuda_->m);
  if (cuda_->group) gpu::abort(*cuda_->group);
}

void backend::cuda_close() noexcept {
  if (!cuda_) return;
  try {
    c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(cuda_->device));
    std::lock_guard<std::mutex> lk(cuda_->m);
    cuda_->group.reset(); // collective unless it failed: every rank closes the group together
  } catch (...) {
  }
}

} // namespace braid_torch
