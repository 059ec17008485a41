// braid/schedule/one_shot.hpp — one-shot all-reduce: every rank reads every rank's whole input and
// reduces it in rank order 0..n-1. One step, one synchronisation: the latency choice for small
// messages. Every rank evaluates the same expression in the same order, so all get the same bits.
#pragma once

#include "common.hpp"

namespace braid::schedule {

struct one_shot {
  BRAID_HD static constexpr std::uint32_t nchunks(collective, int, std::uint32_t) { return 1; }
  BRAID_HD static constexpr int nphases(collective, int) { return 0; }
  BRAID_HD static constexpr int nsteps(const args&) { return 1; }
  BRAID_HD static constexpr step at(const args&, int) { return reduce_all_step(0, 1, src_in(0), -1, true); }
  BRAID_HD static constexpr bool in_published(const args&, std::uint32_t) { return true; }
};

} // namespace braid::schedule
