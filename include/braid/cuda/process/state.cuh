// braid/cuda/process/state.cuh — what a process_communicator holds (options, statistics, the state of
// one rank: staging memory, peer mappings, registrations, the call counter) and the host-side steps
// its calls share: failing quietly, exchanging a descriptor, waiting for the rank's stream.
#pragma once

#include "../runtime.cuh"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../comm/communicator.hpp"
#include "../../comm/options.hpp"
#include "../../core/error.hpp"
#include "../check.cuh"
#include "../handles.cuh"
#include "ipc.cuh"
#include "../enqueue/launcher.cuh"

#include <set>

#include <cerrno>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace braid::cuda {

// How a process_communicator's calls run (process_communicator::path()):
//  * device: every rank is alone on its GPU. A call is one cooperative launch of the executor's kernel
//    (cuda/device/executor.cuh, the kernel of the one-process communicator) on the caller's stream; ranks
//    wait for each other inside the kernel, through progress words in IPC-mapped device memory. The
//    call returns once the kernel is enqueued, and it can be captured in a CUDA graph.
//  * host: some ranks share a GPU. Kernels of different processes do not run at the same time on one
//    GPU, so no kernel may wait for a peer there: each round meets on the host (see process.cuh).
enum class process_path { automatic, host, device };

struct process_options {
  options base = options::from_env();         // timeout of the wait for this rank's stream (from_env: also the host's)
  // automatic: device when every rank is on a GPU of its own, else host. device where ranks share a
  // GPU is refused (invalid_argument). Every rank must ask for the same.
  process_path path = process_path::automatic;
  std::size_t staging_bytes = std::size_t{32} << 20; // device memory per rank, two halves
  // Host path: a piece of a peer on another GPU at or above this size is brought by the copy engines
  // into local scratch before the reduce kernel runs; smaller pieces, and every piece of a peer on
  // this rank's own GPU, are read by the reduce kernel directly (no second trip through memory).
  std::size_t copy_engine_min_bytes = std::size_t{1} << 20;
  // Blocks of the host path's reduce kernel; 0: from the device, one per SM at most, fewer for small
  // pieces (one block per process::reduce_bytes_per_block, 32 KiB, of the piece).
  int reduce_blocks = 0;
  int threads = 512;
  // The host path's wait for its own stream spins (cudaEventQuery) this long, then sleeps until a
  // host function enqueued behind the work wakes it (cudaLaunchHostFunc): no core is burnt on
  // waits longer than this. 0: sleep after the first 64 queries. Spinning stops at the timeout too.
  std::chrono::microseconds spin{20};
  // Device path: who orders a rank's calls on its GPU, braid or the caller's streams (call_order; a
  // call then costs one kernel launch in the steady state); each rank's own. The host path
  // synchronises on the host every round and ignores it.
  call_order order = call_order::braid;
};

// What a communicator has done, for tests and tuning.
struct process_stats {
  std::uint64_t calls = 0;
  std::uint64_t rounds = 0;
  std::uint64_t staged_bytes = 0;        // copied into staging memory (inputs not registered)
  std::uint64_t copy_engine_bytes = 0;   // moved from peers by cudaMemcpyAsync
  std::uint64_t direct_read_bytes = 0;   // read from peers by the reduce kernel
  // Times a call blocked the host: waits for the stream and host collectives (all_gather, barrier).
  // Host path, a call of R rounds of a schedule of D levels (process_host_layout.hpp): a wait before
  // the first round; per round the announcement, a wait and a barrier between consecutive levels,
  // and a wait at its end, except in a round that is not the call's last where D >= 2 and the last
  // level reads only windows; and a last barrier where the last level read a peer's registered input.
  // So with the automatic algorithm: all_reduce (two_shot) 3R + 2, the others (direct) 2R + 1, plus
  // the barrier. Device path: none (barrier(stream) is not a call).
  std::uint64_t host_syncs = 0;
  // Host path: rounds whose input was staged on the side stream while the previous round's reads
  // ran (every staged round but a call's first).
  std::uint64_t staged_ahead = 0;
  // Host path: the reduce kernel's grid at its last launch, and the waits for the stream that went
  // to sleep (spin over, woken by the host function) rather than spinning to the end.
  std::uint64_t reduce_grid = 0;
  std::uint64_t blocking_waits = 0;
};

