// braid/cuda/process/communicator.cuh — collectives between GPU ranks that live in different processes (or in
// different threads of one process), over CUDA IPC memory handles. Several processes may share one
// GPU.
//
//   braid::communicator host = braid::communicator_from_env();        // RANK/WORLD_SIZE/LOCAL_RANK, or
//   braid::cuda::process_communicator comm(std::move(host));          // BRAID_UNIQUE_ID; GPU = host rank % visible devices
//   comm.all_reduce(d_in, d_out, count, braid::sum{}, stream);        // host path: returns when the result is in d_out
//
// Two paths, chosen once at construction from where the ranks are (process_path in process_state.cuh;
// describe() says which and why; every rank takes the same one):
//  * Device path, when every rank is alone on its GPU. A call is one cooperative launch of the
//    executor's kernel (executor.cuh, the kernel of the one-process communicator) on the caller's
//    stream; the ranks' kernels wait for each other on progress words in IPC-mapped device memory,
//    each wait bounded by the timeout and by an abort record in shared host memory. Inputs are always
//    staged (registered memory is not read in place on this path). The call returns once the kernel
//    is enqueued, with no host wait, and it can be captured in a CUDA graph; an error a kernel
//    records (a timeout, an abort, a dead peer) is raised by check() or by the next call.
//  * Host path, when some ranks share a GPU. Kernels of different processes do not run at the same
//    time on one GPU (the GPU time-slices between contexts), so a kernel that spin-waited for a peer
//    process on the same GPU would wait for work that cannot run until it yields: on this path no
//    kernel waits for a peer, and each round meets on the host. The rest of this comment describes
//    this path except where it names the device path.
// A host-path call replays the schedule of its algorithm (every one; automatic is two_shot for
// all_reduce and direct for the others), round by round (process_host.cuh): (1) the chunks peers
// read are copied into the rank's staging memory unless the input lies in memory registered with
// the communicator; (2) all ranks exchange a small call descriptor through the host communicator
// (the round's first meeting, which also checks that every rank makes the same call); (3) the
// round's steps run in levels (process_host_layout.hpp), with a meeting (a wait for the stream, a
// host barrier) between consecutive levels so that a step reads a peer's window only after the
// peer's step wrote it. Copies are cudaMemcpyAsync; a reduction is the reduce kernel reading its
// sources through IPC mappings, except a peer's piece on another GPU of at least
// copy_engine_min_bytes, which the copy engines bring into local scratch first. Round k + 1's
// staging runs on a second stream beside round k's steps. Staging memory has two halves used by
// alternate rounds, so a rank never overwrites memory a peer may still read.
//
// Two kinds of error. Raised before anything is enqueued or exchanged, the communicator stays usable
// and the peers are not told (they wait in their call until the host deadline): invalid arguments,
// an algorithm the path does not implement (the device path implements automatic and direct, and
// one_shot and two_shot for all_reduce), a stream being captured (host path), a bad registration
// id, a null range to register. Raised once the call has started (CUDA errors, timeouts, a failed
// or mismatched peer, memory that cannot be exported): the communicator fails, aborts its host
// communicator so that the peers raise too, and refuses later calls. A call with count 0 returns at
// once on the calling rank, with no synchronisation and no check against the peers' calls.
//
// Guarantees: the reduction order is rank 0, 1, ..., n-1 for every element, so every rank gets
// identical bits (each element is reduced by one rank and copied bit for bit to the others; the
// device path's one_shot has every rank reduce every element in that order itself). Every host wait
// has the deadline of the host communicator's options (from_env passes process_options::base to it),
// the wait for this rank's own stream that of process_options::base.timeout, and a peer that dies or
// raises makes every other rank raise (peer_failed, aborted, or usage_error carrying that cause)
// instead of waiting. After an error of the second kind above the
// communicator refuses further calls (usage_error carrying the cause).
//
// Host-path calls are blocking on the host: a call returns when its work on `stream` is complete (it
// waits for the stream's earlier work too), and cannot be captured in a CUDA graph
// (unsupported_error). Destruction is collective: the destructor waits (a host barrier; on the device
// path first for this rank's kernels) until no peer can still be reading this rank's staging memory,
// unless the communicator failed.
//
// Where it has run: the host path (test_gpu_procs: processes sharing one GPU) has passed on one H100
// and one H200 (bench/results). The device path needs a GPU per rank and has run only on the emulated
// CUDA device (braid/emu: test_gpu_procs_emu_device, real processes), never on hardware; on a GPU,
// test_gpu_procs_device runs it where there are 3 GPUs or more. In CI this file compiles with nvcc and
// runs on the emulated device.
#pragma once

