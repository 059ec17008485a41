// DDP: k ranks (threads) on batch B/k end with the same weights as 1 rank on batch B.
//
// The equivalence is exact in mathematics only when the per-sample gradients do not depend on the
// other samples of the batch. BatchNorm in training mode breaks that (each rank normalises with its
// own batch's statistics), so these networks use BatchNorm in eval mode (fixed running statistics:
// an affine map) or none at all. The remaining difference is float rounding: the order of the sums
// differs between one batch of B and k batches of B/k averaged by all_reduce.
#include <doctest/doctest.h>

#include <braid/nn/ddp.hpp>
#include <braid/nn/loss.hpp>
#include <braid/nn/optim.hpp>

#include <cmath>
#include <random>

#include "../support/fork_ranks.hpp"

#include "random_batches.hpp"

using namespace braid::nn;

namespace {

std::unique_ptr<sequential<float>> small_net(std::uint64_t seed, bool with_bn) {
  std::mt19937_64 rng(seed);
  auto net = std::make_unique<sequential<float>>();
  net->add<conv2d<float>>(1, 4, 3, 1, 1, true, rng);
  if (with_bn) {
    auto& bn = net->add<batchnorm2d<float>>(4);
    // non-trivial running statistics, the same on every rank after the broadcast
    for (int c = 0; c < 4; ++c) {
      bn.running_mean().data<float>()[c] = 0.1f * float(c) + float(seed % 7) * 0.01f;
      bn.running_var().data<float>()[c] = 0.5f + 0.2f * float(c);
    }
  }
  net->add<relu<float>>();
  net->add<maxpool2d<float>>(2, 2);
  net->add<conv2d<float>>(4, 8, 3, 2, 1, false, rng);
  net->add<relu<float>>();
  net->add<global_avgpool<float>>();
  net->add<linear<float>>(8, 10, rng);
  if (with_bn) net->set_training(false); // BatchNorm in eval mode (see the top of this file)
  return net;
}

using batch_data = braid::nn_test::random_batches;
batch_data make_data(int steps, int B) { return braid::nn_test::make_random_batches(steps, B, 8); }

tensor slice(const tensor& x, int from, int count) {
  const std::int64_t per = x.numel() / x.dim(0);
  tensor s({count, x.dim(1), x.dim(2), x.dim(3)});
  std::memcpy(s.raw(), x.data<float>() + from * per, std::size_t(count * per) * sizeof(float));
  return s;
}

std::vector<std::vector<float>> weights(module<float>& m) {
  std::vector<std::vector<float>> w;
  for (parameter* p : m.parameters()) w.emplace_back(p->value.data<float>(), p->value.data<float>() + p->value.numel());
  return w;
}

// Trains `steps` steps of SGD (momentum, weight decay) on rank `r` of `k`, each rank on its B/k slice
// of every batch; `accum` micro-batches per step (no_sync on all but the last).
std::vector<std::vector<float>> train(braid::communicator* comm, bool with_bn, const batch_data& d, int B,
                                      int accum = 1, ddp_options o = {}) {
  const int k = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  auto net = small_net(100 + std::uint64_t(r), with_bn); // different start on each rank: the broadcast fixes it
  std::unique_ptr<ddp<float>> dp;
  if (comm) dp = std::make_unique<ddp<float>>(*net, *comm, o);
  sgd<float> opt(net->parameters(), 0.9, 1e-3);
  softmax_cross_entropy<float> ce;
  const int local = B / k, micro = local / accum;
  for (std::size_t s = 0; s < d.x.size(); ++s) {
    net->zero_grad();
    for (int a = 0; a < accum; ++a) {
      const int from = r * local + a * micro;
      tensor x = slice(d.x[s], from, micro);
      std::vector<std::int32_t> y(d.y[s].begin() + from, d.y[s].begin() + from + micro);
      if (dp) {
        ce.forward(dp->forward(x), y);
        if (a + 1 < accum) {
          auto guard = dp->no_sync();
          dp->backward(ce.backward(1.0 / accum));
        } else {
          dp->backward(ce.backward(1.0 / accum));
        }
      } else {
        ce.forward(net->forward(x), y);
        net->backward(ce.backward(1.0 / accum));
      }
    }
    opt.step(0.1);
  }
  return weights(*net);
}

void check_close(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j)
      worst = std::max(worst, std::abs(double(a[i][j]) - double(b[i][j])) / (1.0 + std::abs(double(b[i][j]))));
  }
  MESSAGE("largest relative weight difference: " << worst);
  CHECK(worst < 2e-5);
}

double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a[i].size(); ++j)
      worst = std::max(worst, std::abs(double(a[i][j]) - double(b[i][j])) / (1.0 + std::abs(double(b[i][j]))));
  return worst;
}

} // namespace