namespace process {

// Each of a process rank's two staging halves (host path and device path alike) holds at least this
// much, whatever process_options::staging_bytes says.
inline constexpr std::size_t min_staging_half = std::size_t{64} << 10;

struct registration {
  bool live = true;
  std::uintptr_t mine = 0;
  std::size_t bytes = 0;
  std::vector<std::byte*> peer;
  std::vector<std::size_t> peer_bytes;
  std::vector<u64> peer_base;
};

// Releases, in this order when a state is destroyed: this rank's last GPU work is awaited and the
// event destroyed, peers' memory is unmapped, the staging memory is freed, the device restored.
struct restore_device {
  int saved = -1;
  ~restore_device() {
    if (saved >= 0) cudaSetDevice(saved);
  }
};
struct device_memory {
  void* p = nullptr;
  void* release() { return std::exchange(p, nullptr); }
  ~device_memory() {
    if (p) cudaFree(p);
  }
};
struct event {
  cudaEvent_t e = nullptr;
  ~event() {
    if (!e) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (cudaEventQuery(e) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    cudaEventDestroy(e);
  }
};

// Device path: a thread that watches the peers' processes (one pidfd each, blocked in poll(), no
// CPU) and, when one ends while this rank's communicator is open, records peer_failed (rank: this
// one, peer: the dead one) in the group's abort record. Every kernel of the group, waiting for the
// dead rank's progress, then returns at its next check, well before the deadline. Stopped by close()
// before its final barrier, so a peer that exits after closing normally is never reported.
struct peer_watch {
  std::thread t;
  int wake = -1;          // eventfd: stop()
  std::vector<int> fds;   // pidfd per watched peer
  std::vector<int> ranks; // their ranks
  bool watching() const noexcept { return t.joinable(); }
  void start(cuda::device::device_abort* rec, int me) {
    if (fds.empty()) return;
    wake = ::eventfd(0, EFD_CLOEXEC);
    if (wake < 0) return; // no watcher: a dead peer is then found at the deadline
    t = std::thread([this, rec, me] {
      std::vector<pollfd> p;
      for (int fd : fds) p.push_back(pollfd{fd, POLLIN, 0});
      p.push_back(pollfd{wake, POLLIN, 0});
      for (;;) {
        if (::poll(p.data(), p.size(), -1) < 0) {
          if (errno == EINTR) continue;
          return;
        }
        if (p.back().revents) return;
        for (std::size_t i = 0; i + 1 < p.size(); ++i)
          if (p[i].revents) {
            // A failure recorded before the peer ended (say the mismatch it found and raised, then
            // exited) stays the group's error.
            cuda::device::record_host_failure_if_first(
                rec, cuda::device::device_error{static_cast<unsigned>(errc::peer_failed), me, ranks[i], cuda::device::fail_step::peer_died, 0, cuda::device::call_id{}});
            return;
          }
      }
    });
  }
  void stop() noexcept {
    if (t.joinable()) {
      const std::uint64_t one = 1;
      (void)!::write(wake, &one, sizeof one);
      t.join();
    }
    if (wake >= 0) ::close(wake);
    wake = -1;
    for (int fd : fds) ::close(fd);
    fds.clear();
    ranks.clear();
  }
  ~peer_watch() { stop(); }
};

// The host path's sleep in its wait for the stream: a host function enqueued behind the awaited work
// (cudaLaunchHostFunc) records its ticket and writes an eventfd the waiting thread sleeps on in
// poll(). The waker outlives a wait that timed out: the host function still holds a reference.
struct stream_waker {
  int fd = -1;
  std::atomic<std::uint64_t> fired{0}; // the highest ticket whose host function has run
  std::uint64_t issued = 0;
  ~stream_waker() {
    if (fd >= 0) ::close(fd);
  }
  // Null where no eventfd can be made: the wait for the stream then naps instead of sleeping.
  static std::shared_ptr<stream_waker> make() {
    auto w = std::make_shared<stream_waker>();
    w->fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return w->fd >= 0 ? w : nullptr;
  }
  struct ticket {
    std::shared_ptr<stream_waker> w;
    std::uint64_t n;
  };
  static void run(void* p) { // on the CUDA driver's thread: no runtime calls here
    std::unique_ptr<ticket> t(static_cast<ticket*>(p));
    std::uint64_t seen = t->w->fired.load();
    while (seen < t->n && !t->w->fired.compare_exchange_weak(seen, t->n)) {
    }
    const std::uint64_t one = 1;
    (void)!::write(t->w->fd, &one, sizeof one);
  }
};

// The device path's memory and launch state (process_path::device).
struct shared_abort_page {
  void* p = nullptr; // host-mapped, registered, the same address for the host and the kernels
  std::size_t bytes = 0;
  bool registered = false;
  cuda::device::device_abort* rec() const { return static_cast<cuda::device::device_abort*>(p); }
  ~shared_abort_page() {
    if (registered) cudaHostUnregister(p);
    if (p) ::munmap(p, bytes);
  }
};
struct device_path_state {
  device_memory segment;     // control page (progress, round, in_desc, busy, exits, arrivals), then two halves
  device_memory table;       // device_rank[n]: this rank's view and the peers' through IPC mappings
  shared_abort_page abort;   // the group's abort record, one page of shared memory every rank maps
  std::shared_ptr<enqueue::device_set> set; // this rank alone on its GPU: the launcher's bookkeeping
  std::set<const void*> loaded;            // kernel instantiations checked for residency
  u64 half = 0;
  unsigned blocks = 1, threads = 512;
  u64 launches = 0;
  std::uint64_t call_word = 0, calls = 0; // this rank's call word chain (rank_call::call_word), calls made
  peer_watch watch;                        // after `abort`: stopped before the record is unmapped
  ~device_path_state() {
    if (!set) return;
    set->destroy_events();
  }
};

// Waits (bounded) until every launch of the device path on this rank has ended.
inline bool drain_launches(device_path_state& d, std::chrono::nanoseconds timeout) noexcept {
  if (!d.set || !d.set->chain || d.launches == 0) return true;
  const auto until = std::chrono::steady_clock::now() + timeout;
  cudaError_t e;
  while ((e = cudaEventQuery(d.set->chain)) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  (void)cudaGetLastError();
  return e != cudaErrorNotReady;
}

struct process_state {
  restore_device restore; // first member: destroyed last
  braid::communicator host;
  process_options opts;
  int device = 0;
  u64 half = 0;
  u64 max_pitch = 0; // cudaDevAttrMaxPitch
  device_memory staging;
  cuda::detail::owned_stream side; // host path: stages round k + 1 while round k's reads run
  event staged;             // host path: the side stream's staging, for the caller's stream to wait on
  std::vector<char> same_gpu; // host path: peer q is on this rank's GPU (its pieces are read directly)
  int sms = 1;                // this rank's GPU's multiprocessors (the reduce grid's ceiling)
  std::shared_ptr<stream_waker> waker; // wakes the wait for the stream (sync_stream)
  peer_mappings maps;
  std::unique_ptr<device_path_state> dev; // process_path::device only (destroyed before maps)
  event done;
  std::vector<std::byte*> peer_staging;
  std::vector<registration> regs;
  host_levels_cache levels; // host path: the levels of each schedule run so far
  u64 round = 0, seq = 0;
  process_stats stats;
  std::atomic<bool> failed{false};
  bool agreed_failure = false;  // construction failed with an error every rank raises (no abort)
  std::string cause;            // written only by the thread making a call
  std::string description;      // process_communicator::describe()
  cudaStream_t last_stream = nullptr; // of the call in progress, drained after an error
  ~process_state() {
    if (cudaGetDevice(&restore.saved) == cudaSuccess) cudaSetDevice(device);
  }
};

// After an error: stop peers from waiting for this rank, and let this rank's enqueued GPU work
// finish (bounded) before anything it reads can be released.
// Everything the call enqueued is awaited (an event recorded now on the call's stream), bounded by
// the timeout; the memory it reads is released only afterwards.
inline void fail_quietly(process_state& s) noexcept {
  s.failed.store(true);
  if (s.dev && s.dev->abort.rec()) {
    // Every kernel of the group (this rank's and the peers') returns at its next check. A record
    // already there (a kernel's timeout) stays the one check() reports.
    cuda::device::record_host_failure_if_first(s.dev->abort.rec(), cuda::device::device_error{static_cast<unsigned>(errc::aborted),
                                                                                            s.host.valid() ? s.host.rank() : -1, -1, -1, 0, cuda::device::call_id{}});
    (void)drain_launches(*s.dev, s.opts.base.timeout);
  }
  try {
    if (s.host.valid()) s.host.abort();
  } catch (...) {
  }
  if (s.side.h) { // the host path's staging stream: copies a failed round queued may still read inputs
    const auto until = std::chrono::steady_clock::now() + s.opts.base.timeout;
    while (cudaStreamQuery(s.side.h) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    (void)cudaGetLastError();
  }
  if (s.done.e) {
    if (s.seq) (void)cudaEventRecord(s.done.e, s.last_stream); // a call has run: drain its stream
    const auto until = std::chrono::steady_clock::now() + s.opts.base.timeout;
    while (cudaEventQuery(s.done.e) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    (void)cudaGetLastError();
  }
}

template <class W> std::vector<W> exchange(process_state& s, const W& mine) {
  std::vector<W> all(static_cast<std::size_t>(s.host.size()));
  s.host.all_gather(reinterpret_cast<const std::uint8_t*>(&mine), reinterpret_cast<std::uint8_t*>(all.data()), sizeof(W));
  return all;
}

// Waits (on the host, bounded) until everything enqueued on `stream` so far has run: spins for
// opts.spin, then sleeps in poll() until the host function enqueued behind the work says it ran
// (process_options::spin), checking the deadline every 10 ms. Without a waker (an eventfd could not be
// made) or where the host function cannot be enqueued, it naps 20 us between queries instead.
inline void sync_stream(process_state& s, cudaStream_t stream, const error_context& ctx) {
  BRAID_CUDA_CHECK(cudaEventRecord(s.done.e, stream));
  const auto start = std::chrono::steady_clock::now();
  auto query = [&] {
    const cudaError_t e = cudaEventQuery(s.done.e);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) cuda::detail::raise_cuda(e, "cudaEventQuery (this rank's GPU work)", __FILE__, __LINE__, ctx);
    return false;
  };
  auto overdue = [&] {
    if (std::chrono::steady_clock::now() - start > s.opts.base.timeout)
      raise(errc::timeout, "this rank's GPU work did not finish within the timeout (is the stream blocked by earlier work?)", ctx);
  };
  for (unsigned i = 0;; ++i) {
    if (query()) return;
    if ((i & 63) == 63) {
      if (std::chrono::steady_clock::now() - start >= s.opts.spin) break;
      overdue();
    }
  }
  stream_waker* w = s.waker.get();
  const std::uint64_t n = w ? ++w->issued : 0;
  if (w) {
    auto* t = new stream_waker::ticket{s.waker, n};
    if (cudaLaunchHostFunc(stream, &stream_waker::run, t) != cudaSuccess) {
      delete t;
      (void)cudaGetLastError();
      w = nullptr;
    }
  }
  if (!w) {
    for (;;) {
      if (query()) return;
      overdue();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  ++s.stats.blocking_waits;
  for (;;) {
    if (w->fired.load() >= n) break;
    pollfd p{w->fd, POLLIN, 0};
    if (::poll(&p, 1, 10) > 0) {
      std::uint64_t v = 0;
      (void)!::read(w->fd, &v, sizeof v);
    }
    if (w->fired.load() >= n) break;
    if (query()) return;
    overdue();
  }
  // The host function ran, so the event's work is done; the query reports an error it ended with.
  while (!query()) overdue();
}

// Registration holding [p, p + bytes) on this rank, or -1.
inline int find_registration(const process_state& s, const void* p, std::size_t bytes) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (std::size_t k = 0; k < s.regs.size(); ++k) {
    const registration& g = s.regs[k];
    if (g.live && at >= g.mine && at + bytes <= g.mine + g.bytes) return static_cast<int>(k);
  }
  return -1;
}

} // namespace process

} // namespace braid::cuda
