// bench/rows.hpp — the definition of rank_runner::run_row, for bench/rows_*.cpp only: each of them
// instantiates it for a group of element types (every operator and algorithm of every collective).
#pragma once

#include "bench.hpp"

namespace braid_bench {

template <class T> void rank_runner::run_row(collective c, algo a, dtype t, op_kind k, std::uint64_t size) {
  braid::visit(k, [&](auto op) { run_row_op<T>(c, a, t, k, op, size); });
}

} // namespace braid_bench

// The explicit instantiation of run_row<T>, one line per element type in each rows_*.cpp.
#define BRAID_BENCH_ROWS(T)                                                                        \
  template void braid_bench::rank_runner::run_row<T>(braid_bench::collective, braid_bench::algo,    \
                                                     braid_bench::dtype, braid_bench::op_kind,      \
                                                     std::uint64_t)
