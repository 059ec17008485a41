// braid/emu/state.hpp — the emulated runtime's state: devices, streams, events, graphs, captures,
// peer access and the per-thread current device and last error.
//
// Streams: each stream is an in-order queue with a thread of its own that runs its operations one
// after another (kernels, copies, fills, event markers, graph launches). An operation may also wait
// for operations of other streams first (its dependencies):
// - the legacy default stream (stream 0 / cudaStreamLegacy) of a device waits for everything enqueued
//   so far on the device's blocking streams, and every blocking stream's operation waits for
//   everything enqueued so far on the legacy stream (CUDA's implicit synchronisation); streams made
//   with cudaStreamNonBlocking take part in neither;
// - cudaStreamWaitEvent makes a stream's next operations wait for the event's recorded work.
// Everything is ordered with mutexes and condition variables, so ThreadSanitizer sees stream order,
// event waits and host synchronisation as happens-before, and nothing else.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "exec.hpp"
#include "memory.hpp"
#include "types.hpp"

namespace braid::emu::detail {

struct stream_state;
using dependency = std::pair<std::shared_ptr<stream_state>, std::uint64_t>;

struct op {
  std::function<void()> run; // empty: a pure ordering point
  std::vector<dependency> deps;
};

struct capture_state;

struct stream_state : std::enable_shared_from_this<stream_state> {
  int device = 0;
  unsigned flags = 0;
  bool legacy = false;
  std::uint64_t id = 0; // cudaStreamGetId: never reused, unlike the handle (a later stream may get a destroyed one's)
  std::mutex m;
  std::condition_variable cv;
  std::deque<op> q;
  std::uint64_t enqueued = 0, completed = 0;
  bool retired = false;
  capture_state* capture = nullptr; // guarded by the runtime's mutex
  std::function<void(stream_state*)> drained; // called once a destroyed stream has run all its work

  void start() {
    std::thread([self = shared_from_this()] { self->loop(); }).detach();
  }
  // Waits until operation `seq` of this stream has completed.
  void wait_for(std::uint64_t seq) {
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return completed >= seq; });
  }
  bool done_through(std::uint64_t seq) {
    std::lock_guard<std::mutex> lk(m);
    return completed >= seq;
  }
  std::uint64_t last_enqueued() {
    std::lock_guard<std::mutex> lk(m);
    return enqueued;
  }
  std::uint64_t push(op&& o) {
    std::lock_guard<std::mutex> lk(m);
    q.push_back(std::move(o));
    cv.notify_all();
    return ++enqueued;
  }

private:
  void loop() {
    for (;;) {
      op o;
      {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return !q.empty() || retired; });
        if (q.empty()) {
          lk.unlock();
          if (drained) drained(this);
          return;
        }
        o = std::move(q.front());
        q.pop_front();
      }
      for (auto& [s, seq] : o.deps)
        if (s.get() != this) s->wait_for(seq);
      if (o.run) o.run();
      {
        std::lock_guard<std::mutex> lk(m);
        ++completed;
        cv.notify_all();
      }
    }
  }
};

struct event_record {
  std::shared_ptr<stream_state> stream;
  std::uint64_t seq = 0;
  std::atomic<std::int64_t> at_ns{-1}; // when the stream reached the record (a CPU time)
};

struct event_state {
  unsigned flags = 0;
  std::shared_ptr<event_record> rec; // guarded by the runtime's mutex
};

// A node of a captured graph: work, or an external event node (cudaEventWaitExternal /
// cudaEventRecordExternal), which refers to the event as it is when the graph is launched.
struct graph_node {
  std::function<void()> run;
  event_state* wait = nullptr;   // waits for the event's record as of the graph's launch
  event_state* record = nullptr; // records the event (complete when the graph's launch is)
};
struct graph_state {
  std::vector<graph_node> nodes; // a chain: each node after the previous one
};
struct graph_exec_state {
  std::vector<graph_node> nodes;
};

