// braid/host/context.hpp — one rank's view of a host communicator: the shared segment, its
// rank, the call in progress, and the bounded wait every synchronisation goes through.
//
// Every wait has a deadline: `timeout` after the wait began. While waiting, a rank spins (yielding the
// CPU between polls when ranks outnumber CPUs) for wait_policy::spin, then sleeps in the kernel on the
// word it waits for until the poster wakes it (sleep.hpp); every few iterations, and at least every
// wait_policy::recheck while asleep, it checks the communicator's abort word, the peer's state (a
// thread rank that left or failed) and, for processes, whether the peer process still exists.
// Whatever ends a wait early is raised as an error that names this rank, the peer, the collective and
// its sequence number; it is also published in the abort word so that every other rank stops waiting
// at once instead of at its own deadline.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../core/error.hpp"
#include "../schedule/call.hpp"
#include "registry.hpp"
#include "segment.hpp"
#include "sleep.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BRAID_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define BRAID_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define BRAID_CPU_RELAX() ((void)0)
#endif

namespace braid::host {

enum class rank_mode : std::uint8_t { threads, processes };

class rank_context {
public:
  segment_view seg;
  int rank = 0;
  int nranks = 1;
  rank_mode mode = rank_mode::threads;
  std::uint64_t round = 0;                  // last round id used (rounds start at 1)
  std::chrono::nanoseconds timeout{std::chrono::seconds(300)};
  std::vector<int> peer_pidfd;              // processes: pidfd per rank (-1: none or self)
  std::vector<std::int32_t> peer_pid;
  const registry* reg = nullptr;            // processes: buffers registered with the communicator
  wait_policy policy{};                     // how waits spin and sleep (sleep.hpp)
  // What this rank's last slow wait found: another rank on its CPU (wait_slow). The next slow wait
  // starts from it, so ranks bound two to a CPU yield from their first poll.
  mutable bool crowded_last = false;

  // The call in progress, for error messages.
  error_context ctx{};

  // The call word (always on; segment.hpp, rank_control::call). A call is described by fp = {collective
  // | dtype << 8 | op << 16 | algorithm << 24 | sizeof(T) << 32, count, root + 1 (0: none), collective-call
  // number} (the debug fingerprint's layout). Its word chains fp and the call's first round onto the
  // previous call's word, so two ranks publish equal words only if this call and every earlier one
  // (collectives and barriers) agree: a mismatch that no read noticed (two ranks that both think they
  // are a broadcast's root read nothing of each other) is caught at their next read of each other.
  std::uint64_t call_word = 0;
  // The description of the call in progress, for the mismatch message; the caller's array, which lives
  // until the call returns (a pointer, not a copy: copying it on every call stalled on store forwarding).
  const std::array<std::uint64_t, 4>* call_fp = nullptr;
  std::string (*describe_call)(const std::array<std::uint64_t, 4>&) = nullptr;

  // Sets the word of the call whose first round is round + 1 (schedule/call.hpp: a short
  // dependent chain, since this runs on every call, small ones included).
  void begin_rounds(const std::array<std::uint64_t, 4>& fp) {
    call_word = braid::detail::chain_call_word(call_word, fp, round + 1);
    call_fp = &fp;
  }
  // Round R starts: the word goes out with the release store of progress_word(R, 1) that follows.
  void publish_call(std::uint64_t R) const {
    self().call[R & 3].store(call_word, std::memory_order_relaxed); // on the progress line, posted next
  }
  // Before this rank reads anything of peer's in round R, having acquired a progress word of peer's
  // round R (or later): peer's word of round R must be this call's. The word cannot change while this
  // rank is in round R, and the line it shares with in_desc is in this rank's cache after the first
  // compare of a round, so later compares of the round cost a load and a compare, no bookkeeping.
  void check_call(int peer, std::uint64_t R) const {
    if (BRAID_UNLIKELY(seg.rank(peer).call[R & 3].load(std::memory_order_relaxed) != call_word)) fail_mismatch(peer);
  }
  [[noreturn]] void fail_mismatch(int peer) const {
    error_context c = ctx;
    c.peer = peer;
    const std::string mine = describe_call && call_fp ? describe_call(*call_fp) : std::string("a collective");
    const std::string m = "mismatched calls: rank " + std::to_string(rank) + " called " + mine + "; rank " +
                          std::to_string(peer) + "'s call differs in collective, element type, operator, count, root or "
                          "algorithm, or an earlier call of the two ranks did, or they are out of step (BRAID_DEBUG=1 "
                          "names both calls)";
    publish_failure(errc::mismatch, m);
    raise(errc::mismatch, m, c);
  }

