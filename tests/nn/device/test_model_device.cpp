// tests/nn/device/test_model_device.cpp — nn/model_device.cuh's fused::resnet on the emulated CUDA
// device (its GEMMs on the emulated cuBLAS) against the host nn::resnet (hand-written path, no
// oneDNN): logits, loss, every parameter gradient and the BatchNorm running statistics after a
// training-mode step, in double (to 1e-10) and float (to 1e-4 of the largest value); buckets finish in
// bucket order (bucket 0 first); data parallel over braid::cuda with the bucket reducer and the fused
// SGD on two emulated GPUs: both ranks hold the same bits, and they match one GPU on the whole batch
// (BatchNorm in eval mode, where the two are equal in exact arithmetic); refusals. Emulated device
// only: no GPU ran this.
#include <doctest/doctest.h>

#include <braid/cuda.cuh>
#include <braid/nn/ddp_device.cuh>
#include <braid/nn/loss.hpp>
#include <braid/nn/model_device.cuh>
#include <braid/nn/optim_device.cuh>

#include "model_test_support.hpp"
#include "rank_threads.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

using namespace braid::nn;
using namespace model_test;

namespace {

// mixed: 0 none; 1 bf16, 2 fp16 (float only): the loss gradient scaled by a device loss scaler's
// scale (1024) and rounded to the compute type, against the host's ce.backward(1024) rounded by rules.
template <class T> void compare_one_step(double tol, int mixed = 0) {
  std::mt19937_64 init(11), data(12);
  auto host = resnet<T>(1, 10, init, 1, 4, false);
  device_side d(0);
  fused::resnet<T> net(1, 10, 1, 4, d.pool, d.stream, d.blas);
  REQUIRE_EQ(net.parameter_count(), host->parameters().size());
  net.load(*host);
  std::vector<std::size_t> finished;
  net.set_buckets(0);
  net.on_bucket_ready([&](std::size_t b) { finished.push_back(b); });

  const std::int64_t n = 6;
  tensor x = random_images<T>(n, 12, data);
  auto labels = random_labels(n, data);
  softmax_cross_entropy<T> ce;
  host->zero_grad();
  tensor logits = host->forward(x);
  const double host_loss = ce.forward(logits, labels);
  constexpr double scale = 1024.0;
  if (mixed == 0) host->backward(ce.backward());
  else {
    tensor dy = ce.backward(scale);
    for (std::int64_t i = 0; i < dy.numel(); ++i) dy.template data<T>()[i] = T(rules::round_to(float(dy.template data<T>()[i]), mixed == 1));
    host->backward(dy);
  }

  T* xd = d.upload(x.template data<T>(), x.numel());
  std::int32_t* ld = d.upload(labels.data(), n);
  const T* zd = net.forward(xd, x.shape());
  net.loss(ld);
  if constexpr (std::is_same_v<T, float>) {
    fused::loss_scaler scaler(d.stream, scale);
    if (mixed == 0) net.backward();
    else net.backward(scaler, mixed == 1);
    EMU_OK(cudaStreamSynchronize(d.stream)); // the scaler's state is read by backward's kernels
  } else {
    REQUIRE_EQ(mixed, 0);
    net.backward();
  }
  const auto z = d.download(zd, logits.numel());
  CHECK(rel_err(z.data(), logits.template data<T>(), logits.numel()) <= tol);
  const auto [loss_sum, right] = net.take_sums();
  CHECK(std::fabs(loss_sum / double(n) - host_loss) <= tol * std::fabs(host_loss));
  CHECK_EQ(right, double(ce.correct()));

  const auto g = d.download(net.grads(), net.size());
  const auto ps = host->parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    INFO("parameter ", i, " ", ps[i]->name);
    CHECK_EQ(net.parameter_name(i), ps[i]->name);
    CHECK(rel_err(g.data() + net.parameter_offset(i), ps[i]->grad.template data<T>(), ps[i]->grad.numel()) <= tol);
  }
  // Every bucket finished once, in bucket order.
  std::vector<std::size_t> in_order(net.bucket_begin().size());
  for (std::size_t b = 0; b < in_order.size(); ++b) in_order[b] = b;
  CHECK(finished == in_order);

  // The running statistics after the step, through store().
  std::mt19937_64 other(99);
  auto back = resnet<T>(1, 10, other, 1, 4, false);
  net.store(*back);
  const auto hb = host->buffers(), bb = back->buffers();
  for (std::size_t i = 0; i < hb.size(); ++i) {
    INFO("buffer ", i);
    CHECK(rel_err(bb[i]->template data<T>(), hb[i]->template data<T>(), hb[i]->numel()) <= tol);
  }
  const auto hp = back->parameters();
  for (std::size_t i = 0; i < hp.size(); ++i) CHECK(std::memcmp(hp[i]->value.template data<T>(), ps[i]->value.template data<T>(), std::size_t(ps[i]->value.numel()) * sizeof(T)) == 0);
  d.pool.deallocate(xd, d.stream);
  d.pool.deallocate(ld, d.stream);
}

} // namespace

