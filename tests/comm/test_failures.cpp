// Failures never hang: a rank that throws, a rank that never arrives, abort() from another thread and
// a process that dies mid-collective each end every waiting rank's call with a specific error (peer
// error, timeout naming the rank, collective and sequence number, aborted) well within the deadline,
// and the failed communicator then refuses further calls with usage_error.
#include <doctest/doctest.h>

#include <braid/braid.hpp>
#include <support/fork_ranks.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <latch>
#include <mutex>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

namespace {

using braid::communicator;
using braid::errc;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count();
}

braid::options with_timeout(std::chrono::nanoseconds t) { return braid::options{}.with_timeout(t); }

struct boom : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Small collectives that every rank calls before the failure.
void warm_up(communicator& c, int calls) {
  std::vector<float> v(1000, 1.0f);
  for (int i = 0; i < calls; ++i) c.all_reduce(std::span<float>(v));
}

} // namespace

// ---- a rank that throws ------------------------------------------------------------------------------

TEST_CASE("failures: a rank that throws makes the others raise peer_error; run_threads rethrows the original") {
  for (int n : {2, 3, 4})
    for (int thrower : {0, n - 1})
      for (int before : {0, 3}) {
        INFO(n << " ranks, rank " << thrower << " throws after " << before << " calls");
        // A survivor that waits when the thrower leaves raises peer_error; one that enters only after
        // another survivor published that failure is refused at entry with usage_error.
        std::atomic<int> peer_errors{0}, refused_at_entry{0}, others{0};
        std::atomic<int> wrong_context{0}, refused_after{0};
        std::atomic<std::int64_t> slowest_ns{0};
        auto body = [&](communicator& c) {
          warm_up(c, before);
          if (c.rank() == thrower) throw boom("rank " + std::to_string(thrower) + " gave up");
          std::vector<float> v(1000, 1.0f);
          const auto t0 = clock_type::now();
          auto refused_again = [&] {
            try {
              c.all_reduce(std::span<float>(v));
            } catch (const braid::usage_error&) {
              ++refused_after;
            }
          };
          try {
            c.all_reduce(std::span<float>(v));
            ++others;
          } catch (const braid::peer_error& e) {
            ++peer_errors;
            const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count();
            std::int64_t cur = slowest_ns.load();
            while (ns > cur && !slowest_ns.compare_exchange_weak(cur, ns)) {}
            if (e.rank() != c.rank() || e.collective() != "all_reduce" ||
                e.sequence() != static_cast<std::uint64_t>(before) + 1)
              ++wrong_context;
            refused_again();
            throw; // a consequence of the thrower's failure: run_threads must not report this one
          } catch (const braid::usage_error& e) {
            ++refused_at_entry;
            if (e.rank() != c.rank() || e.collective() != "all_reduce") ++wrong_context;
            refused_again();
            // Not rethrown: run_threads would report it instead of the thrower's exception (see report).
          } catch (...) {
            ++others;
          }
        };
        bool got_original = false;
        try {
          braid::run_threads(n, body, with_timeout(10s));
        } catch (const boom& e) {
          got_original = std::string(e.what()) == "rank " + std::to_string(thrower) + " gave up";
        } catch (const std::exception& e) {
          FAIL_CHECK("run_threads rethrew " << e.what() << " instead of the thrower's exception");
        }
        CHECK(got_original);
        CHECK(peer_errors >= 1);
        CHECK(peer_errors + refused_at_entry == n - 1);
        CHECK(others == 0);
        CHECK(wrong_context == 0);
        CHECK(refused_after == n - 1);
        CHECK(static_cast<double>(slowest_ns.load()) * 1e-9 < 2.0); // detected, not timed out (10 s)
      }
}

TEST_CASE("failures: a rank whose bad call escapes: run_threads rethrows its invalid_argument, not the peers' errors") {
  auto body = [](communicator& c) {
    std::vector<float> v(64, 1.0f);
    if (c.rank() == 1) c.all_reduce<float>(nullptr, v.data(), v.size()); // throws invalid_argument
    c.all_reduce(std::span<float>(v));
  };
  CHECK_THROWS_AS(braid::run_threads(3, body, with_timeout(10s)), braid::invalid_argument);
}

