// braid/nn/optim_device.cuh — fused optimizers (SGD with momentum/Nesterov/weight decay, Adam, AdamW,
// LAMB), clipping by global norm and dynamic loss scaling on a CUDA device, over flat parameter
// buffers. Namespace braid::nn::fused.
//
// A flat_params<T> names n parameters and their n gradients, each in one device allocation, with the
// parameter tensors back to back; `segments` lists where each tensor starts (LAMB's trust ratio is per
// tensor). T is float or double: the master weights (mixed precision keeps them in float).
//
// Everything is enqueued on the optimizer's stream and nothing waits for the device on the host: step()
// launches its kernels and returns. The step count and Adam's bias corrections live in device memory,
// so that a step the loss scaler skips (an overflow seen by a kernel, unknown to the host) leaves them
// as they were, as the host optimizer does when mixed_precision::step does not call it. Reading them
// back (steps(), loss_scaler::scale()) synchronises the stream.
//
// The arithmetic per element is rules.hpp's, the same text as the host optimizers in optim.hpp. On the
// emulated device (same compiler, no fused multiply-add) SGD, Adam, AdamW, unscaling and rounding give
// the host optimizers' bits exactly; LAMB's and clipping's sums of squares are added in another order
// (per block, then per block in order), so their norms may differ from the host's in the last bits. On a
// GPU nvcc may contract multiply-adds (rules.hpp). Every reduction has a fixed order for a given n and
// segmentation, so every rank that runs the same step gets the same bits.
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

#include "optim_kernels.cuh"

namespace braid::nn::fused {

// Dynamic loss scaling on the device (the rule of nn::loss_scaler, rules::scaler_update): the scale,
// the clean-step count and the overflow flag stay in device memory, so a training step needs no host
// synchronisation. Per step: unscale() each gradient buffer (rounds to the compute type, checks, divides
// by the scale; an inf or NaN sets the overflow flag), then update() (one thread: halve and skip, or
// count and maybe grow), then give this scaler to the optimizer's step(), which is skipped when the
// update saw an overflow. scale(), clean_steps() and skipped() read back and synchronise the stream.
class loss_scaler {
public:
  explicit loss_scaler(cudaStream_t stream, double init = 65536.0, int interval = 2000, double growth = 2.0,
                       double backoff = 0.5)
      : stream_(stream), interval_(interval), growth_(growth), backoff_(backoff), state_(1) {
    if (!(init > 0) || interval < 1 || !(growth >= 1) || !(backoff > 0 && backoff <= 1))
      raise(errc::invalid_argument, "fused::loss_scaler: needs init > 0, interval >= 1, growth >= 1, 0 < backoff <= 1");
    rules::scaler_state s;
    s.scale = init;
    BRAID_CUDA_CHECK(cudaMemcpyAsync(state_.get(), &s, sizeof s, cudaMemcpyHostToDevice, stream_));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // Rounds n float gradients to the compute type (bfloat16 when bf16, else half), checks them, and
  // divides them by the current scale. Enqueued on the scaler's stream.
  void unscale(float* grad, std::int64_t n, bool bf16) {
    if (n < 0 || (n > 0 && grad == nullptr)) raise(errc::invalid_argument, "fused::loss_scaler::unscale: n < 0, or a null buffer");
    if (n == 0) return;
    detail::launched(cuda::device::launch(detail::unscale_kernel<>, detail::blocks_for(n), detail::threads, 0, stream_, grad, n, bf16, state_.get()),
                     "fused::loss_scaler::unscale");
  }
  // Records this step's outcome (after every unscale of the step).
  void update() {
    detail::launched(cuda::device::launch(detail::scaler_update_kernel<>, 1, 1, 0, stream_, state_.get(), interval_, growth_, backoff_),
                     "fused::loss_scaler::update");
  }
  rules::scaler_state read() const {
    rules::scaler_state s;
    BRAID_CUDA_CHECK(cudaMemcpyAsync(&s, state_.get(), sizeof s, cudaMemcpyDeviceToHost, stream_));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return s;
  }
  double scale() const { return read().scale; }
  // A checkpoint's scaler: the scale, the clean steps since the last change, the steps skipped so far
  // (nn::loss_scaler::set_state's). Synchronises the stream.
  void set_state(double scale, int clean, std::uint64_t skipped) {
    if (!(scale > 0) || clean < 0) raise(errc::invalid_argument, "fused::loss_scaler::set_state: needs scale > 0 and clean >= 0");
    rules::scaler_state s;
    s.scale = scale;
    s.clean = clean;
    s.skipped = skipped;
    BRAID_CUDA_CHECK(cudaMemcpyAsync(state_.get(), &s, sizeof s, cudaMemcpyHostToDevice, stream_));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  int clean_steps() const { return read().clean; }
  std::uint64_t skipped() const { return read().skipped; }
  // Whether the last update let the step through.
  bool applied() const { return read().applied != 0; }
  const rules::scaler_state* device_state() const noexcept { return state_.get(); }
  cudaStream_t stream() const noexcept { return stream_; }

private:
  cudaStream_t stream_;
  int interval_;
  double growth_, backoff_;
  detail::device_array<rules::scaler_state> state_;
};

// Rounds n fp32 master weights into the model's copy (to the compute type, stored as float), as
// mixed_precision::round_into_model does. Enqueued on `stream`.
inline void round_into(const float* master, float* model, std::int64_t n, bool bf16, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (master == nullptr || model == nullptr)))
    raise(errc::invalid_argument, "fused::round_into: n < 0, or a null buffer");
  if (n == 0) return;
  detail::launched(cuda::device::launch(detail::round_kernel<>, detail::blocks_for(n), detail::threads, 0, stream, master, model, n, bf16),
                   "fused::round_into");
}

// An optimizer over one flat buffer: it owns the state (moments) in device memory, zeroed, and the
// step record. Not copyable; the buffers it was given must outlive it.
template <class T> class optimizer {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "fused optimizers: float or double master weights");

public:
  optimizer(const optimizer&) = delete;
  optimizer& operator=(const optimizer&) = delete;
  virtual ~optimizer() = default;

