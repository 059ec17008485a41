// Optimizers, schedules and clipping against steps computed by hand from the published definitions
// (SGD and schedules: by hand in the comments; Adam, AdamW and LAMB: the paper's formulas evaluated
// step by step in double, values quoted to 16 digits).
#include <doctest/doctest.h>

#include <braid/nn/optim.hpp>

#include <cmath>

using namespace braid::nn;

namespace {
struct one_param {
  parameter p;
  explicit one_param(std::vector<double> v) {
    const auto n = std::int64_t(v.size());
    p = parameter{"w", tensor({n}, braid::dtype::float64), tensor::zeros({n}, braid::dtype::float64)};
    for (std::size_t i = 0; i < v.size(); ++i) p.value.data<double>()[i] = v[i];
  }
  void grad(std::vector<double> g) {
    for (std::size_t i = 0; i < g.size(); ++i) p.grad.data<double>()[i] = g[i];
  }
  double operator[](int i) { return p.value.data<double>()[i]; }
};
} // namespace

TEST_CASE("SGD: plain, momentum with weight decay, Nesterov") {
  {
    one_param w({1.0});
    sgd<double> o({&w.p});
    w.grad({2.0});
    o.step(0.5);
    CHECK(w[0] == doctest::Approx(0.0)); // 1 - 0.5*2
  }
  {
    one_param w({1.0});
    sgd<double> o({&w.p}, 0.9, 0.1);
    w.grad({2.0});
    o.step(0.5); // d = 2 + 0.1*1 = 2.1, b = 2.1, p = 1 - 1.05
    CHECK(w[0] == doctest::Approx(-0.05).epsilon(1e-14));
    w.grad({-1.0});
    o.step(0.5); // d = -1 - 0.005 = -1.005, b = 1.89 - 1.005 = 0.885, p = -0.05 - 0.4425
    CHECK(w[0] == doctest::Approx(-0.4925).epsilon(1e-14));
  }
  {
    one_param w({1.0});
    sgd<double> o({&w.p}, 0.9, 0.1, true);
    w.grad({2.0});
    o.step(0.5); // d = 2.1, b = 2.1, d' = 2.1 + 1.89 = 3.99, p = 1 - 1.995
    CHECK(w[0] == doctest::Approx(-0.995).epsilon(1e-14));
    w.grad({-1.0});
    o.step(0.5); // d = -1.0995, b = 0.7905, d' = -0.38805, p = -0.995 + 0.194025
    CHECK(w[0] == doctest::Approx(-0.800975).epsilon(1e-14));
  }
  {
    one_param w({1.0});
    sgd<double> o({&w.p}, 0.5, 0.0, false, 0.5); // dampening applies from the second step
    w.grad({1.0});
    o.step(1.0); // b = 1, p = 0
    w.grad({1.0});
    o.step(1.0); // b = 0.5 + 0.5 = 1, p = -1
    CHECK(w[0] == doctest::Approx(-1.0));
  }
  one_param w({1.0});
  CHECK_THROWS_AS(sgd<double>({&w.p}, 0.0, 0.0, true), braid::invalid_argument);
}

TEST_CASE("Adam and AdamW: two steps") {
  one_param a({1.0}), b({1.0}), c({1.0});
  adam<double> oa({&a.p});
  adam<double> ob({&b.p}, 0.1, true);
  adam<double> oc({&c.p}, 0.1, false); // L2: step 1 moves by lr whatever the gradient scale
  a.grad({2.0});
  b.grad({2.0});
  c.grad({2.0});
  oa.step(0.1);
  ob.step(0.1);
  oc.step(0.1);
  CHECK(a[0] == doctest::Approx(0.9000000005).epsilon(1e-14));
  CHECK(b[0] == doctest::Approx(0.8900000004999999).epsilon(1e-14));
  CHECK(c[0] == doctest::Approx(1.0 - 0.1 * 2.1 / (2.1 + 1e-8)).epsilon(1e-14));
  a.grad({-1.0});
  b.grad({-1.0});
  oa.step(0.1);
  ob.step(0.1);
  CHECK(a[0] == doctest::Approx(0.8733662967024315).epsilon(1e-13));
  CHECK(b[0] == doctest::Approx(0.8544662966974315).epsilon(1e-13));
  CHECK(oa.steps() == 2);
  CHECK(ob.name() == "adamw");
}

