// tests/nn/device/test_ddp_device.cpp — nn/ddp_device.cuh's bucket_reducer on the emulated CUDA device:
// two ranks on two emulated GPUs (one process, braid::cuda::create_group), each driven by its own host
// thread, with a synthetic backward (kernels that write each bucket's gradients). It shows that the
// first bucket's average completes while backward is still running (the rest of backward is held
// behind a host function on the compute stream; the test sees the average's event complete and reads
// the averaged bucket from the device before it lets backward go on),
// that the results are the exact averages and the same bits on both ranks, that buckets marked out of
// order are averaged in order, that no_sync accumulates, and the refusals. Emulated device only.
#include <doctest/doctest.h>

#include <braid/cuda.cuh>
#include <braid/nn/ddp_device.cuh>

#include "rank_threads.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

namespace {

#define EMU_OK(expr) REQUIRE_EQ((expr), cudaSuccess)

using reducer = braid::nn::fused::bucket_reducer<braid::cuda::communicator>;

// g[j] (+)= scale * (j % 7 + 1) over [begin, end): each rank's synthetic gradient.
BRAID_KERNEL void produce(float* g, std::int64_t begin, std::int64_t end, float scale, bool add) {
  for (std::int64_t j = begin + std::int64_t(braid::cuda::device::block_index()) * braid::cuda::device::block_size() + braid::cuda::device::thread_index();
       j < end; j += std::int64_t(braid::cuda::device::grid_size()) * braid::cuda::device::block_size()) {
    const float v = scale * float(j % 7 + 1);
    g[j] = add ? g[j] + v : v;
  }
}

// A host function that holds its stream until `open` (or 10 s: then `timed_out`).
struct gate {
  std::atomic<bool> open{false}, timed_out{false};
  static void hold(void* p) {
    auto* g = static_cast<gate*>(p);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!g->open.load()) {
      if (std::chrono::steady_clock::now() > end) {
        g->timed_out = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
};

const std::vector<std::int64_t> bounds = {0, 1000, 5000};
constexpr std::int64_t n = 9000;

struct rank_state {
  float* grad = nullptr;
  cudaStream_t compute = nullptr, comm = nullptr;
};

struct fixture {
  std::vector<braid::cuda::communicator> comms = braid::cuda::create_group({0, 1});
  rank_state rs[2];
  fixture() {
    for (int r = 0; r < 2; ++r) {
      EMU_OK(cudaSetDevice(r));
      EMU_OK(cudaMalloc(reinterpret_cast<void**>(&rs[r].grad), n * sizeof(float)));
      EMU_OK(cudaStreamCreateWithFlags(&rs[r].compute, cudaStreamNonBlocking));
      EMU_OK(cudaStreamCreateWithFlags(&rs[r].comm, cudaStreamNonBlocking));
    }
  }
  ~fixture() {
    for (int r = 0; r < 2; ++r) {
      cudaSetDevice(r);
      cudaDeviceSynchronize();
      cudaStreamDestroy(rs[r].compute);
      cudaStreamDestroy(rs[r].comm);
      cudaFree(rs[r].grad);
    }
  }
  std::vector<float> download(int r) {
    std::vector<float> v(n);
    EMU_OK(cudaSetDevice(r));
    EMU_OK(cudaDeviceSynchronize());
    EMU_OK(cudaMemcpy(v.data(), rs[r].grad, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }
  // Runs body(rank) on one thread per rank; rethrows the first exception.
  template <class F> void each_rank(F body) {
    rank_threads::run(2, [&](int r) {
      EMU_OK(cudaSetDevice(r));
      body(r);
    });
  }
};

void launch_produce(rank_state& s, std::size_t b, float scale, bool add) {
  const std::int64_t lo = bounds[b], hi = b + 1 < bounds.size() ? bounds[b + 1] : n;
  REQUIRE(braid::cuda::device::launch(produce, 4, 128, 0, s.compute, s.grad, lo, hi, scale, add) == cudaSuccess);
}

// The average over the two ranks of scale_r * (j % 7 + 1), with scale_r = (r + 1) * f.
float expected(std::int64_t j, float f) { return (f * float(j % 7 + 1) + 2 * f * float(j % 7 + 1)) / 2.0f; }

} // namespace

TEST_CASE("bucket_reducer: the first bucket is averaged while backward still runs; exact, identical results") {
  fixture fx;
  gate gates[2];
  std::atomic<int> probes_done{0};
  cudaEvent_t probe[2];
  std::atomic<int> enqueued{0};
  std::uint64_t reductions[2] = {0, 0};
  fx.each_rank([&](int r) {
    rank_state& s = fx.rs[r];
    reducer red(fx.comms[std::size_t(r)], s.grad, n, bounds, s.comm);
    EMU_OK(cudaEventCreateWithFlags(&probe[r], cudaEventDisableTiming));
    const float scale = float(r + 1);
    launch_produce(s, 0, scale, false);
    red.ready(0, s.compute);
    CHECK(red.reductions() == 1); // launched at ready(), not at finish()
    EMU_OK(cudaEventRecord(probe[r], s.comm)); // passes when bucket 0's average is done
    EMU_OK(cudaLaunchHostFunc(s.compute, gate::hold, &gates[r])); // the rest of backward waits here
    launch_produce(s, 1, scale, false);
    red.ready(1, s.compute);
    launch_produce(s, 2, scale, false);
    red.ready(2, s.compute);
    red.finish(s.compute);
    reductions[r] = red.reductions();
    ++enqueued;
    // Rank 0's thread watches both ranks: each bucket-0 average must complete while that rank's
    // backward is still held; then the gates open.
    if (r == 0) {
      while (enqueued.load() < 2) std::this_thread::yield();
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(8);
      bool done[2] = {false, false};
      while (!(done[0] && done[1]) && std::chrono::steady_clock::now() < end) {
        for (int q = 0; q < 2; ++q)
          if (!done[q] && cudaEventQuery(probe[q]) == cudaSuccess) {
            done[q] = true;
            ++probes_done;
          }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      // With both backwards still held: bucket 0 holds the averages already (read on a stream of
      // its own, which waits for nothing that the gates hold).
      for (int q = 0; q < 2 && probes_done.load() == 2; ++q) {
        EMU_OK(cudaSetDevice(q));
        cudaStream_t side = nullptr;
        EMU_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
        std::vector<float> b0(static_cast<std::size_t>(bounds[1]));
        EMU_OK(cudaMemcpyAsync(b0.data(), fx.rs[q].grad, b0.size() * sizeof(float), cudaMemcpyDeviceToHost, side));
        EMU_OK(cudaStreamSynchronize(side));
        EMU_OK(cudaStreamDestroy(side));
        int wrong0 = 0;
        for (std::int64_t j = 0; j < bounds[1]; ++j) wrong0 += b0[std::size_t(j)] != expected(j, 1.0f);
        CHECK(wrong0 == 0);
        CHECK(!gates[q].open.load());
        CHECK(!gates[q].timed_out.load());
      }
      EMU_OK(cudaSetDevice(0));
      for (auto& g : gates) g.open = true;
    }
    EMU_OK(cudaStreamSynchronize(s.compute));
  });
  CHECK(probes_done.load() == 2); // both averages of bucket 0 finished before backward went on
  CHECK(!gates[0].timed_out.load());
  CHECK(!gates[1].timed_out.load());
  CHECK(reductions[0] == 3);
  CHECK(reductions[1] == 3);
  const std::vector<float> a = fx.download(0), b = fx.download(1);
  CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
  int wrong = 0;
  for (std::int64_t j = 0; j < n; ++j) wrong += a[std::size_t(j)] != expected(j, 1.0f);
  CHECK(wrong == 0);
  for (auto& e : probe) cudaEventDestroy(e);
}

TEST_CASE("bucket_reducer: buckets marked out of order are averaged in order; no_sync accumulates") {
  fixture fx;
  fx.each_rank([&](int r) {
    rank_state& s = fx.rs[r];
    reducer red(fx.comms[std::size_t(r)], s.grad, n, bounds, s.comm);
    const float scale = float(r + 1);
    // Step 1, no_sync: gradients written, nothing averaged.
    red.set_sync(false);
    for (std::size_t b : {2u, 1u, 0u}) {
      launch_produce(s, b, scale, false);
      red.ready(b, s.compute);
    }
    red.finish(s.compute);
    CHECK(red.reductions() == 0);
    red.set_sync(true);
    // Step 2: accumulated into, marked 2, 0, 1: bucket 0 and then 1 and 2 are averaged.
    launch_produce(s, 2, scale, true);
    red.ready(2, s.compute);
    CHECK(red.reductions() == 0); // bucket 2 waits for 0 and 1
    launch_produce(s, 0, scale, true);
    red.ready(0, s.compute);
    CHECK(red.reductions() == 1);
    launch_produce(s, 1, scale, true);
    red.ready(1, s.compute);
    CHECK(red.reductions() == 3);
    red.finish(s.compute);
    EMU_OK(cudaStreamSynchronize(s.compute));
  });
  const std::vector<float> a = fx.download(0), b = fx.download(1);
  CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
  int wrong = 0;
  for (std::int64_t j = 0; j < n; ++j) wrong += a[std::size_t(j)] != expected(j, 2.0f); // two steps' sums
  CHECK(wrong == 0);
}

TEST_CASE("bucket_reducer: refusals") {
  fixture fx;
  rank_state& s = fx.rs[0];
  EMU_OK(cudaSetDevice(0));
  auto& c = fx.comms[0];
  CHECK_THROWS_AS(reducer(c, s.grad, n, {}, s.comm), braid::invalid_argument);
  CHECK_THROWS_AS(reducer(c, s.grad, n, {1, 5}, s.comm), braid::invalid_argument);
  CHECK_THROWS_AS(reducer(c, s.grad, n, {0, 5, 5}, s.comm), braid::invalid_argument);
  CHECK_THROWS_AS(reducer(c, s.grad, n, {0, n}, s.comm), braid::invalid_argument);
  CHECK_THROWS_AS(reducer(c, nullptr, n, {0}, s.comm), braid::invalid_argument);
  reducer red(c, s.grad, n, bounds, s.comm);
  CHECK_THROWS_AS(red.ready(3, s.compute), braid::invalid_argument);
  CHECK_THROWS_AS(red.finish(s.compute), braid::usage_error); // no bucket marked: nothing was launched
  CHECK(red.reductions() == 0);
  // The rest without a peer, so without launching anything: no_sync checks the same things.
  red.set_sync(false);
  red.ready(0, s.compute);
  CHECK_THROWS_AS(red.ready(0, s.compute), braid::invalid_argument); // twice in one step
  CHECK_THROWS_AS(red.set_sync(true), braid::usage_error);         // in the middle of a step
  red.ready(2, s.compute);
  CHECK_THROWS_AS(red.finish(s.compute), braid::usage_error); // bucket 1 never marked
  for (std::size_t b : {0u, 1u, 2u}) red.ready(b, s.compute); // the next step starts afresh
  red.finish(s.compute);
  CHECK(red.reductions() == 0);
}
