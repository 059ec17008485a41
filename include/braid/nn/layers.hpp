// braid/nn/layers.hpp — layers with explicit forward and backward (no autograd engine), on the CPU.
//
// Every layer is a module<T> for T = float or double (double is what the gradient checks use). The
// contract of a module:
//   y  = forward(x)    keeps what backward needs (the input, masks, batch statistics);
//   dx = backward(dy)  for the last forward's x: returns dL/dx and ADDS dL/dparam into each
//                      parameter's grad (so gradients accumulate until zero_grad()); when a layer's
//                      parameter gradients are final for this backward it calls the grad hook (DDP uses
//                      it to start reducing a bucket while backward goes on), in the reverse of the
//                      order collect() lists them.
// Tensors are NCHW (images) or NF (features), row-major. Float convolutions run on oneDNN where it was
// found (BRAID_HAVE_DNNL; onednn.hpp); double ones, and all where it was not, go through im2col and
// BLAS gemm, as linear layers do; nothing calls a virtual function per element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "blas.hpp"
#include "ops.hpp"
#include "tensor.hpp"
// nvcc 13.0's front end stops with an internal error on oneDNN's dnnl.hpp: what nvcc compiles sees
// braid::nn without oneDNN (every layer on its im2col + BLAS path). Compile all of one program's
// translation units that use braid::nn with the same compiler (one definition of each layer).
#if defined(__CUDACC__) && BRAID_HAVE_DNNL
#undef BRAID_HAVE_DNNL
#define BRAID_HAVE_DNNL 0
#endif
#if BRAID_HAVE_DNNL
#include "onednn.hpp"
#endif

namespace braid::nn {

// A learnable tensor and its gradient (same shape and type).
struct parameter {
  std::string name;
  tensor value;
  tensor grad;
};

// Called once per parameter per backward, when that parameter's gradient is final.
using grad_hook = std::function<void(parameter&)>;

template <class T> class module {
public:
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "modules compute in float or double");
  using scalar = T;
  virtual ~module() = default;
  virtual tensor forward(const tensor& x) = 0;
  virtual tensor backward(const tensor& dy) = 0;
  // Appends this module's parameters and buffers (BatchNorm running statistics), in a fixed order.
  virtual void collect(std::vector<parameter*>& params, std::vector<tensor*>& buffers) {
    (void)params;
    (void)buffers;
  }
  virtual void set_training(bool on) { training_ = on; }
  virtual void set_grad_hook(grad_hook* h) { hook_ = h; }
  bool training() const noexcept { return training_; }

  std::vector<parameter*> parameters() {
    std::vector<parameter*> p;
    std::vector<tensor*> b;
    collect(p, b);
    return p;
  }
  std::vector<tensor*> buffers() {
    std::vector<parameter*> p;
    std::vector<tensor*> b;
    collect(p, b);
    return b;
  }
  void zero_grad() {
    for (parameter* p : parameters()) p->grad.zero();
  }

protected:
  void grads_ready(parameter& p) {
    if (hook_ && *hook_) (*hook_)(p);
  }
  bool training_ = true;
  grad_hook* hook_ = nullptr;
};

namespace detail {
inline void require(bool ok, const std::string& what) {
  if (!ok) raise(errc::invalid_argument, what);
}
template <class T> parameter make_param(std::string name, shape_t s) {
  parameter p{std::move(name), tensor(s, dtype_of_v<T>), tensor::zeros(s, dtype_of_v<T>)};
  p.value.zero();
  return p;
}
// Kaiming-uniform-like initialisation: U(-b, b), b = sqrt(6 / fan_in) * gain / sqrt(2).
template <class T> void init_uniform(tensor& t, double bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-bound, bound);
  T* p = t.data<T>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = T(u(rng));
}
#if BRAID_HAVE_DNNL
// use_onednn(on) of a float conv2d or batchnorm2d, whose oneDNN side is `impl`: off drops it, on
// builds it in plain NCHW with make() unless it is there. A side set to blocked activations stays:
// the layers around it hand it blocked tensors.
template <class Impl, class Make> void use_onednn(std::unique_ptr<Impl>& impl, bool on, const char* layer, Make make) {
  require(on || !(impl && impl->blocked()), std::string(layer) + ": a layer with blocked activations stays on oneDNN");
  if (!on) impl.reset();
  else if (!impl) impl = make();
}
#endif
} // namespace detail

