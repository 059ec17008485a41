// braid/comm/registration.hpp — communicator::alloc's exchange between processes: every rank's new
// buffer described to every peer over the rendezvous sockets and mapped there, and what a closed
// socket during that exchange means (which rank died, closed or failed).
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

#include "../host/rendezvous/rendezvous.hpp"
#include "../core/error.hpp"
#include "state.hpp"

namespace braid::detail {

[[noreturn]] inline void raise_closed_in_alloc(communicator_state& p, const host::detail::peer_closed_error& e);

inline void exchange_registration(communicator_state& p, std::uint64_t id, const host::mapped_memory& mine) {
  using namespace host::detail;
  const int n = p.cx.nranks, r = p.cx.rank;
  const auto deadline = clock::now() + p.opts.timeout;
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(n), 0);
  std::vector<int> fds(static_cast<std::size_t>(n), -1); // received descriptors, by rank
  // Allocation ids each rank freed since its previous alloc (more than wire::max_freed wait for the next).
  std::vector<std::vector<std::uint64_t>> freed(static_cast<std::size_t>(n));
  freed[static_cast<std::size_t>(r)] = p.reg->take_freed(wire::max_freed);
  auto close_all = [&] { for (int q = 0; q < n; ++q) if (q != r && fds[static_cast<std::size_t>(q)] >= 0) ::close(fds[static_cast<std::size_t>(q)]); };
  // Errors on the socket to rank q: this rank, "alloc" and its sequence number, peer q.
  auto with_peer = [&](int q) {
    error_context c = p.cx.ctx;
    c.peer = q;
    return c;
  };
  // Every id rank q says it freed must be one of q's buffers that this rank maps.
  auto check_freed = [&](int q, const std::vector<std::uint64_t>& ids) {
    for (std::uint64_t f : ids)
      if (!p.reg->maps_peer(f, q))
        raise(errc::protocol, "alloc: rank " + std::to_string(q) + " announced freeing allocation " + std::to_string(f) +
                                  ", which is not a buffer of that rank mapped here", with_peer(q));
  };
  sizes[static_cast<std::size_t>(r)] = mine.size();
  fds[static_cast<std::size_t>(r)] = mine.fd();
  try {
    if (r == 0) {
      for (int q = 1; q < n; ++q) {
        std::vector<int> got;
        auto offer = recv_message(p.sockets[static_cast<std::size_t>(q)].get(), wire::msg_type::reg_offer, &got, deadline,
                                  with_peer(q), wire::parse_reg_offer);
        if (got.size() != 1 || offer.alloc_id != id) {
          for (int f : got) ::close(f);
          raise(errc::mismatch, "alloc: rank " + std::to_string(q) + " is at a different allocation (calls to alloc must match on every rank)",
                with_peer(q));
        }
        fds[static_cast<std::size_t>(q)] = got[0];
        sizes[static_cast<std::size_t>(q)] = offer.bytes;
        check_freed(q, offer.freed);
        freed[static_cast<std::size_t>(q)] = std::move(offer.freed);
      }
      const auto table = wire::encode_reg_table(wire::reg_table{id, sizes, freed});
      for (int q = 1; q < n; ++q) {
        std::vector<int> pass;
        for (int k = 0; k < n; ++k) if (k != q) pass.push_back(fds[static_cast<std::size_t>(k)]);
        send_all(p.sockets[static_cast<std::size_t>(q)].get(), table, pass, deadline, with_peer(q));
      }
    } else {
      send_all(p.sockets[0].get(), wire::encode_reg_offer(wire::reg_offer{id, mine.size(), freed[static_cast<std::size_t>(r)]}),
               {mine.fd()}, deadline, with_peer(0));
      std::vector<int> got;
      auto t = recv_message(p.sockets[0].get(), wire::msg_type::reg_table, &got, deadline, with_peer(0), wire::parse_reg_table);
      if (t.alloc_id != id || t.bytes.size() != static_cast<std::size_t>(n) || got.size() != static_cast<std::size_t>(n - 1) ||
          t.freed[static_cast<std::size_t>(r)] != freed[static_cast<std::size_t>(r)]) {
        for (int f : got) ::close(f);
        raise(errc::protocol, "alloc: rank 0 sent a registration table that does not match this allocation", with_peer(0));
      }
      std::size_t k = 0;
      for (int q = 0; q < n; ++q) if (q != r) fds[static_cast<std::size_t>(q)] = got[k++];
      sizes = t.bytes;
      for (int q = 0; q < n; ++q) if (q != r) check_freed(q, t.freed[static_cast<std::size_t>(q)]);
      freed = std::move(t.freed);
    }
  } catch (const host::detail::peer_closed_error& e) {
    close_all();
    raise_closed_in_alloc(p, e);
  } catch (...) {
    close_all();
    throw;
  }
  // The peers' freed buffers: unmapped here, between this rank's calls (see alloc).
  for (int q = 0; q < n; ++q)
    if (q != r)
      for (std::uint64_t f : freed[static_cast<std::size_t>(q)]) p.reg->drop_peer(f, q);
  std::vector<host::mapped_memory> maps(static_cast<std::size_t>(n));
  try {
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const int f = fds[static_cast<std::size_t>(q)];
      fds[static_cast<std::size_t>(q)] = -1; // map_shared owns it now, on success and failure alike
      maps[static_cast<std::size_t>(q)] = host::mapped_memory::map_shared(f, sizes[static_cast<std::size_t>(q)], false);
    }
  } catch (...) {
    close_all(); // the descriptors of the peers not mapped yet
    throw;
  }
  p.reg->set_peers(id, std::move(maps));
}

