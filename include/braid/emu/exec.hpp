// braid/emu/exec.hpp — how the emulated device runs a kernel: blocks on streaming multiprocessors
// (SMs) as far as their capacity allows, each resident block on an OS thread of its own, the CUDA
// threads of a block as fibers on that OS thread.
//
// Residency is what a GPU promises and no more. An SM holds at most `threads_per_sm` threads and
// `blocks_per_sm` blocks; a block starts when some SM has room for it, in launch order (the front of
// the device's queue waits; later launches wait behind it, as a GPU's block scheduler does). So the
// blocks of a launch are all live at once only when they fit the device, which is exactly what
// cudaOccupancyMaxActiveBlocksPerMultiprocessor answers; a kernel whose blocks wait for blocks that
// have no SM yet never finishes, as on a GPU (braid's device deadlines then fire).
//
// Inside a block, the fibers run round-robin until each reaches a block barrier (sync_block), a
// yield point (sleep_ns, or every 64th poll of an atomic), or its end. A barrier completes when every
// thread that has not exited has reached it (exited threads do not count, as on sm_70 and later).
// When a whole pass over a block's threads makes no progress (everyone is polling something another
// block or another rank must write), the OS thread yields its core, then naps, with a growing
// back-off, so that the threads that can make progress get the machine.
//
// Kernels of different processes on one device never run at the same time: a process takes the
// device (an abstract Unix socket name per device, released when the process ends, even by SIGKILL)
// for as long as any of its kernels on it runs; kernels of one process run concurrently.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cerrno>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fiber.hpp"

namespace braid::emu::detail {

// ---- TSan happens-before annotations (no-ops elsewhere) ----------------------------------------
#if BRAID_EMU_TSAN
inline void hb_release(void* addr) { __tsan_release(addr); }
inline void hb_acquire(void* addr) { __tsan_acquire(addr); }
#else
inline void hb_release(void*) {}
inline void hb_acquire(void*) {}
#endif

inline long env_long(const char* name, long fallback, long lo, long hi) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (*end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "braid emulated CUDA device: %s=%s is not a number in [%ld, %ld]; using %ld\n", name, s, lo, hi,
                 fallback);
    return fallback;
  }
  return v;
}

