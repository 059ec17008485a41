// braid/cuda/enqueue/launcher.cuh — how the calls of a one-process group become launches: one cooperative
// launch per call per GPU, serving every rank of the group on that GPU, chained after the group's
// previous launch on that GPU.
//
// Why: the blocks of a call wait for each other and for the other ranks. CUDA promises co-residency
// only to the blocks of one cooperative launch, and no concurrency at all between kernels of
// different streams on one GPU (CUDA_LAUNCH_BLOCKING, profilers, connection sharing, other resident
// work). So the ranks that share a GPU meet on the host first (a rendezvous per call), and the last
// of them to arrive launches one kernel for all of them. Kernels on different GPUs still wait for
// each other, as NCCL's do: that needs each GPU to run its launch, which nothing on another GPU can
// hold back.
//
// Ordering: the launch waits for every participant's stream and for the group's previous launch on
// that GPU (the chain event), so a rank's calls run in the order they were made, whatever streams
// they were enqueued on; each participant's stream then waits for the launch. What that costs is
// only what a call's streams need: where every rank of the group is on one GPU, a participant's
// stream is joined when the launch is made (nothing is recorded at its call; nothing at all when the
// participants share one stream); elsewhere an event is recorded at its call, since a kernel of
// another GPU that waits for this launch may be what the participant's later work waits for. A
// launch on the stream of the set's previous launch waits on no chain event, unless a launch of the
// group was ever captured into a graph (a replay may come between). A rank alone on its GPU, calling
// on the same stream as before, costs the capture query, the stream's id, the launch and the chain's
// record. Inside a CUDA graph capture the ranks of a GPU must enqueue on one stream (refused
// otherwise), and the chain becomes external event nodes of the graph (cudaEventWaitExternal,
// cudaEventRecordExternal), so each replay too runs after the group's latest launch on its GPU and
// before the next. Should two launches of the group still run at once on one GPU, the kernel sees it
// (an in-flight word), stops the group, and check() raises invalid_usage instead of mixing rounds.
//
// A thread that drives several ranks of one GPU cannot block in each call until the others arrive:
// it brackets them with group_start()/group_end() (or a group_scope), as with NCCL. Inside the
// bracket a call returns at once; group_end() launches what is complete, joins each rank's stream to
// its launch, and raises if a call was left incomplete.
#pragma once

#include "../runtime.cuh"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../../core/error.hpp"
#include "../../schedule/call.hpp"
#include "../check.cuh"
#include "../device/executor.cuh"
#include "error.cuh"

namespace braid::cuda {

namespace enqueue {

// One call of the group on one GPU, while its ranks arrive.
struct pending_call {
  std::uint64_t seq = 0;
  // What the ranks of the GPU must agree on: the first arriver's call (its description without its
  // number: collective, element type, operator, algorithm, count, root) and kernel instantiation.
  braid::detail::call_description what{};
  const void* kernel = nullptr;
  cuda::device::launch_args args{};
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
  cudaEvent_t joiner = nullptr;             // created by the first launch that joins another stream
  // The stream of the latest launch outside a graph capture, by cudaStreamGetId (a handle may name a
  // later stream once its stream is destroyed; 0: none yet). A launch on that stream is ordered after
  // it by the stream itself and needs no wait on `chain`, unless a launch of the set went into a graph
  // (`captured`): a replay may then run between any two launches, on any stream.
  unsigned long long last_stream = 0;
  bool captured = false;
  cuda::device::device_abort* abort = nullptr; // the group's
  // Destroys the set's events, those of calls never launched included (its device current).
  void destroy_events();
};

// A call made inside group_start()/group_end() whose stream still has to be joined to its launch.
struct deferred_join {
  std::shared_ptr<device_set> set;
  std::shared_ptr<pending_call> call;
  int local = 0;
  cudaStream_t stream = nullptr;
  int rank = 0;
  std::shared_ptr<void> keep; // the group's state, alive until the join
};
struct bracket_state {
  int depth = 0;
  std::vector<deferred_join> joins;
};
inline bracket_state& bracket() {
  static thread_local bracket_state b;
  return b;
}

// A number for the calling thread, never reused (std::thread::id values are reused by later threads).
inline std::uint64_t this_thread_token() {
  static std::atomic<std::uint64_t> next{1};
  static thread_local const std::uint64_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine;
}

// How long a call waits for the GPU's other ranks before it takes their absence for that mistake:
// when their latest calls came from this thread, or when they have made none and this thread
// created the group (longer: a rank's own thread may still be starting).
inline constexpr std::chrono::seconds grace_after_own_calls{1};
inline constexpr std::chrono::seconds grace_before_first_call{5};

inline bool is_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  BRAID_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

// Whether `stream` still has to wait for the launch of `c` (its own stream, or in a capture where every
// participant used one stream, it is ordered already).
inline bool needs_join(const pending_call& c, cudaStream_t stream) { return !c.capturing && stream != c.launch_stream; }

// Joins `stream` to the launch of `c` (called with the set's lock held, after the launch, with the
// set's device current).
inline void join_locked(device_set& ds, const pending_call& c, cudaStream_t stream) {
  if (needs_join(c, stream)) BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, ds.chain, 0));
}

