// braid/schedule/common.hpp — the vocabulary every algorithm is written in.
//
// A schedule says, for one rank, what each of its steps does within one *round* of a collective: which
// chunks it handles, which ranks' data it reads (in which order they are reduced), and where the
// result goes. Schedules are pure __host__ __device__ functions of (collective, nranks, rank, root,
// nchunks, step): no allocation, no CUDA calls. The host executor and the CUDA kernels replay them,
// and tests/schedule/ simulates them for every nranks 1..64.
//
// Memory model the schedules are written against (pull model):
//  * Each rank has an input IN (its user buffer, or a staged copy of the chunks peers read) and a
//    window WIN of `nphases` regions; region `phase` holds one slot per chunk. A step that publishes
//    writes its result into WIN[phase][chunk]; every (phase, chunk) slot is written at most once per
//    round, so within a round nothing a peer may still read is ever overwritten.
//  * After each step a rank posts its progress; a step that reads peer q's data first waits until q
//    has completed step `ready` (ready == -1: q has entered the round, so its IN is published).
//  * OUT is the rank's output; writes to it are clipped to the part of the collective's output this
//    rank owns (its block for reduce_scatter, nothing for non-roots of reduce).
//  * Chunks: all_reduce/broadcast/reduce split the round's elements into `nchunks` balanced chunks;
//    reduce_scatter/all_gather use nchunks == nranks and chunk i is rank i's block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "../core/config.hpp"

namespace braid {

enum class collective : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, reduce, barrier, send_recv };

constexpr std::string_view name(collective c) noexcept {
  switch (c) {
  case collective::all_reduce: return "all_reduce";
  case collective::reduce_scatter: return "reduce_scatter";
  case collective::all_gather: return "all_gather";
  case collective::broadcast: return "broadcast";
  case collective::reduce: return "reduce";
  case collective::barrier: return "barrier";
  case collective::send_recv: return "send_recv";
  }
  return "?";
}

// Algorithms. `automatic` asks the tuning table.
enum class algo : std::uint8_t { automatic, ring, tree, one_shot, two_shot, halving_doubling, direct };

inline constexpr algo all_algos[] = {algo::ring, algo::tree, algo::one_shot, algo::two_shot,
                                     algo::halving_doubling, algo::direct};

constexpr std::string_view name(algo a) noexcept {
  switch (a) {
  case algo::automatic: return "auto";
  case algo::ring: return "ring";
  case algo::tree: return "tree";
  case algo::one_shot: return "one_shot";
  case algo::two_shot: return "two_shot";
  case algo::halving_doubling: return "halving_doubling";
  case algo::direct: return "direct";
  }
  return "?";
}

constexpr bool parse_algo(std::string_view s, algo& out) noexcept {
  struct alias { std::string_view n; algo a; };
  constexpr alias table[] = {{"auto", algo::automatic}, {"ring", algo::ring}, {"tree", algo::tree},
                             {"one_shot", algo::one_shot}, {"oneshot", algo::one_shot},
                             {"two_shot", algo::two_shot}, {"twoshot", algo::two_shot},
                             {"halving_doubling", algo::halving_doubling}, {"hd", algo::halving_doubling},
                             {"rhd", algo::halving_doubling}, {"direct", algo::direct}};
  for (const auto& a : table)
    if (a.n == s) { out = a.a; return true; }
  return false;
}

// Which collectives each algorithm implements.
constexpr bool supports(algo a, collective c) noexcept {
  switch (c) {
  case collective::all_reduce: return a != algo::automatic;
  case collective::reduce_scatter:
  case collective::all_gather: return a == algo::ring || a == algo::halving_doubling || a == algo::direct;
  case collective::broadcast:
  case collective::reduce: return a == algo::ring || a == algo::tree || a == algo::direct;
  case collective::barrier:
  case collective::send_recv: return false;
  }
  return false;
}

