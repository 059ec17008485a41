// braid/cuda/process/host_layout.hpp — what braid::cuda::process_communicator's host path
// (cuda/process/host_path.cuh) needs to replay a schedule, kept free of CUDA so that CPU tests check it:
// the staging half of a round, the host meetings between a round's steps, and the reduce kernel's
// grid.
//
// A staging half is chunk_map's regions (schedule/common.hpp: region 0 the staged input, region
// 1 + phase the windows) followed by `slots` scratch pieces, where the copy engines bring a peer's
// chunk before a reduce reads it. Every rank computes the same half from (schedule, collective,
// ranks, element, half size), so a rank finds a peer's regions without asking.
//
// No kernel waits for a peer on this path: a step that reads what a peer's step wrote runs after a
// host meeting (a wait for this rank's stream, then a barrier of every rank) that follows the peer's
// step. host_levels assigns each rank's steps to levels, the same on every rank: a step's level is
// past the level of every peer step it reads, and not below its own rank's previous step. A round
// runs its levels in order with one meeting between consecutive levels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "../../schedule/common.hpp"

namespace braid::cuda::process {

using u64 = std::uint64_t;

inline constexpr u64 round_up(u64 x, u64 a) { return (x + a - 1) / a * a; }

// Chunks per round on the host path: each step already meets on the host, so the chunked
// schedules are not pipelined (1 asks for their unpipelined form).
inline constexpr std::uint32_t host_pipeline = 1;

// One staging half of a round of `per` elements per block.
struct host_half {
  u64 per = 0;          // elements per block per round (chunk_map's cap); 0: nothing fits
  u64 region_bytes = 0; // one of chunk_map's regions
  int regions = 0;      // 1 + the schedule's window phases
  u64 scratch_off = 0;  // the first scratch piece
  u64 piece_bytes = 0;  // one scratch piece: the largest chunk, padded to 256 bytes
  int slots = 0;        // scratch pieces: n - 1 where the collective reduces, else 0
  u64 total = 0;        // bytes of the half used
};

template <class S, class T> constexpr host_half host_half_for(collective c, int n, u64 per) {
  host_half L;
  L.per = per;
  const schedule::chunk_map<T> map(c, n, 0, 0, per, per);
  L.region_bytes = map.region_bytes;
  L.regions = 1 + S::nphases(c, n);
  L.scratch_off = round_up(static_cast<u64>(L.regions) * L.region_bytes, 256);
  const bool reduces = c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
  L.slots = reduces ? n - 1 : 0;
  const std::uint32_t P = S::nchunks(c, n, host_pipeline);
  // split_begin gives the first chunks the extra units: chunk 0 is the largest.
  const u64 piece = schedule::chunk_at(c, per, P, 0, schedule::chunk_unit<T>()).count;
  L.piece_bytes = round_up(piece * sizeof(T), 256);
  L.total = L.scratch_off + L.piece_bytes * static_cast<u64>(L.slots);
  return L;
}

// The largest round whose half fits `half` bytes (a multiple of the chunk unit where it is at least
// one); per == 0 if not even one element per block fits.
template <class S, class T> constexpr host_half fit_host_half(collective c, int n, u64 half) {
  const u64 unit = schedule::chunk_unit<T>();
  u64 per = schedule::per_round<S, T>(c, n, half);
  while (per > 0) {
    const host_half L = host_half_for<S, T>(c, n, per);
    if (L.total <= half) return L;
    // Scale down by the overshoot, always by at least one element, and keep to the unit.
    u64 next = static_cast<u64>(static_cast<double>(per) * static_cast<double>(half) / static_cast<double>(L.total));
    if (next >= per) next = per - 1;
    if (next >= unit) next -= next % unit;
    per = next;
  }
  return {};
}

// The levels of one round's steps, for every rank (see the header comment).
struct host_levels {
  int nranks = 0, max_steps = 0;
  int depth = 0;               // levels in the round (meetings: depth - 1)
  bool last_reads_in = false;  // a step of the last level reads a peer's input region
  std::vector<int> nsteps;     // per rank
  std::vector<int> level;      // [rank * max_steps + step]
  constexpr int at(int q, int j) const { return level[static_cast<std::size_t>(q * max_steps + j)]; }
};

template <class S> host_levels levels_for(collective c, int n, int root) {
  host_levels v;
  v.nranks = n;
  const std::uint32_t P = S::nchunks(c, n, host_pipeline);
  v.nsteps.resize(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    v.nsteps[static_cast<std::size_t>(q)] = S::nsteps(schedule::args{c, n, q, root, P});
    v.max_steps = std::max(v.max_steps, v.nsteps[static_cast<std::size_t>(q)]);
  }
  v.level.assign(static_cast<std::size_t>(n) * static_cast<std::size_t>(v.max_steps), -1);
  // Each level is set once, rank by rank and step by step; a step whose peer source is not yet set
  // sets that one first (the schedules' steps form no circle: tests/schedule/ simulates them).
  std::vector<std::pair<int, int>> todo;
  for (int q0 = 0; q0 < n; ++q0)
    for (int j0 = 0; j0 < v.nsteps[static_cast<std::size_t>(q0)]; ++j0) {
      if (v.at(q0, j0) >= 0) continue;
      todo.assign(1, {q0, j0});
      while (!todo.empty()) {
        const auto [q, j] = todo.back();
        if (v.at(q, j) >= 0) {
          todo.pop_back();
          continue;
        }
        int lv = 0;
        bool ready = true;
        if (j > 0) {
          if (v.at(q, j - 1) < 0) {
            todo.push_back({q, j - 1});
            ready = false;
          } else {
            lv = v.at(q, j - 1);
          }
        }
        const schedule::step st = S::at(schedule::args{c, n, q, root, P}, j);
        for (int i = 0; i < st.count_sources(n); ++i) {
          const schedule::source s = st.source_at(i);
          if (s.rank == q || s.ready < 0) continue;
          const int pl = v.at(s.rank, s.ready);
          if (pl < 0) {
            todo.push_back({s.rank, s.ready});
            ready = false;
          } else {
            lv = std::max(lv, pl + 1);
          }
        }
        if (!ready) continue;
        v.level[static_cast<std::size_t>(q * v.max_steps + j)] = lv;
        v.depth = std::max(v.depth, lv + 1);
        todo.pop_back();
      }
    }
  for (int q = 0; q < n; ++q)
    for (int j = 0; j < v.nsteps[static_cast<std::size_t>(q)]; ++j) {
      if (v.at(q, j) + 1 != v.depth) continue;
      const schedule::step st = S::at(schedule::args{c, n, q, root, P}, j);
      for (int i = 0; i < st.count_sources(n); ++i) {
        const schedule::source s = st.source_at(i);
        if (s.rank != q && s.reg == schedule::region::in) v.last_reads_in = true;
      }
    }
  return v;
}

// The levels of the schedules one communicator has run, each computed once: levels_for walks every
// rank's steps (about 3 us for two_shot at 8 ranks and 0.4 ms for ring at 64 on this project's CPU
// VMs), where a call only looks them up. Root is part of the key only for the rooted collectives. A
// table returned stays where it is until 16 newer ones have been added.
class host_levels_cache {
public:
  template <class S> const host_levels& get(algo a, collective c, int n, int root) {
    const int kr = c == collective::broadcast || c == collective::reduce ? root : 0;
    const std::uint64_t key = static_cast<std::uint64_t>(a) | static_cast<std::uint64_t>(c) << 8 |
                              static_cast<std::uint64_t>(static_cast<std::uint32_t>(kr)) << 16;
    for (const auto& e : entries_)
      if (e.first == key) return e.second;
    if (entries_.size() >= max_entries) entries_.erase(entries_.begin());
    entries_.emplace_back(key, levels_for<S>(c, n, kr));
    ++computed_;
    return entries_.back().second;
  }
  std::size_t computed() const { return computed_; }

private:
  static constexpr std::size_t max_entries = 16;
  std::deque<std::pair<std::uint64_t, host_levels>> entries_; // a deque: adding an entry moves none
  std::size_t computed_ = 0;
};

// Bytes of a piece one block of the host path's reduce kernel takes when the grid comes from the
// device: 64 per thread at 512 threads, four 16-byte loads per source, enough to keep loads in flight
// without launching blocks that find nothing to do.
inline constexpr u64 reduce_bytes_per_block = 32 << 10;

// Blocks of the host path's reduce kernel for a piece of `m` elements of `elem` bytes: `asked`
// (process_options::reduce_blocks) if positive, else one per reduce_bytes_per_block of the piece, at
// most one per SM of the device (`sms`); never more blocks than there are threads' worth of elements,
// never fewer than one.
inline constexpr u64 reduce_grid(u64 m, std::size_t elem, int asked, int sms, int threads) {
  const u64 by_threads = (m + static_cast<u64>(threads) - 1) / static_cast<u64>(threads);
  u64 g = asked > 0 ? static_cast<u64>(asked) : (m * elem + reduce_bytes_per_block - 1) / reduce_bytes_per_block;
  if (asked <= 0 && g > static_cast<u64>(sms > 0 ? sms : 1)) g = static_cast<u64>(sms > 0 ? sms : 1);
  if (g > by_threads) g = by_threads;
  return g > 0 ? g : 1;
}

} // namespace braid::cuda::process