// Launches `c` (every participant arrived; the set's lock is held; the set's device is current) on
// the last arriver's stream; `ctx` is that arriver's call. What it enqueues besides the launch and
// the record of `chain`: a wait for each participant on another stream, and a wait on `chain` only
// where the launch's stream does not order it after the set's latest launch already.
inline void launch_locked(device_set& ds, pending_call& c, cudaStream_t stream,
                          const std::function<cudaError_t(cudaStream_t, const cuda::device::launch_args&)>& launch,
                          const error_context& ctx) {
  c.launch_stream = stream;
  unsigned long long stream_id = 0;
  if (c.capturing) {
    // In the graph: wait for the group's latest launch on this GPU as of each replay, and be that.
    BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, ds.chain, cudaEventWaitExternal));
  } else {
    for (std::size_t li = 0; li < c.streams.size(); ++li) {
      if (c.streams[li] == stream) continue; // ordered by the stream itself
      if (c.ready[li]) {
        BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, c.ready[li], 0));
        continue;
      }
      // join_at_launch: the participant's stream now, its work up to its call and whatever came
      // after it, none of which waits for this group (every rank of the group is here, on this GPU).
      if (!ds.joiner) BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&ds.joiner, cudaEventDisableTiming));
      BRAID_CUDA_CHECK(cudaEventRecord(ds.joiner, c.streams[li]));
      BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, ds.joiner, 0));
    }
    BRAID_CUDA_CHECK(cudaStreamGetId(stream, &stream_id));
    if (ds.captured || stream_id != ds.last_stream) BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, ds.chain, 0));
  }
  const cudaError_t e = launch(stream, c.args);
  if (e != cudaSuccess) {
    const bool too_large = e == cudaErrorCooperativeLaunchTooLarge;
    raise(too_large ? errc::unsupported : errc::cuda,
          too_large ? "the " + std::to_string(c.args.local) + " ranks on GPU " + std::to_string(ds.device) + " need " +
                          std::to_string(c.args.local * static_cast<int>(ds.blocks_per_rank)) +
                          " blocks resident at once and this kernel cannot have that many "
                          "(cudaErrorCooperativeLaunchTooLarge; lower group_options::max_blocks_per_rank or "
                          "threads_per_block, or put fewer ranks on the GPU)"
                    : std::string("the collective kernel's launch failed: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e),
          ctx);
  }
  if (c.capturing) {
    BRAID_CUDA_CHECK(cudaEventRecordWithFlags(ds.chain, stream, cudaEventRecordExternal));
    ds.captured = true;
  } else {
    BRAID_CUDA_CHECK(cudaEventRecord(ds.chain, stream));
    ds.last_stream = stream_id;
  }
  c.launched = true;
}

// A launch that serves every rank of the group (all of them on this GPU) and of which no part touches
// staging memory (rank_call::uses_staging: every input is read in place, the schedule keeps no
// windows) runs its call as one round: staging bounds a round only through what it holds there.
inline void one_round_when_unstaged(cuda::device::launch_args& a) {
  if (a.local != a.nranks || a.rounds <= 1) return;
  for (int i = 0; i < a.local; ++i)
    if (a.calls[i].uses_staging) return;
  a.per_round = a.count;
  a.rounds = 1;
}

[[noreturn]] inline void raise_failed(const pending_call& c, const error_context& ctx) {
  raise(c.failure_code, c.failure, ctx);
}

