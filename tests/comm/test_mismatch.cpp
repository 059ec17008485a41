// Mismatched calls. In debug mode (options::debug, BRAID_DEBUG=1) every rank compares every peer's call
// fingerprint (collective, type, operator, algorithm, count, root, call number) before any data moves:
// a mismatch raises mismatch_error on every rank, naming both calls, and the communicator then refuses
// further calls. Matching calls (empty ones, send/recv between some ranks in between) pass. An empty
// call (count 0) is no call in either mode: not counted, not fingerprinted, nothing waited for. Outside
// debug mode a mismatched call never writes outside this rank's own output and never hangs past the
// deadline (it may return garbage or raise an error).
#include <doctest/doctest.h>

#include <braid/braid.hpp>
#include <support/fork_ranks.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using braid::communicator;
using clock_type = std::chrono::steady_clock;

struct outcome {
  int code = 0; // errc, 0 = returned
  std::string what;
  int next_code = 0;
  double seconds = 0;
};

// One mismatch: what rank r calls (only `odd` differs from the others).
struct mismatch_case {
  const char* name;
  std::function<void(communicator&, bool odd)> call;
  std::vector<std::string> both; // texts that must appear in every rank's error: each side's call
};

std::vector<mismatch_case> mismatch_cases() {
  using braid::algo;
  return {
      {"collective", [](communicator& c, bool odd) {
         std::vector<float> v(100, 1.0f);
         if (odd) c.broadcast(std::span<float>(v), 0);
         else c.all_reduce(std::span<float>(v));
       }, {"all_reduce (collective call 1)", "broadcast (collective call 1)"}},
      {"type", [](communicator& c, bool odd) {
         if (odd) { std::vector<double> v(100, 1.0); c.all_reduce(std::span<double>(v)); }
         else { std::vector<float> v(100, 1.0f); c.all_reduce(std::span<float>(v)); }
       }, {"float, sum", "double, sum"}},
      {"operator", [](communicator& c, bool odd) {
         std::vector<int> v(100, 1);
         if (odd) c.all_reduce(std::span<int>(v), braid::max<>{});
         else c.all_reduce(std::span<int>(v), braid::sum<>{});
       }, {"int32, sum", "int32, max"}},
      {"count", [](communicator& c, bool odd) {
         std::vector<float> v(odd ? 999 : 1000, 1.0f);
         c.all_reduce(std::span<float>(v));
       }, {"count 1000", "count 999"}},
      {"root", [](communicator& c, bool odd) {
         std::vector<float> v(100, 1.0f);
         c.broadcast(std::span<float>(v), odd ? 1 : 0);
       }, {"root 0", "root 1"}},
      {"algorithm", [](communicator& c, bool odd) {
         std::vector<float> v(100, 1.0f);
         c.all_reduce(std::span<float>(v), braid::sum<>{}, braid::call_options{odd ? algo::tree : algo::ring});
       }, {"algorithm ring", "algorithm tree"}},
      {"barrier against a collective", [](communicator& c, bool odd) {
         std::vector<float> v(100, 1.0f);
         if (odd) c.barrier();
         else c.all_reduce(std::span<float>(v));
       }, {"barrier (collective call 1)", "all_reduce (collective call 1)"}},
      {"reduce_scatter against all_gather", [](communicator& c, bool odd) {
         const std::size_t n = static_cast<std::size_t>(c.size());
         std::vector<float> big(10 * n, 1.0f), small(10, 1.0f);
         if (odd) c.all_gather(std::span<const float>(small), std::span<float>(big));
         else c.reduce_scatter(std::span<const float>(big), std::span<float>(small));
       }, {"reduce_scatter (collective call 1)", "all_gather (collective call 1)"}},
      {"one rank is a call ahead", [](communicator& c, bool odd) {
         std::vector<float> v(100, 1.0f);
         c.all_reduce(std::span<float>(v));
         if (!odd) c.all_reduce(std::span<float>(v));
         c.broadcast(std::span<float>(v), 0);
       }, {"all_reduce (collective call 2)", "broadcast (collective call 2)"}},
  };
}

braid::options debug_options(std::chrono::nanoseconds timeout) {
  braid::options o;
  o.debug = true;
  o.timeout = timeout;
  return o;
}

