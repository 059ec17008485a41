// bench/gpu_sync_probe.cu — what one step of braid's collective kernel costs on a real GPU, taken
// apart. Built as braid-gpu-sync-probe where CUDA is on (nothing to run without a GPU: it is no test);
// bench/gpu-check.sh runs it. First run: bench/results/h100-2026-11-25/5-sync-probe.txt. Two "ranks" (sides) share one cooperative launch, `blocks` blocks of 512 threads each, as
// collective_kernel (cuda/device/executor.cuh) runs ranks of one GPU, and each side takes K steps with the
// executor's own primitives: the block arrival and the last block's system-scope post
// (arrive_and_post's pattern), and wait_ge on the other side's progress word. Variants:
//   post only   each side arrives and posts K times, never waits (the cost of arrive + post)
//   lockstep    step k waits for the other side's step k-1, then arrives and posts
//   +copy BYTES lockstep, and each step copies BYTES with reduce_copy across the side's blocks
// and then the parts a step of collective_kernel adds, one at a time (second table, 64 KiB copies):
//   acq      every step thread 0 passes a wait on a word already posted (a poll and an acquire)
//   sys      every step thread 0 reads two peer words at system scope (the call word, in_desc) into
//            shared memory, then a block barrier
//   bar      two more block barriers per step (the executor has four per step)
//   round    no lockstep: blocks run 32 steps freely, then wait at a round barrier (own side's round
//            posted by its last block, the other side's round before), as the executor's rounds do
// Waits are wait_ge with its default abort-flag interval (cuda/device/signal.cuh: 100 us since 2026-11-26; the
// runs of 2026-11-25 and 2026-11-26 were built when every 64 polls read the flag).
// Printed: microseconds per step (cudaEvent time of the launch / K), median of 5 launches. Built for the
// emulated device too (braid-gpu-sync-probe-emu, a CTest with BRAID_PROBE_QUICK=1: small grids and few
// steps): there it checks that every variant completes, and prints no time.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <braid/cuda/device/executor.cuh>

using namespace braid::cuda::device;

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
  u64* progress = nullptr;   // [2], one per side
  u64* arrivals = nullptr;   // [2][K+1]
  device_abort* abort = nullptr;
  unsigned blocks = 0;       // per side
  int steps = 0;
  int mode = 0;              // probe_lock | probe_acq | probe_sys | probe_bar | probe_round (0: post only)
  u64* words = nullptr;      // [4]: each side's "call word" and "in_desc" (read by the other side: probe_sys)
  u64* round_word = nullptr; // [2]: rounds completed by each side (probe_round)
  u64* round_arr = nullptr;  // [2][steps / 32 + 1]: round-end arrivals
  const float* src[2] = {};
  float* dst[2] = {};
  std::uint64_t copy_count = 0; // floats per step (0: no copy)
};

enum : int { probe_lock = 1, probe_acq = 2, probe_sys = 4, probe_bar = 8, probe_round = 16 };
constexpr int probe_round_steps = 32;

BRAID_KERNEL_BOUNDED(512) void probe_kernel(probe_args a) {
  namespace gpu = braid::cuda::device;
  BRAID_SHARED int stop;
  BRAID_SHARED u64 peer_words[2];
  const unsigned thread = gpu::thread_index();
  const int side = static_cast<int>(gpu::block_index() / a.blocks);
  const unsigned block = gpu::block_index() % a.blocks;
  const int other = 1 - side;
  const std::uint64_t tid = static_cast<std::uint64_t>(block) * gpu::block_size() + thread;
  const std::uint64_t nthreads = static_cast<std::uint64_t>(a.blocks) * gpu::block_size();
  if (thread == 0) stop = 0;
  gpu::sync_block();
  const abort_ref ab{a.abort, 1};
  constexpr u64 deadline = 10'000'000'000ull;
  for (int k = 0; k < a.steps; ++k) {
    const u64 rr = static_cast<u64>(k / probe_round_steps);
    if ((a.mode & probe_round) && k % probe_round_steps == 0 && k > 0) {
      if (thread == 0 && !wait_ge(a.round_word + side, rr, ab, deadline, side, side, k)) stop = 1;
      if (thread == 1 && rr >= 2 && !wait_ge(a.round_word + other, rr - 1, ab, deadline, side, other, k)) stop = 1;
      gpu::sync_block();
      if (stop) return;
    }
    if ((a.mode & probe_lock) && k > 0) {
      if (thread == 0 && !wait_ge(a.progress + other, static_cast<u64>(k), ab, deadline, side, other, k)) stop = 1;
      gpu::sync_block();
      if (stop) return;
    }
    if (a.mode & probe_acq) {
      if (thread == 0 && !wait_ge(a.progress + other, 0, ab, deadline, side, other, k)) stop = 1;
      gpu::sync_block();
      if (stop) return;
    }
    if (a.mode & probe_sys) {
      if (thread == 0) {
        peer_words[0] = sys_u64(a.words[2 * other]).load(gpu::memory_order::relaxed);
        peer_words[1] = sys_u64(a.words[2 * other + 1]).load(gpu::memory_order::relaxed);
      }
      gpu::sync_block();
      if (peer_words[0] == 1) stop = 1; // never: the words stay 0; keeps the loads
    }
    if (a.mode & probe_bar) {
      gpu::sync_block();
      gpu::sync_block();
    }
    if (a.copy_count) {
      const float* s[1] = {a.src[side]};
      reduce_copy<float>(s, 1, a.dst[side], static_cast<float*>(nullptr), a.copy_count, braid::detail::copy_only{}, false, 2,
                         tid, nthreads);
    }
    if (arrive(a.arrivals + side * (a.steps + 1) + k, a.blocks)) post_max_release(a.progress + side, static_cast<u64>(k + 1));
    if ((a.mode & probe_round) && k % probe_round_steps == probe_round_steps - 1 &&
        arrive(a.round_arr + side * (a.steps / probe_round_steps + 1) + rr, a.blocks) && thread == 0)
      post_max_release(a.round_word + side, rr + 1);
  }
}

