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
#include "tensor.hpp"

#if defined(BRAID_CUDA_EMULATOR) && !defined(__CUDACC__)
#include "../emu/cublas.hpp"
#else
#include <cublas_v2.h>
#endif

namespace braid::nn::fused {

namespace detail {

inline void blas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) raise(errc::cuda, std::string("nn::fused: ") + what + ": " + cublasGetStatusName(st));
}

// Row-major C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, leading dimensions row-major, on
// the handle's stream. cuBLAS is column-major: row-major C is column-major C^T = op(B)^T op(A)^T.
template <class T>
void gemm(cublasHandle_t h, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
          std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  const std::int64_t most = 0x7fffffff;
  require_shape(m <= most && n <= most && k <= most && lda <= most && ldb <= most && ldc <= most,
                "gemm: a dimension beyond cuBLAS's 32-bit int");
  const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if constexpr (std::is_same_v<T, float>)
    blas_check(cublasSgemm(h, ob, oa, int(n), int(m), int(k), &alpha, b, int(ldb), a, int(lda), &beta, c, int(ldc)), "cublasSgemm");
  else
    blas_check(cublasDgemm(h, ob, oa, int(n), int(m), int(k), &alpha, b, int(ldb), a, int(lda), &beta, c, int(ldc)), "cublasDgemm");
}

// What every layer of one model shares: the stream, the cuBLAS handle (set to the stream), the pool.
struct device_context {
  cudaStream_t stream;
  cublasHandle_t blas;
  device_pool* pool;
};

// A device buffer from the pool, given back in stream order when it is dropped or regrown.
template <class T> class pooled {
public:
  pooled() = default;
  pooled(device_context& c, std::int64_t n) { grow(c, n); }
  pooled(const pooled&) = delete;
  pooled& operator=(const pooled&) = delete;
  ~pooled() { reset(); }
  // At least n elements (contents undefined after a regrow).
  T* grow(device_context& c, std::int64_t n) {
    if (n > cap_) {
      reset();
      p_ = static_cast<T*>(c.pool->allocate(std::size_t(n) * sizeof(T), c.stream));
      cap_ = n;
      ctx_ = &c;
    }
    return p_;
  }
  void reset() noexcept {
    if (p_) {
      try {
        ctx_->pool->deallocate(p_, ctx_->stream);
      } catch (...) { // an event that cannot be recorded: the block stays in use (the pool's rule)
      }
    }
    p_ = nullptr;
    cap_ = 0;
  }
  T* get() const noexcept { return p_; }

private:
  T* p_ = nullptr;
  std::int64_t cap_ = 0;
  device_context* ctx_ = nullptr;
};

// The model's parameters (in the host's collect() order) and buffers (BatchNorm running statistics),
// each a slice of one flat device buffer; grads_ready() reports a parameter whose gradient is final.
template <class T> struct param_table {
  std::vector<std::string> names;
  std::vector<shape_t> shapes;
  std::vector<std::int64_t> offset; // in values/grads
  std::vector<shape_t> buffer_shapes;
  std::vector<std::int64_t> buffer_offset;
  T* value = nullptr;
  T* grad = nullptr;
  T* buffer = nullptr;
  std::function<void(std::size_t)> on_ready;

  std::size_t add(std::string name, shape_t s) {
    names.push_back(std::move(name));
    shapes.push_back(std::move(s));
    return names.size() - 1;
  }
  std::size_t add_buffer(shape_t s) {
    buffer_shapes.push_back(std::move(s));
    return buffer_shapes.size() - 1;
  }
  T* w(std::size_t i) const noexcept { return value + offset[i]; }
  T* g(std::size_t i) const noexcept { return grad + offset[i]; }
  T* b(std::size_t i) const noexcept { return buffer + buffer_offset[i]; }
  void ready(std::size_t i) const {
    if (on_ready) on_ready(i);
  }
};

