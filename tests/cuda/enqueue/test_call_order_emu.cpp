// tests/cuda/enqueue/test_call_order_emu.cpp — who orders a rank's calls (braid::cuda::call_order), and the
// launch's parts of ranks beyond its parameter block, on the emulated device:
//   - call_order::streams gives the reference's results on the process device path;
//   - calls that the streams leave unordered, run in different orders on two GPUs, stop the group
//     with mismatch_error instead of mixing two calls' data;
//   - a GPU with more ranks than a launch carries (cuda::device::inline_calls) reads the others'
//     parts from host-mapped slots, which its launches give back: more calls than slots, under both
//     orders, give the reference's results.
#include <braid/launch/threads.hpp>
#include <braid/cuda.cuh>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace {

using braid::cuda::call_order;

// One rank's device buffers and stream on `device`.
struct rank_buffers {
  std::size_t n = 0;
  float* in = nullptr;
  float* out = nullptr;
  cudaStream_t stream = nullptr;
  rank_buffers(int device, std::size_t count) : n(count) {
    REQUIRE(cudaSetDevice(device) == cudaSuccess);
    REQUIRE(cudaMalloc(&in, n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&out, n * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  }
  ~rank_buffers() {
    cudaStreamDestroy(stream);
    cudaFree(in);
    cudaFree(out);
  }
  // Rank r's input of call k: element i is r + k + i % 7 (sums are exact in float).
  void upload(int r, int k) {
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<float>(r + k + static_cast<int>(i % 7));
    REQUIRE(cudaMemcpyAsync(in, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  }
  // Elements of out that are not the sum over `ranks` ranks of call k's inputs.
  std::size_t wrong(int ranks, int k) const {
    std::vector<float> h(n);
    REQUIRE(cudaMemcpy(h.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(ranks * (ranks - 1) / 2 + ranks * (k + static_cast<int>(i % 7)));
      bad += h[i] != want;
    }
    return bad;
  }
};

} // namespace

TEST_CASE("call_order::streams: the process device path gives the reference's results") {
  constexpr std::size_t count = 5000;
  std::atomic<std::size_t> bad{0};
  braid::run_threads(2, [&](braid::communicator& host) {
    const int r = host.rank();
    braid::cuda::process_options o;
    o.path = braid::cuda::process_path::device;
    o.order = call_order::streams;
    braid::cuda::process_communicator comm(std::move(host), r, o);
    rank_buffers b(r, count);
    for (int k = 0; k < 6; ++k) {
      b.upload(r, k);
      comm.all_reduce(b.in, b.out, count, braid::sum<>{}, b.stream);
      REQUIRE(cudaStreamSynchronize(b.stream) == cudaSuccess);
      comm.check();
      bad += b.wrong(2, k);
    }
  });
  CHECK(bad == 0);
}

TEST_CASE("call_order::streams: calls the streams leave unordered, run in different orders on two GPUs, stop the group") {
  // Rank 0 enqueues call 1 behind a gate on stream A and call 2 on stream B, which nothing orders
  // after A; rank 1 enqueues both on one stream. GPU 0 runs call 2 while GPU 1 runs call 1: their
  // call words differ, and the group stops with mismatch_error instead of reducing one call's data
  // with another's.
  constexpr std::size_t count = 256;
  braid::cuda::group_options o;
  o.order = call_order::streams;
  o.base.with_timeout(std::chrono::seconds(20));
  auto comms = braid::cuda::create_group({0, 1}, o);
  std::atomic<int> gate{0};
  std::vector<std::string> raised(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      rank_buffers a(r, count), b(r, count);
      auto& comm = comms[static_cast<std::size_t>(r)];
      if (r == 0) {
        REQUIRE(cudaLaunchHostFunc(
                    a.stream, [](void* g) { while (static_cast<std::atomic<int>*>(g)->load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1)); },
                    &gate) == cudaSuccess);
        comm.all_reduce(a.in, a.out, count, braid::sum<>{}, a.stream);      // call 1, held back
        comm.all_reduce(b.in, b.out, count, braid::sum<>{}, b.stream);      // call 2, runs first
        REQUIRE(cudaStreamSynchronize(b.stream) == cudaSuccess);
        gate = 1;
        REQUIRE(cudaStreamSynchronize(a.stream) == cudaSuccess);
      } else {
        comm.all_reduce(a.in, a.out, count, braid::sum<>{}, a.stream);
        comm.all_reduce(a.in, b.out, count, braid::sum<>{}, a.stream);
        REQUIRE(cudaStreamSynchronize(a.stream) == cudaSuccess);
      }
      try {
        comm.check();
      } catch (const braid::mismatch_error& e) {
        raised[static_cast<std::size_t>(r)] = e.what();
      } catch (const std::exception& e) {
        raised[static_cast<std::size_t>(r)] = std::string("not a mismatch: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(!raised[static_cast<std::size_t>(r)].empty(), "check() raised nothing");
    CHECK_MESSAGE(raised[static_cast<std::size_t>(r)].find("not a mismatch") == std::string::npos, raised[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("12 ranks on one GPU: the parts beyond the launch's block come from host-mapped slots, given back") {
  // 40 calls enqueued at once, more than the 16 slots of the ring: a launch takes a slot again only
  // once the launch that held it gave it back, so the host waits for the earliest launches. Under both
  // orders, from one thread in a bracket, a stream per rank.
  constexpr int n = 12, calls = 40;
  constexpr std::size_t count = 1000;
  static_assert(n > braid::cuda::device::inline_calls);
  for (const call_order order : {call_order::braid, call_order::streams}) {
    CAPTURE(static_cast<int>(order));
    braid::cuda::group_options o;
    o.order = order;
    o.threads_per_block = 64;
    auto comms = braid::cuda::create_group(std::vector<int>(n, 0), o);
    std::vector<std::unique_ptr<rank_buffers>> b;
    for (int r = 0; r < n; ++r) {
      b.push_back(std::make_unique<rank_buffers>(0, count));
      b.back()->upload(r, 3);
    }
    for (int k = 0; k < calls; ++k) {
      braid::cuda::group_scope g;
      for (int r = 0; r < n; ++r) {
        rank_buffers& x = *b[static_cast<std::size_t>(r)];
        comms[static_cast<std::size_t>(r)].all_reduce(x.in, x.out, count, braid::sum<>{}, x.stream);
      }
    }
    std::size_t bad = 0;
    for (int r = 0; r < n; ++r) {
      REQUIRE(cudaStreamSynchronize(b[static_cast<std::size_t>(r)]->stream) == cudaSuccess);
      comms[static_cast<std::size_t>(r)].check();
      bad += b[static_cast<std::size_t>(r)]->wrong(n, 3);
    }
    CHECK(bad == 0);
  }
}
