// tests/schedule/test_process_host_layout.cpp — what the cross-process CUDA communicator's host path
// replays a schedule with (braid/cuda/process/host_layout.hpp), checked on the CPU: a round's staging
// half fits, its regions and scratch do not overlap and hold every chunk; the levels put every step
// after the peer steps it reads, in each rank's own order, with the depths the schedules imply; and
// the reduce kernel's grid.
#include <doctest/doctest.h>

#include <braid/cuda/process/host_layout.hpp>
#include <braid/schedule/schedule.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace {

using braid::algo;
using braid::collective;
using namespace braid::cuda::process;
namespace sch = braid::schedule;

constexpr collective all_colls[] = {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                                    collective::broadcast, collective::reduce};

template <std::size_t N> struct bytes_of {
  unsigned char b[N];
};

template <class S, class T> long check_halves(collective c, int n) {
  long checked = 0;
  for (u64 half : {u64{64} << 10, (u64{1} << 20) + 4096, u64{16} << 20}) {
    CAPTURE(half);
    const host_half L = fit_host_half<S, T>(c, n, half);
    ++checked;
    if (L.per == 0) {
      // Nothing fits: not even one element per block.
      CHECK(host_half_for<S, T>(c, n, 1).total > half);
      continue;
    }
    CHECK(L.total <= half);
    // Used, not wasted: more than half of the half.
    CHECK(L.total * 2 > half);
    CHECK(L.scratch_off >= static_cast<u64>(L.regions) * L.region_bytes);
    CHECK(L.regions == 1 + S::nphases(c, n));
    const std::uint32_t P = S::nchunks(c, n, host_pipeline);
    const sch::chunk_map<T> map(c, n, 0, 0, L.per, L.per);
    CHECK(map.region_bytes == L.region_bytes);
    // Every chunk of a full round lies inside its region and fits a scratch piece; chunks of one
    // region do not overlap.
    // A region's worth of memory (not written), so that the slot pointers stay inside one object.
    const std::unique_ptr<std::byte[]> region(new std::byte[L.region_bytes + 1]);
    std::byte* base = region.get();
    u64 next = 0;
    for (std::uint32_t ch = 0; ch < P; ++ch) {
      const sch::chunk_span sp = sch::chunk_at(c, L.per, P, ch, sch::chunk_unit<T>());
      const auto lo = static_cast<u64>(reinterpret_cast<std::byte*>(map.slot(base, 0, ch, sp)) - base);
      CHECK(lo >= next);
      next = lo + sp.count * sizeof(T);
      CHECK(next <= L.region_bytes);
      if (L.slots) CHECK(sp.count * sizeof(T) <= L.piece_bytes);
    }
  }
  return checked;
}

template <class S> long check_levels(collective c, int n, int root) {
  const std::uint32_t P = S::nchunks(c, n, host_pipeline);
  const host_levels v = levels_for<S>(c, n, root);
  bool last_reads_in = false;
  for (int q = 0; q < n; ++q) {
    const int ns = S::nsteps(sch::args{c, n, q, root, P});
    REQUIRE(v.nsteps[static_cast<std::size_t>(q)] == ns);
    for (int j = 0; j < ns; ++j) {
      const int l = v.at(q, j);
      REQUIRE(l >= 0);
      REQUIRE(l < v.depth);
      if (j > 0) CHECK(l >= v.at(q, j - 1));
      const sch::step st = S::at(sch::args{c, n, q, root, P}, j);
      for (int i = 0; i < st.count_sources(n); ++i) {
        const sch::source s = st.source_at(i);
        if (s.rank == q) continue;
        if (s.ready >= 0) CHECK(l > v.at(s.rank, s.ready));
        if (l + 1 == v.depth && s.reg == sch::region::in) last_reads_in = true;
      }
    }
  }
  CHECK(v.last_reads_in == last_reads_in);
  return 1;
}

} // namespace

TEST_CASE("process host layout: every schedule's half fits, holds every chunk, and is used") {
  long halves = 0;
  for (collective c : all_colls)
    for (int n : {2, 3, 4, 5, 8, 64}) {
      CAPTURE(static_cast<int>(c));
      CAPTURE(n);
      for (algo a : braid::all_algos) {
        if (!braid::supports(a, c)) continue;
        CAPTURE(static_cast<int>(a));
        sch::with_schedule(a, [&](auto s) {
          using S = decltype(s);
          halves += check_halves<S, std::uint8_t>(c, n);
          halves += check_halves<S, std::uint16_t>(c, n);
          halves += check_halves<S, float>(c, n);
          halves += check_halves<S, double>(c, n);
          halves += check_halves<S, bytes_of<12>>(c, n);
          halves += check_halves<S, bytes_of<16>>(c, n);
        });
      }
    }
  MESSAGE(halves << " halves checked");
}

TEST_CASE("process host layout: a half too small for one element per rank gives no round") {
  // reduce_scatter over 64 ranks of 16-byte elements: 2 regions of 64 blocks, and 63 scratch pieces of
  // 256 bytes, do not fit 4 KiB.
  CHECK(fit_host_half<sch::direct, bytes_of<16>>(collective::reduce_scatter, 64, 4096).per == 0);
  // all_gather copies only: one region, no scratch.
  const host_half g = fit_host_half<sch::direct, double>(collective::all_gather, 2, 4096);
  CHECK(g.per == 256);
  CHECK(g.slots == 0);
}

