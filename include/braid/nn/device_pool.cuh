// braid/nn/device_pool.cuh — a caching allocator of CUDA device memory with stream-ordered frees, for
// one device: the device-side counterpart of memory_pool (nn/tensor.hpp), with the same size classes
// and the same statistics (pool_stats). Needs nvcc or the emulated device (CMake: braid::emu), not a
// CBLAS.
//
// Semantics (those of PyTorch's CUDA caching allocator, without its block splitting):
// - A block belongs to the stream it was allocated on. deallocate() returns it at once to that
//   stream's free list and no host wait happens: the next allocate() on the same stream may hand it
//   out again before the device has finished with it, which is safe because that stream runs the new
//   owner's work after the old owner's.
// - record_stream(p, s) says that work on stream s (another stream) also uses the block. At the free,
//   an event is recorded on each such stream, and the block is handed out again — to any stream,
//   its own included — only after every one of those events has completed (cudaEventQuery, asked at
//   the next allocate(); never a host-blocking wait on the allocation path).
// - At every free an event is also recorded on the block's own stream. A block free on stream A
//   serves a request on stream B (when B's own free list has none of its size) only once that event
//   has completed, that is, when A has finished every use of it; the block then belongs to B. So a
//   free costs one cudaEventRecord (plus one per recorded stream; events are pooled, not created
//   each time), and a request that misses on its own stream queries the free events of that size
//   class's blocks on other streams until one has completed.
// - Sizes are rounded up to memory_pool's size classes (powers of two from 256 bytes to 4 MiB, then
//   whole MiB); each block is one cudaMalloc, so blocks are at least 256-byte aligned. A request is
//   served only by a block of its own class (no splitting or merging: at most half of a small block
//   and 1 MiB of a large one is slack).
// - stats(): in_use (handed out, rounded to the class), peak_in_use, cached (free blocks held, with
//   or without pending events), reserved (in_use + cached: what the pool holds from cudaMalloc),
//   requests, hits (served from the cache), system_allocs (cudaMalloc calls). reset_peak().
// - release_cached() waits for the pending events of the cached blocks (the only host wait), then
//   cudaFree's them (cudaFree itself waits for the device on CUDA) and destroys the pool's idle events.
// - When cudaMalloc fails for lack of memory, the pool releases its cache and tries once more; if that
//   fails too it raises cuda_error (code() == errc::cuda, sys_errno() == cudaErrorMemoryAllocation)
//   naming the bytes asked, the class and the pool's statistics. Other CUDA failures raise cuda_error.
// - deallocate() or record_stream() of a pointer this pool did not hand out, or of a block already
//   freed, raises invalid_argument and changes nothing.
// - Thread-safe: one mutex, held across the CUDA calls the pool makes (a cudaMalloc or release_cached
//   blocks the other threads' allocate/deallocate meanwhile).
// - Not for streams being captured into a CUDA graph: cudaMalloc is refused during a capture, and an
//   event recorded on a capturing stream is a graph node, not a point the pool can query (PyTorch gives
//   captures private pools; braid has none).
// - Streams passed in must be streams of the pool's device, and must outlive the blocks allocated on
//   them (cached ones included: release_cached() before destroying a stream, as a new stream may get
//   the old one's handle and inherit its free list without being ordered after its work).
// - Destruction frees every cached block (after its pending events) and the pool's events. Blocks still
//   in use are left allocated, not freed: work on the device may still use them, and a cudaFree under
//   it would be a use after free; their memory is lost until the process ends. Deallocating such a
//   block afterwards is a use of a destroyed object, as with any allocator; pools outlive their blocks.
//   The destructor never throws and ignores CUDA errors (at process exit the runtime may be gone).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../cuda/check.cuh"
#include "../cuda/runtime.cuh"
#include "tensor.hpp"