template <class T> class layer {
public:
  layer(device_context& c, param_table<T>& t) : ctx_(c), tab_(t) {}
  layer(const layer&) = delete;
  layer& operator=(const layer&) = delete;
  virtual ~layer() = default;
  // y = f(x); x (shape `in`) must stay valid until backward(). Returns this layer's output.
  virtual const T* forward(const T* x, const shape_t& in) = 0;
  // dx for the last forward's x, from dy (the shape of out()); adds the parameter gradients.
  virtual const T* backward(const T* dy) = 0;
  virtual void set_training(bool on) { training_ = on; }
  const shape_t& out() const noexcept { return out_; }

protected:
  device_context& ctx_;
  param_table<T>& tab_;
  shape_t in_, out_;
  bool training_ = true;
};

template <class T> class conv_layer final : public layer<T> {
public:
  conv_layer(device_context& c, param_table<T>& t, int in_ch, int out_ch, int k, int stride, int pad)
      : layer<T>(c, t), c_(in_ch), o_(out_ch), k_(k), s_(stride), p_(pad) {
    w_ = t.add("conv.weight", {out_ch, in_ch, k, k});
  }
  const T* forward(const T* x, const shape_t& in) override {
    require_shape(in.rank() == 4 && in[1] == c_, "conv2d: input shape");
    this->in_ = in;
    x_ = x;
    g_ = conv_geometry(c_, int(in[2]), int(in[3]), k_, s_, p_);
    const std::int64_t n = in[0], hw = std::int64_t(g_.ho) * g_.wo, ck = std::int64_t(c_) * k_ * k_;
    this->out_ = shape_t({n, o_, g_.ho, g_.wo});
    auto& c = this->ctx_;
    pooled<T> col(c, ck * n * hw), cn(c, o_ * n * hw);
    for_each(ck * n * hw, ops::im2col_batch<T>::make(x, col.get(), g_, n), c.stream);
    gemm<T>(c.blas, false, false, o_, n * hw, ck, T(1), this->tab_.w(w_), ck, col.get(), n * hw, T(0), cn.get(), n * hw);
    T* y = y_.grow(c, n * o_ * hw);
    for_each(n * o_ * hw, ops::cn_to_nchw<T>{cn.get(), y, o_, n, hw}, c.stream);
    return y;
  }
  const T* backward(const T* dy) override {
    auto& c = this->ctx_;
    const std::int64_t n = this->in_[0], hw = std::int64_t(g_.ho) * g_.wo, ck = std::int64_t(c_) * k_ * k_;
    pooled<T> col(c, ck * n * hw), dcn(c, o_ * n * hw);
    for_each(o_ * n * hw, ops::nchw_to_cn<T>{dy, dcn.get(), o_, n, hw}, c.stream);
    for_each(ck * n * hw, ops::im2col_batch<T>::make(x_, col.get(), g_, n), c.stream);
    gemm<T>(c.blas, false, true, o_, ck, n * hw, T(1), dcn.get(), n * hw, col.get(), n * hw, T(1), this->tab_.g(w_), ck);
    this->tab_.ready(w_);
    gemm<T>(c.blas, true, false, ck, n * hw, o_, T(1), this->tab_.w(w_), ck, dcn.get(), n * hw, T(0), col.get(), n * hw);
    T* dx = dx_.grow(c, this->in_.numel());
    for_each(this->in_.numel(), ops::col2im_batch<T>::make(col.get(), dx, g_, n), c.stream);
    return dx;
  }

private:
  int c_, o_, k_, s_, p_;
  std::size_t w_;
  ops::conv_shape g_{};
  const T* x_ = nullptr;
  pooled<T> y_, dx_;
};

