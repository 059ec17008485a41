// bench/rows_8bit.cpp — braid-bench's rows for
// std::int8_t, std::uint8_t, braid::fp8_e4m3, braid::fp8_e5m2 (see bench/rows.hpp).
#include "rows.hpp"

namespace braid_bench {
template void rank_runner::run_row<std::int8_t>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<std::uint8_t>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<braid::fp8_e4m3>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<braid::fp8_e5m2>(collective, algo, dtype, op_kind, std::uint64_t);
} // namespace braid_bench