TEST_CASE("fused::resnet: one training step equals the host resnet (double, float)") {
  SUBCASE("double") { compare_one_step<double>(1e-10); }
  SUBCASE("float") { compare_one_step<float>(1e-4); }
  SUBCASE("float, mixed precision bf16 (device loss scale, rounded loss gradient)") { compare_one_step<float>(1e-4, 1); }
  SUBCASE("float, mixed precision fp16") { compare_one_step<float>(1e-4, 2); }
}

TEST_CASE("fused::resnet: 2 GPUs on B/2 (bucket reducer, fused SGD) equal 1 GPU on B; the same bits on both ranks") {
  constexpr int steps = 3;
  constexpr std::int64_t B = 8;
  std::mt19937_64 init(5), data(6);
  auto host = resnet<float>(1, 10, init, 1, 4, false);
  std::vector<tensor> xs;
  std::vector<std::vector<std::int32_t>> ls;
  for (int s = 0; s < steps; ++s) {
    xs.push_back(random_images<float>(B, 12, data));
    ls.push_back(random_labels(B, data));
  }
  const double lr = 0.05;

  // One GPU, batch B.
  std::vector<float> single;
  {
    device_side d(0);
    fused::resnet<float> net(1, 10, 1, 4, d.pool, d.stream, d.blas);
    net.load(*host);
    net.set_training(false);
    fused::sgd<float> opt({net.values(), net.grads(), net.size(), net.segments()}, d.stream, 0.9, 5e-4, true);
    for (int s = 0; s < steps; ++s) {
      float* x = d.upload(xs[std::size_t(s)].data<float>(), xs[std::size_t(s)].numel());
      std::int32_t* l = d.upload(ls[std::size_t(s)].data(), B);
      net.zero_grad();
      net.forward(x, xs[std::size_t(s)].shape());
      net.loss(l);
      net.backward();
      opt.step(lr);
      d.pool.deallocate(x, d.stream);
      d.pool.deallocate(l, d.stream);
    }
    single = d.download(net.values(), net.size());
  }

  // Two GPUs, B/2 each. Small collective blocks: fewer emulated threads (fibers), so that the test
  // also runs under ThreadSanitizer, which allows 8128 threads and fibers in all.
  braid::cuda::group_options go;
  go.threads_per_block = 64;
  go.max_blocks_per_rank = 4;
  auto comms = braid::cuda::create_group({0, 1}, go);
  std::vector<float> got[2];
  std::size_t buckets_seen[2] = {0, 0};
  rank_threads::run(2, [&](int r) {
    device_side d(r);
    cudaStream_t comm_stream = nullptr;
    if (cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("stream");
    {
      fused::resnet<float> net(1, 10, 1, 4, d.pool, d.stream, d.blas);
      net.load(*host);
      net.set_training(false);
      net.set_buckets(200); // several buckets, whole tensors each
      fused::bucket_reducer<braid::cuda::communicator> red(comms[std::size_t(r)], net.grads(), net.size(), net.bucket_begin(),
                                                           comm_stream);
      net.on_bucket_ready([&](std::size_t b) {
        red.ready(b, d.stream);
        ++buckets_seen[r];
      });
      fused::sgd<float> opt({net.values(), net.grads(), net.size(), net.segments()}, d.stream, 0.9, 5e-4, true);
      const std::int64_t half = B / 2;
      for (int s = 0; s < steps; ++s) {
        const tensor& full = xs[std::size_t(s)];
        const std::int64_t per = full.numel() / B;
        float* x = d.upload(full.data<float>() + r * half * per, half * per);
        std::int32_t* l = d.upload(ls[std::size_t(s)].data() + r * half, half);
        net.zero_grad();
        net.forward(x, shape_t({half, 1, 12, 12}));
        net.loss(l);
        net.backward();
        red.finish(d.stream);
        opt.step(lr);
        d.pool.deallocate(x, d.stream);
        d.pool.deallocate(l, d.stream);
      }
      got[r] = d.download(net.values(), net.size());
      if (buckets_seen[r] != std::size_t(steps) * net.bucket_begin().size()) throw std::runtime_error("bucket count");
    }
    cudaStreamSynchronize(comm_stream);
    cudaStreamDestroy(comm_stream);
  });
  REQUIRE_EQ(got[0].size(), single.size());
  CHECK(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)) == 0);
  const double e = rel_err(got[0].data(), single.data(), std::int64_t(single.size()));
  INFO("relative difference to one GPU: ", e);
  CHECK(e <= 2e-5);
  // Training moved the weights (the comparison is not of two untouched copies).
  std::vector<float> start(single.size());
  {
    device_side d(0);
    fused::resnet<float> net(1, 10, 1, 4, d.pool, d.stream, d.blas);
    net.load(*host);
    start = d.download(net.values(), net.size());
  }
  CHECK(rel_err(single.data(), start.data(), std::int64_t(start.size())) > 1e-3);
}

