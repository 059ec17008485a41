// The reference sweep (tests/comm/sweep.hpp) for ranks as threads and as processes, nranks
// {1, 2, 3, 4, 5, 8}. BRAID_SWEEP_LARGE overrides the large count (default 1000003).
#include <doctest/doctest.h>

#include "comm/sweep.hpp"
#include "support/fork_ranks.hpp"

#include <cstdio>
#include <cstdlib>

namespace {
std::size_t large_count() {
  if (const char* s = std::getenv("BRAID_SWEEP_LARGE")) return std::strtoull(s, nullptr, 10);
  return 1000003;
}
constexpr int kRanks[] = {1, 2, 3, 4, 5, 8};
} // namespace

TEST_CASE("reference sweep: ranks as threads") {
  for (int n : kRanks) {
    std::vector<braid::testing::sweep_stats> stats(static_cast<std::size_t>(n));
    braid::run_threads(n, [&](braid::communicator& comm) {
      braid::testing::run_sweep(comm, large_count(), stats[static_cast<std::size_t>(comm.rank())]);
    });
    long cases = 0, elements = 0;
    for (auto& s : stats) {
      cases += s.cases;
      elements += s.elements;
      if (s.failures) FAIL_CHECK(s.failures << " failures; first: " << s.first);
    }
    MESSAGE("threads n=" << n << ": " << cases << " rank-cases, " << elements << " elements checked");
  }
}

TEST_CASE("reference sweep: ranks as processes") {
  for (int n : kRanks) {
    const auto status = braid::testing::fork_ranks(n, [&](int rank, const braid::unique_id& id) {
      auto comm = braid::communicator::join(id, rank, n);
      braid::testing::sweep_stats st;
      braid::testing::run_sweep(comm, large_count(), st);
      if (st.failures) std::fprintf(stderr, "rank %d: %ld failures; first: %s\n", rank, st.failures, st.first.c_str());
      else if (rank == 0) std::printf("processes n=%d: %ld rank-cases per rank, %ld elements checked on rank 0\n", n, st.cases, st.elements);
      return st.failures ? 1 : 0;
    });
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(status[static_cast<std::size_t>(r)] == 0, "n=" << n << " rank " << r << " exit status " << status[static_cast<std::size_t>(r)]);
  }
}
