// braid/cuda/group/state.cuh — what the ranks of a one-process CUDA group share: group_options, each
// rank's device memory, the point-to-point mailboxes and the group's state.
#pragma once

#include "../runtime.cuh"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../../comm/options.hpp"
#include "../../comm/tuning.hpp"
#include "../../comm/validate.hpp"
#include "../../core/error.hpp"
#include "../../core/ops.hpp"
#include "../../core/types.hpp"
#include "../../schedule/call.hpp"
#include "../../schedule/schedule.hpp"
#include "../check.cuh"
#include "../collectives.cuh"
#include "../device/executor.cuh"
#include "../device/kernel.cuh"
#include "../enqueue/launcher.cuh"

namespace braid::cuda {

struct group_options {
  options base = options::from_env();
  int threads_per_block = 512;   // at most 512 (the kernels' launch bound: __launch_bounds__(512), checked by static_kernel_checks)
  int max_blocks_per_rank = 1024; // a cap below the SM-derived share (half the SMs, split among the GPU's ranks)
  // Who orders a rank's calls on its GPU: braid (they run in call order whatever their streams), or
  // the caller's streams (a call then costs one kernel launch in the steady state): call_order.
  call_order order = call_order::braid;
};

namespace group {

struct rank_memory {
  int device = 0;
  void* segment = nullptr; // progress, in_desc, arrivals, round, then the two halves
  cuda::device::device_rank view{};
  cuda::device::device_rank* table = nullptr; // device copy of every rank's view, on this rank's GPU
  std::uint64_t call_word = 0, calls = 0;    // this rank's call word chain (rank_call::call_word), calls made
};

// Point to point (communicator::send / recv): a send posts its message in the mailbox of its ordered
// pair of ranks and waits on the host until the receiver has taken it; the receiver enqueues the copy
// on its own stream and hands back an event after it. Posts are matched in FIFO order.
struct p2p_post {
  const void* src = nullptr;     // the sender's buffer
  std::size_t bytes = 0;
  cudaEvent_t ready = nullptr;   // on the sender's stream at its send: the data is there
  // Set by the receiver, under the box's mutex, when it takes the post (taken = true):
  bool taken = false;
  std::uint64_t seq = 0;         // the message's number in its pair and direction, from 1
  std::size_t expected = 0;      // the receiver's byte count (differs: both sides raise mismatch_error)
  cudaEvent_t copied = nullptr;  // on the receiver's stream after the copy; the sender destroys it
  std::string failure;           // the receiver could not enqueue the copy (the sender raises peer_error)
};
struct p2p_box {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::shared_ptr<p2p_post>> q; // posted, not yet taken
  std::uint64_t taken = 0;                  // messages taken so far (numbers them)
};

struct group_state {
  int nranks = 0;
  int blocks = 1, threads = 512;
  std::uint64_t half_bytes = 0;
  std::vector<rank_memory> ranks;
  std::vector<std::shared_ptr<enqueue::device_set>> sets; // one per GPU used, in order of first appearance
  std::vector<int> set_of, local_of;             // per rank
  cuda::device::device_abort* abort = nullptr; // host-mapped, portable
  options opts;
  std::mutex loaded_m;
  std::set<const void*> loaded; // kernel instantiations loaded on every GPU of the group
  std::mutex p2p_m;                               // guards the slots of `boxes`
  std::vector<std::unique_ptr<p2p_box>> boxes;    // [src * nranks + dst], made on first use

  p2p_box& box(int src, int dst) {
    std::lock_guard<std::mutex> lk(p2p_m);
    if (boxes.empty()) boxes.resize(static_cast<std::size_t>(nranks) * static_cast<std::size_t>(nranks));
    auto& b = boxes[static_cast<std::size_t>(src) * static_cast<std::size_t>(nranks) + static_cast<std::size_t>(dst)];
    if (!b) b = std::make_unique<p2p_box>();
    return *b;
  }
  // Wakes every rank waiting in send or recv (after abort() raised the flag they poll).
  void wake_p2p() {
    std::lock_guard<std::mutex> lk(p2p_m);
    for (auto& b : boxes)
      if (b) {
        { std::lock_guard<std::mutex> bl(b->m); } // a waiter is either asleep or has yet to read the flag
        b->cv.notify_all();
      }
  }
  ~group_state() {
    int saved = 0;
    cudaGetDevice(&saved);
    for (auto& r : ranks) {
      cudaSetDevice(r.device);
      cudaDeviceSynchronize(); // no kernel of the group may still use the memory
      if (r.table) cudaFree(r.table);
      if (r.segment) cudaFree(r.segment);
    }
    for (auto& s : sets) {
      cudaSetDevice(s->device);
      s->destroy_events();
    }
    if (abort) cudaFreeHost(abort);
    cudaSetDevice(saved);
  }
};

} // namespace group

} // namespace braid::cuda
