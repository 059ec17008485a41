// A user struct with a user functor (max-with-index), bf16 with fp32 accumulation, and copy-only
// collectives on a type with no arithmetic at all.
#include <doctest/doctest.h>

#include <braid/braid.hpp>

#include <vector>

namespace {
struct value_index {
  float v;
  int i;
};
struct argmax {
  value_index operator()(const value_index& a, const value_index& b) const { return b.v > a.v ? b : a; }
};
} // namespace

TEST_CASE("user struct with a user functor: all_reduce for every algorithm, gather and broadcast") {
  for (int n : {1, 2, 3, 5}) {
    int wrong = 0;
    braid::run_threads(n, [&](braid::communicator& c) {
      std::vector<value_index> x(1001), y(1001), g(1001 * static_cast<std::size_t>(n));
      for (int i = 0; i < 1001; ++i) x[static_cast<std::size_t>(i)] = {float((i + c.rank()) % n), c.rank()};
      for (braid::algo a : braid::all_algos) {
        c.all_reduce(x.data(), y.data(), x.size(), argmax{}, {a});
        for (int i = 0; i < 1001; ++i) {
          const value_index& got = y[static_cast<std::size_t>(i)];
          // the maximum n-1 is held by exactly one rank: (i + r) % n == n - 1
          if (got.v != float(n - 1) || (got.i + i) % n != n - 1) ++wrong;
        }
      }
      c.all_gather(x.data(), g.data(), x.size());
      c.broadcast(x.data(), y.data(), x.size(), n - 1);
      for (int r = 0; r < n; ++r)
        if (g[static_cast<std::size_t>(r) * 1001].i != r) ++wrong;
      if (y[0].i != n - 1) ++wrong;
    });
    CHECK(wrong == 0);
  }
}

TEST_CASE("bfloat16 summed in float keeps the bits a bf16 accumulator loses") {
  braid::run_threads(4, [](braid::communicator& c) {
    // 256 + 1 + 1 + 1: exact in float, not in bf16 (8 bits of mantissa)
    std::vector<braid::bfloat16> x(64, braid::bfloat16(c.rank() == 0 ? 256.0f : 1.0f)), y(64);
    c.all_reduce(x.data(), y.data(), x.size(), braid::sum<float>{}, {braid::algo::one_shot});
    CHECK(float(y[0]) == float(braid::bfloat16(259.0f)));
    c.all_reduce(x.data(), y.data(), x.size(), braid::sum<braid::bfloat16>{}, {braid::algo::one_shot});
    CHECK(float(y[0]) == 256.0f); // each +1 rounds away in bf16
  });
}
