// braid-detect — how long survivors take to fail when a peer dies, freezes or throws, and how long
// abort() takes to release blocked calls; measured over many trials, with a watchdog so that a hang is
// counted (and ends the trial) instead of hanging this program.
//
// Usage: braid-detect [--trials N] [--timeout SECONDS] [--case NAME]...
//   cases: kill (processes, SIGKILL mid all_reduce), stop (processes, SIGSTOP mid all_reduce: a
//   timeout error is expected), throw (threads, a rank throws while the others are in all_reduce),
//   abort-threads, abort-processes (abort() from a helper thread while ranks are blocked).
// The deadline is --timeout (default: BRAID_TIMEOUT, else 2 s). Rank counts cycle 2, 3, 4 and the
// failing rank cycles through every rank. A trial passes when every survivor raised an error within
// the deadline + 2 s (abort: within 1 s) whose text names the failing rank, of the expected kind.
// Prints one line per trial and min / median / max per case; exit status 0 when every trial passed.
#include <braid/braid.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

std::int64_t now_ns() { // CLOCK_MONOTONIC: comparable across the processes of one host
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count();
}

constexpr int max_ranks = 8;

struct rank_result {
  std::int64_t error_ns = 0; // 0: no error seen
  int code = 0;
  int peer = -1;
  bool names_victim = false;
  char message[240] = {};
};

struct record { // shared by the forked ranks and this process
  std::atomic<std::int64_t> event_ns{0}; // when the victim died / froze / threw / abort() was called
  rank_result rank[max_ranks];
};

bool names_rank(const std::string& what, int victim) {
  return std::regex_search(what, std::regex("rank " + std::to_string(victim) + "([^0-9]|$)"));
}

void store(rank_result& out, const braid::error& e, int victim) {
  out.error_ns = now_ns();
  out.code = static_cast<int>(e.code());
  out.peer = e.peer();
  // The survivor's own rank appears in the context prefix; it is never the victim.
  out.names_victim = names_rank(e.what(), victim);
  std::snprintf(out.message, sizeof out.message, "%s", e.what());
}

struct trial {
  int n = 0, victim = 0;
  bool hang = false, passed = false;
  double seconds = 0; // the slowest survivor's time from the event to its error
  std::string note;
  std::string example; // one survivor's error text
};

enum class how { kill, stop, thrown, abort_threads, abort_processes };

const char* case_name(how h) {
  switch (h) {
  case how::kill: return "kill";
  case how::stop: return "stop";
  case how::thrown: return "throw";
  case how::abort_threads: return "abort-threads";
  case how::abort_processes: return "abort-processes";
  }
  return "?";
}

void judge(trial& t, record& rec, how h, std::chrono::nanoseconds timeout) {
  const double limit = h == how::abort_threads || h == how::abort_processes
                           ? 1.0
                           : std::chrono::duration<double>(timeout).count() + 2.0;
  t.passed = !t.hang;
  for (int r = 0; r < t.n; ++r) {
    if (r == t.victim && h != how::abort_threads && h != how::abort_processes) continue;
    if (r == t.victim) continue; // abort: the victim is the rank that stays out of the call
    const rank_result& x = rec.rank[r];
    if (!x.error_ns) {
      t.passed = false;
      t.note += " rank " + std::to_string(r) + ": no error;";
      continue;
    }
    const double s = static_cast<double>(x.error_ns - rec.event_ns.load()) * 1e-9;
    if (t.example.empty()) t.example = x.message;
    t.seconds = std::max(t.seconds, s);
    // A survivor that was between calls when the failure was published is refused at its next call's
    // entry: invalid_usage, whose text carries the cause (docs/guarantees.md). It counts when it names
    // the failing rank like the others.
    const bool refused = x.code == static_cast<int>(braid::errc::invalid_usage);
    bool kind_ok = false;
    switch (h) {
    case how::kill:
    case how::thrown: kind_ok = x.code == static_cast<int>(braid::errc::peer_failed) || refused; break;
    case how::stop:
      kind_ok = x.code == static_cast<int>(braid::errc::timeout) || x.code == static_cast<int>(braid::errc::peer_failed) || refused;
      break;
    default: kind_ok = x.code == static_cast<int>(braid::errc::aborted) || (refused && std::string_view(x.message).find("abort") != std::string_view::npos); break;
    }
    // abort(): the error names the rank that aborted (rank 0's communicator here).
    const bool names = (h == how::abort_threads || h == how::abort_processes) ? true : x.names_victim;
    if (!kind_ok || !names || s > limit) {
      t.passed = false;
      t.note += " rank " + std::to_string(r) + ": " + x.message + (s > limit ? " (too late)" : "") + ";";
    }
  }
  if (t.hang) t.note += " HANG (watchdog ended the trial);";
}

braid::options opts_with(std::chrono::nanoseconds timeout) {
  braid::options o = braid::options::from_env();
  o.timeout = timeout;
  return o;
}

// ---- processes -----------------------------------------------------------------------------------------