template <class T> class bn_layer final : public layer<T> {
public:
  bn_layer(device_context& c, param_table<T>& t, int ch, double momentum = 0.1, double eps = 1e-5)
      : layer<T>(c, t), c_(ch), mom_(momentum), eps_(eps) {
    gamma_ = t.add("bn.weight", {ch});
    beta_ = t.add("bn.bias", {ch});
    mean_ = t.add_buffer({ch});
    var_ = t.add_buffer({ch});
  }
  const T* forward(const T* x, const shape_t& in) override {
    require_shape(in.rank() == 4 && in[1] == c_, "batchnorm2d: input shape");
    this->in_ = this->out_ = in;
    auto& c = this->ctx_;
    const std::int64_t n = in[0], hw = in[2] * in[3], all = in.numel();
    T* mu = mu_.grow(c, c_);
    T* is = invstd_.grow(c, c_);
    bn_stats(ops::bn_stats<T>{x, n, c_, hw, mom_, eps_, this->training_, this->tab_.b(mean_), this->tab_.b(var_), mu, is},
             scratch_.grow(c, bn_scratch_doubles(c_)), c.stream);
    T* y = y_.grow(c, all);
    for_each(all, ops::bn_apply<T>{x, mu, is, this->tab_.w(gamma_), this->tab_.w(beta_), xhat_.grow(c, all), y, c_, hw}, c.stream);
    return y;
  }
  const T* backward(const T* dy) override {
    auto& c = this->ctx_;
    const std::int64_t n = this->in_[0], hw = this->in_[2] * this->in_[3], all = this->in_.numel();
    pooled<T> coef(c, 3 * c_);
    bn_grad_sums(ops::bn_grad_sums<T>{dy, xhat_.get(), this->tab_.w(gamma_), invstd_.get(), n, c_, hw, this->tab_.g(gamma_),
                                      this->tab_.g(beta_), coef.get()},
                 scratch_.grow(c, bn_scratch_doubles(c_)), c.stream);
    this->tab_.ready(beta_);
    this->tab_.ready(gamma_);
    T* dx = dx_.grow(c, all);
    for_each(all, ops::bn_grad_apply<T>{dy, xhat_.get(), coef.get(), c_, hw, this->training_, dx}, c.stream);
    return dx;
  }

private:
  int c_;
  double mom_, eps_;
  std::size_t gamma_, beta_, mean_, var_;
  pooled<T> mu_, invstd_, xhat_, y_, dx_;
  pooled<double> scratch_; // the batch-norm sums' group sums (bn_scratch_doubles(c_))
};

template <class T> class relu_layer final : public layer<T> {
public:
  using layer<T>::layer;
  const T* forward(const T* x, const shape_t& in) override {
    this->in_ = this->out_ = in;
    T* y = y_.grow(this->ctx_, in.numel());
    relu_forward(x, y, in.numel(), this->ctx_.stream);
    return y;
  }
  const T* backward(const T* dy) override {
    T* dx = dx_.grow(this->ctx_, this->in_.numel());
    relu_backward(static_cast<const T*>(y_.get()), dy, dx, this->in_.numel(), this->ctx_.stream);
    return dx;
  }

private:
  pooled<T> y_, dx_;
};

// Layers in order; backward in reverse.
template <class T> class chain {
public:
  template <class L, class... A> L& add(device_context& c, param_table<T>& t, A&&... args) {
    auto l = std::make_unique<L>(c, t, std::forward<A>(args)...);
    L& ref = *l;
    layers_.push_back(std::move(l));
    return ref;
  }
  const T* forward(const T* x, const shape_t& in) {
    const T* h = x;
    shape_t s = in;
    for (auto& l : layers_) {
      h = l->forward(h, s);
      s = l->out();
    }
    return h;
  }
  const T* backward(const T* dy) {
    const T* d = dy;
    for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) d = (*it)->backward(d);
    return d;
  }
  void set_training(bool on) {
    for (auto& l : layers_) l->set_training(on);
  }
  const shape_t& out() const { return layers_.back()->out(); }
  std::size_t size() const noexcept { return layers_.size(); }

private:
  std::vector<std::unique_ptr<layer<T>>> layers_;
};