// Sleeps `ns` nanoseconds of wall time (the emulator's back-off; not a device timing).
inline void nap_ns(long ns) {
  timespec t{ns / 1000000000L, ns % 1000000000L};
  while (::nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

// ---- the machine ------------------------------------------------------------------------------

struct machine_shape {
  int devices = 2;
  unsigned sms = 16;
  unsigned threads_per_sm = 2048;
  unsigned blocks_per_sm = 32;
  unsigned max_threads_per_block = 1024;
  std::size_t stack_bytes = 256 << 10; // per emulated CUDA thread (virtual; pages are touched as used)
  static machine_shape from_env() {
    machine_shape m;
    m.devices = static_cast<int>(env_long("BRAID_EMU_DEVICES", 2, 1, 16));
    m.sms = static_cast<unsigned>(env_long("BRAID_EMU_SMS", 16, 1, 1024));
    m.stack_bytes = static_cast<std::size_t>(env_long("BRAID_EMU_STACK_KIB", 256, 16, 65536)) << 10;
    return m;
  }
  // Blocks of `threads` threads one SM holds at once (registers and shared memory are not modelled).
  unsigned blocks_per_sm_for(unsigned threads) const {
    if (threads == 0 || threads > max_threads_per_block) return 0;
    return std::min(blocks_per_sm, threads_per_sm / threads);
  }
};

// ---- a kernel launch, type-erased ---------------------------------------------------------------

struct kernel_job {
  void (*invoke)(const void* args) = nullptr; // runs the kernel body once, for the calling CUDA thread
  std::shared_ptr<const void> args;           // the launch's arguments (each thread gets its own copy)
  unsigned grid = 1, block = 1;
  bool cooperative = false; // all blocks start together, or none (cudaLaunchCooperativeKernel)
  // Progress, under the device scheduler's mutex: the launch is done when no block is left.
  unsigned next_block = 0;
  unsigned blocks_left = 0;
};

class worker;

// One block being run by a worker: the state its fibers and the scheduler share.
struct block_run {
  kernel_job* job = nullptr;
  unsigned bid = 0;
  // Addresses TSan synchronises on: the block barrier, one per barrier parity (a thread resuming from
  // barrier k must not acquire what a faster thread released at barrier k + 1), and the block's end.
  char barrier_token[2] = {0, 0};
  char exit_token = 0;
};

enum class fiber_event : int { none, barrier, yielded, exited };

// One emulated CUDA thread: its fiber and what the vocabulary reads.
struct cuda_thread {
  fiber f;
  worker* w = nullptr;
  block_run* run = nullptr;
  unsigned tid = 0;
  unsigned polls = 0;
  unsigned barriers = 0; // barriers this thread has passed in the current block
  bool first = true;
  std::atomic<int> event{0}; // fiber_event, written by the fiber, read by the scheduler
};

// The CUDA thread running on this OS thread (null outside a kernel). A relaxed atomic: the scheduler
// writes it and the fiber it switches to reads it, and TSan must not see that as a race.
inline thread_local std::atomic<cuda_thread*> tls_thread{nullptr};

inline cuda_thread& current_thread(const char* what) {
  cuda_thread* t = tls_thread.load(std::memory_order_relaxed);
  if (!t) {
    std::string m = std::string(what) + " was called outside a kernel running on the emulated device";
    fatal(m.c_str());
  }
  return *t;
}

// ---- processes take turns on a device ---------------------------------------------------------
// As on a GPU, where contexts of different processes time-slice: kernels of two processes never run
// at the same time on one emulated device. BRAID_EMU_MPS=1 emulates CUDA MPS instead: every
// process's kernels run beside each other's.

inline bool emulate_mps() {
  static const bool on = [] {
    const char* e = std::getenv("BRAID_EMU_MPS");
    return e && e[0] == '1' && e[1] == 0;
  }();
  return on;
}

// The sockets this process holds its devices with, so that a child forked while they are held can
// close its copies at once (it cannot use the runtime; it must not keep the devices either).
inline std::atomic<int> held_slice_fds[16] = {};
inline void close_slices_in_child() {
  for (auto& fd : held_slice_fds) {
    const int f = fd.exchange(-1);
    if (f > 0) ::close(f);
  }
}

class device_slice {
public:
  explicit device_slice(int device) : device_(device) {
    static const bool registered = [] { return ::pthread_atfork(nullptr, nullptr, &close_slices_in_child) == 0; }();
    (void)registered;
  }
  device_slice(const device_slice&) = delete;
  device_slice& operator=(const device_slice&) = delete;

  void enter() {
    std::unique_lock<std::mutex> lk(m_);
    if (emulate_mps()) {
      ++running_;
      return;
    }
    cv_.wait(lk, [&] { return !acquiring_; });
    if (running_ == 0 && !held_) {
      acquiring_ = true;
      lk.unlock();
      const int s = acquire_os_lock();
      lk.lock();
      sock_ = s;
      if (device_ >= 0 && device_ < 16) held_slice_fds[device_].store(s);
      held_ = true;
      acquiring_ = false;
      cv_.notify_all();
    }
    ++running_;
  }
  void leave() {
    std::lock_guard<std::mutex> lk(m_);
    if (emulate_mps()) {
      --running_;
      return;
    }
    if (--running_ == 0 && held_) {
      if (device_ >= 0 && device_ < 16) held_slice_fds[device_].store(-1);
      ::close(sock_);
      sock_ = -1;
      held_ = false;
    }
  }

private:
  int device_;
  std::mutex m_;
  std::condition_variable cv_;
  int running_ = 0;
  bool held_ = false, acquiring_ = false;
  int sock_ = -1;

  // Binds an abstract Unix socket whose name says (user, emulated machine, device): only one process
  // can hold it, and the kernel frees it when the process closes it or dies.
  int acquire_os_lock() const {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const char* machine = std::getenv("BRAID_EMU_MACHINE");
    char name[100];
    const int len = std::snprintf(name, sizeof name, "braid-emu/%u/%.40s/device%d", unsigned{::getuid()},
                                  machine && *machine ? machine : "default", device_);
    std::memcpy(a.sun_path + 1, name, static_cast<std::size_t>(len));
    const auto alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<std::size_t>(len));
    long wait = 20000;
    for (;;) {
      const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (s < 0) fatal("socket() failed for the device's time slice");
      if (::bind(s, reinterpret_cast<const sockaddr*>(&a), alen) == 0) return s;
      const int e = errno;
      ::close(s);
      if (e != EADDRINUSE) fatal("bind() failed for the device's time slice");
      nap_ns(wait);
      wait = std::min<long>(wait * 2, 1000000);
    }
  }
};

// ---- the block scheduler of one device ----------------------------------------------------------

class device_exec;

class worker {
public:
  explicit worker(device_exec& d) : dev_(d), os_(&worker::main, this) { os_.detach(); }
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  // Called with the device's mutex held.
  void assign(kernel_job* j, unsigned bid, unsigned sm) {
    std::lock_guard<std::mutex> lk(m_);
    job_ = j;
    bid_ = bid;
    sm_ = sm;
    cv_.notify_one();
  }

  // The vocabulary's operations on the running thread (called from a fiber of this worker).
  void barrier(cuda_thread& t) {
    char* token = &t.run->barrier_token[t.barriers++ & 1];
    hb_release(token);
    t.event.store(static_cast<int>(fiber_event::barrier), std::memory_order_relaxed);
    sched_.switch_from(t.f, false); // back to run_block; resumes here once the barrier completes
    hb_acquire(token);
  }
  void yield(cuda_thread& t) {
    t.event.store(static_cast<int>(fiber_event::yielded), std::memory_order_relaxed);
    sched_.switch_from(t.f, false);
  }

private:
  device_exec& dev_;
  std::mutex m_;
  std::condition_variable cv_;
  kernel_job* job_ = nullptr;
  unsigned bid_ = 0, sm_ = 0;
  fiber sched_;
  std::vector<std::unique_ptr<cuda_thread>> threads_;
  char* stacks_ = nullptr;
  std::vector<unsigned> ready_, next_, waiting_;
  block_run run_;
  std::thread os_;

  static void fiber_main(void* p);
  void main();
  void run_block(kernel_job& j, unsigned bid);
};

class device_exec {
public:
  device_exec(int index, const machine_shape& shape)
      : index_(index), shape_(shape), sm_threads_(shape.sms, 0), sm_blocks_(shape.sms, 0), slice_(index) {}
  device_exec(const device_exec&) = delete;
  device_exec& operator=(const device_exec&) = delete;

  const machine_shape& shape() const { return shape_; }
  int index() const { return index_; }

  // Runs every block of `j` and returns when all have ended (called by the stream's own thread).
  void execute(kernel_job& j) {
    slice_.enter();
    {
      std::lock_guard<std::mutex> lk(m_);
      j.next_block = 0;
      j.blocks_left = j.grid;
      queue_.push_back(&j);
      dispatch_locked();
    }
    {
      std::unique_lock<std::mutex> lk(m_);
      done_cv_.wait(lk, [&] { return j.blocks_left == 0; });
    }
    slice_.leave();
  }

private:
  friend class worker;
  int index_;
  machine_shape shape_;
  std::mutex m_;
  std::condition_variable done_cv_;
  std::vector<unsigned> sm_threads_, sm_blocks_;
  std::deque<kernel_job*> queue_;    // launches with blocks not yet started, in launch order
  std::vector<worker*> idle_;
  std::vector<std::unique_ptr<worker>> workers_;
  device_slice slice_;

  // Starts as many queued blocks as the SMs have room for, front first.
  void dispatch_locked() {
    while (!queue_.empty()) {
      kernel_job* j = queue_.front();
      if (j->next_block >= j->grid) {
        queue_.pop_front();
        continue;
      }
      if (j->cooperative && j->next_block == 0 && free_slots_locked(j->block) < j->grid)
        return; // a cooperative grid starts only when all of it fits (the launch checked that it can)
      unsigned best = shape_.sms;
      for (unsigned s = 0; s < shape_.sms; ++s) {
        if (sm_threads_[s] + j->block > shape_.threads_per_sm || sm_blocks_[s] + 1 > shape_.blocks_per_sm) continue;
        if (best == shape_.sms || sm_threads_[s] < sm_threads_[best]) best = s;
      }
      if (best == shape_.sms) return; // the front block waits for room; so does everything behind it
      sm_threads_[best] += j->block;
      sm_blocks_[best] += 1;
      worker* w = nullptr;
      if (!idle_.empty()) {
        w = idle_.back();
        idle_.pop_back();
      } else {
        workers_.push_back(std::make_unique<worker>(*this));
        w = workers_.back().get();
      }
      w->assign(j, j->next_block++, best);
    }
  }

  // How many more blocks of `threads` threads the SMs have room for now.
  unsigned free_slots_locked(unsigned threads) const {
    unsigned n = 0;
    for (unsigned s = 0; s < shape_.sms; ++s) {
      const unsigned by_threads = (shape_.threads_per_sm - sm_threads_[s]) / threads;
      n += std::min(by_threads, shape_.blocks_per_sm - sm_blocks_[s]);
    }
    return n;
  }

  // A worker finished block `bid` of `j` on SM `sm`.
  void block_done(worker* w, kernel_job& j, unsigned sm) {
    std::lock_guard<std::mutex> lk(m_);
    sm_threads_[sm] -= j.block;
    sm_blocks_[sm] -= 1;
    idle_.push_back(w);
    if (--j.blocks_left == 0) done_cv_.notify_all();
    dispatch_locked();
  }
};

[[noreturn]] inline void stack_overflow() {
  fatal("a CUDA thread overflowed its stack on the emulated device (raise BRAID_EMU_STACK_KIB, 256 by default)");
}

inline void worker::fiber_main(void* p) {
  fiber::asan_entered();
  auto* t = static_cast<cuda_thread*>(p);
  for (;;) {
    block_run& r = *t->run;
    r.job->invoke(r.job->args.get());
    hb_release(&r.exit_token);
    t->event.store(static_cast<int>(fiber_event::exited), std::memory_order_relaxed);
    t->w->sched_.switch_from(t->f, false);
  }
}

inline void worker::main() {
  sched_.adopt_current_thread();
  for (;;) {
    kernel_job* j = nullptr;
    unsigned bid = 0, sm = 0;
    {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return job_ != nullptr; });
      j = job_;
      bid = bid_;
      sm = sm_;
      job_ = nullptr;
    }
    run_block(*j, bid);
    dev_.block_done(this, *j, sm);
  }
}

