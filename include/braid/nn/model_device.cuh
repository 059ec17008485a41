// braid/nn/model_device.cuh — a ResNet of braid::nn on a CUDA device: forward, backward and softmax
// cross-entropy over device memory, its parameters and gradients in one flat buffer each (what the
// fused optimizers and the DDP bucket reducer take), its GEMMs through cuBLAS and its per-element
// arithmetic from nn/ops.hpp, the same text the host layers run. Namespace braid::nn::fused.
//
//   fused::resnet<T> net(blocks, classes, in_ch, width, pool, stream, blas);   // nn::resnet's shape
//   net.load(host_model);                     // the host model's parameters and running statistics
//   net.forward(x_dev, {n, in_ch, h, w});     // x: device memory, NCHW
//   net.loss(labels_dev);                     // softmax cross-entropy; running sums on the device
//   net.backward();                           // dL/dparam into grads(), bucket callbacks as they finish
//   ... optimizer over {net.values(), net.grads(), net.size(), net.segments()} ...
//   net.store(host_model);                    // back to the host (checkpoints, evaluation there)
//
// fused::sequential<T> is the general form: add<fused::conv2d>(...), ... then build(); fused::resnet
// is a sequential of nn::resnet's layers. A pipeline stage keeps only some of the top-level children (resnet(..., first, last); see
// pipeline_device.cuh); mixed precision scales and rounds the loss gradient on the device
// (backward(loss_scaler, bf16)).
//
// The layers are nn::resnet's, in its order: conv3x3-BN-ReLU, 3 stages of `blocks` basic blocks
// (16, 32, 64 channels times width/16; stride 2 at the start of stages 2 and 3, with a 1x1
// convolution + BN shortcut), global average pooling, linear. Parameters are listed in the host
// model's collect() order (load/store match them one for one, shapes checked); in the flat buffer
// they lie in the REVERSE of that order, so that backward, which finishes them last to first, fills
// the buffer from offset 0 upwards and bucket 0 (the lowest offsets) is ready first. Each tensor
// starts at a multiple of 256 bytes; size() counts the zero padding between them.
//
// How each layer runs (T = float or double):
//   conv2d      im2col of the whole batch into [c*k*k, n*ho*wo] (ops::im2col_batch), one GEMM
//               W[o, c*k*k] x col, then a permute to NCHW; backward: dy permuted to [o, n*ho*wo],
//               dW += dy' col^T (one GEMM over the batch), dcol = W^T dy' (one GEMM), col2im_batch.
//   batchnorm2d ops::bn_stats per channel (fused::bn_stats: a block per channel and group of 256 of
//               the channel's 4096 strided partials, in double, its fixed tree in shared memory, then
//               the 16 group sums' tree; ops.hpp's channel order, which the host runs in one pass;
//               scratch: 32 doubles a channel from the pool), ops::bn_apply per element; backward
//               ops::bn_grad_sums the same way, bn_grad_apply per element. The same bits as the host layer's hand-written
//               path (it runs these ops).
//   relu, residual add, global average pooling, softmax cross-entropy: ops.hpp, as on the host.
//   linear      bias rows, then one GEMM (y = x W^T + b); backward two GEMMs and ops::bias_grad.
// Scratch (column matrices, permuted gradients) comes from the device_pool and goes back to it in
// stream order; each layer keeps its output and input-gradient buffers between steps (regrown when
// the batch grows).
//
// Everything is enqueued on the stream given at construction; nothing waits on the host except
// load(), store() and take_sums() (they synchronise the stream). The GEMMs sum in cuBLAS's order, not
// the host BLAS's, so convolutions and the linear layer agree with the host model to rounding, not to
// the bit; every rank that runs the same step on the same device type gets the same bits (cuBLAS's
// GEMMs are deterministic for a given shape, device and library version). Performance notes, not
// measured on a GPU: the per-channel batch-norm sums run a block per channel (C blocks), few blocks
// for a large GPU when C is small; the permutes cost one extra pass over each convolution's output
// and gradient.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../cuda/check.cuh"
#include "../cuda/runtime.cuh"
#include "device_pool.cuh"
#include "layers.hpp"
#include "layers_device.cuh"
#include "ops.hpp"
#include "optim_device.cuh"
#include "resnet_plan.hpp"
#include "tensor.hpp"

#if defined(BRAID_CUDA_EMULATOR) && !defined(__CUDACC__)
#include "../emu/cublas.hpp"
#else
#include <cublas_v2.h>
#endif

