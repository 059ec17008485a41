// tests/nn/device/test_optim_device.cpp — the fused device optimizers, clipping and loss scaling
// (include/braid/nn/optim_device.cuh) on the emulated CUDA device, against braid::nn's host
// optimizers (optim.hpp) and mixed precision (ddp.hpp) on the same parameters and gradients: five
// tensors of 1, 7, 1000, 8193 and 20000 elements (LAMB's chunks of 8192 split the last two), several
// steps at changing learning rates. Same compiler, no FMA: SGD, Adam, AdamW, unscaling, rounding and
// the skipped-step bookkeeping must give the host's bits; LAMB's and clipping's sums of squares are
// added in another order, so there the weights are compared within a few units in the last place
// (the moments, which do not depend on them, exactly). Emulated device only: no GPU ran this.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <braid/nn/ddp.hpp>
#include <braid/nn/optim.hpp>
#include <braid/nn/optim_device.cuh>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace braid::nn;

namespace {

#define EMU_OK(expr) REQUIRE_EQ((expr), cudaSuccess)

const std::vector<std::int64_t> sizes = {1, 7, 1000, 8193, 20000};

// The same parameters on the host (one tensor each) and on the device (one flat buffer).
template <class T> struct twin {
  std::vector<parameter> host;
  std::vector<parameter*> ptrs;
  fused::flat_params<T> dev;
  cudaStream_t stream = nullptr;
  std::mt19937_64 rng{12345};

  twin() {
    EMU_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::int64_t n = 0;
    for (std::int64_t s : sizes) {
      dev.segments.push_back(n);
      n += s;
    }
    dev.n = n;
    EMU_OK(cudaMalloc(reinterpret_cast<void**>(&dev.value), std::size_t(n) * sizeof(T)));
    EMU_OK(cudaMalloc(reinterpret_cast<void**>(&dev.grad), std::size_t(n) * sizeof(T)));
    std::uniform_real_distribution<double> u(-1, 1);
    host.reserve(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      host.push_back(parameter{"p" + std::to_string(i), tensor({sizes[i]}, braid::dtype_of_v<T>),
                               tensor::zeros({sizes[i]}, braid::dtype_of_v<T>)});
      for (std::int64_t j = 0; j < sizes[i]; ++j) host.back().value.template data<T>()[j] = T(u(rng));
    }
    for (auto& p : host) ptrs.push_back(&p);
    upload_values();
  }
  ~twin() {
    cudaFree(dev.value);
    cudaFree(dev.grad);
    cudaStreamDestroy(stream);
  }
  twin(const twin&) = delete;
  twin& operator=(const twin&) = delete;

  void copy_to_device(T* dst, bool grads) {
    // The last step's kernels, on a non-blocking stream, may still read the buffer: a cudaMemcpy on the
    // legacy stream does not wait for them.
    EMU_OK(cudaDeviceSynchronize());
    std::int64_t off = 0;
    for (auto& p : host) {
      const tensor& t = grads ? p.grad : p.value;
      EMU_OK(cudaMemcpy(dst + off, t.template data<T>(), std::size_t(t.numel()) * sizeof(T), cudaMemcpyHostToDevice));
      off += t.numel();
    }
    // cudaMemcpy from pageable memory may return before the copy lands, ordered only on the legacy
    // stream, and the optimizers run on a non-blocking stream: wait for it.
    EMU_OK(cudaDeviceSynchronize());
  }
  void upload_values() { copy_to_device(dev.value, false); }
  // New random gradients, the same on both sides; `scale` multiplies them (loss scaling).
  void new_grads(double scale = 1) {
    std::normal_distribution<double> nd(0, 1);
    for (auto& p : host)
      for (std::int64_t j = 0; j < p.grad.numel(); ++j) p.grad.template data<T>()[j] = T(nd(rng) * scale);
    copy_to_device(dev.grad, true);
  }
  std::vector<T> download(const T* src) {
    std::vector<T> v(std::size_t(dev.n));
    EMU_OK(cudaStreamSynchronize(stream));
    EMU_OK(cudaMemcpy(v.data(), src, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  // The host side flattened: values, grads, or an optimizer's state k.
  std::vector<T> flat(const std::vector<tensor*>& ts) {
    std::vector<T> v;
    for (tensor* t : ts) v.insert(v.end(), t->template data<T>(), t->template data<T>() + t->numel());
    return v;
  }
  std::vector<T> host_values() {
    std::vector<tensor*> ts;
    for (auto& p : host) ts.push_back(&p.value);
    return flat(ts);
  }
  std::vector<T> host_grads() {
    std::vector<tensor*> ts;
    for (auto& p : host) ts.push_back(&p.grad);
    return flat(ts);
  }
};

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <class T> double max_ulps(const std::vector<T>& a, const std::vector<T>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double ulp = std::abs(double(std::nextafter(a[i], std::numeric_limits<T>::infinity()) - a[i]));
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / ulp);
  }
  return worst;
}

// Host state buffer k of every parameter, flattened (optimizer<T>::state() lists them per parameter).
template <class T> std::vector<T> host_state(twin<T>& w, optimizer<T>& o, std::size_t k, std::size_t per_param) {
  std::vector<tensor*> all = o.state(), pick;
  for (std::size_t i = 0; i < w.host.size(); ++i) pick.push_back(all[i * per_param + k]);
  return w.flat(pick);
}

const double lrs[] = {0.1, 0.05, 0.2, 0.01};

template <class T> void check_exact(std::string what, std::unique_ptr<optimizer<T>> h, std::unique_ptr<fused::optimizer<T>> d,
                                    twin<T>& w, std::size_t states) {
  CAPTURE(what);
  for (double lr : lrs) {
    w.new_grads();
    h->step(lr);
    d->step(lr);
  }
  CHECK(d->steps() == 4);
  CHECK(same_bits(w.download(w.dev.value), w.host_values()));
  for (std::size_t k = 0; k < states; ++k) {
    CAPTURE(k);
    CHECK(same_bits(w.download(d->state(k)), host_state(w, *h, k, states)));
  }
  CHECK(d->name() == h->name());
}

template <class T> void exact_rules() {
  {
    twin<T> w;
    check_exact<T>("sgd", std::make_unique<sgd<T>>(w.ptrs), std::make_unique<fused::sgd<T>>(w.dev, w.stream), w, 0);
  }
  {
    twin<T> w;
    check_exact<T>("sgd momentum wd", std::make_unique<sgd<T>>(w.ptrs, 0.9, 1e-3),
                   std::make_unique<fused::sgd<T>>(w.dev, w.stream, 0.9, 1e-3), w, 1);
  }
  {
    twin<T> w;
    check_exact<T>("sgd nesterov", std::make_unique<sgd<T>>(w.ptrs, 0.9, 1e-3, true),
                   std::make_unique<fused::sgd<T>>(w.dev, w.stream, 0.9, 1e-3, true), w, 1);
  }
  {
    twin<T> w;
    check_exact<T>("sgd dampening", std::make_unique<sgd<T>>(w.ptrs, 0.5, 0, false, 0.3),
                   std::make_unique<fused::sgd<T>>(w.dev, w.stream, 0.5, 0, false, 0.3), w, 1);
  }
  {
    twin<T> w;
    check_exact<T>("adam l2", std::make_unique<adam<T>>(w.ptrs, 1e-2), std::make_unique<fused::adam<T>>(w.dev, w.stream, 1e-2), w, 2);
  }
  {
    twin<T> w;
    check_exact<T>("adamw", std::make_unique<adam<T>>(w.ptrs, 1e-2, true),
                   std::make_unique<fused::adam<T>>(w.dev, w.stream, 1e-2, true), w, 2);
  }
}

// A kernel that holds its stream until the host sets *gate (or 10 s pass: then *timed_out).
BRAID_KERNEL void hold(int* gate, int* timed_out) {
  const std::uint64_t end = braid::cuda::device::clock_ns() + 10'000'000'000ull;
  while (braid::cuda::device::atomic_ref<int, braid::cuda::device::scope::system>(*gate).load(braid::cuda::device::memory_order::acquire) == 0) {
    if (braid::cuda::device::clock_ns() > end) {
      *timed_out = 1;
      return;
    }
    braid::cuda::device::sleep_ns(1000);
  }
}

} // namespace

TEST_CASE("fused SGD, Adam and AdamW give the host optimizers' bits (float and double)") {
  exact_rules<float>();
  exact_rules<double>();
}

TEST_CASE("fused LAMB: the host's moments exactly, weights within the rounding of the norms") {
  twin<float> w;
  lamb<float> h(w.ptrs, 1e-2);
  fused::lamb<float> d(w.dev, w.stream, 1e-2);
  for (double lr : lrs) {
    w.new_grads();
    h.step(lr);
    d.step(lr);
  }
  CHECK(d.steps() == 4);
  CHECK(same_bits(w.download(d.state(0)), host_state(w, h, 0, 2)));
  CHECK(same_bits(w.download(d.state(1)), host_state(w, h, 1, 2)));
  const double ulps = max_ulps(w.download(w.dev.value), w.host_values());
  MESSAGE("LAMB float weights after 4 steps: max difference from the host " << ulps << " units in the last place");
  CHECK(ulps <= 2);
  // The last tensor's trust ratio (the host keeps only the last one it computed).
  const double t = d.trust_ratios().back();
  CHECK(t == doctest::Approx(h.last_trust_ratio()).epsilon(1e-12));
  CHECK(t != doctest::Approx(1.0)); // the ratio is in play, not the fallback
}

TEST_CASE("fused clipping: the host's norm and scaling") {
  twin<double> w;
  w.new_grads();
  fused::grad_clipper<double> c(w.dev.grad, w.dev.n, w.stream);
  CHECK(c.norm() == 0);
  c.clip(1e9); // above the norm: nothing changes
  const double host_norm = clip_grad_norm(w.ptrs, 1e9);
  CHECK(c.norm() == doctest::Approx(host_norm).epsilon(1e-13));
  CHECK(same_bits(w.download(w.dev.grad), w.host_grads()));
  c.clip(10.0);
  clip_grad_norm(w.ptrs, 10.0);
  // The norms agree to about 1e-15 (another order of addition), so the factors do, and every clipped
  // gradient agrees to within that relative difference.
  const std::vector<double> dg = w.download(w.dev.grad), hg = w.host_grads();
  double rel = 0;
  for (std::size_t i = 0; i < dg.size(); ++i) rel = std::max(rel, std::abs(dg[i] - hg[i]) / std::abs(hg[i]));
  MESSAGE("clipped gradients: max relative difference from the host " << rel << " (" << max_ulps(dg, hg) << " units in the last place)");
  CHECK(rel <= 1e-13);
  CHECK(w.download(w.dev.grad) != std::vector<double>(std::size_t(w.dev.n), 0.0));
  CHECK_THROWS_AS(c.clip(0), braid::invalid_argument);
}

TEST_CASE("fused loss scaling: an overflow skips the step on the device, as mixed_precision does on the host") {
  for (bool bf16 : {false, true}) {
    CAPTURE(bf16);
    twin<float> w; // the masters
    // The model's copies (rounded), host and device.
    std::vector<parameter> model;
    std::vector<parameter*> model_ptrs;
    for (auto& p : w.host) model.push_back(parameter{p.name, p.value.clone(), p.grad});
    for (auto& p : model) model_ptrs.push_back(&p);
    float* dev_model = nullptr;
    EMU_OK(cudaMalloc(reinterpret_cast<void**>(&dev_model), std::size_t(w.dev.n) * sizeof(float)));

    mixed_precision mp(model_ptrs, bf16 ? braid::dtype::bfloat16 : braid::dtype::float16);
    // mixed_precision cloned the values as its masters: the host optimizer steps those.
    std::vector<parameter*> masters = mp.master_params();
    adam<float> h(masters, 1e-2, true);
    loss_scaler hs(1024.0, 2);
    fused::adam<float> d(w.dev, w.stream, 1e-2, true);
    fused::loss_scaler ds(w.stream, 1024.0, 2);
    fused::round_into(w.dev.value, dev_model, w.dev.n, bf16, w.stream);

    // Scaled gradients; step 2 overflows (an inf; in half also anything above 65504 after scaling).
    int applied = 0;
    for (int step = 0; step < 5; ++step) {
      w.new_grads(hs.scale());
      if (step == 2) w.host[3].grad.data<float>()[17] = std::numeric_limits<float>::infinity();
      w.copy_to_device(w.dev.grad, true);
      const bool host_applied = mp.step(h, hs, 0.01);
      applied += host_applied;
      ds.unscale(w.dev.grad, w.dev.n, bf16);
      ds.update();
      d.step(0.01, &ds);
      fused::round_into(w.dev.value, dev_model, w.dev.n, bf16, w.stream);
      CAPTURE(step);
      CHECK(ds.applied() == host_applied);
      CHECK(ds.scale() == hs.scale());
      CHECK(ds.clean_steps() == hs.clean_steps());
      CHECK(ds.skipped() == hs.skipped());
      CHECK(d.steps() == h.steps());
      CHECK(same_bits(w.download(w.dev.grad), w.host_grads())); // unscaled the same way
      std::vector<tensor*> mv, hv;
      for (parameter* p : masters) mv.push_back(&p->value);
      for (parameter* p : model_ptrs) hv.push_back(&p->value);
      CHECK(same_bits(w.download(w.dev.value), w.flat(mv)));
      CHECK(same_bits(w.download(dev_model), w.flat(hv)));
    }
    CHECK(applied == 4);
    CHECK(hs.skipped() == 1);
    cudaFree(dev_model);
  }
}

TEST_CASE("fused optimizer steps are enqueued: step() returns while the stream is held") {
  twin<float> w;
  fused::adam<float> d(w.dev, w.stream);
  fused::lamb<float> l(w.dev, w.stream);
  fused::loss_scaler s(w.stream);
  fused::grad_clipper<float> c(w.dev.grad, w.dev.n, w.stream);
  w.new_grads();
  int* gate = nullptr;
  EMU_OK(cudaMallocHost(reinterpret_cast<void**>(&gate), 2 * sizeof(int)));
  gate[0] = gate[1] = 0;
  const std::vector<float> before = w.download(w.dev.value);
  REQUIRE(braid::cuda::device::launch(hold, 1, 1, 0, w.stream, gate, gate + 1) == cudaSuccess);
  s.unscale(w.dev.grad, w.dev.n, true);
  s.update();
  c.clip(1.0);
  d.step(0.1, &s);
  l.step(0.1, &s);
  CHECK(cudaStreamQuery(w.stream) == cudaErrorNotReady); // everything above returned with the stream held
  braid::cuda::device::atomic_ref<int, braid::cuda::device::scope::system>(gate[0]).store(1, braid::cuda::device::memory_order::release);
  EMU_OK(cudaStreamSynchronize(w.stream));
  CHECK(gate[1] == 0);
  CHECK(d.steps() == 1);
  CHECK(l.steps() == 1);
  CHECK(!same_bits(w.download(w.dev.value), before));
  cudaFreeHost(gate);
}

TEST_CASE("fused optimizers refuse bad buffers and options") {
  twin<float> w;
  auto with = [&](std::vector<std::int64_t> seg) {
    fused::flat_params<float> p = w.dev;
    p.segments = std::move(seg);
    return p;
  };
  CHECK_THROWS_AS(fused::sgd<float>(with({}), w.stream), braid::invalid_argument);
  CHECK_THROWS_AS(fused::sgd<float>(with({1, 5}), w.stream), braid::invalid_argument);
  CHECK_THROWS_AS(fused::sgd<float>(with({0, 5, 5}), w.stream), braid::invalid_argument);
  CHECK_THROWS_AS(fused::adam<float>(with({0, w.dev.n}), w.stream), braid::invalid_argument);
  fused::flat_params<float> no_grad = w.dev;
  no_grad.grad = nullptr;
  CHECK_THROWS_AS(fused::lamb<float>(no_grad, w.stream), braid::invalid_argument);
  CHECK_THROWS_AS(fused::sgd<float>(w.dev, w.stream, 0, 0, true), braid::invalid_argument);
  CHECK_THROWS_AS(fused::loss_scaler(w.stream, 0), braid::invalid_argument);
  CHECK_THROWS_AS(fused::grad_clipper<float>(nullptr, 5, w.stream), braid::invalid_argument);
  fused::flat_params<float> empty;
  fused::sgd<float> nothing(empty, w.stream); // n = 0: a valid no-op
  nothing.step(0.1);
  CHECK(nothing.steps() == 0);
}
