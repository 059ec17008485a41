// bench/launch/launch_procs.hpp — what launch_procs.cu exports to the host-compiled test of
// braid::cuda::process_communicator (test_gpu_procs.cpp) and to braid-bench.
//
// Plain C++, no CUDA headers. launch_procs.cu with launch_procs_narrow.cu and launch_procs_wide.cu
// (procs.cuh) instantiates every collective for the 14 element types with braid::sum, and float with
// prod, min, max and avg (one small reduce kernel per type and operator: 18 kernels).
#pragma once

#include <braid/comm/communicator.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "launch.hpp" // gpu_launch::call

namespace braid::gpu_procs {

// Number of CUDA devices (0 if the runtime says there are none or fails). Initialises CUDA in the
// calling process: call it in a forked child, never in a process that forks afterwards.
int device_count();

struct comm; // a process_communicator plus a stream on its device (a blocking stream: it waits for
             // the legacy default stream, where to_device and dev_fill work)

struct comm_options {
  std::size_t staging_bytes = 0;                      // 0: the communicator's default
  std::size_t copy_engine_min_bytes = std::size_t(-1); // (-1): the communicator's default
  std::chrono::nanoseconds timeout{0};                // 0: BRAID_TIMEOUT or 300 s
  int reduce_blocks = 0;                              // 0: default
  int threads = 0;                                    // threads per block of the reduce kernel; 0: default
  int path = 0;                                       // 0 automatic, 1 host, 2 device (process_path)
  int spin_us = -1;                                   // process_options::spin; -1: default
};

// Collective over the ranks of `host`; the GPU is `device` (-1: host.rank() % device count).
std::shared_ptr<comm> connect(braid::communicator host, int device, const comm_options& o = {});

// Runs one rank's part of a collective on the communicator's stream; returns when it is complete.
// Raises what the communicator raises (on the device path: also what a kernel recorded, check()).
void run(comm& c, const gpu_launch::call& call);
// The call alone: returns when the communicator returns (on the device path: once it is enqueued).
void enqueue(comm& c, const gpu_launch::call& call);
// Enqueues on the communicator's stream a host function that sleeps `ms` milliseconds: work that
// keeps the stream busy without a kernel (the next call's wait for the stream waits for it).
void hold_stream(comm& c, int ms);
// Whether the communicator's stream still has work (cudaStreamQuery says not ready).
bool stream_busy(comm& c);
// Waits for the stream, then raises what a kernel recorded (process_communicator::check()).
void finish(comm& c);
// 1: host path, 2: device path (process_communicator::path()); and its describe() line.
int path_of(const comm& c);
std::string describe(const comm& c);
// A CUDA graph captured from `call` on the communicator's stream (global capture mode), replayed by
// replay() on the same stream; destroy_graph frees it.
void* capture(comm& c, const gpu_launch::call& call);
void replay(comm& c, void* graph);
void destroy_graph(void* graph) noexcept;

int register_memory(comm& c, void* p, std::size_t bytes);
void deregister_memory(comm& c, int id);
void barrier(comm& c);
void abort(comm& c);
std::size_t memory_bytes(const comm& c);
std::size_t open_handles(const comm& c);
int device_of(const comm& c);
int multiprocessors(const comm& c); // of the communicator's GPU (cudaDevAttrMultiProcessorCount)

struct stats {
  std::uint64_t calls, rounds, staged_bytes, copy_engine_bytes, direct_read_bytes, host_syncs;
  std::uint64_t staged_ahead, reduce_grid, blocking_waits;
};
stats stats_of(const comm& c);

// Device memory on the current device (cudaMalloc), and copies; raise braid::cuda_error.
void* dev_alloc(std::size_t bytes);
void dev_free(void* p) noexcept;
void* dev_alloc_managed(std::size_t bytes); // for the "cannot be exported" test; free with dev_free
void set_device(int d);
void to_device(void* dst, const void* src, std::size_t bytes);
void to_host(void* dst, const void* src, std::size_t bytes);
void dev_fill(void* dst, unsigned char byte, std::size_t bytes);

// The overlap experiment (issue: a compute kernel and a large all_reduce on different streams):
// `nranks` thread ranks on device 0 run all_reduce of `bytes` of float (host path, 16 reduce blocks) in a loop
// while a compute-bound kernel runs on its own stream; the kernel is timed alone and beside them.
struct overlap_result {
  double alone_s = 0, beside_s = 0; // compute kernel time, median of the runs
  double collective_s = 0;          // one all_reduce, alone
  int runs = 0;
  std::uint64_t collectives_beside = 0; // all_reduce calls completed while the kernel ran
};
overlap_result measure_overlap(std::size_t bytes, int nranks, int runs);

// Seconds per all_reduce of `count` floats (sum), mean over `iters` after `warmup`, wall clock until
// the stream has finished them (host path: each call blocks; device path: the calls are enqueued back
// to back, then the stream is synchronised). Every rank calls it together.
double time_all_reduce(comm& c, std::size_t count, int warmup, int iters, bool in_place);
// The check pattern of check_all_reduce (and of braid-bench's NCCL --procs rows): rank r's element i,
// and the exact sum over n ranks (small integers: exact in float).
inline float check_input(int r, std::size_t i) { return static_cast<float>(r + 1 + static_cast<int>(i % 7)); }
inline float check_sum(int n, std::size_t i) { return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7)); }

// One all_reduce of `count` floats with check_input; returns this rank's number of wrong elements.
std::int64_t check_all_reduce(comm& c, std::size_t count, bool in_place);
// Through the host communicator: the maximum / sum over ranks.
double max_over_ranks(comm& c, double v);
std::int64_t sum_over_ranks(comm& c, std::int64_t v);

} // namespace braid::gpu_procs
