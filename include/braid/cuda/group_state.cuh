// braid/cuda/group_state.cuh — what the ranks of a one-process CUDA group share: group_options, each
// rank's device memory, the point-to-point mailboxes, the group's state, and the launch arguments and
// residency check that both CUDA communicators use.
#pragma once

#include "runtime.cuh"

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

#include "../comm/options.hpp"
#include "../comm/tuning.hpp"
#include "../comm/validate.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/types.hpp"
#include "../schedule/call_word.hpp"
#include "../schedule/schedule.hpp"
#include "check.cuh"
#include "collectives.cuh"
#include "executor.cuh"
#include "kernel.cuh"
#include "launcher.cuh"

namespace braid::cuda {

struct group_options {
  options base = options::from_env();
  int threads_per_block = 512;   // at most 512 (the kernels' launch bound: __launch_bounds__(512), checked by static_kernel_checks)
  int max_blocks_per_rank = 1024; // a cap below the SM-derived share (half the SMs, split among the GPU's ranks)
};

namespace detail {

struct rank_memory {
  int device = 0;
  void* segment = nullptr; // progress, in_desc, arrivals, round, then the two halves
  cuda_detail::device_rank view{};
  cuda_detail::device_rank* table = nullptr; // device copy of every rank's view, on this rank's GPU
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
  std::vector<std::shared_ptr<device_set>> sets; // one per GPU used, in order of first appearance
  std::vector<int> set_of, local_of;             // per rank
  cuda_detail::device_abort* abort = nullptr; // host-mapped, portable
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

// How often a waiting kernel thread may read the group's host-mapped abort flag (wait_ge): every
// 100 us of a wait (cuda_detail::default_abort_every_ns), or BRAID_CUDA_ABORT_POLL (BRAID_TIMEOUT's
// syntax: "1ms"; "0.001us" reads it at every look at the clock, every 64 polls), read once per
// process.
inline std::uint64_t abort_poll_ns() {
  static const std::uint64_t ns = [] {
    const char* s = std::getenv("BRAID_CUDA_ABORT_POLL");
    return s && *s ? static_cast<std::uint64_t>(options::parse_duration(s, "BRAID_CUDA_ABORT_POLL").count())
                   : std::uint64_t{cuda_detail::default_abort_every_ns};
  }();
  return ns;
}

// One rank's launch arguments for a call of schedule S, for the executor's kernel: a round's elements
// from the staging half, checked against the staging memory and the kernel's step counters
// (unsupported_error). Both CUDA communicators (one process, and processes on distinct GPUs) fill
// them here.
template <class S, class T>
cuda_detail::launch_args launch_args_for(collective c, int n, int r, int root, std::size_t count, std::uint64_t half_bytes,
                                         const cuda_detail::device_rank* table, cuda_detail::device_abort* abort,
                                         std::chrono::nanoseconds timeout, const error_context& ctx) {
  const std::uint64_t per = schedule::per_round<S, T>(c, n, half_bytes);
  if (per == 0) raise(errc::unsupported, "staging memory too small for this schedule", ctx);
  // Every round's schedule must fit the arrival counters.
  const std::uint32_t P = S::nchunks(c, n, schedule::pipeline_chunks<T>(std::min<std::uint64_t>(per, count)));
  if (S::nsteps(schedule::args{c, n, r, root, P}) > cuda_detail::max_steps)
    raise(errc::unsupported, "schedule has too many steps per round for the CUDA executor", ctx);
  cuda_detail::launch_args la{};
  la.ranks = table;
  la.nranks = n;
  la.root = root;
  la.coll = c;
  la.count = count;
  la.per_round = per;
  la.rounds = schedule::nrounds(count, per);
  la.half_bytes = half_bytes;
  la.abort = abort;
  la.timeout_ns = static_cast<std::uint64_t>(timeout.count());
  la.abort_every_ns = abort_poll_ns();
  return la;
}

// Raises unsupported_error unless `blocks` blocks of `threads` threads of `kernel` can be resident on
// `device` at once: the executor's blocks wait for each other and for peers, so every one must run.
// `needed` says where the blocks come from, `remedy` which option lowers them.
template <class K>
void check_resident(K kernel, int device, int threads, std::uint64_t blocks, const std::string& needed, const char* remedy,
                    const error_context& ctx) {
  cudaFuncAttributes fa{};
  BRAID_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  if (fa.maxThreadsPerBlock < threads)
    raise(errc::unsupported, "this collective's kernel (element type and operator) can run at most " + std::to_string(fa.maxThreadsPerBlock) +
                                 " threads per block on GPU " + std::to_string(device) + " and the call uses " +
                                 std::to_string(threads) + ": " + remedy, ctx);
  int per_sm = 0, sms = 0;
  BRAID_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (static_cast<std::uint64_t>(per_sm) * static_cast<unsigned>(sms) < blocks)
    raise(errc::unsupported, "GPU " + std::to_string(device) + " can hold " + std::to_string(per_sm * sms) +
                                 " blocks of this collective's kernel at once and a call needs " + std::to_string(blocks) + " (" +
                                 needed + "): " + remedy, ctx);
}

} // namespace detail

} // namespace braid::cuda
