// braid/cuda/enqueue/args.cuh — one rank's launch arguments for a call, and the residency check of
// a kernel, for both CUDA communicators (one process, and processes on distinct GPUs).
#pragma once

#include "../runtime.cuh"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "../../comm/options.hpp"
#include "../../core/error.hpp"
#include "../../schedule/call.hpp"
#include "../../schedule/schedule.hpp"
#include "../check.cuh"
#include "../device/executor.cuh"

namespace braid::cuda::enqueue {
// How often a waiting kernel thread may read the group's host-mapped abort flag (wait_ge): every
// 100 us of a wait (cuda::device::default_abort_every_ns), or BRAID_CUDA_ABORT_POLL (BRAID_TIMEOUT's
// syntax: "1ms"; "0.001us" reads it at every look at the clock, every 64 polls), read once per
// process.
inline std::uint64_t abort_poll_ns() {
  static const std::uint64_t ns = [] {
    const char* s = std::getenv("BRAID_CUDA_ABORT_POLL");
    return s && *s ? static_cast<std::uint64_t>(options::parse_duration(s, "BRAID_CUDA_ABORT_POLL").count())
                   : std::uint64_t{cuda::device::default_abort_every_ns};
  }();
  return ns;
}

// The launch arguments for call `k` (its word `word`) under schedule S, for the executor's kernel: a round's elements
// from the staging half, checked against the staging memory and the kernel's step counters
// (unsupported_error). Both CUDA communicators (one process, and processes on distinct GPUs) fill
// them here.
template <class S, class T>
cuda::device::launch_args launch_args_for(const braid::detail::call_record& k, std::uint64_t word, int n, int r, std::uint64_t half_bytes,
                                         const cuda::device::device_rank* table, cuda::device::device_abort* abort,
                                         std::chrono::nanoseconds timeout, const error_context& ctx) {
  const collective c = k.coll;
  const std::uint64_t count = k.count;
  const int root = k.root;
  const std::uint64_t per = schedule::per_round<S, T>(c, n, half_bytes);
  if (per == 0) raise(errc::unsupported, "staging memory too small for this schedule", ctx);
  // Every round's schedule must fit the arrival counters.
  const std::uint32_t P = S::nchunks(c, n, schedule::pipeline_chunks<T>(std::min<std::uint64_t>(per, count)));
  if (S::nsteps(schedule::args{c, n, r, root, P}) > cuda::device::max_steps)
    raise(errc::unsupported, "schedule has too many steps per round for the CUDA executor", ctx);
  // The launcher adds what belongs to the GPU (its ranks' parts, its words, its slot).
  const cuda::device::launch_args la{.ranks = table,
                                     .nranks = n,
                                     .root = root,
                                     .coll = c,
                                     .count = count,
                                     .per_round = per,
                                     .rounds = schedule::nrounds(count, per),
                                     .half_bytes = half_bytes,
                                     .abort = abort,
                                     .timeout_ns = static_cast<std::uint64_t>(timeout.count()),
                                     .abort_every_ns = abort_poll_ns(),
                                     .call_word = word,
                                     .seq = ctx.seq};
  return la;
}

// Rank r's part of call `k` (its record, with k.in_desc set where peers read the input in place) in a
// launch whose rounds hold `per_round` elements per block, with `threads` threads per block.
template <class T>
cuda::device::rank_call rank_call_for(const braid::detail::call_record& k, int r, std::uint64_t per_round, unsigned threads) {
  // In place is always staged: k.in_desc is 0 there.
  const cuda::device::out_order order = k.in_place ? cuda::device::in_place_out_order<T>(k.coll, k.in, k.out, k.count, per_round, threads)
                                                   : cuda::device::out_order::none;
  return {r, order, k.in_desc != 0, k.in, k.out};
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

} // namespace braid::cuda::enqueue
