// tests/comm/orders_rule.hpp — the reduction orders written in docs/guarantees.md ("Exact reduction
// order"), re-derived from the text with plain loops, and the bit-for-bit check of a run against them.
// Shared by tests/comm/test_orders.cpp (the host communicator, thread ranks) and
// tests/cuda/device/test_orders_emu.cpp (the one-process CUDA communicator on the emulated device).
//
// The expected results are computed here from the documented rule alone: the round size, the chunk
// boundaries, the chunk owners, the tree and butterfly shapes are re-derived from the formulas in the
// text with plain loops. Nothing here asks braid's schedule functions (schedule::per_round,
// split_begin, chunk_at, pipeline_chunks, the schedule types) what the order is.
//
// Two operators, both on float (accumulator float, so storing a partial in T changes nothing):
//   - sum, on values of mixed magnitudes (random 24-bit mantissas times 2^-12..2^12, random signs), so
//     that most regroupings of more than two operands round differently;
//   - `minus` (a - b), which is not commutative: it tells the order of every pair apart, also for
//     n = 2, where every order of a commutative sum gives the same bits. braid requires operators to
//     be associative and commutative up to rounding for its results to make sense; it does not need
//     that to run, and the order it applies them in is the same.
// For every case the test also computes alternative orders (rank order, reversed rank order and a
// flip of the algorithm's own rule: the butterfly run from distance 1 instead of n/2, the ring
// started one rank later, the two trees swapped, ...) and checks that at least one of them gives
// different bits on the same data, so a wrong rule could not pass by accident.
#pragma once

#include <doctest/doctest.h>

#include <braid/braid.hpp>

#include "orders_values.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace orders_rule {

// ---- the documented rule, written out ------------------------------------------------------------

u64 align_up(u64 x, u64 a) { return (x + a - 1) / a * a; }

// Window regions (nphases) per algorithm and collective, as the doc's table gives them.
int nphases(braid::algo a, braid::collective c, int n) {
  using braid::algo;
  using braid::collective;
  const bool ar = c == collective::all_reduce;
  int L = 0;
  while ((2 << L) <= n) ++L; // log2 of the largest power of two <= n
  switch (a) {
  case algo::ring: return ar ? 2 : 1;
  case algo::tree: return ar ? 2 : 1;
  case algo::one_shot: return 0;
  case algo::two_shot: return 1;
  case algo::halving_doubling: return L + 1;
  case algo::direct: return ar ? 1 : 0;
  default: return -1;
  }
}

// Elements per block per round: a staging half split into nphases + 1 regions rounded down to 64
// bytes, divided among the round's blocks, rounded down to the chunk unit.
u64 round_elems(u64 staging_bytes, int regions, u64 blocks) {
  const u64 half = align_up(staging_bytes / 2, 4096);
  const u64 region = half / static_cast<u64>(regions) / 64 * 64;
  u64 e = region / (blocks * sizeof(float));
  const u64 unit = 64 / sizeof(float);
  if (e >= unit) e -= e % unit;
  return e;
}

// Chunk of round offset o in a round of len elements split into P chunks: chunk c starts at
// min(len, unit * (per*c + min(c, extra))) with units = ceil(len/unit), per = units / P,
// extra = units % P.
std::uint32_t chunk_of(u64 o, u64 len, std::uint32_t P) {
  const u64 unit = 64 / sizeof(float);
  const u64 units = (len + unit - 1) / unit, per = units / P, extra = units % P;
  auto begin = [&](u64 c) { return std::min(len, unit * (per * c + std::min(c, extra))); };
  for (std::uint32_t c = 0; c < P; ++c)
    if (begin(c) <= o && o < begin(c + 1)) return c;
  FAIL("offset " << o << " in no chunk");
  return 0;
}

// Tree pipeline depth of a round: ceil(len * sizeof(T) / 64 KiB), clamped to [1, 32]; all_reduce
// uses at least 2 chunks.
std::uint32_t tree_chunks(u64 len) {
  const u64 p = (len * sizeof(float) + 65535) / 65536;
  return static_cast<std::uint32_t>(std::max<u64>(2, std::min<u64>(32, std::max<u64>(1, p))));
}

// Heap-shaped binary tree over virtual ids v (children 2v+1, 2v+2); rank_of(v) maps to real ranks.
// Each inner node reduces (itself, left child, right child); `children_first` is an alternative.
template <class F> float tree_value(opk k, int n, int v, F rank_of, u64 i, bool children_first = false) {
  const int c0 = 2 * v + 1, c1 = 2 * v + 2;
  const float own = value(rank_of(v), i);
  if (c0 >= n) return own;
  float acc = children_first ? tree_value(k, n, c0, rank_of, i, true) : own;
  if (children_first) acc = apply(k, acc, own);
  else acc = apply(k, acc, tree_value(k, n, c0, rank_of, i));
  if (c1 < n) acc = apply(k, acc, tree_value(k, n, c1, rank_of, i, children_first));
  return acc;
}

