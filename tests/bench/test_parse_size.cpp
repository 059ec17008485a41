// tests/bench/test_parse_size.cpp — bench/parse_size.hpp, the size argument of braid-bench-mpi and
// braid-mpi-allreduce: suffixes, and refusal of signs, spaces, unknown suffixes and 64-bit overflow
// (each refusal leaves the output unchanged).
#include <doctest/doctest.h>

#include <parse_size.hpp>

#include <cstdint>

using braid_bench::parse_size;

TEST_CASE("parse_size: plain counts and 1024-based suffixes") {
  std::uint64_t v = 0;
  CHECK((parse_size("0", v) && v == 0));
  CHECK((parse_size("8", v) && v == 8));
  CHECK((parse_size("1k", v) && v == 1024));
  CHECK((parse_size("64M", v) && v == (std::uint64_t{64} << 20)));
  CHECK((parse_size("2g", v) && v == (std::uint64_t{2} << 30)));
  CHECK((parse_size("18446744073709551615", v) && v == UINT64_MAX));
  CHECK((parse_size("17179869183G", v) && v == (std::uint64_t{17179869183} << 30)));
}

TEST_CASE("parse_size: refusals leave the output unchanged") {
  for (const char* bad : {"", "-1", "+5", " 5", "5X", "5KB", "k", "18446744073709551616", "17179869184G",
                          "18014398509481984K"}) {
    std::uint64_t v = 77;
    CAPTURE(bad);
    CHECK_FALSE(parse_size(bad, v));
    CHECK(v == 77);
  }
}
