// Mismatched calls. In debug mode (options::debug, BRAID_DEBUG=1) every rank compares every peer's call
// fingerprint (collective, type, operator, algorithm, count, root, call number) before any data moves:
// a mismatch raises mismatch_error on every rank, naming both calls, and the communicator then refuses
// further calls. Matching calls (empty ones, send/recv between some ranks in between) pass. An empty
// call (count 0) is no call in either mode: not counted, not fingerprinted, nothing waited for. Outside
// debug mode every call is compared too, through one word per round (the call word, at the end of this
// file): mismatch_error on every rank, no read outside any buffer, no write outside this rank's output.
#include <doctest/doctest.h>

#include <braid/braid.hpp>
#include <support/fork_ranks.hpp>

#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <span>
#include <string>
#include <vector>

#include <sys/mman.h>

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

// ---- outside debug mode: every call is compared (the call word) ---------------------------------------
//
// Without BRAID_DEBUG every round publishes a word naming the call (collective, element type, operator,
// count, root, algorithm, collective-call number, first round) beside its progress word, and a rank
// compares a peer's word before it reads anything of that peer's. So a mismatched call raises
// mismatch_error on every rank (in the call, or, on a rank whose part of the call returned before a
// rank noticed, or when no rank read anything of the other's, at one of its next two calls that read
// each other's data: here all_reduce) and no rank reads outside any buffer. Buffers here
// are fenced by inaccessible pages, so a read past either end kills the test (SIGSEGV) in any build;
// registered buffers (alloc) cannot be fenced in the peers that map them: there the error is checked,
// and the ASan build (scripts/sanitize.sh asan) watches the ordinary ones.

