// braid/cuda/device/executor.cuh — replays a schedule on the GPU: the twin of host/executor.hpp,
// with the same rounds, halves, progress words and write-once windows.
//
// One launch per call per GPU serves every rank of the group on that GPU: the grid is partitioned,
// `blocks_per_rank` consecutive blocks per rank, and it is a cooperative launch, so CUDA guarantees
// that all of its blocks are resident together. Within a rank's share, thread 0 of every block waits
// (bounded) for the sources' progress, the share reduces the step's chunks with a stride loop, and the
// last block of the share to arrive on the step's counter posts the rank's progress word. A kernel
// waits only on blocks of its own launch and on kernels of other GPUs (the assumption NCCL makes too).
// Round numbers come from a device-side counter per rank, read at kernel start and advanced at kernel
// end, so a collective captured in a CUDA graph uses fresh rounds on every replay. A kernel that times
// out or sees the group's abort flag returns early and leaves the error for the host
// (communicator::check()).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../core/error.hpp"
#include "../../schedule/schedule.hpp"
#include "signal.cuh"
#include "kernel.cuh"

namespace braid::cuda::device {

inline constexpr int max_steps = 254; // per round; the host refuses schedules with more
inline constexpr int max_local_ranks = 64; // ranks of one group on one GPU (one launch serves them all)
inline constexpr int max_threads_per_block = 512; // the most create_group accepts: the kernels' launch bound (BRAID_KERNEL_BOUNDED(512))

// What every rank's kernel needs to know about rank r (device pointers, valid on every GPU of the
// group through peer access).
struct device_rank {
  u64* progress;       // (round << 24) | steps posted, as on the host
  u64* in_desc;        // [2]: 0 = staged in the window, else the user's input pointer
  u64* call;           // [4]: the call word of round R in call[R % 4] (rank_call::call_word)
  std::byte* half[2];  // staging halves
  u64* arrivals;       // [2][max_steps + 2] block arrival counters, then one exit counter (own rank only)
  u64* round;          // last round id used by this rank's kernels
};

// One rank's device memory for the collective kernel, the same in both CUDA communicators: a control
// page, then two staging halves. The control page holds, at these byte offsets, the progress word,
// the round counter, the input descriptors, the call words, the in-flight word and exit counter of
// the launches on the rank's GPU (read on the GPU's first rank only), and from one page on the block
// arrival counters. Each word that another GPU polls has a 128-byte line to itself.
struct rank_segment {
  static constexpr std::size_t progress_at = 0, round_at = 128, in_desc_at = 256, call_at = 288, busy_at = 512,
                               exits_at = 640, arrivals_at = 4096;
  std::size_t control_bytes = 0; // the control page, in whole 4 KiB pages
  std::size_t half_bytes = 0;    // each staging half
  std::size_t bytes() const { return control_bytes + 2 * half_bytes; }