  // One update at learning rate lr, enqueued on the stream; skipped on the device when `scaler` is
  // given and its last update() saw an overflow (the step count then stays).
  void step(double lr, const loss_scaler* scaler = nullptr) {
    if (p_.n == 0) return;
    detail::launched(cuda::device::launch(detail::begin_step<>, 1, 1, 0, stream_, record_.get(),
                                 scaler ? scaler->device_state() : nullptr, beta1_, beta2_),
                     "fused optimizer: begin_step");
    update(lr);
  }
  virtual std::string name() const = 0;
  // The steps applied so far (reads back: synchronises the stream).
  std::int64_t steps() const {
    detail::step_state s;
    BRAID_CUDA_CHECK(cudaMemcpyAsync(&s, record_.get(), sizeof s, cudaMemcpyDeviceToHost, stream_));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return s.t;
  }
  // Sets the steps applied so far (a run resumed from a checkpoint: state(k) restored beside it); the
  // next step() counts from there. Synchronises the stream.
  void set_steps(std::int64_t t) {
    if (t < 0) raise(errc::invalid_argument, "fused optimizer: set_steps(" + std::to_string(t) + ")");
    detail::step_state s;
    s.t = t;
    s.c1 = 1 - std::pow(beta1_, double(t));
    s.c2 = 1 - std::pow(beta2_, double(t));
    BRAID_CUDA_CHECK(cudaMemcpyAsync(record_.get(), &s, sizeof s, cudaMemcpyHostToDevice, stream_));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // State buffer k (n elements each; momentum, or Adam's m and v), for checkpoints.
  T* state(std::size_t k) const {
    if (k >= state_.size()) raise(errc::invalid_argument, "fused optimizer: no state buffer " + std::to_string(k));
    return state_[k].get();
  }
  std::size_t state_count() const noexcept { return state_.size(); }
  const flat_params<T>& params() const noexcept { return p_; }
  cudaStream_t stream() const noexcept { return stream_; }

protected:
  optimizer(flat_params<T> p, int states, cudaStream_t stream, double beta1, double beta2)
      : p_(std::move(p)), stream_(stream), beta1_(beta1), beta2_(beta2), record_(1) {
    check(p_);
    for (int k = 0; k < states; ++k) {
      state_.emplace_back(std::size_t(p_.n));
      if (p_.n > 0) BRAID_CUDA_CHECK(cudaMemsetAsync(state_.back().get(), 0, std::size_t(p_.n) * sizeof(T), stream_));
    }
    const detail::step_state s;
    BRAID_CUDA_CHECK(cudaMemcpyAsync(record_.get(), &s, sizeof s, cudaMemcpyHostToDevice, stream_));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  virtual void update(double lr) = 0;

  static void check(const flat_params<T>& p) {
    if (p.n < 0) raise(errc::invalid_argument, "fused optimizer: n < 0");
    if (p.n > 0 && (p.value == nullptr || p.grad == nullptr)) raise(errc::invalid_argument, "fused optimizer: null value or grad buffer");
    if (p.n > 0 && (p.segments.empty() || p.segments.front() != 0))
      raise(errc::invalid_argument, "fused optimizer: segments must start with 0 (the first tensor)");
    for (std::size_t i = 0; i < p.segments.size(); ++i)
      if (p.segments[i] >= p.n || (i > 0 && p.segments[i] <= p.segments[i - 1]))
        raise(errc::invalid_argument, "fused optimizer: segment " + std::to_string(i) + " starts at " +
                                          std::to_string(p.segments[i]) + ": segments must ascend and lie below n = " +
                                          std::to_string(p.n));
  }

  flat_params<T> p_;
  cudaStream_t stream_;
  double beta1_, beta2_;
  std::vector<detail::device_array<T>> state_;
  detail::device_array<detail::step_state> record_;
};

// SGD (rules::sgd; nn::sgd's options and checks).
template <class T> class sgd : public optimizer<T> {
public:
  sgd(flat_params<T> p, cudaStream_t stream, double momentum = 0, double weight_decay = 0, bool nesterov = false,
      double dampening = 0)
      : optimizer<T>(std::move(p), momentum != 0 ? 1 : 0, stream, 0, 0), a_{0, momentum, weight_decay, dampening, nesterov, false} {
    if (nesterov && (momentum <= 0 || dampening != 0))
      raise(errc::invalid_argument, "fused::sgd: Nesterov needs momentum > 0 and dampening 0");
  }
  std::string name() const override { return a_.nesterov ? "sgd-nesterov" : "sgd"; }

protected:
  void update(double lr) override {
    rules::sgd_args a = a_;
    a.lr = lr;
    T* buf = this->state_.empty() ? this->p_.value : this->state_[0].get(); // unused without momentum
    detail::launched(cuda::device::launch(detail::sgd_kernel<T>, detail::blocks_for(this->p_.n), detail::threads, 0, this->stream_,
                                 this->p_.value, static_cast<const T*>(this->p_.grad), buf, this->p_.n, a,
                                 static_cast<const detail::step_state*>(this->record_.get())),
                     "fused::sgd");
  }

private:
  rules::sgd_args a_;
};

// Adam, or AdamW with decoupled = true (rules::adam).
template <class T> class adam : public optimizer<T> {
public:
  adam(flat_params<T> p, cudaStream_t stream, double weight_decay = 0, bool decoupled = false, double beta1 = 0.9,
       double beta2 = 0.999, double eps = 1e-8)
      : optimizer<T>(std::move(p), 2, stream, beta1, beta2), a_{0, weight_decay, beta1, beta2, eps, 1, 1, decoupled} {}
  std::string name() const override { return a_.decoupled ? "adamw" : "adam"; }

protected:
  void update(double lr) override {
    rules::adam_args a = a_;
    a.lr = lr;
    detail::launched(cuda::device::launch(detail::adam_kernel<T>, detail::blocks_for(this->p_.n), detail::threads, 0, this->stream_,
                                 this->p_.value, static_cast<const T*>(this->p_.grad), this->state_[0].get(),
                                 this->state_[1].get(), this->p_.n, a, static_cast<const detail::step_state*>(this->record_.get())),
                     "fused::adam");
  }

private:
  rules::adam_args a_;
};

// LAMB (rules::lamb), the trust ratio per tensor of the segmentation: three kernels per step (sums per
// chunk, trust per tensor, update).
template <class T> class lamb : public optimizer<T> {
public:
  lamb(flat_params<T> p, cudaStream_t stream, double weight_decay = 0, double beta1 = 0.9, double beta2 = 0.999,
       double eps = 1e-6)
      : optimizer<T>(std::move(p), 2, stream, beta1, beta2), a_{weight_decay, beta1, beta2, eps, 1, 1} {
    // Chunks of at most detail::chunk elements that never straddle two tensors.
    std::vector<std::int64_t> begin, tensor_of, first_chunk;
    const auto& seg = this->p_.segments;
    for (std::size_t i = 0; i < seg.size(); ++i) {
      first_chunk.push_back(std::int64_t(begin.size()));
      const std::int64_t end = i + 1 < seg.size() ? seg[i + 1] : this->p_.n;
      for (std::int64_t b = seg[i]; b < end; b += detail::chunk) {
        begin.push_back(b);
        tensor_of.push_back(std::int64_t(i));
      }
    }
    first_chunk.push_back(std::int64_t(begin.size()));
    chunks_ = begin.size();
    tensors_ = seg.size();
    begin.push_back(this->p_.n);
    chunk_begin_ = detail::upload(begin, this->stream_);
    chunk_tensor_ = detail::upload(tensor_of, this->stream_);
    first_chunk_ = detail::upload(first_chunk, this->stream_);
    partial_ = detail::device_array<double>(2 * chunks_);
    trust_ = detail::device_array<double>(tensors_);
  }
  std::string name() const override { return "lamb"; }
  // The trust ratio of each tensor at the last applied step (reads back: synchronises the stream).
  std::vector<double> trust_ratios() const {
    std::vector<double> t(tensors_);
    if (tensors_ > 0) {
      BRAID_CUDA_CHECK(cudaMemcpyAsync(t.data(), trust_.get(), tensors_ * sizeof(double), cudaMemcpyDeviceToHost, this->stream_));
      BRAID_CUDA_CHECK(cudaStreamSynchronize(this->stream_));
    }
    return t;
  }

protected:
  void update(double lr) override {
    const auto* rec = static_cast<const detail::step_state*>(this->record_.get());
    const T* g = this->p_.grad;
    detail::launched(cuda::device::launch(detail::lamb_sums<T>, unsigned(chunks_), detail::threads, 0, this->stream_,
                                 static_cast<const T*>(this->p_.value), g, static_cast<const T*>(this->state_[0].get()),
                                 static_cast<const T*>(this->state_[1].get()), static_cast<const std::int64_t*>(chunk_begin_.get()),
                                 partial_.get(), a_, rec),
                     "fused::lamb (sums)");
    detail::launched(cuda::device::launch(detail::lamb_trust_kernel<>, detail::blocks_for(std::int64_t(tensors_)), detail::threads, 0,
                                 this->stream_, static_cast<const double*>(partial_.get()),
                                 static_cast<const std::int64_t*>(first_chunk_.get()), std::int64_t(tensors_), trust_.get(), rec),
                     "fused::lamb (trust)");
    detail::launched(cuda::device::launch(detail::lamb_apply<T>, unsigned(chunks_), detail::threads, 0, this->stream_, this->p_.value, g,
                                 this->state_[0].get(), this->state_[1].get(), static_cast<const std::int64_t*>(chunk_begin_.get()),
                                 static_cast<const std::int64_t*>(chunk_tensor_.get()), static_cast<const double*>(trust_.get()), lr,
                                 a_, rec),
                     "fused::lamb (update)");
  }

private:
  rules::lamb_args a_;
  std::size_t chunks_ = 0, tensors_ = 0;
  detail::device_array<std::int64_t> chunk_begin_, chunk_tensor_, first_chunk_;
  detail::device_array<double> partial_, trust_;
};

// Clipping by global norm (nn::clip_grad_norm's rule) over a flat gradient buffer, enqueued on the
// stream: the norm is computed and applied on the device; norm() reads the last one back.
template <class T> class grad_clipper {
public:
  grad_clipper(T* grad, std::int64_t n, cudaStream_t stream)
      : g_(grad), n_(n), stream_(stream), chunks_(n > 0 ? std::size_t((n + detail::chunk - 1) / detail::chunk) : 0),
        partial_(chunks_), out_(2) {
    if (n < 0 || (n > 0 && grad == nullptr)) raise(errc::invalid_argument, "fused::grad_clipper: n < 0, or a null buffer");
    BRAID_CUDA_CHECK(cudaMemsetAsync(out_.get(), 0, 2 * sizeof(double), stream_));
  }
  // Scales the gradients by max_norm / (norm + 1e-6) when their L2 norm exceeds max_norm.
  void clip(double max_norm) {
    if (!(max_norm > 0)) raise(errc::invalid_argument, "fused::grad_clipper::clip: max_norm must be > 0");
    if (n_ == 0) return;
    detail::launched(cuda::device::launch(detail::square_sums<T>, unsigned(chunks_), detail::threads, 0, stream_,
                                 static_cast<const T*>(g_), n_, partial_.get()),
                     "fused::grad_clipper (sums)");
    detail::launched(cuda::device::launch(detail::clip_factor<>, 1, 1, 0, stream_, static_cast<const double*>(partial_.get()),
                                 std::int64_t(chunks_), max_norm, out_.get()),
                     "fused::grad_clipper (norm)");
    detail::launched(cuda::device::launch(detail::clip_apply<T>, detail::blocks_for(n_), detail::threads, 0, stream_, g_, n_,
                                 static_cast<const double*>(out_.get())),
                     "fused::grad_clipper (scale)");
  }
  // The norm before clipping at the last clip() (reads back: synchronises the stream); 0 before any.
  double norm() const {
    if (n_ == 0) return 0;
    double o[2] = {0, 0};
    BRAID_CUDA_CHECK(cudaMemcpyAsync(o, out_.get(), sizeof o, cudaMemcpyDeviceToHost, stream_));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return o[0];
  }

private:
  T* g_;
  std::int64_t n_;
  cudaStream_t stream_;
  std::size_t chunks_;
  detail::device_array<double> partial_, out_;
};

} // namespace braid::nn::fused