inline void worker::run_block(kernel_job& j, unsigned bid) {
  const unsigned n = j.block;
  const std::size_t stack = dev_.shape().stack_bytes;
  if (!stacks_) { // room for the largest block, reserved once; pages are touched as stacks grow
    const std::size_t pg = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t len = pg + stack * dev_.shape().max_threads_per_block;
    void* m = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fatal("cannot reserve the CUDA threads' stacks (mmap failed)");
    if (::mprotect(m, pg, PROT_NONE) != 0) fatal("cannot protect the stacks' guard page");
    stacks_ = static_cast<char*>(m) + pg;
  }
  while (threads_.size() < n) {
#if BRAID_EMU_TSAN
    // ThreadSanitizer (g++ 12) stops the process past 8128 threads and fibers: say why first.
    static std::atomic<unsigned> fibers{0};
    if (fibers.fetch_add(1, std::memory_order_relaxed) > 7000)
      fatal("more than 7000 emulated CUDA threads are alive, and ThreadSanitizer allows 8128 threads and fibers in all: "
            "use smaller blocks or fewer SMs (BRAID_EMU_SMS) under ThreadSanitizer");
#endif
    auto t = std::make_unique<cuda_thread>();
    t->w = this;
    t->tid = static_cast<unsigned>(threads_.size());
    t->f.create(stacks_ + stack * threads_.size(), stack, &worker::fiber_main, t.get());
    threads_.push_back(std::move(t));
  }
  run_.job = &j;
  run_.bid = bid;
  for (unsigned i = 0; i < n; ++i) {
    cuda_thread& t = *threads_[i];
    t.run = &run_;
    t.first = true;
    t.polls = 0;
    t.barriers = 0;
  }
  // Threads that can run, in order; the rest wait at the barrier or have exited.
  ready_.clear();
  for (unsigned i = 0; i < n; ++i) ready_.push_back(i);
  waiting_.clear();
  unsigned live = n, fruitless = 0;
  while (live > 0) {
    bool progress = false;
    next_.clear();
    for (const unsigned i : ready_) {
      cuda_thread& t = *threads_[i];
      t.event.store(static_cast<int>(fiber_event::none), std::memory_order_relaxed);
      tls_thread.store(&t, std::memory_order_relaxed);
      t.f.switch_from(sched_, t.first); // the first entry of a block's thread is ordered after the launch
      t.first = false;
      tls_thread.store(nullptr, std::memory_order_relaxed);
      if (!t.f.stack_intact()) stack_overflow();
      switch (static_cast<fiber_event>(t.event.load(std::memory_order_relaxed))) {
      case fiber_event::barrier:
        waiting_.push_back(i);
        progress = true;
        break;
      case fiber_event::exited:
        --live;
        progress = true;
        break;
      case fiber_event::yielded: next_.push_back(i); break;
      case fiber_event::none: fatal("a CUDA thread left the scheduler without saying why");
      }
      if (!waiting_.empty() && waiting_.size() == live) { // the barrier completes
        next_.insert(next_.end(), waiting_.begin(), waiting_.end());
        waiting_.clear();
      }
    }
    ready_.swap(next_);
    if (progress) {
      fruitless = 0;
    } else if (++fruitless < 16) {
      std::this_thread::yield();
    } else {
      nap_ns(fruitless < 256 ? 20000 : 200000);
    }
  }
  hb_acquire(&run_.exit_token);
  for (unsigned i = 0; i < n; ++i)
    if (!threads_[i]->f.stack_zone_intact()) stack_overflow();
}

} // namespace braid::emu::detail