// ---- a rank that never arrives: timeout ----------------------------------------------------------------

namespace {
struct timeout_outcome {
  std::mutex m;
  std::vector<int> code;              // errc per rank, 0 = returned normally
  std::vector<int> peer;
  std::vector<std::string> coll;
  std::vector<std::uint64_t> seq;
  std::vector<double> seconds;
  std::vector<int> next_code;         // errc of the following call, 0 = returned normally
  std::latch started;                 // every rank's thread runs before the first (short-deadline) call
  explicit timeout_outcome(int n)
      : code(n, 0), peer(n, -2), coll(n), seq(n, 0), seconds(n, 0), next_code(n, 0), started(n) {}
};

// Every rank but `late` calls the collective `what` once (after 2 good calls); `late` sleeps for
// `sleep` first and then calls it too.
void timeout_rank(communicator& c, int late, std::chrono::milliseconds sleep, const char* what, timeout_outcome& o) {
  const auto r = static_cast<std::size_t>(c.rank());
  o.started.arrive_and_wait(); // on a loaded machine a thread may start late: not what is tested here
  warm_up(c, 2);
  if (c.rank() == late) std::this_thread::sleep_for(sleep);
  std::vector<float> v(1000, 1.0f);
  auto call = [&] {
    if (std::string(what) == "all_reduce") c.all_reduce(std::span<float>(v));
    else if (std::string(what) == "barrier") c.barrier();
    else c.broadcast(std::span<float>(v), late); // the late rank is the root: everyone waits for it
  };
  const auto t0 = clock_type::now();
  try {
    call();
  } catch (const braid::error& e) {
    std::lock_guard<std::mutex> lock(o.m);
    o.code[r] = static_cast<int>(e.code());
    o.peer[r] = e.peer();
    o.coll[r] = std::string(e.collective());
    o.seq[r] = e.sequence();
    if (e.rank() != c.rank()) o.coll[r] += " (wrong rank " + std::to_string(e.rank()) + ")";
  }
  o.seconds[r] = seconds_since(t0);
  try {
    call();
  } catch (const braid::error& e) {
    o.next_code[r] = static_cast<int>(e.code());
  }
}
} // namespace

TEST_CASE("failures: a rank that never enters makes the others raise timeout_error naming rank, collective, sequence") {
  constexpr auto timeout = 300ms;
  for (const char* what : {"all_reduce", "barrier", "broadcast"}) {
    INFO("2 ranks, rank 1 late for " << std::string(what));
    timeout_outcome o(2);
    braid::run_threads(2, [&](communicator& c) { timeout_rank(c, 1, 1000ms, what, o); }, with_timeout(timeout));
    CHECK(o.code[0] == static_cast<int>(errc::timeout));
    CHECK(o.peer[0] == 1);
    CHECK(o.coll[0] == what);
    CHECK(o.seq[0] == 3);
    CHECK(o.seconds[0] >= 0.29);
    CHECK(o.seconds[0] < 0.3 + 1.0);
    CHECK(o.next_code[0] == static_cast<int>(errc::invalid_usage));
    // The failure was published long before the late rank arrives: its call is refused at entry.
    CHECK(o.code[1] == static_cast<int>(errc::invalid_usage));
    CHECK(o.next_code[1] == static_cast<int>(errc::invalid_usage));
    auto outcome = [](int code) { return std::string(code ? braid::to_string(static_cast<errc>(code)) : "returned normally"); };
    MESSAGE(std::string(what) << ": rank 0 timed out after " << o.seconds[0] * 1e3 << " ms (timeout 300 ms); the late rank's call "
                 << outcome(o.code[1]) << ", its next call " << outcome(o.next_code[1]));
  }
  {
    INFO("3 ranks, rank 2 late for all_reduce");
    timeout_outcome o(3);
    braid::run_threads(3, [&](communicator& c) { timeout_rank(c, 2, 1000ms, "all_reduce", o); }, with_timeout(timeout));
    int timeouts = 0;
    for (int r = 0; r < 2; ++r) {
      CHECK((o.code[r] == static_cast<int>(errc::timeout) || o.code[r] == static_cast<int>(errc::peer_failed)));
      CHECK(o.coll[r] == "all_reduce");
      CHECK(o.seq[r] == 3);
      CHECK(o.seconds[r] < 0.3 + 1.0);
      CHECK(o.next_code[r] == static_cast<int>(errc::invalid_usage));
      if (o.code[r] == static_cast<int>(errc::timeout)) {
        ++timeouts;
        CHECK(o.peer[r] == 2);
      }
    }
    CHECK(timeouts >= 1);
    CHECK(o.code[2] == static_cast<int>(errc::invalid_usage));
  }
}

