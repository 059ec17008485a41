// braid/nn/rules.hpp — the per-element arithmetic of braid::nn's optimizers and mixed precision,
// written once: the host loops (optim.hpp, ddp.hpp's mixed_precision) and the fused device kernels
// (optim_device.cuh) call these same functions, so an update rule has one text. Every function is
// BRAID_HD (host and device under nvcc; plain inline functions elsewhere) and uses nothing but
// arithmetic, sqrt and braid's 16-bit float types.
//
// Arithmetic per element is in double and rounded once to the stored type T, as optim.hpp documents.
// On a GPU, nvcc may contract a * b + c into one fused multiply-add where the host compiler does not,
// so a device result may differ from the host's in the last bit of the double before rounding; every
// rank runs the same binary, so every rank still gets the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "../core/config.hpp"
#include "../core/float16.hpp"

namespace braid::nn::rules {

// sqrt of a double in host and device code (std::sqrt is host-only to nvcc; ::sqrt is both).
BRAID_HD double root(double x) noexcept { return ::sqrt(x); }

// SGD with momentum, dampening, Nesterov and L2 weight decay (optim.hpp's sgd, PyTorch's form).
struct sgd_args {
  double lr = 0, momentum = 0, weight_decay = 0, dampening = 0;
  bool nesterov = false;
  bool first = false; // the optimizer's first step: the momentum buffer starts at the gradient
};
template <class T> BRAID_HD void sgd(T& w, T g, T& buf, const sgd_args& a) noexcept {
  double d = double(g) + a.weight_decay * double(w);
  if (a.momentum != 0) {
    const double b = a.first ? d : a.momentum * double(buf) + (1 - a.dampening) * d;
    buf = T(b);
    d = a.nesterov ? d + a.momentum * b : b;
  }
  w = T(double(w) - a.lr * d);
}

// Adam with L2 weight decay, or AdamW (decoupled) (optim.hpp's adam). c1 = 1 - beta1^t and
// c2 = 1 - beta2^t are the bias corrections of step t (1-based).
struct adam_args {
  double lr = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, c1 = 1, c2 = 1;
  bool decoupled = false;
};
template <class T> BRAID_HD void adam(T& w, T g, T& m, T& v, const adam_args& a) noexcept {
  double x = double(w), d = double(g);
  if (a.decoupled) x *= 1 - a.lr * a.weight_decay;
  else d += a.weight_decay * x;
  const double mj = a.beta1 * double(m) + (1 - a.beta1) * d;
  const double vj = a.beta2 * double(v) + (1 - a.beta2) * d * d;
  m = T(mj);
  v = T(vj);
  w = T(x - a.lr * (mj / a.c1) / (root(vj / a.c2) + a.eps));
}

// LAMB's per-element part (optim.hpp's lamb): the new moments, unrounded, and the update direction
// r = (m / c1) / (sqrt(v / c2) + eps) + wd * w. The caller stores T(m) and T(v), sums w^2 and r^2
// over the parameter tensor, and applies w - lr * trust * r with trust = ||w|| / ||r||.
struct lamb_args {
  double weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-6, c1 = 1, c2 = 1;
};
struct lamb_step {
  double m, v, r;
};
template <class T> BRAID_HD lamb_step lamb(T w, T g, T m, T v, const lamb_args& a) noexcept {
  const double d = double(g);
  const double mj = a.beta1 * double(m) + (1 - a.beta1) * d;
  const double vj = a.beta2 * double(v) + (1 - a.beta2) * d * d;
  return {mj, vj, (mj / a.c1) / (root(vj / a.c2) + a.eps) + a.weight_decay * double(w)};
}
// The trust ratio from the two sums of squares: ||w|| / ||r|| when both norms are > 0, else 1.
BRAID_HD double lamb_trust(double w_squares, double r_squares) noexcept {
  const double wn = root(w_squares), rn = root(r_squares);
  return (wn > 0 && rn > 0) ? wn / rn : 1.0;
}

// Mixed precision (ddp.hpp's mixed_precision): a float rounded to the compute type (bfloat16 or
// half, to nearest even) and returned as float.
BRAID_HD float round_to(float v, bool bf16) noexcept { return bf16 ? float(bfloat16(v)) : float(half(v)); }
// inf or NaN, from the bits (no <cmath> classification function is both host and device).
BRAID_HD bool finite(float v) noexcept { return (braid::detail::bit_cast<std::uint32_t>(v) & 0x7f800000u) != 0x7f800000u; }
// One scaled gradient: rounded to the compute type as a low-precision backward would store it,
// checked, then multiplied by inv_scale (float(1 / scale)). Returns false when the rounded value is
// inf or NaN (the step must be skipped).
BRAID_HD bool unscale(float& g, bool bf16, float inv_scale) noexcept {
  const float r = round_to(g, bf16);
  g = r * inv_scale;
  return finite(r);
}

// Dynamic loss scaling (ddp.hpp's loss_scaler): one step's outcome. On an overflow the scale is
// multiplied by backoff, the clean-step count reset and the step skipped; otherwise, after `interval`
// clean steps in a row, the scale is multiplied by growth. Returns whether the step is applied.
struct scaler_state {
  double scale = 65536.0;
  std::int32_t clean = 0;
  std::int32_t overflow = 0; // this step's flag (device scaler: set by unscale, cleared by the update)
  std::uint64_t skipped = 0;
  std::int32_t applied = 1;  // the last update's outcome (device scaler: read by the optimizer step)
};
BRAID_HD bool scaler_update(scaler_state& s, bool overflow, int interval, double growth, double backoff) noexcept {
  s.applied = overflow ? 0 : 1;
  if (overflow) {
    s.scale *= backoff;
    s.clean = 0;
    ++s.skipped;
    return false;
  }
  if (++s.clean >= interval) {
    s.scale *= growth;
    s.clean = 0;
  }
  return true;
}

} // namespace braid::nn::rules
