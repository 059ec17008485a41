// braid/cuda/process_layout.hpp — the staging arithmetic of braid::cuda::process_communicator
// (cuda/process.cuh), kept free of CUDA so that CPU tests check it: how many elements one round
// moves, where the input, result and scratch regions of a staging half lie, and how a round of
// all_reduce is cut into one shard per rank, and the reduce kernel's grid.
//
// Every rank computes the same layout from (collective, ranks, element size, half size, count), so a
// rank finds a peer's regions without asking. A half holds, for a round of `per` elements per block:
//   in       the rank's staged input slice (reduce_scatter: n blocks of `per`)
//   result   all_reduce only: the rank's reduced shard, which the peers copy
//   scratch  n - 1 pieces the copy engines bring from the peers before the reduce kernel runs
#pragma once

#include <cstddef>
#include <cstdint>

#include "../schedule/common.hpp"

namespace braid::cuda::ipc_detail {

using u64 = std::uint64_t;

inline constexpr u64 round_up(u64 x, u64 a) { return (x + a - 1) / a * a; }

// Staging layout of one half for a round of `per` elements per block: [in | result | scratch].
struct half_layout {
  u64 per = 0;            // elements per block per round
  u64 in_off = 0, in_bytes = 0;
  u64 res_off = 0, res_bytes = 0;
  u64 scratch_off = 0, piece_bytes = 0; // n - 1 pieces
  u64 total = 0;
};

// Elements of an all_reduce shard (a multiple of 16 bytes where the type allows, so vector accesses
// stay aligned): shard q of a round of `len` covers [q * s, min(len, (q + 1) * s)).
inline constexpr u64 shard_elems(u64 len, int n, std::size_t elem) {
  const u64 a = elem <= 16 && 16 % elem == 0 ? 16 / elem : 1;
  return round_up((len + static_cast<u64>(n) - 1) / static_cast<u64>(n), a);
}

inline half_layout layout_for(collective c, int n, std::size_t elem, u64 per) {
  const u64 un = static_cast<u64>(n);
  half_layout L;
  L.per = per;
  const u64 in_elems = c == collective::reduce_scatter ? per * un : per;
  L.in_bytes = in_elems * elem;
  L.res_off = round_up(L.in_bytes, 256);
  if (c == collective::all_reduce) {
    L.res_bytes = shard_elems(per, n, elem) * elem;
    L.piece_bytes = L.res_bytes;
  } else if (c == collective::reduce_scatter || c == collective::reduce) {
    L.piece_bytes = per * elem;
  }
  L.scratch_off = round_up(L.res_off + L.res_bytes, 256);
  L.total = L.scratch_off + round_up(L.piece_bytes, 256) * (un - 1);
  return L;
}

// The largest round (elements per block) whose layout fits `half` bytes; 0 if none does.
inline half_layout fit_layout(collective c, int n, std::size_t elem, u64 half, u64 count) {
  const u64 un = static_cast<u64>(n);
  u64 factor = 1;
  if (c == collective::all_reduce) factor = 2;
  else if (c == collective::reduce_scatter) factor = 2 * un - 1;
  else if (c == collective::reduce) factor = un;
  u64 per = half / elem / factor;
  const u64 a = c == collective::all_reduce ? un * (elem <= 16 && 16 % elem == 0 ? 16 / elem : 1) : 1;
  if (per >= count) per = count;
  else per = per / a * a;
  while (per > 0) {
    const half_layout L = layout_for(c, n, elem, per);
    if (L.total <= half) return L;
    // The estimate ignores padding: step down by about 1/64 (a multiple of the alignment unit).
    const u64 step = per / 64 / a * a > a ? per / 64 / a * a : a;
    per = per > step ? (per - step) / a * a : 0;
  }
  return {};
}

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

} // namespace braid::cuda::ipc_detail