// Which call of its rank `c` is, for a record of the group's error.
inline cuda::device::call_id call_of(const pending_call& c, int local) {
  return {static_cast<int>(c.args.coll), c.args.calls[local].seq};
}

// Returns a call's ready events for reuse (the waits on them are enqueued, or the call is dropped).
inline void give_back_locked(device_set& ds, pending_call& c) {
  for (cudaEvent_t& e : c.ready)
    if (e) ds.spare.push_back(std::exchange(e, nullptr));
}

inline void device_set::destroy_events() {
  for (auto& [seq, c] : calls) give_back_locked(*this, *c);
  for (cudaEvent_t e : spare) cudaEventDestroy(e);
  spare.clear();
  for (cudaEvent_t* e : {&chain, &joiner})
    if (*e) cudaEventDestroy(std::exchange(*e, nullptr));
}

// A call that cannot go on leaves its GPU's ranks at different call counts: stop the group, so that
// every later call raises at once and kernels on other GPUs waiting for this launch give up. `call`
// is rank `rank`'s call that could not go on.
inline void stop_group(device_set& ds, int rank, unsigned code, cuda::device::call_id call) {
  cuda::device::record_failure({ds.abort, cuda::device::abort_host_slot}, cuda::device::device_error{code, rank, -1, cuda::device::fail_step::launch_refused, 0, call});
}

} // namespace enqueue

// Starts a bracket: until the matching group_end(), collective calls made by this thread return at
// once without joining their stream to the call (needed when one thread drives several ranks of one
// GPU). Brackets nest; only the outermost group_end() acts.
inline void group_start() { ++enqueue::bracket().depth; }

// Ends a bracket: joins every call made inside it to its launch, in order. Raises (after joining
// what can be joined) if a call inside the bracket was not made by every rank on its GPU, or failed.
inline void group_end() {
  enqueue::bracket_state& b = enqueue::bracket();
  if (b.depth == 0) raise(errc::invalid_usage, "group_end() without group_start()");
  if (--b.depth > 0) return;
  std::vector<enqueue::deferred_join> joins;
  joins.swap(b.joins);
  std::string first;
  errc code = errc::invalid_usage;
  int first_rank = -1;
  for (auto& j : joins) {
    std::unique_lock<std::mutex> lk(j.set->m);
    if (!j.call->failure.empty()) {
      if (first.empty()) first = j.call->failure, code = j.call->failure_code, first_rank = j.rank;
      continue;
    }
    if (!j.call->launched) {
      j.call->failure = "call #" + std::to_string(j.call->seq) + " on GPU " + std::to_string(j.set->device) + " was made by " +
                        std::to_string(j.call->arrived) + " of its " + std::to_string(j.set->ranks.size()) +
                        " ranks before group_end(): the ranks of one GPU are launched together, so every one of them "
                        "must make the call inside the bracket";
      j.call->failure_code = errc::invalid_usage;
      j.set->calls.erase(j.call->seq);
      enqueue::give_back_locked(*j.set, *j.call);
      enqueue::stop_group(*j.set, j.rank, static_cast<unsigned>(errc::invalid_usage), enqueue::call_of(*j.call, j.local));
      j.set->cv.notify_all();
      if (first.empty()) first = j.call->failure, code = errc::invalid_usage, first_rank = j.rank;
      continue;
    }
    if (!enqueue::needs_join(*j.call, j.stream)) continue;
    try {
      cuda::detail::device_guard dg(j.set->device);
      enqueue::join_locked(*j.set, *j.call, j.stream);
    } catch (const std::exception& e) {
      if (first.empty()) first = e.what(), code = errc::cuda, first_rank = j.rank;
    }
  }
  if (!first.empty()) raise(code, first, error_context{first_rank, "group_end", 0, -1});
}

// group_start() for a scope; group_end() at its end (an error raises from the destructor unless an
// exception is already on its way; call end() to see it explicitly).
class group_scope {
public:
  group_scope() { group_start(); }
  group_scope(const group_scope&) = delete;
  group_scope& operator=(const group_scope&) = delete;
  void end() {
    if (ended_) return;
    ended_ = true;
    group_end();
  }
  ~group_scope() noexcept(false) {
    if (ended_) return;
    ended_ = true;
    if (std::uncaught_exceptions() > uncaught_) {
      try {
        group_end();
      } catch (...) {
      }
      return;
    }
    group_end();
  }

private:
  bool ended_ = false;
  int uncaught_ = std::uncaught_exceptions();
};