#include "fused_layers.cuh"

namespace braid::nn::fused {

// A network of the layers above on one device, in order: the device counterpart of nn::sequential
// of the same layers. add() them, then build() (lays out the flat buffers: see the top of this file);
// load() then takes a host model whose parameters() and buffers() are the same list.
template <class T> class sequential {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "fused models compute in float or double");

public:
  // The layers will run on the device of `pool`, enqueued on `stream`; `blas` is set to `stream` here
  // and must stay this model's while it runs. The pool, the stream and the handle must outlive the
  // model. After build(), parameters are zero (running variance one): load() a host model's.
  sequential(device_pool& pool, cudaStream_t stream, cublasHandle_t blas) : ctx_{stream, blas, &pool} {
    cuda::detail::device_guard guard(pool.device());
    detail::blas_check(cublasSetStream(blas, stream), "cublasSetStream");
  }
  // Appends layer L (one of the aliases above) built from args; before build() only.
  template <template <class> class L, class... A> L<T>& add(A&&... args) {
    detail::require_shape(!built_, "add: the model is built already");
    return net_.template add<L<T>>(ctx_, tab_, std::forward<A>(args)...);
  }
  // Lays out and allocates the flat buffers; once.
  void build() {
    detail::require_shape(!built_, "build: the model is built already");
    detail::require_shape(net_.size() > 0, "build: the model has no layers");
    cuda::detail::device_guard guard(ctx_.pool->device());
    // Flat layout: the reverse of collect() order, each tensor at a multiple of 256 bytes (the zero
    // padding between them stays zero: zero gradients, and every optimizer leaves a zero weight with a
    // zero gradient at zero), so every bucket and segment starts 16-byte aligned.
    constexpr std::int64_t align = std::int64_t(256 / sizeof(T));
    const std::size_t np = tab_.names.size();
    tab_.offset.assign(np, 0);
    std::int64_t at = 0;
    for (std::size_t i = np; i-- > 0;) {
      tab_.offset[i] = at;
      at = (at + tab_.shapes[i].numel() + align - 1) / align * align;
    }
    n_ = at;
    for (const shape_t& s : tab_.buffer_shapes) {
      tab_.buffer_offset.push_back(nbuf_);
      nbuf_ += s.numel();
    }
    tab_.value = values_.grow(ctx_, n_);
    tab_.grad = grads_.grow(ctx_, n_);
    tab_.buffer = buffers_.grow(ctx_, nbuf_);
    sums_.grow(ctx_, 2);
    BRAID_CUDA_CHECK(cudaMemsetAsync(tab_.value, 0, std::size_t(n_) * sizeof(T), ctx_.stream));
    BRAID_CUDA_CHECK(cudaMemsetAsync(tab_.grad, 0, std::size_t(n_) * sizeof(T), ctx_.stream));
    BRAID_CUDA_CHECK(cudaMemsetAsync(sums_.get(), 0, 2 * sizeof(double), ctx_.stream));
    std::vector<T> init(static_cast<std::size_t>(nbuf_));
    for (std::size_t i = 0; i < tab_.buffer_shapes.size(); ++i) // running mean 0, running variance 1 (pairs)
      std::fill(init.begin() + tab_.buffer_offset[i], init.begin() + tab_.buffer_offset[i] + tab_.buffer_shapes[i].numel(),
                T(i % 2 == 0 ? 0 : 1));
    BRAID_CUDA_CHECK(cudaMemcpyAsync(tab_.buffer, init.data(), init.size() * sizeof(T), cudaMemcpyHostToDevice, ctx_.stream));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    tab_.on_ready = [this](std::size_t i) { param_ready(i); };
    built_ = true;
    set_buckets(0);
  }
  sequential(const sequential&) = delete;
  sequential& operator=(const sequential&) = delete;
  virtual ~sequential() = default;

