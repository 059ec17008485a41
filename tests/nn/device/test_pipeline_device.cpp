// tests/nn/device/test_pipeline_device.cpp — model parallelism on CUDA ranks (nn/pipeline_device.cuh)
// on the emulated device: fused::resnet stages chained by hand equal the whole network to the bit;
// input_shape() is the previous stage's output shape at every cut; fused::pipeline on two emulated GPUs
// (braid::cuda send/recv, GPipe fill and drain, 2 steps of SGD per stage) equals the unsplit network
// with gradient accumulation: to the bit when the reference sums the micro-batches in the pipeline's
// order (M-1 .. 0), and within 1e-5 in the usual order, with the running statistics of the fill;
// refusals. Emulated device only: no GPU ran this.
#include <doctest/doctest.h>

#include <braid/cuda.cuh>
#include <braid/nn/model_device.cuh>
#include <braid/nn/optim_device.cuh>
#include <braid/nn/pipeline.hpp>
#include <braid/nn/pipeline_device.cuh>

#include <cmath>
#include <cstring>
#include <exception>
#include <random>
#include <thread>
#include <vector>

#include "model_test_support.hpp"
#include "rank_threads.hpp"

using namespace braid::nn;
using namespace model_test;

namespace {

constexpr int blocks = 1, width = 4, hw = 12;
constexpr std::size_t cut = 4; // stage 1 starts at the second basic block (children: conv, bn, relu, 3 blocks, gap, linear)

// The host model's parameters, flat in collect() order (stages compare with the whole model this way).
std::vector<float> host_params(module<float>& m) {
  std::vector<float> v;
  for (parameter* p : m.parameters()) v.insert(v.end(), p->value.data<float>(), p->value.data<float>() + p->value.numel());
  return v;
}
std::vector<float> host_buffers(module<float>& m) {
  std::vector<float> v;
  for (tensor* b : m.buffers()) v.insert(v.end(), b->data<float>(), b->data<float>() + b->numel());
  return v;
}

struct batch {
  tensor x;
  std::vector<std::int32_t> labels;
};

// The unsplit network on one GPU, gradient accumulation over the micro-batches of each batch (in the
// order M-1 .. 0 when `reverse`), SGD after each batch. Returns the trained host model.
// sums gets the summed loss and right answers over all batches.
std::unique_ptr<sequential<float>> unsplit(const std::vector<batch>& data, int M, bool reverse, double lr, double sums[2]) {
  std::mt19937_64 init(21);
  auto host = resnet<float>(blocks, 10, init, 1, width, false);
  device_side d(0);
  {
    fused::resnet<float> net(blocks, 10, 1, width, d.pool, d.stream, d.blas);
    net.load(*host);
    fused::sgd<float> opt({net.values(), net.grads(), net.size(), net.segments()}, d.stream, 0.9, 5e-4, true);
    for (const batch& b : data) {
      const std::int64_t B = b.x.dim(0), per = b.x.numel() / B;
      float* x = d.upload(b.x.data<float>(), b.x.numel());
      std::int32_t* l = d.upload(b.labels.data(), B);
      net.zero_grad();
      for (int j = 0; j < M; ++j) {
        const int i = reverse ? M - 1 - j : j;
        const auto [lo, n] = micro_batch_range(B, M, i);
        net.forward(x + lo * per, shape_t({n, 1, hw, hw}));
        net.loss(l + lo);
        net.backward(double(n) / double(B));
      }
      opt.step(lr);
      d.pool.deallocate(x, d.stream);
      d.pool.deallocate(l, d.stream);
    }
    const auto [loss, right] = net.take_sums();
    sums[0] = loss;
    sums[1] = right;
    net.store(*host);
  }
  return host;
}

std::vector<batch> make_data(int steps, std::int64_t B) {
  std::mt19937_64 data(22);
  std::vector<batch> v;
  for (int s = 0; s < steps; ++s) v.push_back({random_images<float>(B, hw, data), random_labels(B, data)});
  return v;
}

} // namespace

