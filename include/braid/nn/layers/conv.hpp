// braid/nn/layers/conv.hpp — conv2d: oneDNN for float where braid::nn has it, im2col + BLAS gemm otherwise.
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

#include "module.hpp"

namespace braid::nn {

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
    if (dnnl_) {
      dnnl_->forward(x, w_.value, has_bias_ ? &b_.value : nullptr, y);
      return y;
    }
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
    if (dnnl_) return backward_dnnl(dy);
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
  bool uses_onednn() const noexcept { return dnnl_ != nullptr; }
  void use_onednn(bool on) {
    if constexpr (detail::serves_onednn<T>) {
      detail::use_onednn(dnnl_, on, "conv2d",
                         [&] { return std::make_unique<detail::onednn_conv>(c_, o_, k_, s_, p_, has_bias_); });
    } else {
      detail::require(!on, "conv2d: oneDNN serves float convolutions, and only where braid::nn was built with it");
    }
  }
  // oneDNN only: x and dx (in), y and dy (out) in oneDNN's channel-blocked layout
  // (onednn::layout(true), nn/onednn.hpp) instead of NCHW, the shape still [N, C, H, W]. resnet() sets this between
  // its own layers; the channel counts must be multiples of oneDNN's channel block.
  void set_blocked(bool in, bool out) {
    if constexpr (detail::serves_onednn<T>) {
      const int b = detail::onednn_block();
      detail::require(dnnl_ && b > 0 && (!in || c_ % b == 0) && (!out || o_ % b == 0),
                      "conv2d: blocked activations need oneDNN and channel counts that are multiples of its block");
      dnnl_ = std::make_unique<detail::onednn_conv>(c_, o_, k_, s_, p_, has_bias_, in, out);
    } else {
      detail::require(!in && !out, "conv2d: blocked activations need oneDNN (float layers)");
    }
  }
  // The oneDNN implementations in use ("" on the BLAS path or before the first forward).
  std::string onednn_impl() const { return dnnl_ ? dnnl_->impl() : ""; }

private:
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
  // The oneDNN side (absent on the im2col + BLAS path).
  std::unique_ptr<detail::onednn_conv> dnnl_ =
      detail::serves_onednn<T> ? std::make_unique<detail::onednn_conv>(c_, o_, k_, s_, p_, has_bias_) : nullptr;
};

} // namespace braid::nn