struct capture_state {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id owner;
  bool invalidated = false;
  graph_state* graph = nullptr;
};

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class runtime {
public:
  runtime() : pid_(::getpid()), shape_(machine_shape::from_env()) {
    const char* lb = std::getenv("CUDA_LAUNCH_BLOCKING");
    launch_blocking_ = lb && lb[0] == '1';
    const char* poison = std::getenv("BRAID_EMU_POISON");
    poison_ = !(poison && poison[0] == '0');
    for (int d = 0; d < shape_.devices; ++d) devices_.push_back(std::make_unique<device_exec>(d, shape_));
    peer_.assign(static_cast<std::size_t>(shape_.devices * shape_.devices), false);
    legacy_.resize(static_cast<std::size_t>(shape_.devices));
  }
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;

  // False in a child forked after the runtime started (its threads did not survive the fork).
  bool usable() const { return ::getpid() == pid_; }
  const machine_shape& shape() const { return shape_; }
  int device_count() const { return shape_.devices; }
  bool poison() const { return poison_; }
  device_exec& device(int d) { return *devices_[static_cast<std::size_t>(d)]; }
  memory_table& memory() { return mem_; }

  // ---- peer access ------------------------------------------------------------------------------
  // Peer access is recorded (for cudaErrorPeerAccessAlreadyEnabled), not enforced: a kernel's loads
  // cannot be checked (docs/architecture.md). False if it was enabled already.
  bool enable_peer(int from, int to) {
    std::lock_guard<std::mutex> lk(m_);
    auto&& e = peer_[static_cast<std::size_t>(from * shape_.devices + to)];
    if (e) return false;
    e = true;
    return true;
  }

  // ---- streams ----------------------------------------------------------------------------------
  static std::uint64_t next_stream_id() {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  std::shared_ptr<stream_state> create_stream(int device, unsigned flags) {
    auto s = std::make_shared<stream_state>();
    s->device = device;
    s->flags = flags;
    s->id = next_stream_id();
    // A destroyed stream stays listed (device synchronisation and the legacy stream still wait for
    // its work, as CUDA's do) until its thread has run everything it was given.
    s->drained = [this](stream_state* done) {
      std::lock_guard<std::mutex> lk(m_);
      for (auto it = all_streams_.begin(); it != all_streams_.end(); ++it)
        if (it->get() == done) {
          all_streams_.erase(it);
          break;
        }
    };
    s->start();
    std::lock_guard<std::mutex> lk(m_);
    streams_.insert(s.get());
    all_streams_.push_back(s);
    return s;
  }
  std::shared_ptr<stream_state> legacy(int device) {
    std::lock_guard<std::mutex> lk(m_);
    auto& l = legacy_[static_cast<std::size_t>(device)];
    if (!l) {
      l = std::make_shared<stream_state>();
      l->device = device;
      l->legacy = true;
      l->id = next_stream_id();
      l->start();
    }
    return l;
  }
  // The stream a handle names (the legacy stream of `current` for 0 / cudaStreamLegacy); null if the
  // handle is not a live stream.
  std::shared_ptr<stream_state> resolve(cudaStream_t h, int current) {
    if (h == nullptr || h == cudaStreamLegacy) return legacy(current);
    std::lock_guard<std::mutex> lk(m_);
    auto* s = reinterpret_cast<stream_state*>(h);
    if (!streams_.count(s)) return nullptr;
    return s->shared_from_this();
  }
  bool destroy_stream(cudaStream_t h) {
    std::shared_ptr<stream_state> s;
    {
      std::lock_guard<std::mutex> lk(m_);
      auto* p = reinterpret_cast<stream_state*>(h);
      if (!streams_.erase(p)) return false;
      s = p->shared_from_this();
      if (capture_state* c = s->capture) { // a capture that can never end: drop it
        captures_.erase(c);
        delete c->graph;
        delete c;
        s->capture = nullptr;
      }
    }
    std::lock_guard<std::mutex> lk(s->m);
    s->retired = true; // its thread finishes what is queued, then ends
    s->cv.notify_all();
    return true;
  }

  // The implicit dependencies of an operation enqueued now on `s` (legacy-stream semantics). Called
  // with m_ held, so that two threads enqueuing on the legacy and a blocking stream at once are
  // ordered one way or the other (the enqueue and the push happen under m_ together).
  std::vector<dependency> implicit_deps_locked(stream_state& s) {
    std::vector<dependency> d;
    if (s.legacy) {
      for (auto& x : all_streams_)
        if (x->device == s.device && !(x->flags & cudaStreamNonBlocking)) d.emplace_back(x, x->last_enqueued());
    } else if (!(s.flags & cudaStreamNonBlocking)) {
      if (auto& l = legacy_[static_cast<std::size_t>(s.device)]) d.emplace_back(l, l->last_enqueued());
    }
    return d;
  }

  // Every stream of a device (live ones and the legacy one), for cudaDeviceSynchronize.
  std::vector<std::shared_ptr<stream_state>> streams_of(int device) {
    std::lock_guard<std::mutex> lk(m_);
    std::vector<std::shared_ptr<stream_state>> v;
    for (auto& x : all_streams_)
      if (x->device == device) v.push_back(x);
    if (auto& l = legacy_[static_cast<std::size_t>(device)]) v.push_back(l);
    return v;
  }

  // Enqueues `run` on `s` after its implicit dependencies and `extra`; returns its sequence number.
  // With CUDA_LAUNCH_BLOCKING=1, returns after it ran.
  std::uint64_t enqueue(stream_state& s, std::function<void()> run, std::vector<dependency> extra = {}) {
    op o;
    o.run = std::move(run);
    for (auto& e : extra) o.deps.push_back(std::move(e));
    std::uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lk(m_);
      for (auto& d : implicit_deps_locked(s)) o.deps.push_back(std::move(d));
      seq = s.push(std::move(o));
    }
    if (launch_blocking_) s.wait_for(seq);
    return seq;
  }

  // ---- events -----------------------------------------------------------------------------------
  event_state* create_event(unsigned flags) {
    auto* e = new event_state;
    e->flags = flags;
    std::lock_guard<std::mutex> lk(m_);
    events_.insert(e);
    return e;
  }
  bool live_event(event_state* e) {
    std::lock_guard<std::mutex> lk(m_);
    return events_.count(e) != 0;
  }
  bool destroy_event(event_state* e) {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (!events_.erase(e)) return false;
    }
    delete e;
    return true;
  }
  std::shared_ptr<event_record> record_of(event_state* e) {
    std::lock_guard<std::mutex> lk(m_);
    return e->rec;
  }
  void set_record(event_state* e, std::shared_ptr<event_record> r) {
    std::lock_guard<std::mutex> lk(m_);
    e->rec = std::move(r);
  }

  // ---- capture and graphs -------------------------------------------------------------------------
  std::mutex& lock() { return m_; }
  // Captures that forbid a legacy-stream or synchronising call by the calling thread now: any
  // global-mode capture, and thread-local captures of this thread. Invalidates them; true if any.
  bool prohibits_sync_here() {
    std::lock_guard<std::mutex> lk(m_);
    bool any = false;
    for (capture_state* c : captures_)
      if (c->mode == cudaStreamCaptureModeGlobal ||
          (c->mode == cudaStreamCaptureModeThreadLocal && c->owner == std::this_thread::get_id())) {
        c->invalidated = true;
        any = true;
      }
    return any;
  }
  std::set<capture_state*>& captures() { return captures_; } // under lock()
  std::set<graph_state*>& graphs() { return graphs_; }        // under lock()
  std::set<graph_exec_state*>& graph_execs() { return execs_; } // under lock()

private:
  int pid_;
  machine_shape shape_;
  bool launch_blocking_ = false, poison_ = true;
  std::vector<std::unique_ptr<device_exec>> devices_;
  memory_table mem_;
  std::mutex m_;
  std::vector<bool> peer_;
  std::vector<std::shared_ptr<stream_state>> legacy_;
  std::set<stream_state*> streams_;
  std::vector<std::shared_ptr<stream_state>> all_streams_;
  std::set<event_state*> events_;
  std::set<capture_state*> captures_;
  std::set<graph_state*> graphs_;
  std::set<graph_exec_state*> execs_;
};

// The process's runtime, made at first use and never destroyed (its threads may outlive main).
inline runtime& rt() {
  static runtime* r = new runtime;
  return *r;
}

// Per host thread, as in CUDA.
inline thread_local int tls_device = 0;
inline thread_local cudaError_t tls_last_error = cudaSuccess;

inline cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) tls_last_error = e;
  return e;
}

} // namespace braid::emu::detail