void record(outcome& o, const std::function<void()>& call, const std::function<void()>& next) {
  const auto t0 = clock_type::now();
  try {
    call();
  } catch (const braid::error& e) {
    o.code = static_cast<int>(e.code());
    o.what = e.what();
  }
  o.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  try {
    next();
  } catch (const braid::error& e) {
    o.next_code = static_cast<int>(e.code());
  }
}

void check_mismatch_outcomes(const std::vector<outcome>& out, const mismatch_case& mc) {
  for (std::size_t r = 0; r < out.size(); ++r) {
    INFO("rank " << r << ": " << out[r].what);
    CHECK(out[r].code == static_cast<int>(braid::errc::mismatch));
    for (const auto& text : mc.both) CHECK(out[r].what.find(text) != std::string::npos);
    CHECK(out[r].next_code == static_cast<int>(braid::errc::invalid_usage));
    CHECK(out[r].seconds < 5.0); // found at once, not at the 10 s deadline
  }
}

} // namespace

TEST_CASE("mismatch (debug, threads): every kind raises mismatch_error on every rank naming both calls") {
  for (int n : {2, 3}) {
    for (const auto& mc : mismatch_cases()) {
      INFO(n << " ranks, mismatched " << std::string(mc.name));
      const int odd = n - 1;
      std::vector<outcome> out(static_cast<std::size_t>(n));
      braid::run_threads(n, [&](communicator& c) {
        std::vector<float> v(16, 1.0f);
        c.all_reduce(std::span<float>(v)); // a matching call first: the check passes it
        c.barrier();
        record(out[static_cast<std::size_t>(c.rank())], [&] { mc.call(c, c.rank() == odd); },
               [&] { c.all_reduce(std::span<float>(v)); });
      }, debug_options(10s));
      // The matching calls above take collective call numbers 1 and 2: shift the expected texts.
      mismatch_case shifted = mc;
      for (auto& text : shifted.both)
        for (const char* k : {"(collective call 1)", "(collective call 2)"})
          if (auto at = text.find(k); at != std::string::npos)
            text.replace(at, std::strlen(k), k[17] == '1' ? "(collective call 3)" : "(collective call 4)");
      check_mismatch_outcomes(out, shifted);
    }
  }
}

TEST_CASE("mismatch (debug, processes): mismatched collective, type, count and root raise mismatch_error on every rank") {
  const auto cases = mismatch_cases();
  for (const auto& mc : cases) {
    const std::string nm = mc.name;
    if (nm != "collective" && nm != "type" && nm != "count" && nm != "root" && nm != "one rank is a call ahead") continue;
    INFO("3 processes, mismatched " << nm);
    const auto status = braid::testing::fork_ranks(3, [&](int rank, const braid::unique_id& id) {
      communicator c = communicator::join(id, rank, 3, debug_options(10s));
      outcome o;
      std::vector<float> v(16, 1.0f);
      record(o, [&] { mc.call(c, rank == 1); }, [&] { c.all_reduce(std::span<float>(v)); });
      if (o.code != static_cast<int>(braid::errc::mismatch)) {
        std::fprintf(stderr, "rank %d: expected mismatch_error, got code %d: %s\n", rank, o.code, o.what.c_str());
        return 1;
      }
      for (const auto& text : mc.both)
        if (o.what.find(text) == std::string::npos) {
          std::fprintf(stderr, "rank %d: '%s' does not name '%s'\n", rank, o.what.c_str(), text.c_str());
          return 2;
        }
      if (o.next_code != static_cast<int>(braid::errc::invalid_usage)) return 3;
      if (o.seconds > 5.0) return 4;
      return 0;
    }, 120s);
    for (int s : status) CHECK(s == 0);
  }
}

