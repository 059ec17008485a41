// tests/cuda/group/test_gpu_p2p.cpp — point to point on the one-process CUDA communicator
// (braid::cuda::communicator::send / recv), on the emulated CUDA device (braid::emu): one host thread
// per rank, as a pipeline-parallel trainer drives them.
//
// Groups: 2 ranks on two emulated GPUs, 3 ranks on three, 2 ranks sharing one (BRAID_EMU_DEVICES=3,
// set by CTest). Cases:
//   - a ring of sends (r -> r+1) and back (r+1 -> r), float, double, int8_t and a 3-byte struct,
//     counts 1, 7 and about 1 MiB; bytes compared exactly;
//   - stream order: the sender overwrites its buffer right after send() on its stream while the
//     receiver's stream is held by a slow host function before the copy (the receiver must still get
//     the old bytes: the sender's stream waits for the copy); the sender's data is written by work
//     still queued behind a slow host function at its send (the receiver must get the new bytes: the
//     copy waits for the sender's stream); the receiver's own earlier fill comes before the copy;
//   - three messages in flight to one peer, matched in order;
//   - errors: mismatched sizes (mismatch_error on both ranks, the pair stays usable), a recv or a send
//     without a partner (timeout_error within the bound; a withdrawn send is never delivered), abort()
//     from another thread waking a blocked recv and a blocked send, invalid peers, self, null, a
//     one-rank group, a call inside group_scope (invalid_usage), a call on a capturing stream.
// The slow host functions sleep 300 ms: on the emulator every stream has a thread of its own, so the
// other side's work runs meanwhile, and an ordering that is missing shows up as wrong bytes.
#include <braid/cuda.cuh>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

#define EMU_OK(expr)                                                                                 \
  do {                                                                                               \
    const cudaError_t emu_ok_e_ = (expr);                                                            \
    if (emu_ok_e_ != cudaSuccess) throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorName(emu_ok_e_)); \
  } while (0)

struct rgb {
  unsigned char r, g, b;
};
static_assert(sizeof(rgb) == 3);

// The bytes of message `tag` from rank `r`: a hash of (r, tag, i), so that a message from another
// rank, another call or another offset never looks right.
std::vector<unsigned char> pattern(int r, int tag, std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  std::uint64_t x = 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(r + 1) ^ static_cast<std::uint64_t>(tag) * 0xbf58476d1ce4e5b9ULL;
  for (std::size_t i = 0; i < bytes; ++i) {
    x ^= x >> 31;
    x *= 0x94d049bb133111ebULL;
    x += i;
    v[i] = static_cast<unsigned char>(x >> 56);
  }
  return v;
}

// Device memory of the calling thread's current device, filled with `bytes` (synchronously: a
// cudaMemcpy from pageable memory may return before its copy, and the test streams are non-blocking,
// so they would not wait for the legacy stream).
void* device_bytes(const std::vector<unsigned char>& bytes) {
  void* p = nullptr;
  EMU_OK(cudaMalloc(&p, bytes.size()));
  EMU_OK(cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  EMU_OK(cudaStreamSynchronize(nullptr));
  return p;
}
std::vector<unsigned char> host_bytes(const void* p, std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  EMU_OK(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost));
  return v;
}

void sleep_300ms(void*) { std::this_thread::sleep_for(300ms); }