namespace {

// `count` elements whose last byte is followed, and whose first byte is preceded, by a PROT_NONE page.
template <class T> class fenced {
public:
  explicit fenced(std::size_t count) {
    const std::size_t bytes = count * sizeof(T), pages = (bytes + 4095) / 4096;
    map_bytes_ = (pages + 2) * 4096;
    void* m = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("mmap failed");
    base_ = static_cast<std::byte*>(m);
    if (::mprotect(base_, 4096, PROT_NONE) != 0 || ::mprotect(base_ + (pages + 1) * 4096, 4096, PROT_NONE) != 0)
      throw std::runtime_error("mprotect failed");
    data_ = reinterpret_cast<T*>(base_ + (pages + 1) * 4096 - bytes);
    for (std::size_t i = 0; i < count; ++i) data_[i] = static_cast<T>(1);
  }
  fenced(const fenced&) = delete;
  fenced& operator=(const fenced&) = delete;
  ~fenced() { ::munmap(base_, map_bytes_); }
  T* data() const { return data_; }

private:
  std::byte* base_ = nullptr;
  std::size_t map_bytes_ = 0;
  T* data_ = nullptr;
};

enum class coll_kind { all_reduce, broadcast, reduce, reduce_scatter, all_gather };
constexpr coll_kind all_colls[] = {coll_kind::all_reduce, coll_kind::broadcast, coll_kind::reduce, coll_kind::reduce_scatter,
                                   coll_kind::all_gather};
const char* coll_name(coll_kind k) {
  switch (k) {
  case coll_kind::all_reduce: return "all_reduce";
  case coll_kind::broadcast: return "broadcast";
  case coll_kind::reduce: return "reduce";
  case coll_kind::reduce_scatter: return "reduce_scatter";
  default: return "all_gather";
  }
}
bool reduces(coll_kind k) { return k == coll_kind::all_reduce || k == coll_kind::reduce || k == coll_kind::reduce_scatter; }
bool rooted(coll_kind k) { return k == coll_kind::broadcast || k == coll_kind::reduce; }

enum class what_differs { count, type, op, root, collective, barrier };
const char* differs_name(what_differs w) {
  switch (w) {
  case what_differs::count: return "count";
  case what_differs::type: return "type";
  case what_differs::op: return "operator";
  case what_differs::root: return "root";
  case what_differs::collective: return "collective";
  default: return "barrier against the collective";
  }
}

// Where the input lives: fenced ordinary memory (staged, or read in place by thread peers when
// zero_copy is set), or a buffer from communicator::alloc (read in place by every peer).
enum class source { ordinary, registered };

// One out-of-place call of collective k on `count` elements (per block), with this rank's input in
// `src` memory; max instead of sum when `use_max`.
// The buffers outlive the call in `keep`: after an error a peer may still be reading this rank's input
// in place until it, too, notices the failure (guarantees.md, completion semantics), so the callers
// free them only once every rank is done.
using keeper = std::vector<std::shared_ptr<void>>;
template <class T>
void one_call(communicator& c, coll_kind k, std::size_t count, int root, bool use_max, source src, keeper& keep,
              braid::call_options co = {}) {
  const std::size_t n = static_cast<std::size_t>(c.size());
  const std::size_t in_n = k == coll_kind::reduce_scatter ? count * n : count;
  const std::size_t out_n = k == coll_kind::all_gather ? count * n : count;
  auto out = std::make_shared<fenced<T>>(out_n);
  keep.push_back(out);
  const T* in = nullptr;
  if (src == source::registered) {
    auto reg = std::make_shared<braid::buffer<T>>(c.alloc<T>(in_n));
    for (std::size_t i = 0; i < in_n; ++i) (*reg)[i] = static_cast<T>(1);
    in = reg->data();
    keep.push_back(reg);
  } else {
    auto plain = std::make_shared<fenced<T>>(in_n);
    in = plain->data();
    keep.push_back(plain);
  }
  switch (k) {
  case coll_kind::all_reduce:
    if (use_max) c.all_reduce(in, out->data(), count, braid::max<>{}, co);
    else c.all_reduce(in, out->data(), count, braid::sum<>{}, co);
    break;
  case coll_kind::broadcast: c.broadcast(in, out->data(), count, root, co); break;
  case coll_kind::reduce:
    if (use_max) c.reduce(in, out->data(), count, root, braid::max<>{}, co);
    else c.reduce(in, out->data(), count, root, braid::sum<>{}, co);
    break;
  case coll_kind::reduce_scatter:
    if (use_max) c.reduce_scatter(in, out->data(), count, braid::max<>{}, co);
    else c.reduce_scatter(in, out->data(), count, braid::sum<>{}, co);
    break;
  case coll_kind::all_gather: c.all_gather(in, out->data(), count, co); break;
  }
}

constexpr std::size_t base_count = 3000;

// What rank r calls: the last rank differs from the others in `w`.
void mismatched_call(communicator& c, coll_kind k, what_differs w, source src, keeper& keep) {
  const bool odd = c.rank() == c.size() - 1;
  if (!odd) return one_call<float>(c, k, base_count, 0, false, src, keep);
  switch (w) {
  case what_differs::count: return one_call<float>(c, k, base_count * 6 / 5, 0, false, src, keep);
  case what_differs::type: return one_call<double>(c, k, base_count, 0, false, src, keep);
  case what_differs::op: return one_call<float>(c, k, base_count, 0, true, src, keep);
  case what_differs::root: return one_call<float>(c, k, base_count, 1, false, src, keep);
  case what_differs::collective:
    return one_call<float>(c, k == coll_kind::all_gather ? coll_kind::all_reduce : coll_kind::all_gather, base_count, 0, false,
                           src, keep);
  default:
    // For process ranks alloc is a collective too: allocate as the others do, then differ.
    if (src == source::registered) keep.push_back(std::make_shared<braid::buffer<float>>(c.alloc<float>(16)));
    c.barrier();
    return;
  }
}

// What one rank saw: the first error of the mismatched call and the two matching all_reduce calls after
// it, and where.
struct seen {
  int code = 0;   // errc of the first error, 0 = none
  int where = -1; // 0: the mismatched call, 1 and 2: the calls after it
  double seconds = 0;
  char what[400] = {};
};

// A matching call after the mismatched one, in which every rank reads every other rank's input.
void follow_up(communicator& c) {
  std::vector<float> v(16, 1.0f);
  c.all_reduce(std::span<float>(v));
}

// Step 0: `first` (the mismatched call); steps 1 and 2: follow_up. Records the first error in s.
template <class F> void run_steps(communicator& c, seen& s, F first) {
  const auto t0 = clock_type::now();
  for (int step = 0; step < 3 && s.code == 0; ++step) {
    try {
      if (step == 0) first();
      else follow_up(c);
    } catch (const braid::error& e) {
      s.code = static_cast<int>(e.code());
      s.where = step;
      std::snprintf(s.what, sizeof(s.what), "%s", e.what());
    }
  }
  s.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
}

void run_one(communicator& c, coll_kind k, what_differs w, source src, seen& s, keeper& keep) {
  run_steps(c, s, [&] { mismatched_call(c, k, w, src, keep); });
}

std::vector<what_differs> kinds_for(coll_kind k) {
  std::vector<what_differs> v{what_differs::count, what_differs::type, what_differs::collective, what_differs::barrier};
  if (reduces(k)) v.push_back(what_differs::op);
  if (rooted(k)) v.push_back(what_differs::root);
  return v;
}

braid::options call_word_options(bool zero_copy) {
  braid::options o;
  o.timeout = std::chrono::seconds(5);
  o.staging_bytes = std::size_t{64} << 10; // several rounds per call
  o.zero_copy_min_bytes = zero_copy ? 1 : SIZE_MAX;
  return o;
}

// Every rank saw mismatch_error, soon (well before the 5 s deadline: not a timeout).
void check_seen(const std::vector<seen>& v, std::string& where) {
  for (std::size_t r = 0; r < v.size(); ++r) {
    INFO("rank " << r << ": " << v[r].what);
    CHECK(v[r].code == static_cast<int>(braid::errc::mismatch));
    CHECK(v[r].seconds < 2.0);
    where += std::to_string(v[r].where);
  }
}

} // namespace