#include "../runtime.cuh"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../launch/env.hpp"
#include "../../comm/communicator.hpp"
#include "../../comm/options.hpp"
#include "../../comm/validate.hpp"
#include "../../core/error.hpp"
#include "../../core/ops.hpp"
#include "../../core/types.hpp"
#include "../check.cuh"
#include "../collectives.cuh"
#include "../device/signal.cuh"
#include "../handles.cuh"
#include "ipc.cuh"
#include "device_path.cuh"
#include "host_path.cuh"
#include "state.cuh"
#include "../device/kernel.cuh"
#include "host_layout.hpp"

namespace braid::cuda {

class process_communicator : public detail::stream_collectives<process_communicator> {
public:
  process_communicator() = default;
  process_communicator(process_communicator&&) noexcept = default;
  process_communicator& operator=(process_communicator&& o) noexcept {
    if (this != &o) {
      close();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  ~process_communicator() { close(); }

  // Joins the GPU ranks: one per rank of `host` (processes or threads of one host). `device` -1 picks
  // GPU host.rank() % (number of GPUs). Collective: every rank constructs at the same time.
  explicit process_communicator(braid::communicator host, int device = -1, const process_options& o = {})
      : s_(std::make_unique<state>()) {
    state& s = *s_;
    s.host = std::move(host);
    s.opts = o;
    const int n = s.host.size(), r = s.host.rank();
    error_context ctx{r, "cuda::process_communicator", 0, -1};
    try {
      if (n > process::max_ranks) raise(errc::unsupported, "at most 64 ranks", ctx);
      if (o.reduce_blocks < 0 || o.threads < 32 || o.threads > 512) // 512: reduce_kernel's launch bound
        raise(errc::invalid_argument, "reduce_blocks must be >= 0 (0: from the device) and threads within [32, 512]", ctx);
      if (o.spin.count() < 0) raise(errc::invalid_argument, "spin must not be negative", ctx);
      int count = 0;
      BRAID_CUDA_CHECK(cudaGetDeviceCount(&count));
      if (count < 1) raise(errc::unsupported, "no CUDA device", ctx);
      if (device < 0) device = r % count;
      if (device >= count) raise(errc::invalid_argument, "device " + std::to_string(device) + " does not exist", ctx);
      s.device = device;
      cuda::detail::device_guard dg(device);
      if (choose_device_path(s, ctx)) {
        process::setup_device_path(s, ctx);
        s.host.barrier(); // nobody uses a peer's memory before every rank has mapped everyone's
        return;
      }
      s.half = cuda::device::rank_segment::make(o.staging_bytes, process::min_staging_half).half_bytes;
      int pitch = 0;
      BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, device));
      s.max_pitch = static_cast<process::u64>(static_cast<unsigned>(pitch));
      BRAID_CUDA_CHECK(cudaMalloc(&s.staging.p, 2 * s.half));
      BRAID_CUDA_CHECK(cudaMemset(s.staging.p, 0, 2 * s.half));
      BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&s.done.e, cudaEventDisableTiming));
      BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&s.staged.e, cudaEventDisableTiming));
      BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&s.side.h, cudaStreamNonBlocking));
      BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&s.sms, cudaDevAttrMultiProcessorCount, device));
      s.waker = process::stream_waker::make();
      BRAID_CUDA_CHECK(cudaDeviceSynchronize());
      const process::wire_region mine = process::export_region(s.staging.p, 2 * s.half, device, ctx);
      std::vector<process::wire_region> all = exchange(s, mine);
      s.peer_staging.assign(static_cast<std::size_t>(n), nullptr);
      for (int q = 0; q < n; ++q) {
        const auto& w = all[static_cast<std::size_t>(q)];
        if (w.bytes != 2 * s.half)
          raise(errc::mismatch, "rank " + std::to_string(q) + " has " + std::to_string(w.bytes) + " bytes of staging memory, this rank " +
                                    std::to_string(2 * s.half) + ": every rank must use the same staging_bytes", ctx);
        if (q == r) {
          s.peer_staging[static_cast<std::size_t>(q)] = static_cast<std::byte*>(s.staging.p);
          continue;
        }
        s.peer_staging[static_cast<std::size_t>(q)] = s.maps.map(q, w, device, ctx);
      }
      // Nobody uses a peer's memory before every rank has mapped everyone's.
      s.host.barrier();
    } catch (...) {
      // An error every rank raises from the same exchanged data needs no abort (an abort could
      // reach a rank still finishing the exchange, and change its error); any other error stops
      // the peers.
      if (!s.agreed_failure) fail_quietly(s);
      throw;
    }
  }

  // Convenience: the host communicator from the launcher's environment (see launch/env.hpp).
  static process_communicator from_env(int device = -1, const process_options& o = {}) {
    return process_communicator(communicator_from_env(o.base), device, o);
  }

  bool valid() const noexcept { return s_ != nullptr; }
  // Which path this communicator's calls take (the same on every rank; see process_path).
  process_path path() const { return live().dev ? process_path::device : process_path::host; }
  // One line saying which path and why, for logs (also printed at construction under BRAID_DEBUG=1).
  std::string describe() const { return live().description; }
  // Device path: raises the error a kernel of the group recorded (a timeout, an abort), if any; call
  // it after synchronising the stream, or periodically. Every call checks it too before it enqueues.
  // Host path: nothing to check (calls raise themselves).
  void check() const {
    const state& s = live();
    if (s.dev) enqueue::raise_recorded(s.dev->abort.rec(), error_context{s.host.rank(), nullptr, 0, -1});
  }
  int rank() const { return live().host.rank(); }
  int size() const { return live().host.size(); }
  int device() const { return live().device; }
  // Device memory this communicator allocated (staging, both halves). The host communicator's shared
  // memory is host_memory_bytes().
  std::size_t memory_bytes() const { return 2 * (live().dev ? live().dev->half : live().half); }
  std::size_t host_memory_bytes() const { return live().host.memory_bytes(); }
  // IPC handles of peers' memory this rank holds open (staging and registrations).
  std::size_t open_handles() const { return live().maps.open_handles(); }
  const process_stats& stats() const { return live().stats; }
  braid::communicator& host() { return live().host; }

  // Registers [p, p + bytes) (device memory from cudaMalloc) with every peer: inputs inside it are
  // read by peers in place, with no staging copy. Collective: every rank calls it, each with its own
  // buffer (sizes may differ); returns the same id on every rank. Memory that cannot be exported
  // raises unsupported_error on that rank and aborts the call on the others.
  int register_memory(void* p, std::size_t bytes) {
    state& s = live();
    error_context ctx{s.host.rank(), "register_memory", 0, -1};
    if (!p || bytes == 0) raise(errc::invalid_argument, "register_memory: null pointer or zero bytes", ctx);
    return guarded(s, [&] {
      cuda::detail::device_guard dg(s.device);
      const process::wire_region mine = process::export_region(p, bytes, s.device, ctx);
      std::vector<process::wire_region> all = exchange(s, mine);
      registration reg;
      reg.mine = reinterpret_cast<std::uintptr_t>(p);
      reg.bytes = bytes;
      reg.peer.assign(all.size(), nullptr);
      reg.peer_bytes.assign(all.size(), 0);
      reg.peer_base.assign(all.size(), 0);
      for (int q = 0; q < static_cast<int>(all.size()); ++q) {
        if (q == s.host.rank()) continue;
        const auto& w = all[static_cast<std::size_t>(q)];
        reg.peer[static_cast<std::size_t>(q)] = s.maps.map(q, w, s.device, ctx);
        reg.peer_bytes[static_cast<std::size_t>(q)] = w.bytes;
        reg.peer_base[static_cast<std::size_t>(q)] = w.base;
      }
      s.regs.push_back(std::move(reg));
      s.host.barrier();
      return static_cast<int>(s.regs.size() - 1);
    });
  }

  // Collective: this rank closes its handles to the peers' registered memory, then waits until every
  // peer has closed its handles to this rank's; after it returns the memory may be freed.
  void deregister_memory(int id) {
    state& s = live();
    error_context ctx{s.host.rank(), "deregister_memory", 0, -1};
    if (id < 0 || id >= static_cast<int>(s.regs.size()) || !s.regs[static_cast<std::size_t>(id)].live)
      raise(errc::invalid_argument, "deregister_memory: no registration " + std::to_string(id), ctx);
    guarded(s, [&] {
      cuda::detail::device_guard dg(s.device);
      registration& reg = s.regs[static_cast<std::size_t>(id)];
      for (int q = 0; q < static_cast<int>(reg.peer.size()); ++q)
        if (reg.peer[static_cast<std::size_t>(q)]) s.maps.unmap(q, reg.peer_base[static_cast<std::size_t>(q)]);
      reg = registration{};
      reg.live = false;
      s.host.barrier();
      return 0;
    });
  }

  // Returns when the stream's earlier work is done on this rank and every rank has reached it.
  void barrier(cudaStream_t stream) {
    state& s = live();
    error_context ctx{s.host.rank(), "barrier", ++s.seq, -1};
    guarded(s, [&] {
      cuda::detail::device_guard dg(s.device);
      s.last_stream = stream;
      sync_stream(s, stream, ctx);
      s.host.barrier();
      return 0;
    });
  }
  // Releases every rank waiting in a call (they raise aborted_error); this communicator refuses
  // further calls. Any thread may call it.
  void abort() {
    state& s = live();
    s.failed.store(true);
    if (s.dev)
      cuda::device::record_failure({s.dev->abort.rec(), cuda::device::abort_host_slot},
                                  cuda::device::device_error{static_cast<unsigned>(errc::aborted), s.host.rank(), -1, cuda::device::fail_step::aborted, 0, cuda::device::call_id{}});
    try {
      s.host.abort();
    } catch (...) {
    }
  }

  // For a layer built over this communicator (braid::mpi::cuda_communicator, whose ranks compare calls
  // across hosts): publishes a failure found outside this communicator's calls, as abort() does but
  // with `code`. Ranks waiting in a call on the host raise it (errc::mismatch: mismatch_error carrying
  // `message`; see braid::communicator::publish_failure); on the device path the group's kernels stop
  // at their next look at the abort flag and their ranks raise `code` from check() or their next call.
  // This communicator refuses further calls. The first failure recorded wins.
  void publish_failure(errc code, const std::string& message) {
    state& s = live();
    s.failed.store(true);
    if (s.cause.empty()) s.cause = message;
    if (s.dev)
      cuda::device::record_failure({s.dev->abort.rec(), cuda::device::abort_host_slot},
                                  cuda::device::device_error{static_cast<unsigned>(code), s.host.rank(), -1, cuda::device::fail_step::published, 0, cuda::device::call_id{}});
    try {
      s.host.publish_failure(code, message);
    } catch (...) {
    }
  }

  // Collective unless the communicator failed: this rank closes its handles to the peers' memory,
  // then waits (host barrier) until every peer has closed its handles to this rank's memory, then frees
  // it. The destructor calls it; errors are swallowed there. Moving onto a live communicator closes it
  // too. A failed communicator skips the barrier: peers still reading this rank's memory when it is
  // freed read undefined data (they are failing too).
  void close() noexcept {
    if (!s_) return;
    state& s = *s_;
    // A failure in the group's abort record (a peer's death seen by the watcher, a kernel's timeout,
    // another rank's abort) that no call of this rank raised yet, or that check() raised: the group
    // has failed as surely as if a call had, and peers' kernels may still be reading this rank's
    // memory. Closing normally would free it under them (the emulator makes that a SIGBUS in the
    // peer, as CUDA makes it undefined).
    if (!s.failed.load() && s.dev && s.dev->abort.rec() && cuda::device::abort_raised(s.dev->abort.rec())) fail_quietly(s);
    // A failed device path: peers' kernels may read this rank's memory until they see the abort flag
    // (their next check). It is not freed: it stays allocated until the process exits.
    if (s.failed.load() && s.dev) (void)s.dev->segment.release();
    if (!s.failed.load() && s.host.valid()) {
      try {
        cuda::detail::device_guard dg(s.device);
        // Device path: this rank's kernels may still read the peers' memory (and they this rank's).
        if (s.dev && !process::drain_launches(*s.dev, s.opts.base.timeout)) {
          fail_quietly(s);
          s_.reset();
          return;
        }
        // Peers may exit once past the barrier below: stop watching them first.
        if (s.dev) s.dev->watch.stop();
        s.maps.close_all();
        s.host.barrier();
      } catch (...) {
      }
    }
    s_.reset();
  }