struct group {
  std::vector<int> devices;
  std::vector<braid::cuda::communicator> comms;
  std::vector<cudaStream_t> streams;
  explicit group(std::vector<int> devs, std::chrono::nanoseconds timeout = 20s) : devices(std::move(devs)) {
    braid::cuda::group_options go;
    go.base.timeout = timeout;
    go.threads_per_block = 32; // no kernel of the group runs here; keep create_group cheap
    go.max_blocks_per_rank = 1;
    comms = braid::cuda::create_group(devices, go);
    for (int d : devices) {
      EMU_OK(cudaSetDevice(d));
      cudaStream_t s = nullptr;
      EMU_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams.push_back(s);
    }
  }
  ~group() {
    for (std::size_t r = 0; r < streams.size(); ++r) {
      cudaSetDevice(devices[r]);
      cudaStreamSynchronize(streams[r]);
      cudaStreamDestroy(streams[r]);
    }
  }
  // Buffers freed only once every rank's thread has ended (free_later): should an ordering be missing,
  // a copy still queued must read stale bytes, which the test sees, not freed memory, which crashes.
  std::mutex later_m;
  std::vector<std::pair<int, void*>> later;
  void free_later(int r, void* p) {
    std::lock_guard<std::mutex> lk(later_m);
    later.emplace_back(devices[static_cast<std::size_t>(r)], p);
  }
  void free_now() {
    for (auto& [d, p] : later) {
      cudaSetDevice(d);
      cudaDeviceSynchronize();
      cudaFree(p);
    }
    later.clear();
  }
  int size() const { return static_cast<int>(devices.size()); }
  cudaStream_t stream(int r) const { return streams[static_cast<std::size_t>(r)]; }
  braid::cuda::communicator& comm(int r) { return comms[static_cast<std::size_t>(r)]; }

