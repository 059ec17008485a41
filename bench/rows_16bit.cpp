// bench/rows_16bit.cpp — braid-bench's rows for
// std::int16_t, std::uint16_t, braid::half, braid::bfloat16 (see bench/rows.hpp).
#include "rows.hpp"

BRAID_BENCH_ROWS(std::int16_t);
BRAID_BENCH_ROWS(std::uint16_t);
BRAID_BENCH_ROWS(braid::half);
BRAID_BENCH_ROWS(braid::bfloat16);