// nn::basic_block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
template <class T> class block_layer final : public layer<T> {
public:
  block_layer(device_context& c, param_table<T>& t, int in_ch, int out_ch, int stride) : layer<T>(c, t), out_relu_(c, t) {
    main_.template add<conv_layer<T>>(c, t, in_ch, out_ch, 3, stride, 1);
    main_.template add<bn_layer<T>>(c, t, out_ch);
    main_.template add<relu_layer<T>>(c, t);
    main_.template add<conv_layer<T>>(c, t, out_ch, out_ch, 3, 1, 1);
    main_.template add<bn_layer<T>>(c, t, out_ch);
    if (stride != 1 || in_ch != out_ch) {
      shortcut_ = std::make_unique<chain<T>>();
      shortcut_->template add<conv_layer<T>>(c, t, in_ch, out_ch, 1, stride, 0);
      shortcut_->template add<bn_layer<T>>(c, t, out_ch);
    }
  }
  const T* forward(const T* x, const shape_t& in) override {
    this->in_ = in;
    const T* a = main_.forward(x, in);
    const T* b = shortcut_ ? shortcut_->forward(x, in) : x;
    this->out_ = main_.out();
    const std::int64_t all = this->out_.numel();
    T* sum = sum_.grow(this->ctx_, all);
    add(a, b, sum, all, this->ctx_.stream);
    return out_relu_.forward(sum, this->out_);
  }
  // The shortcut's gradients first: the parameters then finish in the reverse of collect() order
  // (main, then shortcut), as the flat buffer lies. dx_main + dx_shortcut is the host's sum (an IEEE
  // addition does not depend on the order of its operands).
  const T* backward(const T* dy) override {
    const T* d = out_relu_.backward(dy);
    const T* ds = shortcut_ ? shortcut_->backward(d) : d;
    const T* dm = main_.backward(d);
    const std::int64_t all = this->in_.numel();
    T* dx = dx_.grow(this->ctx_, all);
    add(dm, ds, dx, all, this->ctx_.stream);
    return dx;
  }
  void set_training(bool on) override {
    this->training_ = on;
    main_.set_training(on);
    if (shortcut_) shortcut_->set_training(on);
  }

private:
  chain<T> main_;
  std::unique_ptr<chain<T>> shortcut_;
  relu_layer<T> out_relu_;
  pooled<T> sum_, dx_;
};

template <class T> class gap_layer final : public layer<T> {
public:
  using layer<T>::layer;
  const T* forward(const T* x, const shape_t& in) override {
    require_shape(in.rank() == 4, "global_avgpool: input shape");
    this->in_ = in;
    this->out_ = shape_t({in[0], in[1]});
    T* y = y_.grow(this->ctx_, in[0] * in[1]);
    global_avgpool_forward(x, y, in[0] * in[1], in[2] * in[3], this->ctx_.stream);
    return y;
  }
  const T* backward(const T* dy) override {
    T* dx = dx_.grow(this->ctx_, this->in_.numel());
    global_avgpool_backward(dy, dx, this->in_[0] * this->in_[1], this->in_[2] * this->in_[3], this->ctx_.stream);
    return dx;
  }

private:
  pooled<T> y_, dx_;
};

template <class T> class linear_layer final : public layer<T> {
public:
  linear_layer(device_context& c, param_table<T>& t, int in, int out) : layer<T>(c, t), in_f_(in), out_f_(out) {
    w_ = t.add("linear.weight", {out, in});
    b_ = t.add("linear.bias", {out});
  }
  const T* forward(const T* x, const shape_t& in) override {
    require_shape(in.rank() == 2 && in[1] == in_f_, "linear: input shape");
    this->in_ = in;
    this->out_ = shape_t({in[0], out_f_});
    x_ = x;
    auto& c = this->ctx_;
    const std::int64_t n = in[0];
    T* y = y_.grow(c, n * out_f_);
    for_each(n * out_f_, ops::bias_rows<T>{this->tab_.w(b_), y, out_f_}, c.stream);
    gemm<T>(c.blas, false, true, n, out_f_, in_f_, T(1), x, in_f_, this->tab_.w(w_), in_f_, T(1), y, out_f_);
    return y;
  }
  const T* backward(const T* dy) override {
    auto& c = this->ctx_;
    const std::int64_t n = this->in_[0];
    gemm<T>(c.blas, true, false, out_f_, in_f_, n, T(1), dy, out_f_, x_, in_f_, T(1), this->tab_.g(w_), in_f_);
    for_each(out_f_, ops::bias_grad<T>{dy, this->tab_.g(b_), n, out_f_}, c.stream);
    this->tab_.ready(b_);
    this->tab_.ready(w_);
    T* dx = dx_.grow(c, n * in_f_);
    gemm<T>(c.blas, false, false, n, in_f_, out_f_, T(1), dy, out_f_, this->tab_.w(w_), in_f_, T(0), dx, in_f_);
    return dx;
  }

private:
  std::int64_t in_f_, out_f_;
  std::size_t w_, b_;
  const T* x_ = nullptr;
  pooled<T> y_, dx_;
};

} // namespace detail

