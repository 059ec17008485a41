// braid/nn/loss.hpp — softmax cross-entropy over a batch of logits.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops.hpp"
#include "tensor.hpp"

namespace braid::nn {

// loss = mean over the batch of -log softmax(logits[i])[label[i]]. forward() keeps the probabilities;
// backward(scale) returns d(scale * loss)/dlogits = scale * (p - onehot) / N. `correct` counts the
// rows whose arg-max (first maximum) equals the label.
template <class T> class softmax_cross_entropy {
public:
  double forward(const tensor& logits, const std::vector<std::int32_t>& labels) {
    if (logits.shape().rank() != 2 || logits.dim(0) != std::int64_t(labels.size()))
      raise(errc::invalid_argument, "softmax_cross_entropy: logits " + logits.shape().str() + " for " +
                                        std::to_string(labels.size()) + " labels");
    const std::int64_t n = logits.dim(0), k = logits.dim(1);
    for (const std::int32_t y : labels)
      if (y < 0 || y >= k) raise(errc::invalid_argument, "softmax_cross_entropy: label out of range");
    labels_ = labels;
    p_ = tensor(logits.shape(), dtype_of_v<T>);
    std::vector<double> loss(std::size_t(n), 0.0);
    std::vector<std::int32_t> right(std::size_t(n), 0);
    ops::for_each_host(n, ops::softmax_ce_forward<T>{logits.data<T>(), labels_.data(), p_.data<T>(), loss.data(), right.data(), k});
    double total = 0; // in row order
    correct_ = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      total += loss[std::size_t(i)];
      correct_ += right[std::size_t(i)];
    }
    return n ? total / double(n) : 0.0;
  }
  tensor backward(double scale = 1.0) const {
    tensor d(p_.shape(), dtype_of_v<T>);
    const std::int64_t n = p_.dim(0), k = p_.dim(1);
    ops::for_each_host(n * k, ops::softmax_ce_backward<T>{p_.data<T>(), labels_.data(), d.data<T>(), T(scale / double(n)), k});
    return d;
  }
  std::int64_t correct() const noexcept { return correct_; }

private:
  tensor p_;
  std::vector<std::int32_t> labels_;
  std::int64_t correct_ = 0;
};

} // namespace braid::nn
