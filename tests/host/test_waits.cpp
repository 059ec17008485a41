// How host ranks wait (host/sleep.hpp): a rank that waits long sleeps in the kernel
// (little CPU, few wake-ups) and is woken by the post it waits for, not by its periodic recheck; with a
// 1 us spin every wait that outlasts it goes to sleep, and a ping-pong of barriers, all_reduces and send/recv between
// threads and between processes still runs at wake-up speed, which it could not if a wake were lost
// (each lost wake costs the 2 ms recheck); a sleeping rank raises soon after a peer aborts or leaves.
// A waiter that shares its CPU with another rank yields instead of spinning, whichever rank it waits
// for: asserted with four processes bound two to a CPU (per-call time); beside a busy core it is
// measured by bench/vs-mpi.sh, not asserted here.
#include <doctest/doctest.h>

#include <braid/braid.hpp>
#include <support/fork_ranks.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

namespace {

using braid::communicator;
using braid::errc;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

long voluntary_switches() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_nvcsw;
}

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// What one rank saw while waiting 300 ms for its peer in a barrier.
struct long_wait {
  double wall = 0, cpu = 0;
  long switches = 0;
};

long_wait wait_for_late_peer(communicator& c) {
  long_wait w;
  if (c.rank() == 0) {
    std::this_thread::sleep_for(300ms);
    c.barrier();
    return w;
  }
  const auto t0 = clock_type::now();
  const double cpu0 = thread_cpu_seconds();
  const long sw0 = voluntary_switches();
  c.barrier();
  w.wall = seconds_since(t0);
  w.cpu = thread_cpu_seconds() - cpu0;
  w.switches = voluntary_switches() - sw0;
  return w;
}

// The spinning before sleep is 200 us by default and a sleeper rechecks every 2 ms: a 300 ms wait costs
// the spin plus about 150 short wake-ups. The naps this replaced (after 4096 sched_yields, 50 us naps)
// cost about 6000 wake-ups and tens of ms of CPU.
void check_long_wait(const long_wait& w, const char* what) {
  MESSAGE(std::string(what) << ": waited " << w.wall * 1e3 << " ms, " << w.cpu * 1e3 << " ms of CPU, " << w.switches
               << " voluntary context switches");
  CHECK(w.wall > 0.25);
  // Without membarrier(2) (old kernel, seccomp) a sleeper sleeps at most 50 us at a time: about 6,000
  // wake-ups per 300 ms, by design. Say so instead of failing, and instead of passing silently.
  if (!braid::host::membarrier_ready()) {
    MESSAGE("membarrier(2) unavailable here: sleeps are capped at 50 us; CPU and wake-up bounds not checked");
    return;
  }
  CHECK(w.cpu < 0.03);
  CHECK(w.switches < 1000);
}

// Busy for d (a rank that arrives late, without sleeping itself).
void busy_for(std::chrono::microseconds d) {
  const auto end = clock_type::now() + d;
  while (clock_type::now() < end) {
  }
}

// n calls of each kind; before call i, rank i % 2 is busy for 100 us, so the other rank's first wait in
// the call outlasts its 1 us spin and sleeps: each rank sleeps in half the calls at least. (30 us was
// too short on a 2-vCPU Xeon VM: a wait that short often ended while the rank was still
// going to sleep, 519-564 switches of the 600 this counts on, old and new waits alike; with 100 us,
// 1150-1200.)
// Returns seconds per call; also counts this thread's voluntary context switches into *switches.
template <class F> double ping_pong(communicator& c, int calls, F&& call, long* switches) {
  c.barrier();
  const long sw0 = voluntary_switches();
  const auto t0 = clock_type::now();
  for (int i = 0; i < calls; ++i) {
    if (i % 2 == c.rank()) busy_for(100us);
    call(i);
  }
  const double s = seconds_since(t0) / calls;
  *switches = voluntary_switches() - sw0;
  return s;
}

struct pong_result {
  double barrier_s = 0, reduce_s = 0, p2p_s = 0, big_s = 0; // big_s: mean seconds per 3 MiB send/recv
  long barrier_sw = 0, reduce_sw = 0, p2p_sw = 0;
  bool values_ok = true;
};

constexpr int kPongCalls = 400; // of each kind

