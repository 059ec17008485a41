// braid/schedule/two_shot.hpp — two-shot all-reduce: rank r reduces chunk r from every rank's input
// in rank order (step 0), then copies every other chunk from its owner (steps 1..n-1, starting with
// the next rank so that owners are read evenly). Reads 2(n-1)/n of the data per rank, like the ring,
// in two synchronisations instead of 2(n-1).
#pragma once

#include "common.hpp"

namespace braid::schedule {

struct two_shot {
  BRAID_HD static constexpr std::uint32_t nchunks(collective, int n, std::uint32_t) { return static_cast<std::uint32_t>(n); }
  BRAID_HD static constexpr int nphases(collective, int) { return 1; }
  BRAID_HD static constexpr int nsteps(const args& a) { return a.nranks; }
  BRAID_HD static constexpr step at(const args& a, int j) {
    const auto c = static_cast<std::uint32_t>(mod(a.rank + j, a.nranks));
    if (j == 0) return reduce_all_step(c, c + 1, src_in(0), 0, true);
    return copy_step(c, c + 1, src_win(static_cast<int>(c), 0, 0), -1, true);
  }
  BRAID_HD static constexpr bool in_published(const args& a, std::uint32_t c) {
    return static_cast<int>(c) != a.rank;
  }
};

} // namespace braid::schedule
