// bench/rows_8bit.cpp — braid-bench's rows for
// std::int8_t, std::uint8_t, braid::fp8_e4m3, braid::fp8_e5m2 (see bench/rows.hpp).
#include "rows.hpp"

BRAID_BENCH_ROWS(std::int8_t);
BRAID_BENCH_ROWS(std::uint8_t);
BRAID_BENCH_ROWS(braid::fp8_e4m3);
BRAID_BENCH_ROWS(braid::fp8_e5m2);
