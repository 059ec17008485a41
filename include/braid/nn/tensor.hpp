// braid/nn/tensor.hpp — tensors (shape, element type, memory) and the caching memory pool behind them.
//
// A tensor is a shared handle to a contiguous, row-major block of elements of one run-time type
// (float32, float64, bfloat16, float16) in one place (host memory; a tensor does not hold CUDA memory,
// and asking for device::cuda raises unsupported_error: the device code uses flat buffers instead). Copies of a tensor share memory; clone() copies it.
// Memory comes from a memory_pool that keeps freed blocks by size class and hands them out again, so a
// training loop that allocates the same shapes every step reaches a steady state with no system
// allocation; its statistics say what is in use now, the peak, and what sits cached.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <ostream>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/types.hpp"

namespace braid::nn {

enum class device { host, cuda };

// Statistics of a memory_pool, in bytes unless said otherwise.
struct pool_stats {
  std::size_t in_use = 0;        // handed out and not yet returned (rounded to the size class)
  std::size_t peak_in_use = 0;   // the largest in_use seen since construction or reset_peak()
  std::size_t cached = 0;        // returned blocks kept for reuse
  std::size_t reserved = 0;      // in_use + cached: what the pool holds from the system
  std::uint64_t requests = 0;    // allocate() calls with size > 0
  std::uint64_t hits = 0;        // requests served from the cache
  std::uint64_t system_allocs = 0; // requests that went to the system allocator
};

inline std::ostream& operator<<(std::ostream& os, const pool_stats& s) {
  auto mib = [](std::size_t b) { return double(b) / double(1 << 20); };
  os << "pool: in use " << mib(s.in_use) << " MiB, peak " << mib(s.peak_in_use) << " MiB, cached "
     << mib(s.cached) << " MiB, requests " << s.requests << " (" << s.hits << " from cache, "
     << s.system_allocs << " new)";
  return os;
}

namespace detail {
// What memory_pool and device_pool (nn/device_pool.cuh) keep alike: the statistics, and the one mutex
// that guards them with the rest of the pool's state.
class pool_accounting {
public:
  pool_stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_in_use = stats_.in_use;
  }

protected:
  // A block of size class `cls` handed out (mu_ held).
  void count_handed_out(std::size_t cls) noexcept {
    stats_.in_use += cls;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  }

  mutable std::mutex mu_;
  pool_stats stats_;
};
} // namespace detail

// A caching host allocator. Sizes are rounded up to a size class (powers of two from 256 bytes, then
// multiples of 1 MiB above 4 MiB); a freed block goes to its class's free list and serves the next
// request of that class. Blocks are 64-byte aligned. Thread-safe (one mutex). Cached blocks are
// returned to the system by release_cached() or the destructor; blocks still in use when the pool is
// destroyed are a usage error that the pool cannot report, so pools outlive their tensors (the
// default pool, memory_pool::host(), lives until exit).
class memory_pool : public detail::pool_accounting {
public:
  memory_pool() = default;
  memory_pool(const memory_pool&) = delete;
  memory_pool& operator=(const memory_pool&) = delete;
  ~memory_pool() { release_cached(); }

  static constexpr std::size_t alignment = 64;

  static std::size_t size_class(std::size_t bytes) noexcept {
    if (bytes <= 256) return 256;
    if (bytes <= (std::size_t(4) << 20)) return std::bit_ceil(bytes);
    const std::size_t mib = std::size_t(1) << 20;
    return (bytes + mib - 1) / mib * mib;
  }

  // Returns a block of at least `bytes` bytes (nullptr for 0); system_error when the system is out
  // of memory even after the cache was released.
  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    const std::size_t cls = size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests;
    auto it = free_.find(cls);
    void* p = nullptr;
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      stats_.cached -= cls;
      ++stats_.hits;
    } else {
      p = std::aligned_alloc(alignment, cls);
      if (!p) {
        release_cached_locked();
        p = std::aligned_alloc(alignment, cls);
        if (!p) raise(errc::system, "memory_pool: out of host memory for " + std::to_string(cls) + " bytes");
      }
      ++stats_.system_allocs;
      stats_.reserved += cls;
    }
    count_handed_out(cls);
    return p;
  }

  // Gives a block from allocate(p's size) back to the cache.
  void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    const std::size_t cls = size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    try {
      free_[cls].push_back(p);
    } catch (...) { // cannot cache it: give it back to the system
      std::free(p);
      stats_.in_use -= cls;
      stats_.reserved -= cls;
      return;
    }
    stats_.in_use -= cls;
    stats_.cached += cls;
  }

  // Frees every cached block.
  void release_cached() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

  // The process-wide pool that tensors use unless given another.
  static memory_pool& host() {
    static memory_pool* pool = new memory_pool(); // never destroyed: tensors may outlive main's locals
    return *pool;
  }

private:
  void release_cached_locked() noexcept {
    for (auto& [cls, list] : free_) {
      for (void* p : list) std::free(p);
      stats_.reserved -= cls * list.size();
      stats_.cached -= cls * list.size();
      list.clear();
    }
  }

  std::map<std::size_t, std::vector<void*>> free_;
};

