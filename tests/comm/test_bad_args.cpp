// Every invalid argument gets its own specific error (exception type, code, rank and collective in the
// context) before any buffer is touched: input and output are filled with a sentinel pattern before
// the call and compared byte for byte after it. An invalid_argument leaves the communicator usable
// (the call does not count: calls() is unchanged, and a following valid all_reduce works on every
// rank); an empty (default-constructed, moved-from or closed) communicator raises usage_error.
// Runs with 1 rank and with 3 thread ranks; in the multi-rank runs a bad call is made only by the ranks
// on which it is invalid (e.g. a null input of broadcast only on the root), so nobody waits.
#include <doctest/doctest.h>

#include <braid/braid.hpp>


#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using braid::algo;
using braid::call_options;
using braid::communicator;
using braid::errc;

constexpr std::size_t K = 5;          // elements per block in every bad call
constexpr std::size_t IN = 64;        // byte offset of the input region in an arena
constexpr std::size_t OUT = 8192;     // byte offset of the output region
constexpr std::size_t ARENA = 16384;  // bytes

// Memory filled with a sentinel pattern; untouched() says whether every byte still holds it.
class arena {
public:
  arena() : words_(ARENA / 8) {
    for (std::size_t i = 0; i < ARENA; ++i) base()[i] = pattern(i);
  }
  std::byte* base() { return reinterpret_cast<std::byte*>(words_.data()); }
  template <class T> T* at(std::size_t byte_offset) { return reinterpret_cast<T*>(base() + byte_offset); }
  float* in() { return at<float>(IN); }
  float* out() { return at<float>(OUT); }
  bool untouched() const {
    const auto* b = reinterpret_cast<const std::byte*>(words_.data());
    for (std::size_t i = 0; i < ARENA; ++i)
      if (b[i] != pattern(i)) return false;
    return true;
  }

private:
  static std::byte pattern(std::size_t i) { return static_cast<std::byte>((i * 131 + 7) & 0xff); }
  std::vector<std::uint64_t> words_;
};

// Distinct case names seen by any rank in any run.
std::mutex tally_mutex;
std::set<std::string> tally;
void count_case(const std::string& name) {
  std::lock_guard<std::mutex> lock(tally_mutex);
  tally.insert(name);
}

// Runs call(arena) and checks it raises exactly E with `code`, names this rank and `coll` (when the
// communicator is live), does not count as a call, and leaves every byte of the arena untouched.
template <class E, class F>
void expect(communicator& c, errc code, const std::string& name, std::string_view coll, F&& call) {
  count_case(name);
  const bool live = c.valid();
  const int rank = live ? c.rank() : -1;
  const std::uint64_t calls = live ? c.calls() : 0;
  arena a;
  bool raised = false;
  try {
    call(a);
  } catch (const E& e) {
    raised = true;
    CHECK_MESSAGE(e.code() == code, name << ": " << e.what());
    if (live && !coll.empty()) {
      CHECK_MESSAGE(e.rank() == rank, name << ": " << e.what());
      CHECK_MESSAGE(e.collective() == coll, name << ": " << e.what());
    }
  } catch (const std::exception& e) {
    raised = true;
    FAIL_CHECK(name << ": wrong exception: " << e.what());
  }
  CHECK_MESSAGE(raised, name << ": no exception (rank " << rank << ")");
  CHECK_MESSAGE(a.untouched(), name << ": a buffer was modified (rank " << rank << ")");
  if (live) CHECK_MESSAGE(c.calls() == calls, name << ": the failed call was counted");
}

template <class F> void invalid(communicator& c, const std::string& name, std::string_view coll, F&& call) {
  expect<braid::invalid_argument>(c, errc::invalid_argument, name, coll, call);
}
template <class F> void unsupported(communicator& c, const std::string& name, std::string_view coll, F&& call) {
  expect<braid::unsupported_error>(c, errc::unsupported, name, coll, call);
}
template <class F> void usage(communicator& c, const std::string& name, F&& call) {
  expect<braid::usage_error>(c, errc::invalid_usage, name, {}, call);
}

