// braid/nn/ops/channels.hpp — per-channel sums in a fixed order (host and device alike) and batch normalisation.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.hpp"

namespace braid::nn::ops {

// Per-channel sums in an order that many blocks of threads compute in parallel and the host in one
// pass, with the same bits. Channel c's m = n*hw elements, numbered k = i*hw + j (image i, pixel j),
// go to partial k % channel_parts (4096 partials); each partial adds its elements in increasing k.
// The partials form channel_groups = 16 groups of channel_group = 256 consecutive partials (group g:
// partials 256g .. 256g + 255); each group is added pairwise in a fixed tree (part[p] += part[p + s]
// for s = 128, 64, ..., 1, all p < s, p relative to the group), and then the 16 group sums in the same
// kind of tree (s = 8, 4, 2, 1): channel_tree. On a device, one block per (channel, group) computes
// the group's partials (its threads take partials t, t + block, ...: consecutive threads on
// consecutive elements, the result independent of the block size) and its tree, and a second step
// adds the 16 group sums (fused::bn_stats, fused::bn_grad_sums); the host adds element k into
// partial k % channel_parts as it walks k (channel_sum). The order depends on the shape only.
inline constexpr int channel_group = 256;
inline constexpr int channel_groups = 16;
inline constexpr int channel_parts = channel_group * channel_groups;
// Walking one channel's elements of [n, C, hw] without a division per element: element k sits at
// e = (i*C + c)*hw + j; k -> k + channel_parts moves (i, j) by (parts / hw, parts % hw) with a carry.
struct channel_walk {
  std::int64_t m, C, hw;
  std::int64_t step; // e's step for k += channel_parts, before the carry
  std::int64_t dj;   // j's step (channel_parts % hw)
  std::int64_t wrap; // e's extra step when j carries past hw (the next image of the channel)
  // Element index of channel c's element k (one division).
  BRAID_HD std::int64_t at(std::int64_t k, std::int64_t c) const {
    const std::int64_t i = k / hw;
    return (i * C + c) * hw + (k - i * hw);
  }
  // Advance (e, j) by channel_parts elements of the channel.
  BRAID_HD void next(std::int64_t& e, std::int64_t& j) const {
    e += step;
    j += dj;
    if (j >= hw) {
      j -= hw;
      e += wrap;
    }
  }
};
inline channel_walk make_channel_walk(std::int64_t n, std::int64_t C, std::int64_t hw) {
  const std::int64_t di = channel_parts / hw, dj = channel_parts % hw;
  return channel_walk{n * hw, C, hw, di * C * hw + dj, dj, (C - 1) * hw};
}
// Two sums at once (bn_grad_sums).
struct sum2 {
  double a, b;
  BRAID_HD sum2& operator+=(const sum2& o) {
    a += o.a;
    b += o.b;
    return *this;
  }
};
// Partial p (< channel_parts) of channel c: f(e) (e: the element's index in [n, C, hw]) over the
// channel's elements k = p, p + channel_parts, ... < m, in increasing k. Loads `unroll` elements before
// adding them (in the same order: the same bits), so that several loads are in flight.
template <class Acc, int unroll = 8, class F>
BRAID_HD Acc channel_partial(const channel_walk& w, std::int64_t c, std::int64_t p, const F& f) {
  Acc acc{};
  if (p >= w.m) return acc;
  std::int64_t left = (w.m - 1 - p) / channel_parts + 1;
  const std::int64_t i = p / w.hw;
  std::int64_t j = p - i * w.hw, e = (i * w.C + c) * w.hw + j;
  for (; left >= unroll; left -= unroll) {
    std::int64_t at[static_cast<std::size_t>(unroll)];
    BRAID_HD_UNROLL
    for (int u = 0; u < unroll; ++u) {
      at[u] = e;
      w.next(e, j);
    }
    Acc v[static_cast<std::size_t>(unroll)];
    BRAID_HD_UNROLL
    for (int u = 0; u < unroll; ++u) v[u] = f(at[u]);
    BRAID_HD_UNROLL
    for (int u = 0; u < unroll; ++u) acc += v[u];
  }
  for (; left > 0; --left) {
    acc += f(e);
    w.next(e, j);
  }
  return acc;
}
// The fixed tree over n (a power of two) values, in place; v[0] holds the sum after it.
template <class Acc> BRAID_HD void channel_tree(Acc* v, int n) {
  for (int s = n / 2; s >= 1; s /= 2)
    for (int p = 0; p < s; ++p) v[p] += v[p + s];
}
// The host's whole sum of channel c (one pass over k).
template <class Acc, class F> Acc channel_sum(const channel_walk& w, std::int64_t c, const F& f) {
  std::vector<Acc> part(static_cast<std::size_t>(channel_parts));
  int p = 0;
  for (std::int64_t i = 0; i * w.hw < w.m; ++i) {
    const std::int64_t base = (i * w.C + c) * w.hw;
    for (std::int64_t j = 0; j < w.hw; ++j) {
      part[static_cast<std::size_t>(p)] += f(base + j);
      if (++p == channel_parts) p = 0;
    }
  }
  Acc group[channel_groups];
  for (int g = 0; g < channel_groups; ++g) {
    channel_tree(part.data() + std::size_t(g) * channel_group, channel_group);
    group[g] = part[std::size_t(g) * channel_group];
  }
  channel_tree(group, channel_groups);
  return group[0];
}

// Batch normalisation over [n, C, hw], per channel c: the statistics (sums in double in the order
// above: the mean, then the squared deviations from it), the running statistics' update (training;
// unbiased variance), and the channel's mean mu[c] and 1/sqrt(var + eps) invstd[c] in T; in
// evaluation, the running statistics. op(c) on the host; on a device, fused::bn_stats computes the
// two sums (a block per channel and group, then the group sums per channel) and calls finish(c, s, s2).
template <class T> struct bn_stats {
  const T* x;
  std::int64_t n, C, hw;
  double momentum, eps;
  bool training;
  T* running_mean;
  T* running_var;
  T* mu;
  T* invstd;
  // Element e of [n, C, hw], and its squared deviation from `mean` (the terms of the two sums).
  struct value {
    const T* x;
    BRAID_HD double operator()(std::int64_t e) const { return double(x[e]); }
  };
  struct deviation {
    const T* x;
    double mean;
    BRAID_HD double operator()(std::int64_t e) const {
      const double d = double(x[e]) - mean;
      return d * d;
    }
  };
  BRAID_HD value values() const { return {x}; }
  BRAID_HD deviation deviations(double mean) const { return {x, mean}; }
  // s: the sum of the channel's elements; s2: of their squared deviations from s / m (training only).
  BRAID_HD void finish(std::int64_t c, double s, double s2) const {
    const std::int64_t m = n * hw;
    double mean, var;
    if (training) {
      mean = s / double(m);
      var = s2 / double(m);
      running_mean[c] = T((1 - momentum) * double(running_mean[c]) + momentum * mean);
      running_var[c] = T((1 - momentum) * double(running_var[c]) + momentum * (m > 1 ? s2 / double(m - 1) : var));
    } else {
      mean = double(running_mean[c]);
      var = double(running_var[c]);
    }
    invstd[c] = T(1.0 / ::sqrt(var + eps));
    mu[c] = T(mean);
  }
  void operator()(std::int64_t c) const {
    const std::int64_t m = n * hw;
    if (!training) return finish(c, 0, 0);
    const channel_walk w = make_channel_walk(n, C, hw);
    const double s = channel_sum<double>(w, c, values());
    finish(c, s, channel_sum<double>(w, c, deviations(s / double(m))));
  }
};
// One element: xhat = (x - mu) * invstd, y = gamma * xhat + beta.
template <class T> struct bn_apply {
  const T* x;
  const T* mu;
  const T* invstd;
  const T* gamma;
  const T* beta;
  T* xhat;
  T* y;
  std::int64_t C, hw;
  BRAID_HD void operator()(std::int64_t e) const {
    const std::int64_t c = (e / hw) % C;
    const T h = (x[e] - mu[c]) * invstd[c];
    xhat[e] = h;
    y[e] = gamma[c] * h + beta[c];
  }
};
// Per channel: sum(dy) and sum(dy * xhat) in double (in the order of channel_sum), added into the
// parameter gradients (dgamma += sum(dy*xhat), dbeta += sum(dy)), and the channel's coefficients of
// dx in coef[3c..3c+2]: gamma*invstd, sum(dy)/m, sum(dy*xhat)/m. op(c) on the host; on a device a
// block per channel and group, then the group sums per channel (fused::bn_grad_sums), computes the
// sums and calls finish().
template <class T> struct bn_grad_sums {
  const T* dy;
  const T* xhat;
  const T* gamma;
  const T* invstd;
  std::int64_t n, C, hw;
  T* dgamma;
  T* dbeta;
  T* coef;
  // (dy, dy * xhat) of element e of [n, C, hw].
  struct terms {
    const T* dy;
    const T* xhat;
    BRAID_HD sum2 operator()(std::int64_t e) const { return {double(dy[e]), double(dy[e]) * double(xhat[e])}; }
  };
  BRAID_HD terms terms_of() const { return {dy, xhat}; }
  BRAID_HD void finish(std::int64_t c, sum2 s) const {
    const std::int64_t m = n * hw;
    dgamma[c] += T(s.b);
    dbeta[c] += T(s.a);
    coef[3 * c] = gamma[c] * invstd[c];
    coef[3 * c + 1] = T(s.a / double(m));
    coef[3 * c + 2] = T(s.b / double(m));
  }
  void operator()(std::int64_t c) const {
    finish(c, channel_sum<sum2>(make_channel_walk(n, C, hw), c, terms_of()));
  }
};
// One input gradient: training, gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat)); evaluation
// (fixed statistics), gamma*invstd * dy.
template <class T> struct bn_grad_apply {
  const T* dy;
  const T* xhat;
  const T* coef;
  std::int64_t C, hw;
  bool training;
  T* dx;
  BRAID_HD void operator()(std::int64_t e) const {
    const std::int64_t c = (e / hw) % C;
    const T k = coef[3 * c];
    dx[e] = training ? k * (dy[e] - coef[3 * c + 1] - xhat[e] * coef[3 * c + 2]) : k * dy[e];
  }
};

} // namespace braid::nn::ops
