// braid/nn/loss.hpp — softmax cross-entropy over a batch of logits.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

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
    labels_ = labels;
    p_ = tensor(logits.shape(), dtype_of_v<T>);
    const T* z = logits.data<T>();
    T* p = p_.data<T>();
    double total = 0;
    correct_ = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int32_t y = labels[std::size_t(i)];
      if (y < 0 || y >= k) raise(errc::invalid_argument, "softmax_cross_entropy: label out of range");
      const T* zi = z + i * k;
      std::int64_t arg = 0;
      for (std::int64_t j = 1; j < k; ++j)
        if (zi[j] > zi[arg]) arg = j;
      if (arg == y) ++correct_;
      const double mx = double(zi[arg]);
      double s = 0;
      for (std::int64_t j = 0; j < k; ++j) s += std::exp(double(zi[j]) - mx);
      const double lse = mx + std::log(s);
      for (std::int64_t j = 0; j < k; ++j) p[i * k + j] = T(std::exp(double(zi[j]) - lse));
      total += lse - double(zi[y]);
    }
    return n ? total / double(n) : 0.0;
  }
  tensor backward(double scale = 1.0) const {
    tensor d(p_.shape(), dtype_of_v<T>);
    const std::int64_t n = p_.dim(0), k = p_.dim(1);
    const T* p = p_.data<T>();
    T* g = d.data<T>();
    const T f = T(scale / double(n));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < k; ++j)
        g[i * k + j] = f * (p[i * k + j] - (j == labels_[std::size_t(i)] ? T(1) : T(0)));
    return d;
  }
  std::int64_t correct() const noexcept { return correct_; }

private:
  tensor p_;
  std::vector<std::int32_t> labels_;
  std::int64_t correct_ = 0;
};

} // namespace braid::nn