private:
  using registration = process::registration;
  using state = process::process_state;
  std::unique_ptr<state> s_;

  state& live() const {
    if (!s_) raise(errc::invalid_usage, "this process_communicator is empty (default-constructed, moved from or closed)");
    return *s_;
  }

  template <class F> auto guarded(state& s, F&& f) -> decltype(f()) {
    if (s.failed.load())
      raise(errc::invalid_usage,
            "this communicator refuses further calls after an error: " + (s.cause.empty() ? std::string("abort() was called") : s.cause),
            error_context{s.host.valid() ? s.host.rank() : -1, "cuda::process_communicator", s.seq, -1});
    try {
      return f();
    } catch (const std::exception& e) {
      s.cause = e.what();
      fail_quietly(s);
      throw;
    }
  }

  friend class detail::stream_collectives<process_communicator>;
  template <collective c, class T, class Op>
  void collective_call(const T* in, T* out, std::size_t count, int root, const Op& op, cudaStream_t stream, call_options co) {
    state& s = live();
    const int n = s.host.size(), r = s.host.rank();
    error_context ctx{r, std::string_view(name(c)).data(), ++s.seq, -1};
    const braid::detail::call_record k = braid::detail::validate_call<c, T, Op>(in, out, count, root, n, r, co.algorithm, ctx);
    const bool device_algo = c == collective::all_reduce && (co.algorithm == algo::one_shot || co.algorithm == algo::two_shot);
    if (s.dev && co.algorithm != algo::automatic && co.algorithm != algo::direct && !device_algo)
      raise(errc::unsupported, "the cross-process CUDA communicator's device path implements only the direct algorithm (and one_shot, "
                               "two_shot for all_reduce)", ctx);
    if (s.dev) {
      guarded(s, [&] {
        process::device_call<c, T>(s, k, op, stream, co, ctx);
        return 0;
      });
      return;
    }
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    BRAID_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
    if (cap != cudaStreamCaptureStatusNone)
      raise(errc::unsupported, "cross-process collectives synchronise on the host and cannot be captured in a CUDA graph", ctx);
    guarded(s, [&] {
      s.last_stream = stream;
      ++s.stats.calls;
      if (count == 0) return 0;
      cuda::detail::device_guard dg(s.device);
      process::run_rounds<c, T>(s, k, op, stream, co.algorithm, ctx);
      return 0;
    });
  }

  // The path, decided once from where the ranks are: every rank learns every rank's device and
  // requested path (an all_gather), so the choice is the same everywhere.
  static bool choose_device_path(state& s, const error_context& ctx) {
    struct where {
      std::int32_t device, asked, shared_ok;
    };
    // Test-only: BRAID_TEST_SHARED_GPU_DEVICE_PATH=1 takes the device path where ranks share a GPU.
    // Its kernels then wait for kernels of other processes on the same GPU, which only CUDA MPS runs
    // beside them (without it they wait until the timeout): for testing the device path on one GPU.
    const char* force_env = std::getenv("BRAID_TEST_SHARED_GPU_DEVICE_PATH");
    const std::int32_t force = force_env && std::string(force_env) == "1";
    const int n = s.host.size();
    const std::vector<where> all = exchange(s, where{s.device, static_cast<std::int32_t>(s.opts.path), force});
    bool distinct = n > 1;
    std::string devices;
    s.same_gpu.assign(static_cast<std::size_t>(n), 0);
    for (int q = 0; q < n; ++q) {
      const where& w = all[static_cast<std::size_t>(q)];
      s.same_gpu[static_cast<std::size_t>(q)] = w.device == s.device;
      if (w.asked != all[0].asked || w.shared_ok != all[0].shared_ok) {
        s.agreed_failure = true; // every rank sees the same `all`
        raise(errc::mismatch, "rank " + std::to_string(q) + " asked for a different process_path than rank 0" +
                                  (w.shared_ok != all[0].shared_ok ? " (BRAID_TEST_SHARED_GPU_DEVICE_PATH differs)" : ""), ctx);
      }
      if (q) devices += ',';
      devices += std::to_string(w.device);
      for (int k = 0; k < q; ++k) distinct = distinct && all[static_cast<std::size_t>(k)].device != w.device;
    }
    const auto asked = static_cast<process_path>(all[0].asked);
    const bool forced = all[0].shared_ok && !distinct && n > 1 && asked != process_path::host;
    if (forced) distinct = true;
    if (asked == process_path::device && !distinct) {
      s.agreed_failure = true; // every rank raises this error from the same data
      raise(errc::invalid_argument, "process_path::device needs every rank on a GPU of its own (devices " + devices +
                                        "): kernels of processes that share a GPU must not wait for each other", ctx);
    }
    const bool device = asked == process_path::device || (asked == process_path::automatic && distinct);
    s.description = std::string(device ? "device path" : "host path") + " (" + std::to_string(n) + " ranks on GPUs " + devices +
                    (forced ? "; some share a GPU, device path forced by BRAID_TEST_SHARED_GPU_DEVICE_PATH)"
                     : asked == process_path::automatic ? (distinct ? "; each alone on its GPU)" : "; some share a GPU)") : "; asked for)");
    if (s.opts.base.debug && s.host.rank() == 0) std::fprintf(stderr, "braid: cuda::process_communicator: %s\n", s.description.c_str());
    return device;
  }

};

} // namespace braid::cuda
