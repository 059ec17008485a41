// bench/gpu_sync_probe.cu — what one step of braid's collective kernel costs on a real GPU, taken
// apart. Built as braid-gpu-sync-probe where CUDA is on (nothing to run without a GPU: it is no test);
// bench/gpu-check.sh runs it. First run: bench/results/h100-2026-11-25/5-sync-probe.txt. Two "ranks" (sides) share one cooperative launch, `blocks` blocks of 512 threads each, as
// collective_kernel (cuda/executor.cuh) runs ranks of one GPU, and each side takes K steps with the
// executor's own primitives: the block arrival and the last block's system-scope post
// (arrive_and_post's pattern), and wait_ge on the other side's progress word. Variants:
//   post only   each side arrives and posts K times, never waits (the cost of arrive + post)
//   lockstep    step k waits for the other side's step k-1, then arrives and posts
//   +copy BYTES lockstep, and each step copies BYTES with reduce_copy across the side's blocks
// Printed: microseconds per step (cudaEvent time of the launch / K), median of 5 launches.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <braid/cuda/executor.cuh>

using namespace braid::cuda_detail;

namespace {

#define CK(x)                                                                                                     \
  do {                                                                                                            \
    cudaError_t e_ = (x);                                                                                         \
    if (e_ != cudaSuccess) {                                                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                     \
      std::exit(1);                                                                                               \
    }                                                                                                             \
  } while (0)

struct probe_args {
  u64* progress;  // [2], one per side
  u64* arrivals;  // [2][K+1]
  device_abort* abort;
  unsigned blocks; // per side
  int steps;
  int wait;        // 0: post only, 1: lockstep
  const float* src[2];
  float* dst[2];
  std::uint64_t copy_count; // floats per step (0: no copy)
};

__global__ __launch_bounds__(512) void probe_kernel(probe_args a) {
  __shared__ int stop;
  const int side = static_cast<int>(blockIdx.x / a.blocks);
  const unsigned block = blockIdx.x % a.blocks;
  const int other = 1 - side;
  const std::uint64_t tid = static_cast<std::uint64_t>(block) * blockDim.x + threadIdx.x;
  const std::uint64_t nthreads = static_cast<std::uint64_t>(a.blocks) * blockDim.x;
  if (threadIdx.x == 0) stop = 0;
  __syncthreads();
  for (int k = 0; k < a.steps; ++k) {
    if (a.wait && k > 0) {
      if (threadIdx.x == 0 && !wait_ge(a.progress + other, static_cast<u64>(k), abort_ref{a.abort, 1}, 10'000'000'000ull, side, other, k))
        stop = 1;
      __syncthreads();
      if (stop) return;
    }
    if (a.copy_count) {
      const float* s[1] = {a.src[side]};
      reduce_copy<float>(s, 1, a.dst[side], static_cast<float*>(nullptr), a.copy_count, braid::detail::copy_only{}, false, 2,
                         tid, nthreads);
    }
    if (arrive(a.arrivals + side * (a.steps + 1) + k, a.blocks)) post_max_release(a.progress + side, static_cast<u64>(k + 1));
  }
}

double run(unsigned blocks, int steps, int wait, std::uint64_t copy_bytes, const std::vector<float*>& buf, device_abort* ab) {
  u64 *progress = nullptr, *arrivals = nullptr;
  CK(cudaMalloc(&progress, 2 * sizeof(u64)));
  CK(cudaMalloc(&arrivals, 2 * (steps + 1) * sizeof(u64)));
  probe_args a{};
  a.progress = progress;
  a.arrivals = arrivals;
  a.abort = ab;
  a.blocks = blocks;
  a.steps = steps;
  a.wait = wait;
  for (int s = 0; s < 2; ++s) {
    a.src[s] = buf[static_cast<std::size_t>(2 * s)];
    a.dst[s] = buf[static_cast<std::size_t>(2 * s + 1)];
  }
  a.copy_count = copy_bytes / sizeof(float);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> us;
  for (int rep = 0; rep < 6; ++rep) {
    CK(cudaMemset(progress, 0, 2 * sizeof(u64)));
    CK(cudaMemset(arrivals, 0, 2 * (steps + 1) * sizeof(u64)));
    void* params[] = {&a};
    CK(cudaEventRecord(e0));
    CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(probe_kernel), dim3(2 * blocks), dim3(512), params, 0, nullptr));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep > 0) us.push_back(1000.0 * ms / steps);
  }
  if (abort_raised(ab)) {
    std::fprintf(stderr, "probe: a wait timed out\n");
    std::exit(1);
  }
  std::sort(us.begin(), us.end());
  CK(cudaFree(progress));
  CK(cudaFree(arrivals));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return us[us.size() / 2];
}

} // namespace

int main() {
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("# gpu_sync_probe on %s (%d SMs): microseconds per step, median of 5 launches, 2 sides x B blocks x 512 threads\n",
              p.name, p.multiProcessorCount);
  device_abort* ab = nullptr;
  CK(cudaHostAlloc(&ab, sizeof(device_abort), cudaHostAllocMapped));
  std::memset(ab, 0, sizeof(device_abort));
  const std::uint64_t max_copy = std::uint64_t{4} << 20;
  std::vector<float*> buf(4);
  for (auto& b : buf) {
    CK(cudaMalloc(&b, max_copy));
    CK(cudaMemset(b, 1, max_copy));
  }
  const int steps = 2000;
  std::printf("%8s %10s %12s %12s\n", "blocks", "variant", "copy bytes", "us/step");
  for (unsigned blocks : {1u, 16u, 64u}) {
    std::printf("%8u %10s %12d %12.2f\n", blocks, "post-only", 0, run(blocks, steps, 0, 0, buf, ab));
    std::printf("%8u %10s %12d %12.2f\n", blocks, "lockstep", 0, run(blocks, steps, 1, 0, buf, ab));
    for (std::uint64_t c : {std::uint64_t{64} << 10, std::uint64_t{1} << 20, std::uint64_t{4} << 20})
      std::printf("%8u %10s %12llu %12.2f\n", blocks, "lockstep", static_cast<unsigned long long>(c), run(blocks, steps / 4, 1, c, buf, ab));
  }
  return 0;
}
