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
template <class F> constexpr decltype(auto) with_schedule(algo a, F&& f) { // host only
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

// Like with_schedule, for a collective known at compile time: instantiates f only for the schedules
// that implement C (an unsupported `a` falls back to ring, which implements every collective).
template <collective C, class F> constexpr decltype(auto) with_supported_schedule(algo a, F&& f) {
  if constexpr (C == collective::all_reduce) {
    return with_schedule(a, static_cast<F&&>(f));
  } else if constexpr (C == collective::reduce_scatter || C == collective::all_gather) {
    if (a == algo::halving_doubling) return f(halving_doubling{});
    if (a == algo::direct) return f(direct{});
    return f(ring{});
  } else {
    if (a == algo::tree) return f(tree{});
    if (a == algo::direct) return f(direct{});
    return f(ring{});
  }
}

} // namespace braid::schedule
