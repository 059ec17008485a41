// braid/comm/tuning.hpp — which algorithm a collective uses when the caller does not say: data, not
// code. The first rule that matches (collective, rank count, message bytes, kind of ranks) wins. Each
// rule carries the measurement that justified it; docs/benchmarks.md has the full tables.
#pragma once

#include <cstdint>

#include "../schedule/common.hpp"

namespace braid {

// Which ranks a rule is for: the host backend's ranks are threads of one process (their inputs are
// read in place from 16 KiB up, options::zero_copy_min_bytes) or processes (inputs staged unless
// registered), and the two favour different algorithms. Every rank of a communicator is of one kind,
// so every rank picks the same algorithm. The CUDA tables leave it at both.
enum tuning_ranks : std::uint8_t { thread_ranks = 1, process_ranks = 2, any_ranks = 3 };

struct tuning_rule {
  collective coll;
  int min_ranks, max_ranks;
  std::uint64_t max_bytes; // message bytes (per rank input) up to and including
  algo choice;
  const char* evidence;
  std::uint8_t ranks = any_ranks; // tuning_ranks this rule is for
};

// Host backend (threads and processes). Measured by bench/tuning.sh on the 2-vCPU AMD EPYC VM (float
// sum; medians of 3 passes of 20 calls; bench/results): every algorithm beside a baseline table
// (all_reduce one_shot to 32 KiB, then two_shot; direct for the other collectives below 17 ranks;
// tuning-*-before-cpu.txt), then every algorithm beside these rules (the EPYC run of these rules).
// 2 and 4 ranks were measured, 4 on the 2 CPUs; rules for 5-16 ranks follow the 4-rank figures, for
// 17 and more they are reasoning only. A rule departs from the baseline only where another algorithm
// was at least about 1.25x faster at that size and the neighbouring ones; the figures are in the
// evidence. In those EPYC runs thread ranks read inputs in place only from 256 KiB. The thread_ranks
// rules whose evidence names the zero-copy Xeon run (tuning-*-zero-copy-xeon-cpu.txt) were measured
// on the 2-vCPU Intel Xeon VM with thread ranks reading inputs in place from 16 KiB
// (options::zero_copy_min_bytes), as they do by default.
inline constexpr tuning_rule host_tuning[] = {
    {collective::all_reduce, 2, 2, std::uint64_t{256} << 10, algo::one_shot,
     "one_shot against two_shot: 2 processes 64 KiB 14.4 vs 23.6 us, 256 KiB 35.4 vs 41.8; 2 threads 64 KiB "
     "10.1 vs 14.2, 256 KiB 9.2 vs 32.9 (read in place)"},
    {collective::all_reduce, 2, 2, std::uint64_t{1} << 20, algo::one_shot,
     "2 threads: one_shot against two_shot 512 KiB 26-32 vs 89-92 us, 1 MiB 91-102 vs 152-162 in runs A, A2 and "
     "C (150 vs 158 in run B), 4 MiB 510 vs 538 (the zero-copy Xeon run)",
     thread_ranks},
    {collective::all_reduce, 3, 64, std::uint64_t{4} << 10, algo::one_shot,
     "4 processes: one_shot fastest to 4 KiB (9.9 us, two_shot 10.1), 16 KiB 22.2 vs 14.9; 4 threads: fastest "
     "to 1 KiB, 16 KiB 30.2 vs 21.2"},
    {collective::all_reduce, 2, 16, ~std::uint64_t{0}, algo::two_shot,
     "4 processes: two_shot fastest from 16 KiB to 64 MiB (31.5 ms, ring 38.3, one_shot 69.4); at 2 ranks "
     "from 1 MiB within noise of ring and tree"},
    {collective::all_reduce, 17, 64, ~std::uint64_t{0}, algo::ring, "not measured: two_shot's fan-in of n sources grows with n"},
    {collective::reduce_scatter, 2, 2, std::uint64_t{16} << 10, algo::direct, "2 processes and threads: within noise of the fastest to 16 KiB"},
    {collective::reduce_scatter, 2, 2, ~std::uint64_t{0}, algo::halving_doubling,
     "2 processes: halving_doubling against direct 64 KiB 5.0 vs 6.8 us, 4 MiB 148 vs 215, 16 MiB 1.59 vs 2.43 ms (each won 3 of 3 passes)",
     process_ranks},
    {collective::reduce_scatter, 2, 2, ~std::uint64_t{0}, algo::direct,
     "2 threads (inputs read in place from 256 KiB): direct ahead at 16 and 64 MiB (0.95 vs 1.21 ms, 6.1 vs 7.6 ms, 3 of 3 passes)",
     thread_ranks},
    {collective::reduce_scatter, 3, 16, std::uint64_t{4} << 10, algo::direct,
     "4 threads: direct 3.8-4.2 us to 4 KiB, halving_doubling about 10; 4 processes within noise to 1 KiB"},
    {collective::reduce_scatter, 3, 16, std::uint64_t{128} << 10, algo::direct,
     "4 threads, inputs read in place from 16 KiB: direct against halving_doubling 16 KiB 4.8 vs 9.2 us, 64 KiB "
     "9.8 vs 18.0, 128 KiB 15.8 vs 21.1; even at 256 KiB (the zero-copy Xeon run)",
     thread_ranks},
    {collective::reduce_scatter, 3, 16, ~std::uint64_t{0}, algo::halving_doubling,
     "4 processes: halving_doubling against direct 16 KiB 7.9 vs 10.6 us, 1 MiB 164 vs 192, 64 MiB 17.4 vs 29.4 ms; "
     "ring was faster in one run (1 MiB 126 us) and 3.4x slower in the next (425 us, halving_doubling 126, "
     "the EPYC run of these rules); 4 threads: halving_doubling ahead or even from 16 KiB in both runs"},
    {collective::reduce_scatter, 17, 64, ~std::uint64_t{0}, algo::ring, "not measured: fan-in bounded at 2"},
    {collective::all_gather, 2, 16, ~std::uint64_t{0}, algo::direct,
     "fastest or within noise of it at 2 and 4 ranks, threads and processes, 64 B to 64 MiB"},
    {collective::all_gather, 17, 64, ~std::uint64_t{0}, algo::ring, "not measured: fan-in bounded"},
    {collective::broadcast, 2, 2, std::uint64_t{1} << 20, algo::direct, "2 ranks: within noise of the fastest to 1 MiB"},
    {collective::broadcast, 2, 2, ~std::uint64_t{0}, algo::ring,
     "2 ranks: ring against direct 4 MiB 262 vs 352 us (processes) and 95 vs 112 (threads), 64 MiB 10.5 vs 13.4 ms and 8.7 vs 10.1"},
    {collective::broadcast, 3, 64, ~std::uint64_t{0}, algo::direct,
     "4 processes and threads: direct fastest at most sizes, ring 1.2-4.3x slower; above 4 ranks not measured"},
    {collective::reduce, 2, 2, ~std::uint64_t{0}, algo::direct,
     "2 ranks: within noise of the fastest (threads: ahead at 16 and 64 MiB, 3 of 3 passes)"},
    {collective::reduce, 3, 64, std::uint64_t{16} << 10, algo::direct, "4 processes and threads: within noise of the fastest to 16 KiB"},
    {collective::reduce, 3, 64, std::uint64_t{64} << 10, algo::direct,
     "4 threads, inputs read in place from 16 KiB: direct against ring 32 KiB 9.3 vs 14.0 us, 64 KiB 15.8 vs "
     "23.1; ring ahead from 128 KiB (the zero-copy Xeon run)",
     thread_ranks},
    {collective::reduce, 3, 64, ~std::uint64_t{0}, algo::ring,
     "4 ranks: ring against direct 256 KiB 53 vs 77 us (processes), 63 vs 77 (threads); 1 MiB 151 vs 269 and "
     "167 vs 301; 64 MiB 17.7 vs 30.8 ms and 18.2 vs 21.2; above 4 ranks not measured"},
};

// Whether rule r covers this call; `ranks`: the kind of ranks calling (tuning_ranks).
constexpr bool rule_applies(const tuning_rule& r, collective c, int nranks, std::uint64_t bytes, std::uint8_t ranks) {
  return r.coll == c && nranks >= r.min_ranks && nranks <= r.max_ranks && bytes <= r.max_bytes && (r.ranks & ranks) != 0;
}

template <std::size_t N>
constexpr algo choose_algorithm(const tuning_rule (&table)[N], collective c, int nranks, std::uint64_t bytes,
                                std::uint8_t ranks = any_ranks) {
  for (const auto& r : table)
    if (rule_applies(r, c, nranks, bytes, ranks)) return r.choice;
  return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::all_gather ? algo::ring
                                                                                                     : algo::tree;
}

} // namespace braid
