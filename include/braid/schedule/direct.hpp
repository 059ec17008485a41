// braid/schedule/direct.hpp — direct (parameter-server) schedules: one rank reduces everything and the
// others copy from it, or every rank reads its part straight from its owner.
//   all_reduce:     rank 0 reduces each chunk from every input (rank order), the others copy it.
//   reduce:         the root reduces every input; the others only publish theirs.
//   broadcast:      every rank copies the root's input.
//   reduce_scatter: rank r reduces its block from every input (rank order).
//   all_gather:     rank r copies every block from its owner, starting with its own.
#pragma once

#include "common.hpp"

namespace braid::schedule {

struct direct {
  BRAID_HD static constexpr std::uint32_t nchunks(collective c, int n, std::uint32_t pipeline) {
    if (c == collective::reduce_scatter || c == collective::all_gather) return static_cast<std::uint32_t>(n);
    return c == collective::all_reduce && pipeline ? pipeline : 1;
  }
  BRAID_HD static constexpr int nphases(collective c, int) { return c == collective::all_reduce ? 1 : 0; }
  BRAID_HD static constexpr int nsteps(const args& a) {
    switch (a.coll) {
    case collective::all_reduce: return static_cast<int>(a.nchunks);
    case collective::all_gather: return a.nranks;
    default: return 1;
    }
  }
  BRAID_HD static constexpr step at(const args& a, int j) {
    const int r = a.rank;
    const auto rr = static_cast<std::uint32_t>(r);
    switch (a.coll) {
    case collective::all_reduce: {
      const auto c = static_cast<std::uint32_t>(j);
      if (r == 0) return reduce_all_step(c, c + 1, src_in(0), 0, true);
      return copy_step(c, c + 1, src_win(0, 0, j), -1, true);
    }
    case collective::reduce:
      return r == a.root ? reduce_all_step(0, 1, src_in(0), -1, true) : nothing();
    case collective::broadcast: return copy_step(0, 1, src_in(a.root), -1, true);
    case collective::reduce_scatter: return reduce_all_step(rr, rr + 1, src_in(0), -1, true);
    case collective::all_gather: {
      const auto c = static_cast<std::uint32_t>(mod(r + j, a.nranks));
      return copy_step(c, c + 1, src_in(static_cast<int>(c)), -1, true);
    }
    default: return nothing();
    }
  }
  BRAID_HD static constexpr bool in_published(const args& a, std::uint32_t c) {
    switch (a.coll) {
    case collective::all_reduce: return a.rank != 0;
    case collective::reduce: return a.rank != a.root;
    case collective::broadcast: return a.rank == a.root;
    case collective::reduce_scatter: return static_cast<int>(c) != a.rank;
    case collective::all_gather: return static_cast<int>(c) == a.rank;
    default: return false;
    }
  }
};

} // namespace braid::schedule
