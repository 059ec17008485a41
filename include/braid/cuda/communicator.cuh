// braid/cuda/communicator.cuh — collectives between ranks that are GPUs (or shares of one GPU) driven
// by one process. Each rank has its own CUDA stream, buffers and staging memory; peers' memory is
// reached through cudaDeviceEnablePeerAccess (ranks on the same GPU need nothing).
//
//   auto comms = braid::cuda::create_group({0, 0, 0, 0});   // four ranks sharing GPU 0
//   comms[r].all_reduce(d_in, d_out, count, braid::sum{}, stream_r);  // from rank r's thread, or one
//                                                                    // thread enqueuing for all ranks
//
// Calls are stream-ordered and return at once; nothing is synchronised on the host. Every rank must
// enqueue the same collectives in the same order, and the kernels of all ranks of a call must be able
// to run at the same time: create_group sizes the grids so that all ranks on one GPU are co-resident
// and refuses a configuration where they could not be. A kernel that waits longer than the timeout,
// or sees the group aborted, returns early; check() raises that error on the host (call it after
// synchronising the stream, or periodically). A collective is capturable in a CUDA graph: round
// numbers live on the device, so every replay is a new round.
//
// Not verified on a GPU yet: in CI this file compiles with nvcc and runs on the emulated CUDA device
// (braid/emu: test_gpu_emu); the nvcc build of the GPU tests runs only where a GPU is present.
#pragma once

#include "runtime.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../comm/options.hpp"
#include "../comm/tuning.hpp"
#include "../comm/validate.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/types.hpp"
#include "../schedule/schedule.hpp"
#include "check.cuh"
#include "collectives.cuh"
#include "executor.cuh"
#include "kernel.cuh"