const char* mode_name(int mode) {
  switch (mode) {
  case 0: return "post-only";
  case probe_lock: return "lockstep";
  case probe_lock | probe_acq: return "lock+acq";
  case probe_lock | probe_acq | probe_sys: return "lock+acq+sys";
  case probe_lock | probe_acq | probe_sys | probe_bar: return "lock+acq+sys+bar";
  case probe_round: return "round";
  case probe_round | probe_acq | probe_sys: return "round+acq+sys";
  case probe_round | probe_acq | probe_sys | probe_bar: return "round+acq+sys+bar";
  default: return "?";
  }
}

double run(unsigned blocks, int steps, int mode, std::uint64_t copy_bytes, const std::vector<float*>& buf, device_abort* ab) {
  u64 *progress = nullptr, *arrivals = nullptr, *words = nullptr, *round_word = nullptr, *round_arr = nullptr;
  const std::size_t nround_arr = 2 * static_cast<std::size_t>(steps / probe_round_steps + 1);
  CK(cudaMalloc(&progress, 2 * sizeof(u64)));
  CK(cudaMalloc(&arrivals, 2 * (steps + 1) * sizeof(u64)));
  CK(cudaMalloc(&words, 4 * sizeof(u64)));
  CK(cudaMalloc(&round_word, 2 * sizeof(u64)));
  CK(cudaMalloc(&round_arr, nround_arr * sizeof(u64)));
  CK(cudaMemset(words, 0, 4 * sizeof(u64)));
  probe_args a{.progress = progress,
               .arrivals = arrivals,
               .abort = ab,
               .blocks = blocks,
               .steps = steps,
               .mode = mode,
               .words = words,
               .round_word = round_word,
               .round_arr = round_arr};
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
    CK(cudaMemset(round_word, 0, 2 * sizeof(u64)));
    CK(cudaMemset(round_arr, 0, nround_arr * sizeof(u64)));
    CK(cudaEventRecord(e0));
    CK(braid::cuda::device::launch_cooperative(probe_kernel, 2 * blocks, 512, 0, nullptr, a));
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
  CK(cudaFree(words));
  CK(cudaFree(round_word));
  CK(cudaFree(round_arr));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return us[us.size() / 2];
}

// An emulator's time is not a GPU's: none is printed there.
std::string us(double v) {
#if BRAID_CUDA_EMULATOR
  (void)v;
  return "-";
#else
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
#endif
}

} // namespace

int main() {
  const bool quick = std::getenv("BRAID_PROBE_QUICK") && std::string(std::getenv("BRAID_PROBE_QUICK")) == "1";
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
  const int steps = quick ? 64 : 2000;
  const std::vector<unsigned> grids = quick ? std::vector<unsigned>{1, 2} : std::vector<unsigned>{1, 16, 64};
  const std::vector<std::uint64_t> copies =
      quick ? std::vector<std::uint64_t>{4096} : std::vector<std::uint64_t>{std::uint64_t{64} << 10, std::uint64_t{1} << 20, std::uint64_t{4} << 20};
  std::printf("%8s %10s %12s %12s\n", "blocks", "variant", "copy bytes", "us/step");
  for (unsigned blocks : grids) {
    std::printf("%8u %10s %12d %12s\n", blocks, "post-only", 0, us(run(blocks, steps, 0, 0, buf, ab)).c_str());
    std::printf("%8u %10s %12d %12s\n", blocks, "lockstep", 0, us(run(blocks, steps, probe_lock, 0, buf, ab)).c_str());
    for (std::uint64_t c : copies)
      std::printf("%8u %10s %12llu %12s\n", blocks, "lockstep", static_cast<unsigned long long>(c),
                  us(run(blocks, steps / 4, probe_lock, c, buf, ab)).c_str());
  }
  // The parts of a collective_kernel step, added one at a time; 33 blocks = an H100's default share
  // for each of 2 ranks on one GPU. 64 KiB per step, as the chunked schedules copy.
  std::printf("# the parts of a step (copies of %llu bytes, %d steps a round where rounds are on)\n",
              static_cast<unsigned long long>(quick ? 4096 : 65536), probe_round_steps);
  std::printf("%8s %18s %12s %12s\n", "blocks", "variant", "copy bytes", "us/step");
  const int modes[] = {probe_lock, probe_lock | probe_acq, probe_lock | probe_acq | probe_sys,
                       probe_lock | probe_acq | probe_sys | probe_bar, probe_round, probe_round | probe_acq | probe_sys,
                       probe_round | probe_acq | probe_sys | probe_bar};
  const std::uint64_t part_copy = quick ? 4096 : std::uint64_t{64} << 10;
  for (unsigned blocks : quick ? std::vector<unsigned>{2} : std::vector<unsigned>{16, 33})
    for (int m : modes)
      std::printf("%8u %18s %12llu %12s\n", blocks, mode_name(m), static_cast<unsigned long long>(part_copy),
                  us(run(blocks, quick ? 96 : 1024, m, part_copy, buf, ab)).c_str());
  return 0;
}
