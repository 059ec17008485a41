// tests/cuda/test_call_cost_emu.cpp — what one collective costs on the host, in runtime calls, for
// every CUDA communicator, counted by the emulated runtime (braid::emu::runtime_calls: every entry
// point that reaches the runtime, kernel launches included, made by the calling thread).
//
// Each case makes a few calls first (setup and first-call work are not the steady state), then
// counts 16 small all_reduce calls and checks the count per call and rank, polls of events and
// streams aside (how many a wait makes depends on timing; printed), against the bound today's code
// meets, so a change that adds runtime calls to a call fails here. The bound of a cost-free
// call (one kernel launch per rank with a GPU of its own; one for all the ranks of a shared GPU plus
// the event operations that join their streams) is what the launch path is to reach; the counts are
// printed beside it.
#include <braid/launch/threads.hpp>
#include <braid/cuda.cuh>

#include <doctest/doctest.h>

#include <cstdio>
#include <vector>

namespace {

constexpr std::size_t count = 256;
constexpr int warm = 4, measured = 16;

struct cost {
  double calls = 0, polls = 0; // per call and rank; calls excludes polls
};

struct counter {
  std::uint64_t c = braid::emu::runtime_calls(), p = braid::emu::runtime_polls();
  void add_to(cost& x, double per) const {
    const std::uint64_t dp = braid::emu::runtime_polls() - p;
    x.calls += static_cast<double>(braid::emu::runtime_calls() - c - dp) / per;
    x.polls += static_cast<double>(dp) / per;
  }
};

struct buffers {
  float* in = nullptr;
  float* out = nullptr;
  cudaStream_t stream = nullptr;
  explicit buffers(int device) {
    REQUIRE(cudaSetDevice(device) == cudaSuccess);
    REQUIRE(cudaMalloc(&in, count * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&out, count * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemset(in, 0, count * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  }
  ~buffers() {
    cudaStreamDestroy(stream);
    cudaFree(in);
    cudaFree(out);
  }
};

// Runtime calls per all_reduce per rank, one thread enqueuing every rank of a one-process group
// (inside a group_scope, as ranks sharing a GPU need).
cost one_process(const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  auto comms = braid::cuda::create_group(devices);
  std::vector<std::unique_ptr<buffers>> b;
  for (int d : devices) b.push_back(std::make_unique<buffers>(d));
  auto call = [&] {
    braid::cuda::group_scope g;
    for (int r = 0; r < n; ++r) {
      auto& x = *b[static_cast<std::size_t>(r)];
      comms[static_cast<std::size_t>(r)].all_reduce(x.in, x.out, count, braid::sum<>{}, x.stream);
    }
  };
  for (int i = 0; i < warm; ++i) call();
  cost x;
  const counter k;
  for (int i = 0; i < measured; ++i) call();
  k.add_to(x, static_cast<double>(measured) * n);
  for (int r = 0; r < n; ++r) {
    REQUIRE(cudaStreamSynchronize(b[static_cast<std::size_t>(r)]->stream) == cudaSuccess);
    comms[static_cast<std::size_t>(r)].check();
  }
  return x;
}

// Runtime calls per all_reduce on each rank of a process_communicator whose ranks are threads
// (device r of each rank given by `device_of`), counted around the calls alone.
std::vector<cost> process_ranks(int n, int (*device_of)(int), braid::cuda::process_path path) {
  std::vector<cost> per(static_cast<std::size_t>(n));
  braid::run_threads(n, [&](braid::communicator& host) {
    const int r = host.rank();
    braid::cuda::process_options o;
    o.path = path;
    braid::cuda::process_communicator comm(std::move(host), device_of(r), o);
    buffers x(device_of(r));
    for (int i = 0; i < warm; ++i) comm.all_reduce(x.in, x.out, count, braid::sum<>{}, x.stream);
    REQUIRE(cudaStreamSynchronize(x.stream) == cudaSuccess);
    cost c;
    for (int i = 0; i < measured; ++i) {
      const counter k;
      comm.all_reduce(x.in, x.out, count, braid::sum<>{}, x.stream);
      k.add_to(c, measured);
    }
    REQUIRE(cudaStreamSynchronize(x.stream) == cudaSuccess);
    per[static_cast<std::size_t>(r)] = c;
  });
  return per;
}

void report(const char* what, const cost& got, double bound, double floor) {
  std::printf("runtime calls per all_reduce per rank, %s: %.2f and %.2f polls (bound today %.0f; a launch-only call: %.2f)\n", what,
              got.calls, got.polls, bound, floor);
  CHECK(got.calls <= bound);
  CHECK(got.calls >= floor); // at least the launch: a count below it would mean nothing was counted
}

} // namespace

TEST_CASE("runtime calls per collective: one process, a GPU per rank") {
  report("one process, 2 ranks on 2 GPUs", one_process({0, 1}), 9, 1);
}

TEST_CASE("runtime calls per collective: one process, ranks sharing a GPU") {
  report("one process, 2 ranks on 1 GPU", one_process({0, 0}), 8, 0.5);
}

TEST_CASE("runtime calls per collective: process_communicator, device path (a GPU per rank)") {
  for (const cost& c : process_ranks(2, [](int r) { return r; }, braid::cuda::process_path::device))
    report("process_communicator device path, 2 ranks on 2 GPUs", c, 8, 1);
}

TEST_CASE("runtime calls per collective: process_communicator, host path (ranks sharing a GPU)") {
  for (const cost& c : process_ranks(2, [](int) { return 0; }, braid::cuda::process_path::automatic))
    report("process_communicator host path, 2 ranks on 1 GPU", c, 13, 1); // 9-11: spin or sleep, by timing
}