pong_result run_pongs(communicator& c) {
  pong_result res;
  const int calls = kPongCalls;
  res.barrier_s = ping_pong(c, calls, [&](int) { c.barrier(); }, &res.barrier_sw);
  std::vector<float> v(256);
  res.reduce_s = ping_pong(c, calls, [&](int i) {
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(c.rank() + i + static_cast<int>(k));
    c.all_reduce(std::span<float>(v));
    for (std::size_t k = 0; k < v.size(); ++k)
      if (v[k] != static_cast<float>(1 + 2 * (i + static_cast<int>(k)))) res.values_ok = false;
  }, &res.reduce_sw);
  // send/recv: a small message each way, then (every 50th) one of 3 MiB, three times the 1 MiB send
  // buffer, so that the sender waits for the receiver to consume pieces (the second line's words).
  std::vector<std::uint8_t> big(3u << 20), got(3u << 20);
  double big_total = 0;
  int bigs = 0;
  res.p2p_s = ping_pong(c, calls, [&](int i) {
    std::uint64_t x = static_cast<std::uint64_t>(i) * 3 + static_cast<std::uint64_t>(c.rank()), y = 0;
    const int peer = 1 - c.rank();
    // The big message's bytes are written before the small exchange, outside its timing: the fill takes
    // 2.4 ms on the 2-vCPU Xeon VM, several times the transfer (0.5 ms), and the receiver's clock would
    // count it as waiting.
    if (i % 50 == 0 && c.rank() == 0)
      for (std::size_t k = 0; k < big.size(); ++k) big[k] = static_cast<std::uint8_t>(k * 7 + static_cast<std::size_t>(i));
    if (c.rank() == 0) {
      c.send(&x, 1, peer);
      c.recv(&y, 1, peer);
    } else {
      c.recv(&y, 1, peer);
      c.send(&x, 1, peer);
    }
    if (y != static_cast<std::uint64_t>(i) * 3 + static_cast<std::uint64_t>(peer)) res.values_ok = false;
    if (i % 50 == 0) {
      const auto tb = clock_type::now();
      if (c.rank() == 0) {
        c.send(big.data(), big.size(), peer);
      } else {
        c.recv(got.data(), got.size(), peer);
        for (std::size_t k = 0; k < got.size(); k += 4099)
          if (got[k] != static_cast<std::uint8_t>(k * 7 + static_cast<std::size_t>(i))) res.values_ok = false;
      }
      big_total += seconds_since(tb);
      ++bigs;
    }
  }, &res.p2p_sw);
  res.big_s = big_total / bigs;
  return res;
}

// A lost wake costs the sleeper its 2 ms recheck. Each ping-pong runs twice in one test: with a 1 us spin
// (a rank that waits sleeps, and the post must wake it) and with a 50 ms spin (no rank sleeps: the
// machine's own speed for the same calls). The sleeping run may be slower by its wake-ups, not by lost
// wakes. Per sleep of this rank (its voluntary context switches; the peer sleeps about as often, and
// both ranks' wakes delay the ping-pong), the extra time must stay under 1 ms: about 2 x 2 ms if every
// wake were lost, 0.1-0.3 ms measured on the 2-vCPU Xeon VM. A 3 MiB send/recv goes through the 1 MiB
// send buffer in 6 pieces with the sender asleep for each: under 5 ms more per message (lost piece
// wakes would cost about 2 ms each). At least 150 switches (600 if this rank slept in every call in
// which it was early; 0 in the awake run) show the waits did sleep: without them this test would prove
// nothing about waking. Absolute bounds failed on a slow CI machine where the calls themselves took
// most of the margin; a loaded machine also lets a waiter miss its chance to sleep (the peer posts
// before it runs again), which is why the switches are counted, not assumed.
long sleeps_of(const pong_result& asleep) { return asleep.barrier_sw + asleep.reduce_sw + asleep.p2p_sw; }

// Seconds the sleeping run took beyond the awake one, per context switch of this rank.
double extra_per_sleep(const pong_result& asleep, const pong_result& awake) {
  const double extra = kPongCalls * ((asleep.barrier_s - awake.barrier_s) + (asleep.reduce_s - awake.reduce_s) +
                                     (asleep.p2p_s - awake.p2p_s));
  return extra / static_cast<double>(std::max(sleeps_of(asleep), 1L));
}

std::string pong_failures(const pong_result& asleep, const pong_result& awake) {
  std::string f;
  if (!asleep.values_ok || !awake.values_ok) f += " wrong values;";
  if (sleeps_of(asleep) < 150) f += " too few context switches: the waits did not sleep;";
  else if (extra_per_sleep(asleep, awake) >= 1e-3) f += " 1 ms or more per sleep beyond the awake run;";
  if (asleep.big_s - awake.big_s >= 5e-3) f += " 3 MiB send/recv 5 ms or more slower than awake;";
  return f;
}

std::string pong_line(const pong_result& r) {
  char buf[320];
  std::snprintf(buf, sizeof buf, "barrier %.1f us (%ld switches), all_reduce 1 KiB %.1f us (%ld), send/recv %.1f us (%ld), 3 MiB send/recv %.2f ms",
                r.barrier_s * 1e6, r.barrier_sw, r.reduce_s * 1e6, r.reduce_sw, r.p2p_s * 1e6, r.p2p_sw, r.big_s * 1e3);
  return buf;
}

