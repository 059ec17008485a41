// bench/rows_32bit.cpp — braid-bench's rows for
// std::int32_t, std::uint32_t, float (see bench/rows.hpp).
#include "rows.hpp"

BRAID_BENCH_ROWS(std::int32_t);
BRAID_BENCH_ROWS(std::uint32_t);
BRAID_BENCH_ROWS(float);