// ---- abort() -----------------------------------------------------------------------------------------

TEST_CASE("failures: abort() from another rank's thread releases a blocked rank with aborted_error within 1 s") {
  std::atomic<std::int64_t> abort_ns{0}, error_ns{0};
  std::atomic<int> code{0}, next_code{0}, aborter_code{0};
  auto body = [&](communicator& c) {
    warm_up(c, 2);
    if (c.rank() == 1) {
      std::this_thread::sleep_for(200ms);
      abort_ns = now_ns();
      c.abort();
      std::this_thread::sleep_for(500ms); // stay: rank 0 must see the abort, not this rank leaving
      std::vector<float> v(1000, 1.0f);
      try {
        c.all_reduce(std::span<float>(v)); // rank 0's input is there: only the abort can stop this
      } catch (const braid::error& e) {
        aborter_code = static_cast<int>(e.code());
      }
      return;
    }
    std::vector<float> v(1000, 1.0f);
    try {
      c.all_reduce(std::span<float>(v));
    } catch (const braid::error& e) {
      error_ns = now_ns();
      code = static_cast<int>(e.code());
    }
    try {
      c.all_reduce(std::span<float>(v));
    } catch (const braid::error& e) {
      next_code = static_cast<int>(e.code());
    }
  };
  braid::run_threads(2, body, with_timeout(30s));
  CHECK(code == static_cast<int>(errc::aborted));
  CHECK(next_code == static_cast<int>(errc::invalid_usage));
  CHECK(aborter_code == static_cast<int>(errc::invalid_usage)); // the aborting rank refuses calls too
  const double latency = static_cast<double>(error_ns - abort_ns) * 1e-9;
  CHECK(latency < 1.0);
  MESSAGE("abort() released the blocked rank after " << latency * 1e3 << " ms");
}

TEST_CASE("failures: after abort() a single rank refuses every call with usage_error") {
  braid::run_threads(1, [](communicator& c) {
    std::vector<float> v(100, 1.0f);
    c.all_reduce(std::span<float>(v));
    c.abort();
    CHECK_THROWS_AS(c.all_reduce(std::span<float>(v)), braid::usage_error);
    CHECK_THROWS_AS(c.barrier(), braid::usage_error);
    CHECK_THROWS_AS(c.broadcast(std::span<float>(v), 0), braid::usage_error);
    CHECK(v[0] == 1.0f);
  }, with_timeout(10s));
}

