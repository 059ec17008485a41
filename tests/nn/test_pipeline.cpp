// Pipeline (model) parallelism: a small ResNet cut into two stages on two thread ranks, trained with
// pipeline<float>::train_step (GPipe fill and drain over M micro-batches, recomputation in the
// drain), ends with the same weights, losses and BatchNorm running statistics as the unsplit model
// trained on one rank with gradient accumulation over the same micro-batches (ce.backward(n_i/B) per
// micro-batch, one SGD step per batch). BatchNorm is in training mode: each micro-batch is normalised
// with its own statistics in both runs, so the two are the same computation; what differs is the
// order in which the micro-batches' gradients are summed (M-1 .. 0 against 0 .. M-1), i.e. float
// rounding. And: a wrong split, or stages that disagree on the micro-batching, end in an error on
// both ranks well before the communicator's timeout.
#include <doctest/doctest.h>

#include <braid/nn/optim.hpp>
#include <braid/nn/pipeline.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>

#include "random_batches.hpp"

using namespace braid::nn;

namespace {

constexpr std::uint64_t seed = 7;
constexpr int small_width = 4; // channels 4/8/16: small enough that a step takes milliseconds
constexpr int hw = 12;   // 12x12 images: 12, 6, 3 pixels in the three stages of the ResNet
// resnet(1) has 8 children: conv, bn, relu, 3 basic blocks, global pooling, linear. Stage 0 is the
// stem and the first block, stage 1 the rest.
const std::vector<std::size_t> cuts = {4};

// width 16 is a multiple of oneDNN's channel block on AVX2 (8) and AVX-512 (16) machines: where braid::nn
// has oneDNN, the activations between the layers, the one sent across the cut included, are then in
// its channel-blocked layout.
std::unique_ptr<sequential<float>> make_net(int width = small_width) {
  std::mt19937_64 rng(seed);
  return resnet<float>(1, 10, rng, 1, width);
}

using batches = braid::nn_test::random_batches;
batches make_data(int steps, int B) { return braid::nn_test::make_random_batches(steps, B, hw); }

struct result {
  std::vector<std::vector<float>> params, buffers;
  std::vector<double> losses;
};

std::vector<std::vector<float>> copy_out(const std::vector<tensor*>& ts) {
  std::vector<std::vector<float>> v;
  for (const tensor* t : ts) v.emplace_back(t->data<float>(), t->data<float>() + t->numel());
  return v;
}
std::vector<std::vector<float>> copy_out(const std::vector<parameter*>& ps) {
  std::vector<tensor*> ts;
  for (parameter* p : ps) ts.push_back(&p->value);
  return copy_out(ts);
}

// The reference: the whole model on one rank, gradient accumulation over the micro-batches in order
// (sizes as pipeline's: the first B % M get one sample more); reverse: in the order M-1 .. 0.
result train_unsplit(const batches& d, int M, double scale_sum = 1.0, int width = small_width, bool reverse = false) {
  auto net = make_net(width);
  sgd<float> opt(net->parameters(), 0.9, 1e-3);
  softmax_cross_entropy<float> ce;
  result r;
  for (std::size_t s = 0; s < d.x.size(); ++s) {
    const tensor& x = d.x[s];
    const std::int64_t B = x.dim(0), per = x.numel() / B;
    net->zero_grad();
    double loss = 0;
    for (int k = 0; k < M; ++k) {
      const int i = reverse ? M - 1 - k : k;
      const std::int64_t n = B / M + (i < B % M ? 1 : 0), lo = i * (B / M) + std::min<std::int64_t>(i, B % M);
      tensor xi({n, 1, hw, hw});
      std::memcpy(xi.raw(), x.data<float>() + lo * per, std::size_t(n * per) * sizeof(float));
      const std::vector<std::int32_t> yi(d.y[s].begin() + lo, d.y[s].begin() + lo + n);
      const double w = double(n) / double(B);
      loss += ce.forward(net->forward(xi), yi) * w;
      net->backward(ce.backward(w * scale_sum));
    }
    opt.step(0.1);
    r.losses.push_back(loss);
  }
  r.params = copy_out(net->parameters());
  r.buffers = copy_out(net->buffers());
  return r;
}

// The two stages on two thread ranks; out[r] is stage r's result.
std::vector<result> train_pipelined(const batches& d, int M, int width = small_width) {
  std::vector<result> out(2);
  braid::run_threads(2, [&](braid::communicator& comm) {
    auto net = make_net(width);
    auto stage = take_stage(*net, cuts, comm.rank());
    pipeline<float> pp(*stage, comm, M);
    sgd<float> opt(stage->parameters(), 0.9, 1e-3);
    result& r = out[std::size_t(comm.rank())];
    for (std::size_t s = 0; s < d.x.size(); ++s) {
      stage->zero_grad();
      // x is read on stage 0 only and the labels on stage 1 only: pass each where it is not read empty
      r.losses.push_back(pp.train_step(pp.first() ? d.x[s] : tensor(), pp.last() ? d.y[s] : std::vector<std::int32_t>{}));
      opt.step(0.1);
    }
    r.params = copy_out(stage->parameters());
    r.buffers = copy_out(stage->buffers());
  }, braid::options{}.with_timeout(std::chrono::seconds(60)));
  return out;
}

// Largest |a - b| over stage 0's and stage 1's tensors (concatenated) against the reference's.
double max_abs_diff(const std::vector<std::vector<float>>& s0, const std::vector<std::vector<float>>& s1,
                    const std::vector<std::vector<float>>& ref) {
  std::vector<std::vector<float>> both = s0;
  both.insert(both.end(), s1.begin(), s1.end());
  REQUIRE(both.size() == ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    REQUIRE(both[i].size() == ref[i].size());
    for (std::size_t j = 0; j < ref[i].size(); ++j) worst = std::max(worst, std::abs(double(both[i][j]) - double(ref[i][j])));
  }
  return worst;
}

} // namespace