  // The flat buffers: n = size() parameters, their gradients, and the running statistics.
  T* values() const noexcept { return tab_.value; }
  T* grads() const noexcept { return tab_.grad; }
  std::int64_t size() const noexcept { return n_; }
  T* buffers() const noexcept { return tab_.buffer; }
  std::int64_t buffer_size() const noexcept { return nbuf_; }
  std::size_t parameter_count() const noexcept { return tab_.names.size(); }
  const std::string& parameter_name(std::size_t i) const { return tab_.names.at(i); }
  const shape_t& parameter_shape(std::size_t i) const { return tab_.shapes.at(i); }
  std::int64_t parameter_offset(std::size_t i) const { return tab_.offset.at(i); }
  // Where each parameter tensor starts in the flat buffer, ascending (the fused optimizers' segments).
  std::vector<std::int64_t> segments() const {
    std::vector<std::int64_t> s(tab_.offset.rbegin(), tab_.offset.rend());
    return s;
  }
  cudaStream_t stream() const noexcept { return ctx_.stream; }
  device_pool& pool() const noexcept { return *ctx_.pool; }

  // The last forward's output shape.
  const shape_t& output_shape() const { return net_.out(); }

  // Gradient buckets of about `elems` elements (0: one per parameter tensor), whole tensors each,
  // ascending from offset 0: the boundaries for fused::bucket_reducer. After each backward()'s last
  // gradient of bucket b, `on_bucket(b)` is called (on the host, when the work is enqueued).
  const std::vector<std::int64_t>& set_buckets(std::int64_t elems) {
    require_built("set_buckets");
    bucket_begin_.clear();
    bucket_of_.assign(tab_.names.size(), 0);
    std::int64_t filled = 0;
    for (std::size_t i = tab_.names.size(); i-- > 0;) {
      if (bucket_begin_.empty() || filled >= elems) {
        bucket_begin_.push_back(tab_.offset[i]);
        filled = 0;
      }
      bucket_of_[i] = bucket_begin_.size() - 1;
      filled += tab_.shapes[i].numel();
    }
    pending_.assign(bucket_begin_.size(), 0);
    return bucket_begin_;
  }
  const std::vector<std::int64_t>& bucket_begin() const noexcept { return bucket_begin_; }
  void on_bucket_ready(std::function<void(std::size_t)> f) { on_bucket_ = std::move(f); }

  void set_training(bool on) { net_.set_training(on); }

  // x: [n, in_ch, h, w] in device memory, valid until backward() returns. Returns the logits [n, classes].
  const T* forward(const T* x, const shape_t& in) {
    detail::require_shape(built_, "forward: build() the model first");
    cuda::detail::device_guard guard(ctx_.pool->device());
    logits_ = net_.forward(x, in);
    batch_ = in[0];
    return logits_;
  }
  // Softmax cross-entropy of the last forward's logits against `labels` (device memory, n int32 in
  // [0, classes): not checked on the device); adds the batch's summed loss and right answers to the
  // running sums (take_sums()).
  // count = false: the probabilities for backward only, the running sums untouched (a pipeline's
  // recomputed micro-batch).
  void loss(const std::int32_t* labels, bool count = true) {
    detail::require_shape(classifier_ && built_, "loss: this model (stage) does not end with the classifier");
    cuda::detail::device_guard guard(ctx_.pool->device());
    labels_ = labels;
    const shape_t& z = net_.out();
    detail::require_shape(z.rank() == 2, "loss: the model's output is not [n, classes]");
    classes_ = z[1];
    T* p = probs_.grow(ctx_, batch_ * classes_);
    double* rl = row_loss_.grow(ctx_, batch_);
    std::int32_t* rr = row_right_.grow(ctx_, batch_);
    softmax_ce_forward(logits_, labels, p, rl, rr, batch_, classes_, ctx_.stream);
    if (count) for_each(1, ops::ce_accumulate{rl, rr, batch_, sums_.get()}, ctx_.stream);
  }
  // Backward of scale * (mean loss): adds dL/dparam into grads(), calling the bucket callback as
  // buckets finish. Returns d(input) (a stage's, for the previous stage), valid until the next forward
  // or backward.
  const T* backward(double scale = 1.0) {
    detail::require_shape(classifier_ && built_, "backward: this model (stage) does not end with the classifier (backward_from)");
    cuda::detail::device_guard guard(ctx_.pool->device());
    begin_backward();
    T* g = dlogits_.grow(ctx_, batch_ * classes_);
    softmax_ce_backward(static_cast<const T*>(probs_.get()), labels_, g, batch_, classes_, scale, ctx_.stream);
    return net_.backward(g);
  }
  // Mixed precision (T = float; the values() hold weights rounded to the compute type, see
  // fused::round_into): backward of scaler's scale * (mean loss), the scale read on the device (no
  // host synchronisation), with the loss gradient rounded to the compute type (bfloat16 when bf16,
  // else half) as the host trainer rounds it (mixed_precision::round). The scaler's stream must be
  // this model's stream.
  void backward(const loss_scaler& scaler, bool bf16)
    requires std::is_same_v<T, float>
  {
    detail::require_shape(scaler.stream() == ctx_.stream, "backward: the loss scaler runs on another stream");
    detail::require_shape(classifier_ && built_, "backward: this model (stage) does not end with the classifier");
    cuda::detail::device_guard guard(ctx_.pool->device());
    begin_backward();
    T* g = dlogits_.grow(ctx_, batch_ * classes_);
    softmax_ce_backward(static_cast<const T*>(probs_.get()), labels_, g, batch_, classes_, &scaler.device_state()->scale,
                        ctx_.stream);
    round_into(g, g, batch_ * classes_, bf16, ctx_.stream);
    (void)net_.backward(g);
  }
  // A stage without the classifier: backward of the last forward from dy (output_shape(), device
  // memory), adding dL/dparam into grads() with the bucket callbacks; returns d(input), valid until the
  // next forward or backward.
  const T* backward_from(const T* dy) {
    require_built("backward_from");
    cuda::detail::device_guard guard(ctx_.pool->device());
    begin_backward();
    return net_.backward(dy);
  }
  void zero_grad() {
    require_built("zero_grad");
    BRAID_CUDA_CHECK(cudaMemsetAsync(tab_.grad, 0, std::size_t(n_) * sizeof(T), ctx_.stream));
  }
  // The running sums of loss and right answers since the last call (synchronises), then zero.
  std::pair<double, double> take_sums() {
    require_built("take_sums");
    double h[2] = {0, 0};
    BRAID_CUDA_CHECK(cudaMemcpyAsync(h, sums_.get(), sizeof h, cudaMemcpyDeviceToHost, ctx_.stream));
    BRAID_CUDA_CHECK(cudaMemsetAsync(sums_.get(), 0, sizeof h, ctx_.stream));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    return {h[0], h[1]};
  }

