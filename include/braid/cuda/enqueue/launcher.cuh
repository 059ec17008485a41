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
// Under call_order::streams (group_options::order, process_options::order) the caller's streams order
// a rank's calls instead: nothing asks the runtime about the stream, its capture or the current
// device, no chain is waited for or recorded but where a participant's stream is joined to a launch,
// and in the steady state a call is its launch. Calls the streams leave unordered run one after the
// other or stop the group (the in-flight word on one GPU; different call words across GPUs).
//
// A launch carries the parts of up to cuda::device::inline_calls ranks in its parameter block
// (launch_args, a fixed size); a GPU with more ranks passes the rest in host-mapped memory (more_parts,
// set.cuh), which the kernel reads once per block.
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
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../core/error.hpp"
#include "../../schedule/call.hpp"
#include "../check.cuh"
#include "../device/executor.cuh"
#include "error.cuh"
#include "set.cuh"

namespace braid::cuda {

namespace enqueue {

// A call made inside group_start()/group_end() whose stream still has to be joined to its launch.
struct deferred_join {
  std::shared_ptr<device_set> set;
  std::shared_ptr<pending_call> call;
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

// Makes runtime call `f` for the set's GPU. Under call_order::braid that GPU is current already.
// Under call_order::streams the calling thread's current device is usually the rank's GPU, and
// nothing is asked: `f` runs as it is, and only if it fails runs again with the set's device made
// current (kept so in `dg` for what follows).
template <class F> cudaError_t on_set_device(device_set& ds, std::optional<cuda::detail::device_guard>& dg, F&& f) {
  const cudaError_t e = f();
  if (e == cudaSuccess || ds.order == call_order::braid || dg) return e;
  (void)cudaGetLastError();
  dg.emplace(ds.device);
  return f();
}

// Whether `stream` still has to wait for the launch of `c` (its own stream, or in a capture where every
// participant used one stream, it is ordered already).
inline bool needs_join(const pending_call& c, cudaStream_t stream) { return !c.capturing && stream != c.launch_stream; }

// Joins `stream` to the launch of `c` (called with the set's lock held, after the launch; the set's
// device is current under call_order::braid and made current here under call_order::streams).
inline void join_locked(device_set& ds, const pending_call& c, cudaStream_t stream) {
  if (!needs_join(c, stream)) return;
  std::optional<cuda::detail::device_guard> dg;
  BRAID_CUDA_CHECK(on_set_device(ds, dg, [&] { return cudaStreamWaitEvent(stream, ds.chain, 0); }));
}

// Launches `c` (every participant arrived; the set's lock is held) on the last arriver's stream; `ctx`
// is that arriver's call. What it enqueues besides the launch: a wait for each participant on another
// stream, and, under call_order::braid, a wait on `chain` only where the launch's stream does not order
// it after the set's latest launch already, and the record of `chain`; under call_order::streams, the
// record of `chain` only where a participant's stream must be joined to the launch. The set's device
// is current under call_order::braid; under call_order::streams it is made current only for the event
// operations, and for the launch if the caller's current device is another GPU.
inline void launch_locked(device_set& ds, pending_call& c, cudaStream_t stream,
                          const std::function<cudaError_t(cudaStream_t, const cuda::device::launch_args&)>& launch,
                          const error_context& ctx) {
  const bool by_streams = ds.order == call_order::streams;
  std::optional<cuda::detail::device_guard> dg;
  c.launch_stream = stream;
  const int L = static_cast<int>(c.parts.size());
  for (int i = 0; i < L && i < cuda::device::inline_calls; ++i) c.args.calls[i] = c.parts[static_cast<std::size_t>(i)];
  if (ds.more.per_slot) {
    if (by_streams) c.capturing = is_capturing(stream);
    ds.more.fill(c.args, c.parts, c.capturing, ds.timeout, ctx);
  }
  bool joins = false; // a participant on another stream
  for (std::size_t li = 0; li < c.streams.size(); ++li) joins = joins || c.streams[li] != stream;
  unsigned long long stream_id = 0;
  if (c.capturing && !by_streams) {
    // In the graph: wait for the group's latest launch on this GPU as of each replay, and be that.
    BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, ds.chain, cudaEventWaitExternal));
  } else {
    for (std::size_t li = 0; li < c.streams.size(); ++li) {
      if (c.streams[li] == stream) continue; // ordered by the stream itself
      if (c.ready[li]) {
        BRAID_CUDA_CHECK(on_set_device(ds, dg, [&] { return cudaStreamWaitEvent(stream, c.ready[li], 0); }));
        continue;
      }
      // join_at_launch: the participant's stream now, its work up to its call and whatever came
      // after it, none of which waits for this group (every rank of the group is here, on this GPU).
      BRAID_CUDA_CHECK(on_set_device(ds, dg, [&] { return cudaEventRecord(ds.joiner, c.streams[li]); }));
      BRAID_CUDA_CHECK(on_set_device(ds, dg, [&] { return cudaStreamWaitEvent(stream, ds.joiner, 0); }));
    }
    if (!by_streams) {
      BRAID_CUDA_CHECK(cudaStreamGetId(stream, &stream_id));
      if (ds.captured || stream_id != ds.last_stream) BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, ds.chain, 0));
    }
  }
  const cudaError_t e = on_set_device(ds, dg, [&] { return launch(stream, c.args); });
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
  if (by_streams) {
    // The participants' joins (join_locked) wait on it.
    if (joins && !c.capturing) BRAID_CUDA_CHECK(on_set_device(ds, dg, [&] { return cudaEventRecord(ds.chain, stream); }));
  } else if (c.capturing) {
    BRAID_CUDA_CHECK(cudaEventRecordWithFlags(ds.chain, stream, cudaEventRecordExternal));
    ds.captured = true;
  } else {
    BRAID_CUDA_CHECK(cudaEventRecord(ds.chain, stream));
    ds.last_stream = stream_id;
  }
  c.launched = true;
}