TEST_CASE("mismatch outside debug mode (threads): every collective, staged and zero-copy, ordinary and alloc buffers: "
          "mismatch_error on every rank, no read outside a buffer") {
  std::string summary;
  for (int n : {2, 3})
    for (bool zero_copy : {false, true})
      for (source src : {source::ordinary, source::registered})
        for (coll_kind k : all_colls)
          for (what_differs w : kinds_for(k)) {
            if (src == source::registered && !zero_copy) continue; // threads: alloc memory is ordinary memory
            INFO(n << " thread ranks, " << std::string(coll_name(k)) << ", " << std::string(zero_copy ? "zero-copy" : "staged") << ", "
                   << std::string(src == source::registered ? "alloc" : "ordinary") << " input, mismatched " << std::string(differs_name(w)));
            std::vector<seen> v(static_cast<std::size_t>(n));
            std::barrier done(n);
            braid::run_threads(n, [&](communicator& c) {
              keeper keep;
              std::vector<float> warm(16, 1.0f);
              c.all_reduce(std::span<float>(warm)); // a matching call first
              run_one(c, k, w, src, v[static_cast<std::size_t>(c.rank())], keep);
              done.arrive_and_wait(); // every rank's call ended: nobody reads this rank's input any more
            }, call_word_options(zero_copy));
            std::string where;
            check_seen(v, where);
            if (k == coll_kind::all_reduce && w != what_differs::barrier)
              for (const auto& s : v) CHECK(s.where == 0); // every rank reads every peer: found in the call
            summary += std::string(coll_name(k)) + "/" + differs_name(w) + ":" + where + " ";
          }
  MESSAGE("where each rank raised (0 in the call, 1 or 2 at the next calls): " << summary);
}

