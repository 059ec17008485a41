// Layers: every gradient (input and parameters) against central finite differences in double
// precision; BatchNorm's running statistics and eval mode; the memory pool's statistics.
#include <doctest/doctest.h>

#include <braid/nn/layers.hpp>
#include <braid/nn/loss.hpp>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>

using namespace braid::nn;

namespace {

tensor random_tensor(shape_t s, std::mt19937_64& rng, double scale = 1.0) {
  tensor t(s, braid::dtype::float64);
  std::normal_distribution<double> d(0.0, scale);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = d(rng);
  return t;
}

double dot(const tensor& a, const tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

tensor to_float(const tensor& d) {
  tensor f(d.shape(), braid::dtype::float32);
  convert(d, f);
  return f;
}

// Float tensors a and b agree: the largest |a - b| over the largest |b| (at least `floor`) is at most
// tol. Returns that relative difference (the oneDNN tests report the largest one they saw).
double check_close(const tensor& a, const tensor& b, const std::string& what, double tol, double floor) {
  REQUIRE(a.shape() == b.shape());
  double scale = floor, worst = 0;
  for (std::int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, double(std::abs(b.data<float>()[i])));
  for (std::int64_t i = 0; i < b.numel(); ++i)
    worst = std::max(worst, double(std::abs(a.data<float>()[i] - b.data<float>()[i])) / scale);
  INFO(what << ": largest difference " << worst << " of the largest magnitude " << scale);
  CHECK(worst <= tol);
  return worst;
}

// Checks d(sum(forward(x) * r))/dx and /dparam against central differences, on every element (or on
// `max_checks` evenly spread ones for large tensors). Returns the number of elements checked.
int check_gradients(module<double>& m, const tensor& x, std::mt19937_64& rng, double tol = 1e-6) {
  tensor y = m.forward(x);
  tensor r = random_tensor(y.shape(), rng);
  m.zero_grad();
  tensor dx = m.backward(r);
  auto loss = [&] { return dot(m.forward(x), r); };
  const double eps = 1e-5;
  int checked = 0;
  auto check = [&](const tensor& v, const tensor& g, const char* what) {
    const std::int64_t n = v.numel();
    const std::int64_t stride = std::max<std::int64_t>(1, n / 60);
    for (std::int64_t i = 0; i < n; i += stride) {
      double& e = v.data<double>()[i];
      const double keep = e;
      e = keep + eps;
      const double up = loss();
      e = keep - eps;
      const double down = loss();
      e = keep;
      const double num = (up - down) / (2 * eps);
      const double ana = g.data<double>()[i];
      INFO(what << "[" << i << "]: analytic " << ana << " numeric " << num);
      CHECK(std::abs(ana - num) <= tol * std::max({1.0, std::abs(ana), std::abs(num)}));
      ++checked;
    }
  };
  check(x, dx, "input");
  for (parameter* p : m.parameters()) check(p->value, p->grad, p->name.c_str());
  return checked;
}

} // namespace

TEST_CASE("conv2d gradients (stride 1 pad 1, stride 2 pad 0, with bias)") {
  std::mt19937_64 rng(1);
  conv2d<double> a(3, 4, 3, 1, 1, true, rng);
  CHECK(check_gradients(a, random_tensor({2, 3, 5, 6}, rng), rng) > 100);
  conv2d<double> b(2, 3, 3, 2, 0, false, rng);
  check_gradients(b, random_tensor({2, 2, 7, 7}, rng), rng);
  conv2d<double> c(2, 5, 1, 2, 0, false, rng);
  check_gradients(c, random_tensor({3, 2, 6, 6}, rng), rng);
}

TEST_CASE("conv2d forward equals a direct convolution") {
  std::mt19937_64 rng(2);
  conv2d<double> c(2, 3, 3, 2, 1, true, rng);
  parameter& w = c.weight();
  tensor x = random_tensor({1, 2, 5, 5}, rng);
  tensor y = c.forward(x);
  REQUIRE(y.shape() == shape_t({1, 3, 3, 3}));
  const double* b = c.parameters()[1]->value.data<double>();
  for (int o = 0; o < 3; ++o)
    for (int oy = 0; oy < 3; ++oy)
      for (int ox = 0; ox < 3; ++ox) {
        double s = b[o];
        for (int ch = 0; ch < 2; ++ch)
          for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j) {
              const int iy = oy * 2 - 1 + i, ix = ox * 2 - 1 + j;
              if (iy < 0 || iy >= 5 || ix < 0 || ix >= 5) continue;
              s += w.value.data<double>()[((o * 2 + ch) * 3 + i) * 3 + j] * x.data<double>()[(ch * 5 + iy) * 5 + ix];
            }
        CHECK(y.data<double>()[(o * 3 + oy) * 3 + ox] == doctest::Approx(s).epsilon(1e-12));
      }
}