namespace braid::cuda {

// Tuning for the CUDA backend (not yet measured: no GPU run so far; see docs/benchmarks.md).
inline constexpr tuning_rule cuda_tuning[] = {
    {collective::all_reduce, 2, 64, std::uint64_t{256} << 10, algo::one_shot, "unmeasured: one synchronisation"},
    {collective::all_reduce, 2, 64, ~std::uint64_t{0}, algo::two_shot, "unmeasured: 2(n-1)/n bytes, two synchronisations"},
    {collective::reduce_scatter, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured"},
    {collective::all_gather, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured"},
    {collective::broadcast, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured"},
    {collective::reduce, 2, 64, ~std::uint64_t{0}, algo::direct, "unmeasured"},
};

struct group_options {
  options base = options::from_env();
  int threads_per_block = 512;
  int max_blocks_per_rank = 32;
};

namespace detail {

struct rank_memory {
  int device = 0;
  void* segment = nullptr; // progress, in_desc, arrivals, round, then the two halves
  cuda_detail::device_rank view{};
  cuda_detail::device_rank* table = nullptr; // device copy of every rank's view, on this rank's GPU
};

struct group_state {
  int nranks = 0;
  int blocks = 1, threads = 512;
  std::uint64_t half_bytes = 0;
  std::vector<rank_memory> ranks;
  cuda_detail::device_abort* abort = nullptr; // host-mapped, portable
  options opts;
  ~group_state() {
    for (auto& r : ranks) {
      cudaSetDevice(r.device);
      cudaDeviceSynchronize(); // no kernel of the group may still use the memory
      if (r.table) cudaFree(r.table);
      if (r.segment) cudaFree(r.segment);
    }
    if (abort) cudaFreeHost(abort);
  }
};


} // namespace detail

class communicator : public detail::stream_collectives<communicator> {
public:
  communicator() = default;
  int rank() const { return live(), rank_; }
  int size() const { return live().nranks; }
  int device() const { return live().ranks[static_cast<std::size_t>(rank_)].device; }
  bool valid() const noexcept { return g_ != nullptr; }
  // The launch shape of this group's kernels (the same for every rank): blocks per rank, chosen by
  // create_group from the device's SMs, and threads per block (group_options::threads_per_block).
  int blocks_per_rank() const { return live().blocks; }
  int threads_per_block() const { return live().threads; }

  // Raises the error a kernel of this group recorded (timeout, abort), if any.
  void check() const {
    const detail::group_state& g = live();
    auto* ab = g.abort;
    if (!cuda_detail::abort_raised(ab)) return;
    // The flag is raised only once the record is claimed; wait (briefly) until it is complete.
    for (int i = 0; !cuda_detail::abort_record_written(ab); ++i) {
      if (i > 100000) raise(errc::aborted, "the group was aborted (its error record was never completed)", error_context{rank_, "cuda collective", 0, -1});
      std::this_thread::yield();
    }
    const cuda_detail::device_error first = ab->first;
    error_context c{first.rank >= 0 ? first.rank : rank_, "cuda collective", 0, first.peer};
    if (first.code == static_cast<unsigned>(errc::timeout)) {
      // With CUDA_LAUNCH_BLOCKING=1 a launch returns only when its kernel has ended, so a thread that
      // enqueues several ranks never launches the peers its first kernel waits for.
      const char* lb = std::getenv("CUDA_LAUNCH_BLOCKING");
      const std::string hint = lb && lb[0] == '1'
                                   ? " (CUDA_LAUNCH_BLOCKING=1 is set: each launch returns only when its kernel ends, so ranks "
                                     "enqueued by one thread cannot run together; enqueue each rank from its own thread, or unset it)"
                                   : "";
      raise(errc::timeout, "rank " + std::to_string(first.rank) + " waited more than the timeout for rank " +
                               std::to_string(first.peer) + " at step " + std::to_string(first.step) + " on the " +
                               gpu::device_kind() + hint, c);
    }
    raise(errc::aborted, "the group was aborted", c);
  }
  // Makes every kernel of the group return at its next check (within microseconds).
  void abort() {
    cuda_detail::record_failure(live().abort, cuda_detail::device_error{static_cast<unsigned>(errc::aborted), rank_, -1, -1, 0});
  }


  algo algorithm_for(collective c, std::uint64_t bytes, algo requested = algo::automatic) const {
    const detail::group_state& g = live();
    if (requested != algo::automatic) return requested;
    const algo env = static_cast<int>(c) < 5 ? g.opts.algorithm[static_cast<int>(c)] : algo::automatic;
    if (env != algo::automatic && supports(env, c)) return env;
    return choose_algorithm(cuda_tuning, c, g.nranks, bytes);
  }

  friend std::vector<communicator> create_group(const std::vector<int>& devices, const group_options& o);

private:
  std::shared_ptr<detail::group_state> g_;
  int rank_ = 0;

  detail::group_state& live() const {
    if (!g_) raise(errc::invalid_usage, "this CUDA communicator is empty (default-constructed or moved from)");
    return *g_;
  }

  friend class detail::stream_collectives<communicator>;
  template <collective c, class T, class Op>
  void collective_call(const T* in, T* out, std::size_t count, int root, const Op& op, cudaStream_t stream, call_options co) {
    detail::group_state& g = live();
    const int n = g.nranks, r = rank_;
    error_context ctx{r, std::string_view(name(c)).data(), 0, -1};
    check();
    const braid::detail::call_shape sh = braid::detail::validate_call<c, T>(in, out, count, root, n, r, co.algorithm, ctx);
    const bool reads_in = sh.reads_in, writes_out = sh.writes_out, in_place = sh.in_place;
    const std::size_t in_n = sh.in_n, out_n = sh.out_n;
    const auto lo = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
    if (count == 0) return;
    cuda_detail::device_guard dg(g.ranks[static_cast<std::size_t>(r)].device);
    if (n == 1) {
      if (writes_out && !in_place)
        BRAID_CUDA_CHECK(cudaMemcpyAsync(out, in, out_n * sizeof(T), cudaMemcpyDeviceToDevice, stream));
      return;
    }
    const algo a = algorithm_for(c, static_cast<std::uint64_t>(in_n) * sizeof(T), co.algorithm);
    if (!supports(a, c)) braid::detail::raise_unsupported_algorithm(a, c, ctx);
    schedule::with_supported_schedule<c>(a, [&](auto s) {
      using S = decltype(s);
      const std::uint64_t per = schedule::per_round<S, T>(c, n, g.half_bytes);
      if (per == 0) raise(errc::unsupported, "staging memory too small for this schedule", ctx);
      // Every round's schedule must fit the arrival counters.
      const std::uint32_t P = S::nchunks(c, n, schedule::pipeline_chunks<T>(std::min<std::uint64_t>(per, count)));
      if (S::nsteps(schedule::args{c, n, r, root, P}) > cuda_detail::max_steps)
        raise(errc::unsupported, "schedule has too many steps per round for the CUDA executor", ctx);
      cuda_detail::launch_args la{};
      la.ranks = g.ranks[static_cast<std::size_t>(r)].table;
      la.nranks = n;
      la.rank = r;
      la.root = root;
      la.coll = c;
      la.in = in;
      la.out = out;
      la.count = count;
      la.per_round = per;
      la.rounds = schedule::nrounds(count, per);
      la.half_bytes = g.half_bytes;
      la.in_desc = !in_place && reads_in ? static_cast<std::uint64_t>(lo(in)) : 0;
      la.abort = g.abort;
      la.timeout_ns = static_cast<std::uint64_t>(g.opts.timeout.count());
      BRAID_CUDA_CHECK(gpu::launch(&cuda_detail::collective_kernel<S, T, Op>, static_cast<unsigned>(g.blocks),
                                   static_cast<unsigned>(g.threads), 0, stream, la, op));
    });
  }
};

// Creates one communicator per entry of `devices` (rank r runs on GPU devices[r]; repeat a device to
// put several ranks on it). Enables peer access between the GPUs used, or raises unsupported.
inline std::vector<communicator> create_group(const std::vector<int>& devices, const group_options& o = {}) {
  const int n = static_cast<int>(devices.size());
  if (n < 1 || n > 64) raise(errc::invalid_argument, "create_group: between 1 and 64 ranks");
  int count = 0;
  BRAID_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int d : devices)
    if (d < 0 || d >= count) raise(errc::invalid_argument, "create_group: device " + std::to_string(d) + " does not exist");
  if (o.max_blocks_per_rank < 1) raise(errc::invalid_argument, "create_group: max_blocks_per_rank must be at least 1");
  for (int d : devices) {
    int most = 0;
    BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxThreadsPerBlock, d));
    if (o.threads_per_block < 1 || o.threads_per_block > most)
      raise(errc::invalid_argument, "create_group: threads_per_block must be within [1, " + std::to_string(most) + "] on GPU " +
                                        std::to_string(d));
  }
  auto g = std::make_shared<detail::group_state>();
  g->nranks = n;
  g->opts = o.base;
  g->threads = o.threads_per_block;
  g->half_bytes = (o.base.staging_bytes / 2 + 4095) / 4096 * 4096;
  // Peer access between distinct GPUs.
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int ok = 0;
      BRAID_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
      if (!ok) raise(errc::unsupported, "GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) + " peer to peer");
      cuda_detail::device_guard dg(a);
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else if (e != cudaSuccess) cuda_detail::raise_cuda(e, "cudaDeviceEnablePeerAccess", __FILE__, __LINE__);
    }
  // Co-residency: all ranks on one GPU must run their kernels at once. Every collective kernel uses
  // at most 128 registers per thread at this block size (checked below for the heaviest), so one
  // block per SM always fits; plan for that, and use at most half the SMs for braid.
  int blocks = o.max_blocks_per_rank;
  for (int d : devices) {
    const int on_d = static_cast<int>(std::count(devices.begin(), devices.end(), d));
    cuda_detail::device_guard dg(d);
    int sms = 0, per_sm = 0;
    BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
    BRAID_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, cuda_detail::collective_kernel<schedule::halving_doubling, double, avg<>>, g->threads, 0));
    if (per_sm < 1 || sms < on_d)
      raise(errc::unsupported, "GPU " + std::to_string(d) + " cannot keep the kernels of " + std::to_string(on_d) +
                                   " ranks resident at once (" + std::to_string(sms) + " SMs)");
    blocks = std::min(blocks, std::max(1, sms / on_d / 2));
  }
  g->blocks = blocks;
  BRAID_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&g->abort), sizeof(cuda_detail::device_abort),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
  *g->abort = cuda_detail::device_abort{};
  g->ranks.resize(static_cast<std::size_t>(n));
  const std::size_t ctrl = 4096 + (2 * (cuda_detail::max_steps + 2) + 1) * sizeof(cuda_detail::u64);
  const std::size_t ctrl_aligned = (ctrl + 4095) / 4096 * 4096;
  for (int r = 0; r < n; ++r) {
    auto& m = g->ranks[static_cast<std::size_t>(r)];
    m.device = devices[static_cast<std::size_t>(r)];
    cuda_detail::device_guard dg(m.device);
    const std::size_t bytes = ctrl_aligned + 2 * g->half_bytes;
    BRAID_CUDA_CHECK(cudaMalloc(&m.segment, bytes));
    BRAID_CUDA_CHECK(cudaMemset(m.segment, 0, ctrl_aligned));
    auto* base = static_cast<std::byte*>(m.segment);
    m.view.progress = reinterpret_cast<cuda_detail::u64*>(base);
    m.view.round = reinterpret_cast<cuda_detail::u64*>(base + 128);
    m.view.in_desc = reinterpret_cast<cuda_detail::u64*>(base + 256);
    m.view.arrivals = reinterpret_cast<cuda_detail::u64*>(base + 4096);
    m.view.half[0] = base + ctrl_aligned;
    m.view.half[1] = base + ctrl_aligned + g->half_bytes;
  }
  std::vector<cuda_detail::device_rank> views(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) views[static_cast<std::size_t>(r)] = g->ranks[static_cast<std::size_t>(r)].view;
  for (int r = 0; r < n; ++r) {
    auto& m = g->ranks[static_cast<std::size_t>(r)];
    cuda_detail::device_guard dg(m.device);
    BRAID_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&m.table), sizeof(cuda_detail::device_rank) * static_cast<std::size_t>(n)));
    BRAID_CUDA_CHECK(cudaMemcpy(m.table, views.data(), sizeof(cuda_detail::device_rank) * static_cast<std::size_t>(n), cudaMemcpyHostToDevice));
  }
  for (int r = 0; r < n; ++r) {
    cuda_detail::device_guard dg(g->ranks[static_cast<std::size_t>(r)].device);
    BRAID_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<communicator> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    out[static_cast<std::size_t>(r)].g_ = g;
    out[static_cast<std::size_t>(r)].rank_ = r;
  }
  return out;
}

} // namespace braid::cuda
