// braid/nn/ops.hpp — the per-element arithmetic of braid::nn's hand-written layers, written once for
// the host loops (layers.hpp, loss.hpp) and the device kernels (layers_device.cuh): one text per layer
// where one text can serve.
//
// Each op is a small struct of pointers and sizes with a BRAID_HD operator()(i) that computes ONE
// output element i (host: a loop over i; device: one thread per i, grid-stride). An output element is
// never written by two i, and every sum an element needs is taken inside its own call in a fixed order,
// so the host and the device compute the same bits (same compiler and no contraction on the emulated
// device; on a GPU, nvcc may contract multiply-adds) and the device needs no atomics. Where a layer's
// natural loop scatters (pooling's and col2im's backward), the op gathers instead, adding each
// output's terms in the order a scatter loop would add them, so it gives that loop's bits.
//
// What is NOT here, and why: the GEMMs (conv2d and linear: a BLAS, cuBLAS on the device), the
// channel statistics of batchnorm2d (a reduction over N*H*W, which a GPU needs as a tree over a block,
// not as the host's sequential sum), the fast row-wise im2col of the host conv (std::copy runs; the
// device uses im2col below, element by element: both are tested against each other), and everything
// oneDNN does on the host.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../core/config.hpp"

#if !defined(BRAID_HD_UNROLL)
#if defined(__CUDA_ARCH__) // nvcc's device pass
#define BRAID_HD_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__) // nvcc's host pass: its host compiler may not know the pragma
#define BRAID_HD_UNROLL
#elif defined(__clang__)
#define BRAID_HD_UNROLL _Pragma("unroll")
#else
#define BRAID_HD_UNROLL _Pragma("GCC unroll 16")
#endif
#endif

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

// Host: runs op(i) for i in [0, n).
template <class Op> inline void for_each_host(std::int64_t n, const Op& op) {
  for (std::int64_t i = 0; i < n; ++i) op(i);
}

} // namespace braid::nn::ops