  // Runs body(r) on one thread per rank (its device current) and rethrows the first failure.
  void run(const std::function<void(int)>& body) {
    std::vector<std::exception_ptr> errs(devices.size());
    std::vector<std::thread> ts;
    for (int r = 0; r < size(); ++r)
      ts.emplace_back([&, r] {
        try {
          EMU_OK(cudaSetDevice(devices[static_cast<std::size_t>(r)]));
          body(r);
        } catch (...) {
          errs[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : ts) t.join();
    free_now();
    for (auto& e : errs)
      if (e) std::rethrow_exception(e);
  }
};

std::string describe(const std::vector<int>& devices) {
  std::string s = "devices {";
  for (std::size_t i = 0; i < devices.size(); ++i) s += (i ? ", " : "") + std::to_string(devices[i]);
  return s + "}";
}

const std::vector<std::vector<int>> layouts = {{0, 1}, {0, 1, 2}, {0, 0}};

// One round trip of count elements of T: a ring forward (r -> r+1, the last rank to rank 0), then
// backward (r+1 -> r). Rank 0 sends first in each direction, every other rank receives first.
template <class T> void ring_and_back(group& g, std::size_t count, int tag) {
  const int n = g.size();
  const std::size_t bytes = count * sizeof(T);
  g.run([&](int r) {
    braid::cuda::communicator& c = g.comm(r);
    cudaStream_t s = g.stream(r);
    for (int dir = 0; dir < 2; ++dir) {
      const int to = dir == 0 ? (r + 1) % n : (r + n - 1) % n, from = dir == 0 ? (r + n - 1) % n : (r + 1) % n;
      void* out = device_bytes(pattern(r, tag + dir, bytes));
      void* in = device_bytes(std::vector<unsigned char>(bytes, 0));
      if (r == 0) {
        c.send(static_cast<const T*>(out), count, to, s);
        c.recv(static_cast<T*>(in), count, from, s);
      } else {
        c.recv(static_cast<T*>(in), count, from, s);
        c.send(static_cast<const T*>(out), count, to, s);
      }
      EMU_OK(cudaStreamSynchronize(s));
      if (host_bytes(in, bytes) != pattern(from, tag + dir, bytes))
        throw std::runtime_error("rank " + std::to_string(r) + " received wrong bytes from rank " + std::to_string(from) + " (" +
                                 std::to_string(count) + " elements of " + std::to_string(sizeof(T)) + " bytes)");
      g.free_later(r, out);
      g.free_later(r, in);
    }
  });
}

template <class F> braid::errc code_of(F&& f) {
  try {
    f();
  } catch (const braid::error& e) {
    return e.code();
  }
  return braid::errc{};
}

} // namespace

TEST_CASE("send/recv: ring and back, every layout, type and size") {
  for (const auto& devs : layouts) {
    group g(devs);
    int tag = 0;
    for (std::size_t bytes_target : {std::size_t{0}, std::size_t{1} << 20}) {
      auto counts = [&](std::size_t elem) {
        return bytes_target ? std::vector<std::size_t>{bytes_target / elem + 1} : std::vector<std::size_t>{1, 7};
      };
      for (std::size_t k : counts(sizeof(float))) {
        CAPTURE(describe(devs));
        CAPTURE(k);
        CHECK_NOTHROW(ring_and_back<float>(g, k, tag += 2));
      }
      for (std::size_t k : counts(sizeof(double))) {
        CAPTURE(describe(devs));
        CAPTURE(k);
        CHECK_NOTHROW(ring_and_back<double>(g, k, tag += 2));
      }
      for (std::size_t k : counts(sizeof(std::int8_t))) {
        CAPTURE(describe(devs));
        CAPTURE(k);
        CHECK_NOTHROW(ring_and_back<std::int8_t>(g, k, tag += 2));
      }
      for (std::size_t k : counts(sizeof(rgb))) {
        CAPTURE(describe(devs));
        CAPTURE(k);
        CHECK_NOTHROW(ring_and_back<rgb>(g, k, tag += 2));
      }
    }
  }
}

TEST_CASE("send/recv: the sender's stream waits for the copy; the copy waits for both streams") {
  for (const auto& devs : {std::vector<int>{0, 1}, std::vector<int>{0, 0}}) {
    CAPTURE(describe(devs));
    group g(devs);
    const std::size_t count = 100003, bytes = count * sizeof(float);
    const auto old_bytes = pattern(0, 1, bytes), new_bytes = pattern(0, 2, bytes);
    // 1. The receiver's stream is held 300 ms, and filled, before its copy; the sender overwrites its
    // buffer on its stream right after send(). The receiver must get the bytes as of the send.
    std::vector<unsigned char> got;
    g.run([&](int r) {
      cudaStream_t s = g.stream(r);
      if (r == 0) {
        void* buf = device_bytes(old_bytes);
        g.comm(0).send(static_cast<const float*>(buf), count, 1, s);
        EMU_OK(cudaMemsetAsync(buf, 0xEE, bytes, s)); // must run after the copy
        EMU_OK(cudaStreamSynchronize(s));
        g.free_later(r, buf);
      } else {
        void* buf = device_bytes(std::vector<unsigned char>(bytes, 0));
        EMU_OK(cudaLaunchHostFunc(s, sleep_300ms, nullptr));
        EMU_OK(cudaMemsetAsync(buf, 0x11, bytes, s)); // the receiver's own earlier work: before the copy
        g.comm(1).recv(static_cast<float*>(buf), count, 0, s);
        EMU_OK(cudaStreamSynchronize(s));
        got = host_bytes(buf, bytes);
        g.free_later(r, buf);
      }
    });
    CHECK_MESSAGE(got == old_bytes, "the receiver did not get the bytes as of the send (0xEE: the sender's stream "
                                    "overwrote them before the copy; 0x11: the copy ran before the receiver's earlier work)");
    // 2. The sender's data is written by work queued behind 300 ms on its stream at its send: the copy
    // must wait for it.
    got.clear();
    g.run([&](int r) {
      cudaStream_t s = g.stream(r);
      if (r == 0) {
        void* buf = device_bytes(std::vector<unsigned char>(bytes, 0));
        void* src = device_bytes(new_bytes);
        EMU_OK(cudaLaunchHostFunc(s, sleep_300ms, nullptr));
        EMU_OK(cudaMemcpyAsync(buf, src, bytes, cudaMemcpyDeviceToDevice, s));
        g.comm(0).send(static_cast<const float*>(buf), count, 1, s);
        EMU_OK(cudaStreamSynchronize(s));
        g.free_later(r, buf);
        g.free_later(r, src);
      } else {
        void* buf = device_bytes(std::vector<unsigned char>(bytes, 0));
        g.comm(1).recv(static_cast<float*>(buf), count, 0, s);
        EMU_OK(cudaStreamSynchronize(s));
        got = host_bytes(buf, bytes);
        g.free_later(r, buf);
      }
    });
    CHECK_MESSAGE(got == new_bytes, "the copy did not wait for the sender's stream as of its send");
  }
}

TEST_CASE("send/recv: three messages in flight to one peer arrive in order") {
  for (const auto& devs : {std::vector<int>{0, 1}, std::vector<int>{0, 0}}) {
    CAPTURE(describe(devs));
    group g(devs);
    const std::size_t counts[3] = {5, 1000, 33};
    std::vector<std::vector<unsigned char>> got(3);
    g.run([&](int r) {
      cudaStream_t s = g.stream(r);
      std::vector<void*> bufs;
      // The receiver's stream is held first, so all three copies are still queued when the sender's
      // three sends have returned and it overwrites every buffer.
      if (r == 1) EMU_OK(cudaLaunchHostFunc(s, sleep_300ms, nullptr));
      for (int k = 0; k < 3; ++k) {
        const std::size_t bytes = counts[k] * sizeof(double);
        bufs.push_back(device_bytes(r == 0 ? pattern(0, 100 + k, bytes) : std::vector<unsigned char>(bytes, 0)));
        if (r == 0) g.comm(0).send(static_cast<const double*>(bufs.back()), counts[k], 1, s);
        else g.comm(1).recv(static_cast<double*>(bufs.back()), counts[k], 0, s);
      }
      if (r == 0)
        for (int k = 0; k < 3; ++k) EMU_OK(cudaMemsetAsync(bufs[static_cast<std::size_t>(k)], 0xEE, counts[k] * sizeof(double), s));
      EMU_OK(cudaStreamSynchronize(s));
      if (r == 1)
        for (int k = 0; k < 3; ++k) got[static_cast<std::size_t>(k)] = host_bytes(bufs[static_cast<std::size_t>(k)], counts[k] * sizeof(double));
      for (void* b : bufs) g.free_later(r, b);
    });
    for (int k = 0; k < 3; ++k) CHECK(got[static_cast<std::size_t>(k)] == pattern(0, 100 + k, counts[k] * sizeof(double)));
  }
}

TEST_CASE("send/recv: mismatched sizes raise mismatch_error on both ranks; the pair stays usable") {
  group g({0, 1});
  std::string send_msg, recv_msg;
  braid::errc send_code{}, recv_code{};
  std::vector<unsigned char> got;
  g.run([&](int r) {
    cudaStream_t s = g.stream(r);
    void* buf = device_bytes(pattern(r, 7, 64));
    try {
      if (r == 0) g.comm(0).send(static_cast<const float*>(buf), 3, 1, s);
      else g.comm(1).recv(static_cast<float*>(buf), 4, 0, s);
    } catch (const braid::error& e) {
      (r == 0 ? send_code : recv_code) = e.code();
      (r == 0 ? send_msg : recv_msg) = e.what();
      CHECK(e.peer() == 1 - r);
      CHECK(e.rank() == r);
      CHECK(e.collective() == (r == 0 ? "send" : "recv"));
      CHECK(e.sequence() == 1);
    }
    // The next message of the pair matches the next call.
    if (r == 0) g.comm(0).send(static_cast<const float*>(buf), 16, 1, s);
    else g.comm(1).recv(static_cast<float*>(buf), 16, 0, s);
    EMU_OK(cudaStreamSynchronize(s));
    if (r == 1) got = host_bytes(buf, 64);
    EMU_OK(cudaFree(buf));
  });
  CHECK(send_code == braid::errc::mismatch);
  CHECK(recv_code == braid::errc::mismatch);
  INFO(send_msg);
  INFO(recv_msg);
  CHECK(send_msg.find("12 bytes") != std::string::npos);
  CHECK(send_msg.find("16 bytes") != std::string::npos);
  CHECK(recv_msg.find("12 bytes") != std::string::npos);
  CHECK(recv_msg.find("16 bytes") != std::string::npos);
  CHECK(got == pattern(0, 7, 64));
}

namespace {
// Runs call, a send or recv (`name`) that has no partner: it must raise timeout_error once `timeout`
// has passed (and well before 2 s), naming `rank` and `peer`. `partner` names what was missing, for
// the failure where it returns. Returns the error's message.
template <class F>
std::string expect_timeout(F&& call, clk::duration timeout, int rank, int peer, const char* name, const char* partner) {
  INFO(name << " on rank " << rank);
  const auto t0 = clk::now();
  try {
    call();
  } catch (const braid::timeout_error& e) {
    const auto waited = clk::now() - t0;
    CHECK(waited >= timeout);
    CHECK(waited < 2s);
    CHECK(e.rank() == rank);
    CHECK(e.peer() == peer);
    CHECK(e.collective() == name);
    return e.what();
  }
  FAIL(name << " returned without a " << partner);
  return {};
}
} // namespace

TEST_CASE("send/recv: timeouts") {
  group g({0, 1}, 300ms);
  // A recv with no sender.
  g.run([&](int r) {
    if (r != 1) return;
    void* buf = device_bytes(std::vector<unsigned char>(16, 0));
    const std::string what =
        expect_timeout([&] { g.comm(1).recv(static_cast<float*>(buf), 4, 0, g.stream(1)); }, 300ms, 1, 0, "recv", "sender");
    CHECK(what.find("recv") != std::string::npos);
    EMU_OK(cudaFree(buf));
  });
  // A send with no receiver: withdrawn, never delivered to a later recv.
  std::vector<unsigned char> got;
  std::atomic<bool> withdrawn{false};
  g.run([&](int r) {
    cudaStream_t s = g.stream(r);
    void* a = device_bytes(pattern(0, 1, 16));
    void* b = device_bytes(pattern(0, 2, 16));
    if (r == 0) {
      (void)expect_timeout([&] { g.comm(0).send(static_cast<const float*>(a), 4, 1, s); }, 300ms, 0, 1, "send", "receiver");
      withdrawn = true;
      g.comm(0).send(static_cast<const float*>(b), 4, 1, s);
    } else {
      while (!withdrawn) std::this_thread::sleep_for(1ms); // the first send has given up
      g.comm(1).recv(static_cast<float*>(a), 4, 0, s);
      EMU_OK(cudaStreamSynchronize(s));
      got = host_bytes(a, 16);
    }
    EMU_OK(cudaStreamSynchronize(s));
    EMU_OK(cudaFree(a));
    EMU_OK(cudaFree(b));
  });
  CHECK(got == pattern(0, 2, 16));
}

TEST_CASE("send/recv: abort() from another thread wakes a blocked recv and a blocked send") {
  for (int sender : {0, 1}) {
    CAPTURE(sender);
    group g({0, 1}, 20s);
    std::atomic<long long> woke_after_abort_us{-1};
    std::atomic<clk::rep> aborted_at{0};
    braid::errc code{};
    std::thread aborter([&] {
      std::this_thread::sleep_for(200ms);
      aborted_at = clk::now().time_since_epoch().count();
      g.comm(0).abort();
    });
    g.run([&](int r) {
      if (r != 1) return; // rank 1 waits alone: for a sender (sender 0) or a receiver (sender 1)
      void* buf = device_bytes(std::vector<unsigned char>(16, 0));
      try {
        if (sender == 0) g.comm(1).recv(static_cast<float*>(buf), 4, 0, g.stream(1));
        else g.comm(1).send(static_cast<const float*>(buf), 4, 0, g.stream(1));
      } catch (const braid::error& e) {
        code = e.code();
        const auto now = clk::now().time_since_epoch().count();
        woke_after_abort_us = std::chrono::duration_cast<std::chrono::microseconds>(clk::duration(now - aborted_at.load())).count();
        CHECK(e.collective() == (sender == 0 ? "recv" : "send"));
        CHECK(e.peer() == 0);
        CHECK(e.rank() == 0); // the record's: the rank that called abort() (api.md)
      }
      EMU_OK(cudaFree(buf));
    });
    aborter.join();
    CHECK(code == braid::errc::aborted);
    MESSAGE("woke " << woke_after_abort_us.load() << " us after abort()");
    CHECK(woke_after_abort_us.load() >= 0);
    CHECK(woke_after_abort_us.load() < 200000);
    // The group is stopped: later calls raise at once.
    g.run([&](int r) {
      if (r != 0) return;
      void* buf = device_bytes(std::vector<unsigned char>(16, 0));
      CHECK(code_of([&] { g.comm(0).send(static_cast<const float*>(buf), 4, 1, g.stream(0)); }) == braid::errc::aborted);
      EMU_OK(cudaFree(buf));
    });
  }
}

TEST_CASE("send/recv: refused arguments and uses") {
  using braid::errc;
  group g({0, 1, 2});
  EMU_OK(cudaSetDevice(0));
  float* buf = nullptr;
  EMU_OK(cudaMalloc(reinterpret_cast<void**>(&buf), 64));
  braid::cuda::communicator& c = g.comm(0);
  cudaStream_t s = g.stream(0);
  CHECK(code_of([&] { c.send(buf, 4, 3, s); }) == errc::invalid_argument);
  CHECK(code_of([&] { c.recv(buf, 4, -1, s); }) == errc::invalid_argument);
  CHECK(code_of([&] { c.send(buf, 4, 0, s); }) == errc::invalid_argument); // self
  CHECK(code_of([&] { c.recv(buf, 4, 0, s); }) == errc::invalid_argument);
  CHECK(code_of([&] { c.send(static_cast<const float*>(nullptr), 4, 1, s); }) == errc::invalid_argument);
  CHECK(code_of([&] { c.recv(static_cast<float*>(nullptr), 4, 1, s); }) == errc::invalid_argument);
  CHECK(code_of([&] { c.send(buf, ~std::size_t{0} / 2, 1, s); }) == errc::invalid_argument); // overflow
  try {
    c.send(buf, 4, 0, s);
  } catch (const braid::invalid_argument& e) {
    CHECK(e.rank() == 0);
    CHECK(e.collective() == "send");
    CHECK(std::string(e.what()).find("itself") != std::string::npos);
  }
  // count 0: returns at once, synchronises nothing (no peer calls), a null buffer allowed.
  const auto t0 = clk::now();
  CHECK_NOTHROW(c.send(static_cast<const float*>(nullptr), 0, 1, s));
  CHECK_NOTHROW(c.recv(static_cast<float*>(nullptr), 0, 2, s));
  CHECK(clk::now() - t0 < 1s);
  // Inside a bracket.
  {
    braid::cuda::group_scope bracket;
    CHECK(code_of([&] { c.send(buf, 4, 1, s); }) == errc::invalid_usage);
    try {
      c.recv(buf, 4, 1, s);
    } catch (const braid::usage_error& e) {
      CHECK(std::string(e.what()).find("one host thread per rank") != std::string::npos);
    }
  }
  // On a capturing stream.
  EMU_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CHECK(code_of([&] { c.send(buf, 4, 1, s); }) == errc::unsupported);
  cudaGraph_t graph = nullptr;
  EMU_OK(cudaStreamEndCapture(s, &graph));
  if (graph) EMU_OK(cudaGraphDestroy(graph));
  // A group of one rank has no peer.
  group one({0});
  CHECK(code_of([&] { one.comm(0).send(buf, 4, 0, one.stream(0)); }) == errc::invalid_argument);
  EMU_OK(cudaFree(buf));
}
