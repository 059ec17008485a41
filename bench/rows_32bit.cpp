// bench/rows_32bit.cpp — braid-bench's rows for
// std::int32_t, std::uint32_t, float (see bench/rows.hpp).
#include "rows.hpp"

namespace braid_bench {
template void rank_runner::run_row<std::int32_t>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<std::uint32_t>(collective, algo, dtype, op_kind, std::uint64_t);
template void rank_runner::run_row<float>(collective, algo, dtype, op_kind, std::uint64_t);
} // namespace braid_bench
