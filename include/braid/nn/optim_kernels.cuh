// braid/nn/optim_kernels.cuh — the kernels of the fused optimizers (nn/optim_device.cuh): step
// state, the per-element rules of rules.hpp over flat buffers, LAMB's trust ratios, clipping, loss
// scaling and rounding, and the small device arrays they take.
#pragma once

#include <cstddef>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../cuda/check.cuh"
#include "../cuda/device/kernel.cuh"
#include "rules.hpp"

namespace braid::nn::fused {

template <class T> struct flat_params {
  T* value = nullptr;                 // n parameters, device memory
  T* grad = nullptr;                  // their n gradients, device memory
  std::int64_t n = 0;
  std::vector<std::int64_t> segments; // first element of each parameter tensor: 0, ascending, each < n
};

namespace detail {

constexpr unsigned threads = 256;          // per block, every kernel here
constexpr std::int64_t chunk = 8192;        // elements per block in the reducing kernels
constexpr unsigned max_blocks = 1024;       // elementwise kernels: grid-stride beyond this

// The step record of an optimizer, in device memory.
struct step_state {
  std::int64_t t = 0;    // steps applied
  double c1 = 1, c2 = 1; // 1 - beta1^t, 1 - beta2^t (Adam, LAMB)
  std::int32_t skip = 0; // this step is skipped (the loss scaler's last update saw an overflow)
};

inline unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + threads - 1) / threads;
  return b < 1 ? 1u : b > max_blocks ? max_blocks : unsigned(b);
}
BRAID_DEVICE std::int64_t first_index() { return std::int64_t(cuda::device::block_index()) * threads + cuda::device::thread_index(); }
BRAID_DEVICE std::int64_t stride() { return std::int64_t(cuda::device::grid_size()) * threads; }

// The kernels that need no type parameter are templates all the same (template <int = 0>): a
// template has vague linkage, so this header can be included by several translation units of one
// program (a plain kernel defined here would be defined twice at link time, host stub or emulated).

// Counts a step unless the scaler's last update skipped it, and computes the bias corrections.
template <int = 0> BRAID_KERNEL_BOUNDED(1) void begin_step(step_state* s, const rules::scaler_state* scaler, double beta1, double beta2) {
  s->skip = (scaler != nullptr && scaler->applied == 0) ? 1 : 0;
  if (s->skip) return;
  ++s->t;
  s->c1 = 1 - ::pow(beta1, double(s->t));
  s->c2 = 1 - ::pow(beta2, double(s->t));
}

template <class T>
BRAID_KERNEL_BOUNDED(threads) void sgd_kernel(T* w, const T* g, T* buf, std::int64_t n, rules::sgd_args a, const step_state* s) {
  if (s->skip) return;
  a.first = s->t == 1;
  for (std::int64_t j = first_index(); j < n; j += stride()) {
    T b = buf[j];
    rules::sgd(w[j], g[j], b, a);
    if (a.momentum != 0) buf[j] = b;
  }
}

template <class T>
BRAID_KERNEL_BOUNDED(threads) void adam_kernel(T* w, const T* g, T* m, T* v, std::int64_t n, rules::adam_args a, const step_state* s) {
  if (s->skip) return;
  a.c1 = s->c1;
  a.c2 = s->c2;
  for (std::int64_t j = first_index(); j < n; j += stride()) rules::adam(w[j], g[j], m[j], v[j], a);
}

// Sums two values over the block in a fixed tree order; the result is valid in thread 0.
BRAID_DEVICE void block_sum2(double& x, double& y) {
  BRAID_SHARED double sx[threads];
  BRAID_SHARED double sy[threads];
  const unsigned t = cuda::device::thread_index();
  sx[t] = x;
  sy[t] = y;
  cuda::device::sync_block();
  for (unsigned h = threads / 2; h > 0; h /= 2) {
    if (t < h) {
      sx[t] += sx[t + h];
      sy[t] += sy[t + h];
    }
    cuda::device::sync_block();
  }
  x = sx[0];
  y = sy[0];
}

// LAMB, pass 1: per chunk (one block each; chunks never straddle two tensors), the sums of w^2 and r^2.
template <class T>
BRAID_KERNEL_BOUNDED(threads) void lamb_sums(const T* w, const T* g, const T* m, const T* v, const std::int64_t* chunk_begin,
                                             double* partial, rules::lamb_args a, const step_state* s) {
  if (s->skip) return;
  a.c1 = s->c1;
  a.c2 = s->c2;
  const unsigned c = cuda::device::block_index();
  double ws = 0, rs = 0;
  for (std::int64_t j = chunk_begin[c] + cuda::device::thread_index(); j < chunk_begin[c + 1]; j += threads) {
    const rules::lamb_step st = rules::lamb(w[j], g[j], m[j], v[j], a);
    ws += double(w[j]) * double(w[j]);
    rs += st.r * st.r;
  }
  block_sum2(ws, rs);
  if (cuda::device::thread_index() == 0) {
    partial[2 * c] = ws;
    partial[2 * c + 1] = rs;
  }
}

