// braid/cuda/process/communicator.cuh's device path (every rank alone on its GPU): its memory, exported to every
// peer, and a call as one cooperative launch of the executor's kernel on the caller's stream, with no
// host wait. process_communicator chooses the path (process.cuh); this file holds what it runs.
#pragma once

#include "../runtime.cuh"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../../comm/tuning.hpp"
#include "../../core/error.hpp"
#include "../../schedule/call.hpp"
#include "../../schedule/schedule.hpp"
#include "../check.cuh"
#include "../device/executor.cuh"
#include "ipc.cuh"
#include "../enqueue/args.cuh"
#include "../enqueue/launcher.cuh"
#include "state.cuh"
#include "../tuning.cuh"

namespace braid::cuda::process {

// The device path's memory: a control page and two staging halves per rank in device memory,
// exported to every peer; a table of every rank's view, peers' through their IPC mappings; one
// page of shared host memory for the group's abort record, registered so kernels reach it.
inline void setup_device_path(process_state& s, const error_context& ctx) {
  const int n = s.host.size(), r = s.host.rank();
  auto d = std::make_unique<device_path_state>();
  int coop = 0, sms = 0;
  BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, s.device));
  if (!coop) raise(errc::unsupported, "GPU " + std::to_string(s.device) + " does not support cooperative launches", ctx);
  BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s.device));
  d->blocks = static_cast<unsigned>(std::max(1, std::min(sms / 2, s.opts.reduce_blocks > 0 ? s.opts.reduce_blocks : 16)));
  d->threads = static_cast<unsigned>(s.opts.threads);
  const cuda::device::rank_segment layout = cuda::device::rank_segment::make(s.opts.staging_bytes, min_staging_half);
  d->half = layout.half_bytes;
  const u64 bytes = layout.bytes();
  BRAID_CUDA_CHECK(cudaMalloc(&d->segment.p, bytes));
  BRAID_CUDA_CHECK(cudaMemset(d->segment.p, 0, layout.control_bytes));
  BRAID_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<wire_region> all = exchange(s, export_region(d->segment.p, bytes, s.device, ctx));
  std::vector<cuda::device::device_rank> views(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    const auto& w = all[static_cast<std::size_t>(q)];
    if (w.bytes != bytes)
      raise(errc::mismatch, "rank " + std::to_string(q) + " has " + std::to_string(w.bytes) + " bytes of device-path memory, this rank " +
                                std::to_string(bytes) + ": every rank must use the same staging_bytes", ctx);
    std::byte* base = q == r ? static_cast<std::byte*>(d->segment.p) : s.maps.map(q, w, s.device, ctx);
    views[static_cast<std::size_t>(q)] = layout.view(base);
  }
  BRAID_CUDA_CHECK(cudaMalloc(&d->table.p, sizeof(cuda::device::device_rank) * views.size()));
  BRAID_CUDA_CHECK(cudaMemcpy(d->table.p, views.data(), sizeof(cuda::device::device_rank) * views.size(), cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the copy has landed in device memory (it is
  // ordered only on the legacy default stream); a kernel on a non-blocking stream could read the
  // table first. Wait for it (the emulator models that window: without this wait 3 to 4 runs in 100
  // of mpi-cuda-mismatch-2x2 read the freshly allocated table's 0xDB poison and crashed).
  BRAID_CUDA_CHECK(cudaDeviceSynchronize());
  // The abort record: rank 0 creates a POSIX shared memory object under a random name and tells
  // the others; the name is removed once every rank has opened it.
  char name[64] = {};
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  int fd = -1;
  if (r == 0) {
    std::random_device rd;
    std::snprintf(name, sizeof name, "/braid-cuda-%ld-%08x%08x", static_cast<long>(::getpid()), rd(), rd());
    fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(page)) != 0) {
      const int err = errno;
      if (fd >= 0) ::close(fd), ::shm_unlink(name);
      raise(errc::system, std::string("shm_open/ftruncate for the abort record: ") + std::strerror(err), ctx);
    }
  }
  s.host.broadcast(reinterpret_cast<std::uint8_t*>(name), reinterpret_cast<std::uint8_t*>(name), sizeof name, 0);
  name[sizeof name - 1] = 0;
  if (r != 0) fd = ::shm_open(name, O_RDWR | O_CLOEXEC, 0);
  const int open_err = errno;
  void* m = fd >= 0 ? ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0) ::close(fd);
  s.host.barrier();
  if (r == 0) ::shm_unlink(name);
  if (m == MAP_FAILED) raise(errc::system, std::string("opening the abort record ") + name + ": " + std::strerror(open_err), ctx);
  d->abort.p = m;
  d->abort.bytes = page;
  BRAID_CUDA_CHECK(cudaHostRegister(m, page, cudaHostRegisterMapped | cudaHostRegisterPortable));
  d->abort.registered = true;
  void* dp = nullptr;
  BRAID_CUDA_CHECK(cudaHostGetDevicePointer(&dp, m, 0));
  if (dp != m)
    raise(errc::unsupported, "registered host memory has a different address on GPU " + std::to_string(s.device) +
                                 " (the device path needs canUseHostPointerForRegisteredMem)", ctx);
  // The peers' processes, watched (peer_watch): the pids of every rank, a pidfd for each other
  // process (ranks that are threads of this process are not watched; a kernel without pidfd_open
  // leaves a peer unwatched, found at the deadline instead).
  {
    std::vector<std::int64_t> pids(static_cast<std::size_t>(n));
    const std::int64_t me = static_cast<std::int64_t>(::getpid());
    s.host.all_gather(&me, pids.data(), 1);
    for (int q = 0; q < n; ++q) {
      if (q == r || pids[static_cast<std::size_t>(q)] == me) continue;
      const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pids[static_cast<std::size_t>(q)]), 0));
      if (pidfd < 0) continue;
      d->watch.fds.push_back(pidfd);
      d->watch.ranks.push_back(q);
    }
  }
  d->watch.start(d->abort.rec(), r);
  // This rank alone on its GPU: a launch serves one rank, and the error-record slot of its kernels
  // is 1 + rank.
  auto set = std::make_shared<enqueue::device_set>();
  set->device = s.device;
  set->index = r;
  set->ranks = {r};
  set->blocks_per_rank = d->blocks;
  set->busy = cuda::device::rank_segment::word(d->segment.p, cuda::device::rank_segment::busy_at);
  set->exits = cuda::device::rank_segment::word(d->segment.p, cuda::device::rank_segment::exits_at);
  set->next_seq.assign(1, 0);
  set->last_thread.assign(1, 0);
  set->abort = d->abort.rec();
  set->timeout = s.opts.base.timeout;
  set->order = s.opts.order;
  BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&set->chain, cudaEventDisableTiming));
  d->set = std::move(set);
  BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&s.done.e, cudaEventDisableTiming)); // barrier(stream)'s wait
  s.waker = stream_waker::make();
  s.dev = std::move(d);
}