trial run_processes(how h, int n, int victim, std::chrono::nanoseconds timeout, std::uint64_t salt) {
  trial t;
  t.n = n;
  t.victim = victim;
  void* mem = ::mmap(nullptr, sizeof(record), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) { std::perror("mmap"); std::exit(2); }
  record& rec = *new (mem) record{};
  const braid::unique_id id = braid::unique_id::generate();
  const auto delay = std::chrono::milliseconds(100 + static_cast<int>(salt % 200)); // into the call loop
  std::fflush(stdout);
  std::vector<pid_t> pids(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    pids[static_cast<std::size_t>(r)] = ::fork();
    if (pids[static_cast<std::size_t>(r)] != 0) continue;
    int code = 0;
    try {
      braid::communicator c = braid::communicator::join(id, r, n, opts_with(timeout));
      c.barrier();
      std::vector<float> v(std::size_t{1} << 20, 1.0f); // 4 MiB per call: the failure lands mid-call
      const bool abort_case = h == how::abort_processes;
      if (r == victim && !abort_case) {
        std::thread([&] {
          std::this_thread::sleep_for(delay);
          rec.event_ns = now_ns();
          ::kill(::getpid(), h == how::kill ? SIGKILL : SIGSTOP);
        }).detach();
        for (;;) c.all_reduce(std::span<float>(v));
      }
      if (abort_case && r == victim) { // stays out of the call until everyone was released
        std::this_thread::sleep_for(delay + 1500ms);
        ::_exit(0);
      }
      std::thread aborter;
      if (abort_case && r == (victim + 1) % n)
        aborter = std::thread([&] {
          std::this_thread::sleep_for(delay);
          rec.event_ns = now_ns();
          c.abort();
        });
      try {
        for (;;) c.all_reduce(std::span<float>(v));
      } catch (const braid::error& e) {
        store(rec.rank[r], e, victim);
      }
      if (aborter.joinable()) aborter.join();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: unexpected: %s\n", r, e.what());
      code = 101;
    }
    std::fflush(stderr);
    ::_exit(code);
  }
  const auto give_up = clock_type::now() + timeout + 20s;
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  auto survivors_left = [&] {
    for (int r = 0; r < n; ++r)
      if (!done[static_cast<std::size_t>(r)] && (r != victim || h == how::abort_processes)) return true;
    return false;
  };
  while (survivors_left()) {
    for (int r = 0; r < n; ++r) {
      int st = 0;
      if (!done[static_cast<std::size_t>(r)] && ::waitpid(pids[static_cast<std::size_t>(r)], &st, WNOHANG) == pids[static_cast<std::size_t>(r)]) {
        done[static_cast<std::size_t>(r)] = true;
        if (r != victim && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) t.note += " rank " + std::to_string(r) + " exited badly;";
      }
    }
    if (clock_type::now() > give_up) {
      t.hang = true;
      break;
    }
    std::this_thread::sleep_for(1ms);
  }
  for (int r = 0; r < n; ++r)
    if (!done[static_cast<std::size_t>(r)]) {
      ::kill(pids[static_cast<std::size_t>(r)], SIGKILL); // the stopped victim, or anything left of a hang
      ::waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
    }
  judge(t, rec, h, timeout);
  if (!t.note.empty() && t.note.find("exited badly") != std::string::npos) t.passed = false;
  ::munmap(mem, sizeof(record));
  return t;
}

// ---- threads -------------------------------------------------------------------------------------------

struct boom : std::runtime_error {
  using std::runtime_error::runtime_error;
};

trial run_threads_case(how h, int n, int victim, std::chrono::nanoseconds timeout, std::uint64_t salt) {
  trial t;
  t.n = n;
  t.victim = victim;
  record rec;
  const auto delay = std::chrono::milliseconds(100 + static_cast<int>(salt % 200));
  std::atomic<bool> finished{false};
  std::thread watchdog([&] { // a hang ends this program visibly rather than silently
    const auto give_up = clock_type::now() + timeout + 20s;
    while (!finished && clock_type::now() < give_up) std::this_thread::sleep_for(10ms);
    if (!finished) {
      std::printf("braid-detect: HANG in %s, %d ranks, victim %d: watchdog exits\n", case_name(h), n, victim);
      std::fflush(stdout);
      std::_Exit(3);
    }
  });
  std::atomic<braid::communicator*> target{nullptr};
  std::atomic<bool> released{false};
  std::thread aborter;
  if (h == how::abort_threads)
    aborter = std::thread([&] {
      while (!target) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(delay);
      rec.event_ns = now_ns();
      target.load()->abort();
    });
  try {
    braid::run_threads(n, [&](braid::communicator& c) {
      std::vector<float> v(std::size_t{1} << 18, 1.0f);
      c.barrier();
      const int r = c.rank();
      if (r == victim && h == how::thrown) {
        const auto until = clock_type::now() + delay;
        while (clock_type::now() < until) c.all_reduce(std::span<float>(v)); // peers spend time in calls
        rec.event_ns = now_ns();
        throw boom("rank " + std::to_string(r) + " threw on purpose");
      }
      if (r == victim && h == how::abort_threads) { // stays out of the call until the others are released
        while (!released) std::this_thread::sleep_for(1ms);
        return;
      }
      if (h == how::abort_threads && r == (victim + 1) % n) target = &c;
      try {
        for (;;) c.all_reduce(std::span<float>(v));
      } catch (const braid::error& e) {
        store(rec.rank[r], e, victim);
      }
      if (h == how::abort_threads) {
        bool all = true;
        for (int q = 0; q < n; ++q)
          if (q != victim && !rec.rank[q].error_ns) all = false;
        if (all) released = true;
      }
    }, opts_with(timeout));
  } catch (const boom&) {
    // the thrower's own exception, rethrown by run_threads as the root cause
  } catch (const std::exception& e) {
    t.note += std::string(" run_threads rethrew ") + e.what() + ";";
  }
  if (aborter.joinable()) aborter.join();
  finished = true;
  watchdog.join();
  judge(t, rec, h, timeout);
  if (t.note.find("rethrew") != std::string::npos) t.passed = false;
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

} // namespace

