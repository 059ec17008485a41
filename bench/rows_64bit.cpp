// bench/rows_64bit.cpp — braid-bench's rows for
// std::int64_t, std::uint64_t, double (see bench/rows.hpp).
#include "rows.hpp"

BRAID_BENCH_ROWS(std::int64_t);
BRAID_BENCH_ROWS(std::uint64_t);
BRAID_BENCH_ROWS(double);