// One call on the device path: stream-ordered, no host wait. Inputs are always staged (a peer in
// another process cannot read this rank's buffer in place). The algorithm: all_reduce one_shot or
// two_shot (the CUDA tuning table; direct means one_shot), the other collectives direct.
template <collective c, class T, class Op>
void device_call(process_state& s, braid::detail::call_record k, const Op& op, cudaStream_t stream, call_options co,
                 const error_context& ctx) {
  device_path_state& d = *s.dev;
  const int n = s.host.size(), r = s.host.rank();
  enqueue::raise_recorded(d.abort.rec(), ctx);
  s.last_stream = stream;
  ++s.stats.calls;
  if (k.count == 0) return;
  // n > 1 here: one rank never takes the device path. Under call_order::streams the launcher makes
  // the device current only where it must.
  std::optional<cuda::detail::device_guard> dg;
  if (d.set->order == call_order::braid) dg.emplace(s.device);
  const algo asked = co.algorithm == algo::automatic ? choose_algorithm(cuda_tuning, c, n, k.in_bytes()) : co.algorithm;
  k.algorithm = c != collective::all_reduce ? algo::direct : asked == algo::two_shot ? algo::two_shot : algo::one_shot;
  k.number = d.calls + 1;
  const std::uint64_t word = braid::detail::chain_call_word(d.call_word, braid::detail::describe(k), 0);
  auto run = [&](auto sched) {
    using S = decltype(sched);
    const cuda::device::launch_args la = enqueue::launch_args_for<S, T>(k, word, n, r, d.half, static_cast<const cuda::device::device_rank*>(d.table.p),
                                                                       d.abort.rec(), s.opts.base.timeout, ctx);
    // Inputs are always staged here (k.in_desc is 0): peers read them from staging. A launch serves
    // this rank alone, so never runs as one round whatever its part touches.
    const cuda::device::rank_call mine = enqueue::rank_call_for<T>(k, r, la.per_round, d.threads);
    auto kernel = &cuda::device::collective_kernel<S, T, Op>;
    if (!d.loaded.count(reinterpret_cast<const void*>(kernel))) {
      enqueue::check_resident(kernel, s.device, static_cast<int>(d.threads), d.blocks, "process_options::reduce_blocks",
                             "lower process_options::reduce_blocks or threads", ctx);
      d.loaded.insert(reinterpret_cast<const void*>(kernel));
    }
    const unsigned grid = d.blocks, threads = d.threads;
    enqueue::arrive({}, d.set, 0, r, k, reinterpret_cast<const void*>(kernel), la, mine, true, stream, s.opts.base.timeout, d.abort.rec(),
                    1, // 1: this process launches only its own GPU
                    [&](cudaStream_t st, const cuda::device::launch_args& args) {
                      return device::launch_cooperative(kernel, grid, threads, 0, st, args, op);
                    },
                    ctx);
    ++d.launches;
    d.call_word = word; // the chain advances once the call is enqueued
    ++d.calls;
    s.stats.rounds += la.rounds;
    if (k.reads_in) s.stats.staged_bytes += k.in_bytes();
  };
  if constexpr (c == collective::all_reduce) {
    if (k.algorithm == algo::two_shot) run(schedule::two_shot{});
    else run(schedule::one_shot{});
  } else {
    run(schedule::direct{});
  }
}

} // namespace braid::cuda::process
