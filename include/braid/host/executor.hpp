// braid/host/executor.hpp — runs a schedule on the host: the CPU twin of the CUDA kernels.
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

#include "../core/ops.hpp"
#include "../core/reduce.hpp"
#include "../schedule/call.hpp"
#include "../schedule/schedule.hpp"
#include "context.hpp"

namespace braid::host {

// Elements per block per round for this collective and schedule on this communicator's staging
// halves; 0 if even one element does not fit.
template <class S, class T> std::uint64_t per_round(const rank_context& cx, collective coll) {
  return schedule::per_round<S, T>(coll, cx.nranks, cx.seg.layout.half_bytes);
}

template <class S, class T, class Op>
// Runs `call` (its record, schedule/call.hpp) on this rank under schedule S. Peers read `call.in` in
// place when call.in_desc is set (it must stay valid and unchanged until return); braid never writes
// `call.in` unless it aliases `call.out`.
void run_schedule(rank_context& cx, const braid::detail::call_record& call, const Op& op) {
  const collective coll = call.coll;
  using schedule::chunk_span;
  const int n = cx.nranks, r = cx.rank;
  const T* in = static_cast<const T*>(call.in);
  T* out = static_cast<T*>(call.out);
  const std::uint64_t cap = per_round<S, T>(cx, coll);
  const std::uint64_t unit = schedule::chunk_unit<T>();
  const int nph = S::nphases(coll, n);
  const schedule::chunk_map<T> map(coll, n, r, call.root, call.count, cap);
  const T* few[16];
  std::vector<const T*> many;
  const T** ptrs = few;
  if (n > 16) {
    many.resize(static_cast<std::size_t>(n));
    ptrs = many.data();
  }
  auto slot = [&](int q, std::uint64_t parity, int region, std::uint32_t c, const chunk_span& s) -> T* {
    return map.slot(cx.seg.half(q, parity), region, c, s);
  };

  const std::uint64_t rounds = schedule::nrounds(call.count, cap);
  std::uint64_t R = cx.round;
  for (std::uint64_t k = 0; k < rounds; ++k) {
    R = ++cx.round;
    const std::uint64_t h = R & 1;
    const std::uint64_t base = k * cap, len = schedule::round_len(call.count, cap, k);
    const std::uint32_t P = S::nchunks(coll, n, schedule::pipeline_chunks<T>(len));
    const schedule::args a{coll, n, r, call.root, P};

    // Prologue: the half is free once every peer finished round R - 2; then stage the input, and
    // publish where it is, this call's word and the post: three stores to one line (segment.hpp).
    if (R >= 3)
      for (int q = 0; q < n; ++q)
        if (q != r) cx.wait_progress(q, progress_word(R - 1, 0));
    if (!call.in_desc)
      for (std::uint32_t c = 0; c < P; ++c) {
        if (!map.stages(c, S::in_published(a, c))) continue;
        const chunk_span s = schedule::chunk_at(coll, len, P, c, unit);
        if (s.count) std::memcpy(slot(r, h, 0, c, s), in + map.in_off(c, s, base), s.count * sizeof(T));
      }
    cx.self().in_desc[h] = call.in_desc;
    cx.publish_call(R);
    cx.post(progress_word(R, 1));

    const int nsteps = S::nsteps(a);
    for (int j = 0; j < nsteps; ++j) {
      const schedule::step st = S::at(a, j);
      const int ns = st.count_sources(n);
      for (int i = 0; i < ns; ++i) {
        const schedule::source s = st.source_at(i);
        if (s.rank != r) {
          cx.wait_progress(s.rank, progress_word(R, static_cast<std::uint64_t>(s.ready + 2)));
          cx.check_call(s.rank, R); // before anything of s.rank's is read: same call, same round
        }
      }
      for (std::uint32_t c = st.lo; c < st.hi; ++c) {
        const chunk_span sp = schedule::chunk_at(coll, len, P, c, unit);
        if (sp.count == 0) continue;
        for (int i = 0; i < ns; ++i) {
          ptrs[i] = map.source_at(
              st.source_at(i), in, c, sp, base,
              [&](int q, int region, std::uint32_t ch, const chunk_span& x) { return slot(q, h, region, ch, x); },
              [&](int q) -> const T* {
                const std::uint64_t d = cx.seg.rank(q).in_desc[h];
                return d ? reinterpret_cast<const T*>(cx.resolve_input(q, d)) : nullptr;
              });
        }
        T* w = st.win >= 0 && st.win < nph ? slot(r, h, 1 + st.win, c, sp) : nullptr;
        T* o = st.out && map.out_covers(c) ? out + map.out_off(c, sp, base) : nullptr;
        if (!w && !o) continue;
        reduce_n<T>(ptrs, ns, o ? o : w, o ? w : nullptr, sp.count, op, st.final, n);
      }
      // The last step's post is the round's end below: (R + 1) << 24 exceeds every word of round R, so
      // a peer waiting for this step is released by it, and the line peers spin on moves once less.
      if (j + 1 < nsteps) cx.post(progress_word(R, static_cast<std::uint64_t>(j) + 2));
    }
    cx.post(progress_word(R + 1, 0));
  }
  if (call.in_desc && rounds)
    for (int q = 0; q < n; ++q)
      if (q != r) cx.wait_progress(q, progress_word(R + 1, 0));
}

// Dissemination barrier: one round with no data. It publishes a call word (cx.begin_rounds) that a
// collective's reader compares, and that later calls chain on; reading no data, it compares none.
inline void run_barrier(rank_context& cx) {
  const std::uint64_t R = ++cx.round;
  const int n = cx.nranks;
  if (R >= 3)
    for (int q = 0; q < n; ++q)
      if (q != cx.rank) cx.wait_progress(q, progress_word(R - 1, 0));
  cx.publish_call(R);
  cx.post(progress_word(R, 1));
  const int K = schedule::dissemination::nsteps(n);
  for (int k = 0; k < K; ++k) {
    const schedule::step st = schedule::dissemination::at(n, cx.rank, k);
    cx.wait_progress(st.src[0].rank, progress_word(R, static_cast<std::uint64_t>(st.src[0].ready + 2)));
    if (k + 1 < K) cx.post(progress_word(R, static_cast<std::uint64_t>(k) + 2)); // the last: the round's end
  }
  cx.post(progress_word(R + 1, 0));
}

} // namespace braid::host