TEST_CASE("mismatch (debug): matching calls pass, including empty calls and send/recv between some ranks") {
  std::atomic<int> errors{0};
  braid::run_threads(3, [&](communicator& c) {
    try {
      std::vector<float> v(1000, 1.0f), w(3000, 0.0f);
      for (int k = 0; k < 20; ++k) {
        c.all_reduce(std::span<float>(v));
        c.all_reduce(v.data(), v.data(), 0);
        c.broadcast(std::span<float>(v), k % 3);
        c.reduce(v.data(), w.data(), v.size(), (k + 1) % 3, braid::max<>{});
        c.all_gather(std::span<const float>(v), std::span<float>(w));
        c.reduce_scatter(std::span<const float>(w), std::span<float>(v));
        c.barrier();
        if (c.rank() == 0) c.send(v.data(), 10, 1); // rank 2 makes no call here
        if (c.rank() == 1) c.recv(v.data(), 10, 0);
      }
      CHECK(c.calls() == static_cast<std::uint64_t>(20 * 6 + (c.rank() < 2 ? 20 : 0))); // the empty call is not counted
    } catch (const std::exception& e) {
      ++errors;
      MESSAGE("rank " << c.rank() << ": " << e.what());
    }
  }, debug_options(30s));
  CHECK(errors == 0);
}

// api.md (count == 0): an empty collective returns at once, synchronises nothing and is not counted,
// with debug mode on or off. Here only rank 0 makes the empty calls; a rank's empty call, if it were
// counted or fingerprinted in debug mode, would meet rank 1's next real call and fail both with
// mismatch_error.
TEST_CASE("count-0 calls mean the same with and without debug mode: not counted, synchronise nothing") {
  for (bool debug : {false, true}) {
    INFO("debug " << debug);
    std::atomic<int> errors{0};
    std::vector<std::uint64_t> calls(2, 0);
    std::vector<float> sums(2, 0.0f);
    braid::options o;
    o.debug = debug;
    o.timeout = 10s;
    braid::run_threads(2, [&](communicator& c) {
      try {
        std::vector<float> v(16, 1.0f), w(32, 0.0f);
        if (c.rank() == 0) { // rank 1 makes none of these
          c.all_reduce(v.data(), v.data(), 0);
          c.all_reduce(static_cast<const float*>(nullptr), static_cast<float*>(nullptr), 0, braid::max<>{});
          c.broadcast(v.data(), v.data(), 0, 1);
          c.reduce(v.data(), w.data(), 0, 0);
          c.all_gather(v.data(), w.data(), 0);
          c.reduce_scatter(w.data(), v.data(), 0);
        }
        c.all_reduce(std::span<float>(v)); // the first counted call on both ranks
        calls[static_cast<std::size_t>(c.rank())] = c.calls();
        sums[static_cast<std::size_t>(c.rank())] = v[0];
      } catch (const std::exception& e) {
        ++errors;
        MESSAGE("rank " << c.rank() << ": " << std::string(e.what()));
      }
    }, o);
    CHECK(errors == 0);
    for (std::size_t r = 0; r < 2; ++r) {
      CHECK(calls[r] == 1);
      CHECK(sums[r] == 2.0f);
    }
  }
}

TEST_CASE("mismatch (debug): BRAID_DEBUG=1 turns it on") {
  ::setenv("BRAID_DEBUG", "1", 1);
  CHECK(braid::options::from_env().debug);
  ::setenv("BRAID_DEBUG", "0", 1);
  CHECK(!braid::options::from_env().debug);
  ::unsetenv("BRAID_DEBUG");
  CHECK(!braid::options::from_env().debug);
}

// ---- outside debug mode ------------------------------------------------------------------------------