TEST_CASE("failures: abort() from a thread that is no rank releases every blocked rank") {
  constexpr int n = 3;
  std::atomic<communicator*> target{nullptr};
  std::atomic<std::int64_t> abort_ns{0}, slowest_ns{0};
  std::atomic<int> aborted{0}, other{0}, refused{0};
  std::atomic<bool> released{false};
  auto body = [&](communicator& c) {
    warm_up(c, 1);
    if (c.rank() == n - 1) { // stays out of the call; waits until the others were released
      while (!released) std::this_thread::sleep_for(1ms);
      return;
    }
    if (c.rank() == 0) target = &c;
    std::vector<float> v(1000, 1.0f);
    try {
      c.all_reduce(std::span<float>(v));
      ++other;
    } catch (const braid::aborted_error& e) {
      const std::int64_t ns = now_ns() - abort_ns.load();
      std::int64_t cur = slowest_ns.load();
      while (ns > cur && !slowest_ns.compare_exchange_weak(cur, ns)) {}
      if (e.collective() == "all_reduce" && e.rank() == c.rank()) ++aborted;
    } catch (...) {
      ++other;
    }
    try {
      c.barrier();
    } catch (const braid::usage_error&) {
      ++refused;
    }
  };
  std::thread helper([&] {
    while (!target) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(200ms); // both ranks are blocked in all_reduce by now
    abort_ns = now_ns();
    target.load()->abort();
    // Let rank n-1 leave only once both blocked ranks had time to see the abort word.
    std::this_thread::sleep_for(1000ms);
    released = true;
  });
  braid::run_threads(n, body, with_timeout(30s));
  helper.join();
  CHECK(aborted == n - 1);
  CHECK(other == 0);
  CHECK(refused == n - 1);
  const double latency = static_cast<double>(slowest_ns.load()) * 1e-9;
  CHECK(latency < 1.0);
  MESSAGE("abort() from a helper thread released both blocked ranks within " << latency * 1e3 << " ms");
}

// ---- a process that dies --------------------------------------------------------------------------------

namespace {
constexpr int max_ranks = 8;
struct death_record {
  std::atomic<std::int64_t> died_ns{0};
  std::int64_t error_ns[max_ranks] = {};
  int code[max_ranks] = {};
  int peer[max_ranks] = {};
  int next_code[max_ranks] = {};
  int calls[max_ranks] = {};
};

template <class T> T* shared_object() {
  void* p = ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return new (p) T{};
}
template <class T> void release_shared(T* p) { ::munmap(static_cast<void*>(p), sizeof(T)); }

enum class death { exit_mid_call, sigkill_mid_call, exit_between_calls };

constexpr auto death_timeout = 5s;

// Runs n ranks; `victim` dies 150 ms after the first barrier (from a helper thread while its main
// thread runs large all_reduces, or between calls); the survivors run all_reduces until one fails.
// Returns the slowest survivor's detection time in seconds (from the victim's death to its error).
double run_death(int n, int victim, death how) {
  death_record* rec = shared_object<death_record>();
  const auto status = braid::testing::fork_ranks(n, [&](int rank, const braid::unique_id& id) {
    communicator c = communicator::join(id, rank, n, with_timeout(death_timeout));
    c.barrier();
    std::vector<float> v(std::size_t{1} << 20, 1.0f); // 4 MiB: each call takes a while
    if (rank == victim) {
      if (how == death::exit_between_calls) {
        std::this_thread::sleep_for(150ms);
        rec->died_ns = now_ns();
        ::_exit(3);
      }
      std::thread killer([&] {
        std::this_thread::sleep_for(150ms);
        rec->died_ns = now_ns();
        if (how == death::sigkill_mid_call) ::kill(::getpid(), SIGKILL);
        ::_exit(3);
      });
      killer.detach();
      for (;;) c.all_reduce(std::span<float>(v));
    }
    const auto give_up = clock_type::now() + 20s;
    try {
      while (clock_type::now() < give_up) {
        c.all_reduce(std::span<float>(v));
        ++rec->calls[rank];
      }
    } catch (const braid::error& e) {
      rec->error_ns[rank] = now_ns();
      rec->code[rank] = static_cast<int>(e.code());
      rec->peer[rank] = e.peer();
    }
    try {
      c.all_reduce(std::span<float>(v));
    } catch (const braid::error& e) {
      rec->next_code[rank] = static_cast<int>(e.code());
    }
    return 0;
  }, 60s);
  double slowest = 0;
  bool someone_names_victim = false;
  for (int r = 0; r < n; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    if (r == victim) {
      CHECK(status[ur] == (how == death::sigkill_mid_call ? 128 + SIGKILL : 3));
      continue;
    }
    CHECK(status[ur] == 0);
    // peer_error; or, for a survivor that finished the call the victim died in and entered the next
    // one after another survivor had published the death, usage_error at entry.
    CHECK((rec->code[r] == static_cast<int>(errc::peer_failed) || rec->code[r] == static_cast<int>(errc::invalid_usage)));
    CHECK(rec->next_code[r] == static_cast<int>(errc::invalid_usage));
    someone_names_victim = someone_names_victim || (rec->code[r] == static_cast<int>(errc::peer_failed) && rec->peer[r] == victim);
    const double d = static_cast<double>(rec->error_ns[r] - rec->died_ns.load()) * 1e-9;
    slowest = std::max(slowest, d);
  }
  CHECK(someone_names_victim);
  CHECK(slowest < std::chrono::duration<double>(death_timeout).count() + 2.0);
  release_shared(rec);
  return slowest;
}
} // namespace