// y[n,o,:,:] = sum_c w[o,c] * x[n,c] (k x k window, stride s, zero padding p) + b[o]
template <class T> class conv2d : public module<T> {
public:
  conv2d(int in_ch, int out_ch, int k, int stride, int pad, bool bias, std::mt19937_64& rng)
      : c_(in_ch), o_(out_ch), k_(k), s_(stride), p_(pad), has_bias_(bias) {
    detail::require(in_ch > 0 && out_ch > 0 && k > 0 && stride > 0 && pad >= 0, "conv2d: bad geometry");
    w_ = detail::make_param<T>("conv.weight", {out_ch, in_ch, k, k});
    detail::init_uniform<T>(w_.value, std::sqrt(6.0 / double(in_ch * k * k)), rng);
    if (bias) b_ = detail::make_param<T>("conv.bias", {out_ch});
  }
  tensor forward(const tensor& x) override {
    detail::require(x.shape().rank() == 4 && x.dim(1) == c_, "conv2d: input " + x.shape().str());
    x_ = x;
    const int n = int(x.dim(0)), h = int(x.dim(2)), w = int(x.dim(3));
    ho_ = (h + 2 * p_ - k_) / s_ + 1;
    wo_ = (w + 2 * p_ - k_) / s_ + 1;
    detail::require(ho_ > 0 && wo_ > 0, "conv2d: input smaller than the kernel");
    tensor y({n, o_, ho_, wo_}, dtype_of_v<T>);
#if BRAID_HAVE_DNNL
    if constexpr (std::is_same_v<T, float>) {
      if (dnnl_) {
        dnnl_->forward(x, w_.value, has_bias_ ? &b_.value : nullptr, y);
        return y;
      }
    }
#endif
    const int ck = c_ * k_ * k_, hw = ho_ * wo_;
    tensor col({ck, hw}, dtype_of_v<T>);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    for (int i = 0; i < n; ++i) {
      im2col(xp + std::int64_t(i) * c_ * h * w, h, w, col.data<T>());
      blas::gemm(false, false, o_, hw, ck, T(1), w_.value.data<T>(), ck, col.data<T>(), hw, T(0),
                 yp + std::int64_t(i) * o_ * hw, hw);
      if (has_bias_) {
        const T* b = b_.value.data<T>();
        for (int oc = 0; oc < o_; ++oc) {
          T* row = yp + (std::int64_t(i) * o_ + oc) * hw;
          for (int j = 0; j < hw; ++j) row[j] += b[oc];
        }
      }
    }
    return y;
  }
  tensor backward(const tensor& dy) override {
    const int n = int(x_.dim(0)), h = int(x_.dim(2)), w = int(x_.dim(3));
    const int ck = c_ * k_ * k_, hw = ho_ * wo_;
    detail::require(dy.numel() == std::int64_t(n) * o_ * hw, "conv2d: gradient " + dy.shape().str());
#if BRAID_HAVE_DNNL
    if constexpr (std::is_same_v<T, float>) {
      if (dnnl_) return backward_dnnl(dy);
    }
#endif
    tensor dx = tensor::zeros(x_.shape(), dtype_of_v<T>);
    tensor col({ck, hw}, dtype_of_v<T>);
    const T* xp = x_.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
    T* dw = w_.grad.data<T>();
    for (int i = 0; i < n; ++i) {
      const T* dyi = dyp + std::int64_t(i) * o_ * hw;
      im2col(xp + std::int64_t(i) * c_ * h * w, h, w, col.data<T>());
      blas::gemm(false, true, o_, ck, hw, T(1), dyi, hw, col.data<T>(), hw, T(1), dw, ck); // dW += dy col^T
      blas::gemm(true, false, ck, hw, o_, T(1), w_.value.data<T>(), ck, dyi, hw, T(0), col.data<T>(), hw);
      col2im(col.data<T>(), h, w, dxp + std::int64_t(i) * c_ * h * w);
      if (has_bias_) {
        T* db = b_.grad.data<T>();
        for (int oc = 0; oc < o_; ++oc) {
          T s = 0;
          for (int j = 0; j < hw; ++j) s += dyi[std::int64_t(oc) * hw + j];
          db[oc] += s;
        }
      }
    }
    if (has_bias_) this->grads_ready(b_); // reverse registration order, as DDP's buckets
    this->grads_ready(w_);
    x_ = tensor();
    return dx;
  }
  void collect(std::vector<parameter*>& params, std::vector<tensor*>&) override {
    params.push_back(&w_);
    if (has_bias_) params.push_back(&b_);
  }
  parameter& weight() { return w_; }
  // Whether this float layer runs on oneDNN (the default where braid::nn found it) or on the
  // im2col + BLAS path (double layers always do). Tests compare the two.
  bool uses_onednn() const noexcept {
#if BRAID_HAVE_DNNL
    return dnnl_ != nullptr;
#else
    return false;
#endif
  }
  void use_onednn(bool on) {
#if BRAID_HAVE_DNNL
    if constexpr (std::is_same_v<T, float>) {
      detail::use_onednn(dnnl_, on, "conv2d",
                         [&] { return std::make_unique<onednn::conv>(c_, o_, k_, s_, p_, has_bias_); });
      return;
    }
#endif
    detail::require(!on, "conv2d: oneDNN serves float convolutions, and only where braid::nn was built with it");
  }
  // oneDNN only: x and dx (in), y and dy (out) in oneDNN's channel-blocked layout
  // (onednn::layout(true)) instead of NCHW, the shape still [N, C, H, W]. resnet() sets this between
  // its own layers; the channel counts must be multiples of onednn::block().
  void set_blocked(bool in, bool out) {
#if BRAID_HAVE_DNNL
    if constexpr (std::is_same_v<T, float>) {
      const int b = onednn::block();
      detail::require(dnnl_ && b > 0 && (!in || c_ % b == 0) && (!out || o_ % b == 0),
                      "conv2d: blocked activations need oneDNN and channel counts that are multiples of its block");
      dnnl_ = std::make_unique<onednn::conv>(c_, o_, k_, s_, p_, has_bias_, in, out);
      return;
    }
#endif
    detail::require(!in && !out, "conv2d: blocked activations need oneDNN (float layers)");
  }
  // The oneDNN implementations in use ("" on the BLAS path or before the first forward).
  std::string onednn_impl() const {
#if BRAID_HAVE_DNNL
    if (dnnl_) return dnnl_->impl();
#endif
    return "";
  }

private:
#if BRAID_HAVE_DNNL
  tensor backward_dnnl(const tensor& dy) {
    tensor dx(x_.shape(), dtype_of_v<T>);
    tensor dw(w_.grad.shape(), dtype_of_v<T>);
    tensor db = has_bias_ ? tensor(b_.grad.shape(), dtype_of_v<T>) : tensor();
    dnnl_->backward(x_, w_.value, dy, dx, dw, has_bias_ ? &db : nullptr);
    if (has_bias_) {
      T* g = b_.grad.data<T>();
      const T* d = db.data<T>();
      for (std::int64_t i = 0; i < db.numel(); ++i) g[i] += d[i];
      this->grads_ready(b_);
    }
    T* g = w_.grad.data<T>();
    const T* d = dw.data<T>();
    for (std::int64_t i = 0; i < dw.numel(); ++i) g[i] += d[i];
    this->grads_ready(w_);
    x_ = tensor();
    return dx;
  }
#endif
  // The output columns [lo, hi) whose input column ox*s - p + kj lies inside [0, w).
  void valid_range(int kj, int w, int& lo, int& hi) const {
    const int off = kj - p_; // ix = ox*s + off
    lo = off >= 0 ? 0 : (-off + s_ - 1) / s_;
    hi = (w - 1 - off) < 0 ? 0 : std::min(wo_, (w - 1 - off) / s_ + 1);
    if (hi < lo) hi = lo;
  }
  // col[(c*k + ki)*k + kj][oy*wo + ox] = x[c][oy*s - p + ki][ox*s - p + kj] (0 outside)
  void im2col(const T* x, int h, int w, T* col) const {
    for (int c = 0; c < c_; ++c)
      for (int ki = 0; ki < k_; ++ki)
        for (int kj = 0; kj < k_; ++kj) {
          T* row = col + (std::int64_t(c * k_ + ki) * k_ + kj) * ho_ * wo_;
          int lo, hi;
          valid_range(kj, w, lo, hi);
          const int off = kj - p_;
          for (int oy = 0; oy < ho_; ++oy) {
            const int iy = oy * s_ - p_ + ki;
            T* r = row + oy * wo_;
            if (iy < 0 || iy >= h) {
              std::fill(r, r + wo_, T(0));
              continue;
            }
            const T* xr = x + (std::int64_t(c) * h + iy) * w;
            std::fill(r, r + lo, T(0));
            if (s_ == 1) {
              std::copy(xr + lo + off, xr + hi + off, r + lo);
            } else {
              for (int ox = lo; ox < hi; ++ox) r[ox] = xr[ox * s_ + off];
            }
            std::fill(r + hi, r + wo_, T(0));
          }
        }
  }
  void col2im(const T* col, int h, int w, T* dx) const {
    for (int c = 0; c < c_; ++c)
      for (int ki = 0; ki < k_; ++ki)
        for (int kj = 0; kj < k_; ++kj) {
          const T* row = col + (std::int64_t(c * k_ + ki) * k_ + kj) * ho_ * wo_;
          int lo, hi;
          valid_range(kj, w, lo, hi);
          const int off = kj - p_;
          for (int oy = 0; oy < ho_; ++oy) {
            const int iy = oy * s_ - p_ + ki;
            if (iy < 0 || iy >= h) continue;
            T* xr = dx + (std::int64_t(c) * h + iy) * w;
            const T* r = row + oy * wo_;
            if (s_ == 1) {
              for (int ox = lo; ox < hi; ++ox) xr[ox + off] += r[ox];
            } else {
              for (int ox = lo; ox < hi; ++ox) xr[ox * s_ + off] += r[ox];
            }
          }
        }
  }
  int c_, o_, k_, s_, p_;
  bool has_bias_;
  int ho_ = 0, wo_ = 0;
  parameter w_, b_;
  tensor x_;
#if BRAID_HAVE_DNNL
  std::unique_ptr<onednn::conv> dnnl_ =
      std::is_same_v<T, float> ? std::make_unique<onednn::conv>(c_, o_, k_, s_, p_, has_bias_) : nullptr;
#endif
};

