// bench/parse_size.hpp — the byte-size argument of braid-bench-mpi and braid-mpi-allreduce (-b, -e, -f).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace braid_bench {

// Parses a decimal count with an optional 1024-based suffix, K/k, M/m or G/g ("64M" = 64 << 20).
// Returns false, leaving `out` unchanged, for anything else: an empty string, a sign or space before
// the digits, another suffix, or a value that does not fit 64 bits.
inline bool parse_size(const char* s, std::uint64_t& out) {
  if (*s < '0' || *s > '9') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno == ERANGE) return false;
  const std::string unit(end);
  unsigned shift = 0;
  if (unit == "K" || unit == "k") shift = 10;
  else if (unit == "M" || unit == "m") shift = 20;
  else if (unit == "G" || unit == "g") shift = 30;
  else if (!unit.empty()) return false;
  if (static_cast<std::uint64_t>(v) > (UINT64_MAX >> shift)) return false;
  out = static_cast<std::uint64_t>(v) << shift;
  return true;
}

} // namespace braid_bench
