// braid/launch/fork.hpp — run a function as n ranks in n forked processes of this program.
//
//   const std::vector<int> status = braid::fork_ranks(4, [](int rank, const braid::unique_id& id) {
//     braid::communicator c = braid::communicator::join(id, rank, 4);
//     ...                                                  // the rank's work
//     return 0;                                            // its exit status
//   });
//
// fork_ranks(n, fn) creates one unique_id, forks n children, and in child r calls fn(r, id); the
// child's exit status is fn's return value (an escaped exception prints its what() and exits 101,
// anything else thrown 102). The parent waits for all children, killing every survivor once
// `timeout` passes, and returns each child's status (exit code, or 128 + signal). Call it before the
// parent starts threads (a forked child has only the thread that forked).
#pragma once

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../host/rendezvous/unique_id.hpp"

namespace braid {

inline std::vector<int> fork_ranks(int n, const std::function<int(int rank, const unique_id& id)>& fn,
                                   std::chrono::seconds timeout = std::chrono::seconds(600)) {
  const unique_id id = unique_id::generate();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(static_cast<std::size_t>(n), -1);
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        code = fn(r, id);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 101;
      } catch (...) {
        code = 102;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  }
  std::vector<int> status(static_cast<std::size_t>(n), -1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (status[static_cast<std::size_t>(r)] != -1) continue;
      int st = 0;
      const pid_t got = ::waitpid(pids[static_cast<std::size_t>(r)], &st, WNOHANG);
      if (got == pids[static_cast<std::size_t>(r)]) {
        status[static_cast<std::size_t>(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r)
        if (status[static_cast<std::size_t>(r)] == -1) ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return status;
}

} // namespace braid
