// braid/host/segment.hpp — the memory every rank of a host communicator shares.
//
// One segment holds everything: a header, one control block per rank, one per ordered pair of ranks
// (send/recv), and each rank's staging area (two halves of `half_bytes`, used by alternate rounds)
// and send buffer. Threads share it as ordinary memory; processes map the same memfd. Everything in
// it is plain data and std::atomic of lock-free, address-free types, so it works at any address.
//
// Memory ordering: a rank writes data, then stores its progress word with release; a reader loads the
// progress word with acquire before it reads the data. Nothing else orders data.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../core/config.hpp"

namespace braid::host {

inline constexpr std::uint64_t segment_magic = 0x62726169642d7368ULL; // "braid-sh"
inline constexpr std::uint32_t segment_version = 4; // 2: rank_control::call; 3: in_desc and call on the progress line; 4: sleepers

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "braid needs lock-free 64-bit atomics");

enum class rank_state : std::uint32_t { absent = 0, active = 1, left = 2, failed = 3 };

struct alignas(control_stride) segment_header {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t nranks;
  std::uint64_t half_bytes;  // bytes in each of a rank's two staging halves
  std::uint64_t p2p_bytes;   // bytes in a rank's send buffer
  std::uint64_t total_bytes;
  // First failure anywhere: 0 = none; otherwise (1 << 63) | (errc << 32) | (rank + 1). The message is
  // written before the word is published with release.
  std::atomic<std::uint64_t> abort_word;
  std::atomic<std::uint32_t> abort_claim;
  // Set by a rank whose process could not register for membarrier(2) (sleep.hpp): a waiter's barrier
  // would not reach it, so no waiter counts on one (sleeps are then 50 us at most).
  std::atomic<std::uint32_t> no_membarrier;
  char abort_message[512];
};

struct alignas(control_stride) rank_control {
  // The line peers spin on: the progress word and what a reader needs right after acquiring it.
  // (round << 24) | steps posted in that round: 1 after the round's input is published, j + 2 after
  // step j; (round + 1) << 24 once the rank has finished the round (and read everything it needed).
  // The last step's post is folded into that one (host/executor.hpp).
  alignas(control_stride) std::atomic<std::uint64_t> progress;
  // Where this rank's input for rounds of parity h is: 0 = staged in its window; otherwise a pointer
  // (threads) or a registered-buffer descriptor (processes) to the start of the user's input.
  std::uint64_t in_desc[2];
  // The call word of round R is call[R % 4]: a hash of the call's collective, element type, operator,
  // count, root, algorithm, collective-call number and first round, chained onto the previous call's
  // word (rank_context::begin_rounds). Stored (relaxed) before the release store of
  // progress_word(R, 1) that starts round R; a reader that acquired a word of round R from this rank
  // compares it before it reads any of this rank's data.
  // Four slots: a rank rewrites slot R % 4 only in round R + 4, which needs every peer to have finished
  // round R + 2, so the word of round R is stable while any peer is in round R, R + 1 or R + 2.
  // in_desc and the call word share the progress word's 64 bytes: a round start stores in_desc, the
  // word and the post back to back (after the staging copy), so the line moves to the writer once, and
  // a reader that acquired the post has both in its cache with it. (On a line of their own they
  // measured the same at the latency floor: the call word's cost is a store-forwarding stall,
  // context.hpp's call_fp, not the line.)
  std::atomic<std::uint64_t> call[4];
  alignas(control_stride) std::atomic<std::uint32_t> state;
  std::int32_t pid;
  // Ranks asleep on a word this rank posts (sleep.hpp): its progress word, or a send/recv word it
  // writes (as sender: msg_posted, bytes_posted; as receiver: msg_done, bytes_consumed, msg_error).
  // Every post reads it, so it lives on this line, which peers read only in slow paths and debug mode,
  // and not on the progress line: a load there after the post waits for the line when a spinning peer
  // has just taken it (+22% per call at the 4 B floor, measured).
  std::atomic<std::uint32_t> sleepers;
  // The CPU this rank ran on when it last began a slow wait (-1: none yet): a peer waiting for it on
  // the same CPU yields instead of spinning (context.hpp).
  std::atomic<std::int32_t> cpu;
  // Debug-mode fingerprint of the current call (collective, type, op, count, root, sequence):
  // fingerprint[] is written, then fingerprint_seq stored with release; once this rank compared every
  // peer's fingerprint it stores fingerprint_checked. A rank rewrites its fingerprint only after every
  // peer checked the previous one, so a reader that acquired fingerprint_seq reads a stable value.
  std::atomic<std::uint64_t> fingerprint_seq;
  std::uint64_t fingerprint[4];
  std::atomic<std::uint64_t> fingerprint_checked;
};

