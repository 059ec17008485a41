// braid/launch/threads.hpp — run a function on n ranks that are threads of this process.
#pragma once

#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "../comm/communicator.hpp"

namespace braid {

// Starts n threads, gives each its rank's communicator and calls fn(comm) on it; returns when all
// have returned. If any rank throws, its communicator is closed (so ranks waiting for it fail with
// peer_failed instead of hanging) and, after every thread ended, the first root-cause exception is
// rethrown: one that is not a consequence of another rank's failure, if there is one.
template <class F> void run_threads(int n, F&& fn, const options& opts = options::from_env()) {
  thread_group group(n, opts);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  // One byte per rank: each thread writes its own element (std::vector<bool> would pack them into
  // shared words, and concurrent writes to one word are a data race).
  std::vector<unsigned char> secondary(static_cast<std::size_t>(n), 0);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  std::vector<communicator> comms;
  comms.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) comms.push_back(group.make(r));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      communicator& c = comms[static_cast<std::size_t>(r)];
      try {
        fn(c);
      } catch (const error& e) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        // Consequences of another rank's failure: a peer error, an abort, or a refusal to start a
        // call on a communicator that another rank's failure had already poisoned.
        secondary[static_cast<std::size_t>(r)] =
            e.code() == errc::peer_failed || e.code() == errc::aborted || e.code() == errc::invalid_usage;
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
      c.close();
    });
  }
  for (auto& t : threads) t.join();
  for (int pass = 0; pass < 2; ++pass)
    for (int r = 0; r < n; ++r)
      if (errors[static_cast<std::size_t>(r)] && (pass == 1 || !secondary[static_cast<std::size_t>(r)]))
        std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
}

} // namespace braid
