// braid/cuda/process/communicator.cuh's host path (some ranks share a GPU): each round meets on the host, no
// kernel waits for a peer; the reduce kernel reads peers' pieces through IPC mappings (process.cuh's
// header comment describes the rounds).
#pragma once

#include "../runtime.cuh"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../comm/communicator.hpp"
#include "../../comm/options.hpp"
#include "../../comm/validate.hpp"
#include "../../core/error.hpp"
#include "../../core/ops.hpp"
#include "../../core/types.hpp"
#include "../check.cuh"
#include "../collectives.cuh"
#include "../enqueue/launcher.cuh"
#include "../device/signal.cuh"
#include "../handles.cuh"
#include "ipc.cuh"
#include "state.cuh"
#include "../device/kernel.cuh"
#include "host_layout.hpp"
#include "../../schedule/call.hpp"
#include "../../schedule/schedule.hpp"

namespace braid::cuda::process {

// One round's call, as every rank announces it (also the synchronisation point of the round): the
// call's description (schedule/call.hpp, compared whole), the round, and where the rank's input
// lies for peers that read it in place.
struct call_desc {
  braid::detail::call_description call;
  u64 round, in_off;
  std::int32_t in_reg, valid;
};
static_assert(std::is_trivially_copyable_v<call_desc>);

template <class T> struct sources {
  const T* p[max_ranks];
};

// Launched with process_options::threads (512) threads per block: the bound keeps ptxas within 128
// registers. The sources stay in the parameter space (grid constant), where reduce_copy reads them.
template <class T, class Op>
BRAID_KERNEL_BOUNDED(512) void reduce_kernel(const BRAID_GRID_CONSTANT sources<T> s, int ns, T* dst, T* dst2, u64 count, Op op,
                                             bool final, int nranks) {
  const u64 tid = static_cast<u64>(device::block_index()) * device::block_size() + device::thread_index();
  const u64 nthreads = static_cast<u64>(device::grid_size()) * device::block_size();
  cuda::device::reduce_copy<T>(s.p, ns, dst, dst2, count, op, final, nranks, tid, nthreads);
}

// A device-to-device copy on `stream` (nothing for 0 bytes).
inline void copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes) BRAID_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

// The algorithm the host path runs for `requested`: automatic is two_shot for all_reduce (every rank
// reduces one chunk, one meeting between the reduce and the copies) and direct for the others.
constexpr algo host_algorithm(collective c, algo requested) {
  if (requested != algo::automatic) return requested;
  return c == collective::all_reduce ? algo::two_shot : algo::direct;
}

