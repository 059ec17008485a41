// tests/schedule/test_process_layout.cpp — the staging arithmetic of the cross-process CUDA
// communicator (braid/cuda/process_layout.hpp), checked on the CPU: a round's layout fits its half,
// its regions do not overlap, the rounds cover the count exactly, and an all_reduce round's shards
// are disjoint, cover the round, fit the result and scratch regions, and start 16-byte aligned.
#include <doctest/doctest.h>

#include <braid/cuda/process_layout.hpp>

#include <cstdint>
#include <vector>

namespace {

using braid::collective;
using namespace braid::cuda::ipc_detail;

constexpr collective all_colls[] = {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                                    collective::broadcast, collective::reduce};

} // namespace

TEST_CASE("process layout: every round fits its half, regions are disjoint, rounds cover the count") {
  long layouts = 0;
  for (collective c : all_colls)
    for (int n : {2, 3, 4, 5, 8, 64})
      for (std::size_t elem : {1u, 2u, 4u, 8u, 12u, 16u})
        for (u64 half : {u64{64} << 10, (u64{1} << 20) + 4096, u64{16} << 20})
          for (u64 count : {u64{1}, u64{7}, u64{1003}, u64{1000003}, u64{1} << 30}) {
            CAPTURE(static_cast<int>(c));
            CAPTURE(n);
            CAPTURE(elem);
            CAPTURE(half);
            CAPTURE(count);
            const half_layout L = fit_layout(c, n, elem, half, count);
            ++layouts;
            REQUIRE(L.per > 0);
            REQUIRE(L.per <= count);
            CHECK(L.total <= half);
            CHECK(L.in_off + L.in_bytes <= L.res_off);
            CHECK(L.res_off + L.res_bytes <= L.scratch_off);
            CHECK(L.in_bytes == L.per * elem * (c == collective::reduce_scatter ? static_cast<u64>(n) : 1));
            // Not wasteful: a round that is shorter than the count uses over half the staging.
            if (L.per < count) CHECK(L.total * 2 > half);
            const u64 a = elem <= 16 && 16 % elem == 0 ? 16 / elem : 1;
            if (c == collective::all_reduce && L.per < count) CHECK(L.per % (static_cast<u64>(n) * a) == 0);
            // Rounds: all but the last have `per` elements and the last has 1..per, so every element
            // is in exactly one round (rounds 0, 1 and the last are checked in detail).
            const u64 rounds = (count + L.per - 1) / L.per;
            const u64 last = count - (rounds - 1) * L.per;
            CHECK(last > 0);
            CHECK(last <= L.per);
            for (u64 k : {u64{0}, u64{1}, rounds - 1}) {
              if (k >= rounds) continue;
              const u64 base = k * L.per, len = k + 1 == rounds ? last : L.per;
              if (c != collective::all_reduce) {
                CHECK(len * elem <= (c == collective::reduce_scatter ? L.in_bytes / static_cast<u64>(n) : L.in_bytes));
                if (c == collective::reduce_scatter || c == collective::reduce) CHECK(len * elem <= L.piece_bytes);
                continue;
              }
              // Shards of this round: disjoint, covering [0, len), within the result/scratch pieces,
              // and every non-empty one starts 16-byte aligned (given an aligned buffer).
              const u64 s = shard_elems(len, n, elem);
              u64 next = 0;
              for (int q = 0; q < n; ++q) {
                const u64 lo = std::min<u64>(len, static_cast<u64>(q) * s);
                const u64 hi = std::min<u64>(len, lo + s);
                CHECK(lo == next);
                next = hi;
                CHECK((hi - lo) * elem <= L.res_bytes);
                CHECK((hi - lo) * elem <= L.piece_bytes);
                if (hi > lo && 16 % elem == 0) CHECK(((base + lo) * elem) % 16 == 0);
              }
              CHECK(next == len);
            }
          }
  MESSAGE(layouts << " layouts checked");
}

TEST_CASE("process layout: a half too small for one element per rank gives no layout") {
  // reduce_scatter over 64 ranks of 16-byte elements needs (2 * 64 - 1) pieces, each padded to 256 B.
  CHECK(fit_layout(collective::reduce_scatter, 64, 16, 4096, 1000).per == 0);
  CHECK(fit_layout(collective::all_gather, 2, 8, 4096, 1000).per == 512);
}

TEST_CASE("process layout: the reduce grid comes from the piece and the device unless asked for") {
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
