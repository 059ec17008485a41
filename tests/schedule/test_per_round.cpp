// tests/schedule/test_per_round.cpp — schedule::per_round, the round size both executors (host and
// CUDA) use: a round must fill a staging half (minus the 64-byte padding of each region, once per
// region), because every round costs a synchronisation of all ranks (issue 15). Checked for every
// schedule, collective, element size and 1..64 ranks, at the default half (4 MiB: options'
// staging_bytes of 8 MiB) and at 1 MiB.
#include <doctest/doctest.h>

#include <braid/schedule/schedule.hpp>

#include <cstdint>

namespace {

using braid::algo;
using braid::collective;
using u64 = std::uint64_t;

template <std::size_t N> struct bytes_of {
  unsigned char b[N];
};

constexpr collective all_colls[] = {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                                    collective::broadcast, collective::reduce};
constexpr algo all_algos[] = {algo::ring, algo::tree, algo::one_shot, algo::two_shot, algo::halving_doubling, algo::direct};

struct tally {
  long cases = 0, over = 0, under = 0, formula = 0;
  double worst = 1.0;
};

// The expected round, written independently of per_round: the half is split into `regions` equal
// regions rounded down to 64 bytes; a region holds `blocks` blocks of the round; the round is rounded
// down to the chunk unit.
template <class T> u64 expected(u64 half, u64 regions, u64 blocks) {
  const u64 region = half / regions / 64 * 64;
  u64 e = region / (blocks * sizeof(T));
  const u64 unit = braid::schedule::chunk_unit<T>();
  if (e >= unit) e -= e % unit;
  return e;
}

template <class T> void check_type(tally& t, u64 half) {
  for (collective c : all_colls)
    for (algo a : all_algos) {
      if (!braid::supports(a, c)) continue;
      for (int n = 1; n <= 64; ++n)
        braid::schedule::with_schedule(a, [&](auto s) {
          using S = decltype(s);
          const u64 regions = static_cast<u64>(S::nphases(c, n)) + 1;
          const u64 blocks = braid::schedule::blocked(c) ? static_cast<u64>(n) : 1;
          const u64 per = braid::schedule::per_round<S, T>(c, n, half);
          const braid::schedule::chunk_map<T> map(c, n, 0, 0, per * 10 + 1, per);
          const u64 used = regions * map.region_bytes;
          ++t.cases;
          if (used > half) ++t.over;
          const double fill = static_cast<double>(used) / static_cast<double>(half);
          if (fill < t.worst) t.worst = fill;
          if (fill < 0.9) {
            if (++t.under <= 5)
              FAIL_CHECK(name(c) << "/" << name(a) << " n=" << n << " " << sizeof(T) << "-byte elements: a round of " << per
                                 << " elements fills " << fill * 100 << "% of a " << half << "-byte half");
          }
          if (per != expected<T>(half, regions, blocks)) ++t.formula;
          // Rounds per call: a call of `count` elements takes ceil(count / per) rounds.
          for (u64 count : {u64{1}, per, per + 1, u64{1} << 24})
            if (per && braid::schedule::nrounds(count, per) != (count + per - 1) / per) ++t.formula;
        });
    }
}

} // namespace

TEST_CASE("per_round: a round fills at least 90% of a staging half, never more than all of it") {
  for (u64 half : {u64{4} << 20, u64{1} << 20}) {
    CAPTURE(half);
    tally t;
    check_type<std::uint8_t>(t, half);
    check_type<std::uint16_t>(t, half);
    check_type<bytes_of<3>>(t, half);
    check_type<float>(t, half);
    check_type<double>(t, half);
    check_type<bytes_of<16>>(t, half);
    MESSAGE(t.cases << " (schedule, collective, type size, ranks) cases at a " << half << "-byte half; the emptiest round fills "
                    << t.worst * 100 << "%");
    CHECK(t.over == 0);
    CHECK(t.under == 0);
    CHECK(t.formula == 0);
  }
}