TEST_CASE("mismatch outside debug mode (processes): every collective, staged and registered: mismatch_error on every "
          "rank, no read outside a buffer") {
  for (source src : {source::ordinary, source::registered})
    for (coll_kind k : all_colls)
      for (what_differs w : kinds_for(k)) {
        INFO("3 processes, " << std::string(coll_name(k)) << ", " << std::string(src == source::registered ? "registered (read in place)" : "staged")
                             << ", mismatched " << std::string(differs_name(w)));
        auto* v = static_cast<seen*>(::mmap(nullptr, 3 * sizeof(seen), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
        REQUIRE(v != MAP_FAILED);
        for (int r = 0; r < 3; ++r) new (&v[r]) seen{};
        const auto status = braid::testing::fork_ranks(3, [&](int rank, const braid::unique_id& id) {
          communicator c = communicator::join(id, rank, 3, call_word_options(false));
          std::vector<float> warm(16, 1.0f);
          c.all_reduce(std::span<float>(warm));
          keeper keep; // registered inputs stay mapped in the peers anyway; ordinary ones are staged
          run_one(c, k, w, src, v[rank], keep);
          return 0;
        }, 60s);
        for (int s : status) CHECK(s == 0); // 128 + 11: a read outside a fenced buffer
        std::vector<seen> got(v, v + 3);
        std::string where;
        check_seen(got, where);
        ::munmap(v, 3 * sizeof(seen));
      }
}

// The reproduction (issue 18, finding 1): two thread ranks, all_reduce of exact-size vectors
// of 100000 and 120000 floats, default options (zero-copy: 400 KB is above zero_copy_min_bytes). Before
// the call word the longer rank read past the shorter rank's vector (ASan: heap-buffer-overflow READ
// in reduce_n) and both returned wrong results.
TEST_CASE("mismatch outside debug mode: all_reduce of 100000 against 120000 floats raises mismatch_error on both ranks") {
  for (bool in_place : {false, true}) {
    INFO(std::string(in_place ? "in place (staged)" : "out of place (zero-copy)"));
    std::vector<seen> v(2);
    braid::options o;
    o.timeout = std::chrono::seconds(5);
    braid::run_threads(2, [&](communicator& c) {
      const std::size_t count = c.rank() == 0 ? 100000 : 120000;
      std::vector<float> in(count, 1.0f), out(count, 0.0f);
      seen& s = v[static_cast<std::size_t>(c.rank())];
      try {
        if (in_place) c.all_reduce(std::span<float>(in));
        else c.all_reduce(std::span<const float>(in), std::span<float>(out));
      } catch (const braid::error& e) {
        s.code = static_cast<int>(e.code());
        std::snprintf(s.what, sizeof(s.what), "%s", e.what());
      }
    }, o);
    for (std::size_t r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << v[r].what);
      CHECK(v[r].code == static_cast<int>(braid::errc::mismatch));
      CHECK(std::string(v[r].what).find("mismatched calls") != std::string::npos);
      // The rank that saw the mismatch describes its own call: this very all_reduce of floats.
      const std::string w = v[r].what;
      CHECK(w.find("called all_reduce") != std::string::npos);
      CHECK(w.find("float") != std::string::npos);
      CHECK((w.find("count 100000") != std::string::npos || w.find("count 120000") != std::string::npos));
    }
  }
}

// Every schedule: mismatched counts (the longer rank reads past the shorter one's buffers if anything
// lets it) with each algorithm that implements the collective, forced per call, on 2, 3 and 4 thread
// ranks, staged and zero-copy, and on 3 processes with registered inputs.
TEST_CASE("mismatch outside debug mode: mismatched counts under every algorithm raise mismatch_error on every rank") {
  const braid::collective ids[] = {braid::collective::all_reduce, braid::collective::broadcast, braid::collective::reduce,
                                   braid::collective::reduce_scatter, braid::collective::all_gather};
  int cases = 0;
  for (std::size_t i = 0; i < 5; ++i)
    for (braid::algo a : braid::all_algos) {
      if (!braid::supports(a, ids[i])) continue;
      const coll_kind k = all_colls[i];
      const braid::call_options co{a};
      for (int n : {2, 3, 4})
        for (bool zero_copy : {false, true}) {
          INFO(n << " thread ranks, " << std::string(coll_name(k)) << ", " << std::string(braid::name(a)) << ", "
                 << std::string(zero_copy ? "zero-copy" : "staged"));
          std::vector<seen> v(static_cast<std::size_t>(n));
          std::barrier done(n);
          braid::run_threads(n, [&](communicator& c) {
            keeper keep;
            const std::size_t count = c.rank() == c.size() - 1 ? base_count * 6 / 5 : base_count;
            run_steps(c, v[static_cast<std::size_t>(c.rank())],
                      [&] { one_call<float>(c, k, count, 0, false, source::ordinary, keep, co); });
            done.arrive_and_wait();
          }, call_word_options(zero_copy));
          std::string where;
          check_seen(v, where);
          ++cases;
        }
      INFO("3 processes, registered inputs, " << std::string(coll_name(k)) << ", " << std::string(braid::name(a)));
      auto* v = static_cast<seen*>(::mmap(nullptr, 3 * sizeof(seen), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
      REQUIRE(v != MAP_FAILED);
      for (int r = 0; r < 3; ++r) new (&v[r]) seen{};
      const auto status = braid::testing::fork_ranks(3, [&](int rank, const braid::unique_id& id) {
        communicator c = communicator::join(id, rank, 3, call_word_options(false));
        keeper keep;
        const std::size_t count = rank == 2 ? base_count * 6 / 5 : base_count;
        run_steps(c, v[rank], [&] { one_call<float>(c, k, count, 0, false, source::registered, keep, co); });
        return 0;
      }, 60s);
      for (int st : status) CHECK(st == 0);
      std::vector<seen> got(v, v + 3);
      std::string where;
      check_seen(got, where);
      ::munmap(v, 3 * sizeof(seen));
      ++cases;
    }
  MESSAGE("mismatched counts under every algorithm: " << cases << " cases");
}