// Per-channel normalisation over (N, H, W). Training: batch mean and biased variance normalise, and
// the running statistics move by `momentum` toward the batch mean and the unbiased variance (as
// PyTorch does). Evaluation: the running statistics normalise and backward is the affine map. Float
// layers run on oneDNN where braid::nn has it (plain NCHW, statistics in float), double ones by hand.
template <class T> class batchnorm2d : public module<T> {
public:
  explicit batchnorm2d(int ch, double momentum = 0.1, double eps = 1e-5) : c_(ch), mom_(momentum), eps_(eps) {
    gamma_ = detail::make_param<T>("bn.weight", {ch});
    beta_ = detail::make_param<T>("bn.bias", {ch});
    gamma_.value.fill<T>(T(1));
    mean_ = tensor::zeros({ch}, dtype_of_v<T>);
    var_ = tensor({ch}, dtype_of_v<T>);
    var_.fill<T>(T(1));
  }
  tensor forward(const tensor& x) override {
    detail::require(x.shape().rank() == 4 && x.dim(1) == c_, "batchnorm2d: input " + x.shape().str());
    const std::int64_t n = x.dim(0), hw = x.dim(2) * x.dim(3);
#if BRAID_HAVE_DNNL
    if constexpr (std::is_same_v<T, float>) {
      if (dnnl_) return forward_dnnl(x, n * hw);
    }
#endif
    tensor y(x.shape(), dtype_of_v<T>);
    xhat_ = tensor(x.shape(), dtype_of_v<T>);
    invstd_ = tensor({c_}, dtype_of_v<T>);
    tensor mu({c_}, dtype_of_v<T>);
    ops::for_each_host(c_, ops::bn_stats<T>{x.data<T>(), n, c_, hw, mom_, eps_, this->training_, mean_.data<T>(),
                                            var_.data<T>(), mu.data<T>(), invstd_.data<T>()});
    ops::for_each_host(x.numel(), ops::bn_apply<T>{x.data<T>(), mu.data<T>(), invstd_.data<T>(), gamma_.value.data<T>(),
                                                   beta_.value.data<T>(), xhat_.data<T>(), y.data<T>(), c_, hw});
    return y;
  }
  tensor backward(const tensor& dy) override {
#if BRAID_HAVE_DNNL
    if constexpr (std::is_same_v<T, float>) {
      if (dnnl_) return backward_dnnl(dy);
    }
#endif
    const shape_t& s = xhat_.shape();
    detail::require(dy.shape() == s, "batchnorm2d: gradient " + dy.shape().str());
    const std::int64_t n = s[0], hw = s[2] * s[3];
    tensor dx(s, dtype_of_v<T>), coef({3 * c_}, dtype_of_v<T>);
    ops::for_each_host(c_, ops::bn_grad_sums<T>{dy.data<T>(), xhat_.data<T>(), gamma_.value.data<T>(), invstd_.data<T>(), n, c_,
                                                hw, gamma_.grad.data<T>(), beta_.grad.data<T>(), coef.data<T>()});
    ops::for_each_host(dx.numel(), ops::bn_grad_apply<T>{dy.data<T>(), xhat_.data<T>(), coef.data<T>(), c_, hw, this->training_,
                                                         dx.data<T>()});
    this->grads_ready(beta_);
    this->grads_ready(gamma_);
    xhat_ = tensor();
    return dx;
  }
  void collect(std::vector<parameter*>& params, std::vector<tensor*>& buffers) override {
    params.push_back(&gamma_);
    params.push_back(&beta_);
    buffers.push_back(&mean_);
    buffers.push_back(&var_);
  }
  tensor& running_mean() { return mean_; }
  tensor& running_var() { return var_; }
  // Whether this float layer runs on oneDNN (the default where braid::nn found it) or on the
  // hand-written loops (double layers always do). Tests compare the two.
  bool uses_onednn() const noexcept {
#if BRAID_HAVE_DNNL
    return dnnl_ != nullptr;
#else
    return false;
#endif
  }
  void use_onednn(bool on) {
#if BRAID_HAVE_DNNL
    if constexpr (std::is_same_v<T, float>) {
      detail::use_onednn(dnnl_, on, "batchnorm2d", [&] { return std::make_unique<onednn::bnorm>(c_, eps_); });
      return;
    }
#endif
    detail::require(!on, "batchnorm2d: oneDNN serves float layers, and only where braid::nn was built with it");
  }
  // oneDNN only: x, y, dy and dx in oneDNN's channel-blocked layout (see conv2d::set_blocked).
  void set_blocked(bool on) {
#if BRAID_HAVE_DNNL
    if constexpr (std::is_same_v<T, float>) {
      const int b = onednn::block();
      detail::require(dnnl_ && (!on || (b > 0 && c_ % b == 0)),
                      "batchnorm2d: blocked activations need oneDNN and a channel count that is a multiple of its block");
      dnnl_ = std::make_unique<onednn::bnorm>(c_, eps_, on);
      return;
    }
#endif
    detail::require(!on, "batchnorm2d: blocked activations need oneDNN (float layers)");
  }

private:
#if BRAID_HAVE_DNNL
  // m: the elements per channel (N * H * W).
  tensor forward_dnnl(const tensor& x, std::int64_t m) {
    tensor y(x.shape(), dtype_of_v<T>);
    x_ = x;
    if (this->training_) {
      bmean_ = tensor({c_}, dtype_of_v<T>);
      bvar_ = tensor({c_}, dtype_of_v<T>);
    } else {
      bmean_ = mean_.clone();
      bvar_ = var_.clone();
    }
    dnnl_->forward(x, gamma_.value, beta_.value, this->training_, bmean_, bvar_, y);
    if (this->training_) {
      T* rm = mean_.data<T>();
      T* rv = var_.data<T>();
      const T* bm = bmean_.data<T>();
      const T* bv = bvar_.data<T>();
      for (int c = 0; c < c_; ++c) {
        const double unbiased = m > 1 ? double(bv[c]) * double(m) / double(m - 1) : double(bv[c]);
        rm[c] = T((1 - mom_) * double(rm[c]) + mom_ * double(bm[c]));
        rv[c] = T((1 - mom_) * double(rv[c]) + mom_ * unbiased);
      }
    }
    return y;
  }
  tensor backward_dnnl(const tensor& dy) {
    detail::require(dy.shape() == x_.shape(), "batchnorm2d: gradient " + dy.shape().str());
    tensor dx(dy.shape(), dtype_of_v<T>), dg({c_}, dtype_of_v<T>), db({c_}, dtype_of_v<T>);
    dnnl_->backward(x_, gamma_.value, beta_.value, bmean_, bvar_, dy, dx, dg, db);
    T* g = gamma_.grad.data<T>();
    T* b = beta_.grad.data<T>();
    for (int c = 0; c < c_; ++c) {
      g[c] += dg.data<T>()[c];
      b[c] += db.data<T>()[c];
    }
    this->grads_ready(beta_);
    this->grads_ready(gamma_);
    x_ = tensor();
    return dx;
  }
#endif
  int c_;
  double mom_, eps_;
  parameter gamma_, beta_;
  tensor mean_, var_, xhat_, invstd_;
#if BRAID_HAVE_DNNL
  tensor x_, bmean_, bvar_; // the oneDNN path keeps the input and the statistics it normalised with
  std::unique_ptr<onednn::bnorm> dnnl_ =
      std::is_same_v<T, float> ? std::make_unique<onednn::bnorm>(c_, eps_) : nullptr;
#endif
};

