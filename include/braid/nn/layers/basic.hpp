// braid/nn/layers/basic.hpp — relu, add, max and average pooling, global average pooling, flatten, linear.
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

} // namespace braid::nn
