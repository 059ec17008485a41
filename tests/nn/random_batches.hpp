// tests/nn/random_batches.hpp — `steps` batches of B single-channel hw x hw images of standard-normal
// pixels with labels in 0..9, from a fixed seed: the synthetic data of the DDP and pipeline tests.
#pragma once

#include <braid/nn/tensor.hpp>

#include <cstdint>
#include <random>
#include <vector>

namespace braid::nn_test {

struct random_batches {
  std::vector<braid::nn::tensor> x;
  std::vector<std::vector<std::int32_t>> y;
};

inline random_batches make_random_batches(int steps, int B, int hw) {
  std::mt19937_64 rng(1234);
  std::normal_distribution<float> n(0, 1);
  random_batches d;
  for (int s = 0; s < steps; ++s) {
    braid::nn::tensor x({B, 1, hw, hw});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n(rng);
    std::vector<std::int32_t> y(static_cast<std::size_t>(B));
    for (auto& v : y) v = std::int32_t(rng() % 10);
    d.x.push_back(x);
    d.y.push_back(y);
  }
  return d;
}

} // namespace braid::nn_test