TEST_CASE("take_stage: the stages' parameters are the whole model's, in order") {
  auto whole = make_net();
  const auto all = copy_out(whole->parameters());
  auto net = make_net();
  const std::size_t n = net->size();
  auto s1 = take_stage(*net, cuts, 1);
  auto s0 = take_stage(*net, std::vector<std::size_t>{}, 0); // what is left: one stage
  CHECK(s0->size() == cuts[0]);
  CHECK(s1->size() == n - cuts[0]);
  CHECK(net->size() == 0);
  CHECK(max_abs_diff(copy_out(s0->parameters()), copy_out(s1->parameters()), all) == 0.0);
  auto again = make_net();
  CHECK_THROWS_AS(take_stage(*again, {4, 4}, 0), braid::invalid_argument);
  CHECK_THROWS_AS(take_stage(*again, {4}, 2), braid::invalid_argument);
  CHECK_THROWS_AS(take_stage(*again, {again->size()}, 0), braid::invalid_argument);
}

TEST_CASE("2 stages on 2 ranks equal the unsplit model with gradient accumulation (weights, losses, BN statistics)") {
  const int steps = 3;
  struct config {
    int B, M, width;
  };
  for (const config c : {config{8, 4, small_width}, config{10, 3, small_width}, config{8, 1, small_width}, config{8, 4, 16}}) {
    INFO("B = " << c.B << ", M = " << c.M << ", width " << c.width);
    const batches d = make_data(steps, c.B);
    const result ref = train_unsplit(d, c.M, 1.0, c.width);
    const auto init = copy_out(make_net(c.width)->parameters());
    const std::vector<result> pp = train_pipelined(d, c.M, c.width);
    const double moved = max_abs_diff(std::vector<std::vector<float>>{}, init, ref.params);
    const double dw = max_abs_diff(pp[0].params, pp[1].params, ref.params);
    const double db = max_abs_diff(pp[0].buffers, pp[1].buffers, ref.buffers);
    double dl = 0;
    for (int r = 0; r < 2; ++r) {
      REQUIRE(pp[std::size_t(r)].losses.size() == ref.losses.size());
      for (std::size_t s = 0; s < ref.losses.size(); ++s)
        dl = std::max(dl, std::abs(pp[std::size_t(r)].losses[s] - ref.losses[s]));
    }
    MESSAGE("B " << c.B << " M " << c.M << " width " << c.width << ": weights moved up to " << moved << "; max |pipeline - unsplit|: weights "
                 << dw << ", BN running statistics " << db << ", losses " << dl << " (first loss " << ref.losses[0] << ")");
    CHECK(moved > 1e-2);                    // the steps did change the weights
    CHECK(pp[0].losses[0] == ref.losses[0]); // the same logits before any step: the same bits
    CHECK(dw < 1e-5);
    CHECK(db < 1e-5);
    CHECK(dl < 1e-5);
  }
}

TEST_CASE("summed in the pipeline's order (micro-batches M-1 .. 0), the unsplit model's weights are the same bits") {
  // The pipeline's backward of micro-batch i is the unsplit model's backward of micro-batch i (the
  // same caches, restored by the recomputation), and both ADD into .grad: in the same order the sums
  // are the same floats. Only the BatchNorm running statistics, updated in the reverse order here,
  // differ (by rounding).
  for (const int width : {small_width, 16}) {
    const batches d = make_data(3, 10);
    const result ref = train_unsplit(d, 3, 1.0, width, true);
    const std::vector<result> pp = train_pipelined(d, 3, width);
    const double dw = max_abs_diff(pp[0].params, pp[1].params, ref.params);
    MESSAGE("width " << width << ": max |pipeline - unsplit in reverse order| of the weights: " << dw);
    CHECK(dw == 0.0);
  }
}