static_assert(sizeof(rank_control) == 2 * control_stride, "a rank control block is two control lines (guarantees.md, memory use)");
static_assert(sizeof(std::atomic<std::uint64_t>) * 5 + sizeof(std::uint64_t) * 2 <= 64, "progress, in_desc and the call words share one 64-byte line");

// Send/recv between an ordered pair (sender s, receiver d): the sender publishes a message header and
// then pieces of it in its send buffer; the receiver acknowledges bytes as it copies them out.
struct alignas(control_stride) pair_control {
  alignas(control_stride) std::atomic<std::uint64_t> msg_posted;   // messages announced by the sender
  std::uint64_t msg_bytes;                                         // size of the announced message
  std::atomic<std::uint64_t> bytes_posted;                         // cumulative bytes published
  alignas(control_stride) std::atomic<std::uint64_t> msg_done;     // messages fully received
  std::atomic<std::uint64_t> bytes_consumed;                       // cumulative bytes copied out
  std::atomic<std::uint32_t> msg_error;                            // receiver refused a message (size mismatch)
};

inline constexpr std::uint64_t round_shift = 24;
constexpr std::uint64_t progress_word(std::uint64_t round, std::uint64_t posted) {
  return (round << round_shift) | posted;
}

constexpr std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

// Offsets of everything in a segment for nranks ranks.
struct segment_layout {
  std::uint32_t nranks = 0;
  std::uint64_t half_bytes = 0, p2p_bytes = 0;
  std::uint64_t ranks_off = 0, pairs_off = 0, staging_off = 0, staging_stride = 0, total = 0;

  // `half`: each staging half, braid::detail::staging_half_bytes of options::staging_bytes (a
  // joining rank takes the creator's, which the rendezvous hands on); whole pages either way.
  static segment_layout make(std::uint32_t n, std::uint64_t half, std::uint64_t p2p) {
    segment_layout l;
    l.nranks = n;
    l.half_bytes = align_up(half, 4096);
    l.p2p_bytes = align_up(p2p, 4096);
    l.ranks_off = align_up(sizeof(segment_header), 4096);
    l.pairs_off = align_up(l.ranks_off + std::uint64_t{n} * sizeof(rank_control), 4096);
    l.staging_off = align_up(l.pairs_off + std::uint64_t{n} * n * sizeof(pair_control), 4096);
    l.staging_stride = 2 * l.half_bytes + l.p2p_bytes;
    l.total = l.staging_off + std::uint64_t{n} * l.staging_stride;
    return l;
  }
};

// Typed views into a mapped segment.
struct segment_view {
  std::byte* base = nullptr;
  segment_layout layout;

  segment_header& header() const { return *reinterpret_cast<segment_header*>(base); }
  rank_control& rank(int r) const {
    return reinterpret_cast<rank_control*>(base + layout.ranks_off)[r];
  }
  pair_control& pair(int sender, int receiver) const {
    return reinterpret_cast<pair_control*>(base + layout.pairs_off)[sender * static_cast<int>(layout.nranks) + receiver];
  }
  std::byte* half(int r, std::uint64_t parity) const {
    return base + layout.staging_off + static_cast<std::uint64_t>(r) * layout.staging_stride + parity * layout.half_bytes;
  }
  std::byte* p2p(int r) const {
    return base + layout.staging_off + static_cast<std::uint64_t>(r) * layout.staging_stride + 2 * layout.half_bytes;
  }

  // Constructs the header and control blocks in fresh, zeroed memory.
  void initialize() const {
    auto* h = new (base) segment_header{};
    h->magic = segment_magic;
    h->version = segment_version;
    h->nranks = layout.nranks;
    h->half_bytes = layout.half_bytes;
    h->p2p_bytes = layout.p2p_bytes;
    h->total_bytes = layout.total;
    for (std::uint32_t r = 0; r < layout.nranks; ++r) new (&rank(static_cast<int>(r))) rank_control{};
    for (std::uint32_t s = 0; s < layout.nranks; ++s)
      for (std::uint32_t d = 0; d < layout.nranks; ++d) new (&pair(static_cast<int>(s), static_cast<int>(d))) pair_control{};
  }
};

} // namespace braid::host