TEST_CASE("fused::resnet: refusals") {
  device_side d(0);
  fused::resnet<float> net(1, 10, 1, 4, d.pool, d.stream, d.blas);
  std::mt19937_64 rng(1);
  auto wider = resnet<float>(1, 10, rng, 1, 8, false);
  CHECK_THROWS_AS(net.load(*wider), braid::invalid_argument);
  auto deeper = resnet<float>(2, 10, rng, 1, 4, false);
  CHECK_THROWS_AS(net.store(*deeper), braid::invalid_argument);
  CHECK_THROWS_AS(fused::resnet<float>(0, 10, 1, 4, d.pool, d.stream, d.blas), braid::invalid_argument);
  float* x = static_cast<float*>(d.pool.allocate(2 * 3 * 12 * 12 * sizeof(float), d.stream));
  CHECK_THROWS_AS(net.forward(x, shape_t({2, 3, 12, 12})), braid::invalid_argument); // 3 channels, the model takes 1
  d.pool.deallocate(x, d.stream);
}

TEST_CASE("fused::sequential: a network of one's own (conv, BN, ReLU, a strided basic block, pooling, linear) equals the host's") {
  std::mt19937_64 init(31), data(32);
  sequential<float> host;
  auto& c0 = host.add<conv2d<float>>(1, 6, 3, 1, 1, false, init);
  auto& b0 = host.add<batchnorm2d<float>>(6);
  c0.use_onednn(false);
  b0.use_onednn(false);
  host.add<relu<float>>();
  host.add<basic_block<float>>(6, 12, 2, init, false);
  host.add<global_avgpool<float>>();
  host.add<linear<float>>(12, 7, init);

  device_side d(0);
  fused::sequential<float> net(d.pool, d.stream, d.blas);
  net.add<fused::conv2d>(1, 6, 3, 1, 1);
  net.add<fused::batchnorm2d>(6);
  net.add<fused::relu>();
  net.add<fused::basic_block>(6, 12, 2);
  net.add<fused::global_avgpool>();
  net.add<fused::linear>(12, 7);
  float* x0 = static_cast<float*>(d.pool.allocate(sizeof(float), d.stream));
  CHECK_THROWS_AS(net.forward(x0, shape_t({1, 1, 1, 1})), braid::invalid_argument); // not built yet
  d.pool.deallocate(x0, d.stream);
  net.build();
  CHECK_THROWS_AS(net.build(), braid::invalid_argument);
  CHECK_THROWS_AS(net.add<fused::relu>(), braid::invalid_argument);
  REQUIRE_EQ(net.parameter_count(), host.parameters().size());
  net.load(host);

  const std::int64_t n = 5;
  tensor x = random_images<float>(n, 10, data);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  for (auto& l : labels) l = std::int32_t(data() % 7);
  softmax_cross_entropy<float> ce;
  host.zero_grad();
  tensor logits = host.forward(x);
  const double host_loss = ce.forward(logits, labels);
  host.backward(ce.backward());

  float* xd = d.upload(x.data<float>(), x.numel());
  std::int32_t* ld = d.upload(labels.data(), n);
  const float* zd = net.forward(xd, x.shape());
  CHECK(net.output_shape() == logits.shape());
  net.loss(ld);
  net.backward();
  const auto z = d.download(zd, logits.numel());
  CHECK(rel_err(z.data(), logits.data<float>(), logits.numel()) <= 1e-4);
  const auto [loss_sum, right] = net.take_sums();
  CHECK(std::fabs(loss_sum / double(n) - host_loss) <= 1e-4 * host_loss);
  CHECK_EQ(right, double(ce.correct()));
  const auto g = d.download(net.grads(), net.size());
  const auto ps = host.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    INFO("parameter ", i, " ", ps[i]->name);
    CHECK(rel_err(g.data() + net.parameter_offset(i), ps[i]->grad.data<float>(), ps[i]->grad.numel()) <= 1e-4);
  }
  d.pool.deallocate(xd, d.stream);
  d.pool.deallocate(ld, d.stream);
}
