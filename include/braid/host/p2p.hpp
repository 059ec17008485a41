// braid/host/p2p.hpp — send/recv between two ranks of a host communicator.
//
// The sender announces a message (its size) on the pair's control block, then streams it through its
// send buffer in pieces of half that buffer, alternating halves; the receiver copies each piece out
// and acknowledges it. send() returns once the receiver has copied everything, so the send buffer is
// free for the next message to any peer. A receiver that expects a different size refuses the message:
// both sides then fail with a mismatch error. Other ranks are not involved.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "context.hpp"

namespace braid::host {

struct p2p_state {
  std::vector<std::uint64_t> sent_msgs, recv_msgs; // per peer: messages sent to / received from it
};

class p2p_piece_plan {
public:
  p2p_piece_plan(std::uint64_t total, std::uint64_t half_bytes) : total_(total), half_(half_bytes) {}
  std::uint64_t pieces() const { return total_ == 0 ? 0 : (total_ + half_ - 1) / half_; }
  std::uint64_t offset(std::uint64_t i) const { return i * half_; }
  std::uint64_t size(std::uint64_t i) const { return total_ - i * half_ < half_ ? total_ - i * half_ : half_; }

private:
  std::uint64_t total_, half_;
};

// One direction of an exchange, advanced step by step so send and recv can interleave (sendrecv).
struct p2p_sender {
  rank_context* cx;
  int peer;
  const std::byte* data;
  std::uint64_t bytes, piece = 0, base_posted = 0;
  bool announced = false, done = false;

  // Does as much as possible without waiting; returns true when finished.
  bool poll(bool block) {
    pair_control& pc = cx->seg.pair(cx->rank, peer);
    const std::uint64_t half = cx->seg.layout.p2p_bytes / 2;
    const p2p_piece_plan plan(bytes, half);
    if (!announced) {
      base_posted = pc.bytes_posted.load(std::memory_order_relaxed);
      pc.msg_bytes = bytes;
      pc.msg_posted.fetch_add(1, std::memory_order_release);
      wake_receiver(pc);
      announced = true;
    }
    while (piece < plan.pieces()) {
      // Piece i reuses the half of piece i - 2: it must have been consumed.
      const std::uint64_t need = piece >= 2 ? base_posted + plan.offset(piece - 1) : 0;
      if (piece >= 2 && pc.bytes_consumed.load(std::memory_order_acquire) < need) {
        if (!block) return false;
        wait_consumed(pc, need);
      }
      std::memcpy(cx->seg.p2p(cx->rank) + (piece % 2) * half, data + plan.offset(piece), plan.size(piece));
      pc.bytes_posted.store(base_posted + plan.offset(piece) + plan.size(piece), std::memory_order_release);
      wake_receiver(pc);
      ++piece;
    }
    const std::uint64_t msgs = pc.msg_posted.load(std::memory_order_relaxed);
    if (pc.msg_done.load(std::memory_order_acquire) < msgs || pc.msg_error.load(std::memory_order_acquire)) {
      if (!block) {
        if (pc.msg_error.load(std::memory_order_acquire)) refused(pc);
        return false;
      }
      wait_done(pc, msgs);
    }
    done = true;
    return true;
  }

  // The receiver may sleep on either word of the line (sleep.hpp).
  void wake_receiver(pair_control& pc) const {
    cx->wake(pc.msg_posted);
    if (BRAID_UNLIKELY(cx->self().sleepers.load(std::memory_order_relaxed))) futex_wake_all(pc.bytes_posted, cx->shared_futex());
  }

  void wait_consumed(pair_control& pc, std::uint64_t need) {
    struct view { pair_control& pc; std::uint64_t load(std::memory_order o) const {
      return pc.msg_error.load(o) ? ~0ULL : pc.bytes_consumed.load(o); } } v{pc};
    cx->wait_ge(v, need, peer, pc.bytes_consumed);
    if (pc.msg_error.load(std::memory_order_acquire)) refused(pc);
  }
  void wait_done(pair_control& pc, std::uint64_t msgs) {
    struct view { pair_control& pc; std::uint64_t load(std::memory_order o) const {
      return pc.msg_error.load(o) ? ~0ULL : pc.msg_done.load(o); } } v{pc};
    cx->wait_ge(v, msgs, peer, pc.msg_done);
    if (pc.msg_error.load(std::memory_order_acquire)) refused(pc);
  }
  [[noreturn]] void refused(pair_control& pc) {
    pc.msg_error.store(0, std::memory_order_relaxed);
    error_context c = cx->ctx;
    c.peer = peer;
    raise(errc::mismatch, "rank " + std::to_string(peer) + " refused a message of " + std::to_string(bytes) +
                              " bytes: it expected a different size", c);
  }
};

struct p2p_receiver {
  rank_context* cx;
  // The sender may sleep on either word of the line (sleep.hpp).
  void wake_sender(pair_control& pc) const {
    cx->wake(pc.msg_done);
    if (BRAID_UNLIKELY(cx->self().sleepers.load(std::memory_order_relaxed))) futex_wake_all(pc.bytes_consumed, cx->shared_futex());
  }

  int peer;
  std::byte* data;
  std::uint64_t bytes, expected_msg, piece = 0, base_consumed = 0;
  bool checked = false, done = false;

  bool poll(bool block) {
    pair_control& pc = cx->seg.pair(peer, cx->rank);
    const std::uint64_t half = cx->seg.layout.p2p_bytes / 2;
    if (!checked) {
      if (pc.msg_posted.load(std::memory_order_acquire) < expected_msg) {
        if (!block) return false;
        cx->wait_ge(pc.msg_posted, expected_msg, peer, pc.msg_posted);
      }
      if (pc.msg_bytes != bytes) {
        const std::uint64_t theirs = pc.msg_bytes;
        pc.msg_error.store(1, std::memory_order_release);
        wake_sender(pc);
        error_context c = cx->ctx;
        c.peer = peer;
        raise(errc::mismatch, "rank " + std::to_string(peer) + " sent " + std::to_string(theirs) +
                                  " bytes but this recv expects " + std::to_string(bytes), c);
      }
      base_consumed = pc.bytes_consumed.load(std::memory_order_relaxed);
      checked = true;
    }
    const p2p_piece_plan plan(bytes, half);
    while (piece < plan.pieces()) {
      const std::uint64_t need = base_consumed + plan.offset(piece) + plan.size(piece);
      if (pc.bytes_posted.load(std::memory_order_acquire) < need) {
        if (!block) return false;
        cx->wait_ge(pc.bytes_posted, need, peer, pc.bytes_posted);
      }
      std::memcpy(data + plan.offset(piece), cx->seg.p2p(peer) + (piece % 2) * half, plan.size(piece));
      pc.bytes_consumed.store(need, std::memory_order_release);
      wake_sender(pc);
      ++piece;
    }
    pc.msg_done.store(expected_msg, std::memory_order_release);
    wake_sender(pc);
    done = true;
    return true;
  }
};

} // namespace braid::host