TEST_CASE("LAMB: trust ratio ||p||/||r|| per tensor, two steps") {
  one_param w({3.0, 4.0});
  lamb<double> o({&w.p}, 0.01);
  w.grad({1.0, -2.0});
  o.step(0.1);
  CHECK(o.last_trust_ratio() == doctest::Approx(3.551106825892046).epsilon(1e-12));
  CHECK(w[0] == doctest::Approx(2.634236352043447).epsilon(1e-13));
  CHECK(w[1] == doctest::Approx(4.340906077730384).epsilon(1e-13));
  w.grad({0.5, 0.5});
  o.step(0.1);
  CHECK(o.last_trust_ratio() == doctest::Approx(4.840727974560717).epsilon(1e-12));
  CHECK(w[0] == doctest::Approx(2.170242495818454).epsilon(1e-13));
  CHECK(w[1] == doctest::Approx(4.547149547266993).epsilon(1e-13));
  // zero weights: trust ratio 1
  one_param z({0.0, 0.0});
  lamb<double> oz({&z.p});
  z.grad({1.0, 1.0});
  oz.step(0.1);
  CHECK(oz.last_trust_ratio() == 1.0);
}

TEST_CASE("float parameters follow the double computation") {
  parameter p{"w", tensor({1}), tensor::zeros({1})};
  p.value.data<float>()[0] = 1.0f;
  adam<float> o({&p});
  p.grad.data<float>()[0] = 2.0f;
  o.step(0.1);
  p.grad.data<float>()[0] = -1.0f;
  o.step(0.1);
  CHECK(double(p.value.data<float>()[0]) == doctest::Approx(0.8733662967024315).epsilon(1e-6));
}

TEST_CASE("schedules: step, linear warmup, cosine") {
  schedule s = schedule::step_lr(0.1, 10, 0.5);
  CHECK(s.at(0) == doctest::Approx(0.1));
  CHECK(s.at(9) == doctest::Approx(0.1));
  CHECK(s.at(10) == doctest::Approx(0.05));
  CHECK(s.at(25) == doctest::Approx(0.025));
  schedule c = schedule::cosine_lr(1.0, 105, 5);
  CHECK(c.at(0) == doctest::Approx(0.2)); // warmup: (t+1)/5
  CHECK(c.at(3) == doctest::Approx(0.8));
  CHECK(c.at(4) == doctest::Approx(1.0));
  CHECK(c.at(5) == doctest::Approx(1.0));
  CHECK(c.at(30) == doctest::Approx(0.5 * (1 + std::cos(M_PI * 0.25))));
  CHECK(c.at(55) == doctest::Approx(0.5));
  CHECK(c.at(105) == doctest::Approx(0.0));
  CHECK(c.at(500) == doctest::Approx(0.0));
  schedule m = schedule::cosine_lr(1.0, 10, 0, 0.1);
  CHECK(m.at(5) == doctest::Approx(0.55));
  schedule w = schedule::step_lr(0.4, 2, 0.1, 4);
  CHECK(w.at(1) == doctest::Approx(0.2));
  CHECK(w.at(4) == doctest::Approx(0.4));
  CHECK(w.at(6) == doctest::Approx(0.04));
  CHECK(schedule::constant_lr(0.3).at(1000) == 0.3);
}

TEST_CASE("clip_grad_norm: global L2 norm over all parameters") {
  one_param a({0.0, 0.0}), b({0.0});
  a.grad({3.0, 0.0});
  b.grad({4.0});
  CHECK(clip_grad_norm({&a.p, &b.p}, 10.0) == doctest::Approx(5.0));
  CHECK(a.p.grad.data<double>()[0] == 3.0); // under the limit: untouched
  CHECK(clip_grad_norm({&a.p, &b.p}, 1.0) == doctest::Approx(5.0));
  CHECK(a.p.grad.data<double>()[0] == doctest::Approx(3.0 / (5.0 + 1e-6)));
  CHECK(b.p.grad.data<double>()[0] == doctest::Approx(4.0 / (5.0 + 1e-6)));
}