// LAMB, pass 2: one thread per tensor adds its chunks' sums in chunk order and computes the trust ratio.
template <int = 0> BRAID_KERNEL_BOUNDED(threads) void lamb_trust_kernel(const double* partial, const std::int64_t* first_chunk, std::int64_t tensors,
                                                     double* trust, const step_state* s) {
  if (s->skip) return;
  for (std::int64_t i = first_index(); i < tensors; i += stride()) {
    double ws = 0, rs = 0;
    for (std::int64_t c = first_chunk[i]; c < first_chunk[i + 1]; ++c) {
      ws += partial[2 * c];
      rs += partial[2 * c + 1];
    }
    trust[i] = rules::lamb_trust(ws, rs);
  }
}

// LAMB, pass 3: the moments again from the same inputs (the same bits as pass 1), stored, and the update.
template <class T>
BRAID_KERNEL_BOUNDED(threads) void lamb_apply(T* w, const T* g, T* m, T* v, const std::int64_t* chunk_begin,
                                              const std::int64_t* chunk_tensor, const double* trust, double lr,
                                              rules::lamb_args a, const step_state* s) {
  if (s->skip) return;
  a.c1 = s->c1;
  a.c2 = s->c2;
  const unsigned c = cuda::device::block_index();
  const double f = lr * trust[chunk_tensor[c]];
  for (std::int64_t j = chunk_begin[c] + cuda::device::thread_index(); j < chunk_begin[c + 1]; j += threads) {
    const rules::lamb_step st = rules::lamb(w[j], g[j], m[j], v[j], a);
    m[j] = T(st.m);
    v[j] = T(st.v);
    w[j] = T(double(w[j]) - f * st.r);
  }
}

// Clipping, pass 1: per chunk of the whole buffer, the sum of g^2.
template <class T>
BRAID_KERNEL_BOUNDED(threads) void square_sums(const T* g, std::int64_t n, double* partial) {
  const std::int64_t begin = std::int64_t(cuda::device::block_index()) * chunk;
  const std::int64_t end = begin + chunk < n ? begin + chunk : n;
  double x = 0, unused = 0;
  for (std::int64_t j = begin + cuda::device::thread_index(); j < end; j += threads) x += double(g[j]) * double(g[j]);
  block_sum2(x, unused);
  if (cuda::device::thread_index() == 0) partial[cuda::device::block_index()] = x;
}
// Clipping, pass 2: the norm (chunk sums in order) and the factor: max_norm / (norm + 1e-6) when the
// norm exceeds max_norm, else 1 (torch.nn.utils.clip_grad_norm_'s rule, as nn::clip_grad_norm).
template <int = 0> BRAID_KERNEL_BOUNDED(1) void clip_factor(const double* partial, std::int64_t chunks, double max_norm, double* out) {
  double s = 0;
  for (std::int64_t c = 0; c < chunks; ++c) s += partial[c];
  const double norm = rules::root(s);
  out[0] = norm;
  out[1] = norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}
template <class T> BRAID_KERNEL_BOUNDED(threads) void clip_apply(T* g, std::int64_t n, const double* factor) {
  const double f = factor[1];
  if (f == 1.0) return;
  for (std::int64_t j = first_index(); j < n; j += stride()) g[j] = T(double(g[j]) * f);
}

template <int = 0> BRAID_KERNEL_BOUNDED(threads) void unscale_kernel(float* g, std::int64_t n, bool bf16, rules::scaler_state* s) {
  const float inv = float(1.0 / s->scale);
  bool bad = false;
  for (std::int64_t j = first_index(); j < n; j += stride())
    if (!rules::unscale(g[j], bf16, inv)) bad = true;
  if (bad) cuda::device::atomic_ref<std::int32_t, cuda::device::scope::device>(s->overflow).store(1, cuda::device::memory_order::relaxed);
}
template <int = 0> BRAID_KERNEL_BOUNDED(1) void scaler_update_kernel(rules::scaler_state* s, int interval, double growth, double backoff) {
  rules::scaler_update(*s, s->overflow != 0, interval, growth, backoff);
  s->overflow = 0;
}
template <int = 0> BRAID_KERNEL_BOUNDED(threads) void round_kernel(const float* from, float* to, std::int64_t n, bool bf16) {
  for (std::int64_t j = first_index(); j < n; j += stride()) to[j] = rules::round_to(from[j], bf16);
}

inline void launched(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda::detail::raise_cuda(e, what, __FILE__, __LINE__);
}

// A device allocation owned by one object (cudaMalloc; freed by the destructor, errors ignored there).
template <class E> class device_array {
public:
  device_array() = default;
  explicit device_array(std::size_t count) : n_(count) {
    if (count > 0) BRAID_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), count * sizeof(E)));
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  device_array(device_array&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  device_array& operator=(device_array&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~device_array() {
    if (p_) (void)cudaFree(p_);
  }
  E* get() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

private:
  E* p_ = nullptr;
  std::size_t n_ = 0;
};

template <class E> device_array<E> upload(const std::vector<E>& v, cudaStream_t stream) {
  device_array<E> d(v.size());
  if (!v.empty()) {
    BRAID_CUDA_CHECK(cudaMemcpyAsync(d.get(), v.data(), v.size() * sizeof(E), cudaMemcpyHostToDevice, stream));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream)); // the host vector may go: once, at construction
  }
  return d;
}

} // namespace detail

} // namespace braid::nn::fused
