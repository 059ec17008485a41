// braid/schedule/schedule.hpp — every schedule, and the run-time dispatch from an algo to its type.
// Each schedule type S provides (all static, BRAID_HD, pure):
//   nchunks(collective, nranks, pipeline) -> chunks per round (P)
//   nphases(collective, nranks)           -> window regions it publishes into
//   nsteps(args), at(args, j)             -> rank args.rank's steps
//   in_published(args, chunk)             -> whether peers read this rank's IN chunk
#pragma once

#include "common.hpp"
#include "direct.hpp"
#include "dissemination.hpp"
#include "halving_doubling.hpp"
#include "one_shot.hpp"
#include "ring.hpp"
#include "tree.hpp"
#include "two_shot.hpp"

namespace braid::schedule {

// Calls f(S{}) with the schedule type of `a` (which must not be algo::automatic).
template <class F> BRAID_HD constexpr decltype(auto) with_schedule(algo a, F&& f) {
  switch (a) {
  case algo::tree: return f(tree{});
  case algo::one_shot: return f(one_shot{});
  case algo::two_shot: return f(two_shot{});
  case algo::halving_doubling: return f(halving_doubling{});
  case algo::direct: return f(direct{});
  case algo::ring: case algo::automatic: break;
  }
  return f(ring{});
}

} // namespace braid::schedule