// Layers for sequential::add (their constructor arguments after the model's own):
//   conv2d(in_ch, out_ch, k, stride, pad)       no bias, as nn::conv2d(..., bias = false)
//   batchnorm2d(channels, momentum = 0.1, eps = 1e-5)
//   relu()
//   basic_block(in_ch, out_ch, stride)           nn::basic_block
//   global_avgpool()                             [n, c, h, w] -> [n, c]
//   linear(in, out)                              with bias
template <class T> using conv2d = detail::conv_layer<T>;
template <class T> using batchnorm2d = detail::bn_layer<T>;
template <class T> using relu = detail::relu_layer<T>;
template <class T> using basic_block = detail::block_layer<T>;
template <class T> using global_avgpool = detail::gap_layer<T>;
template <class T> using linear = detail::linear_layer<T>;

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
    cuda_detail::device_guard guard(pool.device());
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
    cuda_detail::device_guard guard(ctx_.pool->device());
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
    cuda_detail::device_guard guard(ctx_.pool->device());
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
    cuda_detail::device_guard guard(ctx_.pool->device());
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
    cuda_detail::device_guard guard(ctx_.pool->device());
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
    cuda_detail::device_guard guard(ctx_.pool->device());
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
    cuda_detail::device_guard guard(ctx_.pool->device());
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
    cuda_detail::device_guard guard(ctx_.pool->device());
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
      : sequential<T>(pool, stream, blas), blocks_(blocks), in_ch_(in_ch), width_(width) {
    detail::require_shape(blocks > 0 && classes > 0 && in_ch > 0 && width > 0, "resnet: bad shape");
    children_ = 3 * std::size_t(blocks) + 5;
    last = std::min(last, children_);
    detail::require_shape(first < last, "resnet: a stage needs first < last <= children()");
    first_ = first;
    last_ = last;
    std::size_t k = 0;
    auto mine = [&] { return k >= first_ && k < last_; };
    if (mine()) this->template add<conv2d>(in_ch, width, 3, 1, 1);
    ++k;
    if (mine()) this->template add<batchnorm2d>(width);
    ++k;
    if (mine()) this->template add<relu>();
    ++k;
    int ch = width;
    for (int stage = 0; stage < 3; ++stage) {
      const int out = width << stage;
      for (int b = 0; b < blocks; ++b, ++k) {
        if (mine()) this->template add<basic_block>(ch, out, (stage > 0 && b == 0) ? 2 : 1);
        ch = out;
      }
    }
    if (mine()) this->template add<global_avgpool>();
    ++k;
    if (mine()) this->template add<linear>(ch, classes);
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
    if (first_ == 0) return shape_t({n, in_ch_, h, w});
    auto conv3 = [&](std::int64_t stride) { // 3x3, padding 1
      h = (h + 2 - 3) / stride + 1;
      w = (w + 2 - 3) / stride + 1;
    };
    conv3(1); // children 0-2: conv, bn, relu
    std::int64_t c = width_;
    std::size_t k = 3;
    for (int stage = 0; stage < 3; ++stage)
      for (int b = 0; b < blocks_; ++b, ++k) {
        if (k >= first_) return shape_t({n, c, h, w});
        conv3((stage > 0 && b == 0) ? 2 : 1);
        c = std::int64_t(width_) << stage;
      }
    if (k >= first_) return shape_t({n, c, h, w}); // the pooling's input
    return shape_t({n, c});                         // the linear layer's input
  }

private:
  int blocks_, in_ch_, width_;
  std::size_t children_ = 0, first_ = 0, last_ = 0;
};

} // namespace braid::nn::fused
