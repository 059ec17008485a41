// braid/cuda/process_state.cuh — what a process_communicator holds (options, statistics, the state of
// one rank: staging memory, peer mappings, registrations, the call counter) and the host-side steps
// its calls share: failing quietly, exchanging a descriptor, waiting for the rank's stream.
#pragma once

#include "runtime.cuh"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../comm/communicator.hpp"
#include "../comm/options.hpp"
#include "../core/error.hpp"
#include "check.cuh"
#include "ipc.cuh"

namespace braid::cuda {

struct process_options {
  options base = options::from_env();         // timeout of the wait for this rank's stream (from_env: also the host's)
  std::size_t staging_bytes = std::size_t{32} << 20; // device memory per rank, two halves
  std::size_t copy_engine_min_bytes = std::size_t{1} << 20; // per-peer piece at or above: copy engines
  int reduce_blocks = 16;                      // blocks of the reduce kernel (the SMs braid may use)
  int threads = 512;
};

// What a communicator has done, for tests and tuning.
struct process_stats {
  std::uint64_t calls = 0;
  std::uint64_t rounds = 0;
  std::uint64_t staged_bytes = 0;        // copied into staging memory (inputs not registered)
  std::uint64_t copy_engine_bytes = 0;   // moved from peers by cudaMemcpyAsync
  std::uint64_t direct_read_bytes = 0;   // read from peers by the reduce kernel
};

namespace ipc_detail {

struct registration {
  bool live = true;
  std::uintptr_t mine = 0;
  std::size_t bytes = 0;
  std::vector<std::byte*> peer;
  std::vector<std::size_t> peer_bytes;
  std::vector<u64> peer_base;
};

// Releases, in this order when a state is destroyed: this rank's last GPU work is awaited and the
// event destroyed, peers' memory is unmapped, the staging memory is freed, the device restored.
struct restore_device {
  int saved = -1;
  ~restore_device() {
    if (saved >= 0) cudaSetDevice(saved);
  }
};
struct device_memory {
  void* p = nullptr;
  ~device_memory() {
    if (p) cudaFree(p);
  }
};
struct event {
  cudaEvent_t e = nullptr;
  ~event() {
    if (!e) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (cudaEventQuery(e) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    cudaEventDestroy(e);
  }
};

struct process_state {
  restore_device restore; // first member: destroyed last
  braid::communicator host;
  process_options opts;
  int device = 0;
  u64 half = 0;
  u64 max_pitch = 0; // cudaDevAttrMaxPitch
  device_memory staging;
  peer_mappings maps;
  event done;
  std::vector<std::byte*> peer_staging;
  std::vector<registration> regs;
  u64 round = 0, seq = 0;
  process_stats stats;
  std::atomic<bool> failed{false};
  std::string cause;            // written only by the thread making a call
  cudaStream_t last_stream = nullptr; // of the call in progress, drained after an error
  ~process_state() {
    if (cudaGetDevice(&restore.saved) == cudaSuccess) cudaSetDevice(device);
  }
};

// After an error: stop peers from waiting for this rank, and let this rank's enqueued GPU work
// finish (bounded) before anything it reads can be released.
// Everything the call enqueued is awaited (an event recorded now on the call's stream), bounded by
// the timeout; the memory it reads is released only afterwards.
inline void fail_quietly(process_state& s) noexcept {
  s.failed.store(true);
  try {
    if (s.host.valid()) s.host.abort();
  } catch (...) {
  }
  if (s.done.e) {
    if (s.seq) (void)cudaEventRecord(s.done.e, s.last_stream); // a call has run: drain its stream
    const auto until = std::chrono::steady_clock::now() + s.opts.base.timeout;
    while (cudaEventQuery(s.done.e) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    (void)cudaGetLastError();
  }
}

template <class W> std::vector<W> exchange(process_state& s, const W& mine) {
  std::vector<W> all(static_cast<std::size_t>(s.host.size()));
  s.host.all_gather(reinterpret_cast<const std::uint8_t*>(&mine), reinterpret_cast<std::uint8_t*>(all.data()), sizeof(W));
  return all;
}

// Waits (on the host, bounded) until everything enqueued on `stream` so far has run.
inline void sync_stream(process_state& s, cudaStream_t stream, const error_context& ctx) {
  BRAID_CUDA_CHECK(cudaEventRecord(s.done.e, stream));
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 0;; ++i) {
    const cudaError_t e = cudaEventQuery(s.done.e);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) cuda_detail::raise_cuda(e, "cudaEventQuery (this rank's GPU work)", __FILE__, __LINE__, ctx);
    if (i < 64) continue;
    if (std::chrono::steady_clock::now() - start > s.opts.base.timeout)
      raise(errc::timeout, "this rank's GPU work did not finish within the timeout (is the stream blocked by earlier work?)", ctx);
    if (i < 4096) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// Registration holding [p, p + bytes) on this rank, or -1.
inline int find_registration(const process_state& s, const void* p, std::size_t bytes) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (std::size_t k = 0; k < s.regs.size(); ++k) {
    const registration& g = s.regs[k];
    if (g.live && at >= g.mine && at + bytes <= g.mine + g.bytes) return static_cast<int>(k);
  }
  return -1;
}

} // namespace ipc_detail

} // namespace braid::cuda
