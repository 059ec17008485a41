// braid/nn/layers/norm.hpp — batchnorm2d: per-channel normalisation, oneDNN for float where braid::nn has it.
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
    if (dnnl_) return forward_dnnl(x, n * hw);
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
    if (dnnl_) return backward_dnnl(dy);
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
  bool uses_onednn() const noexcept { return dnnl_ != nullptr; }
  void use_onednn(bool on) {
    if constexpr (detail::serves_onednn<T>) {
      detail::use_onednn(dnnl_, on, "batchnorm2d", [&] { return std::make_unique<detail::onednn_bnorm>(c_, eps_); });
    } else {
      detail::require(!on, "batchnorm2d: oneDNN serves float layers, and only where braid::nn was built with it");
    }
  }
  // oneDNN only: x, y, dy and dx in oneDNN's channel-blocked layout (see conv2d::set_blocked).
  void set_blocked(bool on) {
    if constexpr (detail::serves_onednn<T>) {
      const int b = detail::onednn_block();
      detail::require(dnnl_ && (!on || (b > 0 && c_ % b == 0)),
                      "batchnorm2d: blocked activations need oneDNN and a channel count that is a multiple of its block");
      dnnl_ = std::make_unique<detail::onednn_bnorm>(c_, eps_, on);
    } else {
      detail::require(!on, "batchnorm2d: blocked activations need oneDNN (float layers)");
    }
  }

private:
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
  int c_;
  double mom_, eps_;
  parameter gamma_, beta_;
  tensor mean_, var_, xhat_, invstd_;
  tensor x_, bmean_, bvar_; // the oneDNN path keeps the input and the statistics it normalised with
  // The oneDNN side (absent on the hand-written path).
  std::unique_ptr<detail::onednn_bnorm> dnnl_ =
      detail::serves_onednn<T> ? std::make_unique<detail::onednn_bnorm>(c_, eps_) : nullptr;
};

} // namespace braid::nn
