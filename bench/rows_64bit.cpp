// bench/rows_64bit.cpp — braid-bench's rows for
// std::int64_t, std::uint64_t, double (see bench/rows.hpp).
#include "rows.hpp"

namespace braid_bench {
template void rank_runner::run_row<std::int64_t>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<std::uint64_t>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<double>(collective, algo, dtype, op_kind, std::uint64_t);
} // namespace braid_bench