// A launch that serves every rank of the group (all of them on this GPU) and of which no part touches
// staging memory (pending_call::staging: every input is read in place, the schedule keeps no windows)
// runs its call as one round: staging bounds a round only through what it holds there.
inline void one_round_when_unstaged(pending_call& c) {
  cuda::device::launch_args& a = c.args;
  if (a.local != a.nranks || a.rounds <= 1) return;
  for (char s : c.staging)
    if (s) return;
  a.per_round = a.count;
  a.rounds = 1;
}

[[noreturn]] inline void raise_failed(const pending_call& c, const error_context& ctx) {
  raise(c.failure_code, c.failure, ctx);
}

// Which call of its rank `c` is, for a record of the group's error.
inline cuda::device::call_id call_of(const pending_call& c) {
  return {static_cast<int>(c.args.coll), c.args.seq};
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
  more.release();
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
      enqueue::stop_group(*j.set, j.rank, static_cast<unsigned>(errc::invalid_usage), enqueue::call_of(*j.call));
      j.set->cv.notify_all();
      if (first.empty()) first = j.call->failure, code = errc::invalid_usage, first_rank = j.rank;
      continue;
    }
    if (!enqueue::needs_join(*j.call, j.stream)) continue;
    try {
      std::optional<cuda::detail::device_guard> dg; // join_locked makes it current itself under call_order::streams
      if (j.set->order == call_order::braid) dg.emplace(j.set->device);
      enqueue::join_locked(*j.set, *j.call, j.stream);
    } catch (const std::exception& e) {
      if (first.empty()) first = e.what(), code = errc::cuda, first_rank = j.rank;
    }
  }
  if (!first.empty()) raise(code, first, error_context{first_rank, "group_end", 0, -1});
}

// Ends a bracket when its scope ends: group_end() unless `ended`, its error raised unless an
// exception is already on its way (`uncaught`: std::uncaught_exceptions() when the scope began).
namespace enqueue {
inline void end_scope(bool& ended, int uncaught) {
  if (ended) return;
  ended = true;
  if (std::uncaught_exceptions() > uncaught) {
    try {
      group_end();
    } catch (...) {
    }
    return;
  }
  group_end();
}
} // namespace enqueue

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
  ~group_scope() noexcept(false) { enqueue::end_scope(ended_, uncaught_); }

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
                   const cuda::device::rank_call& mine, bool uses_staging,
                   cudaStream_t stream, std::chrono::nanoseconds timeout, cuda::device::device_abort* abort, int nsets,
                   const std::function<cudaError_t(cudaStream_t, const cuda::device::launch_args&)>& launch,
                   const error_context& ctx) {
  device_set& ds = *dsp;
  const bool in_bracket = bracket().depth > 0;
  const int L = static_cast<int>(ds.ranks.size());
  // Under call_order::streams the capture is not asked about: a launch is all there is to capture.
  const bool capturing = ds.order == call_order::braid && is_capturing(stream);
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
    c->parts.assign(static_cast<std::size_t>(L), cuda::device::rank_call{});
    c->staging.assign(static_cast<std::size_t>(L), 0);
    c->here.assign(static_cast<std::size_t>(L), 0);
    c->streams.assign(static_cast<std::size_t>(L), nullptr);
    c->ready.assign(static_cast<std::size_t>(L), nullptr);
  }
  const std::string which = "GPU " + std::to_string(ds.device) + ", the group's launch #" + std::to_string(seq + 1) + " there";
  const cuda::device::call_id my_call{static_cast<int>(call.coll), common.seq};
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
  // One launch carries one call word and number for its ranks: theirs agree whenever every call of
  // theirs went through the same launches, as the launcher makes them.
  if (c->args.call_word != common.call_word || c->args.seq != common.seq)
    fail_all(errc::internal, "the ranks of " + which + " disagree on their earlier calls (call words or numbers differ)");
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
      cuda::detail::device_guard dg(ds.device); // the event is the set's GPU's
      BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    } else {
      ev = ds.spare.back();
      ds.spare.pop_back();
    }
    std::optional<cuda::detail::device_guard> dg;
    if (const cudaError_t e = on_set_device(ds, dg, [&] { return cudaEventRecord(ev, stream); }); e != cudaSuccess) {
      ds.spare.push_back(ev);
      cuda::detail::raise_cuda(e, "cudaEventRecord (the rank's stream)", __FILE__, __LINE__, ctx);
    }
  }
  // Counted in.
  ds.calls.emplace(seq, c);
  ++ds.next_seq[me];
  ds.last_thread[me] = this_thread_token();
  c->parts[me] = mine;
  c->staging[me] = uses_staging;
  c->here[me] = 1;
  c->streams[me] = stream;
  c->ready[me] = ev;
  c->capturing = c->capturing || capturing;
  ++c->arrived;
  if (c->arrived == L) {
    ds.calls.erase(seq);
    one_round_when_unstaged(*c);
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
    bracket().joins.push_back(deferred_join{dsp, c, stream, rank, keep});
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
