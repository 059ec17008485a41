// bench/launch/launch.hpp — braid's CUDA collectives behind plain host functions, for host-compiled
// callers: the GPU tests (tests/cuda/group/test_gpu.cpp) and braid-bench --backend cuda.
//
// Plain C++: no CUDA headers, so doctest files stay .cpp built by the host compiler. The .cu files
// behind it hold a braid::cuda group and instantiate only the (collective, type, operator)
// combinations the tests use (nvcc time is paid on every CI run):
//   launch_sum.cu    all_reduce with braid::sum: the 8 integer types and both fp8 types
//   launch_float.cu  all_reduce with braid::sum: half, bfloat16, float, double; float with all five
//                    operators for every collective; the group itself
// (every algorithm each: 14 x 6 + 4 x 6 = 108 kernels).
// Errors come back as braid::error exceptions, exactly as braid::cuda::communicator raises them.
#pragma once

#include <braid/comm/options.hpp>
#include <braid/core/ops.hpp>
#include <braid/core/types.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace braid::gpu_launch {

// One braid::cuda group plus one non-blocking CUDA stream per rank (created on the rank's device).
struct group;

// create_group(devices) with the given per-wait timeout and staging memory per rank (0: what
// options::from_env() says: BRAID_TIMEOUT or 300 s, BRAID_STAGING_BYTES or 8 MiB). Raises what
// create_group raises.
// threads_per_block / max_blocks_per_rank: group_options' fields (0: their defaults). by_streams:
// group_options::order = call_order::streams (the caller's streams order a rank's calls).
std::shared_ptr<group> make_group(const std::vector<int>& devices, std::chrono::nanoseconds timeout = {},
                                  std::size_t staging_bytes = 0, int threads_per_block = 0, int max_blocks_per_rank = 0,
                                  bool by_streams = false);

// The launch shape the group's kernels use (every rank's kernel: the same grid).
int blocks_per_rank(const group& g);
int threads_per_block(const group& g);

int size(const group& g);
// communicator::reads_in_place(p) of that rank: whether peers would read an input at p in place.
bool reads_in_place(const group& g, int rank, const void* p);
// communicator::rounds() of that rank: the rounds its kernels have run (after its stream finished).
std::uint64_t rounds(const group& g, int rank);
// The rank's stream as an opaque handle (a cudaStream_t; test_gpu.cpp casts it back).
void* stream(const group& g, int rank);
// communicator::check() of that rank: raises the error a kernel of the group recorded, if any.
void check(const group& g, int rank);
// communicator::algorithm_for(c, bytes) of that rank: what algo::automatic resolves to.
algo algorithm_for(const group& g, int rank, collective c, std::uint64_t bytes);

// One rank's part of a collective. `out` is the result buffer (for reduce_scatter: the rank's block).
struct call {
  collective coll = collective::all_reduce;
  algo algorithm = algo::automatic;
  dtype type = dtype::float32;
  op_kind op = op_kind::sum;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0; // elements per block, as the communicator takes it
  int root = 0;
  void* stream = nullptr; // a cudaStream_t on the rank's GPU; nullptr: the rank's own stream
};

// braid::cuda::group_start() / group_end(): a thread that enqueues several ranks of one GPU brackets
// them (the ranks of a GPU are launched together when the last of them is enqueued).
void group_start();
void group_end();
// A bracket for a scope (group_end() raising from the destructor only when nothing else is in flight).
struct bracket {
  bracket() { group_start(); }
  bracket(const bracket&) = delete;
  bracket& operator=(const bracket&) = delete;
  ~bracket() noexcept(false);
  void end();
  bool ended = false;
  int uncaught = std::uncaught_exceptions();
};

// Whether this test binary instantiates (c, t, k); enqueue raises unsupported_error otherwise.
bool instantiated(collective c, dtype t, op_kind k);

// Enqueues rank's part of `c` on the rank's stream and returns at once (stream-ordered, like the
// communicator). Argument errors are raised before anything is enqueued.
void enqueue(group& g, int rank, const call& c);

// broadcast (root n - 1) and all_gather of `count` elements of a 3-byte struct that has no operators
// (api.md: copy collectives move any trivially copyable type), every algorithm each supports, on a
// fresh group over `devices`, out-of-place: returns the number of wrong bytes in every rank's output.
std::size_t copy_only_check(const std::vector<int>& devices, std::size_t count);

// What the kernels of this binary run on: "CUDA GPU", or the emulated CUDA device (braid/emu).
const char* device_kind();
bool emulated();

// Whether the collective kernels can run on the current device (built for its architecture); on
// false, `why` says what the runtime answered.
bool kernels_loadable(std::string& why);

// The reduce-copy loop the collective kernels use (cuda/device/signal.cuh), alone: `nsrc` sources (1: a
// copy, 2: a sum of two) of `bytes` each into one destination on the current device, `blocks` x
// `threads`, timed over `iters` launches after a warm-up with CUDA events. Returns seconds per launch;
// type float32 or bfloat16 (sum in fp32). nsrc 0 times cudaMemcpyAsync of the same bytes instead.
double time_reduce_copy(dtype type, int nsrc, std::size_t bytes, int iters, int blocks, int threads);

namespace detail {
// launch_sum.cu: all_reduce with sum for the integer and fp8 types; false if `c` is not one of those.
bool enqueue_sum_narrow(group& g, int rank, const call& c);
} // namespace detail

} // namespace braid::gpu_launch