// Where braid::nn has oneDNN, conv2d<float> runs on it; the same layer with use_onednn(false) runs the
// im2col + BLAS path. Both from the same weights and data, twice in a row (the second forward and
// backward reuse the cached primitives, and the parameter gradients accumulate over both), then on a
// second input shape (primitives re-created). Geometries: strides 1-3, padding 0-2, kernels 1/3/5,
// odd and non-square sizes, batch 1, 1 input channel (the first layer of the trainer's ResNet).
TEST_CASE("conv2d<float> on oneDNN equals the im2col + BLAS path (forward, dx, dw, db)") {
  struct geo {
    int n, c, o, k, s, p, h, w;
    bool bias;
  };
  const geo geos[] = {{4, 3, 8, 3, 1, 1, 9, 9, true},    {1, 16, 16, 3, 1, 1, 28, 28, false},
                      {2, 5, 7, 3, 2, 1, 11, 13, true},  {3, 4, 6, 1, 2, 0, 7, 8, false},
                      {1, 1, 16, 3, 1, 1, 28, 28, false}, {2, 16, 32, 3, 2, 1, 28, 28, false},
                      {2, 6, 5, 5, 3, 2, 10, 9, true},   {5, 32, 64, 1, 2, 0, 14, 14, false}};
  double worst = 0;
  auto close = [&](const tensor& a, const tensor& b, const std::string& what) {
    worst = std::max(worst, check_close(a, b, what, 1e-5, 1));
  };
  for (const geo& g : geos) {
    CAPTURE(g.n);
    CAPTURE(g.c);
    CAPTURE(g.o);
    CAPTURE(g.k);
    CAPTURE(g.s);
    CAPTURE(g.p);
    CAPTURE(g.h);
    CAPTURE(g.w);
    std::mt19937_64 r1(7), r2(7);
    conv2d<float> fast(g.c, g.o, g.k, g.s, g.p, g.bias, r1), hand(g.c, g.o, g.k, g.s, g.p, g.bias, r2);
    hand.use_onednn(false);
    CHECK(!hand.uses_onednn());
#if BRAID_HAVE_DNNL
    CHECK(fast.uses_onednn());
#else
    CHECK(!fast.uses_onednn());
#endif
    if (g.bias) { // a non-zero bias
      fast.parameters()[1]->value.fill<float>(0.25f);
      hand.parameters()[1]->value.fill<float>(0.25f);
    }
    std::mt19937_64 rng(11);
    for (int shape = 0; shape < 2; ++shape) {
      const int n = shape == 0 ? g.n : g.n + 1, h = shape == 0 ? g.h : g.h + 3, w = shape == 0 ? g.w : g.w + 1;
      fast.zero_grad();
      hand.zero_grad();
      for (int rep = 0; rep < 2; ++rep) {
        tensor x = to_float(random_tensor({n, g.c, h, w}, rng));
        tensor ya = fast.forward(x), yb = hand.forward(x);
        close(ya, yb, "y");
        tensor dy = to_float(random_tensor(yb.shape(), rng));
        tensor dxa = fast.backward(dy), dxb = hand.backward(dy);
        close(dxa, dxb, "dx");
      }
      const auto pa = fast.parameters(), pb = hand.parameters();
      for (std::size_t i = 0; i < pa.size(); ++i) close(pa[i]->grad, pb[i]->grad, pa[i]->name.c_str());
    }
    if (fast.uses_onednn()) MESSAGE("oneDNN implementations: " << fast.onednn_impl());
  }
  MESSAGE("largest relative difference: " << worst);
  conv2d<double> dbl(2, 3, 3, 1, 1, false, *std::make_unique<std::mt19937_64>(1));
  CHECK(!dbl.uses_onednn());
  CHECK_THROWS(dbl.use_onednn(true));
}

