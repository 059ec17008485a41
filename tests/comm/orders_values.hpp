// tests/comm/orders_values.hpp — the inputs of the reduction-order tests and the plain left fold
// over ranks (no test framework: tests/mpi's programs use it too). orders_rule.hpp builds the
// documented rules on it.
#pragma once

#include <braid/braid.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace orders_rule {

using u64 = std::uint64_t;

struct minus {
  BRAID_HD float operator()(const float& a, const float& b) const { return a - b; }
};

enum class opk { sum, minus };

inline float apply(opk k, float a, float b) { return k == opk::sum ? a + b : a - b; }

// Rank r's input element i (i counts over the whole input, all blocks for reduce_scatter).
inline float value(int r, u64 i) {
  u64 h = (static_cast<u64>(r) + 1) * 0x9E3779B97F4A7C15ull ^ (i + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  const float m = 1.0f + static_cast<float>(h & 0x7FFFFF) / 8388608.0f; // [1, 2), 24 significant bits
  const int e = static_cast<int>((h >> 23) % 25) - 12;                   // 2^-12 .. 2^12
  const float s = (h >> 40) & 1 ? -1.0f : 1.0f;
  return s * std::ldexp(m, e);
}

// Left fold over ranks in the given order.
inline float fold(opk k, const std::vector<int>& order, u64 i) {
  float acc = value(order[0], i);
  for (std::size_t j = 1; j < order.size(); ++j) acc = apply(k, acc, value(order[j], i));
  return acc;
}

inline std::vector<int> rank_order(int n) {
  std::vector<int> o(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) o[static_cast<std::size_t>(r)] = r;
  return o;
}

inline std::vector<int> reversed(std::vector<int> o) {
  std::reverse(o.begin(), o.end());
  return o;
}

// Ranks start, start+step, start+2*step, ... (mod n), n of them.
inline std::vector<int> cyclic(int n, int start, int step) {
  std::vector<int> o;
  for (int j = 0; j < n; ++j) o.push_back(((start + j * step) % n + n) % n);
  return o;
}

} // namespace orders_rule