  // Copies the host model's parameters and buffers here (shapes must match nn::resnet's of the same
  // arguments; invalid_argument otherwise), or this model's to the host model. Both synchronise.
  void load(module<T>& host) { transfer(host, true); }
  void store(module<T>& host) { transfer(host, false); }

protected:
  // Every bucket waits for all of its tensors' gradients again (each backward starts here).
  void begin_backward() {
    for (std::size_t b = 0; b < pending_.size(); ++b) pending_[b] = 0;
    for (std::size_t i = 0; i < bucket_of_.size(); ++i) ++pending_[bucket_of_[i]];
  }
  void param_ready(std::size_t i) {
    const std::size_t b = bucket_of_[i];
    if (--pending_[b] == 0 && on_bucket_) on_bucket_(b);
  }
  void require_built(const char* what) const {
    if (!built_) detail::require_shape(false, (std::string(what) + ": build() the model first").c_str());
  }
  void transfer(module<T>& host, bool to_device) {
    require_built(to_device ? "load" : "store");
    const std::vector<parameter*> ps = host.parameters();
    const std::vector<tensor*> bs = host.buffers();
    detail::require_shape(ps.size() == tab_.names.size() && bs.size() == tab_.buffer_shapes.size(),
                          "load/store: the host model has other layers");
    for (std::size_t i = 0; i < ps.size(); ++i)
      if (ps[i]->value.shape() != tab_.shapes[i] || ps[i]->value.type() != dtype_of_v<T>)
        detail::require_shape(false, ("load/store: host parameter " + std::to_string(i) + " (" + ps[i]->name + ") has another shape or type").c_str());
    for (std::size_t i = 0; i < bs.size(); ++i)
      if (bs[i]->shape() != tab_.buffer_shapes[i] || bs[i]->type() != dtype_of_v<T>)
        detail::require_shape(false, ("load/store: host buffer " + std::to_string(i) + " has another shape or type").c_str());
    cuda::detail::device_guard guard(ctx_.pool->device());
    auto move = [&](T* dev, tensor& t) {
      const std::size_t bytes = std::size_t(t.numel()) * sizeof(T);
      if (to_device) BRAID_CUDA_CHECK(cudaMemcpyAsync(dev, t.data<T>(), bytes, cudaMemcpyHostToDevice, ctx_.stream));
      else BRAID_CUDA_CHECK(cudaMemcpyAsync(t.data<T>(), dev, bytes, cudaMemcpyDeviceToHost, ctx_.stream));
    };
    for (std::size_t i = 0; i < ps.size(); ++i) move(tab_.w(i), ps[i]->value);
    for (std::size_t i = 0; i < bs.size(); ++i) move(tab_.b(i), *bs[i]);
    BRAID_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream)); // the host tensors are the caller's: done before return
  }

  detail::device_context ctx_;
  detail::param_table<T> tab_;
  detail::chain<T> net_;
  std::int64_t classes_ = 0, n_ = 0, nbuf_ = 0, batch_ = 0;
  bool built_ = false, classifier_ = true;
  detail::pooled<T> values_, grads_, buffers_, probs_, dlogits_;
  detail::pooled<double> sums_, row_loss_;
  detail::pooled<std::int32_t> row_right_;
  const T* logits_ = nullptr;
  const std::int32_t* labels_ = nullptr;
  std::vector<std::int64_t> bucket_begin_;
  std::vector<std::size_t> bucket_of_, pending_;
  std::function<void(std::size_t)> on_bucket_;
};