  // `staging_bytes` is both halves together, as options::staging_bytes; each half is
  // braid::detail::staging_half_bytes of it (at least `min_half`, whole 4 KiB pages).
  static rank_segment make(std::size_t staging_bytes, std::size_t min_half = 0) {
    const auto pages = [](std::size_t b) { return (b + 4095) / 4096 * 4096; };
    rank_segment l;
    l.control_bytes = pages(arrivals_at + (2 * (max_steps + 2) + 1) * sizeof(u64));
    l.half_bytes = braid::detail::staging_half_bytes(staging_bytes, min_half);
    return l;
  }
  // The kernel's view of a segment at `base` (this GPU's address of it).
  device_rank view(std::byte* base) const {
    device_rank v{};
    v.progress = word(base, progress_at);
    v.round = word(base, round_at);
    v.in_desc = word(base, in_desc_at);
    v.call = word(base, call_at);
    v.arrivals = word(base, arrivals_at);
    v.half[0] = base + control_bytes;
    v.half[1] = base + control_bytes + half_bytes;
    return v;
  }
  static u64* word(void* base, std::size_t at) { return reinterpret_cast<u64*>(static_cast<std::byte*>(base) + at); }
};

// An in-place call whose input is staged: this rank's blocks copy the input into the staging half
// before step 0's post (peers read that copy), and a step that writes `out` overwrites the same bytes.
// A thread's copy and its own later write are ordered by program order, block 0's by the barrier of
// the post; a copy by one block and a write by another only by a wait for something that needed the
// copy. Most schedules' in-place writes have one (they need a peer's data, which needed this rank's
// staged copy); one_shot's does not (every rank reads every staged input in the step that writes its
// output). reduce_copy gives the copy's bytes and the write's to the same threads when every pointer
// of both is 16-byte aligned (moves_16_byte_units, reduce_copy.cuh), and the tail to block 0 when
// blocks have 16 threads or more; otherwise (an input 8 bytes past a 16-byte boundary: floats staged
// in 8-byte words, reduced one by one) the kernel waits for the rank's own post of step 0 before a
// step writes `out`.
enum class out_order : std::uint8_t {
  none,          // not in place, or the input is not staged: nothing to order
  peers_aligned, // this rank's side keeps the copy's threads: wait only in a step that reads a peer's
                 // input in place (zero-copy) that is not 16-byte aligned (the reduction then moves
                 // single elements)
  after_staging, // wait for the rank's own post of step 0 before every step that writes `out`
};

// rank_call::order_out of an in-place call with a staged input, from what this rank knows: its
// pointers, T, the block size and where chunks start (multiples of 64 bytes within a round and a
// block; reduce_scatter's and all_gather's blocks at multiples of count elements, rounds at multiples
// of per_round).
template <class T>
inline out_order in_place_out_order(collective c, const void* in, const void* out, std::uint64_t count, std::uint64_t per_round,
                                    unsigned threads_per_block) {
  const auto low = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) & 15; };
  const bool starts_aligned = (!schedule::blocked(c) || count * sizeof(T) % 16 == 0) && per_round * sizeof(T) % 16 == 0;
  return moves_16_byte_units<T> && low(in) == 0 && low(out) == 0 && starts_aligned && threads_per_block >= 16
             ? out_order::peers_aligned
             : out_order::after_staging;
}

// One rank's part of a call: what differs between the ranks of one launch.
struct rank_call {
  int rank;
  out_order order_out; // in place with a staged input: see out_order
  bool zero_copy;      // peers read `in` in place: its address is published each round (in_desc)
  const void* in;
  void* out;
};
static_assert(sizeof(rank_call) == 24, "rank_call: 24 bytes, eight of them in the launch's parameter block");

// Whether rank r's part of a call of `count` elements per block under schedule S touches its staging
// halves (read on the host only: a launch that serves the whole group and of which no part does runs
// as one round, one_round_when_unstaged in cuda/enqueue/launcher.cuh):
// the schedule keeps windows in the staging halves, or the rank publishes an input that its peers do
// not read in place (`input_read_in_place`: rank_call::zero_copy is set).
template <class S, class T>
inline bool uses_staging(collective c, int n, int r, int root, std::uint64_t count, bool input_read_in_place) {
  if (S::nphases(c, n) > 0) return true;
  if (input_read_in_place) return false;
  const std::uint32_t P = S::nchunks(c, n, schedule::pipeline_chunks<T>(count));
  const schedule::chunk_map<T> map(c, n, r, root, count, count);
  const schedule::args sa{c, n, r, root, P};
  for (std::uint32_t k = 0; k < P; ++k)
    if (map.stages(k, S::in_published(sa, k))) return true;
  return false;
}

// The ranks of a launch whose parts ride in its parameter block; the parts of further ranks on one GPU
// are read from host-mapped memory (launch_args::more).
inline constexpr int inline_calls = 8;

