// tests/schedule/test_tuning.cpp — the host tuning table (comm/tuning.hpp, issue 15 item 5): every
// choice it can make is an algorithm that implements its collective (an unsupported one would run as
// ring, silently), every rule says what justified it, and the choices bench/results/tuning-2026-11-27-*
// measured are the ones it makes.
#include <doctest/doctest.h>

#include <braid/comm/tuning.hpp>

#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace {

using braid::algo;
using braid::collective;
using u64 = std::uint64_t;

constexpr collective all_colls[] = {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                                    collective::broadcast, collective::reduce};
constexpr std::uint8_t kinds[] = {braid::thread_ranks, braid::process_ranks};

algo pick(collective c, int n, u64 bytes, std::uint8_t kind) {
  return braid::choose_algorithm(braid::host_tuning, c, n, bytes, kind);
}

// A measured choice: pick(c, n, bytes, k) == want for each kind of ranks k in `ranks` (a tuning_ranks
// mask).
struct choice {
  collective c;
  int n;
  u64 bytes;
  std::uint8_t ranks;
  algo want;
};
void check_choices(std::initializer_list<choice> choices) {
  for (const choice& x : choices)
    for (std::uint8_t k : kinds)
      if (x.ranks & k)
        CHECK_MESSAGE(pick(x.c, x.n, x.bytes, k) == x.want, name(x.c) << " n=" << x.n << " " << x.bytes << " B, ranks " << int(k));
}

} // namespace

TEST_CASE("host tuning: every rule names its evidence and every choice implements its collective") {
  for (const auto& r : braid::host_tuning) {
    CHECK(r.evidence != nullptr);
    CHECK(std::strlen(r.evidence) > 10);
    CHECK(braid::supports(r.choice, r.coll));
    CHECK(r.min_ranks <= r.max_ranks);
    CHECK(r.ranks != 0);
  }
  long cases = 0;
  for (collective c : all_colls)
    for (std::uint8_t k : kinds)
      for (int n = 2; n <= 64; ++n)
        for (u64 b = 1; b <= (u64{1} << 30); b *= 2) {
          ++cases;
          const algo a = pick(c, n, b, k);
          if (!braid::supports(a, c)) FAIL_CHECK(name(c) << " n=" << n << " " << b << " B: " << name(a));
          // Both kinds of ranks, and every size, are covered by a rule: nothing falls through to the default.
          bool matched = false;
          for (const auto& r : braid::host_tuning) matched = matched || braid::rule_applies(r, c, n, b, k);
          if (!matched) FAIL_CHECK(name(c) << " n=" << n << " " << b << " B: no rule");
        }
  CHECK(cases == 5 * 2 * 63 * 31);
}

TEST_CASE("host tuning: the measured choices (bench/results/tuning-2026-11-27-before-cpu.txt)") {
  constexpr auto T = braid::thread_ranks, P = braid::process_ranks, both = braid::any_ranks;
  check_choices({
      // all_reduce: one_shot to 256 KiB at 2 ranks (64 KiB was two_shot at 23.6 us against one_shot's 14.4,
      // slower than MPI_Allreduce's 17.8), to 4 KiB at 3 and more; two_shot above.
      {collective::all_reduce, 2, 64 << 10, both, algo::one_shot},
      {collective::all_reduce, 2, 256 << 10, both, algo::one_shot},
      {collective::all_reduce, 2, (1 << 20) + 4, both, algo::two_shot},
      {collective::all_reduce, 4, 4 << 10, both, algo::one_shot},
      {collective::all_reduce, 4, 16 << 10, both, algo::two_shot},
      {collective::all_reduce, 17, 16 << 10, both, algo::ring},
      // reduce_scatter: at 2 ranks halving_doubling above 16 KiB for processes, direct for threads; from 3
      // ranks halving_doubling above 4 KiB.
      {collective::reduce_scatter, 2, 16 << 10, P, algo::direct},
      {collective::reduce_scatter, 2, 64 << 10, P, algo::halving_doubling},
      {collective::reduce_scatter, 2, 64 << 10, T, algo::direct},
      {collective::reduce_scatter, 4, 4 << 10, both, algo::direct},
      {collective::reduce_scatter, 16, 64 << 20, both, algo::halving_doubling},
      {collective::reduce_scatter, 17, 64 << 20, both, algo::ring},
      // broadcast: ring above 1 MiB at 2 ranks only; reduce: ring above 16 KiB from 3 ranks.
      {collective::broadcast, 2, 1 << 20, both, algo::direct},
      {collective::broadcast, 2, 4 << 20, both, algo::ring},
      {collective::broadcast, 4, 4 << 20, both, algo::direct},
      {collective::reduce, 2, 64 << 20, both, algo::direct},
      {collective::reduce, 4, 16 << 10, both, algo::direct},
      {collective::reduce, 4, 256 << 10, both, algo::ring},
      {collective::all_gather, 4, 64 << 20, both, algo::direct},
  });
}

TEST_CASE("host tuning: thread ranks reading inputs in place from 16 KiB (bench/results/tuning-2026-11-27-zero-copy-xeon-cpu.txt)") {
  constexpr auto T = braid::thread_ranks, P = braid::process_ranks;
  check_choices({
      // all_reduce at 2 ranks: one_shot to 1 MiB for threads, to 256 KiB for processes.
      {collective::all_reduce, 2, 1 << 20, T, algo::one_shot},
      {collective::all_reduce, 2, 512 << 10, P, algo::two_shot},
      // reduce_scatter from 3 ranks: direct to 128 KiB for threads, halving_doubling above 4 KiB for processes.
      {collective::reduce_scatter, 4, 16 << 10, T, algo::direct},
      {collective::reduce_scatter, 4, 128 << 10, T, algo::direct},
      {collective::reduce_scatter, 4, (128 << 10) + 4, T, algo::halving_doubling},
      {collective::reduce_scatter, 4, 16 << 10, P, algo::halving_doubling},
      // reduce from 3 ranks: direct to 64 KiB for threads, to 16 KiB for processes; ring above.
      {collective::reduce, 4, 64 << 10, T, algo::direct},
      {collective::reduce, 4, (64 << 10) + 4, T, algo::ring},
      {collective::reduce, 4, 64 << 10, P, algo::ring},
  });
}
