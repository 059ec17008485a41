// Checkpoints: a run stopped after epoch 1 and resumed from its checkpoint (into freshly built,
// differently initialised objects) ends bit-identical to the run that never stopped. The run uses
// everything that carries state: BatchNorm running statistics (training mode), SGD momentum / Adam
// moments, a warmup+cosine schedule, augmentation from a random engine, a per-epoch sampler, and 2
// DDP ranks. Also: corrupt and mismatching files are refused.
#include <doctest/doctest.h>

#include <braid/nn/checkpoint.hpp>
#include <braid/nn/data.hpp>
#include <braid/nn/ddp.hpp>
#include <braid/nn/loss.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <unistd.h>

using namespace braid::nn;

namespace {

image_dataset synthetic(std::int64_t n) {
  image_dataset d;
  d.n = n;
  d.rows = d.cols = 10;
  std::mt19937_64 g(9);
  for (std::int64_t i = 0; i < n * 100; ++i) d.pixels.push_back(std::uint8_t(g() & 255));
  for (std::int64_t i = 0; i < n; ++i) d.labels.push_back(std::int32_t(g() % 10));
  return d;
}

std::unique_ptr<sequential<float>> net(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto m = std::make_unique<sequential<float>>();
  m->add<conv2d<float>>(1, 4, 3, 1, 1, false, rng);
  m->add<batchnorm2d<float>>(4);
  m->add<relu<float>>();
  m->add<basic_block<float>>(4, 8, 2, rng);
  m->add<global_avgpool<float>>();
  m->add<linear<float>>(8, 10, rng);
  return m;
}

struct run_state {
  std::unique_ptr<sequential<float>> model;
  std::unique_ptr<optimizer<float>> opt;
  std::mt19937_64 rng{77};
  std::int64_t epoch = 0, step = 0;
};

// Runs epochs [state.epoch, last) on this rank, B/k per rank; saves to `save_path` (rank 0) at the end.
std::vector<float> run(braid::communicator& c, bool use_adam, std::int64_t last, const std::string& resume,
                       const std::string& save_path) {
  const image_dataset d = synthetic(48);
  run_state s;
  s.model = net(1000 + std::uint64_t(c.rank()) + (resume.empty() ? 0 : 55)); // resumed: other init
  ddp<float> dp(*s.model, c);
  if (use_adam) s.opt = make_adamw<float>(s.model->parameters(), 0.01);
  else s.opt = std::make_unique<sgd<float>>(s.model->parameters(), 0.9, 5e-4, true);
  s.rng.seed(77 + std::uint64_t(c.rank()) * 13 + (resume.empty() ? 0 : 1)); // resumed: wrong until loaded
  if (!resume.empty()) {
    checkpoint ck = checkpoint::load(resume);
    ck.get_module("model.", *s.model);
    ck.get_optimizer("opt.", *s.opt);
    ck.get_rng("rng." + std::to_string(c.rank()), s.rng);
    s.epoch = ck.get_int("epoch");
    s.step = ck.get_int("step");
  }
  const int B = 8, local = B / c.size();
  const std::int64_t steps_per_epoch = d.n / B;
  const schedule sched = schedule::cosine_lr(0.05, steps_per_epoch * 3, 2);
  distributed_sampler sampler(d.n, c.size(), c.rank(), 5);
  softmax_cross_entropy<float> ce;
  std::vector<std::int32_t> y;
  for (; s.epoch < last; ++s.epoch) {
    s.model->set_training(true);
    const auto idx = sampler.indices(s.epoch);
    for (std::int64_t i = 0; i < steps_per_epoch; ++i, ++s.step) {
      tensor x = make_batch(d, idx.data() + i * local, local, 0.5, 0.3, augment{1, true}, s.rng, y);
      s.model->zero_grad();
      ce.forward(dp.forward(x), y);
      dp.backward(ce.backward());
      s.opt->step(sched.at(s.step));
    }
  }
  if (!save_path.empty()) {
    // One file for all ranks: the model and optimizer are identical on every rank; each rank's
    // engine state is handed to rank 0 (the ranks are threads here), which writes the file.
    checkpoint ck;
    ck.put_module("model.", *s.model);
    ck.put_optimizer("opt.", *s.opt);
    ck.put_int("epoch", s.epoch);
    ck.put_int("step", s.step);
    static std::mutex mu;
    static std::map<int, std::string> engines;
    {
      std::lock_guard<std::mutex> l(mu);
      std::ostringstream os;
      os << s.rng;
      engines[c.rank()] = os.str();
    }
    c.barrier();
    if (c.rank() == 0) {
      std::lock_guard<std::mutex> l(mu);
      for (auto& [r, text] : engines) ck.put_string("rng." + std::to_string(r), text);
      ck.save(save_path);
    }
    c.barrier();
  }
  std::vector<float> w;
  for (parameter* p : s.model->parameters()) w.insert(w.end(), p->value.data<float>(), p->value.data<float>() + p->value.numel());
  for (tensor* b : s.model->buffers()) w.insert(w.end(), b->data<float>(), b->data<float>() + b->numel());
  return w;
}

std::string tmp_path(const char* tag) {
  return (std::filesystem::temp_directory_path() / ("braid-nn-ck-" + std::to_string(::getpid()) + "-" + tag)).string();
}

} // namespace