// A call that is valid although a pointer is null or unused: must not throw nor touch anything.
template <class F> void valid(const std::string& name, F&& call) {
  count_case(name);
  arena a;
  try {
    call(a);
  } catch (const std::exception& e) {
    FAIL_CHECK(name << ": unexpected exception: " << e.what());
  }
  CHECK_MESSAGE(a.untouched(), name << ": a buffer was modified");
}

// A valid all_reduce on every rank: the communicator is still usable.
void check_usable(communicator& c, const char* after) {
  const int n = c.size();
  std::vector<std::int64_t> v(17, c.rank() + 1);
  try {
    c.all_reduce(std::span<std::int64_t>(v));
  } catch (const std::exception& e) {
    FAIL_CHECK("all_reduce after " << after << " failed: " << e.what());
    return;
  }
  for (auto x : v) CHECK_MESSAGE(x == std::int64_t{n} * (n + 1) / 2, "after " << after);
}

constexpr std::size_t huge = SIZE_MAX / 2;
// Fits in bytes for one block of floats, but not for size() blocks when size() >= 3.
constexpr std::size_t huge_blocks = static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(float) / 2;

void bad_all_reduce(communicator& c) {
  const std::string_view co = "all_reduce";
  auto inv = [&](const std::string& what, auto&& call) { invalid(c, "all_reduce: " + what, co, call); };
  inv("null input", [&](arena& a) { c.all_reduce<float>(nullptr, a.out(), K); });
  inv("null output", [&](arena& a) { c.all_reduce<float>(a.in(), nullptr, K); });
  inv("null input and output", [&](arena&) { c.all_reduce<float>(nullptr, nullptr, K); });
  inv("count SIZE_MAX / 2", [&](arena& a) { c.all_reduce(a.in(), a.out(), huge); });
  inv("count SIZE_MAX", [&](arena& a) { c.all_reduce(a.in(), a.out(), SIZE_MAX); });
  inv("count SIZE_MAX / 4 of double", [&](arena& a) { c.all_reduce(a.at<double>(IN), a.at<double>(OUT), SIZE_MAX / 4); });
  inv("misaligned input", [&](arena& a) { c.all_reduce(a.at<float>(IN + 1), a.out(), K); });
  inv("misaligned output", [&](arena& a) { c.all_reduce(a.in(), a.at<float>(OUT + 3), K); });
  inv("double input at a 4-byte offset", [&](arena& a) { c.all_reduce(a.at<double>(IN + 4), a.at<double>(OUT), K); });
  inv("output = input + 1 (partial overlap)", [&](arena& a) { c.all_reduce(a.in(), a.in() + 1, K); });
  inv("output = input + K - 1 (partial overlap)", [&](arena& a) { c.all_reduce(a.in(), a.in() + K - 1, K); });
  inv("input = output + 2 (partial overlap)", [&](arena& a) { c.all_reduce(a.in() + 2, a.in(), K); });
  inv("span sizes differ", [&](arena& a) {
    c.all_reduce(std::span<const float>(a.in(), K), std::span<float>(a.out(), K + 1));
  });
  inv("span sizes differ (output shorter)", [&](arena& a) {
    c.all_reduce(std::span<const float>(a.in(), K), std::span<float>(a.out(), K - 1));
  });
  valid("all_reduce: null input and output with count 0", [&](arena&) { c.all_reduce<float>(nullptr, nullptr, 0); });
  valid("all_reduce: empty spans", [&](arena&) { c.all_reduce(std::span<float>()); });
}