namespace braid::nn {

class device_pool : public detail::pool_accounting {
public:
  // A pool for device `device` (an ordinal; invalid_argument if there is no such device). Allocates
  // nothing until asked.
  explicit device_pool(int device) : device_(device) {
    int n = 0;
    BRAID_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (device < 0 || device >= n)
      raise(errc::invalid_argument, "device_pool: device " + std::to_string(device) + " (there are " +
                                        std::to_string(n) + " devices)");
  }
  device_pool(const device_pool&) = delete;
  device_pool& operator=(const device_pool&) = delete;
  ~device_pool() {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      (void)release_cached_locked();
    } catch (...) { // a device_guard that cannot set the device: the memory stays with the runtime
    }
  }

  static constexpr std::size_t alignment = 256; // cudaMalloc's guarantee

  // memory_pool's size classes; a request too large to round stays as it is (cudaMalloc refuses it).
  static std::size_t size_class(std::size_t bytes) noexcept {
    const std::size_t mib = std::size_t(1) << 20;
    if (bytes > ~std::size_t(0) - mib) return bytes;
    return memory_pool::size_class(bytes);
  }

  int device() const noexcept { return device_; }

  // A block of at least `bytes` bytes (nullptr for 0) for work on `stream`, from the cache when a
  // block of its class is free there (see the header comment), else from cudaMalloc.
  void* allocate(std::size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return nullptr;
    const std::size_t cls = size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests;
    settle_pending_locked();
    block* b = take_cached_locked(cls, stream);
    if (b) {
      ++stats_.hits;
      stats_.cached -= cls;
    } else {
      b = new_block_locked(bytes, cls, stream);
    }
    b->in_use = true;
    count_handed_out(cls);
    return b->ptr;
  }

  // Frees `p` (no-op for nullptr), ordered on `stream`: normally the stream it was allocated on; any
  // other stream counts as record_stream(p, stream) first. Raises invalid_argument for a pointer the
  // pool did not hand out or a block already free, cuda_error if an event cannot be recorded (the
  // block then stays in use).
  void deallocate(void* p, cudaStream_t stream) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    block& b = in_use_block_locked(p, "deallocate");
    add_use(b, stream);
    // Every event first, so that a failure leaves the block as it was (in use).
    std::vector<cudaEvent_t> evs;
    evs.reserve(b.uses.size() + 1);
    try {
      for (cudaStream_t s : b.uses) evs.push_back(record_locked(s));
      evs.push_back(record_locked(b.stream));
    } catch (...) {
      idle_events_.insert(idle_events_.end(), evs.begin(), evs.end());
      throw;
    }
    const std::size_t cls = b.size;
    try { // the list first, so that running out of host memory here also leaves the block in use
      if (evs.size() == 1) free_[key(cls, b.stream)].push_back(&b);
      else pending_.push_back(&b);
    } catch (...) {
      idle_events_.insert(idle_events_.end(), evs.begin(), evs.end());
      throw;
    }
    b.freed = evs.back();
    evs.pop_back();
    b.waits = std::move(evs);
    b.uses.clear();
    b.in_use = false;
    stats_.in_use -= cls;
    stats_.cached += cls;
  }

  // Says that work on `stream` uses the block at `p` (allocated on another stream): its free waits
  // for that work. invalid_argument for a pointer that is not a block in use.
  void record_stream(void* p, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    add_use(in_use_block_locked(p, "record_stream"), stream);
  }

  // Waits for the cached blocks' pending events, cudaFree's the blocks and destroys the idle events.
  // Blocks in use are untouched. Raises cuda_error for the first CUDA call that failed (after trying
  // the rest).
  void release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    const failure f = release_cached_locked();
    if (f.e != cudaSuccess) {
      (void)cudaGetLastError();
      raise(errc::cuda, std::string(cudaGetErrorName(f.e)) + ": " + cudaGetErrorString(f.e), {}, f.call,
            __FILE__, __LINE__, static_cast<int>(f.e));
    }
  }

