// braid/schedule/halving_doubling.hpp — recursive halving (reduce-scatter) and recursive doubling
// (all-gather), and their composition for all-reduce (Rabenseifner's algorithm).
//
// With p the largest power of two <= n and rem = n - p, ranks below 2*rem pair up first ("fold"): the
// odd rank of each pair reduces its even partner's input with its own and stands for both; the others
// stand for themselves. The p virtual ranks (v) then halve: at step k (1..L, L = log2 p) v exchanges
// with v ^ (p >> k) and keeps the half of its range on its side; after L steps v holds the final value
// of its own chunk group. Doubling reverses this with distances 1, 2, ..., p/2. Finally ("unfold") each
// even partner copies what it needs from its odd partner.
// Chunks: all_reduce uses P = p chunks (virtual rank v ends with chunk v); reduce_scatter and
// all_gather use P = n chunks = blocks, and virtual rank v's group is its ranks' blocks (2v, 2v+1 for
// folded pairs), which keeps every range contiguous.
// Steps: all_reduce 0 fold, 1..L halving, L+1..2L doubling, 2L+1 unfold; reduce_scatter 0 fold,
// 1..L halving, L+1 unfold; all_gather 0 fold, 1 own block, 2..L+1 doubling, L+2 unfold.
// Window phases: 0 the fold's result (all_gather: every final block), k the partial of halving step
// k, L the final values.
#pragma once

#include "common.hpp"

namespace braid::schedule {

struct halving_doubling {
  struct shape {
    int n, p, rem, L;
    bool blocks; // chunk i is block i (reduce_scatter, all_gather)
    BRAID_HD constexpr bool folded_out(int r) const { return r < 2 * rem && r % 2 == 0; }
    BRAID_HD constexpr bool folds_in(int r) const { return r < 2 * rem && r % 2 == 1; }
    BRAID_HD constexpr int virt(int r) const { return r < 2 * rem ? r / 2 : r - rem; }
    BRAID_HD constexpr int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
    BRAID_HD constexpr std::uint32_t first(int v) const {
      return static_cast<std::uint32_t>(!blocks ? v : (v < rem ? 2 * v : v + rem));
    }
  };
  BRAID_HD static constexpr shape shape_of(const args& a) {
    const int p = floor_pow2(a.nranks);
    return shape{a.nranks, p, a.nranks - p, log2_exact(p), a.coll != collective::all_reduce};
  }

  BRAID_HD static constexpr std::uint32_t nchunks(collective c, int n, std::uint32_t) {
    return static_cast<std::uint32_t>(c == collective::all_reduce ? floor_pow2(n) : n);
  }
  BRAID_HD static constexpr int nphases(collective c, int n) {
    return c == collective::all_gather ? 1 : log2_exact(floor_pow2(n)) + 1;
  }
  BRAID_HD static constexpr int nsteps(const args& a) {
    const int L = log2_exact(floor_pow2(a.nranks));
    switch (a.coll) {
    case collective::all_reduce: return 2 * L + 2;
    case collective::reduce_scatter: return L + 2;
    default: return L + 3;
    }
  }

  // Source for the halving step k's input held by real rank rr (its base before step 1).
  BRAID_HD static constexpr source partial(const shape& s, int rr, int k) {
    if (k > 1) return src_win(rr, k - 1, k - 1);
    return s.folds_in(rr) ? src_win(rr, 0, 0) : src_in(rr);
  }

  BRAID_HD static constexpr step halve(const args& a, const shape& s, int k) {
    const int v = s.virt(a.rank), mask = s.p >> k;
    const int vlo = v & ~(2 * mask - 1);
    const int klo = (v & mask) ? vlo + mask : vlo;
    const int pv = v ^ mask, pr = s.real(pv);
    const source mine = partial(s, a.rank, k), theirs = partial(s, pr, k);
    const bool last = k == s.L;
    const bool needed = !s.blocks || !last || v < s.rem; // reduce_scatter: only folded pairs reuse it
    return reduce_step(s.first(klo), s.first(klo + mask), v < pv ? mine : theirs, v < pv ? theirs : mine,
                       needed ? (last ? s.L : k) : -1, last, last);
  }

  BRAID_HD static constexpr step at(const args& a, int j) {
    const shape s = shape_of(a);
    const int r = a.rank;
    const auto P = static_cast<std::uint32_t>(a.coll == collective::all_reduce ? s.p : s.n);
    if (a.coll == collective::all_gather) {
      const auto rr = static_cast<std::uint32_t>(r);
      if (j == 0) return s.folds_in(r) ? copy_step(rr - 1, rr, src_in(r - 1), 0, true) : nothing();
      if (s.folded_out(r)) {
        if (j == s.L + 2) return copy_step(0, P, src_win(r + 1, 0, s.L + 1), -1, true);
        return nothing();
      }
      if (j == 1) return copy_step(rr, rr + 1, src_in(r), 0, true);
      if (j >= s.L + 2) return nothing();
      const int k = j - 1, mask = 1 << (k - 1);
      const int pv = s.virt(r) ^ mask, plo = pv & ~(mask - 1);
      return copy_step(s.first(plo), s.first(plo + mask), src_win(s.real(pv), 0, k), 0, true);
    }
    // all_reduce and reduce_scatter
    if (j == 0) return s.folds_in(r) ? reduce_step(0, P, src_in(r - 1), src_in(r), 0, false, false) : nothing();
    const int unfold = a.coll == collective::all_reduce ? 2 * s.L + 1 : s.L + 1;
    if (s.folded_out(r)) {
      if (j != unfold) return nothing();
      if (a.coll == collective::all_reduce) return copy_step(0, P, src_win(r + 1, s.L, 2 * s.L), -1, true);
      const auto rr = static_cast<std::uint32_t>(r);
      return copy_step(rr, rr + 1, src_win(r + 1, s.L, s.L), -1, true);
    }
    if (j <= s.L) return halve(a, s, j);
    if (j >= unfold) return nothing();
    const int k = j - s.L, mask = 1 << (k - 1);
    const int pv = s.virt(r) ^ mask, plo = pv & ~(mask - 1);
    return copy_step(s.first(plo), s.first(plo + mask), src_win(s.real(pv), s.L, s.L + k - 1), s.L, true);
  }

  BRAID_HD static constexpr bool in_published(const args& a, std::uint32_t c) {
    const shape s = shape_of(a);
    const int r = a.rank;
    if (a.coll == collective::all_gather) return s.folded_out(r) && static_cast<int>(c) == r;
    if (s.folded_out(r)) return true;
    if (s.folds_in(r)) return false;
    const int half = s.p / 2, v = s.virt(r);
    const std::uint32_t lo = (v & half) ? s.first(0) : s.first(half);
    const std::uint32_t hi = (v & half) ? s.first(half) : s.first(s.p);
    return c >= lo && c < hi;
  }
};

} // namespace braid::schedule