// What a launch on one GPU needs: the call, and the part of every rank of the group on that GPU.
// Passed by value as the kernel's parameter, so its size is what every launch copies: it does not grow
// with the ranks a GPU serves.
struct launch_args {
  const device_rank* ranks = {}; // [nranks], in this GPU's memory
  int nranks = {}, root = {};
  collective coll = {};
  std::uint64_t count = {};      // elements per block
  std::uint64_t per_round = {};  // elements per block per round
  std::uint64_t rounds = {};
  std::uint64_t half_bytes = {};
  device_abort* abort = {};      // host-mapped, shared by the group
  int abort_slot = {};           // this GPU's slot in it (1 + the GPU's index in the group)
  unsigned blocks_per_rank = {}; // the grid is local * blocks_per_rank blocks
  u64 timeout_ns = {};
  u64 abort_every_ns = {};       // wait_ge reads the host-mapped abort flag at most this often (0: every 64 polls)
  u64* busy = {};                // this GPU's in-flight word: 1 while a launch of the group runs here
  u64* exits = {};               // this GPU's launch exit counter
  // What the call is, chained over the earlier calls (schedule/call.hpp): the same for every rank of
  // the launch, since the ranks of one GPU make every call in one launch (the launcher checks that
  // their calls agree). Published with each round's first post; a reader that acquired a peer's
  // progress in round R compares the peer's word of round R with this one before it reads anything
  // of that peer, and stops the group with a mismatch record if they differ.
  std::uint64_t call_word = {};
  std::uint64_t seq = {};        // the call's number on its ranks (error_context::seq), named by a failure record
  int local = {};                // ranks of the group on this GPU
  const rank_call* more = {};    // local > inline_calls: the parts of ranks inline_calls.. (host-mapped)
  u64* more_in_use = {};         // the launch's last block clears it once `more` is read (host-mapped; null: none)
  rank_call calls[inline_calls] = {};
};
static_assert(sizeof(launch_args) <= 512, "launch_args is the kernel's parameter block: at most 512 bytes");

// The part of the launch's local rank `local`: a copy, so that the parameter block and host-mapped
// memory are each read with their own loads (no pointer that could be either).
BRAID_DEVICE rank_call part_of(const launch_args& a, int local) {
  if (local < inline_calls) return a.calls[local];
  return a.more[local - inline_calls];
}

// Block arrival on `counter`, shared by `blocks` blocks; true for the last of them. The block barrier
// orders the block's data writes before thread 0's acq_rel add; the adds form a release sequence, so
// the last block's add is ordered after every block's writes, and the release post that follows at
// system scope is cumulative over all of them (no fence per block: PTX causality order is
// transitive across scopes). The counter is never reset (old % blocks).
BRAID_DEVICE bool arrive(u64* counter, unsigned blocks) {
  device::sync_block();
  bool last = false;
  if (device::thread_index() == 0) {
    const u64 old = device::atomic_ref<u64, device::scope::device>(*counter).fetch_add(1, device::memory_order::acq_rel);
    last = old % blocks == blocks - 1;
  }
  return last;
}
// The last block of rank r's share posts `word` (progress only ever grows: fetch_max).
BRAID_DEVICE void arrive_and_post(const launch_args& a, int r, std::uint64_t h, int s, u64 word) {
  const device_rank& me = a.ranks[r];
  if (arrive(me.arrivals + h * (max_steps + 2) + s, a.blocks_per_rank)) post_max_release(me.progress, word);
}

