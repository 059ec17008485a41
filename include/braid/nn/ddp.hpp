// braid/nn/ddp.hpp — data parallel training over a braid::communicator, and mixed precision.
//
// ddp<T> wraps a module that every rank builds the same way:
//  * construction broadcasts every parameter and buffer from rank 0, so all ranks start equal;
//  * parameters are grouped in buckets in the order backward produces their gradients (the reverse
//    of registration order): the first bucket holds up to first_bucket_bytes (1 MiB), the others
//    up to bucket_bytes (25 MiB); a parameter larger than a cap gets a bucket of its own;
//  * during backward, the moment a bucket's last gradient is final (the layers' grad hook), the
//    bucket is copied into one flat buffer, averaged over the ranks with all_reduce(avg), and copied
//    back, before backward goes on to earlier layers. Buckets are reduced in bucket order on every
//    rank (a bucket that fills early waits for the ones before it), so all ranks issue the same
//    collectives in the same order. On the host backend the all_reduce runs inline on the calling
//    thread: it interleaves with backward but does not run concurrently with it;
//  * inside a no_sync() scope, backward only accumulates gradients locally; the first backward
//    outside it averages the accumulated sums.
// After backward returns, every rank holds bit-identical averaged gradients (braid's all_reduce gives
// the same bits on every rank), so identical optimizers keep the replicas identical.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "../braid.hpp"
#include "layers.hpp"
#include "optim.hpp"
#include "rules.hpp"

namespace braid::nn {

struct ddp_options {
  std::size_t bucket_bytes = std::size_t(25) << 20;
  std::size_t first_bucket_bytes = std::size_t(1) << 20;
  dtype comm_type = dtype::float32; // float32, or bfloat16 or float16 (summed in float) to halve the traffic
  bool broadcast_at_start = true;
};

template <class T> class ddp {
public:
  ddp(module<T>& m, communicator& comm, ddp_options opts = {}) : m_(m), comm_(comm), opts_(opts) {
    if (opts.comm_type != dtype::float32 && opts.comm_type != dtype::bfloat16 && opts.comm_type != dtype::float16 &&
        opts.comm_type != dtype_of_v<T>)
      raise(errc::invalid_argument, "ddp: comm_type must be the model's type, float32, bfloat16 or float16");
    std::vector<parameter*> params = m.parameters();
    if (opts.broadcast_at_start) {
      for (parameter* p : params) comm_.broadcast(std::span<T>(p->value.template data<T>(), std::size_t(p->value.numel())), 0);
      for (tensor* b : m.buffers()) comm_.broadcast(std::span<T>(b->template data<T>(), std::size_t(b->numel())), 0);
    }
    // Buckets in backward order.
    std::size_t cap = opts.first_bucket_bytes, bytes = 0;
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      const std::size_t pb = std::size_t((*it)->value.numel()) * size_of(opts.comm_type);
      if (buckets_.empty() || (bytes > 0 && bytes + pb > cap)) {
        if (!buckets_.empty()) cap = opts.bucket_bytes;
        buckets_.emplace_back();
        bytes = 0;
      }
      buckets_.back().params.push_back(*it);
      buckets_.back().count += (*it)->value.numel();
      where_[*it] = buckets_.size() - 1;
      bytes += pb;
    }
    for (bucket& b : buckets_) b.flat = tensor({b.count}, opts.comm_type);
    hook_ = [this](parameter& p) { on_grad_ready(p); };
    m_.set_grad_hook(&hook_);
  }
  ddp(const ddp&) = delete;
  ddp& operator=(const ddp&) = delete;
  ~ddp() { m_.set_grad_hook(nullptr); }

  tensor forward(const tensor& x) { return m_.forward(x); }

  // Backward through the module; averages the gradients across ranks unless inside no_sync().
  tensor backward(const tensor& dy) {
    for (bucket& b : buckets_) b.ready = 0;
    next_ = 0;
    seen_ = 0;
    reduced_order_.clear();
    tensor dx = m_.backward(dy);
    if (sync_) {
      // Buckets whose parameters got no gradient this time still take part, in order.
      for (bucket& b : buckets_) b.ready = b.params.size();
      flush();
    }
    return dx;
  }

