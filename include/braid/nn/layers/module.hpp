// braid/nn/layers/module.hpp — the module contract (module<T>, parameter, grad_hook), parameter initialisation, and the
// oneDNN switch the float layers share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../blas.hpp"
#include "../ops.hpp"
#include "../tensor.hpp"
#include "../onednn_side.hpp"

namespace braid::nn {

// A learnable tensor and its gradient (same shape and type).
struct parameter {
  std::string name;
  tensor value;
  tensor grad;
};

// Called once per parameter per backward, when that parameter's gradient is final.
using grad_hook = std::function<void(parameter&)>;

template <class T> class module {
public:
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "modules compute in float or double");
  using scalar = T;
  virtual ~module() = default;
  virtual tensor forward(const tensor& x) = 0;
  virtual tensor backward(const tensor& dy) = 0;
  // Appends this module's parameters and buffers (BatchNorm running statistics), in a fixed order.
  virtual void collect(std::vector<parameter*>& params, std::vector<tensor*>& buffers) {
    (void)params;
    (void)buffers;
  }
  virtual void set_training(bool on) { training_ = on; }
  virtual void set_grad_hook(grad_hook* h) { hook_ = h; }
  bool training() const noexcept { return training_; }

  std::vector<parameter*> parameters() {
    std::vector<parameter*> p;
    std::vector<tensor*> b;
    collect(p, b);
    return p;
  }
  std::vector<tensor*> buffers() {
    std::vector<parameter*> p;
    std::vector<tensor*> b;
    collect(p, b);
    return b;
  }
  void zero_grad() {
    for (parameter* p : parameters()) p->grad.zero();
  }

protected:
  void grads_ready(parameter& p) {
    if (hook_ && *hook_) (*hook_)(p);
  }
  bool training_ = true;
  grad_hook* hook_ = nullptr;
};

namespace detail {
inline void require(bool ok, const std::string& what) {
  if (!ok) raise(errc::invalid_argument, what);
}
template <class T> parameter make_param(std::string name, shape_t s) {
  parameter p{std::move(name), tensor(s, dtype_of_v<T>), tensor::zeros(s, dtype_of_v<T>)};
  p.value.zero();
  return p;
}
// Kaiming-uniform-like initialisation: U(-b, b), b = sqrt(6 / fan_in) * gain / sqrt(2).
template <class T> void init_uniform(tensor& t, double bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-bound, bound);
  T* p = t.data<T>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = T(u(rng));
}
// use_onednn(on) of a float conv2d or batchnorm2d, whose oneDNN side is `impl`: off drops it, on
// builds it in plain NCHW with make() unless it is there. A side set to blocked activations stays:
// the layers around it hand it blocked tensors.
template <class Impl, class Make> void use_onednn(std::unique_ptr<Impl>& impl, bool on, const char* layer, Make make) {
  require(on || !(impl && impl->blocked()), std::string(layer) + ": a layer with blocked activations stays on oneDNN");
  if (!on) impl.reset();
  else if (!impl) impl = make();
}
} // namespace detail

} // namespace braid::nn