  void begin_call(const char* what, std::uint64_t seq) { ctx = error_context{rank, what, seq, -1}; }

  rank_control& self() const { return seg.rank(rank); }

  // Start of peer's input for the current round, given the descriptor it published (non-zero).
  const std::byte* resolve_input(int peer, std::uint64_t desc) const {
    if (mode == rank_mode::threads) return reinterpret_cast<const std::byte*>(desc);
    if (!reg) {
      error_context c = ctx;
      c.peer = peer;
      raise(errc::protocol, "rank " + std::to_string(peer) + " published a registered-buffer descriptor but this rank has no registry", c);
    }
    return reg->resolve(peer, desc);
  }

  bool shared_futex() const { return mode == rank_mode::processes; }

  // Posts this rank's progress word; wakes peers asleep on it (only they cost a system call).
  void post(std::uint64_t word) const {
    rank_control& me = self();
    me.progress.store(word, std::memory_order_release);
    wake_sleepers(me.sleepers, me.progress, shared_futex());
  }

  // Waits until peer's progress word reaches target.
  void wait_progress(int peer, std::uint64_t target) const {
    rank_control& rc = seg.rank(peer);
    wait_ge(rc.progress, target, peer, rc.progress);
  }

  // After a release store of a word peers may sleep on (this rank's progress word, a send/recv word it
  // writes): wakes them; a load of this rank's own sleepers count when nobody sleeps.
  void wake(const std::atomic<std::uint64_t>& w) const { wake_sleepers(self().sleepers, w, shared_futex()); }

  // Waits until word >= target, `peer` being the rank that posts it. `word` is the 64-bit word waited
  // on or a view of it (p2p.hpp: a counter or an error flag); `bell` is the word whose low half a
  // sleeping waiter sleeps on (sleep.hpp), counted in peer's sleepers: whatever changes what `word`
  // reads wakes `bell`. The deadline counts from the start of this wait: a call that keeps making
  // progress never times out, a peer that stops for longer than `timeout` is an error.
  template <class Atomic>
  void wait_ge(const Atomic& word, std::uint64_t target, int peer, const std::atomic<std::uint64_t>& bell) const {
    if (BRAID_LIKELY(word.load(std::memory_order_acquire) >= target)) return;
    wait_slow(word, target, peer, bell);
  }