int main(int argc, char** argv) {
  int trials = 20;
  std::chrono::nanoseconds timeout = 2s;
  if (const char* e = std::getenv("BRAID_TIMEOUT"); e && *e) timeout = braid::options::parse_duration(e);
  std::vector<how> cases;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--trials" && i + 1 < argc) trials = std::max(1, std::atoi(argv[++i]));
    else if (a == "--timeout" && i + 1 < argc) timeout = braid::options::parse_duration(argv[++i]);
    else if (a == "--case" && i + 1 < argc) {
      const std::string_view c = argv[++i];
      bool found = false;
      for (how h : {how::kill, how::stop, how::thrown, how::abort_threads, how::abort_processes})
        if (c == case_name(h)) { cases.push_back(h); found = true; }
      if (!found) { std::fprintf(stderr, "braid-detect: unknown case '%s'\n", argv[i]); return 2; }
    } else {
      std::fprintf(stderr, "usage: braid-detect [--trials N] [--timeout S] [--case kill|stop|throw|abort-threads|abort-processes]...\n");
      return 2;
    }
  }
  if (cases.empty()) cases = {how::kill, how::stop, how::thrown, how::abort_threads, how::abort_processes};
  const double tsec = std::chrono::duration<double>(timeout).count();
  std::printf("braid-detect: %d trials per case, deadline (options::timeout) %.3f s; rank counts 2,3,4; failing rank cycles\n",
              trials, tsec);
  struct summary { how h; std::vector<double> s; int passed = 0, hangs = 0, n = 0; std::string example; };
  std::vector<summary> sums;
  bool ok = true;
  for (how h : cases) {
    summary sm{h, {}, 0, 0, 0, {}};
    for (int k = 0; k < trials; ++k) {
      const int n = 2 + k % 3;
      const int victim = (k / 3) % n;
      const std::uint64_t salt = static_cast<std::uint64_t>(k) * 7919u;
      const trial t = (h == how::thrown || h == how::abort_threads) ? run_threads_case(h, n, victim, timeout, salt)
                                                                     : run_processes(h, n, victim, timeout, salt);
      std::printf("%-16s trial %2d: %d ranks, failing rank %d: slowest survivor %8.1f ms  %s%s\n", case_name(h), k + 1, n,
                  victim, t.seconds * 1e3, t.passed ? "ok" : "FAILED", t.note.c_str());
      std::fflush(stdout);
      sm.s.push_back(t.seconds);
      if (sm.example.empty() || k == 4) sm.example = "(" + std::to_string(n) + " ranks, failing rank " + std::to_string(victim) + ") " + t.example;
      sm.passed += t.passed;
      sm.hangs += t.hang;
      ++sm.n;
      ok = ok && t.passed;
    }
    sums.push_back(sm);
  }
  std::printf("\n%-16s %6s %6s %6s %10s %10s %10s  %s\n", "case", "trials", "passed", "hangs", "min ms", "median ms", "max ms",
              "bound");
  for (const auto& sm : sums) {
    const bool ab = sm.h == how::abort_threads || sm.h == how::abort_processes;
    std::printf("%-16s %6d %6d %6d %10.1f %10.1f %10.1f  %s\n", case_name(sm.h), sm.n, sm.passed, sm.hangs,
                *std::min_element(sm.s.begin(), sm.s.end()) * 1e3, median(sm.s) * 1e3,
                *std::max_element(sm.s.begin(), sm.s.end()) * 1e3, ab ? "1 s" : (std::to_string(static_cast<int>(tsec * 1e3 + 2000)) + " ms").c_str());
  }
  std::printf("\nexample errors (one survivor's what()):\n");
  for (const auto& sm : sums) std::printf("  %-16s %s\n", case_name(sm.h), sm.example.c_str());
  std::printf("braid-detect: %s\n", ok ? "every trial passed" : "SOME TRIALS FAILED");
  return ok ? 0 : 1;
}