template <class T> class relu : public module<T> {
public:
  tensor forward(const tensor& x) override {
    y_ = tensor(x.shape(), dtype_of_v<T>);
    ops::for_each_host(x.numel(), ops::relu_forward<T>{x.data<T>(), y_.data<T>()});
    return y_;
  }
  tensor backward(const tensor& dy) override {
    detail::require(dy.shape() == y_.shape(), "relu: gradient " + dy.shape().str());
    tensor dx(dy.shape(), dtype_of_v<T>);
    ops::for_each_host(dy.numel(), ops::relu_backward<T>{y_.data<T>(), dy.data<T>(), dx.data<T>()});
    y_ = tensor();
    return dx;
  }

private:
  tensor y_;
};

// Residual add: out = a + b (same shape). Backward of a sum passes dy to both branches.
template <class T> tensor add(const tensor& a, const tensor& b) {
  detail::require(a.shape() == b.shape(), "add: " + a.shape().str() + " vs " + b.shape().str());
  tensor y(a.shape(), dtype_of_v<T>);
  ops::for_each_host(a.numel(), ops::add_forward<T>{a.data<T>(), b.data<T>(), y.data<T>()});
  return y;
}

// Max or average pooling over k x k windows with stride s (no padding; a partial window at the edge
// is dropped).
template <class T, bool Max> class pool2d : public module<T> {
public:
  pool2d(int k, int stride) : k_(k), s_(stride) { detail::require(k > 0 && stride > 0, "pool2d: bad geometry"); }
  tensor forward(const tensor& x) override {
    detail::require(x.shape().rank() == 4, "pool2d: input " + x.shape().str());
    in_ = x.shape();
    const std::int64_t nc = x.dim(0) * x.dim(1);
    const int h = int(x.dim(2)), w = int(x.dim(3));
    const int ho = (h - k_) / s_ + 1, wo = (w - k_) / s_ + 1;
    detail::require(ho > 0 && wo > 0, "pool2d: input smaller than the window");
    tensor y({x.dim(0), x.dim(1), ho, wo}, dtype_of_v<T>);
    if (Max) arg_ = std::vector<std::int32_t>(std::size_t(y.numel()));
    g_ = ops::pool_shape{nc, h, w, ho, wo, k_, s_};
    ops::for_each_host(y.numel(), ops::pool_forward<T, Max>{x.data<T>(), y.data<T>(), arg_.data(), g_});
    return y;
  }
  tensor backward(const tensor& dy) override {
    detail::require(dy.shape() == shape_t({in_[0], in_[1], g_.ho, g_.wo}), "pool2d: gradient " + dy.shape().str());
    tensor dx(in_, dtype_of_v<T>);
    ops::for_each_host(dx.numel(), ops::pool_backward<T, Max>{dy.data<T>(), arg_.data(), dx.data<T>(), g_});
    return dx;
  }

private:
  int k_, s_;
  shape_t in_;
  ops::pool_shape g_{};
  std::vector<std::int32_t> arg_;
};
template <class T> using maxpool2d = pool2d<T, true>;
template <class T> using avgpool2d = pool2d<T, false>;

