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

// Host backend (threads and processes). Figures: braid-bench, 2 processes, float, 2-vCPU Xeon,
// 2026-11-21 (docs/benchmarks.md, "all_reduce by algorithm"). Rules for more ranks than measured
// follow the same reasoning and are not yet measured.
inline constexpr tuning_rule host_tuning[] = {
    {collective::all_reduce, 2, 64, std::uint64_t{32} << 10, algo::one_shot,
     "16 KiB: one_shot 4.0 us, two_shot 4.1 us, ring 3.6 us; one synchronisation, reads stay in cache"},
    {collective::all_reduce, 2, 16, ~std::uint64_t{0}, algo::two_shot,
     "256 KiB: one_shot 65 us, two_shot 48 us; 4 MiB: 1617 vs 1457 us (ring 1403 us at 2 ranks)"},
    {collective::all_reduce, 17, 64, ~std::uint64_t{0}, algo::ring, "unmeasured: two_shot's fan-in of n sources grows with n"},
    {collective::reduce_scatter, 2, 16, ~std::uint64_t{0}, algo::direct, "unmeasured: one step"},
    {collective::reduce_scatter, 17, 64, ~std::uint64_t{0}, algo::ring, "unmeasured: fan-in bounded at 2"},
    {collective::all_gather, 2, 16, ~std::uint64_t{0}, algo::direct, "unmeasured: one step per block, no forwarding"},
    {collective::all_gather, 17, 64, ~std::uint64_t{0}, algo::ring, "unmeasured: fan-in bounded"},
    {collective::broadcast, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured: every rank reads the root once"},
    {collective::reduce, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured: the root reads every input once"},
};

template <std::size_t N>
constexpr algo choose_algorithm(const tuning_rule (&table)[N], collective c, int nranks, std::uint64_t bytes) {
  for (const auto& r : table)
    if (r.coll == c && nranks >= r.min_ranks && nranks <= r.max_ranks && bytes <= r.max_bytes) return r.choice;
  return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::all_gather ? algo::ring
                                                                                                     : algo::tree;
}

} // namespace braid