// Likewise batchnorm2d<float>: oneDNN against the hand-written loops, training mode (output, dx,
// dgamma, dbeta and the running statistics after two steps) and then eval mode, on several shapes.
TEST_CASE("batchnorm2d<float> on oneDNN equals the hand-written path (both modes)") {
  const shape_t shapes[] = {{4, 3, 5, 6}, {1, 16, 28, 28}, {7, 5, 3, 1}, {2, 64, 7, 7}};
  double worst = 0;
  auto close = [&](const tensor& a, const tensor& b, const std::string& what) {
    worst = std::max(worst, check_close(a, b, what, 2e-5, 1));
  };
  std::mt19937_64 rng(13);
  for (const shape_t& s : shapes) {
    CAPTURE(s.str());
    batchnorm2d<float> fast{int(s[1])}, hand{int(s[1])};
    hand.use_onednn(false);
    CHECK(!hand.uses_onednn());
#if BRAID_HAVE_DNNL
    CHECK(fast.uses_onednn());
#endif
    for (int i = 0; i < 2; ++i) { // non-trivial gamma and beta
      tensor v = to_float(random_tensor({s[1]}, rng));
      for (std::int64_t c = 0; c < s[1]; ++c) {
        fast.parameters()[std::size_t(i)]->value.data<float>()[c] = 1.0f + 0.5f * v.data<float>()[c];
        hand.parameters()[std::size_t(i)]->value.data<float>()[c] = 1.0f + 0.5f * v.data<float>()[c];
      }
    }
    for (bool training : {true, true, false}) {
      fast.set_training(training);
      hand.set_training(training);
      fast.zero_grad();
      hand.zero_grad();
      tensor x = to_float(random_tensor(s, rng, 3.0));
      for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += 1.5f; // a non-zero mean
      close(fast.forward(x), hand.forward(x), "y");
      tensor dy = to_float(random_tensor(s, rng));
      close(fast.backward(dy), hand.backward(dy), "dx");
      const auto pa = fast.parameters(), pb = hand.parameters();
      for (std::size_t i = 0; i < pa.size(); ++i) close(pa[i]->grad, pb[i]->grad, pa[i]->name.c_str());
      close(fast.running_mean(), hand.running_mean(), "running mean");
      close(fast.running_var(), hand.running_var(), "running var");
    }
  }
  MESSAGE("largest relative difference: " << worst);
  batchnorm2d<double> dbl(2);
  CHECK(!dbl.uses_onednn());
  CHECK_THROWS(dbl.use_onednn(true));
}

// A whole float ResNet (width 16: on AVX-512 its activations stay in oneDNN's nChw16c between the
// first convolution and the global pooling) against the same network on the hand-written path:
// logits, dL/dx, every parameter gradient and the BatchNorm running statistics, over two training
// steps' forward and backward and one in eval mode.
TEST_CASE("resnet<float> on oneDNN (blocked activations) equals the hand-written network") {
  std::mt19937_64 r1(21), r2(21), rng(22);
  auto fast = resnet<float>(1, 10, r1, 1, 16);
  auto hand = resnet<float>(1, 10, r2, 1, 16, false);
#if BRAID_HAVE_DNNL
  MESSAGE("oneDNN channel block: " << onednn::block());
#endif
  double worst = 0;
  auto close = [&](const tensor& a, const tensor& b, const std::string& what) {
    worst = std::max(worst, check_close(a, b, what, 1e-4, 1e-3));
  };
  for (bool training : {true, true, false}) {
    fast->set_training(training);
    hand->set_training(training);
    fast->zero_grad();
    hand->zero_grad();
    tensor x = to_float(random_tensor({3, 1, 12, 11}, rng));
    close(fast->forward(x), hand->forward(x), "logits");
    tensor dy = to_float(random_tensor({3, 10}, rng));
    close(fast->backward(dy), hand->backward(dy), "dx");
    const auto pa = fast->parameters(), pb = hand->parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) close(pa[i]->grad, pb[i]->grad, pa[i]->name + " " + std::to_string(i));
    const auto ba = fast->buffers(), bb = hand->buffers();
    for (std::size_t i = 0; i < ba.size(); ++i) close(*ba[i], *bb[i], "buffer " + std::to_string(i));
  }
  MESSAGE("largest relative difference: " << worst);
}