// [N, C, H, W] -> [N, C]: the mean over each channel's H x W.
template <class T> class global_avgpool : public module<T> {
public:
  // b > 0: x and dx are channel-blocked by b (oneDNN's nChw<b>c, with C a multiple of b) instead of
  // NCHW; y and dy stay [N, C]. resnet() sets this after its blocked layers.
  void set_block(int b) {
    detail::require(b >= 0, "global_avgpool: bad block");
    block_ = b;
  }
  tensor forward(const tensor& x) override {
    detail::require(x.shape().rank() == 4, "global_avgpool: input " + x.shape().str());
    in_ = x.shape();
    const std::int64_t nc = x.dim(0) * x.dim(1), hw = x.dim(2) * x.dim(3);
    tensor y({x.dim(0), x.dim(1)}, dtype_of_v<T>);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    if (block_ > 0) {
      detail::require(x.dim(1) % block_ == 0, "global_avgpool: channels not a multiple of the block");
      const std::int64_t b = block_;
      for (std::int64_t g = 0; g < nc / b; ++g) { // g = n * C/b + channel block; its outputs are y[g*b ...]
        const T* xg = xp + g * hw * b;
        for (std::int64_t j = 0; j < b; ++j) {
          T sum = 0;
          for (std::int64_t i = 0; i < hw; ++i) sum += xg[i * b + j];
          yp[g * b + j] = sum / T(hw);
        }
      }
      return y;
    }
    ops::for_each_host(nc, ops::global_avgpool_forward<T>{xp, yp, hw});
    return y;
  }
  tensor backward(const tensor& dy) override {
    tensor dx(in_, dtype_of_v<T>);
    const std::int64_t nc = in_[0] * in_[1], hw = in_[2] * in_[3];
    const T* d = dy.data<T>();
    T* o = dx.data<T>();
    if (block_ > 0) {
      const std::int64_t b = block_;
      for (std::int64_t g = 0; g < nc / b; ++g)
        for (std::int64_t i = 0; i < hw; ++i)
          for (std::int64_t j = 0; j < b; ++j) o[(g * hw + i) * b + j] = d[g * b + j] / T(hw);
      return dx;
    }
    ops::for_each_host(nc * hw, ops::global_avgpool_backward<T>{d, o, hw});
    return dx;
  }

private:
  shape_t in_;
  int block_ = 0;
};

