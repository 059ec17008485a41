// braid/cuda/tuning.cuh — the CUDA backend's tuning tables: which algorithm create_group's
// communicators choose per collective, rank count and size (comm/tuning.hpp's rules, as data).
#pragma once

#include <cstdint>

#include "../comm/options.hpp"
#include "../comm/tuning.hpp"

namespace braid::cuda {

// Tuning for the CUDA backend. Groups whose ranks are on different GPUs: unmeasured (bench/results has
// no run on several GPUs); the reasoning is in each rule.
inline constexpr tuning_rule cuda_tuning[] = {
    {collective::all_reduce, 2, 64, std::uint64_t{256} << 10, algo::one_shot, "unmeasured: one synchronisation"},
    {collective::all_reduce, 2, 64, ~std::uint64_t{0}, algo::two_shot, "unmeasured: 2(n-1)/n bytes, two synchronisations"},
    {collective::reduce_scatter, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured"},
    {collective::all_gather, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured"},
    {collective::broadcast, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured"},
    {collective::reduce, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured"},
};

// Groups whose ranks all share ONE GPU (no link between them: every algorithm moves its bytes through
// the same memory, so the fewest synchronisations win). Measured on one H100 80GB HBM3, float sum,
// default 8 MiB staging, 2, 4 and 8 ranks; the files each rule names are in the bench/results folder
// that holds 7-all-reduce-sweep.txt (its README.md says which run made which file); one run of each,
// so differences of 1-3 us at small sizes are not rules. Above 8 ranks (unmeasured) the rules of
// cuda_tuning.
inline constexpr tuning_rule cuda_tuning_one_gpu[] = {
    {collective::all_reduce, 2, 8, ~std::uint64_t{0}, algo::one_shot,
     "7-all-reduce-sweep.txt: one_shot's algbw 1.3-2.2x two_shot's at 2, 4 and 8 ranks, 256 KiB to 256 MiB "
     "(8 ranks: to 64 MiB; 256 MiB: 261 vs 118 GB/s at 2 ranks, 139 vs 69 at 4; 64 MiB: 51 vs 38 at 8)"},
    {collective::all_reduce, 9, 64, std::uint64_t{256} << 10, algo::one_shot, "unmeasured above 8 ranks: as cuda_tuning"},
    {collective::all_reduce, 9, 64, ~std::uint64_t{0}, algo::two_shot, "unmeasured above 8 ranks: as cuda_tuning"},
    {collective::reduce_scatter, 2, 64, ~std::uint64_t{0}, algo::direct,
     "2-gpu-check-bench.log, 4-all8.txt: direct ahead of ring and halving_doubling at 2, 4 ranks (32 MiB) and 8 (2 and 16 MiB)"},
    {collective::all_gather, 8, 8, std::uint64_t{256} << 10, algo::halving_doubling,
     "4-all8.txt: 40.6-51.2 us against direct's 48.9-56.6 at every size from 64 B to 2 MiB (8 blocks of 8 B to 256 KiB)"},
    {collective::all_gather, 2, 64, ~std::uint64_t{0}, algo::direct,
     "same runs: direct ahead at 2, 4 ranks (large sizes, within 1 us below 2 MiB) and 8 (16 MiB: 220 vs 341 us)"},
    {collective::broadcast, 2, 64, ~std::uint64_t{0}, algo::direct,
     "same runs: direct 236-295 GB/s at 32 MiB, ring and tree 2.6-7.5 (one step per 64 KiB chunk); tree within 2 us below 8 KiB"},
    {collective::reduce, 2, 64, ~std::uint64_t{0}, algo::direct,
     "same runs: direct 67-179 GB/s at 32 MiB, ring and tree 1.0-6.3; tree ahead by 2-7 us at some small sizes at 8 ranks, behind at others"},
};

} // namespace braid::cuda