namespace {
constexpr std::size_t pad = 256; // guard elements before and after every output
constexpr double deadline_s = 0.5;

// A mismatched call outside debug mode on guarded buffers; returns true when this rank's guards held
// and the call ended (returned or raised) within deadline + 2 s.
template <class T> bool guarded_call(communicator& c, std::size_t count, const std::function<void(T*, std::size_t)>& call,
                                     std::string& note) {
  std::vector<T> buf(count + 2 * pad);
  std::memset(static_cast<void*>(buf.data()), 0x5a, buf.size() * sizeof(T));
  const std::vector<T> before = buf;
  for (std::size_t i = 0; i < count; ++i) buf[pad + i] = static_cast<T>(1);
  const auto t0 = clock_type::now();
  try {
    call(buf.data() + pad, count);
    note += "returned; ";
  } catch (const braid::error& e) {
    note += std::string(braid::to_string(e.code())) + "; ";
  }
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  const bool guards = std::memcmp(buf.data(), before.data(), pad * sizeof(T)) == 0 &&
                      std::memcmp(buf.data() + pad + count, before.data() + pad + count, pad * sizeof(T)) == 0;
  if (!guards) note += "GUARD DAMAGED; ";
  if (s > deadline_s + 2.0) note += "TOO SLOW; ";
  (void)c;
  return guards && s <= deadline_s + 2.0;
}

// Calls every rank makes, rank `odd` differently; counts stay below the zero-copy threshold (see the
// reliability notes: above it, threads read peers' inputs in place).
bool nondebug_rank(communicator& c, int which, std::string& note) {
  const bool odd = c.rank() == c.size() - 1;
  switch (which) {
  case 0: // count
    return guarded_call<float>(c, odd ? 10 : 5000, [&](float* p, std::size_t n) { c.all_reduce(p, p, n); }, note);
  case 1: // type: same count, different element size
    if (odd) return guarded_call<double>(c, 3000, [&](double* p, std::size_t n) { c.all_reduce(p, p, n); }, note);
    return guarded_call<float>(c, 3000, [&](float* p, std::size_t n) { c.all_reduce(p, p, n); }, note);
  case 2: // collective
    if (odd) return guarded_call<float>(c, 3000, [&](float* p, std::size_t n) { c.broadcast(p, p, n, 0); }, note);
    return guarded_call<float>(c, 3000, [&](float* p, std::size_t n) { c.all_reduce(p, p, n); }, note);
  case 3: // root
    return guarded_call<float>(c, 3000, [&](float* p, std::size_t n) { c.broadcast(p, p, n, odd ? 1 : 0); }, note);
  case 4: // count, out-of-place, larger on the odd rank
    return guarded_call<int>(c, odd ? 20000 : 700, [&](int* p, std::size_t n) {
      std::vector<int> in(n, 2);
      c.all_reduce(in.data(), p, n);
    }, note);
  default: // a call on one rank only: the others wait at the next collective
    if (odd) return guarded_call<float>(c, 100, [&](float* p, std::size_t n) { c.all_reduce(p, p, n); }, note);
    return guarded_call<float>(c, 100, [&](float* p, std::size_t n) { c.broadcast(p, p, n, 0); c.barrier(); }, note);
  }
}
constexpr int nondebug_kinds = 6;
} // namespace

TEST_CASE("mismatch outside debug mode (threads): never writes out of bounds, never hangs past the deadline") {
  for (int n : {2, 3})
    for (int which = 0; which < nondebug_kinds; ++which) {
      INFO(n << " ranks, mismatch kind " << which);
      std::mutex m;
      std::vector<std::string> notes(static_cast<std::size_t>(n));
      std::atomic<int> bad{0};
      braid::options o;
      o.timeout = std::chrono::milliseconds(500);
      try {
        braid::run_threads(n, [&](communicator& c) {
          std::string note;
          if (!nondebug_rank(c, which, note)) ++bad;
          std::lock_guard<std::mutex> lock(m);
          notes[static_cast<std::size_t>(c.rank())] = note;
        }, o);
      } catch (const std::exception& e) {
        FAIL_CHECK("run_threads raised " << e.what());
      }
      std::string all;
      for (int r = 0; r < n; ++r) all += "rank " + std::to_string(r) + ": " + notes[static_cast<std::size_t>(r)];
      INFO(all);
      CHECK(bad == 0);
      MESSAGE(n << " ranks, kind " << which << " outside debug mode: " << all);
    }
}

TEST_CASE("mismatch outside debug mode (processes): never writes out of bounds, never hangs past the deadline") {
  for (int which = 0; which < nondebug_kinds; ++which) {
    INFO("3 processes, mismatch kind " << which);
    const auto status = braid::testing::fork_ranks(3, [&](int rank, const braid::unique_id& id) {
      braid::options o;
      o.timeout = std::chrono::milliseconds(500);
      communicator c = communicator::join(id, rank, 3, o);
      std::string note;
      const bool ok = nondebug_rank(c, which, note);
      if (!ok) std::fprintf(stderr, "rank %d: %s\n", rank, note.c_str());
      return ok ? 0 : 1;
    }, 60s);
    for (int s : status) CHECK(s == 0);
  }
}
