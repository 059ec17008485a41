// braid/cuda/enqueue/set.cuh — what the launcher keeps per GPU of a group: the ranks there (a device
// set), the calls they are making (pending calls), the parts of ranks beyond those a launch's parameter
// block holds, and who orders a rank's calls (call_order).
#pragma once

#include "../runtime.cuh"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../core/error.hpp"
#include "../../schedule/call.hpp"
#include "../check.cuh"
#include "../device/executor.cuh"

namespace braid::cuda {

// How the calls of a rank are ordered on its GPU (group_options::order, process_options::order).
enum class call_order : std::uint8_t {
  // braid orders them: a rank's calls run in the order they were made, whatever streams they were
  // enqueued on, replays of captured calls included. Costs, beyond the launch, what that takes: the
  // chain event's record, a wait on it where the stream changed, and the queries that tell.
  braid,
  // The caller's streams order them, as with the one-shot all-reduce kernels of inference engines: in
  // the steady state a call costs its kernel launch and nothing else (the calling thread's current
  // device should be the rank's GPU; otherwise braid makes it current for the launch, a call or two
  // more). Calls the streams leave unordered either run one after the other or fail, never mix: two
  // launches of the group at once on a GPU stop it (invalid_usage), and GPUs that ran the group's
  // calls in different orders stop it (mismatch_error). Ranks sharing a GPU still have their streams
  // joined to their launch (events), none where they give one stream.
  streams,
};

namespace enqueue {

// The parts of the ranks beyond cuda::device::inline_calls on one GPU, for the kernel to read from
// host-mapped memory: a ring of slots, each held by one launch until its last block gives it back
// (launch_args::more_in_use), and slots kept by launches captured into graphs, which read theirs at
// every replay.
struct more_parts {
  static constexpr std::size_t ring = 16, kept = 64;
  std::size_t per_slot = 0; // parts per slot: local ranks beyond inline_calls; 0: none
  std::byte* host = nullptr; // (ring + kept) slots of parts, then `ring` in-use words
  std::byte* dev = nullptr;  // the same memory, as the kernel addresses it
  std::size_t next = 0, kept_used = 0;

  std::size_t slot_bytes() const { return per_slot * sizeof(cuda::device::rank_call); }
  cuda::device::u64* in_use(std::byte* base, std::size_t i) const {
    return reinterpret_cast<cuda::device::u64*>(base + (ring + kept) * slot_bytes()) + i;
  }
  // Pinned, mapped memory for `local` ranks on a GPU (nothing for inline_calls or fewer).
  void allocate(int local) {
    if (local <= cuda::device::inline_calls) return;
    per_slot = static_cast<std::size_t>(local - cuda::device::inline_calls);
    const std::size_t bytes = (ring + kept) * slot_bytes() + ring * sizeof(cuda::device::u64);
    BRAID_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(host, 0, bytes);
    BRAID_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), host, 0));
  }
  // Writes `parts` beyond inline_calls into a free slot and points `a` at it: a ring slot, once the
  // launch that held it last has given it back (waiting at most `timeout`), or, for a launch captured
  // into a graph, a slot of its own.
  void fill(cuda::device::launch_args& a, const std::vector<cuda::device::rank_call>& parts, bool capturing,
            std::chrono::nanoseconds timeout, const error_context& ctx) {
    std::size_t i = 0;
    if (capturing) {
      if (kept_used == kept)
        raise(errc::unsupported, "more than " + std::to_string(kept) + " calls with more than " + std::to_string(cuda::device::inline_calls) +
                                     " ranks on one GPU captured into CUDA graphs by one group", ctx);
      i = ring + kept_used++;
      a.more_in_use = nullptr;
    } else {
      i = next++ % ring;
      std::atomic_ref<cuda::device::u64> busy(*in_use(host, i));
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      while (busy.load(std::memory_order_acquire) != 0) {
        if (std::chrono::steady_clock::now() > deadline)
          raise(errc::timeout, "the launches of this GPU's " + std::to_string(ring) + " latest calls did not end within the timeout", ctx);
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      busy.store(1, std::memory_order_relaxed); // before the launch, which orders it for the kernel
      a.more_in_use = in_use(dev, i);
    }
    std::memcpy(host + i * slot_bytes(), parts.data() + cuda::device::inline_calls, slot_bytes());
    a.more = reinterpret_cast<const cuda::device::rank_call*>(dev + i * slot_bytes());
  }
  void release() {
    if (host) cudaFreeHost(std::exchange(host, nullptr));
  }
};

