// braid/nn/optim.hpp — optimizers (SGD with momentum/Nesterov/weight decay, Adam, AdamW, LAMB),
// learning-rate schedules (step, linear warmup, cosine) and clipping by global norm.
//
// An optimizer updates the parameters it was given from their .grad, in place, at the learning rate
// passed to step(lr) (a schedule computes it). Update rules follow the published definitions, in the
// form PyTorch implements them; each is written out above its class. All arithmetic per element is in
// double and rounded once to the parameter's type. The per-element arithmetic is rules.hpp's, which the
// fused device optimizers (optim_device.cuh) share.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "layers.hpp"
#include "rules.hpp"

namespace braid::nn {

template <class T> class optimizer {
public:
  explicit optimizer(std::vector<parameter*> params) : params_(std::move(params)) {}
  virtual ~optimizer() = default;
  // One update with learning rate lr; counts the step.
  void step(double lr) {
    ++t_;
    for (std::size_t i = 0; i < params_.size(); ++i) update(i, lr);
  }
  virtual std::string name() const = 0;
  std::int64_t steps() const noexcept { return t_; }
  // What a checkpoint saves: the step count and every state tensor, in a fixed order.
  std::int64_t& step_counter() noexcept { return t_; }
  std::vector<tensor*> state() {
    std::vector<tensor*> s;
    for (auto& v : state_)
      for (auto& t : v) s.push_back(&t);
    return s;
  }
  const std::vector<parameter*>& params() const noexcept { return params_; }

protected:
  // Allocates `k` zeroed state tensors per parameter (momentum, moments).
  void make_state(int k) {
    state_.resize(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i)
      for (int j = 0; j < k; ++j) state_[i].push_back(tensor::zeros(params_[i]->value.shape(), dtype_of_v<T>));
  }
  virtual void update(std::size_t i, double lr) = 0;
  std::vector<parameter*> params_;
  std::vector<std::vector<tensor>> state_;
  std::int64_t t_ = 0;
};

// SGD (PyTorch's form of Sutskever et al. 2013 momentum):
//   g = grad + wd * p
//   b = g on the first step, else mu * b + (1 - dampening) * g          (when mu != 0)
//   g = g + mu * b (Nesterov)  or  g = b                                 (when mu != 0)
//   p = p - lr * g
template <class T> class sgd : public optimizer<T> {
public:
  sgd(std::vector<parameter*> params, double momentum = 0, double weight_decay = 0, bool nesterov = false,
      double dampening = 0)
      : optimizer<T>(std::move(params)), mu_(momentum), wd_(weight_decay), nesterov_(nesterov), damp_(dampening) {
    if (nesterov && (momentum <= 0 || dampening != 0))
      raise(errc::invalid_argument, "sgd: Nesterov needs momentum > 0 and dampening 0");
    this->make_state(1);
  }
  std::string name() const override { return nesterov_ ? "sgd-nesterov" : "sgd"; }

protected:
  void update(std::size_t i, double lr) override {
    parameter& p = *this->params_[i];
    T* w = p.value.template data<T>();
    const T* g = p.grad.template data<T>();
    T* b = this->state_[i][0].template data<T>();
    const rules::sgd_args a{lr, mu_, wd_, damp_, nesterov_, this->t_ == 1};
    for (std::int64_t j = 0; j < p.value.numel(); ++j) rules::sgd(w[j], g[j], b[j], a);
  }

private:
  double mu_, wd_;
  bool nesterov_;
  double damp_;
};

// Adam (Kingma & Ba 2015), with L2 weight decay added to the gradient; AdamW (Loshchilov & Hutter
// 2019) instead decays the weight directly, decoupled from the moments:
//   AdamW only: p = p * (1 - lr * wd)          Adam only: g = grad + wd * p
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
template <class T> class adam : public optimizer<T> {
public:
  adam(std::vector<parameter*> params, double weight_decay = 0, bool decoupled = false, double beta1 = 0.9,
       double beta2 = 0.999, double eps = 1e-8)
      : optimizer<T>(std::move(params)), wd_(weight_decay), decoupled_(decoupled), b1_(beta1), b2_(beta2), eps_(eps) {
    this->make_state(2);
  }
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }

protected:
  void update(std::size_t i, double lr) override {
    parameter& p = *this->params_[i];
    T* w = p.value.template data<T>();
    const T* g = p.grad.template data<T>();
    T* m = this->state_[i][0].template data<T>();
    T* v = this->state_[i][1].template data<T>();
    const double c1 = 1 - std::pow(b1_, double(this->t_)), c2 = 1 - std::pow(b2_, double(this->t_));
    const rules::adam_args a{lr, wd_, b1_, b2_, eps_, c1, c2, decoupled_};
    for (std::int64_t j = 0; j < p.value.numel(); ++j) rules::adam(w[j], g[j], m[j], v[j], a);
  }

private:
  double wd_;
  bool decoupled_;
  double b1_, b2_, eps_;
};
template <class T> std::unique_ptr<optimizer<T>> make_adamw(std::vector<parameter*> p, double wd) {
  return std::make_unique<adam<T>>(std::move(p), wd, true);
}

// LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2, with Adam's bias
// correction), per parameter tensor (the paper's "layer"):
//   m, v as in Adam;  r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p
//   trust = ||p|| / ||r||  when both norms are > 0, else 1
//   p = p - lr * trust * r
template <class T> class lamb : public optimizer<T> {
public:
  lamb(std::vector<parameter*> params, double weight_decay = 0, double beta1 = 0.9, double beta2 = 0.999,
       double eps = 1e-6)
      : optimizer<T>(std::move(params)), wd_(weight_decay), b1_(beta1), b2_(beta2), eps_(eps) {
    this->make_state(2);
  }
  std::string name() const override { return "lamb"; }
  double last_trust_ratio() const noexcept { return trust_; }

protected:
  void update(std::size_t i, double lr) override {
    parameter& p = *this->params_[i];
    const std::int64_t n = p.value.numel();
    T* w = p.value.template data<T>();
    const T* g = p.grad.template data<T>();
    T* m = this->state_[i][0].template data<T>();
    T* v = this->state_[i][1].template data<T>();
    const double c1 = 1 - std::pow(b1_, double(this->t_)), c2 = 1 - std::pow(b2_, double(this->t_));
    const rules::lamb_args a{wd_, b1_, b2_, eps_, c1, c2};
    r_.resize(std::size_t(n));
    double wn = 0, rn = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const rules::lamb_step s = rules::lamb(w[j], g[j], m[j], v[j], a);
      m[j] = T(s.m);
      v[j] = T(s.v);
      r_[std::size_t(j)] = s.r;
      wn += double(w[j]) * double(w[j]);
      rn += s.r * s.r;
    }
    trust_ = rules::lamb_trust(wn, rn);
    for (std::int64_t j = 0; j < n; ++j) w[j] = T(double(w[j]) - lr * trust_ * r_[std::size_t(j)]);
  }

private:
  double wd_, b1_, b2_, eps_;
  double trust_ = 1;
  std::vector<double> r_;
};

// Scales every gradient by max_norm / (norm + 1e-6) when their global L2 norm exceeds max_norm (as
// torch.nn.utils.clip_grad_norm_ does); returns the norm before clipping.
inline double clip_grad_norm(const std::vector<parameter*>& params, double max_norm) {
  double s = 0;
  for (parameter* p : params)
    visit(p->grad.type(), [&](auto tag) {
      using E = typename decltype(tag)::type;
      if constexpr (std::is_same_v<E, float> || std::is_same_v<E, double>) {
        const E* g = p->grad.template data<E>();
        for (std::int64_t j = 0; j < p->grad.numel(); ++j) s += double(g[j]) * double(g[j]);
      }
    });
  const double norm = std::sqrt(s);
  if (norm > max_norm) {
    const double f = max_norm / (norm + 1e-6);
    for (parameter* p : params)
      visit(p->grad.type(), [&](auto tag) {
        using E = typename decltype(tag)::type;
        if constexpr (std::is_same_v<E, float> || std::is_same_v<E, double>) {
          E* g = p->grad.template data<E>();
          for (std::int64_t j = 0; j < p->grad.numel(); ++j) g[j] = E(double(g[j]) * f);
        }
      });
  }
  return norm;
}

// Learning-rate schedules: pure functions of the step (0-based), so a checkpoint needs only the step.
struct schedule {
  enum class kind { constant, step, cosine } shape = kind::constant;
  double base = 0.1;
  std::int64_t warmup = 0;    // linear warmup: lr = base * (t + 1) / warmup for t < warmup
  std::int64_t step_size = 1; // step: lr = base * gamma^floor((t - warmup) / step_size)
  double gamma = 0.1;
  std::int64_t total = 1;     // cosine: from base at t = warmup to min_lr at t = total
  double min_lr = 0;

  static schedule constant_lr(double lr) { return schedule{kind::constant, lr}; }
  static schedule step_lr(double lr, std::int64_t step_size, double gamma, std::int64_t warmup = 0) {
    schedule s{kind::step, lr, warmup};
    s.step_size = step_size;
    s.gamma = gamma;
    return s;
  }
  static schedule cosine_lr(double lr, std::int64_t total, std::int64_t warmup = 0, double min_lr = 0) {
    schedule s{kind::cosine, lr, warmup};
    s.total = total;
    s.min_lr = min_lr;
    return s;
  }

  double at(std::int64_t t) const {
    if (t < warmup) return base * double(t + 1) / double(warmup);
    const std::int64_t u = t - warmup;
    switch (shape) {
    case kind::constant: return base;
    case kind::step: return base * std::pow(gamma, double(u / std::max<std::int64_t>(step_size, 1)));
    case kind::cosine: {
      const std::int64_t span = std::max<std::int64_t>(total - warmup, 1);
      const double f = double(std::min(u, span)) / double(span);
      return min_lr + (base - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * f));
    }
    }
    return base;
  }
};

} // namespace braid::nn