// Replays schedule S round by round (process_host_layout.hpp): each round stages the chunks peers
// read, announces the call (the round's first meeting), then runs its levels of steps with a meeting
// between consecutive levels. A step's copies are cudaMemcpyAsync; its reductions are one
// reduce_kernel launch per chunk, reading every source in place except a peer's piece on another
// GPU of at least copy_engine_min_bytes, which the copy engines bring into scratch first.
template <class S, collective c, class T, class Op>
void run_schedule(process_state& s, const braid::detail::call_record& call, const Op& op, cudaStream_t stream, error_context& ctx) {
  const T* in = static_cast<const T*>(call.in);
  T* out = static_cast<T*>(call.out);
  const std::uint64_t count = call.count;
  const int root = call.root;
  const algo a = call.algorithm;
  const int n = s.host.size(), r = s.host.rank();
  constexpr std::size_t E = sizeof(T);
  // The host's blocking steps, counted (process_stats::host_syncs).
  auto wait_stream = [&] {
    sync_stream(s, stream, ctx);
    ++s.stats.host_syncs;
  };
  auto host_barrier = [&] {
    s.host.barrier();
    ++s.stats.host_syncs;
  };
  const host_half L = fit_host_half<S, T>(c, n, s.half);
  if (L.per == 0) raise(errc::unsupported, "staging memory too small for one element per rank", ctx);
  const schedule::chunk_map<T> map(c, n, r, root, count, L.per);
  const std::uint32_t P = S::nchunks(c, n, host_pipeline);
  const schedule::args sa{c, n, r, root, P};
  const u64 unit = schedule::chunk_unit<T>();
  const host_levels& lv = s.levels.get<S>(a, c, n, root);
  const int my_steps = lv.nsteps[static_cast<std::size_t>(r)];
  // Peers read this rank's input in place when it lies in registered memory and the call is not in
  // place (then a step may overwrite an input chunk a peer has yet to read).
  bool reads_in = false;
  for (std::uint32_t ch = 0; ch < P; ++ch) reads_in = reads_in || S::in_published(sa, ch);
  const int in_reg = reads_in && !call.in_place ? find_registration(s, in, call.in_n * E) : -1;
  const auto in_base = in_reg >= 0 ? s.regs[static_cast<std::size_t>(in_reg)].mine : 0;
  const u64 rounds = schedule::nrounds(count, L.per);
  const u64 first = s.round; // round k of this call uses staging half (first + k) & 1
  const bool stages = reads_in && in_reg < 0;
  auto half_of = [&](int q, u64 h) { return s.peer_staging[static_cast<std::size_t>(q)] + h * s.half; };
  // (1) Round k's published input chunks, copied into region 0 of its half; consecutive chunks in
  // one copy (reduce_scatter's blocks as one 2D copy where the pitch allows).
  auto stage = [&](u64 k, cudaStream_t st) {
    const u64 base = k * L.per, len = schedule::round_len(count, L.per, k);
    std::byte* staging = half_of(r, (first + k) & 1);
    for (std::uint32_t lo = 0; lo < P;) {
      if (!map.stages(lo, S::in_published(sa, lo))) {
        ++lo;
        continue;
      }
      std::uint32_t hi = lo + 1;
      while (hi < P && map.stages(hi, S::in_published(sa, hi))) ++hi;
      const schedule::chunk_span a0 = schedule::chunk_at(c, len, P, lo, unit);
      T* to = map.slot(staging, 0, lo, a0);
      const T* from = in + map.in_off(lo, a0, base);
      if constexpr (schedule::blocked(c)) {
        const u64 rows = hi - lo, width = len * E;
        if (rows == 1) {
          copy(to, from, width, st);
        } else if (c == collective::reduce_scatter && count * E <= s.max_pitch && L.per * E <= s.max_pitch) {
          BRAID_CUDA_CHECK(cudaMemcpy2DAsync(to, L.per * E, from, count * E, width, rows, cudaMemcpyDeviceToDevice, st));
        } else {
          for (std::uint32_t ch = lo; ch < hi; ++ch) {
            const schedule::chunk_span sp = schedule::chunk_at(c, len, P, ch, unit);
            copy(map.slot(staging, 0, ch, sp), in + map.in_off(ch, sp, base), len * E, st);
          }
        }
        s.stats.staged_bytes += rows * width;
      } else {
        const schedule::chunk_span b0 = schedule::chunk_at(c, len, P, hi - 1, unit);
        const u64 m = b0.begin + b0.count - a0.begin;
        copy(to, from, m * E, st);
        s.stats.staged_bytes += m * E;
      }
      lo = hi;
    }
  };
  // Round k + 1's staging runs on the side stream beside round k's steps. Its half was last read in
  // round k - 1, and every peer finished those reads before it joined round k's announcement (below);
  // the caller's stream waits for it before the round's next wait for the stream.
  auto stage_ahead = [&](u64 k) {
    if (!stages || k + 1 >= rounds) return;
    stage(k + 1, s.side.h);
    BRAID_CUDA_CHECK(cudaEventRecord(s.staged.e, s.side.h));
    BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, s.staged.e, 0));
    ++s.stats.staged_ahead;
  };
  if (stages) stage(0, stream);
  wait_stream(); // the caller's earlier work (the input) and round 0's staging
  const braid::detail::call_description described = braid::detail::describe(call);
  std::vector<call_desc> descs(static_cast<std::size_t>(n));
  for (u64 k = 0; k < rounds; ++k) {
    const u64 base = k * L.per, len = schedule::round_len(count, L.per, k);
    const u64 h = s.round++ & 1;
    ++s.stats.rounds;
    // (2) Announce the round; every rank checks that all make the same call.
    call_desc d{};
    d.call = described;
    d.round = k;
    d.in_reg = in_reg;
    d.in_off = in_reg >= 0 ? reinterpret_cast<std::uintptr_t>(in) - in_base : 0;
    d.valid = 1;
    s.host.all_gather(reinterpret_cast<const std::uint8_t*>(&d), reinterpret_cast<std::uint8_t*>(descs.data()), sizeof d);
    ++s.stats.host_syncs;
    bool any_reg = false;
    for (int q = 0; q < n; ++q) {
      const auto& o = descs[static_cast<std::size_t>(q)];
      if (o.call != d.call || o.round != d.round || !o.valid) {
        ctx.peer = q;
        raise(errc::mismatch, "rank " + std::to_string(q) + " called " + braid::detail::call_text(braid::detail::unpack(o.call)) + " while this rank called " +
                                  braid::detail::call_text(braid::detail::unpack(d.call)),
              ctx);
      }
      if (o.in_reg >= 0) {
        any_reg = true;
        if (q != r && (o.in_reg >= static_cast<std::int32_t>(s.regs.size()) || !s.regs[static_cast<std::size_t>(o.in_reg)].live))
          raise(errc::protocol, "rank " + std::to_string(q) + " named registration " + std::to_string(o.in_reg) + ", unknown here", ctx);
        if (q != r && o.in_off + call.in_n * E > s.regs[static_cast<std::size_t>(o.in_reg)].peer_bytes[static_cast<std::size_t>(q)])
          raise(errc::protocol, "rank " + std::to_string(q) + "'s input runs past its registration", ctx);
      }
    }
    // Where a step's source lies for chunk ch: a window slot of its rank's half, this rank's own
    // input, a peer's registered input, or the chunk a peer staged.
    auto source_ptr = [&](const schedule::source& src, std::uint32_t ch, const schedule::chunk_span& sp) -> const T* {
      if (src.reg == schedule::region::win) return map.slot(half_of(src.rank, h), 1 + src.phase, ch, sp);
      if (src.rank == r) return in + map.in_off(ch, sp, base);
      const auto& o = descs[static_cast<std::size_t>(src.rank)];
      if (o.in_reg >= 0) {
        const registration& g = s.regs[static_cast<std::size_t>(o.in_reg)];
        return reinterpret_cast<const T*>(g.peer[static_cast<std::size_t>(src.rank)] + o.in_off) + map.in_off(ch, sp, base);
      }
      return map.slot(half_of(src.rank, h), 0, ch, sp);
    };
    auto run_step = [&](const schedule::step& st) {
      const int ns = st.count_sources(n);
      if (ns == 0) return;
      for (std::uint32_t ch = st.lo; ch < st.hi; ++ch) {
        const schedule::chunk_span sp = schedule::chunk_at(c, len, P, ch, unit);
        if (sp.count == 0) continue;
        T* w = st.win >= 0 && st.win + 1 < L.regions ? map.slot(half_of(r, h), 1 + st.win, ch, sp) : nullptr;
        T* o = st.out && map.out_covers(ch) ? out + map.out_off(ch, sp, base) : nullptr;
        if (!w && !o) continue;
        const u64 m = sp.count;
        if (ns == 1) {
          const schedule::source src = st.source_at(0);
          const T* from = source_ptr(src, ch, sp);
          if (src.rank != r) s.stats.copy_engine_bytes += m * E;
          if (o && o != from) copy(o, from, m * E, stream);
          if (w && w != from) copy(w, o ? o : from, m * E, stream);
          continue;
        }
        if constexpr (std::is_invocable_v<const Op&, const accumulator_t<T, Op>&, const accumulator_t<T, Op>&>) {
          const bool engines = m * E >= s.opts.copy_engine_min_bytes;
          sources<T> src{};
          int slot = 0;
          for (int i = 0; i < ns; ++i) {
            const schedule::source si = st.source_at(i);
            src.p[i] = source_ptr(si, ch, sp);
            if (si.rank == r) continue;
            if (engines && !s.same_gpu[static_cast<std::size_t>(si.rank)] && slot < L.slots) {
              T* to = reinterpret_cast<T*>(half_of(r, h) + L.scratch_off + L.piece_bytes * static_cast<u64>(slot++));
              copy(to, src.p[i], m * E, stream);
              src.p[i] = to;
              s.stats.copy_engine_bytes += m * E;
            } else {
              s.stats.direct_read_bytes += m * E;
            }
          }
          const auto blocks = static_cast<int>(reduce_grid(m, E, s.opts.reduce_blocks, s.sms, s.opts.threads));
          s.stats.reduce_grid = static_cast<std::uint64_t>(blocks);
          BRAID_CUDA_CHECK(device::launch(&reduce_kernel<T, Op>, static_cast<unsigned>(blocks), static_cast<unsigned>(s.opts.threads), 0,
                                       stream, src, ns, o ? o : w, o ? w : nullptr, m, op, st.final, n));
        } else {
          raise(errc::internal, "reduction requested for an operator that does not reduce", ctx);
        }
      }
    };
    // (3) The levels, one meeting between consecutive ones. Round k + 1 is staged once level 0 is
    // enqueued, beside it.
    int j = 0;
    for (int level = 0; level < lv.depth; ++level) {
      if (level > 0) {
        wait_stream();
        host_barrier();
      }
      for (; j < my_steps && lv.at(r, j) == level; ++j) run_step(S::at(sa, j));
      if (level == 0) stage_ahead(k);
    }
    // (4) The round's end. Its last level's reads need no wait when they read only windows and the
    // round has two levels or more: their owner rewrites a window of this half two rounds on, after
    // the barrier between the next round's first two levels, which this rank joins only after a
    // wait for its stream. The input region is rewritten sooner (staged ahead right after the next
    // announcement), so reads of it, and a call's last round, are awaited here.
    const bool last = k + 1 == rounds;
    if (last || lv.depth < 2 || lv.last_reads_in) wait_stream();
    // Peers read registered inputs in place until here.
    if (last && any_reg && lv.last_reads_in) host_barrier();
  }
}

template <collective c, class T, class Op>
void run_rounds(process_state& s, braid::detail::call_record call, const Op& op, cudaStream_t stream, algo requested, error_context& ctx) {
  if (s.host.size() == 1) {
    if (call.writes_out && !call.in_place) copy(call.out, call.in, call.out_n * sizeof(T), stream);
    sync_stream(s, stream, ctx);
    ++s.stats.host_syncs;
    return;
  }
  const algo a = host_algorithm(c, requested);
  call.algorithm = a; // the description's number stays 0: the host path compares whole descriptions every round
  schedule::with_supported_schedule<c>(a, [&](auto sch) { run_schedule<decltype(sch), c, T>(s, call, op, stream, ctx); });
}

} // namespace braid::cuda::process