TEST_CASE("resume after a checkpoint equals the uninterrupted run (2 ranks; SGD-Nesterov and AdamW)") {
  for (bool adam_opt : {false, true}) {
    const std::string path = tmp_path(adam_opt ? "adam" : "sgd");
    std::vector<float> straight, resumed, first_half;
    braid::run_threads(2, [&](braid::communicator& c) {
      auto w = run(c, adam_opt, 3, "", "");
      if (c.rank() == 0) straight = w;
    });
    braid::run_threads(2, [&](braid::communicator& c) {
      auto w = run(c, adam_opt, 1, "", path);
      if (c.rank() == 0) first_half = w;
    });
    braid::run_threads(2, [&](braid::communicator& c) {
      auto w = run(c, adam_opt, 3, path, "");
      if (c.rank() == 0) resumed = w;
    });
    REQUIRE(straight.size() == resumed.size());
    CHECK(straight != first_half); // the last two epochs changed the weights
    CHECK(straight == resumed);    // bit-identical
    std::remove(path.c_str());
  }
}

TEST_CASE("checkpoint files: round trip, atomic replace, corruption and mismatches refused") {
  const std::string path = tmp_path("file");
  checkpoint ck;
  tensor t({3});
  t.data<float>()[0] = 1.5f;
  t.data<float>()[1] = -2.0f;
  t.data<float>()[2] = 3.25f;
  ck.put("t", t);
  ck.put_int("epoch", 7);
  ck.put_real("scale", 65536.0);
  ck.put_string("name", "sgd");
  std::mt19937_64 g(3);
  g();
  ck.put_rng("rng", g);
  ck.save(path);
  ck.put_int("epoch", 8);
  ck.save(path); // replaces the file
  CHECK(access((path + ".tmp." + std::to_string(::getpid())).c_str(), F_OK) != 0); // no temporary left
  checkpoint r = checkpoint::load(path);
  CHECK(r.get_int("epoch") == 8);
  CHECK(r.get_real("scale") == 65536.0);
  CHECK(r.get_string("name") == "sgd");
  tensor u({3});
  r.get("t", u);
  CHECK(u.data<float>()[2] == 3.25f);
  std::mt19937_64 h;
  r.get_rng("rng", h);
  CHECK(h() == g());
  CHECK_THROWS_AS(r.get("t", tensor({4})), braid::invalid_argument);
  CHECK_THROWS_AS(r.get_int("missing"), braid::invalid_argument);
  CHECK_THROWS_AS(r.get_int("name"), braid::invalid_argument);
  // flip one byte: the CRC catches it
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    char c;
    f.seekg(20);
    f.get(c);
    f.seekp(20);
    f.put(char(c ^ 1));
  }
  CHECK_THROWS_WITH_AS(checkpoint::load(path), doctest::Contains("CRC"), braid::invalid_argument);
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(checkpoint::load(path), doctest::Contains("cannot open"), braid::invalid_argument);
  // a model of another shape is refused
  checkpoint m;
  auto a = net(1);
  m.put_module("model.", *a);
  std::mt19937_64 rng(1);
  sequential<float> other;
  other.add<linear<float>>(3, 2, rng);
  CHECK_THROWS_AS(m.get_module("model.", other), braid::invalid_argument);
}