void bad_broadcast(communicator& c) {
  const int n = c.size(), r = c.rank(), root = n - 1;
  const std::string_view co = "broadcast";
  auto inv = [&](const std::string& what, auto&& call) { invalid(c, "broadcast: " + what, co, call); };
  inv("root -1", [&](arena& a) { c.broadcast(a.in(), a.out(), K, -1); });
  inv("root == size()", [&](arena& a) { c.broadcast(a.in(), a.out(), K, n); });
  inv("root INT_MIN", [&](arena& a) { c.broadcast(a.in(), a.out(), K, INT_MIN); });
  inv("root -1 in place (span)", [&](arena& a) { c.broadcast(std::span<float>(a.in(), K), -1); });
  inv("null output", [&](arena& a) { c.broadcast<float>(a.in(), nullptr, K, root); });
  inv("count SIZE_MAX / 2", [&](arena& a) { c.broadcast(a.in(), a.out(), huge, root); });
  inv("misaligned output", [&](arena& a) { c.broadcast(a.in(), a.at<float>(OUT + 2), K, root); });
  if (r == root) {
    inv("null input on the root", [&](arena& a) { c.broadcast<float>(nullptr, a.out(), K, root); });
    inv("misaligned input on the root", [&](arena& a) { c.broadcast(a.at<float>(IN + 1), a.out(), K, root); });
    inv("partial overlap on the root", [&](arena& a) { c.broadcast(a.in(), a.in() + 1, K, root); });
  }
  for (algo x : {algo::one_shot, algo::two_shot, algo::halving_doubling}) {
    const std::string an(braid::name(x));
    unsupported(c, "broadcast: algorithm " + an, co, [&](arena& a) { c.broadcast(a.in(), a.out(), K, root, call_options{x}); });
    unsupported(c, "broadcast: algorithm " + an + " with count 0", co,
                [&](arena& a) { c.broadcast(a.in(), a.out(), 0, root, call_options{x}); });
  }
  valid("broadcast: null input and output with count 0", [&](arena&) { c.broadcast<float>(nullptr, nullptr, 0, root); });
}

void bad_reduce(communicator& c) {
  const int n = c.size(), r = c.rank(), root = 0;
  const std::string_view co = "reduce";
  auto inv = [&](const std::string& what, auto&& call) { invalid(c, "reduce: " + what, co, call); };
  inv("root -1", [&](arena& a) { c.reduce(a.in(), a.out(), K, -1); });
  inv("root == size()", [&](arena& a) { c.reduce(a.in(), a.out(), K, n); });
  inv("null input", [&](arena& a) { c.reduce<float>(nullptr, a.out(), K, root); });
  inv("count SIZE_MAX / 2", [&](arena& a) { c.reduce(a.in(), a.out(), huge, root); });
  inv("misaligned input", [&](arena& a) { c.reduce(a.at<float>(IN + 1), a.out(), K, root); });
  if (r == root) {
    inv("null output on the root", [&](arena& a) { c.reduce<float>(a.in(), nullptr, K, root); });
    inv("misaligned output on the root", [&](arena& a) { c.reduce(a.in(), a.at<float>(OUT + 1), K, root); });
    inv("partial overlap on the root", [&](arena& a) { c.reduce(a.in() + 1, a.in(), K, root); });
  }
  for (algo x : {algo::one_shot, algo::two_shot, algo::halving_doubling}) {
    const std::string an(braid::name(x));
    unsupported(c, "reduce: algorithm " + an, co, [&](arena& a) { c.reduce(a.in(), a.out(), K, root, braid::sum<>{}, call_options{x}); });
  }
  valid("reduce: null input and output with count 0", [&](arena&) { c.reduce<float>(nullptr, nullptr, 0, root); });
}