// Halving-doubling: p = largest power of two <= n, rem = n - p. Virtual rank w < rem stands for the
// pair (2w, 2w+1) with base x[2w] op x[2w+1]; w >= rem is rank w + rem. Then a butterfly at distances
// p/2, p/4, ..., 1, the lower virtual rank's partial first. `small_first` runs it at 1, 2, ..., p/2;
// `upper_first` puts the higher virtual rank first (alternatives).
float hd_value(opk k, int n, u64 i, bool small_first = false, bool upper_first = false) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  std::vector<float> cur(static_cast<std::size_t>(p));
  for (int w = 0; w < p; ++w)
    cur[static_cast<std::size_t>(w)] = w < rem ? apply(k, value(2 * w, i), value(2 * w + 1, i)) : value(w + rem, i);
  auto step = [&](int d) {
    // after the steps at distances already done, cur[w] for each w holds the partial of its class;
    // combine w (bit d clear) with w | d
    for (int w = 0; w < p; ++w)
      if (!(w & d)) {
        const float lo = cur[static_cast<std::size_t>(w)], hi = cur[static_cast<std::size_t>(w | d)];
        cur[static_cast<std::size_t>(w)] = upper_first ? apply(k, hi, lo) : apply(k, lo, hi);
      }
  };
  if (small_first) {
    // distance 1 first: then the survivors sit at multiples of 2, and so on
    std::vector<float> c = cur;
    for (int d = 1; d < p; d *= 2)
      for (int w = 0; w < p; w += 2 * d)
        c[static_cast<std::size_t>(w)] = upper_first ? apply(k, c[static_cast<std::size_t>(w + d)], c[static_cast<std::size_t>(w)])
                                                     : apply(k, c[static_cast<std::size_t>(w)], c[static_cast<std::size_t>(w + d)]);
    return c[0];
  }
  for (int d = p / 2; d >= 1; d /= 2) step(d);
  return cur[0];
}

struct rule {
  braid::algo a;
  braid::collective c;
  int n, root;
  u64 count;     // elements per block (reduce_scatter: recv_count)
  u64 staging;   // options::staging_bytes
};

// Expected full result (reduce_scatter: all n blocks) by the documented rule (variant 0) or by an
// alternative order (variant >= 1; empty when the variant does not exist for this rule).
std::vector<float> expected(const rule& ru, opk k, int variant) {
  using braid::algo;
  using braid::collective;
  const int n = ru.n;
  const bool rs = ru.c == collective::reduce_scatter;
  const u64 total = rs ? ru.count * static_cast<u64>(n) : ru.count;
  const u64 cap = round_elems(ru.staging, nphases(ru.a, ru.c, n) + 1, rs ? static_cast<u64>(n) : 1);
  REQUIRE(cap > 0);
  std::vector<float> out(total);
  if (variant > 3) return {}; // 1: rank order, 2: reversed rank order, 3: the rule's own flip
  for (u64 g = 0; g < total; ++g) {
    const u64 block = rs ? g / ru.count : 0, e = rs ? g % ru.count : g; // e: element within the block
    const u64 round = e / cap, base = round * cap, len = std::min(cap, ru.count - base), o = e - base;
    // the generic alternatives
    if (variant == 1) { out[g] = fold(k, rank_order(n), g); continue; }
    if (variant == 2) { out[g] = fold(k, reversed(rank_order(n)), g); continue; }
    const bool flip = variant == 3;
    float v = 0;
    switch (ru.a) {
    case algo::one_shot:
    case algo::two_shot:
    case algo::direct:
      v = fold(k, flip ? cyclic(n, 1, 1) : rank_order(n), g);
      break;
    case algo::ring:
      if (ru.c == collective::reduce) {
        // root-1, root-2, ..., root+1, root (flip: the other direction)
        v = fold(k, flip ? cyclic(n, ru.root + 1, 1) : cyclic(n, ru.root - 1, -1), g);
      } else {
        // chunk c (all_reduce: by the round's split into n chunks; reduce_scatter: block c) is reduced
        // c+1, c+2, ..., c (flip: started one rank later)
        const int c = rs ? static_cast<int>(block) : static_cast<int>(chunk_of(o, len, static_cast<std::uint32_t>(n)));
        v = fold(k, cyclic(n, c + (flip ? 2 : 1), 1), g);
      }
      break;
    case algo::tree:
      if (ru.c == collective::reduce) {
        // v = (r - root) mod n (flip: children before the node itself)
        v = tree_value(k, n, 0, [&](int vv) { return (vv + ru.root) % n; }, g, flip);
      } else {
        // P = max(2, pipeline) chunks per round; chunks [0, ceil(P/2)) tree A (v = r), the rest tree B
        // (v = n-1-r) (flip: trees swapped)
        const std::uint32_t P = tree_chunks(len);
        const bool tree_a = (chunk_of(o, len, P) < (P + 1) / 2) != flip;
        if (tree_a) v = tree_value(k, n, 0, [](int vv) { return vv; }, g);
        else v = tree_value(k, n, 0, [&](int vv) { return n - 1 - vv; }, g);
      }
      break;
    case algo::halving_doubling:
      v = hd_value(k, n, g, flip, false);
      break;
    default: FAIL("no rule");
    }
    out[g] = v;
  }
  return out;
}