TEST_CASE("failures: a process that dies makes every survivor raise peer_error within the timeout") {
  struct scenario {
    const char* name;
    int n, victim;
    death how;
  };
  const scenario scenarios[] = {
      {"3 ranks, rank 2 _exit()s mid all_reduce", 3, 2, death::exit_mid_call},
      {"3 ranks, rank 1 SIGKILLs itself mid all_reduce", 3, 1, death::sigkill_mid_call},
      {"4 ranks, rank 0 (the rendezvous root) _exit()s mid all_reduce", 4, 0, death::exit_mid_call},
      {"2 ranks, rank 1 _exit()s between calls", 2, 1, death::exit_between_calls},
      {"4 ranks, rank 3 SIGKILLs itself mid all_reduce", 4, 3, death::sigkill_mid_call},
  };
  for (const auto& s : scenarios) {
    INFO(std::string(s.name));
    const double t = run_death(s.n, s.victim, s.how);
    MESSAGE(std::string(s.name) << ": slowest survivor detected the death after " << t * 1e3 << " ms (timeout "
                   << std::chrono::duration<double>(death_timeout).count() << " s)");
  }
}


// What each of 3 process ranks saw when its alloc (call 2) raised; filled by alloc_after_rank1_goes.
struct alloc_record {
  int code[3] = {};
  int rank[3] = {};
  int peer[3] = {};
  int sys_errno[3] = {};
  std::uint64_t seq[3] = {};
  char collective[3][16] = {};
  char what[3][512] = {};
};

// 3 process ranks meet at a barrier (call 1); then rank 1 leaves (_exit(3), after close() if `close`),
// and ranks 0 and 2 call alloc, recording in `rec` the error it raised. Returns the exit statuses.
std::vector<int> alloc_after_rank1_goes(alloc_record* rec, bool close) {
  return braid::testing::fork_ranks(3, [&](int rank, const braid::unique_id& id) {
    communicator c = communicator::join(id, rank, 3, with_timeout(5s));
    c.barrier(); // call 1
    if (rank == 1) {
      if (close) c.close();
      ::_exit(3);
    }
    try {
      auto b = c.alloc<float>(1 << 16); // call 2
      (void)b;
    } catch (const braid::error& e) {
      const auto r = static_cast<std::size_t>(rank);
      rec->code[r] = static_cast<int>(e.code());
      rec->rank[r] = e.rank();
      rec->peer[r] = e.peer();
      rec->sys_errno[r] = e.sys_errno();
      rec->seq[r] = e.sequence();
      std::snprintf(rec->collective[r], sizeof rec->collective[r], "%.*s", static_cast<int>(e.collective().size()),
                    e.collective().data());
      std::snprintf(rec->what[r], sizeof rec->what[r], "%s", e.what());
    }
    return 0;
  }, 60s);
}

// Runs alloc_after_rank1_goes(close) `trials` times. Each time: rank 1 exited with 3 and the survivors
// (ranks 0 and 2) with 0, and check(trial, r, rec, what) judges what survivor r raised (`what`: its
// message). INFO names the trial, the rank, its message and errno in every failure.
template <class F> void check_survivors(int trials, bool close, F check) {
  for (int trial = 0; trial < trials; ++trial) {
    INFO("trial " << trial);
    alloc_record* rec = shared_object<alloc_record>();
    const auto status = alloc_after_rank1_goes(rec, close);
    CHECK(status[1] == 3);
    for (int r : {0, 2}) {
      const auto ur = static_cast<std::size_t>(r);
      const std::string what(rec->what[ur]);
      INFO("rank " << r << ": " << what << " (errno " << rec->sys_errno[ur] << ")");
      CHECK(status[ur] == 0);
      check(trial, r, *rec, what);
    }
    release_shared(rec);
  }
}