template <class S, class T, class Op>
BRAID_KERNEL_BOUNDED(512) void collective_kernel(launch_args a, Op op) {
  using schedule::chunk_span;
  BRAID_SHARED u64 round0;
  BRAID_SHARED int stop;
  // This block's rank's part, read once by thread 0 (from the parameter block, or host-mapped memory
  // beyond inline_calls) and by the block from shared memory where it needs a field.
  BRAID_SHARED rank_call part;
  const unsigned thread = device::thread_index();
  // This block's rank, and its place in that rank's share of the grid.
  const int local = static_cast<int>(device::block_index() / a.blocks_per_rank);
  const unsigned block = device::block_index() % a.blocks_per_rank;
  const call_id my_call{static_cast<int>(a.coll), a.seq}; // named only by a failure record
  const int n = a.nranks;
  const device_rank* ranks = a.ranks;
  if (thread == 0) {
    part = part_of(a, local);
    const int r = part.rank;
    if (device::block_index() == 0 &&
        device::atomic_ref<u64, device::scope::device>(*a.busy).exchange(1, device::memory_order::acq_rel) != 0) {
      // Another launch of this group is running on this GPU: two calls overlap (a graph replayed on
      // a stream the group's calls are not ordered with). Their rounds would collide: stop the group.
      record_failure(abort_ref{a.abort, a.abort_slot},
                     device_error{static_cast<unsigned>(errc::invalid_usage), r, -1, fail_step::overlapping_launch, 0, my_call});
    }
    // Written by this rank's previous kernel, which ended before this one began (a relaxed atomic load,
    // as the volatile load it replaces: nothing may be cached from before the launch).
    round0 = device::atomic_ref<u64, device::scope::device>(*ranks[r].round).load(device::memory_order::relaxed);
    stop = 0;
  }
  device::sync_block();
  const int r = part.rank;
  const T* in = static_cast<const T*>(part.in);
  T* out = static_cast<T*>(part.out);
  const std::uint64_t unit = schedule::chunk_unit<T>();
  const int nph = S::nphases(a.coll, n);
  const schedule::chunk_map<T> map(a.coll, n, r, a.root, a.count, a.per_round);
  const std::uint64_t tid = static_cast<std::uint64_t>(block) * device::block_size() + thread;
  const std::uint64_t nthreads = static_cast<std::uint64_t>(a.blocks_per_rank) * device::block_size();
  auto slot = [&](int q, std::uint64_t h, int region, std::uint32_t c, const chunk_span& s) -> T* {
    return map.slot(ranks[q].half[h], region, c, s);
  };
  // Waits are spread over the block's threads (one peer each, in parallel); the block follows after a
  // barrier. A thread that gives up sets `stop` for the whole block.
  auto wait = [&](int q, u64 target, int step) {
    device::atomic_ref<int, device::scope::device> halt(stop);
    if (!halt.load(device::memory_order::relaxed) && !wait_ge(ranks[q].progress, target, abort_ref{a.abort, a.abort_slot}, a.timeout_ns, r, q, step,
                                                           a.abort_every_ns, my_call))
      halt.store(1, device::memory_order::relaxed);
  };

  // After a wait for peer q's progress in round R passed: q must be making this call. A rank rewrites
  // slot R % 4 only in round R + 4, which needs every peer to have finished round R + 2.
  auto same_call = [&](int q, std::uint64_t round, int step) {
    device::atomic_ref<int, device::scope::device> halt(stop);
    if (halt.load(device::memory_order::relaxed)) return;
    if (sys_u64(ranks[q].call[round & 3]).load(device::memory_order::relaxed) != a.call_word) {
      record_failure(abort_ref{a.abort, a.abort_slot},
                     device_error{static_cast<unsigned>(errc::mismatch), r, q, step, 0, my_call});
      halt.store(1, device::memory_order::relaxed);
    }
  };

  std::uint64_t R = round0;
  for (std::uint64_t k = 0; k < a.rounds; ++k) {
    R = round0 + k + 1;
    const std::uint64_t h = R & 1;
    const std::uint64_t base = k * a.per_round;
    const std::uint64_t len = schedule::round_len(a.count, a.per_round, k);
    const std::uint32_t P = S::nchunks(a.coll, n, schedule::pipeline_chunks<T>(len));
    const schedule::args sa{a.coll, n, r, a.root, P};

    // No block starts round R before all blocks of this rank finished round R - 1 (so the arrival
    // counters of a parity are never shared by two rounds), nor before every peer finished R - 2.
    for (int q = static_cast<int>(thread); q < n; q += static_cast<int>(device::block_size())) {
      if (q == r) {
        if (k > 0) wait(r, R << 24, -1);
      } else if (R >= 3) {
        wait(q, (R - 1) << 24, -1);
      }
    }
    device::sync_block();
    if (stop) return;
    // The round's call word, then its input: both before the post of step 0 (arrive_and_post's
    // barrier and release order them), as in_desc below.
    if (block == 0 && thread == 0) ranks[r].call[R & 3] = a.call_word;
    if (part.zero_copy) {
      if (block == 0 && thread == 0) ranks[r].in_desc[h] = reinterpret_cast<u64>(in);
    } else {
      if (block == 0 && thread == 0) ranks[r].in_desc[h] = 0;
      for (std::uint32_t c = 0; c < P; ++c) {
        if (!map.stages(c, S::in_published(sa, c))) continue;
        const chunk_span s = schedule::chunk_at(a.coll, len, P, c, unit);
        const T* src[1] = {in + map.in_off(c, s, base)};
        // A copy: no operator is applied, so any element type (a struct without + included) compiles.
        reduce_copy<T>(src, 1, slot(r, h, 0, c, s), static_cast<T*>(nullptr), s.count, braid::detail::copy_only{}, false, n,
                       tid, nthreads);
      }
    }
    arrive_and_post(a, r, h, 0, (R << 24) | 1);

    const int nsteps = S::nsteps(sa);
    for (int j = 0; j < nsteps; ++j) {
      const schedule::step st = S::at(sa, j);
      const int ns = st.count_sources(n);
      // In place over a staged input (rank_call::order_out): one more waiter after the sources, for
      // the rank's own post of step 0, when this rank's pointers or a peer's in-place input may give
      // the write other threads than the staging copy.
      const bool order = part.order_out != out_order::none && st.out;
      for (int i = static_cast<int>(thread); i < ns + (order ? 1 : 0); i += static_cast<int>(device::block_size())) {
        // source i, or (i == ns) the rank's own post of step 0
        schedule::source s{r, schedule::region::in, 0, -1};
        bool need = part.order_out == out_order::after_staging;
        if (i < ns) {
          s = st.source_at(i);
          need = s.rank != r || s.reg == schedule::region::win;
        }
        int q = s.rank;
        u64 target = (R << 24) | static_cast<u64>(s.ready + 2);
        BRAID_NO_UNROLL
        for (int pass = 0; need; ++pass) { // a second pass: the own post, after a peer's misaligned input
          wait(q, target, j);
          need = false;
          if (pass == 0 && q != r) {
            same_call(q, R, j);
            if (order && s.reg == schedule::region::in &&
                (sys_u64(ranks[q].in_desc[h]).load(device::memory_order::relaxed) & 15) != 0) {
              need = true;
              q = r;
              target = (R << 24) | 1;
            }
          }
        }
      }
      device::sync_block();
      if (stop) return;
      for (std::uint32_t c = st.lo; c < st.hi; ++c) {
        const chunk_span sp = schedule::chunk_at(a.coll, len, P, c, unit);
        if (sp.count == 0) continue;
        T* w = st.win >= 0 && st.win < nph ? slot(r, h, 1 + st.win, c, sp) : nullptr;
        T* o = st.out && map.out_covers(c) ? out + map.out_off(c, sp, base) : nullptr;
        if (!w && !o) continue;
        // The chunk's sources, found once per block (not per thread) and read by reduce_copy from
        // block-shared memory: no per-thread array (local memory), one in_desc load per peer and block.
        BRAID_SHARED const T* srcs[64];
        for (int i = static_cast<int>(thread); i < ns && i < 64; i += static_cast<int>(device::block_size())) {
          srcs[i] = map.source_at(
              st.source_at(i), in, c, sp, base,
              [&](int q, int region, std::uint32_t ch, const chunk_span& x) { return slot(q, h, region, ch, x); },
              [&](int q) {
                // Written by q before it posted step 0 of round R, which this block acquired (one thread
                // per source) before the block barrier above; a relaxed system-scope load through the
                // peer mapping.
                return reinterpret_cast<const T*>(sys_u64(ranks[q].in_desc[h]).load(device::memory_order::relaxed));
              });
        }
        device::sync_block();
        reduce_copy<T, Op, collective_unroll<T, Op>>(srcs, ns, o ? o : w, o ? w : nullptr, sp.count, op, st.final, n, tid,
                                                    nthreads);
        device::sync_block(); // every thread is done with srcs before the next chunk rewrites it
      }
      arrive_and_post(a, r, h, j + 1, (R << 24) | static_cast<u64>(j + 2));
    }
    arrive_and_post(a, r, h, max_steps + 1, (R + 1) << 24);
  }
  if (part.zero_copy && a.rounds) {
    for (int q = static_cast<int>(thread); q < n; q += static_cast<int>(device::block_size()))
      if (q != r) wait(q, (R + 1) << 24, -2);
    device::sync_block();
  }
  // The last block of the share advances the rank's round counter for the group's next launch on this
  // GPU (ordered after this one: the communicator chains them; every block read it before arriving).
  if (arrive(ranks[r].arrivals + 2 * (max_steps + 2), a.blocks_per_rank) && thread == 0) *ranks[r].round = round0 + a.rounds;
  // The last block of the launch clears the in-flight word, and gives the host its table of further
  // ranks' parts back (every block read its part before its first post).
  if (arrive(a.exits, device::grid_size()) && thread == 0) {
    device::atomic_ref<u64, device::scope::device>(*a.busy).store(0, device::memory_order::release);
    if (a.more_in_use) sys_u64(*a.more_in_use).store(0, device::memory_order::release);
  }
}

} // namespace braid::cuda::device