// First in this file (doctest runs a file's cases in order), so the fork happens before any thread.
TEST_CASE("processes: 2 ranks on B/2 equal 1 rank on B (BatchNorm in eval mode)") {
  const int B = 16, steps = 4;
  const auto status = braid::testing::fork_ranks(2, [&](int rank, const braid::unique_id& id) {
    const batch_data d = make_data(steps, B);
    const auto ref = train(nullptr, true, d, B);
    braid::communicator c = braid::communicator::join(id, rank, 2);
    const auto w = train(&c, true, d, B);
    const double worst = max_rel_diff(w, ref);
    if (worst >= 2e-5) std::fprintf(stderr, "rank %d: relative difference %g\n", rank, worst);
    return worst < 2e-5 ? 0 : 1;
  });
  CHECK(status == std::vector<int>{0, 0});
}

TEST_CASE("k ranks on B/k equal 1 rank on B (k = 2, 4; with BatchNorm in eval mode and without)") {
  const int B = 16, steps = 6;
  const batch_data d = make_data(steps, B);
  for (bool bn : {true, false}) {
    const auto ref = train(nullptr, bn, d, B);
    // the runs move the weights: the comparison is not between two untouched initialisations
    const auto init = weights(*small_net(100, bn));
    double moved = 0;
    for (std::size_t i = 0; i < ref.size(); ++i)
      for (std::size_t j = 0; j < ref[i].size(); ++j) moved = std::max(moved, double(std::abs(ref[i][j] - init[i][j])));
    CHECK(moved > 1e-2);
    for (int k : {2, 4}) {
      std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(k));
      braid::run_threads(k, [&](braid::communicator& c) { out[std::size_t(c.rank())] = train(&c, bn, d, B); });
      INFO("k = " << k << ", BatchNorm " << bn);
      check_close(out[0], ref);
      for (int r = 1; r < k; ++r) CHECK(out[std::size_t(r)] == out[0]); // bit-identical replicas
    }
  }
}

TEST_CASE("no_sync: 2 accumulated micro-batches per rank equal one batch; small buckets") {
  const int B = 16, steps = 4;
  const batch_data d = make_data(steps, B);
  const auto ref = train(nullptr, true, d, B);
  ddp_options o;
  o.first_bucket_bytes = 200; // several buckets: the linear layer's 440 bytes of weights alone...
  o.bucket_bytes = 600;
  std::vector<std::vector<std::vector<float>>> out(2);
  braid::run_threads(2, [&](braid::communicator& c) { out[std::size_t(c.rank())] = train(&c, true, d, B, 2, o); });
  check_close(out[0], ref);
  CHECK(out[1] == out[0]);
}

TEST_CASE("buckets: backward order, first bucket small, reduced while backward runs") {
  braid::run_threads(2, [&](braid::communicator& c) {
    auto net = small_net(5, false);
    ddp_options o;
    o.first_bucket_bytes = 64; // the last layer's bias (40 bytes) and then nothing else fits
    o.bucket_bytes = 2000;
    ddp<float> dp(*net, c, o);
    // parameters in backward order: linear.bias (10), linear.weight (80), conv2 (288), conv1.bias (4), conv1 (36)
    const auto sizes = dp.bucket_sizes_bytes();
    REQUIRE(sizes.size() == 2);
    CHECK(sizes[0] == 40);
    CHECK(sizes[1] == (80 + 288 + 4 + 36) * 4);
    tensor x = tensor::zeros({2, 1, 8, 8});
    softmax_cross_entropy<float> ce;
    ce.forward(dp.forward(x), {1, 2});
    dp.backward(ce.backward());
    // the first bucket went out after 1 of the 5 gradients, the second at the end
    CHECK(dp.reduced_after() == std::vector<std::size_t>{1, 5});
    // default sizes: one 1 MiB-capped bucket holds this small model
    ddp<float> dflt(*net, c);
    CHECK(dflt.bucket_count() == 1);
  });
}

TEST_CASE("bf16 gradient communication stays close to float") {
  const int B = 16, steps = 3;
  const batch_data d = make_data(steps, B);
  const auto ref = train(nullptr, false, d, B);
  ddp_options o;
  o.comm_type = braid::dtype::bfloat16;
  std::vector<std::vector<std::vector<float>>> out(2);
  braid::run_threads(2, [&](braid::communicator& c) { out[std::size_t(c.rank())] = train(&c, false, d, B, 1, o); });
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    for (std::size_t j = 0; j < ref[i].size(); ++j) worst = std::max(worst, double(std::abs(out[0][i][j] - ref[i][j])));
  CHECK(worst < 5e-3);
  CHECK(out[1] == out[0]);
}

