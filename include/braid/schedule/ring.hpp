// braid/schedule/ring.hpp — ring all-reduce (reduce-scatter then all-gather around the ring),
// ring reduce-scatter and all-gather, and chain (pipelined ring) broadcast and reduce.
//
// all_reduce / reduce_scatter: rank r at reduce-scatter step s (0..n-2) handles chunk (r+n-2-s)%n:
// it reduces its predecessor's partial (the predecessor's IN at s = 0) with its own IN. It ends holding
// the final value of chunk r, so chunk c is reduced in rank order c+1, c+2, ..., c (mod n); the final
// value is computed once and then copied, so every rank gets the same bits.
// all-gather step t (0..n-2): copy chunk (r-1-t)%n from the predecessor.
// broadcast / reduce: a chain from the root (v = (r-root)%n is the position in the chain), pipelined
// over nchunks chunks.
#pragma once

#include "common.hpp"

namespace braid::schedule {

struct ring {
  BRAID_HD static constexpr std::uint32_t nchunks(collective c, int n, std::uint32_t pipeline) {
    return (c == collective::broadcast || c == collective::reduce) ? (pipeline ? pipeline : 1)
                                                                  : static_cast<std::uint32_t>(n);
  }
  BRAID_HD static constexpr int nphases(collective c, int) { return c == collective::all_reduce ? 2 : 1; }

  BRAID_HD static constexpr int nsteps(const args& a) {
    const int n = a.nranks;
    switch (a.coll) {
    case collective::all_reduce: return 2 * (n - 1);
    case collective::reduce_scatter: return n - 1;
    case collective::all_gather: return n; // n-1 forwarding steps, then the own block
    default: return static_cast<int>(a.nchunks);
    }
  }

  BRAID_HD static constexpr step at(const args& a, int j) {
    const int n = a.nranks, r = a.rank, prev = mod(r - 1, n);
    switch (a.coll) {
    case collective::all_reduce:
    case collective::reduce_scatter: {
      const bool ar = a.coll == collective::all_reduce;
      if (j <= n - 2) {
        const auto c = static_cast<std::uint32_t>(mod(r + n - 2 - j, n));
        const source from = j == 0 ? src_in(prev) : src_win(prev, 0, j - 1);
        const bool last = j == n - 2;
        if (!last) return reduce_step(c, c + 1, from, src_in(r), 0, false, false);
        return reduce_step(c, c + 1, from, src_in(r), ar ? 1 : -1, true, true);
      }
      const int t = j - (n - 1);
      const auto c = static_cast<std::uint32_t>(mod(r - 1 - t, n));
      return copy_step(c, c + 1, src_win(prev, 1, n - 2 + t), t < n - 2 ? 1 : -1, true);
    }
    case collective::all_gather: {
      if (j == n - 1) return copy_step(static_cast<std::uint32_t>(r), static_cast<std::uint32_t>(r) + 1, src_in(r), -1, true);
      const auto c = static_cast<std::uint32_t>(mod(r - 1 - j, n));
      const source from = j == 0 ? src_in(prev) : src_win(prev, 0, j - 1);
      return copy_step(c, c + 1, from, j < n - 2 ? 0 : -1, true);
    }
    case collective::broadcast: {
      const int v = mod(r - a.root, n);
      const auto c = static_cast<std::uint32_t>(j);
      if (v == 0) return copy_step(c, c + 1, src_in(r), -1, true);
      const source from = v == 1 ? src_in(prev) : src_win(prev, 0, j);
      return copy_step(c, c + 1, from, v < n - 1 ? 0 : -1, true);
    }
    case collective::reduce: {
      const int v = mod(r - a.root, n), next = mod(r + 1, n);
      const auto c = static_cast<std::uint32_t>(j);
      if (v == n - 1) return nothing(); // the chain's head: its IN is read by the next in line
      const source from = v + 1 == n - 1 ? src_in(next) : src_win(next, 0, j);
      return reduce_step(c, c + 1, from, src_in(r), v == 0 ? -1 : 0, v == 0, v == 0);
    }
    default: return nothing();
    }
  }

  // Whether peers read chunk c of this rank's IN (so it must be published before the round).
  BRAID_HD static constexpr bool in_published(const args& a, std::uint32_t c) {
    const int n = a.nranks, r = a.rank;
    switch (a.coll) {
    case collective::all_reduce:
    case collective::reduce_scatter: return static_cast<int>(c) == mod(r - 1, n);
    case collective::all_gather: return static_cast<int>(c) == r;
    case collective::broadcast: return r == a.root;
    case collective::reduce: return mod(r - a.root, n) == n - 1;
    default: return false;
    }
  }
};

} // namespace braid::schedule