// [N, ...] -> [N, prod(...)]; shares memory.
template <class T> class flatten : public module<T> {
public:
  tensor forward(const tensor& x) override {
    in_ = x.shape();
    return x.reshape({x.dim(0), x.numel() / std::max<std::int64_t>(x.dim(0), 1)});
  }
  tensor backward(const tensor& dy) override { return dy.reshape(in_); }

private:
  shape_t in_;
};

// y = x W^T + b; x: [N, in], W: [out, in], b: [out].
template <class T> class linear : public module<T> {
public:
  linear(int in, int out, std::mt19937_64& rng) : in_(in), out_(out) {
    w_ = detail::make_param<T>("linear.weight", {out, in});
    b_ = detail::make_param<T>("linear.bias", {out});
    detail::init_uniform<T>(w_.value, 1.0 / std::sqrt(double(in)), rng);
    detail::init_uniform<T>(b_.value, 1.0 / std::sqrt(double(in)), rng);
  }
  tensor forward(const tensor& x) override {
    detail::require(x.shape().rank() == 2 && x.dim(1) == in_, "linear: input " + x.shape().str());
    x_ = x;
    const int n = int(x.dim(0));
    tensor y({n, out_}, dtype_of_v<T>);
    T* yp = y.data<T>();
    const T* b = b_.value.data<T>();
    for (int i = 0; i < n; ++i) std::copy(b, b + out_, yp + std::int64_t(i) * out_);
    blas::gemm(false, true, n, out_, in_, T(1), x.data<T>(), in_, w_.value.data<T>(), in_, T(1), yp, out_);
    return y;
  }
  tensor backward(const tensor& dy) override {
    const int n = int(x_.dim(0));
    detail::require(dy.shape() == shape_t({n, out_}), "linear: gradient " + dy.shape().str());
    tensor dx({n, in_}, dtype_of_v<T>);
    const T* d = dy.data<T>();
    blas::gemm(true, false, out_, in_, n, T(1), d, out_, x_.data<T>(), in_, T(1), w_.grad.data<T>(), in_);
    T* db = b_.grad.data<T>();
    for (int i = 0; i < n; ++i)
      for (int o = 0; o < out_; ++o) db[o] += d[std::int64_t(i) * out_ + o];
    this->grads_ready(b_);
    this->grads_ready(w_);
    blas::gemm(false, false, n, in_, out_, T(1), d, out_, w_.value.data<T>(), in_, T(0), dx.data<T>(), in_);
    x_ = tensor();
    return dx;
  }
  void collect(std::vector<parameter*>& params, std::vector<tensor*>&) override {
    params.push_back(&w_);
    params.push_back(&b_);
  }

private:
  int in_, out_;
  parameter w_, b_;
  tensor x_;
};