TEST_CASE("batchnorm2d gradients in training and eval mode") {
  std::mt19937_64 rng(3);
  batchnorm2d<double> bn(3);
  // non-trivial gamma and beta
  for (parameter* p : bn.parameters())
    for (std::int64_t i = 0; i < p->value.numel(); ++i) p->value.data<double>()[i] += 0.3 * double(i + 1);
  tensor x = random_tensor({4, 3, 3, 2}, rng, 2.0);
  check_gradients(bn, x, rng);
  bn.set_training(false);
  check_gradients(bn, x, rng);
}

TEST_CASE("batchnorm2d running statistics follow momentum 0.1 with the unbiased variance") {
  std::mt19937_64 rng(4);
  batchnorm2d<double> bn(1);
  tensor x({2, 1, 1, 2}, braid::dtype::float64);
  const double v[4] = {1, 2, 3, 6};
  for (int i = 0; i < 4; ++i) x.data<double>()[i] = v[i];
  tensor y = bn.forward(x);
  // mean 3, biased var (4+1+0+9)/4 = 3.5, unbiased 14/3
  CHECK(bn.running_mean().data<double>()[0] == doctest::Approx(0.9 * 0 + 0.1 * 3));
  CHECK(bn.running_var().data<double>()[0] == doctest::Approx(0.9 * 1 + 0.1 * 14.0 / 3));
  CHECK(y.data<double>()[0] == doctest::Approx((1 - 3) / std::sqrt(3.5 + 1e-5)));
  bn.set_training(false);
  tensor z = bn.forward(x);
  CHECK(z.data<double>()[3] == doctest::Approx((6 - 0.3) / std::sqrt(0.9 + 1.4 / 3 + 1e-5)));
}

TEST_CASE("relu, pooling, global average pooling, flatten, linear gradients") {
  std::mt19937_64 rng(5);
  relu<double> r;
  check_gradients(r, random_tensor({2, 3, 4, 4}, rng), rng);
  maxpool2d<double> mp(2, 2);
  check_gradients(mp, random_tensor({2, 3, 5, 4}, rng), rng);
  maxpool2d<double> mp3(3, 1);
  check_gradients(mp3, random_tensor({1, 2, 5, 5}, rng), rng);
  avgpool2d<double> ap(2, 2);
  check_gradients(ap, random_tensor({2, 3, 4, 6}, rng), rng);
  global_avgpool<double> gap;
  check_gradients(gap, random_tensor({3, 4, 3, 5}, rng), rng);
  flatten<double> f;
  check_gradients(f, random_tensor({2, 3, 2, 2}, rng), rng);
  linear<double> l(7, 5, rng);
  check_gradients(l, random_tensor({4, 7}, rng), rng);
}

TEST_CASE("residual blocks (identity and projection shortcuts) and a small ResNet") {
  std::mt19937_64 rng(6);
  basic_block<double> same(3, 3, 1, rng);
  check_gradients(same, random_tensor({2, 3, 4, 4}, rng), rng);
  basic_block<double> proj(2, 4, 2, rng);
  check_gradients(proj, random_tensor({2, 2, 6, 6}, rng), rng);
  auto net = resnet<double>(1, 3, rng, 1, 2);
  check_gradients(*net, random_tensor({3, 1, 8, 8}, rng), rng);
}

