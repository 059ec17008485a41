// tests/mpi/test_mpi_orders.cpp — braid::mpi::communicator's reduction order (docs/api.md, "Several
// hosts"), bit for bit: "inside a host the host communicator's algorithm (partials stored in T), then
// the H host partials in host order 0..H-1 in the operator's accumulator type". With at most two
// ranks on a host the host partial is one addition, the same bits whatever the host algorithm (two
// operands of a float sum commute exactly), so the whole result is fixed by the text:
//   p_h = x_a + x_b (or x_a alone), result = (...((p_0 + p_1) + p_2) ...) + p_{H-1}.
// float sum on values of mixed magnitudes (tests/comm/orders_values.hpp); all_reduce, reduce (root
// H-1's last rank) and reduce_scatter; a count whose inter-host step rides in the check's 208-byte
// blocks (7), one whose all_reduce slice is sent whole beside them (150: one round, every member
// reduces every copy) and two that take two-shot (1000, 100003). The program also checks that a flat fold in rank
// order, or in reverse rank order, differs from the rule on this data and layout (2 x 2 interleaved:
// the host grouping; 3 x 1 and 2 + 1: the direction), so another order could not pass.
//
// Run by tests/mpi/CMakeLists.txt under launch.sh with layouts of at most 2 ranks per host
// (2 x 2 interleaved, 3 x 1, 2 + 1). Exit status 0 when every rank saw the documented bits.
#include <braid/mpi.hpp>

#include "comm/orders_values.hpp"

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

using orders_rule::opk;
using orders_rule::u64;

// The documented result for global input element g (reduce_scatter: over all blocks).
float documented(const braid::mpi::host_layout& L, u64 g) {
  float acc = 0;
  for (int h = 0; h < L.hosts; ++h) {
    const std::vector<int>& m = L.members[static_cast<std::size_t>(h)];
    float p = orders_rule::value(m[0], g);
    for (std::size_t j = 1; j < m.size(); ++j) p = p + orders_rule::value(m[j], g);
    acc = h == 0 ? p : acc + p;
  }
  return acc;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failures = 0;
  {
    braid::mpi::communicator c(MPI_COMM_WORLD);
    const braid::mpi::host_layout& L = c.layout();
    const int n = c.size(), r = c.rank();
    for (int h = 0; h < L.hosts; ++h)
      if (L.members[static_cast<std::size_t>(h)].size() > 2) {
        if (r == 0) std::fprintf(stderr, "test_mpi_orders: host %d has more than 2 ranks: the host order is not fixed by the text alone\n", h);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    const int root = L.members[static_cast<std::size_t>(L.hosts - 1)].back();
    bool differs = false; // a flat fold in rank order or in reverse rank order, against the documented rule
    for (const u64 count : {u64{7}, u64{150}, u64{1000}, u64{100003}}) {
      const u64 un = static_cast<u64>(n);
      for (u64 g = 0; g < count * un && !differs; ++g)
        differs = documented(L, g) != orders_rule::fold(opk::sum, orders_rule::rank_order(n), g) ||
                  documented(L, g) != orders_rule::fold(opk::sum, orders_rule::reversed(orders_rule::rank_order(n)), g);
      std::vector<float> in(count * un), out(count * un, -0.0f);
      for (u64 i = 0; i < count * un; ++i) in[i] = orders_rule::value(r, i);
      auto judge = [&](const char* what, u64 n_out, u64 offset) {
        for (u64 i = 0; i < n_out; ++i) {
          const float want = documented(L, offset + i);
          if (std::memcmp(&out[i], &want, sizeof want) != 0) {
            std::fprintf(stderr, "rank %d (host %d): %s count %llu: element %llu is %a, the documented order gives %a\n", r, L.host, what,
                         static_cast<unsigned long long>(count), static_cast<unsigned long long>(i), static_cast<double>(out[i]),
                         static_cast<double>(want));
            ++failures;
            return;
          }
        }
      };
      c.all_reduce(in.data(), out.data(), count, braid::sum<>{});
      judge("all_reduce", count, 0);
      c.reduce(in.data(), out.data(), count, root, braid::sum<>{});
      if (r == root) judge("reduce", count, 0);
      c.reduce_scatter(in.data(), out.data(), count, braid::sum<>{});
      judge("reduce_scatter", count, static_cast<u64>(r) * count);
    }
    if (!differs) {
      std::fprintf(stderr, "rank %d: flat folds in rank order and reverse rank order both equal the documented order on this data: the test cannot fail\n", r);
      ++failures;
    }
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (r == 0)
      std::printf("test_mpi_orders: %d ranks on %d hosts: all_reduce, reduce, reduce_scatter of 7, 150, 1000 and 100003 floats: %s\n", n,
                  L.hosts, all ? "FAILED" : "the documented order, bit for bit");
    failures = all;
  }
  MPI_Finalize();
  return failures ? 1 : 0;
}
