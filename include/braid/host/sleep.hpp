// braid/host/sleep.hpp — how a waiting rank sleeps in the kernel and how a posting rank wakes
// it (so that waits neither burn a busy machine nor lose latency).
//
// A word a rank waits on (a progress word, a send/recv counter) has a sleepers count on its own
// 64-byte line. A waiter that has spun long enough adds itself to the count, makes the count visible
// to the poster (below), reads the word once more and, if it is still short, sleeps in FUTEX_WAIT on
// the word's low 32 bits (private futex for thread ranks, shared for process ranks: the segment is a
// shared mapping). The poster, after its release store of the word, reads the count — a load from the
// line it has just written, the only cost of a post when nobody sleeps — and calls FUTEX_WAKE only if
// it is non-zero.
//
// The race between "the waiter adds itself, then reads the word" and "the poster stores the word, then
// reads the count" (each side's load may pass its own store) is closed without a fence on the posting
// side: the waiter issues membarrier(2) between its increment and its read, which runs a full barrier
// on every CPU running a thread of the group, so either the poster's store is visible to the waiter's
// read or the waiter's increment is visible to the poster's load (the asymmetric Dekker pattern). The
// poster needs only a compiler barrier. Where membarrier is unavailable (old kernel, seccomp), the
// waiter sleeps with a short timeout instead (kFallbackSleep): a wake lost to the race costs at most
// that, as the naps this replaces did.
//
// The low 32 bits of every word waited on change on every post (progress words: the step in the low
// 24 bits and the round's low 8 above it; counters: they only grow, by less than 2^32 at a time), so a
// FUTEX_WAIT on a stale low half returns at once.
#pragma once

#include "../core/config.hpp"

#include <atomic>
#include <bit>
#include <chrono>
#include <climits>
#include <cstdint>

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace braid::host {

// The 32-bit half of a 64-bit word that holds its low bits (what FUTEX_WAIT compares).
inline const std::uint32_t* futex_half(const std::atomic<std::uint64_t>& w) {
  const auto* p = reinterpret_cast<const std::uint32_t*>(&w);
  return std::endian::native == std::endian::little ? p : p + 1;
}

inline void futex_wake_all(const std::atomic<std::uint64_t>& w, bool shared) {
  ::syscall(SYS_futex, futex_half(w), shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Sleeps while the low half of w equals `seen` (the kernel compares atomically with the sleep), for at
// most `max`; returns on a wake, a change, a signal or the timeout alike.
inline void futex_sleep(const std::atomic<std::uint64_t>& w, std::uint64_t seen, bool shared, std::chrono::nanoseconds max) {
  const auto ns = max.count() > 0 ? max.count() : 1;
  timespec ts{};
  ts.tv_sec = ns / 1'000'000'000;
  ts.tv_nsec = ns % 1'000'000'000;
  ::syscall(SYS_futex, futex_half(w), shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, static_cast<std::uint32_t>(seen), &ts,
            nullptr, 0);
}

// The posting side: after the release store of a word that a waiter may sleep on.
inline void wake_sleepers(const std::atomic<std::uint32_t>& sleepers, const std::atomic<std::uint64_t>& w, bool shared) {
  std::atomic_signal_fence(std::memory_order_seq_cst); // the waiter's membarrier orders the rest
  if (__builtin_expect(sleepers.load(std::memory_order_relaxed) != 0, 0)) futex_wake_all(w, shared);
}

// membarrier(2) commands (linux/membarrier.h values, spelled out so that older headers build).
namespace membarrier_cmd {
inline constexpr int query = 0;
inline constexpr int global_expedited = 1 << 1;
inline constexpr int register_global_expedited = 1 << 2;
inline constexpr int private_expedited = 1 << 3;
inline constexpr int register_private_expedited = 1 << 4;
} // namespace membarrier_cmd

// Registers this process for both expedited barriers, once. True when both are usable: every braid
// process registers before it joins a group, so a waiter's barrier reaches every poster.
inline bool membarrier_ready() {
  static const bool ok = [] {
#ifdef SYS_membarrier
    const long q = ::syscall(SYS_membarrier, membarrier_cmd::query, 0, 0);
    const long need = membarrier_cmd::global_expedited | membarrier_cmd::private_expedited;
    if (q < 0 || (q & need) != need) return false;
    return ::syscall(SYS_membarrier, membarrier_cmd::register_global_expedited, 0, 0) == 0 &&
           ::syscall(SYS_membarrier, membarrier_cmd::register_private_expedited, 0, 0) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

// A full barrier on every CPU running a thread of this process (thread ranks) or of any registered
// process (process ranks). False if it failed (the caller then sleeps with the fallback's timeout).
inline bool membarrier_all(bool processes) {
#ifdef SYS_membarrier
  return ::syscall(SYS_membarrier, processes ? membarrier_cmd::global_expedited : membarrier_cmd::private_expedited, 0, 0) == 0;
#else
  (void)processes;
  return false;
#endif
}

// How a rank waits (rank_context::wait_ge), chosen per communicator when it is created.
struct wait_policy {
  // More ranks on this host than CPUs this process may run on (unless it may run on only one: then a
  // launcher bound it, and ranks that share a CPU find out through rank_control::cpu): a spinning rank
  // takes the CPU a peer it waits for needs, so it yields between polls from the start.
  bool oversubscribed = false;
  // Spinning (or yielding, when oversubscribed) this long before sleeping on the word.
  std::chrono::nanoseconds spin{std::chrono::microseconds(200)};
  // A sleeping rank wakes at least this often to look at the abort word, its peer's state and the
  // deadline (a dead process is noticed within milliseconds, not at the deadline).
  std::chrono::nanoseconds recheck{std::chrono::milliseconds(2)};
  bool membarrier = false;
};

inline constexpr std::chrono::nanoseconds kFallbackSleep{std::chrono::microseconds(50)};

inline int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

} // namespace braid::host