// How long alloc looks for the rank that died after a socket of its exchange closed (at most
// options::timeout): a process's socket closes a few microseconds before its pidfd becomes readable.
inline constexpr std::chrono::milliseconds alloc_death_grace{1000};

// A socket of alloc's exchange closed (e: raise_peer_closed's error, peer() = the rank at its other
// end, q). The sockets form a star around rank 0, so q need not be the rank that died: rank 0 closes
// every socket when it fails because another rank died. Before raising, this rank looks at every
// peer, for at most alloc_death_grace (bounded by options::timeout), and raises:
//  * peer_failed naming the lowest rank whose process ended while its state word still said active
//    (it died without closing or failing), published like a death seen by a wait (fail_peer);
//  * if q closed its communicator (state left): e, the protocol_error it is;
//  * if q failed and a failure is published: that failure, as check_abort raises it (peer_failed
//    "rank W failed: ..." naming the publisher, or mismatch_error / aborted_error);
//  * if none of that is known in time: e, its message saying that q may only have relayed another
//    rank's failure.
[[noreturn]] inline void raise_closed_in_alloc(communicator_state& p, const host::detail::peer_closed_error& e) {
  using clock = std::chrono::steady_clock;
  const host::rank_context& cx = p.cx;
  const int n = cx.nranks, r = cx.rank, q = e.peer();
  const auto grace = std::min<std::chrono::nanoseconds>(p.opts.timeout, alloc_death_grace);
  const auto until = clock::now() + grace;
  const std::string how = e.sys_errno() ? std::string(std::strerror(e.sys_errno())) + " (errno " + std::to_string(e.sys_errno()) + ")"
                                        : std::string("end of file");
  for (;;) {
    std::vector<int> dead;
    for (int k = 0; k < n; ++k)
      if (k != r && !cx.peer_gone(k) && !cx.peer_alive(k)) dead.push_back(k);
    if (!dead.empty()) {
      const int d = dead.front();
      std::string m = "rank " + std::to_string(d) + " (pid " + std::to_string(cx.peer_pid[static_cast<std::size_t>(d)]) +
                      ") died during alloc";
      for (std::size_t i = 1; i < dead.size(); ++i) m += (i == 1 ? "; also dead: rank " : ", rank ") + std::to_string(dead[i]);
      if (q == d) m += " (rank " + std::to_string(r) + " found its connection closed: " + how + ")";
      else if (q >= 0) m += " (rank " + std::to_string(r) + " learnt it when rank " + std::to_string(q) + " closed the connection: " + how + ")";
      error_context c = cx.ctx;
      c.peer = d;
      cx.publish_failure(errc::peer_failed, m);
      raise(errc::peer_failed, m, c, {}, nullptr, 0, e.sys_errno());
    }
    if (q >= 0 && q < n) {
      const auto st = static_cast<host::rank_state>(cx.seg.rank(q).state.load(std::memory_order_acquire));
      if (st == host::rank_state::left) throw e;
      if (st == host::rank_state::failed) cx.check_abort(q); // raises when a failure is published
    }
    const auto now = clock::now();
    if (now >= until) break;
    // Sleep until a peer's process ends (its pidfd becomes readable) or 1 ms passes.
    std::vector<pollfd> fds;
    for (int k = 0; k < n; ++k)
      if (k != r && cx.peer_pidfd[static_cast<std::size_t>(k)] >= 0 && !cx.peer_gone(k))
        fds.push_back(pollfd{cx.peer_pidfd[static_cast<std::size_t>(k)], POLLIN, 0});
    if (fds.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    else (void)::poll(fds.data(), fds.size(), 1); // nfds_t is size_t on Linux (braid's only host OS)
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(grace).count();
  raise(errc::protocol, e.message() + "; rank " + std::to_string(q) + " may only have relayed another rank's failure: no rank " +
                            "was found dead within " + std::to_string(ms) + " ms", e.context(), e.call(), e.file(), e.line(),
        e.sys_errno());
}

} // namespace braid::detail
