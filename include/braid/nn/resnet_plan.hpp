// braid/nn/resnet_plan.hpp — the topology of braid::nn's ResNet, written once: the host network
// (nn::resnet, layers/containers.hpp) and the device one (fused::resnet, model_device.cuh) both
// build their top-level children from resnet_plan(), and a pipeline stage's input shape is read off
// the same list.
//
// CIFAR-style ResNet-(6n+2) for n = blocks: conv3x3(in_ch -> width, stride 1, padding 1), batch
// norm, ReLU, three stages of `blocks` basic blocks with width, 2*width and 4*width channels (the
// first block of stages 2 and 3 has stride 2), global average pooling, linear to `classes`:
// 3 * blocks + 5 children.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor.hpp"

namespace braid::nn::detail {

// One top-level child of the network. in/out: channels (conv, block), features (linear); bn and
// relu keep `out` channels; stride: conv and block.
struct resnet_child {
  enum class kind { conv, batchnorm, relu, block, pool, linear };
  kind what;
  int in = 0, out = 0, stride = 1;
};

inline std::vector<resnet_child> resnet_plan(int blocks, int classes, int in_ch, int width) {
  using k = resnet_child::kind;
  std::vector<resnet_child> plan{{k::conv, in_ch, width, 1}, {k::batchnorm, width, width, 1}, {k::relu, width, width, 1}};
  int ch = width;
  for (int stage = 0; stage < 3; ++stage) {
    const int out = width << stage;
    for (int b = 0; b < blocks; ++b) {
      plan.push_back({k::block, ch, out, (stage > 0 && b == 0) ? 2 : 1});
      ch = out;
    }
  }
  plan.push_back({k::pool, ch, ch, 1});
  plan.push_back({k::linear, ch, classes, 1});
  return plan;
}

// The shape of the input of child `first` for n images of in_ch x h x w: the output shape of
// children [0, first) (3x3 convolutions with padding 1, so only strides change h and w).
inline shape_t resnet_input_shape(const std::vector<resnet_child>& plan, std::size_t first, std::int64_t n, std::int64_t in_ch,
                                  std::int64_t h, std::int64_t w) {
  using k = resnet_child::kind;
  std::int64_t c = in_ch;
  bool flat = false;
  for (std::size_t i = 0; i < first && i < plan.size(); ++i) {
    const resnet_child& x = plan[i];
    if (x.what == k::conv || x.what == k::block) {
      h = (h + 2 - 3) / x.stride + 1;
      w = (w + 2 - 3) / x.stride + 1;
    }
    c = x.out;
    flat = flat || x.what == k::pool || x.what == k::linear;
  }
  return flat ? shape_t({n, c}) : shape_t({n, c, h, w});
}

} // namespace braid::nn::detail