void bad_reduce_scatter(communicator& c) {
  const int n = c.size(), r = c.rank();
  const std::size_t un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
  const std::string_view co = "reduce_scatter";
  auto inv = [&](const std::string& what, auto&& call) { invalid(c, "reduce_scatter: " + what, co, call); };
  inv("null input", [&](arena& a) { c.reduce_scatter<float>(nullptr, a.out(), K); });
  inv("null output", [&](arena& a) { c.reduce_scatter<float>(a.in(), nullptr, K); });
  inv("count SIZE_MAX / 2", [&](arena& a) { c.reduce_scatter(a.in(), a.out(), huge); });
  if (n >= 3) // count * sizeof(T) fits, count * size() * sizeof(T) does not
    inv("count * size() overflows", [&](arena& a) { c.reduce_scatter(a.in(), a.out(), huge_blocks); });
  inv("misaligned input", [&](arena& a) { c.reduce_scatter(a.at<float>(IN + 1), a.out(), K); });
  inv("misaligned output", [&](arena& a) { c.reduce_scatter(a.in(), a.at<float>(OUT + 1), K); });
  inv("output = input + rank * count + 1", [&](arena& a) { c.reduce_scatter(a.in(), a.in() + ur * K + 1, K); });
  inv("output overlaps the start of the input", [&](arena& a) { c.reduce_scatter(a.in() + 1, a.in(), K); });
  if (n > 1)
    inv("output = another rank's block of the input", [&](arena& a) {
      c.reduce_scatter(a.in(), a.in() + ((ur + 1) % un) * K, K);
    });
  inv("span: in.size() = size() * out.size() + 1", [&](arena& a) {
    c.reduce_scatter(std::span<const float>(a.in(), un * K + 1), std::span<float>(a.out(), K));
  });
  inv("span: out.size() one too large", [&](arena& a) {
    c.reduce_scatter(std::span<const float>(a.in(), un * K), std::span<float>(a.out(), K + 1));
  });
  for (algo x : {algo::one_shot, algo::two_shot, algo::tree}) {
    const std::string an(braid::name(x));
    unsupported(c, "reduce_scatter: algorithm " + an, co,
                [&](arena& a) { c.reduce_scatter(a.in(), a.out(), K, braid::sum<>{}, call_options{x}); });
  }
  valid("reduce_scatter: null input and output with count 0", [&](arena&) { c.reduce_scatter<float>(nullptr, nullptr, 0); });
}

void bad_all_gather(communicator& c) {
  const int n = c.size(), r = c.rank();
  const std::size_t un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
  const std::string_view co = "all_gather";
  auto inv = [&](const std::string& what, auto&& call) { invalid(c, "all_gather: " + what, co, call); };
  inv("null input", [&](arena& a) { c.all_gather<float>(nullptr, a.out(), K); });
  inv("null output", [&](arena& a) { c.all_gather<float>(a.in(), nullptr, K); });
  inv("count SIZE_MAX / 2", [&](arena& a) { c.all_gather(a.in(), a.out(), huge); });
  if (n >= 3)
    inv("count * size() overflows", [&](arena& a) { c.all_gather(a.in(), a.out(), huge_blocks); });
  inv("misaligned input", [&](arena& a) { c.all_gather(a.at<float>(IN + 1), a.out(), K); });
  inv("misaligned output", [&](arena& a) { c.all_gather(a.in(), a.at<float>(OUT + 2), K); });
  inv("input = output + rank * count + 1", [&](arena& a) { c.all_gather(a.out() + ur * K + 1, a.out(), K); });
  inv("input overlaps the start of the output", [&](arena& a) { c.all_gather(a.out(), a.out() + 1, K); });
  if (n > 1)
    inv("input = another rank's block of the output", [&](arena& a) {
      c.all_gather(a.out() + ((ur + 1) % un) * K, a.out(), K);
    });
  inv("span: out.size() = size() * in.size() + 1", [&](arena& a) {
    c.all_gather(std::span<const float>(a.in(), K), std::span<float>(a.out(), un * K + 1));
  });
  inv("span: in.size() one too large", [&](arena& a) {
    c.all_gather(std::span<const float>(a.in(), K + 1), std::span<float>(a.out(), un * K));
  });
  for (algo x : {algo::one_shot, algo::two_shot, algo::tree}) {
    const std::string an(braid::name(x));
    unsupported(c, "all_gather: algorithm " + an, co, [&](arena& a) { c.all_gather(a.in(), a.out(), K, call_options{x}); });
  }
  valid("all_gather: null input and output with count 0", [&](arena&) { c.all_gather<float>(nullptr, nullptr, 0); });
}