namespace enqueue {

// Rank `rank` (local index `local` of `ds`) makes `call` (its record) with kernel `kernel` and its part `mine`
// on `stream`.
// Returns when the call is launched and `stream` joined to it, or at once inside a bracket. `common`
// holds the fields every rank computes alike; `launch` starts the kernel (used by the last arriver).
// `ctx` is the call's context on this rank (its collective and sequence number, mine.seq), named by
// every error the call raises. The set's device must be current.
inline void arrive(const std::shared_ptr<void>& keep, const std::shared_ptr<device_set>& dsp, int local, int rank,
                   const braid::detail::call_record& call, const void* kernel, const cuda::device::launch_args& common,
                   const cuda::device::rank_call& mine,
                   cudaStream_t stream, std::chrono::nanoseconds timeout, cuda::device::device_abort* abort, int nsets,
                   const std::function<cudaError_t(cudaStream_t, const cuda::device::launch_args&)>& launch,
                   const error_context& ctx) {
  device_set& ds = *dsp;
  const bool in_bracket = bracket().depth > 0;
  const int L = static_cast<int>(ds.ranks.size());
  const bool capturing = is_capturing(stream);
  if (in_bracket && nsets > 1 && launch_blocking())
    raise(errc::unsupported,
          "CUDA_LAUNCH_BLOCKING=1 is set: a launch returns only when its kernel ends, so one thread cannot launch the "
          "kernels of several GPUs that wait for each other; drive each GPU from its own thread, or unset it",
          ctx);
  braid::detail::call_description what = braid::detail::describe(call);
  what[3] = 0; // the call's number on each rank is not part of the agreement
  std::unique_lock<std::mutex> lk(ds.m);
  const std::size_t me = static_cast<std::size_t>(local);
  const std::uint64_t seq = ds.next_seq[me];
  std::shared_ptr<pending_call> c;
  if (auto it = ds.calls.find(seq); it != ds.calls.end()) {
    c = it->second;
  } else {
    c = std::make_shared<pending_call>();
    c->seq = seq;
    c->what = what;
    c->kernel = kernel;
    c->args = common;
    c->args.local = L;
    c->args.blocks_per_rank = ds.blocks_per_rank;
    c->args.busy = ds.busy;
    c->args.exits = ds.exits;
    c->args.abort_slot = 1 + ds.index;
    c->here.assign(static_cast<std::size_t>(L), 0);
    c->streams.assign(static_cast<std::size_t>(L), nullptr);
    c->ready.assign(static_cast<std::size_t>(L), nullptr);
  }
  const std::string which = "GPU " + std::to_string(ds.device) + ", the group's launch #" + std::to_string(seq + 1) + " there";
  const cuda::device::call_id my_call{static_cast<int>(call.coll), mine.seq};
  // Checks before this rank counts in. One that fails drops the call and stops the group: the ranks
  // that arrived are a call ahead of the others now.
  auto fail_all = [&](errc code, const std::string& why) {
    c->failure = why;
    c->failure_code = code;
    ds.calls.erase(seq);
    give_back_locked(ds, *c);
    stop_group(ds, rank, static_cast<unsigned>(errc::invalid_usage), my_call);
    ds.cv.notify_all();
    raise_failed(*c, ctx);
  };
  if (c->what != what || c->kernel != kernel)
    fail_all(errc::invalid_usage, "ranks made different calls (" + which +
                                      "): collective, count, root, element type, operator and algorithm must match");
  const std::string one_stream = "inside a CUDA graph capture the ranks of one GPU must enqueue a call on one stream (" + which + ")";
  if (capturing) {
    for (int li = 0; li < L; ++li)
      if (c->here[static_cast<std::size_t>(li)] && c->streams[static_cast<std::size_t>(li)] != stream) fail_all(errc::invalid_usage, one_stream);
  } else if (c->capturing) {
    fail_all(errc::invalid_usage, one_stream);
  }
  cudaEvent_t ev = nullptr;
  if (!capturing && L > 1 && !ds.join_at_launch) {
    if (ds.spare.empty()) {
      BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    } else {
      ev = ds.spare.back();
      ds.spare.pop_back();
    }
    if (const cudaError_t e = cudaEventRecord(ev, stream); e != cudaSuccess) {
      ds.spare.push_back(ev);
      cuda::detail::raise_cuda(e, "cudaEventRecord (the rank's stream)", __FILE__, __LINE__, ctx);
    }
  }
  // Counted in.
  ds.calls.emplace(seq, c);
  ++ds.next_seq[me];
  ds.last_thread[me] = this_thread_token();
  c->args.calls[local] = mine;
  c->here[me] = 1;
  c->streams[me] = stream;
  c->ready[me] = ev;
  c->capturing = c->capturing || capturing;
  ++c->arrived;
  if (c->arrived == L) {
    ds.calls.erase(seq);
    one_round_when_unstaged(c->args);
    try {
      launch_locked(ds, *c, stream, launch, ctx);
    } catch (...) {
      try {
        throw;
      } catch (const braid::error& e) {
        c->failure = e.what();
        c->failure_code = e.code();
      } catch (const std::exception& e) {
        c->failure = e.what();
      }
      give_back_locked(ds, *c);
      stop_group(ds, rank, static_cast<unsigned>(errc::aborted), my_call);
      ds.cv.notify_all();
      throw;
    }
    give_back_locked(ds, *c);
    ds.cv.notify_all();
    return; // launched on this rank's stream
  }
  if (in_bracket) {
    bracket().joins.push_back(deferred_join{dsp, c, local, stream, rank, keep});
    return;
  }
  // Wait for the other ranks of this GPU, from their threads. A thread that drives them too would
  // wait for itself: after a grace period, if every missing rank's latest call came from this thread
  // (or it has made none and this thread created the group), this arrival is undone and the call
  // raises (the group stays usable). Otherwise only the timeout ends the wait.
  bool never_called = false;
  auto missing = [&](bool& all_mine) {
    std::string m;
    all_mine = true;
    never_called = false;
    for (int li = 0; li < L; ++li)
      if (!c->here[static_cast<std::size_t>(li)]) {
        m += (m.empty() ? "" : ", ") + std::to_string(ds.ranks[static_cast<std::size_t>(li)]);
        const std::uint64_t last = ds.last_thread[static_cast<std::size_t>(li)];
        never_called = never_called || last == 0;
        all_mine = all_mine && (last ? last : ds.creator) == this_thread_token();
      }
    return m;
  };
  {
    bool unused = false;
    missing(unused); // sets never_called
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  const auto grace = start + (never_called ? grace_before_first_call : grace_after_own_calls);
  bool graced = false;
  while (!c->launched && c->failure.empty()) {
    const auto until = graced ? deadline : std::min(deadline, grace);
    if (ds.cv.wait_until(lk, until) != std::cv_status::timeout || c->launched || !c->failure.empty()) continue;
    bool all_mine = false;
    const std::string who = missing(all_mine);
    if (!graced && until < deadline) {
      graced = true;
      if (!all_mine) continue;
      c->here[me] = 0;
      c->streams[me] = nullptr;
      if (c->ready[me]) ds.spare.push_back(std::exchange(c->ready[me], nullptr));
      --c->arrived;
      --ds.next_seq[me];
      if (c->arrived == 0) ds.calls.erase(seq);
      raise(errc::invalid_usage, "rank " + std::to_string(rank) + " would wait for rank(s) " + who + " on GPU " +
                                     std::to_string(ds.device) +
                                     (never_called ? ", which have made no call " + std::to_string(grace_before_first_call.count()) +
                                                         " s after this one while this thread created the group (if a thread of "
                                                         "their own drives them, it has not reached the group's first call yet): "
                                                   : ", whose latest calls came from this same thread: ") +
                                     bracket_rule,
            ctx);
    }
    c->failure = "rank " + std::to_string(rank) + " waited more than the timeout for rank(s) " + who + " (" + which +
                 ") to make the call (" + bracket_rule + ")";
    c->failure_code = errc::timeout;
    ds.calls.erase(seq);
    give_back_locked(ds, *c);
    ds.cv.notify_all();
    // Kernels of other GPUs may be waiting for this launch: stop them.
    cuda::device::record_failure({abort, cuda::device::abort_host_slot},
                                cuda::device::device_error{static_cast<unsigned>(errc::timeout), rank, -1, cuda::device::fail_step::host_arrival, 0, my_call});
  }
  if (!c->failure.empty()) raise_failed(*c, ctx);
  join_locked(ds, *c, stream);
}

} // namespace enqueue

} // namespace braid::cuda