void check_pongs(const pong_result& asleep, const pong_result& awake, const char* what) {
  MESSAGE(std::string(what) << ", per call, one rank asleep: " << pong_line(asleep) << "; both awake: " << pong_line(awake)
                            << "; " << extra_per_sleep(asleep, awake) * 1e6 << " us more per sleep");
  const std::string f = pong_failures(asleep, awake);
  CHECK_MESSAGE(f.empty(), what << ":" << f);
}

braid::options spin_1us() { return braid::options::from_env().with_spin(1us); }
braid::options spin_50ms() { return braid::options::from_env().with_spin(50ms); }

} // namespace

TEST_CASE("threads: a rank that waits long sleeps, and the post wakes it") {
  std::vector<long_wait> w(2);
  braid::run_threads(2, [&](communicator& c) { w[static_cast<std::size_t>(c.rank())] = wait_for_late_peer(c); });
  check_long_wait(w[1], "threads");
}

TEST_CASE("processes: a rank that waits long sleeps, and the post wakes it") {
  const auto st = braid::testing::fork_ranks(2, [&](int rank, const braid::unique_id& id) {
    communicator c = communicator::join(id, rank, 2);
    const long_wait w = wait_for_late_peer(c);
    if (rank == 0) return 0;
    std::printf("processes: waited %.1f ms, %.2f ms of CPU, %ld voluntary context switches\n", w.wall * 1e3, w.cpu * 1e3,
                w.switches);
    if (!braid::host::membarrier_ready()) return w.wall > 0.25 ? 0 : 1; // sleeps capped at 50 us (check_long_wait)
    return w.wall > 0.25 && w.cpu < 0.03 && w.switches < 1000 ? 0 : 1;
  });
  CHECK(st[0] == 0);
  CHECK(st[1] == 0);
}

TEST_CASE("threads: posts wake the sleepers (no lost wake)") {
  std::vector<pong_result> asleep(2), awake(2);
  braid::run_threads(2, [&](communicator& c) { awake[static_cast<std::size_t>(c.rank())] = run_pongs(c); }, spin_50ms());
  braid::run_threads(2, [&](communicator& c) { asleep[static_cast<std::size_t>(c.rank())] = run_pongs(c); }, spin_1us());
  check_pongs(asleep[0], awake[0], "threads, rank 0");
  check_pongs(asleep[1], awake[1], "threads, rank 1");
}

TEST_CASE("processes: posts wake the sleepers (no lost wake)") {
  // The awake run's results reach the sleeping run's processes through a shared page.
  auto* awake = static_cast<pong_result*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(awake != MAP_FAILED);
  const auto st0 = braid::testing::fork_ranks(2, [&](int rank, const braid::unique_id& id) {
    communicator c = communicator::join(id, rank, 2, spin_50ms());
    awake[rank] = run_pongs(c);
    return 0;
  });
  REQUIRE(st0[0] == 0);
  REQUIRE(st0[1] == 0);
  const auto st = braid::testing::fork_ranks(2, [&](int rank, const braid::unique_id& id) {
    communicator c = communicator::join(id, rank, 2, spin_1us());
    const pong_result r = run_pongs(c);
    const std::string f = pong_failures(r, awake[rank]);
    std::printf("processes, rank %d, per call, one rank asleep: %s; both awake: %s; %.1f us more per sleep%s%s\n", rank,
                pong_line(r).c_str(), pong_line(awake[rank]).c_str(), extra_per_sleep(r, awake[rank]) * 1e6,
                f.empty() ? "" : "; FAILED:", f.c_str());
    return f.empty() ? 0 : 1;
  });
  munmap(awake, 4096);
  CHECK(st[0] == 0);
  CHECK(st[1] == 0);
}