namespace schedule {

enum class region : std::uint8_t { in, win };

struct source {
  std::int32_t rank = 0;
  region reg = region::in;
  std::uint8_t phase = 0; // window phase when reg == win
  std::int32_t ready = -1; // rank's step after which the data is there (-1: round entered)
};

struct step {
  std::uint32_t lo = 0, hi = 0;  // chunks [lo, hi)
  std::uint8_t nsrc = 0;         // sources, reduced in this order (1 = copy, 0 = nothing to read)
  bool all = false;              // sources are every rank 0..nranks-1 in order, like all_src.rank
  source src[3] = {};
  source all_src = {};           // region/phase/ready used for every rank when `all`
  std::int8_t win = -1;          // publish the result into own WIN[win]; -1: don't
  bool out = false;              // write the result into own OUT
  bool final = false;            // the result is fully reduced: apply the operator's finalize
  BRAID_HD constexpr int count_sources(int nranks) const { return all ? nranks : nsrc; }
  BRAID_HD constexpr source source_at(int i) const {
    // a select, not src[i]: a run-time index into the array would put the step in local memory on a GPU
    if (!all) return i == 0 ? src[0] : i == 1 ? src[1] : src[2];
    source s = all_src;
    s.rank = i;
    return s;
  }
};

struct args {
  collective coll = collective::all_reduce;
  int nranks = 1;
  int rank = 0;
  int root = 0;
  std::uint32_t nchunks = 1;
};

// ---- small helpers -------------------------------------------------------------------------------

BRAID_HD constexpr int mod(int a, int n) { return ((a % n) + n) % n; }

BRAID_HD constexpr int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

BRAID_HD constexpr int log2_exact(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

BRAID_HD constexpr source src_in(int rank) { return source{rank, region::in, 0, -1}; }
BRAID_HD constexpr source src_win(int rank, int phase, int ready) {
  return source{rank, region::win, static_cast<std::uint8_t>(phase), ready};
}

BRAID_HD constexpr step copy_step(std::uint32_t lo, std::uint32_t hi, source s, int win, bool out) {
  step st;
  st.lo = lo;
  st.hi = hi;
  st.nsrc = 1;
  st.src[0] = s;
  st.win = static_cast<std::int8_t>(win);
  st.out = out;
  return st;
}

BRAID_HD constexpr step reduce_step(std::uint32_t lo, std::uint32_t hi, source a, source b, int win,
                                    bool out, bool final) {
  step st;
  st.lo = lo;
  st.hi = hi;
  st.nsrc = 2;
  st.src[0] = a;
  st.src[1] = b;
  st.win = static_cast<std::int8_t>(win);
  st.out = out;
  st.final = final;
  return st;
}

BRAID_HD constexpr step reduce_all_step(std::uint32_t lo, std::uint32_t hi, source each, int win, bool out) {
  step st;
  st.lo = lo;
  st.hi = hi;
  st.all = true;
  st.all_src = each;
  st.win = static_cast<std::int8_t>(win);
  st.out = out;
  st.final = true;
  return st;
}

BRAID_HD constexpr step nothing() { return step{}; }

// Balanced split of `count` elements into `parts` chunks whose boundaries fall on multiples of
// `unit` elements (so vector loads stay aligned); chunk c is [split_begin(c), split_begin(c+1)).
BRAID_HD constexpr std::uint64_t split_begin(std::uint64_t count, std::uint32_t parts, std::uint32_t c,
                                             std::uint64_t unit) {
  const std::uint64_t units = (count + unit - 1) / unit;
  const std::uint64_t per = units / parts, extra = units % parts;
  const std::uint64_t u = per * c + (c < extra ? c : extra);
  const std::uint64_t e = u * unit;
  return e < count ? e : count;
}

} // namespace schedule
} // namespace braid

namespace braid::schedule {

// ---- from chunks to elements ---------------------------------------------------------------------
// A collective over `count` elements per block (all_reduce/broadcast/reduce: the whole buffer;
// reduce_scatter/all_gather: one rank's block) runs in rounds of at most `per_round` elements per
// block. Round k covers block elements [k*per_round, k*per_round + round_len(k)).
BRAID_HD constexpr std::uint64_t nrounds(std::uint64_t count, std::uint64_t per_round) {
  return count == 0 ? 0 : (count + per_round - 1) / per_round;
}
BRAID_HD constexpr std::uint64_t round_len(std::uint64_t count, std::uint64_t per_round, std::uint64_t k) {
  const std::uint64_t b = k * per_round;
  return count - b < per_round ? count - b : per_round;
}

BRAID_HD constexpr bool blocked(collective c) {
  return c == collective::reduce_scatter || c == collective::all_gather;
}

// Elements of chunk c within a round of `len` elements per block: for blocked collectives the range is
// within block c, otherwise within the (single) buffer. `unit` aligns the boundaries of a split.
struct chunk_span {
  std::uint32_t block;   // which block (always 0 unless blocked)
  std::uint64_t begin;   // offset within the round, in elements, inside that block
  std::uint64_t count;
};
BRAID_HD constexpr chunk_span chunk_at(collective coll, std::uint64_t len, std::uint32_t nchunks, std::uint32_t c,
                                       std::uint64_t unit) {
  if (blocked(coll)) return chunk_span{c, 0, len};
  const std::uint64_t b = split_begin(len, nchunks, c, unit), e = split_begin(len, nchunks, c + 1, unit);
  return chunk_span{0, b, e - b};
}

} // namespace braid::schedule

