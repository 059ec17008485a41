// examples/common/cuda_ranks.hpp — what the trainers' --backend cuda paths share (resnet_fmnist,
// resnet_pipeline): which GPU each rank takes, and one host thread per rank of a one-process group.
// Needs braid/cuda.cuh (nvcc or the emulated device) included first.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace braid_examples {

// The device of each of `ranks` ranks: rank r on GPU r mod `gpus` (0: one GPU per rank). `what`
// names the ranks in the error ("rank(s)", "stage(s)"). Refuses more GPUs than this process sees.
inline std::vector<int> gpu_of_ranks(int ranks, int gpus, const char* what) {
  int devices = 0;
  BRAID_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const int g = gpus > 0 ? gpus : ranks;
  if (devices < g)
    throw braid::invalid_argument("--backend cuda: " + std::to_string(ranks) + " " + what + " need " + std::to_string(g) + " GPUs (" +
                                  (gpus > 0 ? "--gpus" : "one each; --gpus 1 puts them all on GPU 0") + "); this process sees " +
                                  std::to_string(devices));
  std::vector<int> ids(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) ids[static_cast<std::size_t>(r)] = r % g;
  return ids;
}

// body(r, comms[r]) on a host thread per rank. When one throws, every communicator is aborted (a peer
// waiting in a collective or send/recv ends with `aborted` instead of its timeout) and on_error(r) runs
// (e.g. leave a barrier); after all threads end, the first rank's exception is rethrown.
template <class Comm, class Body>
void run_cuda_ranks(std::vector<Comm>& comms, const Body& body, const std::function<void(std::size_t)>& on_error = {}) {
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
        for (auto& c : comms) c.abort();
        if (on_error) on_error(r);
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// The line both trainers print before an emulated run: its speeds are not a GPU's.
inline const char* emulated_device_banner() {
  return "emulated device: these GPUs are braid's emulated CUDA device on the CPU; speeds and times below are the emulator's, "
         "not a GPU's";
}

} // namespace braid_examples