std::string describe(const rule& ru, opk k) {
  return std::string(braid::name(ru.c)) + " " + std::string(braid::name(ru.a)) + " n=" + std::to_string(ru.n) +
         " root=" + std::to_string(ru.root) + " count=" + std::to_string(ru.count) +
         " staging=" + std::to_string(ru.staging) + (k == opk::sum ? " sum" : " minus");
}

struct outcome {
  rule ru;
  opk k;
  std::vector<std::vector<float>> got; // per rank: all_reduce whole out; reduce root's out; rs own block
};

// Every case of one staging size on n ranks: all_reduce with every algorithm, reduce with ring, tree
// and direct at roots 0, n-1 (and 1 from three ranks on), reduce_scatter with ring, halving_doubling
// and direct; both operators, each count. The runners fill `got`.
inline std::vector<outcome> every_case(int n, u64 staging, const std::vector<u64>& counts) {
  using braid::algo;
  using braid::collective;
  std::vector<outcome> cases;
  std::vector<int> roots = {0, n - 1};
  if (n > 2) roots.push_back(1);
  for (opk k : {opk::sum, opk::minus})
    for (u64 count : counts) {
      for (algo a : braid::all_algos)
        cases.push_back({{a, collective::all_reduce, n, 0, count, staging}, k, {}});
      for (algo a : {algo::ring, algo::tree, algo::direct})
        for (int root : roots) cases.push_back({{a, collective::reduce, n, root, count, staging}, k, {}});
      for (algo a : {algo::ring, algo::halving_doubling, algo::direct})
        cases.push_back({{a, collective::reduce_scatter, n, 0, count, staging}, k, {}});
    }
  return cases;
}

struct tally {
  long cases = 0, elements = 0;
};

// Checks one outcome against the documented rule, and records whether an alternative order gives
// different bits on the same data.
void check(const outcome& oc, std::map<std::string, bool>& alternative_differs, tally& t) {
  const rule& ru = oc.ru;
  const int n = ru.n;
  const std::vector<float> want = expected(ru, oc.k, 0);
  for (int r = 0; r < n; ++r) {
    const std::vector<float>& got = oc.got[static_cast<std::size_t>(r)];
    if (ru.c == braid::collective::reduce && r != ru.root) continue;
    const u64 off = ru.c == braid::collective::reduce_scatter ? static_cast<u64>(r) * ru.count : 0;
    REQUIRE(got.size() == ru.count);
    if (std::memcmp(got.data(), want.data() + off, ru.count * sizeof(float)) != 0) {
      u64 i = 0;
      while (std::memcmp(&got[i], &want[off + i], sizeof(float)) == 0) ++i;
      std::ostringstream msg;
      msg << std::hexfloat << describe(ru, oc.k) << ": rank " << r << " element " << i << " is " << got[i]
          << ", the documented order gives " << want[off + i];
      FAIL_CHECK(msg.str());
      return;
    }
    t.elements += static_cast<long>(ru.count);
  }
  ++t.cases;
  const std::string key = std::string(braid::name(ru.c)) + " " + std::string(braid::name(ru.a)) + " n=" +
                          std::to_string(n) + (oc.k == opk::sum ? " sum" : " minus");
  bool& differs = alternative_differs[key];
  for (int variant = 1; !differs; ++variant) {
    const std::vector<float> alt = expected(ru, oc.k, variant);
    if (alt.empty()) break;
    if (std::memcmp(alt.data(), want.data(), want.size() * sizeof(float)) != 0) differs = true;
  }
}

} // namespace orders_rule
