// tests/comm/test_orders.cpp — the reduction orders written in docs/guarantees.md ("Exact reduction
// order"), checked bit for bit against braid with thread ranks. The rule, re-derived from the text,
// and the check live in orders_rule.hpp (shared with the CUDA communicator's test on the emulated
// device, tests/cuda/device/test_orders_emu.cpp).
#include "orders_rule.hpp"

namespace {

using namespace orders_rule;

// Runs every case of one staging size on n thread ranks.
std::vector<outcome> run_cases(int n, u64 staging, const std::vector<u64>& counts) {
  using braid::algo;
  using braid::collective;
  std::vector<outcome> cases = every_case(n, staging, counts);
  for (auto& cs : cases) cs.got.assign(static_cast<std::size_t>(n), {});
  braid::options opts;
  opts.staging_bytes = staging;
  braid::run_threads(
      n,
      [&](braid::communicator& comm) {
        const int r = comm.rank();
        for (auto& cs : cases) {
          const rule& ru = cs.ru;
          const bool rs = ru.c == collective::reduce_scatter;
          const u64 in_n = rs ? ru.count * static_cast<u64>(n) : ru.count;
          std::vector<float> in(in_n);
          for (u64 i = 0; i < in_n; ++i) in[i] = value(r, i);
          std::vector<float> out(ru.count, -0.0f);
          const braid::call_options co{ru.a};
          auto call = [&](auto op) {
            if (ru.c == collective::all_reduce) comm.all_reduce(in.data(), out.data(), ru.count, op, co);
            else if (ru.c == collective::reduce) comm.reduce(in.data(), out.data(), ru.count, ru.root, op, co);
            else comm.reduce_scatter(in.data(), out.data(), ru.count, op, co);
          };
          if (cs.k == opk::sum) call(braid::sum<>{});
          else call(minus{});
          if (ru.c != collective::reduce || r == ru.root) cs.got[static_cast<std::size_t>(r)] = std::move(out);
        }
      },
      opts);
  return cases;
}

} // namespace

TEST_CASE("reduction orders: every algorithm of all_reduce, reduce and reduce_scatter follows docs/guarantees.md") {
  // Cases: counts 1, 7, 1000 and 100000 at the default staging (8 MiB: one round, tree pipelines of
  // 2 and 7 chunks, the large one read in place); 1000 at 8 KiB of staging (many rounds of a few
  // hundred elements, or 16 per block for reduce_scatter at n = 8); 100000 at 1 MiB (rounds of 43680
  // elements for ring and tree all_reduce: three tree chunks, then a last round of two).
  std::map<std::string, bool> alternative_differs;
  tally t;
  for (int n = 2; n <= 8; ++n) {
    for (const auto& [staging, counts] : {std::pair<u64, std::vector<u64>>{u64{8} << 20, {1, 7, 1000, 100000}},
                                          std::pair<u64, std::vector<u64>>{u64{8} << 10, {1000}},
                                          std::pair<u64, std::vector<u64>>{u64{1} << 20, {100000}}}) {
      for (const outcome& oc : run_cases(n, staging, counts)) check(oc, alternative_differs, t);
    }
  }
  MESSAGE(t.cases << " cases, " << t.elements << " output elements compared bit for bit");
  // The data must be able to tell the documented order from others: for the non-commutative operator
  // at every n, for the sum from three ranks on (two operands of a sum commute exactly).
  for (const auto& [key, differs] : alternative_differs) {
    const bool must = key.find(" minus") != std::string::npos || key.find(" n=2 ") == std::string::npos;
    if (must) CHECK_MESSAGE(differs, key << ": no alternative order gives different bits on this data");
  }
}

TEST_CASE("reduction orders: the halving-doubling butterfly runs from distance n/2 down, not from 1 up") {
  // The direction is what users asked about; check it separately so that a flip is named. From
  // four ranks on the two directions group the sum differently.
  for (int n : {4, 5, 8}) {
    const rule ru{braid::algo::halving_doubling, braid::collective::all_reduce, n, 0, 1000, u64{8} << 20};
    const auto down = expected(ru, opk::sum, 0), up = expected(ru, opk::sum, 3);
    REQUIRE(std::memcmp(down.data(), up.data(), down.size() * sizeof(float)) != 0);
  }
}