// Runs its children in order; backward in reverse order.
template <class T> class sequential : public module<T> {
public:
  template <class M, class... A> M& add(A&&... args) {
    auto m = std::make_unique<M>(std::forward<A>(args)...);
    M& ref = *m;
    m->set_training(this->training_);
    m->set_grad_hook(this->hook_);
    children_.push_back(std::move(m));
    return ref;
  }
  tensor forward(const tensor& x) override {
    tensor h = x;
    for (auto& m : children_) h = m->forward(h);
    return h;
  }
  tensor backward(const tensor& dy) override {
    tensor d = dy;
    for (auto it = children_.rbegin(); it != children_.rend(); ++it) d = (*it)->backward(d);
    return d;
  }
  void collect(std::vector<parameter*>& params, std::vector<tensor*>& buffers) override {
    for (auto& m : children_) m->collect(params, buffers);
  }
  void set_training(bool on) override {
    this->training_ = on;
    for (auto& m : children_) m->set_training(on);
  }
  void set_grad_hook(grad_hook* h) override {
    this->hook_ = h;
    for (auto& m : children_) m->set_grad_hook(h);
  }
  std::size_t size() const { return children_.size(); }
  // Moves children [first, last) out of this sequential, in order, into a new one (pipeline stages).
  // The new sequential takes this one's training flag and grad hook; the moved children keep theirs,
  // which are this one's (add() and the setters give every child its parent's), and their
  // parameters, buffers and state are the same objects as before (pointers to them stay valid).
  // This sequential keeps the others, in order. invalid_argument unless first <= last <= size().
  std::unique_ptr<sequential<T>> extract(std::size_t first, std::size_t last) {
    detail::require(first <= last && last <= children_.size(),
                    "sequential::extract: [" + std::to_string(first) + ", " + std::to_string(last) + ") of " +
                        std::to_string(children_.size()) + " children");
    auto out = std::make_unique<sequential<T>>();
    out->training_ = this->training_;
    out->hook_ = this->hook_;
    const auto b = children_.begin() + std::ptrdiff_t(first), e = children_.begin() + std::ptrdiff_t(last);
    out->children_.assign(std::make_move_iterator(b), std::make_move_iterator(e));
    children_.erase(b, e);
    return out;
  }

private:
  std::vector<std::unique_ptr<module<T>>> children_;
};

