// tests/cuda/process/test_close_emu.cpp — what cuda::process_communicator::close() frees, read off the
// emulated device's memory table (device bytes allocated on each rank's GPU before and after).
// A healthy group frees every rank's segment (its staging memory and control page). A group whose
// abort record holds a failure leaves each rank's segment allocated, since peers' kernels may still read it until they see the abort flag:
// the rank that failed, and a rank that only learnt of the failure through check(), alike.
#include <braid/launch/threads.hpp>
#include <braid/cuda.cuh>

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>

namespace {

constexpr std::size_t count = 1024;
constexpr std::size_t staging = std::size_t{8} << 20; // process_options::staging_bytes: most of a rank's segment

std::size_t device_bytes(int device) { return braid::emu::detail::rt().memory().device_bytes(device); }

// Two ranks as threads, each on a GPU of its own (the device path); after one all_reduce, rank 0
// aborts where `failing`, and rank 1 waits until check() raises that. Returns, per rank, the device
// bytes its close() freed.
std::array<long long, 2> freed_by_close(bool failing) {
  std::array<long long, 2> freed{-1, -1};
  std::atomic<int> checked{0};
  braid::run_threads(2, [&](braid::communicator& host) {
    const int r = host.rank();
    braid::cuda::process_options o;
    o.path = braid::cuda::process_path::device;
    o.base.timeout = std::chrono::seconds(10); // a close() that wrongly waits for a failed peer ends here
    o.staging_bytes = staging;
    braid::cuda::process_communicator comm(std::move(host), r, o);
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    float* buf = nullptr;
    cudaStream_t stream = nullptr;
    REQUIRE(cudaMalloc(&buf, count * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemset(buf, 0, count * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    comm.all_reduce(buf, buf, count, braid::sum<>{}, stream);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    comm.check();
    // Both ranks past that check before rank 0 aborts: else rank 1's check above could raise it.
    checked.fetch_add(1);
    while (checked.load() < 2) std::this_thread::yield();
    if (failing && r == 0) comm.abort();
    if (failing && r == 1) {
      bool raised = false;
      for (int i = 0; i < 10000 && !raised; ++i) {
        try {
          comm.check();
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        } catch (const braid::error& e) {
          raised = e.code() == braid::errc::aborted;
        }
      }
      REQUIRE(raised);
    }
    const std::size_t before = device_bytes(r);
    comm.close();
    freed[static_cast<std::size_t>(r)] = static_cast<long long>(before) - static_cast<long long>(device_bytes(r));
    cudaStreamDestroy(stream);
    cudaFree(buf);
  });
  return freed;
}

} // namespace

TEST_CASE("process_communicator::close(): a healthy group frees each rank's segment") {
  const auto freed = freed_by_close(false);
  MESSAGE("healthy group: close() freed " << freed[0] << " and " << freed[1] << " device bytes");
  CHECK(freed[0] >= static_cast<long long>(staging));
  CHECK(freed[1] >= static_cast<long long>(staging));
}

TEST_CASE("process_communicator::close(): a group with a failure in its abort record frees no segment") {
  const auto freed = freed_by_close(true);
  MESSAGE("failed group: close() freed " << freed[0] << " (the rank that aborted) and " << freed[1]
                                         << " (the rank whose check() raised) device bytes");
  // What a failed close() still frees is the rank's table of the ranks' addresses, which only its own
  // kernels read (cudaFree waits for them); never the segment.
  CHECK(freed[0] < static_cast<long long>(staging));
  CHECK(freed[1] < static_cast<long long>(staging));
}
