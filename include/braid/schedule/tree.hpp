// braid/schedule/tree.hpp — binary-tree broadcast and reduce, double-binary-tree all-reduce.
//
// Trees are heap-shaped over virtual ids (parent (v-1)/2, children 2v+1 and 2v+2), so depth is
// floor(log2 n). broadcast/reduce: v = (r - root) mod n. all_reduce splits the chunks between two
// trees: tree A (v = r) takes chunks [0, ceil(P/2)), tree B (v = n-1-r) the rest; the leaves of one
// tree are mostly inner nodes of the other, so every rank forwards about half the data. all_reduce
// steps: 0..P-1 reduce up chunk j, P..2P-1 broadcast down chunk j-P. An inner node reduces in the
// order (itself, left child, right child); the root's result is computed once and copied down.
#pragma once

#include "common.hpp"

namespace braid::schedule {

struct tree {
  struct node {
    int v, parent, child0, child1; // virtual ids; -1 where absent
    BRAID_HD constexpr bool leaf() const { return child0 < 0; }
  };
  BRAID_HD static constexpr node at_vid(int v, int n) {
    node nd{v, v == 0 ? -1 : (v - 1) / 2, 2 * v + 1 < n ? 2 * v + 1 : -1, 2 * v + 2 < n ? 2 * v + 2 : -1};
    return nd;
  }

  BRAID_HD static constexpr std::uint32_t nchunks(collective c, int, std::uint32_t pipeline) {
    const std::uint32_t p = pipeline ? pipeline : 1;
    return c == collective::all_reduce && p < 2 ? 2 : p;
  }
  BRAID_HD static constexpr int nphases(collective c, int) { return c == collective::all_reduce ? 2 : 1; }
  BRAID_HD static constexpr int nsteps(const args& a) {
    return static_cast<int>(a.coll == collective::all_reduce ? 2 * a.nchunks : a.nchunks);
  }

  // Tree used for chunk c of an all-reduce: 0 = A, 1 = B.
  BRAID_HD static constexpr int which(const args& a, std::uint32_t c) { return c < (a.nchunks + 1) / 2 ? 0 : 1; }
  BRAID_HD static constexpr int vid(int t, int r, int n) { return t == 0 ? r : n - 1 - r; }
  BRAID_HD static constexpr int rid(int t, int v, int n) { return t == 0 ? v : n - 1 - v; }

  // Reduces chunk c at the inner node nd of rank r: its IN, then each child's partial (a leaf's IN, an
  // inner child's window 0 at chunk c). Tree t (0 = A, 1 = B) is rooted at rank `root` (tree A only);
  // the root writes the final result to OUT and to window root_win (-1: none), the others to window 0.
  BRAID_HD static constexpr step reduce_up(const node& nd, std::uint32_t c, int r, int n, int t, int root,
                                           int root_win) {
    step st;
    st.lo = c;
    st.hi = c + 1;
    st.src[0] = src_in(r);
    st.nsrc = 1;
    for (int ch : {nd.child0, nd.child1}) {
      if (ch < 0) continue;
      const int cr = t == 0 ? mod(ch + root, n) : rid(t, ch, n);
      st.src[st.nsrc++] = at_vid(ch, n).leaf() ? src_in(cr) : src_win(cr, 0, static_cast<int>(c));
    }
    const bool is_root = nd.v == 0;
    st.final = is_root;
    st.out = is_root;
    st.win = static_cast<std::int8_t>(is_root ? root_win : 0);
    return st;
  }

  BRAID_HD static constexpr step at(const args& a, int j) {
    const int n = a.nranks, r = a.rank;
    const std::uint32_t P = a.nchunks;
    if (a.coll == collective::broadcast) {
      const auto c = static_cast<std::uint32_t>(j);
      const node nd = at_vid(mod(r - a.root, n), n);
      if (nd.v == 0) return copy_step(c, c + 1, src_in(r), -1, true);
      const int pr = mod(nd.parent + a.root, n);
      const source from = nd.parent == 0 ? src_in(pr) : src_win(pr, 0, j);
      return copy_step(c, c + 1, from, nd.leaf() ? -1 : 0, true);
    }
    if (a.coll == collective::reduce) {
      const auto c = static_cast<std::uint32_t>(j);
      const node nd = at_vid(mod(r - a.root, n), n);
      if (nd.leaf()) return nothing(); // the parent reads this rank's IN directly
      return reduce_up(nd, c, r, n, 0, a.root, -1);
    }
    // all_reduce: double binary tree
    const bool up = static_cast<std::uint32_t>(j) < P;
    const auto c = static_cast<std::uint32_t>(up ? j : j - static_cast<int>(P));
    const int t = which(a, c);
    const node nd = at_vid(vid(t, r, n), n);
    if (up) {
      if (nd.leaf()) return nothing();
      return reduce_up(nd, c, r, n, t, 0, 1);
    }
    if (nd.v == 0) return nothing(); // the root produced its result on the way up
    const int pr = rid(t, nd.parent, n);
    const int ready = nd.parent == 0 ? static_cast<int>(c) : static_cast<int>(P + c);
    return copy_step(c, c + 1, src_win(pr, 1, ready), nd.leaf() ? -1 : 1, true);
  }

  BRAID_HD static constexpr bool in_published(const args& a, std::uint32_t c) {
    const int n = a.nranks, r = a.rank;
    switch (a.coll) {
    case collective::broadcast: return r == a.root;
    case collective::reduce: return at_vid(mod(r - a.root, n), n).leaf() && n > 1;
    case collective::all_reduce: return at_vid(vid(which(a, c), r, n), n).leaf() && n > 1;
    default: return false;
    }
  }
};

} // namespace braid::schedule
