// braid/comm/state.hpp — what a braid::communicator holds: its shared memory, its rank's transport
// context, options, call counts, failure, and its point-to-point and registration state.
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
#include "../host/context.hpp"
#include "../host/memory.hpp"
#include "../host/p2p.hpp"
#include "../host/registry.hpp"
#include "options.hpp"

namespace braid::detail {

struct communicator_state {
  std::shared_ptr<host::mapped_memory> memory;
  host::rank_context cx;
  options opts;
  std::uint64_t seq = 0;
  std::uint64_t collectives = 0; // calls every rank makes (collectives, barrier): call words and debug fingerprints
  bool failed = false;
  std::string failure;
  std::atomic<bool> busy{false};
  host::p2p_state p2p;
  std::shared_ptr<host::registry> reg;
  std::vector<host::socket_fd> sockets; // processes: to rank 0 (or, on rank 0, to each peer)
};

} // namespace braid::detail
