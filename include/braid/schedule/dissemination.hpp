// braid/schedule/dissemination.hpp — the barrier's schedule.
#pragma once

#include "common.hpp"

namespace braid::schedule {

// Dissemination barrier: at step k rank r waits for rank r - 2^k to have finished step k-1. After
// ceil(log2 n) steps every rank has (transitively) seen every other rank enter.
struct dissemination {
  BRAID_HD static constexpr int nsteps(int n) {
    int k = 0;
    while ((1 << k) < n) ++k;
    return k;
  }
  BRAID_HD static constexpr step at(int n, int r, int k) {
    return copy_step(0, 0, src_win(mod(r - (1 << k), n), 0, k - 1), -1, false);
  }
};

} // namespace braid::schedule
