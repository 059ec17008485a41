// tests/cuda/enqueue/test_call_cost_emu.cpp — what one collective costs on the host, in runtime calls, for
// every CUDA communicator, counted by the emulated runtime per entry point (braid::emu::
// runtime_call_log: every call of the calling thread that reaches the runtime, kernel launches
// included).
//
// Each case makes a few calls first (setup and first-call work are not the steady state), then
// counts 16 small all_reduce calls. It asserts exactly one kernel launch per call per GPU, the
// count of each entry point the launch path makes, and a bound on the whole (polls of events and
// streams aside: how many a wait makes depends on timing; printed). The floor is one launch per GPU;
// what a call costs beyond it is printed and asserted call by call, so a change that adds a runtime
// call to a call fails here.
#include <braid/launch/threads.hpp>
#include <braid/cuda.cuh>

#include <doctest/doctest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t count = 256;
constexpr int warm = 4, measured = 16;

using braid::emu::runtime_call_log;

// Runtime calls per call and rank, by entry point, polls apart.
struct cost {
  std::map<std::string, double> per; // entry point -> calls per all_reduce per rank
  double calls = 0, polls = 0;
  double operator[](const std::string& name) const {
    const auto it = per.find(name);
    return it == per.end() ? 0 : it->second;
  }
};

bool is_poll(std::string_view name) { return name == "cudaEventQuery" || name == "cudaStreamQuery"; }

void add(cost& x, const runtime_call_log& log, double calls_times_ranks) {
  for (const auto& [name, k] : log.counts()) {
    const double v = static_cast<double>(k) / calls_times_ranks;
    (is_poll(name) ? x.polls : x.calls) += v;
    if (!is_poll(name)) x.per[std::string(name)] += v;
  }
}

std::string describe(const cost& x) {
  std::string s;
  char buf[96];
  for (const auto& [name, v] : x.per) {
    std::snprintf(buf, sizeof buf, "%s%s %.2f", s.empty() ? "" : ", ", name.c_str(), v);
    s += buf;
  }
  return s;
}

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
// (inside a group_scope, as ranks sharing a GPU need); `one_stream`: every rank on rank 0's stream.
cost one_thread(const std::vector<int>& devices, bool one_stream, braid::cuda::call_order order = braid::cuda::call_order::braid) {
  const int n = static_cast<int>(devices.size());
  braid::cuda::group_options o;
  o.order = order;
  auto comms = braid::cuda::create_group(devices, o);
  std::vector<std::unique_ptr<buffers>> b;
  for (int d : devices) b.push_back(std::make_unique<buffers>(d));
  auto call = [&] {
    braid::cuda::group_scope g;
    for (int r = 0; r < n; ++r) {
      auto& x = *b[static_cast<std::size_t>(r)];
      comms[static_cast<std::size_t>(r)].all_reduce(x.in, x.out, count, braid::sum<>{}, one_stream ? b[0]->stream : x.stream);
    }
  };
  for (int i = 0; i < warm; ++i) call();
  cost x;
  {
    const runtime_call_log log;
    for (int i = 0; i < measured; ++i) call();
    add(x, log, static_cast<double>(measured) * n);
  }
  for (int r = 0; r < n; ++r) {
    REQUIRE(cudaStreamSynchronize(b[static_cast<std::size_t>(r)]->stream) == cudaSuccess);
    comms[static_cast<std::size_t>(r)].check();
  }
  return x;
}

// Runtime calls per all_reduce per rank of a one-process group with a GPU per rank, each rank
// enqueued by a thread of its own with its GPU current (as a program with a thread per GPU does).
cost thread_per_rank(int n, braid::cuda::call_order order = braid::cuda::call_order::braid) {
  std::vector<int> devices;
  for (int r = 0; r < n; ++r) devices.push_back(r);
  braid::cuda::group_options o;
  o.order = order;
  auto comms = braid::cuda::create_group(devices, o);
  std::vector<cost> per(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      buffers x(r);
      auto& comm = comms[static_cast<std::size_t>(r)];
      for (int i = 0; i < warm; ++i) comm.all_reduce(x.in, x.out, count, braid::sum<>{}, x.stream);
      {
        const runtime_call_log log;
        for (int i = 0; i < measured; ++i) comm.all_reduce(x.in, x.out, count, braid::sum<>{}, x.stream);
        add(per[static_cast<std::size_t>(r)], log, static_cast<double>(measured) * n);
      }
      (void)cudaStreamSynchronize(x.stream);
    });
  for (auto& t : threads) t.join();
  cost x;
  for (const cost& c : per) {
    for (const auto& [name, v] : c.per) x.per[name] += v;
    x.calls += c.calls;
    x.polls += c.polls;
  }
  for (auto& c : comms) c.check();
  return x;
}

