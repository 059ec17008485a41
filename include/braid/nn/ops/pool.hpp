// braid/nn/ops/pool.hpp — relu, add, max and average pooling, global average pooling.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.hpp"

namespace braid::nn::ops {

// y = max(x, 0)
template <class T> struct relu_forward {
  const T* x;
  T* y;
  BRAID_HD void operator()(std::int64_t i) const { y[i] = x[i] > T(0) ? x[i] : T(0); }
};
// dx = dy where the forward output was positive, else 0 (both loads unconditional, so that the host
// loop vectorises)
template <class T> struct relu_backward {
  const T* y;
  const T* dy;
  T* dx;
  BRAID_HD void operator()(std::int64_t i) const {
    const T g = dy[i];
    dx[i] = y[i] > T(0) ? g : T(0);
  }
};
// y = a + b
template <class T> struct add_forward {
  const T* a;
  const T* b;
  T* y;
  BRAID_HD void operator()(std::int64_t i) const { y[i] = a[i] + b[i]; }
};

// k x k windows with stride s over nc planes of h x w (no padding; a partial window at the edge is
// dropped): ho = (h - k) / s + 1, wo likewise.
struct pool_shape {
  std::int64_t nc;
  int h, w, ho, wo, k, s;
};
// One output of max pooling (the first maximum in row-major window order; arg = its offset in the
// plane) or average pooling.
template <class T, bool Max> struct pool_forward {
  const T* x;
  T* y;
  std::int32_t* arg; // max only
  pool_shape g;
  BRAID_HD void operator()(std::int64_t o) const {
    const std::int64_t plane = std::int64_t(g.ho) * g.wo;
    const std::int64_t p = o / plane;
    const int r = int(o - p * plane), oy = r / g.wo, ox = r - oy * g.wo;
    const T* xi = x + p * g.h * g.w;
    if constexpr (Max) {
      int best = (oy * g.s) * g.w + ox * g.s;
      for (int i = 0; i < g.k; ++i)
        for (int j = 0; j < g.k; ++j) {
          const int at = (oy * g.s + i) * g.w + ox * g.s + j;
          if (xi[at] > xi[best]) best = at;
        }
      y[o] = xi[best];
      arg[o] = best;
    } else {
      T sum = 0;
      for (int i = 0; i < g.k; ++i)
        for (int j = 0; j < g.k; ++j) sum += xi[(oy * g.s + i) * g.w + ox * g.s + j];
      y[o] = sum / T(g.k * g.k);
    }
  }
};
// One input gradient of pooling, gathered from the outputs whose windows hold it, in output order
// (what a scatter over the outputs in order adds, in the same order).
template <class T, bool Max> struct pool_backward {
  const T* dy;
  const std::int32_t* arg; // max only
  T* dx;
  pool_shape g;
  BRAID_HD void operator()(std::int64_t e) const {
    const std::int64_t plane = std::int64_t(g.h) * g.w;
    const std::int64_t p = e / plane;
    const int at = int(e - p * plane), iy = at / g.w, ix = at - iy * g.w;
    // Outputs oy with oy*s <= iy < oy*s + k, likewise ox.
    const int oy0 = iy - g.k + 1 <= 0 ? 0 : (iy - g.k + 1 + g.s - 1) / g.s, oy1 = iy / g.s < g.ho - 1 ? iy / g.s : g.ho - 1;
    const int ox0 = ix - g.k + 1 <= 0 ? 0 : (ix - g.k + 1 + g.s - 1) / g.s, ox1 = ix / g.s < g.wo - 1 ? ix / g.s : g.wo - 1;
    T acc = 0;
    for (int oy = oy0; oy <= oy1; ++oy)
      for (int ox = ox0; ox <= ox1; ++ox) {
        const std::int64_t o = (p * g.ho + oy) * g.wo + ox;
        if constexpr (Max) {
          if (arg[o] == at) acc += dy[o];
        } else {
          acc += dy[o] / T(g.k * g.k);
        }
      }
    dx[e] = acc;
  }
};

// [N, C, H, W] -> [N, C]: one plane's mean (a sequential sum).
template <class T> struct global_avgpool_forward {
  const T* x;
  T* y;
  std::int64_t hw;
  BRAID_HD void operator()(std::int64_t p) const {
    T s = 0;
    for (std::int64_t j = 0; j < hw; ++j) s += x[p * hw + j];
    y[p] = s / T(hw);
  }
};
template <class T> struct global_avgpool_backward {
  const T* dy;
  T* dx;
  std::int64_t hw;
  BRAID_HD void operator()(std::int64_t e) const { dx[e] = dy[e / hw] / T(hw); }
};

} // namespace braid::nn::ops
