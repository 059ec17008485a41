// braid/nn/ops/loss.hpp — linear layers' bias and softmax cross-entropy.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.hpp"

namespace braid::nn::ops {

// Linear layers' bias: every row of y [n, out] starts as b (one element), and db[o] += the column
// sum of dy, row by row in order (one column).
template <class T> struct bias_rows {
  const T* b;
  T* y;
  std::int64_t out;
  BRAID_HD void operator()(std::int64_t e) const { y[e] = b[e % out]; }
};
template <class T> struct bias_grad {
  const T* dy;
  T* db;
  std::int64_t n, out;
  BRAID_HD void operator()(std::int64_t o) const {
    T acc = db[o];
    for (std::int64_t i = 0; i < n; ++i) acc += dy[i * out + o];
    db[o] = acc;
  }
};

// Softmax cross-entropy, one row of [n, k] logits: the probabilities, the row's loss
// (log-sum-exp minus the label's logit, in double) and whether its first arg-max is the label.
template <class T> struct softmax_ce_forward {
  const T* z;
  const std::int32_t* labels;
  T* p;
  double* loss;         // per row
  std::int32_t* right;  // per row: 1 when the arg-max is the label
  std::int64_t k;
  BRAID_HD void operator()(std::int64_t i) const {
    const T* zi = z + i * k;
    const std::int32_t y = labels[i];
    std::int64_t arg = 0;
    for (std::int64_t j = 1; j < k; ++j)
      if (zi[j] > zi[arg]) arg = j;
    right[i] = arg == y ? 1 : 0;
    const double mx = double(zi[arg]);
    double s = 0;
    for (std::int64_t j = 0; j < k; ++j) s += ::exp(double(zi[j]) - mx);
    const double lse = mx + ::log(s);
    for (std::int64_t j = 0; j < k; ++j) p[i * k + j] = T(::exp(double(zi[j]) - lse));
    loss[i] = lse - double(zi[y]);
  }
};
// d(scale * mean loss)/dlogits = f * (p - onehot), f = scale / n, one element. With scale_at set
// (the device loss scaler's scale, read where the kernel runs: no host synchronisation), f is
// T(*scale_at / rows) instead, the same expression the host computes from a scale it holds.
template <class T> struct softmax_ce_backward {
  const T* p;
  const std::int32_t* labels;
  T* g;
  T f;
  std::int64_t k;
  const double* scale_at = nullptr;
  std::int64_t rows = 1;
  BRAID_HD void operator()(std::int64_t e) const {
    const std::int64_t i = e / k, j = e - i * k;
    const T fe = scale_at ? T(*scale_at / double(rows)) : f;
    g[e] = fe * (p[e] - (j == labels[i] ? T(1) : T(0)));
  }
};

// One call (i = 0): adds n rows' losses, in row order, and their count of right answers into
// sums[0] and sums[1] (a running total the host reads back when it wants it).
struct ce_accumulate {
  const double* loss;
  const std::int32_t* right;
  std::int64_t n;
  double* sums;
  BRAID_HD void operator()(std::int64_t) const {
    double l = 0, r = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      l += loss[i];
      r += double(right[i]);
    }
    sums[0] += l;
    sums[1] += r;
  }
};

} // namespace braid::nn::ops
