// braid/comm/sendrecv.hpp — the blocking send/receive loop under communicator::send, recv and
// sendrecv: both directions progress together over the pair's mailbox, so a ring exchange cannot
// deadlock.
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

#include "../host/p2p.hpp"
#include "state.hpp"

namespace braid::detail {

inline void do_sendrecv(communicator_state& p, const void* sdata, std::size_t sbytes, int speer, void* rdata, std::size_t rbytes,
                        int rpeer) {
  auto& st = p.p2p;
  if (st.sent_msgs.empty()) {
    st.sent_msgs.assign(static_cast<std::size_t>(p.cx.nranks), 0);
    st.recv_msgs.assign(static_cast<std::size_t>(p.cx.nranks), 0);
  }
  host::p2p_sender s{&p.cx, speer, static_cast<const std::byte*>(sdata), sbytes};
  host::p2p_receiver rv{&p.cx, rpeer, static_cast<std::byte*>(rdata), rbytes,
                        rpeer >= 0 ? st.recv_msgs[static_cast<std::size_t>(rpeer)] + 1 : 0};
  bool sdone = speer < 0, rdone = rpeer < 0;
  if (sdone) return void(rv.poll(true)), void(++st.recv_msgs[static_cast<std::size_t>(rpeer)]);
  if (rdone) return void(s.poll(true)), void(++st.sent_msgs[static_cast<std::size_t>(speer)]);
  // Both directions: advance each without blocking; wait (bounded like every wait) only while
  // neither moves, so that two ranks exchanging more than their send buffers never wait on each other.
  auto state = [&] { return std::make_tuple(s.announced, s.piece, s.done, rv.checked, rv.piece, rv.done); };
  auto last = state();
  auto last_move = std::chrono::steady_clock::now();
  std::uint32_t idle = 0;
  while (!sdone || !rdone) {
    if (!sdone && s.poll(false)) sdone = true;
    if (!rdone && rv.poll(false)) rdone = true;
    const auto now_state = state();
    if (now_state != last) {
      last = now_state;
      idle = 0;
      last_move = std::chrono::steady_clock::now();
      continue;
    }
    if (++idle % 64) {
      BRAID_CPU_RELAX();
      continue;
    }
    const int waiting_for = !rdone ? rpeer : speer;
    p.cx.check_abort(waiting_for);
    if (!p.cx.peer_present(waiting_for)) p.cx.fail_peer(waiting_for);
    if (std::chrono::steady_clock::now() - last_move > p.cx.timeout) p.cx.fail_timeout(waiting_for);
    if (idle > 4096) sched_yield();
  }
  ++st.sent_msgs[static_cast<std::size_t>(speer)];
  ++st.recv_msgs[static_cast<std::size_t>(rpeer)];
}

} // namespace braid::detail
