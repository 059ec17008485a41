// braid/transport/host/executor.hpp — runs a schedule on the host: the CPU twin of the CUDA kernels.
//
// A collective runs in rounds; each round processes at most `per_round` elements per block so that
// the round's input copy and window phases fit one staging half. Round R uses half R % 2. Before a
// rank writes into a half it waits until every peer has finished round R - 2, the last one that used
// that half; within a round every window slot is written at most once (proved by the schedule
// simulator). So no data a peer may still read is ever overwritten, with one wait per round that is
// almost always already satisfied.
//
// Inputs are either staged (the chunks peers read are copied into the window: one copy) or, when the
// caller allows it, read in place by peers (zero-copy: threads, or buffers registered with the
// communicator); then the call does not return before every peer has finished reading.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../core/ops.hpp"
#include "../../core/reduce.hpp"
#include "../../schedule/schedule.hpp"
#include "context.hpp"

namespace braid::host {

// Element alignment of chunk boundaries: 64 bytes where the element size allows it.
template <class T> constexpr std::uint64_t chunk_unit() {
  return (64 % sizeof(T) == 0) ? 64 / sizeof(T) : 1;
}

// Elements per block per round for this collective and schedule; 0 if even one element does not fit.
template <class S, class T> std::uint64_t per_round(const rank_context& cx, collective coll) {
  const std::uint64_t regions = static_cast<std::uint64_t>(S::nphases(coll, cx.nranks)) + 1;
  const std::uint64_t blocks = schedule::blocked(coll) ? static_cast<std::uint64_t>(cx.nranks) : 1;
  std::uint64_t e = cx.seg.layout.half_bytes / (regions * blocks * sizeof(T) + regions * 64);
  const std::uint64_t unit = chunk_unit<T>();
  if (e >= unit) e -= e % unit;
  return e;
}

// Pipeline depth for the chunked schedules: chunks of about 64 KiB, between 1 and 32. A function of
// the round's size only, so every rank picks the same.
template <class T> constexpr std::uint32_t pipeline_chunks(std::uint64_t len) {
  const std::uint64_t bytes = len * sizeof(T);
  const std::uint64_t p = (bytes + (64u << 10) - 1) / (64u << 10);
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(p, 1, 32));
}

struct collective_buffers {
  const void* in;      // user input (never written by braid unless it aliases out)
  void* out;           // user output
  std::uint64_t count; // elements per block
  int root;
  bool zero_copy;      // peers read `in` directly (it must stay valid and unchanged until return)
  std::uint64_t in_desc; // what peers resolve to `in` when zero_copy: a pointer (threads) or a registry descriptor
};