TEST_CASE("fused::resnet stages chained by hand equal the whole network (same bits); input_shape at every cut") {
  std::mt19937_64 init(21), data(23);
  auto host = resnet<float>(blocks, 10, init, 1, width, false);
  const std::int64_t n = 5;
  tensor x = random_images<float>(n, hw, data);
  auto labels = random_labels(n, data);
  device_side d(0);
  fused::resnet<float> whole(blocks, 10, 1, width, d.pool, d.stream, d.blas);
  REQUIRE_EQ(whole.children(), std::size_t(3 * blocks + 5));
  whole.load(*host);
  float* xd = d.upload(x.data<float>(), x.numel());
  std::int32_t* ld = d.upload(labels.data(), n);
  const float* z = whole.forward(xd, x.shape());
  const auto want_logits = d.download(z, n * 10);
  whole.loss(ld);
  whole.backward();
  std::mt19937_64 other(99);
  auto want = resnet<float>(blocks, 10, other, 1, width, false);
  whole.store(*want);
  // The whole network's gradients, in collect() order.
  std::vector<float> want_grads;
  {
    const auto g = d.download(whole.grads(), whole.size());
    for (std::size_t i = 0; i < whole.parameter_count(); ++i)
      want_grads.insert(want_grads.end(), g.begin() + whole.parameter_offset(i),
                        g.begin() + whole.parameter_offset(i) + whole.parameter_shape(i).numel());
  }

  for (std::size_t c = 1; c < whole.children(); ++c) {
    INFO("cut before child ", c);
    std::mt19937_64 i2(21);
    auto h2 = resnet<float>(blocks, 10, i2, 1, width, false);
    auto s0h = take_stage(*h2, {c}, 0);
    std::mt19937_64 i3(21);
    auto h3 = resnet<float>(blocks, 10, i3, 1, width, false);
    auto s1h = take_stage(*h3, {c}, 1);
    fused::resnet<float> s0(blocks, 10, 1, width, d.pool, d.stream, d.blas, 0, c);
    fused::resnet<float> s1(blocks, 10, 1, width, d.pool, d.stream, d.blas, c, std::size_t(-1));
    CHECK(!s0.has_loss());
    CHECK(s1.has_loss());
    s0.load(*s0h);
    s1.load(*s1h);
    const float* a = s0.forward(xd, s0.input_shape(n, hw, hw));
    CHECK(s0.output_shape() == s1.input_shape(n, hw, hw));
    const float* z1 = s1.forward(a, s1.input_shape(n, hw, hw));
    CHECK(d.download(z1, n * 10) == want_logits);
    s1.loss(ld);
    const float* da = s1.backward();
    (void)s0.backward_from(da);
    // Gradients of both stages, in collect() order, are the whole network's.
    std::vector<float> got;
    for (fused::resnet<float>* s : {&s0, &s1}) {
      const auto g = d.download(s->grads(), s->size());
      for (std::size_t i = 0; i < s->parameter_count(); ++i)
        got.insert(got.end(), g.begin() + s->parameter_offset(i), g.begin() + s->parameter_offset(i) + s->parameter_shape(i).numel());
    }
    CHECK(got == want_grads);
    // Running statistics, through store() into the host stages.
    s0.store(*s0h);
    s1.store(*s1h);
    std::vector<float> stats = host_buffers(*s0h), more = host_buffers(*s1h);
    stats.insert(stats.end(), more.begin(), more.end());
    CHECK(stats == host_buffers(*want));
  }
  d.pool.deallocate(xd, d.stream);
  d.pool.deallocate(ld, d.stream);
}

