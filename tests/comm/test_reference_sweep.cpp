// The reference sweep (tests/comm/sweep.hpp) for ranks as threads and as processes, nranks
// {1, 2, 3, 4, 5, 8}. Environment:
//   BRAID_SWEEP=full    the large count for every type (default: one type per element size)
//   BRAID_SWEEP=quick   large count 20011 and nranks {1, 2, 3, 4} (sanitizer runs)
//   BRAID_SWEEP_LARGE   overrides the large count (default 1000003)
#include <doctest/doctest.h>

#include "comm/sweep.hpp"
#include "support/fork_ranks.hpp"

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

namespace {
std::string_view mode() {
  const char* s = std::getenv("BRAID_SWEEP");
  return s ? std::string_view(s) : std::string_view("standard");
}
bool full() { return mode() == "full"; }
bool quick() { return mode() == "quick"; }
std::size_t large_count() {
  if (const char* s = std::getenv("BRAID_SWEEP_LARGE")) return std::strtoull(s, nullptr, 10);
  return quick() ? 20011 : 1000003;
}
std::vector<int> rank_counts() {
  if (quick()) return {1, 2, 3, 4};
  return {1, 2, 3, 4, 5, 8};
}
} // namespace

TEST_CASE("reference sweep: ranks as threads") {
  for (int n : rank_counts()) {
    std::vector<braid::testing::sweep_stats> stats(static_cast<std::size_t>(n));
    braid::run_threads(n, [&](braid::communicator& comm) {
      braid::testing::run_sweep(comm, large_count(), stats[static_cast<std::size_t>(comm.rank())], full());
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
  for (int n : rank_counts()) {
    const auto status = braid::testing::fork_ranks(n, [&](int rank, const braid::unique_id& id) {
      auto comm = braid::communicator::join(id, rank, n);
      braid::testing::sweep_stats st;
      braid::testing::run_sweep(comm, large_count(), st, full());
      if (st.failures) std::fprintf(stderr, "rank %d: %ld failures; first: %s\n", rank, st.failures, st.first.c_str());
      else if (rank == 0) std::printf("processes n=%d: %ld rank-cases per rank, %ld elements checked on rank 0\n", n, st.cases, st.elements);
      return st.failures ? 1 : 0;
    });
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(status[static_cast<std::size_t>(r)] == 0, "n=" << n << " rank " << r << " exit status " << status[static_cast<std::size_t>(r)]);
  }
}
