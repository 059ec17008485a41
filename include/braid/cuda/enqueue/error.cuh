// braid/cuda/enqueue/error.cuh — how a one-process or cross-process CUDA group's first error reaches
// its callers: raise_recorded() reads the group's abort record (cuda/device/signal.cuh: written once, by a
// kernel that gave up waiting, by a host that refused a call, or by the peer-death watcher) and raises
// the braid::error every rank then sees, worded by where the failure was found. The launcher's bracket
// rule and CUDA_LAUNCH_BLOCKING live here too, since the timeout's message names them.
#pragma once

#include "../runtime.cuh"

#include <cstdlib>
#include <string>
#include <thread>

#include "../../core/error.hpp"
#include "../../core/types.hpp"
#include "../../schedule/common.hpp"
#include "../device/signal.cuh"
#include "../device/kernel.cuh"

namespace braid::cuda::enqueue {

// The rule a thread that drives several ranks of one GPU breaks when it blocks in one rank's call;
// every error of that mistake ends with it.
inline constexpr const char* bracket_rule =
    "the ranks of one GPU are launched together, so a thread that drives several of them must "
    "enqueue their calls between braid::cuda::group_start() and group_end() (or in a group_scope)";

// Whether CUDA_LAUNCH_BLOCKING=1 is set: every launch then returns only when its kernel has ended.
inline bool launch_blocking() {
  const char* lb = std::getenv("CUDA_LAUNCH_BLOCKING");
  return lb && lb[0] == '1';
}

// Raises the error a kernel (or a host) recorded in a group's abort record, if any. The error names
// the rank, peer and call the record names (the call during which a kernel gave up, or that a host
// refused: its collective and its sequence number on that rank); where the record names none, those
// of `caller` (the call, or check(), that found the record). Shared by both CUDA communicators.
inline void raise_recorded(cuda::device::device_abort* ab, const error_context& caller) {
  if (!cuda::device::abort_raised(ab)) return;
  // The flag is raised only once a slot is claimed; wait (briefly) until one is complete.
  const cuda::device::device_error* rec = nullptr;
  for (int i = 0; !(rec = cuda::device::abort_record(ab)); ++i) {
    if (i > 100000) raise(errc::aborted, "the group was aborted (its error record was never completed)", caller);
    std::this_thread::yield();
  }
  const cuda::device::device_error first = *rec;
  const bool named = first.call.seq != 0;
  error_context c{first.rank >= 0 ? first.rank : caller.rank,
                  named ? name(static_cast<collective>(first.call.coll)).data() : caller.collective,
                  named ? first.call.seq : caller.seq, first.peer >= 0 ? first.peer : caller.peer};
  if (first.step == cuda::device::fail_step::published) // a layer over the group (braid::mpi) found it
    raise(static_cast<errc>(first.code),
          first.code == static_cast<unsigned>(errc::mismatch)
              ? "mismatched calls across hosts: rank " + std::to_string(first.rank) +
                    " of this group found that its host's call differs from another host's (its own error names both calls); "
                    "the group is stopped"
              : "rank " + std::to_string(first.rank) + " stopped the group: " + std::string(braid::to_string(static_cast<errc>(first.code))),
          c);
  if (first.code == static_cast<unsigned>(errc::timeout)) {
    // With CUDA_LAUNCH_BLOCKING=1 a launch returns only when its kernel has ended, so a thread that
    // enqueues several ranks never launches the peers its first kernel waits for.
    const std::string hint = launch_blocking()
                                 ? " (CUDA_LAUNCH_BLOCKING=1 is set: each launch returns only when its kernel ends, so ranks "
                                   "enqueued by one thread cannot run together; enqueue each rank from its own thread, or unset it)"
                                 : "";
    if (first.step == cuda::device::fail_step::host_arrival) // the host waited for the GPU's other ranks to make the call
      raise(errc::timeout, "rank " + std::to_string(first.rank) + " waited more than the timeout for the other ranks of its GPU "
                               "to make the call (nothing was launched; " + bracket_rule + "); the group is stopped" + hint, c);
    raise(errc::timeout, "rank " + std::to_string(first.rank) + " waited more than the timeout for rank " +
                             std::to_string(first.peer) + " at step " + std::to_string(first.step) + " on the " +
                             device::device_kind() + hint, c);
  }
  if (first.code == static_cast<unsigned>(errc::peer_failed))
    raise(errc::peer_failed, "rank " + std::to_string(first.peer) + "'s process ended while the group was open (seen by rank " +
                                 std::to_string(first.rank) + "); the group is stopped", c);
  if (first.code == static_cast<unsigned>(errc::mismatch))
    raise(errc::mismatch, "mismatched calls: rank " + std::to_string(first.rank) + " found that rank " + std::to_string(first.peer) +
                              "'s call differs from its own in collective, element type, operator, count, root or algorithm "
                              "(or an earlier call of the two ranks did); the group is stopped", c);
  if (first.code == static_cast<unsigned>(errc::invalid_usage) && first.step == cuda::device::fail_step::launch_refused)
    raise(errc::invalid_usage, "the group was stopped: a call of rank " + std::to_string(first.rank) +
                                   " could not go on (ranks of its GPU disagreed, or a bracket ended without them); "
                                   "create a new group", c);
  if (first.code == static_cast<unsigned>(errc::invalid_usage))
    raise(errc::invalid_usage, "two launches of this group ran at once on rank " + std::to_string(first.rank) +
                                   "'s GPU (a CUDA graph replayed on a stream the group's other calls are not ordered "
                                   "with?): order them on one stream or with events; the group is stopped", c);
  raise(errc::aborted, "the group was aborted", c);
}

} // namespace braid::cuda::enqueue