// One call of the group on one GPU, while its ranks arrive.
struct pending_call {
  std::uint64_t seq = 0;
  // What the ranks of the GPU must agree on: the first arriver's call (its description without its
  // number: collective, element type, operator, algorithm, count, root) and kernel instantiation.
  braid::detail::call_description what{};
  const void* kernel = nullptr;
  cuda::device::launch_args args{};  // the launch, but for the ranks' parts
  std::vector<cuda::device::rank_call> parts; // per local rank: its part of the launch
  std::vector<char> staging;         // per local rank: its part touches staging (uses_staging)
  std::vector<char> here;            // per local rank: arrived
  std::vector<cudaStream_t> streams; // per local rank: its stream
  std::vector<cudaEvent_t> ready;    // per local rank: its stream at its call (none in a capture, or alone)
  int arrived = 0;
  bool capturing = false;            // a participant's stream is being captured
  bool launched = false;
  cudaStream_t launch_stream = nullptr;
  std::string failure;               // set when the call cannot be launched: every participant raises it
  errc failure_code = errc::internal;
};

// The ranks of a group on one GPU.
struct device_set {
  int device = 0;
  int index = 0;              // in the group's GPUs (its abort slot is 1 + index)
  std::vector<int> ranks;     // global rank of each local index
  unsigned blocks_per_rank = 1;
  cuda::device::u64* busy = nullptr;  // in-flight word and exit counter (device memory)
  cuda::device::u64* exits = nullptr;
  std::mutex m;
  std::condition_variable cv;
  std::map<std::uint64_t, std::shared_ptr<pending_call>> calls;
  std::vector<std::uint64_t> next_seq;      // per local rank
  std::vector<std::uint64_t> last_thread;   // per local rank: who made its latest call (this_thread_token()); 0: none yet
  std::uint64_t creator = 0;                // the thread that created the group
  std::vector<cudaEvent_t> spare;           // events for pending calls' `ready`, reused once a launch has waited
  cudaEvent_t chain = nullptr;              // after the group's latest launch on this GPU (a replay included)
  // Every rank of the group is on this GPU, so no kernel of the group waits for another GPU's: a
  // participant's stream is joined to the launch when the launch is made (its state then, which holds
  // its state at its call), through `joiner`, instead of by an event recorded at each call.
  bool join_at_launch = false;
  cudaEvent_t joiner = nullptr;             // made with the set where join_at_launch
  // The stream of the latest launch outside a graph capture, by cudaStreamGetId (a handle may name a
  // later stream once its stream is destroyed; 0: none yet). A launch on that stream is ordered after
  // it by the stream itself and needs no wait on `chain`, unless a launch of the set went into a graph
  // (`captured`): a replay may then run between any two launches, on any stream.
  unsigned long long last_stream = 0;
  bool captured = false;
  call_order order = call_order::braid;
  cuda::device::device_abort* abort = nullptr; // the group's
  std::chrono::nanoseconds timeout{};          // the group's deadline (a wait for a slot of `more`)
  more_parts more;                             // ranks beyond inline_calls: their parts, host-mapped
  // Destroys the set's events, those of calls never launched included, and frees `more` (its device
  // current).
  void destroy_events();
};

} // namespace enqueue

} // namespace braid::cuda