template <class S, class T, class Op>
void run_schedule(rank_context& cx, collective coll, const collective_buffers& b, const Op& op) {
  using schedule::chunk_span;
  const int n = cx.nranks, r = cx.rank;
  const T* in = static_cast<const T*>(b.in);
  T* out = static_cast<T*>(b.out);
  const bool blk = schedule::blocked(coll);
  const std::uint64_t cap = per_round<S, T>(cx, coll);
  const std::uint64_t unit = chunk_unit<T>();
  const int nph = S::nphases(coll, n);
  const std::uint64_t region_bytes =
      align_up(cap * (blk ? static_cast<std::uint64_t>(n) : 1) * sizeof(T), 64);
  const T* few[16];
  std::vector<const T*> many;
  const T** ptrs = few;
  if (n > 16) {
    many.resize(static_cast<std::size_t>(n));
    ptrs = many.data();
  }

  // Element offsets of chunk c in a rank's user input and output for this round.
  auto in_off = [&](std::uint32_t c, const chunk_span& s, std::uint64_t base) -> std::uint64_t {
    return (coll == collective::reduce_scatter ? c * b.count : 0) + base + s.begin;
  };
  auto out_off = [&](std::uint32_t c, const chunk_span& s, std::uint64_t base) -> std::uint64_t {
    return (coll == collective::all_gather ? c * b.count : 0) + base + s.begin;
  };
  auto out_covers = [&](std::uint32_t c) {
    if (coll == collective::reduce_scatter) return static_cast<int>(c) == r;
    if (coll == collective::reduce) return r == b.root;
    return true;
  };
  auto slot = [&](int q, std::uint64_t parity, int region, std::uint32_t c, const chunk_span& s) -> T* {
    std::byte* h = cx.seg.half(q, parity) + static_cast<std::uint64_t>(region) * region_bytes;
    return reinterpret_cast<T*>(h) + (blk ? c * cap : 0) + s.begin;
  };

  const std::uint64_t rounds = schedule::nrounds(b.count, cap);
  std::uint64_t R = cx.round;
  for (std::uint64_t k = 0; k < rounds; ++k) {
    R = ++cx.round;
    const std::uint64_t h = R & 1;
    const std::uint64_t base = k * cap, len = schedule::round_len(b.count, cap, k);
    const std::uint32_t P = S::nchunks(coll, n, pipeline_chunks<T>(len));
    const schedule::args a{coll, n, r, b.root, P};

    // Prologue: the half is free once every peer finished round R - 2; then publish the input.
    if (R >= 3)
      for (int q = 0; q < n; ++q)
        if (q != r) cx.wait_progress(q, progress_word(R - 1, 0));
    rank_control& me = cx.self();
    if (b.zero_copy) {
      me.in_desc[h] = b.in_desc;
    } else {
      me.in_desc[h] = 0;
      for (std::uint32_t c = 0; c < P; ++c) {
        if (!S::in_published(a, c)) continue;
        if (coll == collective::all_gather && static_cast<int>(c) != r) continue;
        if (coll == collective::broadcast && r != b.root) continue;
        const chunk_span s = schedule::chunk_at(coll, len, P, c, unit);
        if (s.count) std::memcpy(slot(r, h, 0, c, s), in + in_off(c, s, base), s.count * sizeof(T));
      }
    }
    cx.post(progress_word(R, 1));

    const int nsteps = S::nsteps(a);
    for (int j = 0; j < nsteps; ++j) {
      const schedule::step st = S::at(a, j);
      const int ns = st.count_sources(n);
      for (int i = 0; i < ns; ++i) {
        const schedule::source s = st.source_at(i);
        if (s.rank != r) cx.wait_progress(s.rank, progress_word(R, static_cast<std::uint64_t>(s.ready + 2)));
      }
      for (std::uint32_t c = st.lo; c < st.hi; ++c) {
        const chunk_span sp = schedule::chunk_at(coll, len, P, c, unit);
        if (sp.count == 0) continue;
        for (int i = 0; i < ns; ++i) {
          const schedule::source s = st.source_at(i);
          if (s.reg == schedule::region::win) {
            ptrs[i] = slot(s.rank, h, 1 + s.phase, c, sp);
          } else if (s.rank == r) {
            ptrs[i] = in + in_off(c, sp, base);
          } else {
            const std::uint64_t d = cx.seg.rank(s.rank).in_desc[h];
            ptrs[i] = d ? reinterpret_cast<const T*>(cx.resolve_input(s.rank, d)) + in_off(c, sp, base)
                        : slot(s.rank, h, 0, c, sp);
          }
        }
        T* w = st.win >= 0 && st.win < nph ? slot(r, h, 1 + st.win, c, sp) : nullptr;
        T* o = st.out && out_covers(c) ? out + out_off(c, sp, base) : nullptr;
        if (!w && !o) continue;
        reduce_n<T>(ptrs, ns, o ? o : w, o ? w : nullptr, sp.count, op, st.final, n);
      }
      cx.post(progress_word(R, static_cast<std::uint64_t>(j) + 2));
    }
    cx.post(progress_word(R + 1, 0));
  }
  if (b.zero_copy && rounds)
    for (int q = 0; q < n; ++q)
      if (q != r) cx.wait_progress(q, progress_word(R + 1, 0));
}

// Dissemination barrier: one round with no data.
inline void run_barrier(rank_context& cx) {
  const std::uint64_t R = ++cx.round;
  const int n = cx.nranks;
  if (R >= 3)
    for (int q = 0; q < n; ++q)
      if (q != cx.rank) cx.wait_progress(q, progress_word(R - 1, 0));
  cx.post(progress_word(R, 1));
  const int K = schedule::dissemination::nsteps(n);
  for (int k = 0; k < K; ++k) {
    const schedule::step st = schedule::dissemination::at(n, cx.rank, k);
    cx.wait_progress(st.src[0].rank, progress_word(R, static_cast<std::uint64_t>(st.src[0].ready + 2)));
    cx.post(progress_word(R, static_cast<std::uint64_t>(k) + 2));
  }
  cx.post(progress_word(R + 1, 0));
}

} // namespace braid::host