// Up to 4 dimensions (N, C, H, W for images; N, F for features).
class shape_t {
public:
  static constexpr int max_rank = 4;
  shape_t() = default;
  shape_t(std::initializer_list<std::int64_t> dims) {
    if (dims.size() > max_rank) raise(errc::invalid_argument, "shape: more than 4 dimensions");
    for (std::int64_t d : dims) {
      if (d < 0) raise(errc::invalid_argument, "shape: negative dimension");
      d_[std::size_t(rank_++)] = d;
    }
  }
  int rank() const noexcept { return rank_; }
  std::int64_t operator[](int i) const noexcept { return d_[std::size_t(i)]; }
  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= d_[std::size_t(i)];
    return n;
  }
  bool operator==(const shape_t& o) const noexcept {
    if (rank_ != o.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (d_[std::size_t(i)] != o.d_[std::size_t(i)]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += ',';
      s += std::to_string(d_[std::size_t(i)]);
    }
    return s + "]";
  }

private:
  std::array<std::int64_t, max_rank> d_{};
  int rank_ = 0;
};

class tensor {
public:
  tensor() = default;
  // Uninitialised memory of the given shape and type, from `pool`.
  tensor(shape_t s, dtype t = dtype::float32, device dev = device::host,
         memory_pool& pool = memory_pool::host())
      : shape_(s), type_(t), dev_(dev) {
    if (t != dtype::float32 && t != dtype::float64 && t != dtype::bfloat16 && t != dtype::float16)
      raise(errc::unsupported, "tensor: element type " + std::string(braid::name(t)) +
                                   " (supported: float, double, bfloat16, half)");
    if (dev != device::host)
      raise(errc::unsupported, "tensor: CUDA tensors are not built yet (host only)");
    const std::size_t bytes = std::size_t(s.numel()) * size_of(t);
    void* p = pool.allocate(bytes);
    memory_pool* pp = &pool;
    data_ = std::shared_ptr<void>(p, [pp, bytes](void* q) { pp->deallocate(q, bytes); });
  }
  static tensor zeros(shape_t s, dtype t = dtype::float32) {
    tensor x(s, t);
    x.zero();
    return x;
  }

  const shape_t& shape() const noexcept { return shape_; }
  std::int64_t dim(int i) const noexcept { return shape_[i]; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  dtype type() const noexcept { return type_; }
  device where() const noexcept { return dev_; }
  std::size_t bytes() const noexcept { return std::size_t(numel()) * size_of(type_); }
  bool defined() const noexcept { return data_ != nullptr || (type_ != dtype::custom && numel() == 0); }

  // Typed access; invalid_argument when T is not the tensor's type.
  template <class T> T* data() const {
    if (dtype_of_v<T> != type_)
      raise(errc::invalid_argument, "tensor::data<" + std::string(braid::name(dtype_of_v<T>)) +
                                        ">() on a tensor of " + std::string(braid::name(type_)));
    return static_cast<T*>(data_.get());
  }
  void* raw() const noexcept { return data_.get(); }

  void zero() const {
    if (bytes()) std::memset(data_.get(), 0, bytes());
  }
  template <class T> void fill(T v) const {
    T* p = data<T>();
    std::fill(p, p + numel(), v);
  }
  tensor clone() const {
    tensor t(shape_, type_, dev_);
    if (bytes()) std::memcpy(t.raw(), raw(), bytes());
    return t;
  }
  // Same memory, another shape with the same number of elements.
  tensor reshape(shape_t s) const {
    if (s.numel() != numel())
      raise(errc::invalid_argument, "tensor::reshape " + shape_.str() + " -> " + s.str());
    tensor t = *this;
    t.shape_ = s;
    return t;
  }

private:
  std::shared_ptr<void> data_;
  shape_t shape_;
  dtype type_ = dtype::float32;
  device dev_ = device::host;
};

// Converting copy between floating types of equal element count (rounding to nearest even).
inline void convert(const tensor& from, const tensor& to) {
  if (from.numel() != to.numel())
    raise(errc::invalid_argument, "convert: " + from.shape().str() + " vs " + to.shape().str());
  visit(from.type(), [&](auto a) {
    using A = typename decltype(a)::type;
    visit(to.type(), [&](auto b) {
      using B = typename decltype(b)::type;
      if constexpr (std::is_floating_point_v<A> || is_low_precision_float_v<A>) {
        if constexpr (std::is_floating_point_v<B> || is_low_precision_float_v<B>) {
          const A* s = static_cast<const A*>(from.raw());
          B* d = static_cast<B*>(to.raw());
          for (std::int64_t i = 0; i < from.numel(); ++i) {
            double v;
            if constexpr (std::is_same_v<A, double>) v = s[i];
            else v = double(float(s[i]));
            d[i] = B(v);
          }
        }
      }
    });
  });
}

} // namespace braid::nn