TEST_CASE("loss scaler: 2^16 start, x2 after 2000 clean steps, /2 and skip on overflow") {
  loss_scaler s;
  CHECK(s.scale() == 65536.0);
  for (int i = 0; i < 1999; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 65536.0);
  CHECK(s.update(false)); // the 2000th clean step
  CHECK(s.scale() == 131072.0);
  CHECK(s.clean_steps() == 0);
  for (int i = 0; i < 10; ++i) s.update(false);
  CHECK_FALSE(s.update(true)); // overflow: skip, halve, restart the count
  CHECK(s.scale() == 65536.0);
  CHECK(s.clean_steps() == 0);
  CHECK(s.skipped() == 1);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 32768.0);
  for (int i = 0; i < 1999; ++i) s.update(false);
  CHECK(s.scale() == 32768.0);
}

TEST_CASE("mixed precision: bf16-rounded model weights, fp32 masters, unscale and overflow check") {
  parameter p{"w", tensor({3}), tensor::zeros({3})};
  const float v[3] = {1.0f + 1.0f / 1024, 3.14159f, -2.5e-3f};
  for (int i = 0; i < 3; ++i) p.value.data<float>()[i] = v[i];
  mixed_precision mp({&p}, braid::dtype::bfloat16);
  auto master = mp.master_params();
  for (int i = 0; i < 3; ++i) {
    CHECK(master[0]->value.data<float>()[i] == v[i]);                               // fp32 master kept
    CHECK(p.value.data<float>()[i] == float(braid::bfloat16(v[i])));                // model sees bf16
  }
  CHECK(p.value.data<float>()[0] == 1.0f); // 1 + 2^-10 is below bf16's resolution at 1
  p.grad.data<float>()[0] = 65536.0f;
  CHECK_FALSE(mp.unscale(65536.0));
  CHECK(master[0]->grad.data<float>()[0] == 1.0f); // the master's grad is the model's grad
  p.grad.data<float>()[1] = INFINITY;
  CHECK(mp.unscale(2.0));
  // an SGD step on the masters accumulates updates below bf16's resolution
  p.grad.zero();
  p.grad.data<float>()[0] = -1.0f;
  sgd<float> opt(master);
  for (int i = 0; i < 4; ++i) opt.step(1.0f / 1024);
  mp.round_into_model();
  CHECK(master[0]->value.data<float>()[0] == doctest::Approx(1.0 + 5.0 / 1024));
  CHECK(p.value.data<float>()[0] == float(braid::bfloat16(1.0f + 5.0f / 1024)));
}

namespace {

// A task the small network can learn: 4 classes, each a fixed random 8x8 pattern; an image is its
// class's pattern plus noise of half its amplitude. `steps` global batches of B.
batch_data make_pattern_data(int steps, int B) {
  std::mt19937_64 rng(99);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> pat(4 * 64);
  for (float& v : pat) v = n(rng);
  batch_data d;
  for (int s = 0; s < steps; ++s) {
    tensor x({B, 1, 8, 8});
    std::vector<std::int32_t> y(static_cast<std::size_t>(B));
    for (int i = 0; i < B; ++i) {
      y[std::size_t(i)] = std::int32_t(rng() % 4);
      for (int j = 0; j < 64; ++j) x.data<float>()[i * 64 + j] = pat[std::size_t(y[std::size_t(i)] * 64 + j)] + 0.5f * n(rng);
    }
    d.x.push_back(x);
    d.y.push_back(y);
  }
  return d;
}

} // namespace

TEST_CASE("fp16 mixed precision: a scale too large for fp16 overflows; the step is skipped, the scale halves") {
  const batch_data d = make_pattern_data(1, 16);
  auto net = small_net(7, false);
  mixed_precision mp(net->parameters(), braid::dtype::float16);
  CHECK(mp.compute_type() == braid::dtype::float16);
  auto master = mp.master_params();
  sgd<float> opt(master, 0.9);
  loss_scaler scaler(std::ldexp(1.0, 40), 4);
  const auto model_before = weights(*net);
  std::vector<std::vector<float>> master_before;
  for (parameter* p : master) master_before.emplace_back(p->value.data<float>(), p->value.data<float>() + p->value.numel());
  softmax_cross_entropy<float> ce;
  ce.forward(net->forward(d.x[0]), d.y[0]);
  net->backward(ce.backward(scaler.scale()));
  // The scaled gradients are finite in float and some exceed fp16's largest finite value, 65504:
  // the overflow below is fp16's range, not float's.
  float largest = 0;
  for (parameter* p : master)
    for (std::int64_t j = 0; j < p->grad.numel(); ++j) {
      REQUIRE(std::isfinite(p->grad.data<float>()[j]));
      largest = std::max(largest, std::abs(p->grad.data<float>()[j]));
    }
  CHECK(largest > 65504.0f);
  CHECK_FALSE(mp.step(opt, scaler, 0.1)); // overflow: skipped
  CHECK(scaler.scale() == std::ldexp(1.0, 39));
  CHECK(scaler.skipped() == 1);
  CHECK(scaler.clean_steps() == 0);
  CHECK(weights(*net) == model_before); // neither the model nor the masters moved
  for (std::size_t i = 0; i < master.size(); ++i)
    CHECK(std::vector<float>(master[i]->value.data<float>(), master[i]->value.data<float>() + master[i]->value.numel()) ==
          master_before[i]);
  // The same gradient values fit bf16 (float's range): no overflow there.
  parameter big{"g", tensor({1}), tensor({1})};
  mixed_precision bf({&big}, braid::dtype::bfloat16);
  big.grad.data<float>()[0] = largest;
  CHECK_FALSE(bf.unscale(1.0));
  // round(): to the nearest half, ties to even; beyond 65504 (and its rounding margin) to inf.
  tensor t({4});
  const float in[4] = {1.0f + 1.0f / 4096, 65504.0f, 65520.0f, 1e-8f};
  for (int i = 0; i < 4; ++i) t.data<float>()[i] = in[i];
  mp.round(t);
  CHECK(t.data<float>()[0] == 1.0f);
  CHECK(t.data<float>()[1] == 65504.0f);
  CHECK(std::isinf(t.data<float>()[2]));
  CHECK(t.data<float>()[3] == 0.0f); // below half's smallest subnormal, 2^-24
}