void bad_p2p(communicator& c) {
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int peer : {-1, n, r, INT_MAX}) {
    const std::string label = peer == n ? "size()" : peer == r ? "self" : peer == INT_MAX ? "INT_MAX" : "-1";
    invalid(c, "send: peer " + label, "send", [&](arena& a) { c.send(a.in(), K, peer); });
    invalid(c, "recv: peer " + label, "recv", [&](arena& a) { c.recv(a.out(), K, peer); });
    invalid(c, "send: peer " + label + " with count 0", "send", [&](arena&) { c.send<float>(nullptr, 0, peer); });
    invalid(c, "recv: peer " + label + " with count 0", "recv", [&](arena&) { c.recv<float>(nullptr, 0, peer); });
    invalid(c, "sendrecv: send peer " + label, "sendrecv", [&](arena& a) { c.sendrecv(a.in(), K, peer, a.out(), K, prev); });
    invalid(c, "sendrecv: recv peer " + label, "sendrecv", [&](arena& a) { c.sendrecv(a.in(), K, next, a.out(), K, peer); });
  }
  if (n == 1) return;
  invalid(c, "send: null buffer", "send", [&](arena&) { c.send<float>(nullptr, K, next); });
  invalid(c, "recv: null buffer", "recv", [&](arena&) { c.recv<float>(nullptr, K, prev); });
  invalid(c, "send: count SIZE_MAX / 2", "send", [&](arena& a) { c.send(a.in(), huge, next); });
  invalid(c, "recv: count SIZE_MAX / 2", "recv", [&](arena& a) { c.recv(a.out(), huge, prev); });
  invalid(c, "send: misaligned buffer", "send", [&](arena& a) { c.send(a.at<float>(IN + 1), K, next); });
  invalid(c, "recv: misaligned buffer", "recv", [&](arena& a) { c.recv(a.at<double>(OUT + 4), K, prev); });
  invalid(c, "sendrecv: null send buffer", "sendrecv", [&](arena& a) { c.sendrecv<float>(nullptr, K, next, a.out(), K, prev); });
  invalid(c, "sendrecv: null recv buffer", "sendrecv", [&](arena& a) { c.sendrecv<float>(a.in(), K, next, nullptr, K, prev); });
  invalid(c, "sendrecv: send count SIZE_MAX / 2", "sendrecv", [&](arena& a) { c.sendrecv(a.in(), huge, next, a.out(), K, prev); });
  invalid(c, "sendrecv: recv count SIZE_MAX / 2", "sendrecv", [&](arena& a) { c.sendrecv(a.in(), K, next, a.out(), huge, prev); });
  invalid(c, "sendrecv: misaligned send buffer", "sendrecv",
          [&](arena& a) { c.sendrecv(a.at<float>(IN + 2), K, next, a.out(), K, prev); });
  invalid(c, "sendrecv: misaligned recv buffer", "sendrecv",
          [&](arena& a) { c.sendrecv(a.in(), K, next, a.at<float>(OUT + 1), K, prev); });
  invalid(c, "sendrecv: send and recv buffers overlap", "sendrecv",
          [&](arena& a) { c.sendrecv(a.in(), K, next, a.in() + K - 1, K, prev); });
  invalid(c, "sendrecv: send and recv buffers are the same", "sendrecv",
          [&](arena& a) { c.sendrecv(a.in(), K, next, a.in(), K, prev); });

  // Null is fine with count 0: rank 0 -> rank 1 with send/recv, then a ring with sendrecv.
  if (r == 0) valid("send: null buffer with count 0", [&](arena&) { c.send<float>(nullptr, 0, 1); });
  if (r == 1) valid("recv: null buffer with count 0", [&](arena&) { c.recv<float>(nullptr, 0, 0); });
  valid("sendrecv: null buffers with count 0", [&](arena&) { c.sendrecv<float>(nullptr, 0, next, nullptr, 0, prev); });
}