TEST_CASE("the comparison can fail: gradients that are not scaled by n_i/B are told apart") {
  // The reference accumulates M times the full batch's gradient; the pipeline is held to the
  // unscaled reference and must differ from it by far more than the tolerance above.
  const batches d = make_data(2, 8);
  const result wrong = train_unsplit(d, 4, 4.0);
  const std::vector<result> pp = train_pipelined(d, 4);
  const double dw = max_abs_diff(pp[0].params, pp[1].params, wrong.params);
  MESSAGE("against a reference without the 1/M scaling: max weight difference " << dw);
  CHECK(dw > 1e-3);
}

TEST_CASE("forward(): the pipelined forward gives the unsplit model's logits (eval mode)") {
  const batches d = make_data(1, 6);
  auto whole = make_net();
  whole->set_training(false);
  const tensor ref = whole->forward(d.x[0]);
  tensor got;
  braid::run_threads(2, [&](braid::communicator& comm) {
    auto net = make_net();
    auto stage = take_stage(*net, cuts, comm.rank());
    stage->set_training(false);
    pipeline<float> pp(*stage, comm, 3);
    tensor y = pp.forward(pp.first() ? d.x[0] : tensor());
    if (pp.last()) got = y;
    else CHECK(y.shape().rank() == 0); // nothing on the other stages
  }, braid::options{}.with_timeout(std::chrono::seconds(60)));
  REQUIRE(got.shape() == ref.shape());
  CHECK(std::memcmp(got.raw(), ref.raw(), ref.bytes()) == 0);
}

namespace {
// Runs fn on 2 thread ranks with a 20 s timeout; returns each rank's error code (errc{} for none)
// and the seconds it took. run_threads rethrows the root cause, which is caught here.
struct failure_run {
  braid::errc code[2] = {braid::errc{}, braid::errc{}};
  std::string what[2];
  bool threw = false;
  double seconds = 0;
};
template <class F> failure_run run_failing(F fn) {
  failure_run f;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    braid::run_threads(2, [&](braid::communicator& comm) {
      try {
        fn(comm);
      } catch (const braid::error& e) {
        f.code[comm.rank()] = e.code();
        f.what[comm.rank()] = e.what();
        throw;
      }
    }, braid::options{}.with_timeout(std::chrono::seconds(20)));
  } catch (const braid::error&) {
    f.threw = true;
  }
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < 2; ++r) MESSAGE("rank " << r << ": " << f.what[r]);
  MESSAGE("ended after " << f.seconds << " s (timeout 20 s)");
  return f;
}
// What a rank that did not find the error itself may raise: peer_error or mismatch_error at a wait,
// or usage_error (quoting the failure) when it enters a call after the failure was published.
bool is_failure(braid::errc c) {
  return c == braid::errc::mismatch || c == braid::errc::peer_failed || c == braid::errc::invalid_usage;
}
} // namespace

TEST_CASE("a wrong split is an error on both ranks, not a hang") {
  const batches d = make_data(1, 8);
  // Stage 1 starts one block too late: its first block expects 8 channels and receives 4.
  const failure_run f = run_failing([&](braid::communicator& comm) {
    auto net = make_net();
    auto stage = comm.rank() == 0 ? net->extract(0, 4) : net->extract(5, net->size());
    pipeline<float> pp(*stage, comm, 4);
    pp.train_step(d.x[0], d.y[0]);
  });
  CHECK(f.threw);
  CHECK(f.code[1] == braid::errc::invalid_argument); // the layer refused its input ...
  CHECK(is_failure(f.code[0]));                       // ... and stage 0 was told, wherever it waited
  CHECK(f.seconds < 10);
}

TEST_CASE("stages that disagree on the micro-batches, or on the batch, fail with mismatch_error") {
  const batches d = make_data(1, 8);
  SUBCASE("different M") {
    const failure_run f = run_failing([&](braid::communicator& comm) {
      auto net = make_net();
      auto stage = take_stage(*net, cuts, comm.rank());
      pipeline<float> pp(*stage, comm, comm.rank() == 0 ? 2 : 4);
      pp.train_step(d.x[0], d.y[0]);
    });
    CHECK(f.threw);
    CHECK(f.code[1] == braid::errc::mismatch);
    CHECK(is_failure(f.code[0]));
      CHECK(f.seconds < 10);
  }
  SUBCASE("labels for another batch size") {
    const failure_run f = run_failing([&](braid::communicator& comm) {
      auto net = make_net();
      auto stage = take_stage(*net, cuts, comm.rank());
      pipeline<float> pp(*stage, comm, 2);
      std::vector<std::int32_t> y = d.y[0];
      if (comm.rank() == 1) y.resize(6);
      pp.train_step(d.x[0], y);
    });
    CHECK(f.threw);
    CHECK(f.code[1] == braid::errc::mismatch);
    CHECK(is_failure(f.code[0]));
      CHECK(f.seconds < 10);
  }
}