// nn::resnet's network on the device, or a pipeline stage of it.
template <class T> class resnet : public sequential<T> {
public:
  // nn::resnet(blocks, classes, rng, in_ch, width)'s layers (see sequential for pool, stream, blas).
  resnet(int blocks, int classes, int in_ch, int width, device_pool& pool, cudaStream_t stream, cublasHandle_t blas)
      : resnet(blocks, classes, in_ch, width, pool, stream, blas, 0, std::size_t(-1)) {}
  // A pipeline stage: only nn::resnet's top-level children [first, last) (conv, bn, relu, the
  // 3 * blocks basic blocks, global pooling, linear: children() = 3 * blocks + 5 of them; last is
  // clamped to that), the same layers take_stage(host model, cuts, s) keeps, so load()/store() take
  // that host stage. forward() takes the stage's input (the previous stage's output: see
  // input_shape()); loss() and backward(scale) need the last child (has_loss()); other stages run
  // backward_from(dy), which returns the gradient of their input.
  resnet(int blocks, int classes, int in_ch, int width, device_pool& pool, cudaStream_t stream, cublasHandle_t blas,
         std::size_t first, std::size_t last)
      : sequential<T>(pool, stream, blas), in_ch_(in_ch), plan_(nn::detail::resnet_plan(blocks, classes, in_ch, width)) {
    detail::require_shape(blocks > 0 && classes > 0 && in_ch > 0 && width > 0, "resnet: bad shape");
    children_ = plan_.size();
    last = std::min(last, children_);
    detail::require_shape(first < last, "resnet: a stage needs first < last <= children()");
    first_ = first;
    last_ = last;
    using kind = nn::detail::resnet_child::kind;
    for (std::size_t k = first_; k < last_; ++k) {
      const nn::detail::resnet_child& c = plan_[k];
      switch (c.what) {
      case kind::conv: this->template add<conv2d>(c.in, c.out, 3, c.stride, 1); break;
      case kind::batchnorm: this->template add<batchnorm2d>(c.out); break;
      case kind::relu: this->template add<relu>(); break;
      case kind::block: this->template add<basic_block>(c.in, c.out, c.stride); break;
      case kind::pool: this->template add<global_avgpool>(); break;
      case kind::linear: this->template add<linear>(c.in, c.out); break;
      }
    }
    this->classifier_ = last_ == children_;
    this->build();
  }

  // Stages: nn::resnet's top-level child count, this model's [first, last), whether it ends with the
  // classifier (loss() and backward(scale) need it).
  std::size_t children() const noexcept { return children_; }
  std::size_t first_child() const noexcept { return first_; }
  std::size_t last_child() const noexcept { return last_; }
  bool has_loss() const noexcept { return last_ == children_; }
  // The shape of this stage's input for n images of h x w (in_ch channels): the output shape of
  // children [0, first) of the whole network (shape arithmetic only).
  shape_t input_shape(std::int64_t n, std::int64_t h, std::int64_t w) const {
    return nn::detail::resnet_input_shape(plan_, first_, n, in_ch_, h, w);
  }

private:
  int in_ch_;
  std::vector<nn::detail::resnet_child> plan_;
  std::size_t children_ = 0, first_ = 0, last_ = 0;
};

} // namespace braid::nn::fused