// Empty communicators: every member that needs the communicator raises usage_error.
void empty_calls(communicator& c, const std::string& kind) {
  CHECK_FALSE(c.valid());
  auto use = [&](const std::string& what, auto&& call) { usage(c, kind + ": " + what, call); };
  use("rank()", [&](arena&) { (void)c.rank(); });
  use("size()", [&](arena&) { (void)c.size(); });
  use("calls()", [&](arena&) { (void)c.calls(); });
  use("memory_bytes()", [&](arena&) { (void)c.memory_bytes(); });
  use("algorithm_for()", [&](arena&) { (void)c.algorithm_for(braid::collective::all_reduce, 1024); });
  use("abort()", [&](arena&) { c.abort(); });
  use("barrier", [&](arena&) { c.barrier(); });
  use("all_reduce", [&](arena& a) { c.all_reduce(a.in(), a.out(), K); });
  use("all_reduce (span)", [&](arena& a) { c.all_reduce(std::span<float>(a.in(), K)); });
  use("broadcast", [&](arena& a) { c.broadcast(a.in(), a.out(), K, 0); });
  use("reduce", [&](arena& a) { c.reduce(a.in(), a.out(), K, 0); });
  use("reduce_scatter", [&](arena& a) { c.reduce_scatter(a.in(), a.out(), K); });
  use("reduce_scatter (span)", [&](arena& a) { c.reduce_scatter(std::span<const float>(a.in(), K), std::span<float>(a.out(), K)); });
  use("all_gather", [&](arena& a) { c.all_gather(a.in(), a.out(), K); });
  use("all_gather (span)", [&](arena& a) { c.all_gather(std::span<const float>(a.in(), K), std::span<float>(a.out(), K)); });
  use("send", [&](arena& a) { c.send(a.in(), K, 0); });
  use("recv", [&](arena& a) { c.recv(a.out(), K, 0); });
  use("sendrecv", [&](arena& a) { c.sendrecv(a.in(), K, 0, a.out(), K, 0); });
  // Arguments that would be invalid too: emptiness is reported first.
  use("all_reduce with null pointers and count 0", [&](arena&) { c.all_reduce<float>(nullptr, nullptr, 0); });
  use("broadcast with root -1", [&](arena& a) { c.broadcast(a.in(), a.out(), K, -1); });
  c.close(); // idempotent on an empty communicator
  CHECK_FALSE(c.valid());
}

void all_bad_calls(communicator& c) {
  bad_all_reduce(c);
  check_usable(c, "bad all_reduce calls");
  bad_broadcast(c);
  check_usable(c, "bad broadcast calls");
  bad_reduce(c);
  check_usable(c, "bad reduce calls");
  bad_reduce_scatter(c);
  check_usable(c, "bad reduce_scatter calls");
  bad_all_gather(c);
  check_usable(c, "bad all_gather calls");
  bad_p2p(c);
  check_usable(c, "bad send/recv calls");

  // A bad call on one rank only: the others go ahead, and the repeated good call matches theirs.
  if (c.size() > 1 && c.rank() == 1)
    invalid(c, "all_reduce: null input on one rank only", "all_reduce",
            [&](arena& a) { c.all_reduce<float>(nullptr, a.out(), K); });
  check_usable(c, "a bad call on one rank only");

  // Moved from: the source is empty, the destination works; move it back for run_threads.
  communicator moved = std::move(c);
  empty_calls(c, "moved-from");
  check_usable(moved, "moving the communicator");
  c = std::move(moved);
  CHECK(c.valid());
  CHECK_FALSE(moved.valid());
  check_usable(c, "moving the communicator back");

  // Closed: after a barrier nobody waits for this rank any more.
  c.barrier();
  c.close();
  empty_calls(c, "closed");
}

braid::options test_options() { return braid::options{}.with_timeout(std::chrono::seconds(30)); }

} // namespace

TEST_CASE("bad arguments: default-constructed communicator") {
  communicator c;
  empty_calls(c, "default-constructed");
}

TEST_CASE("bad arguments: 1 rank") {
  CHECK_NOTHROW(braid::run_threads(1, [](communicator& c) { all_bad_calls(c); }, test_options()));
}