// Issue 18: a peer that died before alloc. Over the sockets alloc uses (a star around rank 0), a dead
// peer shows up as end of file, ECONNRESET or EPIPE, depending on what was unread when its process
// went, and only on the socket to it: rank 2 reads from rank 0 alone, and sees rank 0's end go when
// rank 0, having seen rank 1's go, fails and exits. Whatever the socket said and whoever's socket it
// was, each survivor must find out which rank died and raise peer_error naming it (guarantees.md,
// process startup and alloc): peer() == 1, itself, alloc #2. Or rank 2 reaches alloc only after
// rank 0 published its failure, and alloc's entry check refuses it with usage_error quoting rank 0's
// error (api.md, entry check): accepted too, and that quote must name rank 1 as the rank that died.
TEST_CASE("failures: a process that dies before alloc: each survivor raises peer_error naming the dead rank") {
  check_survivors(5, false, [](int trial, int r, const alloc_record& rec, const std::string& what) {
    const auto ur = static_cast<std::size_t>(r);
    // Names rank 1 as the rank that died, whichever rank's socket showed it.
    CHECK(what.find("rank 1 (pid ") != std::string::npos);
    CHECK(what.find(") died") != std::string::npos);
    if (r == 2 && rec.code[ur] == static_cast<int>(errc::invalid_usage)) {
      CHECK(what.find("refuses further calls") != std::string::npos);
      MESSAGE("trial " << trial << ", rank 2 (entered after rank 0's failure): " << what);
      return;
    }
    CHECK(rec.code[ur] == static_cast<int>(errc::peer_failed));
    CHECK(rec.rank[ur] == r);
    CHECK(rec.peer[ur] == 1);
    CHECK(std::string(rec.collective[ur]) == "alloc");
    CHECK(rec.seq[ur] == 2);
    MESSAGE("trial " << trial << ", rank " << r << ": " << what);
  });
}

// The other side of the same search: a rank that closed its communicator before alloc did not die, and
// is not reported as dead. Rank 0 reads its end of file and raises protocol_error naming it (it closed
// its communicator); rank 2 raises rank 0's published failure (peer_error naming rank 0, quoting it) or,
// entering after it was published, usage_error quoting it.
TEST_CASE("failures: a process that closes its communicator before alloc is not reported as dead") {
  check_survivors(3, true, [](int trial, int r, const alloc_record& rec, const std::string& what) {
    const auto ur = static_cast<std::size_t>(r);
    CHECK(what.find("rank 1 closed the connection") != std::string::npos);
    CHECK(what.find("died during alloc") == std::string::npos);
    if (r == 0) {
      CHECK(rec.code[ur] == static_cast<int>(errc::protocol));
      CHECK(rec.peer[ur] == 1);
    } else if (rec.code[ur] == static_cast<int>(errc::peer_failed)) {
      CHECK(rec.peer[ur] == 0);
      CHECK(what.find("rank 0 failed") != std::string::npos);
    } else {
      CHECK(rec.code[ur] == static_cast<int>(errc::invalid_usage));
    }
    MESSAGE("trial " << trial << ", rank " << r << ": " << what);
  });
}

TEST_CASE("run_threads rethrows the root cause, not a later rank's refusal") {
  using namespace std::chrono_literals;
  CHECK_THROWS_AS(braid::run_threads(
                      3,
                      [](braid::communicator& c) {
                        if (c.rank() == 1) throw boom("rank 1 gave up");
                        if (c.rank() == 0) std::this_thread::sleep_for(200ms);
                        std::vector<float> v(16, 1.0f);
                        c.all_reduce(std::span<float>(v), braid::sum<>{}, braid::call_options{braid::algo::ring});
                      },
                      braid::options{}.with_timeout(10s)),
                  boom);
}
