// braid/launch/threads.hpp — ranks that are threads of this process: a thread_group makes their
// communicators over one shared segment; run_threads runs a function on each, one thread per rank.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../comm/communicator.hpp"

namespace braid {

// Ranks as threads of this process: make(r) once for each rank, each used by one thread.
class thread_group {
public:
  explicit thread_group(int nranks, const options& opts = options::from_env()) : nranks_(nranks), opts_(opts) {
    if (nranks < 1 || nranks > static_cast<int>(wire::max_ranks))
      raise(errc::invalid_argument, "thread_group: nranks " + std::to_string(nranks) + " out of range");
    layout_ = host::segment_layout::make(static_cast<std::uint32_t>(nranks), braid::detail::staging_half_bytes(opts.staging_bytes), opts.p2p_bytes);
    mem_ = std::make_shared<host::mapped_memory>(host::mapped_memory::anonymous(layout_.total));
    host::segment_view{mem_->data(), layout_}.initialize();
    made_.assign(static_cast<std::size_t>(nranks), false);
  }
  communicator make(int rank) {
    if (rank < 0 || rank >= nranks_) raise(errc::invalid_argument, "thread_group::make: rank out of range");
    if (made_[static_cast<std::size_t>(rank)]) raise(errc::invalid_usage, "thread_group::make: rank " + std::to_string(rank) + " was already made");
    made_[static_cast<std::size_t>(rank)] = true;
    return communicator::make(mem_, layout_, rank, nranks_, host::rank_mode::threads, opts_);
  }
  int size() const { return nranks_; }

private:
  int nranks_;
  options opts_;
  host::segment_layout layout_;
  std::shared_ptr<host::mapped_memory> mem_;
  std::vector<bool> made_;
};

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
