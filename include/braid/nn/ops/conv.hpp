// braid/nn/ops/conv.hpp — convolution geometry, im2col and col2im (per image and per batch), layout changes.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.hpp"

namespace braid::nn::ops {

// Convolution geometry: c input channels of h x w, k x k kernel, stride s, padding pad; ho x wo out.
struct conv_shape {
  int c, h, w, k, s, pad, ho, wo;
};
// One element of one image's column matrix [c*k*k, ho*wo], at row `row` and column q = oy*wo + ox:
// col[(ch*k + ki)*k + kj][oy*wo + ox] = x[ch][oy*s - pad + ki][ox*s - pad + kj], 0 outside.
template <class T> BRAID_HD T im2col_at(const T* x, const conv_shape& g, std::int64_t row, int q) {
  const int oy = q / g.wo, ox = q - oy * g.wo;
  const int kj = int(row % g.k), ki = int((row / g.k) % g.k), ch = int(row / (std::int64_t(g.k) * g.k));
  const int iy = oy * g.s - g.pad + ki, ix = ox * g.s - g.pad + kj;
  return (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) ? x[(std::int64_t(ch) * g.h + iy) * g.w + ix] : T(0);
}
// The gradient of input element (ch, iy, ix) of one image, gathered from its column matrix (rows ld
// apart, this image's columns starting at col) over (ki, kj) in order: what the host's col2im adds to
// the element, in its order.
template <class T> BRAID_HD T col2im_at(const T* col, std::int64_t ld, const conv_shape& g, int ch, int iy, int ix) {
  T acc = 0;
  for (int ki = 0; ki < g.k; ++ki) {
    const int ty = iy + g.pad - ki; // = oy * s
    if (ty < 0 || ty % g.s != 0 || ty / g.s >= g.ho) continue;
    for (int kj = 0; kj < g.k; ++kj) {
      const int tx = ix + g.pad - kj;
      if (tx < 0 || tx % g.s != 0 || tx / g.s >= g.wo) continue;
      acc += col[(std::int64_t(ch * g.k + ki) * g.k + kj) * ld + (ty / g.s) * g.wo + tx / g.s];
    }
  }
  return acc;
}
template <class T> struct im2col {
  const T* x; // one image, [c, h, w]
  T* col;     // [c*k*k, ho*wo]
  conv_shape g;
  BRAID_HD void operator()(std::int64_t e) const {
    const std::int64_t hw = std::int64_t(g.ho) * g.wo;
    const std::int64_t row = e / hw;
    col[e] = im2col_at(x, g, row, int(e - row * hw));
  }
};
// One input gradient of one image, from its column matrix [c*k*k, ho*wo].
template <class T> struct col2im {
  const T* col;
  T* dx; // one image, [c, h, w]
  conv_shape g;
  BRAID_HD void operator()(std::int64_t e) const {
    const std::int64_t plane = std::int64_t(g.h) * g.w;
    const int ch = int(e / plane);
    const int at = int(e - std::int64_t(ch) * plane), iy = at / g.w, ix = at - iy * g.w;
    dx[e] = col2im_at(col, std::int64_t(g.ho) * g.wo, g, ch, iy, ix);
  }
};
// Division of dividends n < 2^31 by a fixed divisor 1 <= d < 2^31 as a multiply-high and a shift
// (Granlund and Montgomery; the rounded-up multiplier of CUTLASS's FastDivmod): exact, and the same
// quotient on the host and the device. For index arithmetic in loops over elements, where a 64-bit
// division costs tens of instructions.
struct divider {
  std::uint32_t d = 1, mul = 0, shift = 0;
  static constexpr divider of(std::uint32_t d) {
    divider r;
    r.d = d;
    if (d > 1) {
      std::uint32_t log2 = 0; // ceil(log2 d)
      while ((std::uint64_t(1) << log2) < d) ++log2;
      r.mul = std::uint32_t(((std::uint64_t(1) << (31 + log2)) + d - 1) / d);
      r.shift = log2 - 1;
    }
    return r;
  }
  BRAID_HD std::uint32_t div(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const std::uint32_t hi = __umulhi(n, mul);
#else
    const std::uint32_t hi = std::uint32_t((std::uint64_t(n) * mul) >> 32);
#endif
    return d == 1 ? n : hi >> shift;
  }
};
// A batch of n images [n, c, h, w] -> one column matrix [c*k*k, n*ho*wo] (image i's columns at
// i*ho*wo), so that one GEMM convolves the whole batch. make() chooses 32-bit index arithmetic with
// dividers (narrow) where every index of x and col fits in 31 bits; an op built without make(), or
// too large, takes the 64-bit divisions. Both copy the same elements.
template <class T> struct im2col_batch {
  const T* x;
  T* col;
  conv_shape g;
  std::int64_t n;
  bool narrow = false;
  divider by_ld{}, by_hw{}, by_wo{}, by_kk{}, by_k{};
  static im2col_batch make(const T* x, T* col, const conv_shape& g, std::int64_t n) {
    im2col_batch op{x, col, g, n};
    const std::int64_t hw = std::int64_t(g.ho) * g.wo, ck = std::int64_t(g.c) * g.k * g.k, most = 0x7fffffff;
    if (n > 0 && ck * n * hw <= most && n * g.c * std::int64_t(g.h) * g.w <= most) {
      op.narrow = true;
      op.by_ld = divider::of(std::uint32_t(n * hw));
      op.by_hw = divider::of(std::uint32_t(hw));
      op.by_wo = divider::of(std::uint32_t(g.wo));
      op.by_kk = divider::of(std::uint32_t(g.k * g.k));
      op.by_k = divider::of(std::uint32_t(g.k));
    }
    return op;
  }
  BRAID_HD void operator()(std::int64_t e) const {
    if (!narrow) {
      const std::int64_t hw = std::int64_t(g.ho) * g.wo, ld = n * hw;
      const std::int64_t row = e / ld, r = e - row * ld, i = r / hw;
      col[e] = im2col_at(x + i * g.c * g.h * g.w, g, row, int(r - i * hw));
      return;
    }
    const std::uint32_t u = std::uint32_t(e);
    const std::uint32_t row = by_ld.div(u), r = u - row * by_ld.d, i = by_hw.div(r), q = r - i * by_hw.d;
    const std::uint32_t oy = by_wo.div(q), ox = q - oy * by_wo.d;
    const std::uint32_t ch = by_kk.div(row), rk = row - ch * by_kk.d, ki = by_k.div(rk), kj = rk - ki * by_k.d;
    const int iy = int(oy) * g.s - g.pad + int(ki), ix = int(ox) * g.s - g.pad + int(kj);
    col[e] = (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) ? x[((int(i) * g.c + int(ch)) * g.h + iy) * g.w + ix] : T(0);
  }
};
// The batch's input gradients [n, c, h, w] from its column matrix [c*k*k, n*ho*wo]: col2im_at's sum
// (over ki, then kj, in order). make() as for im2col_batch: narrow, the element's position by
// dividers and the taps' output positions stepped (no division per tap); the same terms added in the
// same order as col2im_at.
template <class T> struct col2im_batch {
  const T* col;
  T* dx;
  conv_shape g;
  std::int64_t n;
  bool narrow = false;
  divider by_plane{}, by_c{}, by_w{}, by_s{};
  static col2im_batch make(const T* col, T* dx, const conv_shape& g, std::int64_t n) {
    col2im_batch op{col, dx, g, n};
    const std::int64_t hw = std::int64_t(g.ho) * g.wo, ck = std::int64_t(g.c) * g.k * g.k, most = 0x7fffffff;
    if (n > 0 && ck * n * hw <= most && n * g.c * std::int64_t(g.h) * g.w <= most && g.h + g.pad <= most / 2 &&
        g.w + g.pad <= most / 2) {
      op.narrow = true;
      op.by_plane = divider::of(std::uint32_t(std::int64_t(g.h) * g.w));
      op.by_c = divider::of(std::uint32_t(g.c));
      op.by_w = divider::of(std::uint32_t(g.w));
      op.by_s = divider::of(std::uint32_t(g.s));
    }
    return op;
  }
  BRAID_HD void operator()(std::int64_t e) const {
    const std::int64_t hw = std::int64_t(g.ho) * g.wo;
    if (!narrow) {
      const std::int64_t plane = std::int64_t(g.h) * g.w, img = plane * g.c;
      const std::int64_t i = e / img, r = e - i * img;
      const int ch = int(r / plane);
      const int at = int(r - std::int64_t(ch) * plane), iy = at / g.w, ix = at - iy * g.w;
      dx[e] = col2im_at(col + i * hw, n * hw, g, ch, iy, ix);
      return;
    }
    // e = (i*c + ch)*plane + iy*w + ix.
    const std::uint32_t u = std::uint32_t(e);
    const std::uint32_t pl = by_plane.div(u), at = u - pl * by_plane.d, iy = by_w.div(at), ix = at - iy * by_w.d;
    const std::uint32_t i = by_c.div(pl), ch = pl - i * by_c.d;
    const std::uint32_t ld = std::uint32_t(n * hw), s = by_s.d;
    const T* base = col + i * std::uint32_t(hw) + ch * std::uint32_t(g.k * g.k) * ld;
    // Tap ki: ty = iy + pad - ki (= oy * s when it counts); (qy, ry) = (ty / s, ty % s), stepped down.
    const std::uint32_t ty0 = iy + std::uint32_t(g.pad), tx0 = ix + std::uint32_t(g.pad);
    const std::uint32_t qy0 = by_s.div(ty0), qx0 = by_s.div(tx0);
    const std::uint32_t ry0 = ty0 - qy0 * s, rx0 = tx0 - qx0 * s;
    T acc = 0;
    std::uint32_t qy = qy0, ry = ry0;
    for (int ki = 0; ki < g.k; ++ki) {
      // ty = ty0 - ki >= 0, ty % s == 0, ty / s < ho
      if (std::uint32_t(ki) <= ty0 && ry == 0 && qy < std::uint32_t(g.ho)) {
        std::uint32_t qx = qx0, rx = rx0;
        for (int kj = 0; kj < g.k; ++kj) {
          if (std::uint32_t(kj) <= tx0 && rx == 0 && qx < std::uint32_t(g.wo))
            acc += base[std::uint32_t(ki * g.k + kj) * ld + qy * std::uint32_t(g.wo) + qx];
          if (rx == 0) {
            rx = s - 1;
            --qx;
          } else {
            --rx;
          }
        }
      }
      if (ry == 0) {
        ry = s - 1;
        --qy;
      } else {
        --ry;
      }
    }
    dx[e] = acc;
  }
};
// [o, n*hw] (a GEMM's output over the batch's column matrix) -> [n, o, hw] (NCHW), one element.
template <class T> struct cn_to_nchw {
  const T* src;
  T* dst;
  std::int64_t o, n, hw;
  BRAID_HD void operator()(std::int64_t e) const {
    const std::int64_t i = e / (o * hw), r = e - i * o * hw, c = r / hw, j = r - c * hw;
    dst[e] = src[c * n * hw + i * hw + j];
  }
};
// [n, o, hw] -> [o, n*hw], one element.
template <class T> struct nchw_to_cn {
  const T* src;
  T* dst;
  std::int64_t o, n, hw;
  BRAID_HD void operator()(std::int64_t e) const {
    const std::int64_t c = e / (n * hw), r = e - c * n * hw, i = r / hw, j = r - i * hw;
    dst[e] = src[(i * o + c) * hw + j];
  }
};

} // namespace braid::nn::ops