TEST_CASE("process host layout: levels follow every read, and the schedules' depths") {
  long cases = 0;
  for (collective c : all_colls)
    for (int n : {2, 3, 4, 5, 7, 8, 16, 64})
      for (int root : {0, n - 1}) {
        CAPTURE(static_cast<int>(c));
        CAPTURE(n);
        CAPTURE(root);
        for (algo a : braid::all_algos) {
          if (!braid::supports(a, c)) continue;
          CAPTURE(static_cast<int>(a));
          sch::with_schedule(a, [&](auto s) { cases += check_levels<decltype(s)>(c, n, root); });
        }
      }
  MESSAGE(cases << " schedules checked");
  // two_shot: the reduce, one meeting, the copies (which read windows only).
  const host_levels t = levels_for<sch::two_shot>(collective::all_reduce, 4, 0);
  CHECK(t.depth == 2);
  CHECK_FALSE(t.last_reads_in);
  // one_shot and direct's reduce_scatter: one level, reading inputs.
  CHECK(levels_for<sch::one_shot>(collective::all_reduce, 4, 0).depth == 1);
  CHECK(levels_for<sch::one_shot>(collective::all_reduce, 4, 0).last_reads_in);
  CHECK(levels_for<sch::direct>(collective::reduce_scatter, 4, 0).depth == 1);
  // ring all_reduce: each of its 2(n - 1) steps reads the predecessor's previous one.
  CHECK(levels_for<sch::ring>(collective::all_reduce, 5, 0).depth == 8);
  // direct all_reduce: rank 0 reduces, the others copy its window after one meeting.
  CHECK(levels_for<sch::direct>(collective::all_reduce, 4, 0).depth == 2);
}

TEST_CASE("process host layout: the levels cache computes each schedule once and returns what levels_for does") {
  host_levels_cache cache;
  const host_levels& a = cache.get<sch::two_shot>(algo::two_shot, collective::all_reduce, 4, 0);
  CHECK(cache.computed() == 1);
  const host_levels want = levels_for<sch::two_shot>(collective::all_reduce, 4, 0);
  CHECK(a.depth == want.depth);
  CHECK(a.level == want.level);
  CHECK(a.last_reads_in == want.last_reads_in);
  // The same call again, and a root the collective does not use: looked up, not computed.
  CHECK(&cache.get<sch::two_shot>(algo::two_shot, collective::all_reduce, 4, 0) == &a);
  CHECK(&cache.get<sch::two_shot>(algo::two_shot, collective::all_reduce, 4, 3) == &a);
  CHECK(cache.computed() == 1);
  // A rooted collective's roots are different schedules.
  const host_levels& b0 = cache.get<sch::ring>(algo::ring, collective::broadcast, 4, 0);
  const host_levels& b2 = cache.get<sch::ring>(algo::ring, collective::broadcast, 4, 2);
  CHECK(cache.computed() == 3);
  CHECK(b0.level == levels_for<sch::ring>(collective::broadcast, 4, 0).level);
  CHECK(b2.level == levels_for<sch::ring>(collective::broadcast, 4, 2).level);
  CHECK(b0.level != b2.level);
  // Another algorithm of the same collective is another entry.
  cache.get<sch::ring>(algo::ring, collective::all_reduce, 4, 0);
  CHECK(cache.computed() == 4);
}

TEST_CASE("process host layout: the reduce grid comes from the piece and the device unless asked for") {
  // From the device (asked 0): one block per 32 KiB of piece, at most one per SM, at least one.
  CHECK(reduce_grid(1, 4, 0, 132, 512) == 1);
  CHECK(reduce_grid(8192, 4, 0, 132, 512) == 1);           // 32 KiB
  CHECK(reduce_grid(8193, 4, 0, 132, 512) == 2);
  CHECK(reduce_grid(std::uint64_t{1} << 18, 4, 0, 132, 512) == 32); // 1 MiB
  CHECK(reduce_grid(std::uint64_t{1} << 24, 4, 0, 132, 512) == 132); // 64 MiB: every SM, no more
  CHECK(reduce_grid(std::uint64_t{1} << 24, 4, 0, 16, 512) == 16);
  CHECK(reduce_grid(std::uint64_t{1} << 24, 2, 0, 0, 512) == 1); // a device reporting no SMs: one
  // 64-byte elements: bytes, not elements, decide; never more blocks than 512-thread groups.
  CHECK(reduce_grid(2048, 64, 0, 132, 512) == 4);
  CHECK(reduce_grid(600, 1024, 0, 132, 512) == 2);
  // Asked for: that many, but no block without an element to reduce.
  CHECK(reduce_grid(std::uint64_t{1} << 24, 4, 16, 132, 512) == 16);
  CHECK(reduce_grid(1000, 4, 16, 132, 512) == 2);
  CHECK(reduce_grid(1000, 4, 200, 4, 512) == 2);
  // Every piece size from 1 element to 4 MiB of floats: within [1, sms], monotone in the piece.
  std::uint64_t prev = 0;
  for (std::uint64_t m = 1; m <= (std::uint64_t{1} << 20); m = m * 5 / 4 + 1) {
    const std::uint64_t g = reduce_grid(m, 4, 0, 132, 512);
    CHECK(g >= 1);
    CHECK(g <= 132);
    CHECK(g >= prev);
    prev = g;
  }
}
