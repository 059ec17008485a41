// braid/comm/fingerprint.hpp — debug mode (options::debug, BRAID_DEBUG=1): before any data moves,
// every rank publishes its call's fingerprint and compares every peer's with it.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>

#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/types.hpp"
#include "../schedule/call.hpp"
#include "state.hpp"
#include "tuning.hpp"

namespace braid::detail {

// A call's description (schedule/call.hpp) in words, for mismatch messages.
inline std::string describe_fingerprint(const call_description& fp) {
  const call_record f = unpack(fp);
  if (f.coll == collective::barrier) return "barrier (collective call " + std::to_string(f.number) + ")";
  std::string s = std::string(name(f.coll)) + " (collective call " + std::to_string(f.number) + "): " +
                  (f.type == dtype::custom ? std::to_string(f.elem_size) + "-byte custom type" : std::string(name(f.type)));
  if (f.coll == collective::all_reduce || f.coll == collective::reduce || f.coll == collective::reduce_scatter)
    s += ", " + std::string(name(f.op));
  s += ", count " + std::to_string(f.count);
  if (rooted(f.coll)) s += ", root " + std::to_string(f.root);
  s += ", algorithm " + std::string(name(f.algorithm));
  return s;
}

// Waits (bounded, like every wait) until a peer's fingerprint word reaches target. Another rank's
// published mismatch is raised here as a mismatch_error too, so that every rank reports the mismatch.
inline void wait_fingerprint(communicator_state& p, int q, const std::atomic<std::uint64_t>& word, std::uint64_t target) {
  host::rank_context& cx = p.cx;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint32_t spins = 0;; ++spins) {
    if (word.load(std::memory_order_acquire) >= target) return;
    if (spins % 64 != 63) {
      BRAID_CPU_RELAX();
      continue;
    }
    // A published failure: a mismatch found by another rank is raised as a mismatch here too.
    auto published = [&] {
      const std::uint64_t w = cx.seg.header().abort_word.load(std::memory_order_acquire);
      if (!w) return;
      if (static_cast<errc>((w >> 32) & 0x7fffffffu) == errc::mismatch) {
        error_context e = cx.ctx;
        e.peer = static_cast<int>(w & 0xffffffffu) - 1;
        raise(errc::mismatch, "rank " + std::to_string(e.peer) + " found mismatched calls: " +
                                  std::string(cx.seg.header().abort_message), e);
      }
      cx.check_abort(q);
    };
    if (cx.seg.header().abort_word.load(std::memory_order_acquire)) {
      if (word.load(std::memory_order_acquire) >= target) return;
      published();
    }
    if (!cx.peer_present(q)) {
      // A rank that failed published its failure before it marked itself failed: read it again, so
      // that a mismatch it found between the check above and this one is reported as one.
      published();
      cx.fail_peer(q);
    }
    if (std::chrono::steady_clock::now() - start > cx.timeout) cx.fail_timeout(q);
    if (spins > 4096) {
      const timespec ts{0, 50'000};
      nanosleep(&ts, nullptr);
    } else {
      sched_yield();
    }
  }
}

// Publishes this call's fingerprint, waits for every peer's and compares; a difference raises
// mismatch_error naming both calls before any data moves. Returns once every peer compared too, so
// that no rank overwrites its fingerprint while a peer may still read it.
inline void check_fingerprint(communicator_state& p, const std::array<std::uint64_t, 4>& fp) {
  host::rank_context& cx = p.cx;
  const int n = cx.nranks, r = cx.rank;
  host::rank_control& me = cx.self();
  for (std::size_t i = 0; i < 4; ++i) me.fingerprint[i] = fp[i];
  me.fingerprint_seq.store(fp[3], std::memory_order_release);
  for (int q = 0; q < n; ++q)
    if (q != r) wait_fingerprint(p, q, cx.seg.rank(q).fingerprint_seq, fp[3]);
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    const host::rank_control& o = cx.seg.rank(q);
    const std::array<std::uint64_t, 4> theirs{o.fingerprint[0], o.fingerprint[1], o.fingerprint[2], o.fingerprint[3]};
    if (theirs != fp) {
      error_context e = cx.ctx;
      e.peer = q;
      raise(errc::mismatch, "mismatched calls (BRAID_DEBUG): rank " + std::to_string(r) + " called " + describe_fingerprint(fp) +
                                "; rank " + std::to_string(q) + " called " + describe_fingerprint(theirs), e);
    }
  }
  me.fingerprint_checked.store(fp[3], std::memory_order_release);
  for (int q = 0; q < n; ++q)
    if (q != r) wait_fingerprint(p, q, cx.seg.rank(q).fingerprint_checked, fp[3]);
}

} // namespace braid::detail