TEST_CASE("residual add sums elementwise and refuses shape mismatches") {
  std::mt19937_64 rng(7);
  tensor a = random_tensor({2, 3}, rng), b = random_tensor({2, 3}, rng);
  tensor c = add<double>(a, b);
  for (int i = 0; i < 6; ++i) CHECK(c.data<double>()[i] == a.data<double>()[i] + b.data<double>()[i]);
  CHECK_THROWS_AS(add<double>(a, random_tensor({3, 2}, rng)), braid::invalid_argument);
}

TEST_CASE("softmax cross-entropy: value and gradient") {
  std::mt19937_64 rng(8);
  tensor z = random_tensor({4, 5}, rng, 3.0);
  std::vector<std::int32_t> y = {0, 4, 2, 2};
  softmax_cross_entropy<double> ce;
  const double l = ce.forward(z, y);
  double ref = 0;
  for (int i = 0; i < 4; ++i) {
    double s = 0;
    for (int j = 0; j < 5; ++j) s += std::exp(z.data<double>()[i * 5 + j]);
    ref += -(z.data<double>()[i * 5 + y[std::size_t(i)]] - std::log(s));
  }
  CHECK(l == doctest::Approx(ref / 4).epsilon(1e-12));
  tensor g = ce.backward(2.0);
  for (std::int64_t i = 0; i < 20; ++i) {
    double& e = z.data<double>()[i];
    const double keep = e;
    e = keep + 1e-6;
    const double up = ce.forward(z, y);
    e = keep - 1e-6;
    const double down = ce.forward(z, y);
    e = keep;
    CHECK(g.data<double>()[i] == doctest::Approx(2.0 * (up - down) / 2e-6).epsilon(1e-6));
  }
  CHECK_THROWS_AS(ce.forward(z, {0, 1, 2, 5}), braid::invalid_argument);
}

TEST_CASE("float layers agree with double layers") {
  std::mt19937_64 r1(9), r2(9);
  auto nd = resnet<double>(1, 4, r1, 1, 4);
  auto nf = resnet<float>(1, 4, r2, 1, 4);
  std::mt19937_64 rng(10);
  tensor xd = random_tensor({2, 1, 8, 8}, rng);
  tensor xf({2, 1, 8, 8});
  convert(xd, xf);
  tensor yd = nd->forward(xd), yf = nf->forward(xf);
  for (std::int64_t i = 0; i < yd.numel(); ++i)
    CHECK(double(yf.data<float>()[i]) == doctest::Approx(yd.data<double>()[i]).epsilon(1e-4).scale(1));
}

TEST_CASE("memory pool: reuse by size class, statistics") {
  memory_pool pool;
  {
    tensor a({1000}, braid::dtype::float32, device::host, pool); // 4000 B -> 4096 class
    CHECK(pool.stats().in_use == 4096);
    CHECK(pool.stats().system_allocs == 1);
  }
  CHECK(pool.stats().in_use == 0);
  CHECK(pool.stats().cached == 4096);
  {
    tensor b({1024}, braid::dtype::float32, device::host, pool); // same class: served from cache
    tensor c({10}, braid::dtype::float64, device::host, pool);   // 80 B -> 256 class, new
    CHECK(pool.stats().hits == 1);
    CHECK(pool.stats().system_allocs == 2);
    CHECK(pool.stats().in_use == 4096 + 256);
    CHECK(pool.stats().peak_in_use == 4096 + 256);
    CHECK(reinterpret_cast<std::uintptr_t>(b.raw()) % memory_pool::alignment == 0);
  }
  CHECK(pool.stats().cached == 4096 + 256);
  CHECK(pool.stats().reserved == 4096 + 256);
  pool.release_cached();
  CHECK(pool.stats().cached == 0);
  CHECK(pool.stats().reserved == 0);
  CHECK(pool.stats().peak_in_use == 4096 + 256);
  CHECK(memory_pool::size_class(5u << 20) == (5u << 20));
  CHECK(memory_pool::size_class((5u << 20) + 1) == (6u << 20));
  CHECK_THROWS_AS(tensor({2}, braid::dtype::int32), braid::unsupported_error);
  CHECK_THROWS_AS(tensor({2}, braid::dtype::float32, device::cuda), braid::unsupported_error);
  CHECK_THROWS_AS(tensor({2}).data<double>(), braid::invalid_argument);
}