TEST_CASE("fp16 mixed precision on 2 ranks: the scale doubles after 5 clean steps, halves on overflow; the loss falls") {
  const int B = 16, steps = 80, interval = 5;
  const batch_data d = make_pattern_data(steps, B);
  struct record {
    std::vector<double> loss, scale_before;
    std::vector<bool> applied;
    std::uint64_t skipped = 0;
    std::vector<std::vector<float>> w;
  };
  std::vector<record> out(2);
  braid::run_threads(2, [&](braid::communicator& c) {
    record& rec = out[std::size_t(c.rank())];
    auto net = small_net(100 + std::uint64_t(c.rank()), false);
    ddp_options o;
    o.comm_type = braid::dtype::float16; // fp16 gradient traffic, summed in float
    ddp<float> dp(*net, c, o);
    mixed_precision mp(net->parameters(), braid::dtype::float16);
    sgd<float> opt(mp.master_params(), 0.9);
    loss_scaler scaler(256.0, interval);
    softmax_cross_entropy<float> ce;
    const int local = B / 2, from = c.rank() * local;
    for (int s = 0; s < steps; ++s) {
      tensor x = slice(d.x[std::size_t(s)], from, local);
      mp.round(x);
      std::vector<std::int32_t> y(d.y[std::size_t(s)].begin() + from, d.y[std::size_t(s)].begin() + from + local);
      net->zero_grad();
      double l = ce.forward(dp.forward(x), y);
      c.all_reduce(&l, &l, 1, braid::avg{});
      tensor dy = ce.backward(scaler.scale());
      mp.round(dy);
      dp.backward(dy);
      rec.loss.push_back(l);
      rec.scale_before.push_back(scaler.scale());
      rec.applied.push_back(mp.step(opt, scaler, 0.05));
    }
    rec.skipped = scaler.skipped();
    rec.w = weights(*net);
  });
  const record& r = out[0];
  // 256 is far from fp16's limits: the first 5 steps are clean, and the 5th doubles the scale.
  for (int s = 0; s < interval; ++s) {
    CHECK(r.applied[std::size_t(s)]);
    CHECK(r.scale_before[std::size_t(s)] == 256.0);
  }
  CHECK(r.scale_before[interval] == 512.0);
  // The scale keeps growing until a gradient overflows fp16: that step is skipped and the scale halves.
  CHECK(r.skipped >= 1);
  int checked = 0;
  for (int s = 0; s + 1 < steps; ++s)
    if (!r.applied[std::size_t(s)]) {
      CHECK(r.scale_before[std::size_t(s) + 1] == r.scale_before[std::size_t(s)] / 2);
      ++checked;
    }
  CHECK(checked == int(r.skipped) - (r.applied.back() ? 0 : 1));
  double first = 0, last = 0;
  for (int s = 0; s < 10; ++s) {
    first += r.loss[std::size_t(s)] / 10;
    last += r.loss[std::size_t(steps - 10 + s)] / 10;
  }
  MESSAGE("fp16: mean loss of the first 10 steps " << first << ", of the last 10 " << last << "; skipped "
                                                  << r.skipped << ", final scale " << r.scale_before.back());
  CHECK(first > 1.0);
  CHECK(last < 0.5 * first);
  CHECK(out[1].w == out[0].w); // both ranks took the same decisions: bit-identical replicas
  CHECK(out[1].scale_before == out[0].scale_before);
}
