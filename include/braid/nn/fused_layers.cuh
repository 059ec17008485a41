// braid/nn/fused_layers.cuh — the layers of a fused model on one CUDA device (fused::conv2d,
// batchnorm2d, relu, basic_block, global_avgpool, linear), their parameter tables and pooled
// buffers; nn/model_device.cuh builds networks of them.
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

} // namespace braid::nn::fused