namespace braid::schedule {

// ---- from chunks to memory -----------------------------------------------------------------------
// What both executors (host/executor.hpp and cuda/device/executor.cuh) do with a schedule's chunk
// numbers, written once so that the CPU and the GPU cannot place data differently.

// Element alignment of chunk boundaries: 64 bytes where the element size allows it.
template <class T> BRAID_HD constexpr std::uint64_t chunk_unit() {
  return (64 % sizeof(T) == 0) ? 64 / sizeof(T) : 1;
}

// Pipeline depth of the chunked schedules: chunks of about 64 KiB, between 1 and 32. A function of
// the round's size only, so every rank picks the same.
template <class T> BRAID_HD constexpr std::uint32_t pipeline_chunks(std::uint64_t len) {
  const std::uint64_t p = (len * sizeof(T) + (64u << 10) - 1) / (64u << 10);
  return static_cast<std::uint32_t>(p < 1 ? 1 : (p > 32 ? 32 : p));
}

// Elements per block per round so that the input region and the `nphases` window regions of one
// staging half of `half_bytes` hold a round: the half is split into equal regions rounded down to 64
// bytes (chunk_map pads each region to 64), a region holds the round's `blocks` blocks, and the round
// is rounded down to the chunk unit; 0 if even one element does not fit. A round fills all of the half
// but the padding (at least 90% for halves of 1 MiB and up: tests/schedule/test_per_round.cpp).
template <class S, class T>
BRAID_HD constexpr std::uint64_t per_round(collective coll, int nranks, std::uint64_t half_bytes) {
  const std::uint64_t regions = static_cast<std::uint64_t>(S::nphases(coll, nranks)) + 1;
  const std::uint64_t blocks = blocked(coll) ? static_cast<std::uint64_t>(nranks) : 1;
  const std::uint64_t region = half_bytes / regions / 64 * 64;
  std::uint64_t e = region / (blocks * sizeof(T));
  const std::uint64_t unit = chunk_unit<T>();
  if (e >= unit) e -= e % unit;
  return e;
}

// Where chunk c of a round lives: in the rank's user input and output (element offsets) and in a
// staging half (region 0 is the published input, 1 + phase the window regions).
template <class T> struct chunk_map {
  collective coll;
  int rank, root;
  std::uint64_t count;        // elements per block of the whole call
  std::uint64_t cap;          // elements per block per round (per_round)
  std::uint64_t region_bytes; // one region of a half, padded to 64 bytes

  BRAID_HD constexpr chunk_map(collective c, int nranks, int r, int rt, std::uint64_t n, std::uint64_t per)
      : coll(c), rank(r), root(rt), count(n), cap(per),
        region_bytes((per * (blocked(c) ? static_cast<std::uint64_t>(nranks) : 1) * sizeof(T) + 63) / 64 * 64) {}

  // Offsets of chunk c in the user input / output, for the round starting at block element `base`.
  BRAID_HD constexpr std::uint64_t in_off(std::uint32_t c, const chunk_span& s, std::uint64_t base) const {
    return (coll == collective::reduce_scatter ? c * count : 0) + base + s.begin;
  }
  BRAID_HD constexpr std::uint64_t out_off(std::uint32_t c, const chunk_span& s, std::uint64_t base) const {
    return (coll == collective::all_gather ? c * count : 0) + base + s.begin;
  }
  // Whether this rank's output holds chunk c (its own block for reduce_scatter, root only for reduce).
  BRAID_HD constexpr bool out_covers(std::uint32_t c) const {
    if (coll == collective::reduce_scatter) return static_cast<int>(c) == rank;
    if (coll == collective::reduce) return rank == root;
    return true;
  }
  // Whether this rank copies chunk c into its half's input region when its input is staged
  // (`published`: the schedule's in_published for c).
  BRAID_HD constexpr bool stages(std::uint32_t c, bool published) const {
    if (!published) return false;
    if (coll == collective::all_gather && static_cast<int>(c) != rank) return false;
    if (coll == collective::broadcast && rank != root) return false;
    return true;
  }
  // Chunk c's slot in region `region` of a staging half starting at `half`.
  BRAID_HD T* slot(std::byte* half, int region, std::uint32_t c, const chunk_span& s) const {
    std::byte* h = half + static_cast<std::uint64_t>(region) * region_bytes;
    return reinterpret_cast<T*>(h) + (blocked(coll) ? c * cap : 0) + s.begin;
  }
  // Where source `s` of chunk c (span `sp`, in a round starting at element `base`) lies for this rank,
  // whose input is `in`: a window of the source's rank, this rank's input, or a peer's input, read in
  // place where the peer published it (`peer_input(rank)` non-null: its input's start) and from its
  // staged copy (region 0) otherwise. `half_slot(rank, region, c, sp)` is a slot of a rank's half of
  // this round. Written once for every executor (the host's, the CUDA kernel).
  BRAID_HD_CALLS_ANY
  template <class HalfSlot, class PeerInput>
  BRAID_HD const T* source_at(const source& s, const T* in, std::uint32_t c, const chunk_span& sp, std::uint64_t base,
                              HalfSlot&& half_slot, PeerInput&& peer_input) const {
    if (s.reg == region::win) return half_slot(s.rank, 1 + s.phase, c, sp);
    if (s.rank == rank) return in + in_off(c, sp, base);
    const T* p = peer_input(s.rank);
    return p ? p + in_off(c, sp, base) : half_slot(s.rank, 0, c, sp);
  }
};

} // namespace braid::schedule