private:
  struct block {
    void* ptr = nullptr;
    std::size_t size = 0;                // the size class: what cudaMalloc gave
    cudaStream_t stream = nullptr;       // the stream it belongs to
    bool in_use = false;
    std::vector<cudaStream_t> uses;      // in use: other streams that use it (record_stream)
    std::vector<cudaEvent_t> waits;      // free: events on those streams not yet seen complete
    cudaEvent_t freed = nullptr;         // free: recorded on `stream` at the free; null once complete
  };
  struct failure {
    cudaError_t e = cudaSuccess;
    const char* call = nullptr;
  };
  // Work on `s` uses block `b` too (no-op for its own stream or one already recorded).
  static void add_use(block& b, cudaStream_t s) {
    if (s != b.stream && std::find(b.uses.begin(), b.uses.end(), s) == b.uses.end()) b.uses.push_back(s);
  }
  using list_key = std::pair<std::size_t, std::uintptr_t>; // (class, stream)
  static list_key key(std::size_t cls, cudaStream_t s) noexcept { return {cls, reinterpret_cast<std::uintptr_t>(s)}; }

  // True if `e` has completed; cuda_error if the query fails.
  static bool done(cudaEvent_t e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError(); // "not ready" is an answer, not an error to leave for the next call
      return false;
    }
    cuda::detail::raise_cuda(r, "cudaEventQuery", __FILE__, __LINE__);
  }

  block& in_use_block_locked(void* p, const char* what) {
    auto it = blocks_.find(p);
    if (it == blocks_.end())
      raise(errc::invalid_argument, std::string("device_pool::") + what + ": " + hex(p) +
                                        " was not allocated by this pool (device " + std::to_string(device_) + ")");
    if (!it->second.in_use)
      raise(errc::invalid_argument, std::string("device_pool::") + what + ": " + hex(p) +
                                        " is already free (freed twice?)");
    return it->second;
  }

  static std::string hex(const void* p) {
    char s[32];
    std::snprintf(s, sizeof s, "%p", p);
    return s;
  }

  // An idle event recorded on `s`.
  cudaEvent_t record_locked(cudaStream_t s) {
    cudaEvent_t e = nullptr;
    if (!idle_events_.empty()) {
      e = idle_events_.back();
      idle_events_.pop_back();
    } else {
      cuda::detail::device_guard g(device_);
      BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    if (const cudaError_t r = cudaEventRecord(e, s); r != cudaSuccess) {
      idle_events_.push_back(e);
      cuda::detail::raise_cuda(r, "cudaEventRecord", __FILE__, __LINE__);
    }
    return e;
  }

  void drop_events(block& b) {
    idle_events_.insert(idle_events_.end(), b.waits.begin(), b.waits.end());
    b.waits.clear();
    if (b.freed) idle_events_.push_back(b.freed);
    b.freed = nullptr;
  }

  // Moves the freed blocks whose other streams' events have all completed to their free lists.
  void settle_pending_locked() {
    for (std::size_t i = 0; i < pending_.size();) {
      block& b = *pending_[i];
      for (std::size_t j = 0; j < b.waits.size();) {
        if (done(b.waits[j])) {
          idle_events_.push_back(b.waits[j]);
          b.waits[j] = b.waits.back();
          b.waits.pop_back();
        } else {
          ++j;
        }
      }
      if (b.waits.empty()) {
        free_[key(b.size, b.stream)].push_back(&b);
        pending_[i] = pending_.back();
        pending_.pop_back();
      } else {
        ++i;
      }
    }
  }

  // A free block of class `cls` for `stream`: its own stream's first, else one of another stream
  // whose free event has completed (it then belongs to `stream`). Null if none.
  block* take_cached_locked(std::size_t cls, cudaStream_t stream) {
    if (auto it = free_.find(key(cls, stream)); it != free_.end() && !it->second.empty()) {
      block* b = it->second.back();
      it->second.pop_back();
      drop_events(*b);
      return b;
    }
    for (auto it = free_.lower_bound(list_key{cls, 0}); it != free_.end() && it->first.first == cls; ++it) {
      auto& list = it->second;
      for (std::size_t i = list.size(); i-- > 0;) {
        block* b = list[i];
        if (b->freed && !done(b->freed)) continue;
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
        drop_events(*b);
        b->stream = stream;
        return b;
      }
    }
    return nullptr;
  }

  block* new_block_locked(std::size_t bytes, std::size_t cls, cudaStream_t stream) {
    cuda::detail::device_guard g(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      (void)release_cached_locked(); // a failure here leaves less to free; the retry says the rest
      e = cudaMalloc(&p, cls);
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        std::ostringstream os;
        os << "device_pool: out of memory on device " << device_ << ": " << bytes << " bytes asked (class " << cls
           << " bytes), after releasing the cache; " << stats_ << ", reserved " << stats_.reserved << " bytes";
        raise(errc::cuda, os.str(), {}, "cudaMalloc", __FILE__, __LINE__, static_cast<int>(e));
      }
    }
    if (e != cudaSuccess) cuda::detail::raise_cuda(e, "cudaMalloc", __FILE__, __LINE__);
    block* b = nullptr;
    try {
      b = &blocks_[p];
    } catch (...) {
      (void)cudaFree(p);
      throw;
    }
    b->ptr = p;
    b->size = cls;
    b->stream = stream;
    ++stats_.system_allocs;
    stats_.reserved += cls;
    return b;
  }

  failure release_cached_locked() {
    failure f;
    auto note = [&f](cudaError_t e, const char* call) {
      if (e != cudaSuccess && f.e == cudaSuccess) f = failure{e, call};
    };
    cuda::detail::device_guard g(device_);
    auto release = [&](block* b) {
      for (cudaEvent_t e : b->waits) note(cudaEventSynchronize(e), "cudaEventSynchronize");
      if (b->freed) note(cudaEventSynchronize(b->freed), "cudaEventSynchronize");
      drop_events(*b);
      note(cudaFree(b->ptr), "cudaFree");
      stats_.cached -= b->size;
      stats_.reserved -= b->size;
      blocks_.erase(b->ptr);
    };
    for (block* b : pending_) release(b);
    pending_.clear();
    for (auto& [k, list] : free_)
      for (block* b : list) release(b);
    free_.clear();
    for (cudaEvent_t e : idle_events_) note(cudaEventDestroy(e), "cudaEventDestroy");
    idle_events_.clear();
    return f;
  }

  int device_;
  std::unordered_map<void*, block> blocks_;          // every block the pool holds, in use or free
  std::map<list_key, std::vector<block*>> free_;     // free blocks ready for their stream
  std::vector<block*> pending_;                      // free blocks waiting for other streams' events
  std::vector<cudaEvent_t> idle_events_;             // recorded on nothing the pool waits for
};

// n elements of T from a device_pool, given back in stream order on `stream` when the owner goes
// (on an error path too). Move-only; the pool and the stream must outlive it.
template <class T> class pool_buffer {
public:
  pool_buffer() = default;
  pool_buffer(device_pool& pool, std::int64_t n, cudaStream_t stream)
      : pool_(&pool), stream_(stream), p_(static_cast<T*>(pool.allocate(std::size_t(n) * sizeof(T), stream))) {}
  pool_buffer(pool_buffer&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)), stream_(o.stream_), p_(std::exchange(o.p_, nullptr)) {}
  pool_buffer& operator=(pool_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::exchange(o.pool_, nullptr);
      stream_ = o.stream_;
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~pool_buffer() { reset(); }
  T* get() const noexcept { return p_; }
  void reset() noexcept {
    if (p_) {
      try {
        pool_->deallocate(p_, stream_);
      } catch (...) { // an event that cannot be recorded: the block stays in use (the pool's rule)
      }
    }
    p_ = nullptr;
  }

private:
  device_pool* pool_ = nullptr;
  cudaStream_t stream_ = nullptr;
  T* p_ = nullptr;
};

} // namespace braid::nn