TEST_CASE("fused::pipeline: 2 stages on 2 emulated GPUs equal the unsplit network with gradient accumulation") {
  constexpr int steps = 2, M = 3;
  constexpr std::int64_t B = 7; // micro-batches of 3, 2, 2
  const double lr = 0.05;
  const auto data = make_data(steps, B);
  double rev_sums[2], fwd_sums[2];
  const auto rev = unsplit(data, M, true, lr, rev_sums);
  const auto fwd = unsplit(data, M, false, lr, fwd_sums);

  auto comms = braid::cuda::create_group({0, 1});
  std::unique_ptr<sequential<float>> trained[2];
  double sums[2] = {0, 0};
  rank_threads::run(2, [&](int r) {
    std::mt19937_64 init(21);
    auto host = resnet<float>(blocks, 10, init, 1, width, false);
    trained[r] = take_stage(*host, {cut}, r);
    device_side d(r);
    {
      fused::resnet<float> stage(blocks, 10, 1, width, d.pool, d.stream, d.blas, r == 0 ? 0 : cut, r == 0 ? cut : std::size_t(-1));
      stage.load(*trained[r]);
      fused::pipeline<braid::cuda::communicator, float> pipe(stage, comms[std::size_t(r)], M);
      fused::sgd<float> opt({stage.values(), stage.grads(), stage.size(), stage.segments()}, d.stream, 0.9, 5e-4, true);
      for (const batch& b : data) {
        float* x = r == 0 ? d.upload(b.x.data<float>(), b.x.numel()) : nullptr;
        std::int32_t* l = r == 1 ? d.upload(b.labels.data(), B) : nullptr;
        stage.zero_grad();
        pipe.train_step(x, l, B, hw, hw);
        opt.step(lr);
        if (x) d.pool.deallocate(x, d.stream);
        if (l) d.pool.deallocate(l, d.stream);
      }
      if (r == 1) {
        const auto [loss, right] = stage.take_sums();
        sums[0] = loss;
        sums[1] = right;
      }
      stage.store(*trained[r]);
    }
  }, [&](int) {
    for (auto& c : comms) c.abort(); // the peer would wait for this rank's messages
  });

  std::vector<float> got = host_params(*trained[0]), more = host_params(*trained[1]);
  got.insert(got.end(), more.begin(), more.end());
  const std::vector<float> want_rev = host_params(*rev), want_fwd = host_params(*fwd);
  REQUIRE_EQ(got.size(), want_rev.size());
  CHECK(got == want_rev); // the pipeline's order of accumulation: the same bits
  const double e = rel_err(got.data(), want_fwd.data(), std::int64_t(got.size()));
  INFO("relative difference to the unsplit network in the usual order: ", e);
  CHECK(e <= 1e-5);
  // Running statistics: those of the fill (micro-batches 0 .. M-1), as the usual order leaves them
  // (not to the bit: from the second step on, the weights they are computed with are the reverse
  // order's), and not those of the reverse order's updates.
  std::vector<float> stats = host_buffers(*trained[0]), more_stats = host_buffers(*trained[1]);
  stats.insert(stats.end(), more_stats.begin(), more_stats.end());
  const std::vector<float> stats_fwd = host_buffers(*fwd), stats_rev = host_buffers(*rev);
  const double es = rel_err(stats.data(), stats_fwd.data(), std::int64_t(stats.size()));
  const double er = rel_err(stats.data(), stats_rev.data(), std::int64_t(stats.size()));
  INFO("running statistics: relative difference ", es, " to the usual order, ", er, " to the reverse order");
  CHECK(es <= 1e-5);
  CHECK(er > 10 * es);
  // Training moved the weights, and the last stage counted every image of both batches.
  std::mt19937_64 init(21);
  auto start = resnet<float>(blocks, 10, init, 1, width, false);
  const std::vector<float> w0 = host_params(*start);
  CHECK(rel_err(got.data(), w0.data(), std::int64_t(w0.size())) > 1e-3);
  // The last stage's running sums count each image once (the recomputed micro-batches are not
  // counted again): within rounding of the unsplit run's (its second step runs other weights).
  CHECK(std::fabs(sums[0] - fwd_sums[0]) <= 1e-5 * fwd_sums[0]);
  CHECK(sums[1] == fwd_sums[1]);
  CHECK(sums[0] > 0);
}

TEST_CASE("fused::pipeline: refusals") {
  device_side d(0);
  auto comms = braid::cuda::create_group({0, 1});
  fused::resnet<float> tail(blocks, 10, 1, width, d.pool, d.stream, d.blas, cut, std::size_t(-1));
  fused::resnet<float> head(blocks, 10, 1, width, d.pool, d.stream, d.blas, 0, cut);
  using pipe = fused::pipeline<braid::cuda::communicator, float>;
  CHECK_THROWS_AS(pipe(tail, comms[0], 2), braid::invalid_argument); // stage 0 must start at child 0
  CHECK_THROWS_AS(pipe(head, comms[1], 2), braid::invalid_argument); // the last stage needs the classifier
  CHECK_THROWS_AS(pipe(head, comms[0], 0), braid::invalid_argument); // micro-batches >= 1
  CHECK_THROWS_AS(fused::resnet<float>(blocks, 10, 1, width, d.pool, d.stream, d.blas, 3, 3), braid::invalid_argument);
  CHECK_THROWS_AS(head.loss(nullptr), braid::invalid_argument); // no classifier on this stage
  pipe p(head, comms[0], 4);
  CHECK_THROWS_AS(p.train_step(nullptr, nullptr, 8, hw, hw), braid::invalid_argument); // stage 0 without images
  float* x = static_cast<float*>(d.pool.allocate(3 * hw * hw * sizeof(float), d.stream));
  CHECK_THROWS_AS(p.train_step(x, nullptr, 3, hw, hw), braid::invalid_argument); // 3 images for 4 micro-batches
  d.pool.deallocate(x, d.stream);
}