  template <class Atomic>
  [[gnu::noinline]] void wait_slow(const Atomic& word, std::uint64_t target, int peer, const std::atomic<std::uint64_t>& bell) const {
    std::atomic<std::uint32_t>& sleepers = seg.rank(peer).sleepers;
    const auto start = std::chrono::steady_clock::now();
    const auto limit = start + timeout;
    const auto spin_end = start + policy.spin;
    auto last_check = start;
    const std::atomic<std::int32_t>& peer_cpu = seg.rank(peer).cpu;
    int cpu = -2;
    // Whether another rank may need this CPU: then the wait yields between polls instead of spinning,
    // whichever rank it waits for (a spinning rank holds back a rank that shares its CPU until the
    // scheduler's time slice ends, and that rank may be the one every peer waits for).
    bool crowded = policy.oversubscribed || crowded_last;
    bool woke = false; // back from a sleep: the peer's state is read at once (close() wakes sleepers)
    for (;;) {
      // Polls between looks at the clock: one when crowded (each of 64 polls, 13-17 ns of PAUSE on the
      // 2-vCPU Xeon VM, is time the rank that shares the CPU could run: 4 processes on 2 CPUs, 16-256 B
      // all_reduce, 2.1-3.1 µs per call with one poll, 3.0-5.2 with 64, bench/results).
      const int polls = crowded ? 1 : 64;
      for (int i = 0; i < polls; ++i) {
        if (word.load(std::memory_order_acquire) >= target) return;
        BRAID_CPU_RELAX();
      }
      if (cpu == -2) {
        // Where this rank runs, for a peer that waits for it: a peer that finds it on its own CPU
        // yields instead of spinning (spinning would only delay the rank it waits for by a time
        // slice). Looked up once a wait outlasts its first polls, and stored only when it changed:
        // the peer reads the line while it spins (a store on every slow wait costs about 6% per call
        // at the 4 B floor).
        cpu = ::sched_getcpu();
        if (self().cpu.load(std::memory_order_relaxed) != cpu) self().cpu.store(cpu, std::memory_order_relaxed);
        crowded = policy.oversubscribed || shares_cpu(cpu);
        crowded_last = crowded;
      }
      check_abort(peer);
      const auto now = std::chrono::steady_clock::now();
      if (now - last_check > std::chrono::milliseconds(2)) {
        // The peer may have posted its last word and then left: look at the word once more first.
        if (!peer_present(peer) && word.load(std::memory_order_acquire) < target) fail_peer(peer);
        last_check = now;
      } else if (woke && peer_gone(peer) && word.load(std::memory_order_acquire) < target) {
        fail_peer(peer);
      }
      woke = false;
      if (now > limit) {
        if (word.load(std::memory_order_acquire) >= target) return;
        fail_timeout(peer);
      }
      if (now < spin_end) {
        if (crowded || peer_cpu.load(std::memory_order_relaxed) == cpu) sched_yield();
        continue;
      }
      // Asleep until the poster wakes it, the recheck interval passes or the deadline comes.
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      const bool ordered = policy.membarrier && !seg.header().no_membarrier.load(std::memory_order_relaxed) &&
                           membarrier_all(shared_futex());
      const std::uint64_t seen = bell.load(std::memory_order_acquire);
      if (word.load(std::memory_order_acquire) < target) {
        auto nap = std::min<std::chrono::nanoseconds>(policy.recheck, limit - now);
        if (!ordered) nap = std::min(nap, kFallbackSleep);
        futex_sleep(bell, seen, shared_futex(), nap);
        woke = true;
      }
      sleepers.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  // Whether another rank of this communicator last began a slow wait on `cpu` (ranks bound two to a
  // CPU find each other here; an unbound rank that a peer shares a CPU with only for a moment does
  // too, and yields for the rest of this wait). One load per rank, once per slow wait.
  bool shares_cpu(int cpu) const {
    if (cpu < 0) return false;
    for (int q = 0; q < nranks; ++q)
      if (q != rank && seg.rank(q).cpu.load(std::memory_order_relaxed) == cpu) return true;
    return false;
  }

  // Raises the error already published by another rank, if any.
  void check_abort(int peer) const {
    const std::uint64_t w = seg.header().abort_word.load(std::memory_order_acquire);
    if (BRAID_LIKELY(w == 0)) return;
    const int who = static_cast<int>(w & 0xffffffffu) - 1;
    const auto code = static_cast<errc>((w >> 32) & 0x7fffffffu);
    error_context c = ctx;
    c.peer = who >= 0 ? who : peer;
    std::string msg = seg.header().abort_message;
    if (code == errc::aborted) raise(errc::aborted, "the communicator was aborted: " + msg, c);
    // Mismatched calls are reported as such on every rank, whoever found them.
    if (code == errc::mismatch) raise(errc::mismatch, "rank " + std::to_string(who) + " found mismatched calls: " + msg, c);
    raise(errc::peer_failed, "rank " + std::to_string(who) + " failed: " + msg, c);
  }

  // Whether peer marked itself left or failed (a load, no system call).
  bool peer_gone(int peer) const {
    const auto st = static_cast<rank_state>(seg.rank(peer).state.load(std::memory_order_acquire));
    return st == rank_state::left || st == rank_state::failed;
  }

  // Whether peer is still a member that can make progress.
  bool peer_present(int peer) const {
    if (peer < 0 || peer == rank) return true;
    const auto st = static_cast<rank_state>(seg.rank(peer).state.load(std::memory_order_acquire));
    if (st == rank_state::left || st == rank_state::failed) return false;
    return mode != rank_mode::processes || peer_alive(peer);
  }

  [[noreturn]] void fail_peer(int peer) const {
    // A rank that found mismatched calls published them before it marked itself failed: every rank
    // reports the mismatch, not the failed peer it led to.
    const std::uint64_t w = seg.header().abort_word.load(std::memory_order_acquire);
    if (w && static_cast<errc>((w >> 32) & 0x7fffffffu) == errc::mismatch) check_abort(peer);
    error_context c = ctx;
    c.peer = peer;
    const auto st = static_cast<rank_state>(seg.rank(peer).state.load(std::memory_order_acquire));
    std::string m;
    if (st == rank_state::left || st == rank_state::failed)
      m = "rank " + std::to_string(peer) + (st == rank_state::left ? " left the communicator" : " failed") +
          " while rank " + std::to_string(rank) + " waited for it";
    else
      m = "rank " + std::to_string(peer) + " (pid " + std::to_string(peer_pid[static_cast<std::size_t>(peer)]) +
          ") died while rank " + std::to_string(rank) + " waited for it";
    publish_failure(errc::peer_failed, m);
    raise(errc::peer_failed, m, c);
  }

  bool peer_alive(int peer) const {
    if (peer < 0 || peer >= static_cast<int>(peer_pidfd.size())) return true;
    const auto q = static_cast<std::size_t>(peer);
    if (peer_pidfd[q] >= 0) {
      pollfd p{peer_pidfd[q], POLLIN, 0};
      return ::poll(&p, 1, 0) == 0; // a pidfd becomes readable when the process exits
    }
    if (q < peer_pid.size() && peer_pid[q] > 0)
      return ::kill(peer_pid[q], 0) == 0 || errno != ESRCH;
    return true;
  }

  [[noreturn]] void fail_timeout(int peer) const {
    error_context c = ctx;
    c.peer = peer;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
    const std::string m = "rank " + std::to_string(rank) + " waited more than " + std::to_string(ms) +
                          " ms for rank " + std::to_string(peer) + " (BRAID_TIMEOUT / options::timeout)";
    publish_failure(errc::timeout, m);
    raise(errc::timeout, m, c);
  }

  // Publishes the first failure so that every rank stops waiting. Later failures keep the first.
  void publish_failure(errc code, const std::string& message) const {
    segment_header& h = seg.header();
    std::uint32_t expected = 0;
    if (!h.abort_claim.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
    const std::string m = message.substr(0, sizeof(h.abort_message) - 1);
    std::memcpy(h.abort_message, m.c_str(), m.size() + 1);
    const std::uint64_t w = (std::uint64_t{1} << 63) | (static_cast<std::uint64_t>(code) << 32) |
                            static_cast<std::uint64_t>(rank + 1);
    // The words sleepers sleep on are gathered before the store: once it is visible, the ranks raise
    // and may close and unmap the segment (abort() from a helper thread), so after it this function
    // touches neither the segment nor *this; FUTEX_WAKE on an address no longer mapped only fails.
    const std::vector<const std::atomic<std::uint64_t>*> bells = sleeping_bells();
    const bool sh = shared_futex();
    h.abort_word.store(w, std::memory_order_release);
    for (const auto* b : bells) futex_wake_all(*b, sh);
  }

  // The progress words that ranks may be asleep on (sleep.hpp): those of ranks whose sleepers count is
  // non-zero; O(n). Ranks asleep on a send/recv word, or that fall asleep after this look (or between
  // their last look at the abort word and their FUTEX_WAIT), see the failure at their recheck, within
  // 2 ms.
  std::vector<const std::atomic<std::uint64_t>*> sleeping_bells() const {
    std::vector<const std::atomic<std::uint64_t>*> bells;
    const int n = static_cast<int>(seg.layout.nranks);
    for (int q = 0; q < n; ++q)
      if (seg.rank(q).sleepers.load(std::memory_order_seq_cst)) bells.push_back(&seg.rank(q).progress);
    return bells;
  }

  // After this rank marked itself left or failed: wakes ranks asleep on any word it posts, so they see
  // it now (their next pass reads its state), not at their recheck.
  void wake_own_sleepers() const {
    const rank_control& me = self();
    if (!me.sleepers.load(std::memory_order_seq_cst)) return;
    const bool sh = shared_futex();
    futex_wake_all(me.progress, sh);
    const int n = static_cast<int>(seg.layout.nranks);
    for (int d = 0; d < n; ++d) {
      futex_wake_all(seg.pair(rank, d).msg_posted, sh); // as sender
      futex_wake_all(seg.pair(rank, d).bytes_posted, sh);
      futex_wake_all(seg.pair(d, rank).msg_done, sh);   // as receiver
      futex_wake_all(seg.pair(d, rank).bytes_consumed, sh);
    }
  }
};

} // namespace braid::host