// Runtime calls per all_reduce on each rank of a process_communicator whose ranks are threads
// (device r of each rank given by `device_of`), counted around the calls alone.
std::vector<cost> process_ranks(int n, int (*device_of)(int), braid::cuda::process_path path,
                                braid::cuda::call_order order = braid::cuda::call_order::braid) {
  std::vector<cost> per(static_cast<std::size_t>(n));
  braid::run_threads(n, [&](braid::communicator& host) {
    const int r = host.rank();
    braid::cuda::process_options o;
    o.path = path;
    o.order = order;
    braid::cuda::process_communicator comm(std::move(host), device_of(r), o);
    buffers x(device_of(r));
    for (int i = 0; i < warm; ++i) comm.all_reduce(x.in, x.out, count, braid::sum<>{}, x.stream);
    REQUIRE(cudaStreamSynchronize(x.stream) == cudaSuccess);
    {
      const runtime_call_log log;
      for (int i = 0; i < measured; ++i) comm.all_reduce(x.in, x.out, count, braid::sum<>{}, x.stream);
      add(per[static_cast<std::size_t>(r)], log, measured);
    }
    REQUIRE(cudaStreamSynchronize(x.stream) == cudaSuccess);
  });
  return per;
}

// Prints the cost and checks it against `bound` (calls per rank, polls aside).
void report(const char* what, const cost& got, double bound) {
  std::printf("runtime calls per all_reduce per rank, %s: %.2f (%s) and %.2f polls; bound %.2f\n", what, got.calls,
              describe(got).c_str(), got.polls, bound);
  CHECK(got.calls <= bound + 1e-9);
}

constexpr const char* coop = "cudaLaunchCooperativeKernel";

} // namespace

TEST_CASE("runtime calls per collective: one process, a GPU per rank, a thread per rank") {
  // The launch, the chain's record, the stream's id and capture query, the current device: 5. No
  // event is waited for (every call on the stream of the one before), none recorded at the call.
  const cost c = thread_per_rank(2);
  report("one process, 2 ranks on 2 GPUs, a thread each", c, 5);
  CHECK(c[coop] == doctest::Approx(1));
  CHECK(c["cudaEventRecord"] == doctest::Approx(1));
  CHECK(c["cudaStreamGetId"] == doctest::Approx(1));
  CHECK(c["cudaStreamIsCapturing"] == doctest::Approx(1));
  CHECK(c["cudaGetDevice"] == doctest::Approx(1));
  CHECK(c["cudaStreamWaitEvent"] == 0);
  CHECK(c["cudaSetDevice"] == 0);
}

TEST_CASE("runtime calls per collective: one process, a GPU per rank, one thread") {
  // As above, and the switch to the rank's GPU and back for the rank whose GPU is not current: 6.
  const cost c = one_thread({0, 1}, false);
  report("one process, 2 ranks on 2 GPUs, one thread", c, 6);
  CHECK(c[coop] == doctest::Approx(1));
  CHECK(c["cudaStreamWaitEvent"] == 0);
}

TEST_CASE("runtime calls per collective: one process, ranks sharing a GPU") {
  // One launch for both ranks. On one stream: the launch, the chain's record and the stream's id for
  // the two, each rank's capture query and current device: 3.5 per rank.
  const cost one = one_thread({0, 0}, true);
  report("one process, 2 ranks on 1 GPU, one stream", one, 3.5);
  CHECK(one[coop] == doctest::Approx(0.5));
  CHECK(one["cudaStreamWaitEvent"] == 0);
  CHECK(one["cudaEventRecord"] == doctest::Approx(0.5));
  // On a stream each: the other rank's stream joined to the launch (a record and a wait) and back
  // (a wait, and the current device where group_end makes it): 5.5 per rank.
  const cost two = one_thread({0, 0}, false);
  report("one process, 2 ranks on 1 GPU, a stream each", two, 5.5);
  CHECK(two[coop] == doctest::Approx(0.5));
  CHECK(two["cudaStreamWaitEvent"] == doctest::Approx(1));
  CHECK(two["cudaEventRecord"] == doctest::Approx(1));
}

TEST_CASE("runtime calls per collective: process_communicator, device path (a GPU per rank)") {
  // As a rank alone on its GPU in one process: 5.
  for (const cost& c : process_ranks(2, [](int r) { return r; }, braid::cuda::process_path::device)) {
    report("process_communicator device path, 2 ranks on 2 GPUs", c, 5);
    CHECK(c[coop] == doctest::Approx(1));
    CHECK(c["cudaStreamWaitEvent"] == 0);
  }
}

TEST_CASE("runtime calls per collective: process_communicator, host path (ranks sharing a GPU)") {
  // Not a launch-only path: each round meets on the host (stream synchronisations and a copy of the
  // peers' shards); 9-11 by timing (spin or sleep).
  for (const cost& c : process_ranks(2, [](int) { return 0; }, braid::cuda::process_path::automatic)) {
    report("process_communicator host path, 2 ranks on 1 GPU", c, 13);
    CHECK(c["cudaLaunchKernel"] == doctest::Approx(1));
  }
}

// call_order::streams: the caller's streams order a rank's calls, and a call is its launch.
constexpr auto by_streams = braid::cuda::call_order::streams;

