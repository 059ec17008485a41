// braid/cuda/executor.cuh — replays a schedule in one kernel per collective per rank: the GPU twin of
// transport/host/executor.hpp, with the same rounds, halves, progress words and write-once windows.
//
// All blocks of a rank's kernel share each step: thread 0 of every block waits (bounded) for the
// sources' progress, the whole grid reduces the step's chunks with a grid-stride loop, and the last
// block to arrive on the step's counter posts the rank's progress word. Round numbers come from a
// device-side counter read at kernel start and advanced at kernel end, so a collective captured in a
// CUDA graph uses fresh rounds on every replay. A kernel that times out or sees the group's abort
// flag returns early and leaves the error for the host (communicator::check()).
#pragma once

#include <cstdint>

#include "../schedule/schedule.hpp"
#include "device.cuh"
#include "kernel.cuh"

namespace braid::cuda_detail {

inline constexpr int max_steps = 254; // per round; the host refuses schedules with more

// What every rank's kernel needs to know about rank r (device pointers, valid on every GPU of the
// group through peer access).
struct device_rank {
  u64* progress;       // (round << 24) | steps posted, as on the host
  u64* in_desc;        // [2]: 0 = staged in the window, else the user's input pointer
  std::byte* half[2];  // staging halves
  u64* arrivals;       // [2][max_steps + 2] block arrival counters, then one exit counter (own rank only)
  u64* round;          // last round id used by this rank's kernels
};

struct launch_args {
  const device_rank* ranks; // [nranks], in this rank's device memory
  int nranks, rank, root;
  collective coll;
  const void* in;
  void* out;
  std::uint64_t count;      // elements per block
  std::uint64_t per_round;  // elements per block per round
  std::uint64_t rounds;
  std::uint64_t half_bytes;
  std::uint64_t in_desc;    // non-zero: peers read `in` in place (zero-copy)
  device_abort* abort;      // host-mapped, shared by the group
  u64 timeout_ns;
};

// Block arrival on slot `s` of round parity `h`; the last of gridDim.x blocks posts `word`.
// The counter's acq_rel add orders the other blocks' data writes (made visible by their fences)
// before the post; progress only ever grows (fetch_max).
BRAID_DEVICE bool arrive(u64* counter) {
  gpu::sync_block();
  bool last = false;
  if (gpu::thread_index() == 0) {
    gpu::fence_system();
    const u64 old = gpu::atomic_ref<u64, gpu::scope::device>(*counter).fetch_add(1, gpu::memory_order::acq_rel);
    last = old % gpu::grid_size() == gpu::grid_size() - 1;
  }
  return last;
}
BRAID_DEVICE void arrive_and_post(const launch_args& a, std::uint64_t h, int s, u64 word) {
  const device_rank& me = a.ranks[a.rank];
  if (arrive(me.arrivals + h * (max_steps + 2) + s)) post_max_release(me.progress, word);
}

template <class S, class T, class Op>
BRAID_KERNEL_BOUNDED(512) void collective_kernel(launch_args a, Op op) {
  using schedule::chunk_span;
  BRAID_SHARED u64 round0;
  BRAID_SHARED int stop;
  const int n = a.nranks, r = a.rank;
  const device_rank* ranks = a.ranks;
  const unsigned thread = gpu::thread_index(), block = gpu::block_index();
  if (thread == 0) {
    // Written by this rank's previous kernel, which ended before this one began (a relaxed atomic load,
    // as the volatile load it replaces: nothing may be cached from before the launch).
    round0 = gpu::atomic_ref<u64, gpu::scope::device>(*ranks[r].round).load(gpu::memory_order::relaxed);
    stop = 0;
  }
  gpu::sync_block();
  const std::uint64_t unit = schedule::chunk_unit<T>();
  const int nph = S::nphases(a.coll, n);
  const schedule::chunk_map<T> map(a.coll, n, r, a.root, a.count, a.per_round);
  const std::uint64_t tid = static_cast<std::uint64_t>(block) * gpu::block_size() + thread;
  const std::uint64_t nthreads = static_cast<std::uint64_t>(gpu::grid_size()) * gpu::block_size();
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  auto slot = [&](int q, std::uint64_t h, int region, std::uint32_t c, const chunk_span& s) -> T* {
    return map.slot(ranks[q].half[h], region, c, s);
  };
  auto wait = [&](int q, u64 target, int step) {
    // one thread waits; the block follows
    if (thread == 0 && !stop && !wait_ge(ranks[q].progress, target, a.abort, a.timeout_ns, r, q, step)) stop = 1;
  };

  std::uint64_t R = round0;
  for (std::uint64_t k = 0; k < a.rounds; ++k) {
    R = round0 + k + 1;
    const std::uint64_t h = R & 1;
    const std::uint64_t base = k * a.per_round;
    const std::uint64_t len = schedule::round_len(a.count, a.per_round, k);
    const std::uint32_t P = S::nchunks(a.coll, n, schedule::pipeline_chunks<T>(len));
    const schedule::args sa{a.coll, n, r, a.root, P};

    // No block starts round R before all blocks of this rank finished round R - 1 (so the arrival
    // counters of a parity are never shared by two rounds), nor before every peer finished R - 2.
    if (k > 0) wait(r, R << 24, -1);
    if (R >= 3)
      for (int q = 0; q < n; ++q)
        if (q != r) wait(q, (R - 1) << 24, -1);
    gpu::sync_block();
    if (stop) return;
    if (a.in_desc) {
      if (block == 0 && thread == 0) ranks[r].in_desc[h] = a.in_desc;
    } else {
      if (block == 0 && thread == 0) ranks[r].in_desc[h] = 0;
      for (std::uint32_t c = 0; c < P; ++c) {
        if (!map.stages(c, S::in_published(sa, c))) continue;
        const chunk_span s = schedule::chunk_at(a.coll, len, P, c, unit);
        const T* src[1] = {in + map.in_off(c, s, base)};
        // A copy: no operator is applied, so any element type (a struct without + included) compiles.
        reduce_copy<T>(src, 1, slot(r, h, 0, c, s), static_cast<T*>(nullptr), s.count, braid::detail::copy_only{}, false, n,
                       tid, nthreads);
      }
    }
    arrive_and_post(a, h, 0, (R << 24) | 1);

    const int nsteps = S::nsteps(sa);
    for (int j = 0; j < nsteps; ++j) {
      const schedule::step st = S::at(sa, j);
      const int ns = st.count_sources(n);
      for (int i = 0; i < ns; ++i) {
        const schedule::source s = st.source_at(i);
        if (s.rank != r || s.reg == schedule::region::win)
          wait(s.rank, (R << 24) | static_cast<u64>(s.ready + 2), j);
      }
      gpu::sync_block();
      if (stop) return;
      for (std::uint32_t c = st.lo; c < st.hi; ++c) {
        const chunk_span sp = schedule::chunk_at(a.coll, len, P, c, unit);
        if (sp.count == 0) continue;
        T* w = st.win >= 0 && st.win < nph ? slot(r, h, 1 + st.win, c, sp) : nullptr;
        T* o = st.out && map.out_covers(c) ? out + map.out_off(c, sp, base) : nullptr;
        if (!w && !o) continue;
        // The chunk's sources, found once per block (not per thread) and read by reduce_copy from
        // block-shared memory: no per-thread array (local memory), one in_desc load per peer and block.
        BRAID_SHARED const T* srcs[64];
        for (int i = static_cast<int>(thread); i < ns && i < 64; i += static_cast<int>(gpu::block_size())) {
          const schedule::source s = st.source_at(i);
          if (s.reg == schedule::region::win) {
            srcs[i] = slot(s.rank, h, 1 + s.phase, c, sp);
          } else if (s.rank == r) {
            srcs[i] = in + map.in_off(c, sp, base);
          } else {
            // Written by s.rank before it posted step 0 of round R, which thread 0 acquired before the
            // block barrier above; a relaxed system-scope load through the peer mapping.
            const u64 d = sys_u64(ranks[s.rank].in_desc[h]).load(gpu::memory_order::relaxed);
            srcs[i] = d ? reinterpret_cast<const T*>(d) + map.in_off(c, sp, base) : slot(s.rank, h, 0, c, sp);
          }
        }
        gpu::sync_block();
        reduce_copy<T, Op, collective_unroll<T, Op>>(srcs, ns, o ? o : w, o ? w : nullptr, sp.count, op, st.final, n, tid,
                                                    nthreads);
        gpu::sync_block(); // every thread is done with srcs before the next chunk rewrites it
      }
      arrive_and_post(a, h, j + 1, (R << 24) | static_cast<u64>(j + 2));
    }
    arrive_and_post(a, h, max_steps + 1, (R + 1) << 24);
  }
  if (a.in_desc && a.rounds)
    for (int q = 0; q < n; ++q)
      if (q != r) wait(q, (R + 1) << 24, -2);
  // The last block to leave advances the round counter for the next kernel on this stream (stream
  // order makes it visible before that kernel starts; every block read it before arriving here).
  if (arrive(ranks[r].arrivals + 2 * (max_steps + 2)) && thread == 0) *ranks[r].round = round0 + a.rounds;
}

} // namespace braid::cuda_detail