TEST_CASE("bad arguments: 3 ranks") {
  CHECK_NOTHROW(braid::run_threads(3, [](communicator& c) { all_bad_calls(c); }, test_options()));
}

TEST_CASE("bad arguments: a failed communicator refuses every call with usage_error") {
  // A 1-rank communicator cannot fail by itself; 2 ranks where rank 1 leaves at once make rank 0's
  // all_reduce fail with peer_error, after which rank 0 refuses everything.
  auto body = [](communicator& c) {
    if (c.rank() == 1) return; // leaves: run_threads closes it
    std::vector<float> v(K, 1.0f);
    CHECK_THROWS_AS(c.all_reduce(std::span<float>(v)), braid::peer_error);
    auto use = [&](const std::string& what, auto&& call) { usage(c, "failed: " + what, call); };
    use("all_reduce", [&](arena& a) { c.all_reduce(a.in(), a.out(), K); });
    use("all_reduce with null pointers and count 0", [&](arena&) { c.all_reduce<float>(nullptr, nullptr, 0); });
    use("broadcast", [&](arena& a) { c.broadcast(a.in(), a.out(), K, 0); });
    use("reduce", [&](arena& a) { c.reduce(a.in(), a.out(), K, 0); });
    use("reduce_scatter", [&](arena& a) { c.reduce_scatter(a.in(), a.out(), K); });
    use("all_gather", [&](arena& a) { c.all_gather(a.in(), a.out(), K); });
    use("barrier", [&](arena&) { c.barrier(); });
    use("send", [&](arena& a) { c.send(a.in(), K, 1); });
    use("recv", [&](arena& a) { c.recv(a.out(), K, 1); });
    use("sendrecv", [&](arena& a) { c.sendrecv(a.in(), K, 1, a.out(), K, 1); });
  };
  CHECK_NOTHROW(braid::run_threads(2, body, test_options()));
}

TEST_CASE("bad arguments: a call from a second thread while the owner is inside a call raises usage_error") {
  // Rank 0's thread is blocked in all_reduce (rank 1 holds back); a helper thread calls into rank 0's
  // communicator meanwhile: refused, nothing touched, and the blocked call then completes normally.
  std::atomic<communicator*> target{nullptr};
  std::atomic<bool> helper_done{false};
  auto body = [&](communicator& c) {
    std::vector<std::int64_t> v(100, c.rank() + 1);
    if (c.rank() == 0) {
      target = &c;
    } else {
      while (!helper_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    c.all_reduce(std::span<std::int64_t>(v));
    for (auto x : v) CHECK(x == 3);
  };
  std::thread helper([&] {
    while (!target) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(200)); // rank 0 is inside all_reduce now
    communicator& c = *target.load();
    // Only the call itself: rank() or calls() here would race with the owner's call.
    auto refused = [&](const std::string& name, auto&& call) {
      count_case(name);
      arena a;
      bool ok = false;
      try {
        call(a);
      } catch (const braid::usage_error& e) {
        ok = e.code() == errc::invalid_usage;
      } catch (const std::exception& e) {
        FAIL_CHECK(name << ": wrong exception: " << e.what());
      }
      CHECK_MESSAGE(ok, name);
      CHECK_MESSAGE(a.untouched(), name << ": a buffer was modified");
    };
    refused("second thread: all_reduce", [&](arena& a) { c.all_reduce(a.in(), a.out(), K); });
    refused("second thread: barrier", [&](arena&) { c.barrier(); });
    refused("second thread: send", [&](arena& a) { c.send(a.in(), K, 1); });
    refused("second thread: broadcast with a bad root", [&](arena& a) { c.broadcast(a.in(), a.out(), K, -1); });
    helper_done = true;
  });
  CHECK_NOTHROW(braid::run_threads(2, body, test_options()));
  helper.join();
}

TEST_CASE("bad arguments: count of distinct cases") {
  std::lock_guard<std::mutex> lock(tally_mutex);
  MESSAGE("distinct bad-argument cases checked: " << tally.size());
  CHECK(tally.size() >= 150);
}