  // RAII scope in which backward does not communicate (gradient accumulation).
  class no_sync_guard {
  public:
    explicit no_sync_guard(ddp& d) : d_(d), prev_(d.sync_) { d_.sync_ = false; }
    ~no_sync_guard() { d_.sync_ = prev_; }
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;

  private:
    ddp& d_;
    bool prev_;
  };
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(*this); }

  nn::module<T>& module_ref() { return m_; }
  communicator& comm() { return comm_; }
  std::size_t bucket_count() const { return buckets_.size(); }
  std::vector<std::size_t> bucket_sizes_bytes() const {
    std::vector<std::size_t> s;
    for (const bucket& b : buckets_) s.push_back(b.flat.bytes());
    return s;
  }
  // For each bucket reduced in the last backward, how many parameter gradients had been produced
  // when it was reduced (a bucket reduced during backward shows fewer than the total).
  const std::vector<std::size_t>& reduced_after() const { return reduced_order_; }

private:
  struct bucket {
    std::vector<parameter*> params;
    std::int64_t count = 0;
    std::size_t ready = 0;
    tensor flat;
  };

  void on_grad_ready(parameter& p) {
    ++seen_;
    if (!sync_) return;
    auto it = where_.find(&p);
    if (it == where_.end()) return;
    ++buckets_[it->second].ready;
    flush();
  }

  // Reduces every bucket, in order, that is complete and not yet reduced.
  void flush() {
    while (next_ < buckets_.size() && buckets_[next_].ready >= buckets_[next_].params.size()) {
      reduce(buckets_[next_]);
      reduced_order_.push_back(seen_);
      ++next_;
    }
  }

  void reduce(bucket& b) {
    if (opts_.comm_type == dtype_of_v<T>) {
      T* f = b.flat.template data<T>();
      std::int64_t off = 0;
      for (parameter* p : b.params) {
        std::memcpy(f + off, p->grad.raw(), p->grad.bytes());
        off += p->grad.numel();
      }
      comm_.all_reduce(std::span<T>(f, std::size_t(b.count)), avg{});
      off = 0;
      for (parameter* p : b.params) {
        std::memcpy(p->grad.raw(), f + off, p->grad.bytes());
        off += p->grad.numel();
      }
    } else {
      visit(opts_.comm_type, [&](auto tag) {
        using C = typename decltype(tag)::type;
        if constexpr (std::is_same_v<C, float> || std::is_same_v<C, bfloat16> || std::is_same_v<C, half>) {
          C* f = b.flat.template data<C>();
          std::int64_t off = 0;
          for (parameter* p : b.params) {
            const T* g = p->grad.template data<T>();
            for (std::int64_t j = 0; j < p->grad.numel(); ++j) f[off + j] = C(g[j]);
            off += p->grad.numel();
          }
          comm_.all_reduce(std::span<C>(f, std::size_t(b.count)), avg<float>{});
          off = 0;
          for (parameter* p : b.params) {
            T* g = p->grad.template data<T>();
            for (std::int64_t j = 0; j < p->grad.numel(); ++j) g[j] = T(float(f[off + j]));
            off += p->grad.numel();
          }
        }
      });
    }
  }

  nn::module<T>& m_;
  communicator& comm_;
  ddp_options opts_;
  std::vector<bucket> buckets_;
  std::unordered_map<const parameter*, std::size_t> where_;
  grad_hook hook_;
  std::size_t next_ = 0, seen_ = 0;
  bool sync_ = true;
  std::vector<std::size_t> reduced_order_;
};