TEST_CASE("runtime calls per collective, call_order::streams: a GPU per rank, a thread per rank") {
  // The launch and nothing else.
  const cost c = thread_per_rank(2, by_streams);
  report("streams order: one process, 2 ranks on 2 GPUs, a thread each", c, 1);
  CHECK(c[coop] == doctest::Approx(1));
  CHECK(c.calls == doctest::Approx(1));
}

TEST_CASE("runtime calls per collective, call_order::streams: process_communicator device path") {
  for (const cost& c : process_ranks(2, [](int r) { return r; }, braid::cuda::process_path::device, by_streams)) {
    report("streams order: process_communicator device path, 2 ranks on 2 GPUs", c, 1);
    CHECK(c[coop] == doctest::Approx(1));
    CHECK(c.calls == doctest::Approx(1));
  }
}

TEST_CASE("runtime calls per collective, call_order::streams: ranks sharing a GPU") {
  // One launch for both ranks, nothing else, where they give one stream: 0.5 per rank.
  const cost one = one_thread({0, 0}, true, by_streams);
  report("streams order: one process, 2 ranks on 1 GPU, one stream", one, 0.5);
  CHECK(one[coop] == doctest::Approx(0.5));
  CHECK(one.calls == doctest::Approx(0.5));
  // A stream each: the launch, and the events that join the other rank's stream to it (a record and
  // a wait) and back (a record and a wait): 5 per call, 2.5 per rank.
  const cost two = one_thread({0, 0}, false, by_streams);
  report("streams order: one process, 2 ranks on 1 GPU, a stream each", two, 2.5);
  CHECK(two[coop] == doctest::Approx(0.5));
  CHECK(two["cudaEventRecord"] == doctest::Approx(1));
  CHECK(two["cudaStreamWaitEvent"] == doctest::Approx(1));
  CHECK(two.calls == doctest::Approx(2.5));
}

TEST_CASE("runtime calls per collective, call_order::streams: one thread for two GPUs makes each current for its launch") {
  // The thread's current device is GPU 1 (the last it set up): rank 1's call is its launch; rank 0's
  // launch is refused there (the stream is GPU 0's) and made again with GPU 0 current: the refused
  // launch, the device's query, the switch there and back, the launch (6 per call, 3 per rank). The
  // results are checked by the sweep in test_gpu.cpp.
  const cost c = one_thread({0, 1}, false, by_streams);
  report("streams order: one process, 2 ranks on 2 GPUs, one thread", c, 3);
  CHECK(c["cudaSetDevice"] == doctest::Approx(1));
  CHECK(c[coop] == doctest::Approx(1.5)); // one refused
  CHECK(c["cudaStreamWaitEvent"] == 0);
  CHECK(c["cudaEventRecord"] == 0);
}

TEST_CASE("the launch waits for the group's previous launch exactly where its stream does not order it") {
  // Two ranks on two GPUs, one thread (a group): cudaStreamWaitEvent per call, both ranks together.
  auto comms = braid::cuda::create_group({0, 1});
  buffers b0(0), b1(1);
  auto call = [&](cudaStream_t s0, cudaStream_t s1) {
    const runtime_call_log log;
    {
      braid::cuda::group_scope g;
      comms[0].all_reduce(b0.in, b0.out, count, braid::sum<>{}, s0);
      comms[1].all_reduce(b1.in, b1.out, count, braid::sum<>{}, s1);
    }
    return log.count("cudaStreamWaitEvent");
  };
  call(b0.stream, b1.stream);
  CHECK(call(b0.stream, b1.stream) == 0); // each on the stream of its previous launch
  cudaStream_t other0 = nullptr;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&other0) == cudaSuccess);
  CHECK(call(other0, b1.stream) == 1); // rank 0 moved: its launch waits on the chain
  CHECK(call(other0, b1.stream) == 0);
  // A destroyed stream's successor may get its handle; it is another stream, so it waits.
  REQUIRE(cudaStreamDestroy(other0) == cudaSuccess);
  cudaStream_t again = nullptr;
  REQUIRE(cudaStreamCreate(&again) == cudaSuccess);
  CHECK(call(again, b1.stream) == 1);
  // Once a launch of the group was captured, a replay may come between any two launches: every
  // launch waits (the capture's own launch waits as a graph node, not counted here).
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamBeginCapture(again, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  {
    braid::cuda::group_scope g;
    comms[0].all_reduce(b0.in, b0.out, count, braid::sum<>{}, again);
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(b1.stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    comms[1].all_reduce(b1.in, b1.out, count, braid::sum<>{}, b1.stream);
  }
  cudaGraph_t graph1 = nullptr;
  REQUIRE(cudaStreamEndCapture(b1.stream, &graph1) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(again, &graph) == cudaSuccess);
  CHECK(call(again, b1.stream) == 2);
  CHECK(call(again, b1.stream) == 2);
  REQUIRE(cudaStreamSynchronize(again) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b1.stream) == cudaSuccess);
  comms[0].check();
  comms[1].check();
  cudaGraphDestroy(graph);
  cudaGraphDestroy(graph1);
  cudaStreamDestroy(again);
}