TEST_CASE("a sleeping rank raises soon after another aborts or leaves") {
  // Rank 1 sleeps in a barrier (1 us spin); rank 0 aborts (or closes) 100 ms later. Rank 1 raises the
  // right error; the delay from the event is printed and bounded by 50 ms (the recheck alone gives
  // at most 2 ms on a quiet machine: this bound is about a loaded one, not about the wake).
  for (int leave = 0; leave < 2; ++leave) {
    std::atomic<std::int64_t> event_ns{0};
    std::atomic<double> delay{-1};
    std::atomic<int> code{-1};
    std::atomic<bool> raised{false};
    braid::thread_group g(2, spin_1us().with_timeout(60s));
    communicator c0 = g.make(0), c1 = g.make(1); // made before the threads start (make is not thread-safe)
    auto now_ns = [] { return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count(); };
    std::thread t0([&] {
      std::this_thread::sleep_for(100ms);
      event_ns = now_ns();
      if (leave) c0.close();
      else c0.abort();
      while (!raised) std::this_thread::sleep_for(1ms); // c0 stays open until rank 1 has raised
    });
    std::thread t1([&] {
      try {
        c1.barrier();
      } catch (const braid::error& e) {
        code = static_cast<int>(e.code());
        delay = static_cast<double>(now_ns() - event_ns.load()) * 1e-9;
      }
      raised = true;
    });
    t0.join();
    t1.join();
    MESSAGE(std::string(leave ? "peer left" : "abort") << ": the sleeping rank raised " << delay.load() * 1e3
                                                       << " ms after the event");
    CHECK(code.load() == static_cast<int>(leave ? errc::peer_failed : errc::aborted));
    CHECK(delay.load() >= 0);
    CHECK(delay.load() < 0.05);
  }
}

// The yardstick for the test below: seconds per switch between two processes on `cpu` that hand a
// word back and forth with sched_yield (0.88 us on the 2-vCPU Xeon VM).
double yield_switch_seconds(int cpu) {
  auto* w = static_cast<std::atomic<long>*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (w == MAP_FAILED) return 0;
  new (w) std::atomic<long>(0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  const int n = 4000;
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    sched_setaffinity(0, sizeof one, &one);
    for (long i = 0; i < n; ++i) {
      while (w->load() != 2 * i + 1) sched_yield();
      w->store(2 * i + 2);
    }
    ::_exit(0);
  }
  cpu_set_t before;
  sched_getaffinity(0, sizeof before, &before);
  sched_setaffinity(0, sizeof one, &one);
  const auto t0 = clock_type::now();
  for (long i = 0; i < n; ++i) {
    while (w->load() != 2 * i) sched_yield();
    w->store(2 * i + 1);
  }
  while (w->load() != 2 * n) sched_yield();
  const double s = seconds_since(t0) / (2.0 * n);
  int status = 0;
  ::waitpid(child, &status, 0);
  sched_setaffinity(0, sizeof before, &before);
  munmap(w, 4096);
  return s;
}

TEST_CASE("processes bound two to a CPU yield from their first poll, whichever rank they wait for") {
  // Four processes, ranks 0 and 1 bound to one CPU, 2 and 3 to another (all four to one CPU where this
  // process may use only one). A rank that waited for a peer on the other CPU by spinning held back
  // the rank beside it: on the 2-vCPU Xeon VM the fastest of 40 batches took 4.9-5.6 us
  // per 64 B all_reduce (medians 5.8-10), 5.6-6.4 times the yardstick above; once every wait of a rank
  // that shares its CPU yields (context.hpp, wait_slow), 1.9-2.3 us (medians 2.5-2.9), 2.2-2.6 times.
  // The fastest batch must take under 4 yardstick switches per call: the fastest, so that time slices
  // lost to other jobs do not decide it, and in switches, so that it means the same on another machine.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  REQUIRE(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  REQUIRE(!cpus.empty());
  const double sw = yield_switch_seconds(cpus[0]);
  REQUIRE(sw > 0);
  auto* fastest = static_cast<double*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(fastest != MAP_FAILED);
  const auto st = braid::testing::fork_ranks(4, [&](int rank, const braid::unique_id& id) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[static_cast<std::size_t>(rank / 2) % cpus.size()], &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) return 2;
    communicator c = communicator::join(id, rank, 4);
    std::vector<float> in(16, 1.0f), out(16);
    std::vector<double> per_call;
    for (int b = 0; b < 40; ++b) {
      c.barrier();
      const auto t0 = clock_type::now();
      for (int i = 0; i < 50; ++i) c.all_reduce(in.data(), out.data(), in.size());
      per_call.push_back(seconds_since(t0) / 50);
      if (out[0] != 4.0f) return 3;
    }
    std::sort(per_call.begin(), per_call.end());
    fastest[rank] = per_call.front();
    std::printf("4 processes on %zu CPU(s), two to a CPU, rank %d: %.2f us per 64 B all_reduce in the fastest batch, "
                "%.2f in the median one\n", cpus.size(), rank, per_call.front() * 1e6, per_call[per_call.size() / 2] * 1e6);
    return 0;
  });
  for (int s : st) CHECK(s == 0);
  double worst = 0;
  for (int r = 0; r < 4; ++r) worst = std::max(worst, fastest[r]);
  MESSAGE("fastest batch, slowest rank: " << worst * 1e6 << " us per call; a yield switch: " << sw * 1e6 << " us; ratio "
                                          << worst / sw);
  CHECK(worst < 4 * sw);
  munmap(fastest, 4096);
}
