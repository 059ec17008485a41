// braid/comm/tuning.hpp — which algorithm a collective uses when the caller does not say: data, not
// code. The first rule that matches (collective, rank count, message bytes) wins. Each rule carries
// the measurement that justified it; docs/benchmarks.md has the full tables.
#pragma once

#include <cstdint>

#include "../schedule/common.hpp"

namespace braid {

struct tuning_rule {
  collective coll;
  int min_ranks, max_ranks;
  std::uint64_t max_bytes; // message bytes (per rank input) up to and including
  algo choice;
  const char* evidence;
};

// Host backend (threads and processes). Measured with braid-bench on the 2-core CI-class machine
// (see docs/benchmarks.md for the run behind each figure).
inline constexpr tuning_rule host_tuning[] = {
    {collective::all_reduce, 2, 64, std::uint64_t{32} << 10, algo::one_shot,
     "one synchronisation: lowest latency for small messages (docs/benchmarks.md, all_reduce by algorithm)"},
    {collective::all_reduce, 2, 16, ~std::uint64_t{0}, algo::two_shot,
     "reads 2(n-1)/n of the data like the ring in 2 synchronisations instead of 2(n-1)"},
    {collective::all_reduce, 17, 64, ~std::uint64_t{0}, algo::ring, "fan-in of n sources per chunk grows with n"},
    {collective::reduce_scatter, 2, 16, ~std::uint64_t{0}, algo::direct, "one step"},
    {collective::reduce_scatter, 17, 64, ~std::uint64_t{0}, algo::ring, "fan-in bounded at 2"},
    {collective::all_gather, 2, 16, ~std::uint64_t{0}, algo::direct, "one step per block, no forwarding"},
    {collective::all_gather, 17, 64, ~std::uint64_t{0}, algo::ring, "fan-in bounded"},
    {collective::broadcast, 2, 64, ~std::uint64_t{0}, algo::direct, "every rank reads the root once"},
    {collective::reduce, 2, 64, ~std::uint64_t{0}, algo::direct, "the root reads every input once"},
};

template <std::size_t N>
constexpr algo choose_algorithm(const tuning_rule (&table)[N], collective c, int nranks, std::uint64_t bytes) {
  for (const auto& r : table)
    if (r.coll == c && nranks >= r.min_ranks && nranks <= r.max_ranks && bytes <= r.max_bytes) return r.choice;
  return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::all_gather ? algo::ring
                                                                                                     : algo::tree;
}

} // namespace braid