// Dynamic loss scaling: start at 2^16; after `interval` consecutive steps without overflow, double
// the scale; on an overflow (a non-finite gradient), halve it and skip the step.
class loss_scaler {
public:
  explicit loss_scaler(double init = 65536.0, int interval = 2000, double growth = 2.0, double backoff = 0.5)
      : scale_(init), interval_(interval), growth_(growth), backoff_(backoff) {}
  double scale() const noexcept { return scale_; }
  int clean_steps() const noexcept { return good_; }
  std::uint64_t skipped() const noexcept { return skipped_; }
  // Records one step's outcome; returns whether the optimizer step should be applied.
  bool update(bool overflow) {
    rules::scaler_state s{scale_, good_, 0, skipped_};
    const bool apply = rules::scaler_update(s, overflow, interval_, growth_, backoff_);
    scale_ = s.scale;
    good_ = s.clean;
    skipped_ = s.skipped;
    return apply;
  }
  // For checkpoints.
  void set_state(double scale, int clean, std::uint64_t skipped) {
    scale_ = scale;
    good_ = clean;
    skipped_ = skipped;
  }

private:
  double scale_;
  int interval_;
  double growth_, backoff_;
  int good_ = 0;
  std::uint64_t skipped_ = 0;
};

// Mixed precision with fp32 master weights, emulated on the CPU: values are rounded to the compute
// type (bfloat16 or half, to nearest even) and stored as float, so the numbers are those of the compute
// type but the arithmetic, and its speed, are float's. What is rounded:
//  * the model's parameters: the fp32 masters rounded, so forward and backward see low-precision weights;
//  * each gradient, in unscale(), before it is checked and divided: the scaled gradient as a
//    low-precision backward would store it. In half a magnitude above 65504 becomes inf (an overflow,
//    which the loss scaler exists for) and one below 2^-24 becomes 0 (the underflow that the scale
//    prevents); bfloat16 has float's range;
//  * any tensor handed to round() (the trainer rounds the input batch and the loss gradient).
// Activations inside the layers stay float. The optimizer updates the fp32 masters, which are then
// rounded into the model again.
class mixed_precision {
public:
  mixed_precision(const std::vector<parameter*>& model_params, dtype compute)
      : model_(model_params), compute_(compute) {
    if (compute != dtype::bfloat16 && compute != dtype::float16)
      raise(errc::invalid_argument, "mixed_precision: compute type must be bfloat16 or float16");
    for (parameter* p : model_params) master_.push_back(parameter{p->name, p->value.clone(), p->grad});
    round_into_model();
  }
  dtype compute_type() const noexcept { return compute_; }
  // The fp32 master parameters (their grad tensors are the model's): give these to the optimizer.
  std::vector<parameter*> master_params() {
    std::vector<parameter*> v;
    for (parameter& p : master_) v.push_back(&p);
    return v;
  }
  // Rounds every gradient to the compute type, then divides it by `scale`; returns true when any
  // rounded gradient is inf or NaN (the step must then be skipped).
  bool unscale(double scale) {
    bool bad = false;
    const float inv = float(1.0 / scale);
    for (parameter& p : master_) {
      float* g = p.grad.data<float>();
      for (std::int64_t j = 0; j < p.grad.numel(); ++j)
        if (!rules::unscale(g[j], compute_ == dtype::bfloat16, inv)) bad = true;
    }
    return bad;
  }
  // One loss-scaled step: unscale the gradients by the scaler's scale, record the outcome in the
  // scaler, and, when no gradient overflowed, step the optimizer on the masters and round them into
  // the model. Returns whether the step was applied; a skipped step leaves masters and model unchanged.
  bool step(optimizer<float>& opt, loss_scaler& scaler, double lr) {
    if (!scaler.update(unscale(scaler.scale()))) return false;
    opt.step(lr);
    round_into_model();
    return true;
  }
  // Rounds a float tensor in place to the compute type.
  void round(tensor& t) const {
    float* d = t.data<float>();
    for (std::int64_t j = 0; j < t.numel(); ++j) d[j] = rounded(d[j]);
  }
  // Copies the masters into the model, rounded to the compute type.
  void round_into_model() {
    for (std::size_t i = 0; i < master_.size(); ++i) {
      const float* s = master_[i].value.data<float>();
      float* d = model_[i]->value.data<float>();
      for (std::int64_t j = 0; j < master_[i].value.numel(); ++j) d[j] = rounded(s[j]);
    }
  }

private:
  float rounded(float v) const { return rules::round_to(v, compute_ == dtype::bfloat16); }

  std::vector<parameter*> model_;
  std::vector<parameter> master_;
  dtype compute_;
};

} // namespace braid::nn