// ResNet basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), 3x3 convolutions; the
// shortcut is the identity, or a strided 1x1 convolution with BatchNorm when the shape changes.
template <class T> class basic_block : public module<T> {
public:
  // onednn = false: float layers on the hand-written path; blocked: activations in oneDNN's
  // channel-blocked layout in and out (see conv2d::set_blocked).
  basic_block(int in_ch, int out_ch, int stride, std::mt19937_64& rng, bool onednn = true, bool blocked = false) {
    auto setup = [&](auto& layer) -> auto& {
      if (!onednn) layer.use_onednn(false);
      return layer;
    };
    auto& c1 = setup(main_.template add<conv2d<T>>(in_ch, out_ch, 3, stride, 1, false, rng));
    auto& b1 = setup(main_.template add<batchnorm2d<T>>(out_ch));
    main_.template add<relu<T>>();
    auto& c2 = setup(main_.template add<conv2d<T>>(out_ch, out_ch, 3, 1, 1, false, rng));
    auto& b2 = setup(main_.template add<batchnorm2d<T>>(out_ch));
    if (blocked) {
      c1.set_blocked(true, true);
      b1.set_blocked(true);
      c2.set_blocked(true, true);
      b2.set_blocked(true);
    }
    if (stride != 1 || in_ch != out_ch) {
      shortcut_ = std::make_unique<sequential<T>>();
      auto& c3 = setup(shortcut_->template add<conv2d<T>>(in_ch, out_ch, 1, stride, 0, false, rng));
      auto& b3 = setup(shortcut_->template add<batchnorm2d<T>>(out_ch));
      if (blocked) {
        c3.set_blocked(true, true);
        b3.set_blocked(true);
      }
    }
  }
  tensor forward(const tensor& x) override {
    tensor a = main_.forward(x);
    tensor b = shortcut_ ? shortcut_->forward(x) : x;
    return out_.forward(add<T>(a, b));
  }
  tensor backward(const tensor& dy) override {
    tensor d = out_.backward(dy);
    tensor dx = main_.backward(d);
    tensor ds = shortcut_ ? shortcut_->backward(d) : d;
    T* p = dx.data<T>();
    const T* q = ds.data<T>();
    const std::int64_t n = dx.numel();
    for (std::int64_t i = 0; i < n; ++i) p[i] += q[i];
    return dx;
  }
  void collect(std::vector<parameter*>& params, std::vector<tensor*>& buffers) override {
    main_.collect(params, buffers);
    if (shortcut_) shortcut_->collect(params, buffers);
  }
  void set_training(bool on) override {
    this->training_ = on;
    main_.set_training(on);
    if (shortcut_) shortcut_->set_training(on);
  }
  void set_grad_hook(grad_hook* h) override {
    this->hook_ = h;
    main_.set_grad_hook(h);
    if (shortcut_) shortcut_->set_grad_hook(h);
  }

private:
  sequential<T> main_;
  std::unique_ptr<sequential<T>> shortcut_;
  relu<T> out_;
};

// ResNet for 1-channel images (CIFAR-style ResNet-(6n+2)): conv3x3(16)-BN-ReLU, three stages of n
// basic blocks with 16, 32, 64 channels (the 2nd and 3rd start with stride 2), global average
// pooling, linear to `classes`. n = 3 is ResNet-20. `width` scales the channel counts (16*width...).
//
// Float networks run their convolutions and batch norms on oneDNN where braid::nn has it, and when
// `width` is a multiple of oneDNN's channel block (onednn::block(): 16 with AVX-512, 8 with AVX2)
// the activations between the first convolution and the global pooling stay in oneDNN's
// channel-blocked layout (no reorder between layers; ReLU and the residual adds are elementwise and
// do not care). Input and output are NCHW and [N, classes] all the same. onednn = false puts every
// layer on the hand-written path (the tests compare the two).
template <class T> std::unique_ptr<sequential<T>> resnet(int n, int classes, std::mt19937_64& rng,
                                                         int in_ch = 1, int width = 16, bool onednn = true) {
  bool blocked = false;
#if BRAID_HAVE_DNNL
  if constexpr (std::is_same_v<T, float>) blocked = onednn && onednn::block() > 0 && width % onednn::block() == 0;
#endif
  auto net = std::make_unique<sequential<T>>();
  auto& c0 = net->template add<conv2d<T>>(in_ch, width, 3, 1, 1, false, rng);
  auto& b0 = net->template add<batchnorm2d<T>>(width);
  if (!onednn) {
    c0.use_onednn(false);
    b0.use_onednn(false);
  }
  if (blocked) {
    c0.set_blocked(false, true);
    b0.set_blocked(true);
  }
  net->template add<relu<T>>();
  int ch = width;
  for (int stage = 0; stage < 3; ++stage) {
    const int out = width << stage;
    for (int b = 0; b < n; ++b) {
      net->template add<basic_block<T>>(ch, out, (stage > 0 && b == 0) ? 2 : 1, rng, onednn, blocked);
      ch = out;
    }
  }
  auto& pool = net->template add<global_avgpool<T>>();
#if BRAID_HAVE_DNNL
  if (blocked) pool.set_block(onednn::block());
#endif
  (void)pool;
  net->template add<linear<T>>(ch, classes, rng);
  return net;
}

} // namespace braid::nn
