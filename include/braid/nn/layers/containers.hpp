// braid/nn/layers/containers.hpp — sequential, basic_block and resnet(): modules made of modules.
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

#include "basic.hpp"
#include "conv.hpp"
#include "norm.hpp"
#include "../resnet_plan.hpp"

namespace braid::nn {

// Runs its children in order; backward in reverse order.
template <class T> class sequential : public module<T> {
public:
  template <class M, class... A> M& add(A&&... args) {
    auto m = std::make_unique<M>(std::forward<A>(args)...);
    M& ref = *m;
    m->set_training(this->training_);
    m->set_grad_hook(this->hook_);
    children_.push_back(std::move(m));
    return ref;
  }
  tensor forward(const tensor& x) override {
    tensor h = x;
    for (auto& m : children_) h = m->forward(h);
    return h;
  }
  tensor backward(const tensor& dy) override {
    tensor d = dy;
    for (auto it = children_.rbegin(); it != children_.rend(); ++it) d = (*it)->backward(d);
    return d;
  }
  void collect(std::vector<parameter*>& params, std::vector<tensor*>& buffers) override {
    for (auto& m : children_) m->collect(params, buffers);
  }
  void set_training(bool on) override {
    this->training_ = on;
    for (auto& m : children_) m->set_training(on);
  }
  void set_grad_hook(grad_hook* h) override {
    this->hook_ = h;
    for (auto& m : children_) m->set_grad_hook(h);
  }
  std::size_t size() const { return children_.size(); }
  // Moves children [first, last) out of this sequential, in order, into a new one (pipeline stages).
  // The new sequential takes this one's training flag and grad hook; the moved children keep theirs,
  // which are this one's (add() and the setters give every child its parent's), and their
  // parameters, buffers and state are the same objects as before (pointers to them stay valid).
  // This sequential keeps the others, in order. invalid_argument unless first <= last <= size().
  std::unique_ptr<sequential<T>> extract(std::size_t first, std::size_t last) {
    detail::require(first <= last && last <= children_.size(),
                    "sequential::extract: [" + std::to_string(first) + ", " + std::to_string(last) + ") of " +
                        std::to_string(children_.size()) + " children");
    auto out = std::make_unique<sequential<T>>();
    out->training_ = this->training_;
    out->hook_ = this->hook_;
    const auto b = children_.begin() + std::ptrdiff_t(first), e = children_.begin() + std::ptrdiff_t(last);
    out->children_.assign(std::make_move_iterator(b), std::make_move_iterator(e));
    children_.erase(b, e);
    return out;
  }

private:
  std::vector<std::unique_ptr<module<T>>> children_;
};

namespace detail {
// A convolution or batch norm as basic_block and resnet() place it: on the hand-written path unless
// `onednn`, and in oneDNN's channel-blocked layout where `blocked` (a convolution's input too, unless
// `blocked_in` is false: the stem reads NCHW).
template <class T> void place(conv2d<T>& l, bool onednn, bool blocked, bool blocked_in = true) {
  if (!onednn) l.use_onednn(false);
  if (blocked) l.set_blocked(blocked_in, true);
}
template <class T> void place(batchnorm2d<T>& l, bool onednn, bool blocked) {
  if (!onednn) l.use_onednn(false);
  if (blocked) l.set_blocked(true);
}
} // namespace detail

// ResNet basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), 3x3 convolutions; the
// shortcut is the identity, or a strided 1x1 convolution with BatchNorm when the shape changes.
template <class T> class basic_block : public module<T> {
public:
  // onednn = false: float layers on the hand-written path; blocked: activations in oneDNN's
  // channel-blocked layout in and out (see conv2d::set_blocked).
  basic_block(int in_ch, int out_ch, int stride, std::mt19937_64& rng, bool onednn = true, bool blocked = false) {
    using detail::place;
    place(main_.template add<conv2d<T>>(in_ch, out_ch, 3, stride, 1, false, rng), onednn, blocked);
    place(main_.template add<batchnorm2d<T>>(out_ch), onednn, blocked);
    main_.template add<relu<T>>();
    place(main_.template add<conv2d<T>>(out_ch, out_ch, 3, 1, 1, false, rng), onednn, blocked);
    place(main_.template add<batchnorm2d<T>>(out_ch), onednn, blocked);
    if (stride != 1 || in_ch != out_ch) {
      shortcut_ = std::make_unique<sequential<T>>();
      place(shortcut_->template add<conv2d<T>>(in_ch, out_ch, 1, stride, 0, false, rng), onednn, blocked);
      place(shortcut_->template add<batchnorm2d<T>>(out_ch), onednn, blocked);
    }
  }
  tensor forward(const tensor& x) override {
    tensor a = main_.forward(x);
    tensor b = shortcut_ ? shortcut_->forward(x) : x;
    return out_.forward(add<T>(a, b));
  }
  tensor backward(const tensor& dy) override {
    tensor d = out_.backward(dy);
    tensor dx = main_.backward(d);
    tensor ds = shortcut_ ? shortcut_->backward(d) : d;
    T* p = dx.data<T>();
    const T* q = ds.data<T>();
    const std::int64_t n = dx.numel();
    for (std::int64_t i = 0; i < n; ++i) p[i] += q[i];
    return dx;
  }
  void collect(std::vector<parameter*>& params, std::vector<tensor*>& buffers) override {
    each_path([&](sequential<T>& s) { s.collect(params, buffers); });
  }
  void set_training(bool on) override {
    this->training_ = on;
    each_path([on](sequential<T>& s) { s.set_training(on); });
  }
  void set_grad_hook(grad_hook* h) override {
    this->hook_ = h;
    each_path([h](sequential<T>& s) { s.set_grad_hook(h); });
  }

private:
  // f(main path), then f(shortcut) where there is one: the order collect() lists the parameters in.
  template <class F> void each_path(F f) {
    f(main_);
    if (shortcut_) f(*shortcut_);
  }

  sequential<T> main_;
  std::unique_ptr<sequential<T>> shortcut_;
  relu<T> out_;
};

// ResNet for 1-channel images (CIFAR-style ResNet-(6n+2), nn/resnet_plan.hpp): conv3x3(16)-BN-ReLU, three stages of n
// basic blocks with 16, 32, 64 channels (the 2nd and 3rd start with stride 2), global average
// pooling, linear to `classes`. n = 3 is ResNet-20. `width` scales the channel counts (16*width...).
//
// Float networks run their convolutions and batch norms on oneDNN where braid::nn has it, and when
// `width` is a multiple of oneDNN's channel block (onednn::block(): 16 with AVX-512, 8 with AVX2)
// the activations between the first convolution and the global pooling stay in oneDNN's
// channel-blocked layout (no reorder between layers; ReLU and the residual adds are elementwise and
// do not care). Input and output are NCHW and [N, classes] all the same. onednn = false puts every
// layer on the hand-written path (the tests compare the two).
template <class T> std::unique_ptr<sequential<T>> resnet(int n, int classes, std::mt19937_64& rng,
                                                         int in_ch = 1, int width = 16, bool onednn = true) {
  bool blocked = false;
  if constexpr (detail::serves_onednn<T>)
    blocked = onednn && detail::onednn_block() > 0 && width % detail::onednn_block() == 0;
  auto net = std::make_unique<sequential<T>>();
  using kind = detail::resnet_child::kind;
  for (const detail::resnet_child& c : detail::resnet_plan(n, classes, in_ch, width)) {
    switch (c.what) {
    // The stem's convolution reads the NCHW input and writes the blocked layout.
    case kind::conv: detail::place(net->template add<conv2d<T>>(c.in, c.out, 3, c.stride, 1, false, rng), onednn, blocked, false); break;
    case kind::batchnorm: detail::place(net->template add<batchnorm2d<T>>(c.out), onednn, blocked); break;
    case kind::relu: net->template add<relu<T>>(); break;
    case kind::block: net->template add<basic_block<T>>(c.in, c.out, c.stride, rng, onednn, blocked); break;
    case kind::pool: {
      auto& l = net->template add<global_avgpool<T>>();
      if (blocked) l.set_block(detail::onednn_block());
      break;
    }
    case kind::linear: net->template add<linear<T>>(c.in, c.out, rng); break;
    }
  }
  return net;
}

} // namespace braid::nn
