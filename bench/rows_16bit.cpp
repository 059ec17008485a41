// bench/rows_16bit.cpp — braid-bench's rows for
// std::int16_t, std::uint16_t, braid::half, braid::bfloat16 (see bench/rows.hpp).
#include "rows.hpp"

namespace braid_bench {
template void rank_runner::run_row<std::int16_t>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<std::uint16_t>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<braid::half>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<braid::bfloat16>(collective, algo, dtype, op_kind, std::uint64_t);
} // namespace braid_bench
