// resnet_fmnist — a ResNet (ResNet-20 shape: three stages of 16/32/64 channels, 3 basic blocks each)
// trained on Fashion-MNIST in data parallel with braid::nn. Ranks are threads of this process
// (--backend host); the CUDA path is not built yet.
//
//   resnet_fmnist --ranks 2 --epochs 10 --batch 128 --lr 0.1 --optimizer sgd --precision fp32
//
// Prints a progress line (epoch, step/steps, loss, running accuracy, images/s) every --log-every
// steps and the test accuracy after each epoch; writes the curves to --csv; saves a checkpoint after
// each epoch to --checkpoint (when given) and continues from one with --resume (--stop-after E ends
// the run after E epochs, as an interruption would).
#include <braid/braid.hpp>
#include <braid/nn.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace braid::nn;
using clock_type = std::chrono::steady_clock;

namespace {

struct config {
  int ranks = 1;
  std::string backend = "host";
  int epochs = 1;
  int batch = 128;
  double lr = -1;  // per optimizer default when not given
  double wd = -1;
  std::string optimizer = "sgd";
  std::string precision = "fp32";
  std::string resume, checkpoint_path, csv = "resnet_fmnist.csv", data_dir = fashion_mnist_dir;
  std::int64_t train_subset = 0, test_subset = 0; // 0 = all
  int blocks = 3, width = 16;
  int stop_after = 0;        // end this invocation after so many epochs (0: run to --epochs)
  int log_every = 50;
  int warmup_epochs_pct = 3; // warmup steps as % of all steps
  int blas_threads = 0;      // 0: cores / ranks
  std::uint64_t seed = 1;
  bool augment = true;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "resnet_fmnist: %s\n"
               "usage: resnet_fmnist [--ranks N] [--backend host|cuda] [--epochs E] [--batch B] [--lr X]\n"
               "         [--optimizer sgd|adamw|lamb] [--precision fp32|bf16|fp16] [--resume FILE]\n"
               "         [--checkpoint FILE] [--csv FILE] [--train-subset N] [--test-subset N] [--blocks n]\n"
               "         [--width W] [--wd X] [--log-every S] [--seed S] [--blas-threads T] [--no-augment]\n"
               "         [--stop-after E] [--data DIR]\n",
               why);
  std::exit(2);
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    auto num = [&]() -> double {
      const std::string v = val();
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end) usage(("not a number: " + a + " " + v).c_str());
      return d;
    };
    if (a == "--ranks") c.ranks = int(num());
    else if (a == "--backend") c.backend = val();
    else if (a == "--epochs") c.epochs = int(num());
    else if (a == "--batch") c.batch = int(num());
    else if (a == "--lr") c.lr = num();
    else if (a == "--wd") c.wd = num();
    else if (a == "--optimizer") c.optimizer = val();
    else if (a == "--precision") c.precision = val();
    else if (a == "--resume") c.resume = val();
    else if (a == "--checkpoint") c.checkpoint_path = val();
    else if (a == "--csv") c.csv = val();
    else if (a == "--data") c.data_dir = val();
    else if (a == "--train-subset") c.train_subset = std::int64_t(num());
    else if (a == "--test-subset") c.test_subset = std::int64_t(num());
    else if (a == "--blocks") c.blocks = int(num());
    else if (a == "--width") c.width = int(num());
    else if (a == "--log-every") c.log_every = int(num());
    else if (a == "--seed") c.seed = std::uint64_t(num());
    else if (a == "--blas-threads") c.blas_threads = int(num());
    else if (a == "--no-augment") c.augment = false;
    else if (a == "--stop-after") c.stop_after = int(num());
    else if (a == "-h" || a == "--help") usage("help");
    else usage(("unknown flag " + a).c_str());
  }
  if (c.ranks < 1 || c.ranks > 64) usage("--ranks must be in 1..64");
  if (c.epochs < 1) usage("--epochs must be >= 1");
  if (c.batch < c.ranks || c.batch % c.ranks) usage("--batch must be a multiple of --ranks");
  if (c.optimizer != "sgd" && c.optimizer != "adamw" && c.optimizer != "lamb") usage("--optimizer: sgd, adamw or lamb");
  if (c.precision != "fp32" && c.precision != "bf16" && c.precision != "fp16")
    usage("--precision: fp32, bf16 or fp16");
  if (c.backend != "host" && c.backend != "cuda") usage("--backend: host or cuda");
  if (c.lr < 0) c.lr = c.optimizer == "sgd" ? 0.1 : c.optimizer == "adamw" ? 2e-3 : 1e-2;
  if (c.wd < 0) c.wd = c.optimizer == "sgd" ? 5e-4 : c.optimizer == "adamw" ? 0.05 : 0.01;
  return c;
}

// What the ranks share (they are threads of this process).
struct shared_state {
  std::vector<std::mt19937_64> rngs; // each rank's augmentation engine
  std::mutex mu;
};

} // namespace

int main(int argc, char** argv) {
  const config cfg = parse(argc, argv);
  if (cfg.backend == "cuda") {
    std::fprintf(stderr, "resnet_fmnist: --backend cuda is not available: the CUDA training path (cuBLAS) is not "
                         "built yet; use --backend host\n");
    return 2;
  }
  image_dataset train, test;
  try {
    train = load_fashion_mnist(true, cfg.data_dir);
    test = load_fashion_mnist(false, cfg.data_dir);
  } catch (const braid::error& e) {
    std::fprintf(stderr, "resnet_fmnist: %s\n", e.what());
    return 1;
  }
  if (cfg.train_subset > 0) train = train.head(cfg.train_subset);
  if (cfg.test_subset > 0) test = test.head(cfg.test_subset);
  const auto [mean, stdev] = pixel_mean_std(train);
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int blas_threads = cfg.blas_threads > 0 ? cfg.blas_threads : std::max(1, cores / cfg.ranks);
  blas::set_threads(blas_threads);

  const int local = cfg.batch / cfg.ranks;
  const std::int64_t steps_per_epoch = (train.n / cfg.ranks) / local;
  if (steps_per_epoch < 1) usage("the training set is smaller than one batch");
  const std::int64_t total_steps = steps_per_epoch * cfg.epochs;
  const schedule sched = schedule::cosine_lr(cfg.lr, total_steps, std::max<std::int64_t>(1, total_steps * cfg.warmup_epochs_pct / 100));

  std::printf("resnet_fmnist: ResNet-%d (widths %d/%d/%d), %d rank(s) as threads, batch %d (%d per rank), %s, lr %g, "
              "wd %g, %s, cosine schedule with %lld warmup steps, %d epoch(s) x %lld steps\n",
              6 * cfg.blocks + 2, cfg.width, cfg.width * 2, cfg.width * 4, cfg.ranks, cfg.batch, local,
              cfg.optimizer.c_str(), cfg.lr, cfg.wd, cfg.precision.c_str(),
              (long long)std::max<std::int64_t>(1, total_steps * cfg.warmup_epochs_pct / 100), cfg.epochs,
              (long long)steps_per_epoch);
  std::printf("data: %lld training and %lld test images (%s), mean %.4f std %.4f, augmentation %s; BLAS and oneDNN threads per rank: %d\n",
              (long long)train.n, (long long)test.n, cfg.data_dir.c_str(), mean, stdev,
              cfg.augment ? "crop (pad 2) + flip" : "off", blas_threads);
  std::fflush(stdout);

  std::ofstream csv(cfg.csv);
  csv << "kind,epoch,step,loss,accuracy,lr,images_per_s,elapsed_s\n";
  shared_state sh;
  sh.rngs.resize(std::size_t(cfg.ranks));
  for (int r = 0; r < cfg.ranks; ++r) sh.rngs[std::size_t(r)].seed(cfg.seed * 1000003 + std::uint64_t(r));

  int rc = 0;
  try {
    braid::run_threads(cfg.ranks, [&](braid::communicator& comm) {
      const int rank = comm.rank();
      std::mt19937_64 init(cfg.seed);
      auto model = resnet<float>(cfg.blocks, 10, init, 1, cfg.width);
      // bf16 and fp16: compute-type weights and gradients (emulated: see mixed_precision), fp32
      // masters, loss scaling, and gradient traffic in the compute type.
      const braid::dtype compute = cfg.precision == "bf16"   ? braid::dtype::bfloat16
                                   : cfg.precision == "fp16" ? braid::dtype::float16
                                                             : braid::dtype::float32;
      ddp_options dopt;
      dopt.comm_type = compute;
      ddp<float> dp(*model, comm, dopt);
      std::unique_ptr<mixed_precision> mp;
      std::vector<parameter*> opt_params = model->parameters();
      if (compute != braid::dtype::float32) {
        mp = std::make_unique<mixed_precision>(opt_params, compute);
        opt_params = mp->master_params();
      }
      std::unique_ptr<optimizer<float>> opt;
      if (cfg.optimizer == "sgd") opt = std::make_unique<sgd<float>>(opt_params, 0.9, cfg.wd, true);
      else if (cfg.optimizer == "adamw") opt = make_adamw<float>(opt_params, cfg.wd);
      else opt = std::make_unique<lamb<float>>(opt_params, cfg.wd);
      loss_scaler scaler;
      std::mt19937_64& rng = sh.rngs[std::size_t(rank)];
      std::int64_t epoch = 0, step = 0;
      if (!cfg.resume.empty()) {
        checkpoint ck = checkpoint::load(cfg.resume);
        if (ck.get_int("ranks") != cfg.ranks || ck.get_string("precision") != cfg.precision)
          throw braid::invalid_argument("--resume: the checkpoint was written with other --ranks or --precision");
        ck.get_module("model.", *model);
        if (mp) {
          auto mps = mp->master_params();
          for (std::size_t i = 0; i < mps.size(); ++i) ck.get("master." + std::to_string(i), mps[i]->value);
        }
        ck.get_optimizer("opt.", *opt);
        ck.get_rng("rng." + std::to_string(rank), rng);
        scaler.set_state(ck.get_real("scaler.scale"), int(ck.get_int("scaler.clean")), std::uint64_t(ck.get_int("scaler.skipped")));
        epoch = ck.get_int("epoch");
        step = ck.get_int("step");
        if (rank == 0) std::printf("resumed from %s at epoch %lld, step %lld\n", cfg.resume.c_str(), (long long)epoch, (long long)step);
      }
      distributed_sampler sampler(train.n, cfg.ranks, rank, cfg.seed);
      softmax_cross_entropy<float> ce;
      std::vector<std::int32_t> labels;
      const augment aug = cfg.augment ? augment{2, true} : augment{};
      const auto t0 = clock_type::now();

      int epochs_run = 0;
      for (; epoch < cfg.epochs && !(cfg.stop_after > 0 && epochs_run == cfg.stop_after); ++epoch, ++epochs_run) {
        model->set_training(true);
        const auto idx = sampler.indices(epoch);
        double loss_sum = 0, seen = 0, correct = 0; // global, as of the last progress line
        double win_loss = 0, win_correct = 0, win_n = 0;
        auto win_t = clock_type::now();
        std::int64_t win_steps = 0;
        for (std::int64_t s = 0; s < steps_per_epoch; ++s, ++step) {
          tensor x = make_batch(train, idx.data() + s * local, local, mean, stdev, aug, rng, labels);
          if (mp) mp->round(x);
          model->zero_grad();
          const double loss = ce.forward(dp.forward(x), labels);
          win_loss += loss * local;
          win_correct += double(ce.correct());
          win_n += local;
          ++win_steps;
          const double lr = sched.at(step);
          if (mp) {
            tensor dy = ce.backward(scaler.scale());
            mp->round(dy);
            dp.backward(dy);
            mp->step(*opt, scaler, lr);
          } else {
            dp.backward(ce.backward());
            opt->step(lr);
          }
          const bool last = s + 1 == steps_per_epoch;
          if ((cfg.log_every > 0 && (s + 1) % cfg.log_every == 0) || last) {
            double w[3] = {win_loss, win_correct, win_n};
            comm.all_reduce(w, w, 3, braid::sum{});
            loss_sum += w[0];
            correct += w[1];
            seen += w[2];
            const double secs = std::chrono::duration<double>(clock_type::now() - win_t).count();
            const double ips = w[2] / secs;
            if (rank == 0) {
              std::printf("epoch %lld/%d step %lld/%lld loss %.4f acc %.2f%% lr %.4g images/s %.1f%s\n",
                          (long long)epoch + 1, cfg.epochs, (long long)s + 1, (long long)steps_per_epoch,
                          loss_sum / seen, 100.0 * correct / seen, lr, ips,
                          mp ? (" scale " + std::to_string(int64_t(scaler.scale())) + " skipped " +
                                std::to_string(scaler.skipped())).c_str()
                             : "");
              std::fflush(stdout);
              const double el = std::chrono::duration<double>(clock_type::now() - t0).count();
              csv << "train," << epoch + 1 << "," << step + 1 << "," << w[0] / w[2] << "," << w[1] / w[2] << "," << lr
                  << "," << ips << "," << el << "\n";
            }
            win_loss = win_correct = win_n = 0;
            win_steps = 0;
            win_t = clock_type::now();
          }
        }
        // Rank 0's BatchNorm running statistics for everyone (each rank saw only its own batches).
        for (tensor* b : model->buffers()) comm.broadcast(std::span<float>(b->data<float>(), std::size_t(b->numel())), 0);
        // Test accuracy: each rank evaluates a disjoint slice of the test set.
        model->set_training(false);
        const std::int64_t per = (test.n + cfg.ranks - 1) / cfg.ranks;
        const std::int64_t lo = std::min<std::int64_t>(test.n, rank * per), hi = std::min<std::int64_t>(test.n, lo + per);
        double t[3] = {0, 0, double(hi - lo)};
        std::vector<std::int64_t> tidx;
        for (std::int64_t i = lo; i < hi; ++i) tidx.push_back(i);
        for (std::int64_t i = lo; i < hi; i += 250) {
          const std::int64_t k = std::min<std::int64_t>(250, hi - i);
          tensor x = make_batch(test, tidx.data() + (i - lo), k, mean, stdev, augment{}, rng, labels);
          t[0] += ce.forward(model->forward(x), labels) * double(k);
          t[1] += double(ce.correct());
        }
        comm.all_reduce(t, t, 3, braid::sum{});
        if (rank == 0) {
          const double el = std::chrono::duration<double>(clock_type::now() - t0).count();
          std::printf("epoch %lld/%d test loss %.4f test accuracy %.2f%% (%lld images) elapsed %.1f s\n",
                      (long long)epoch + 1, cfg.epochs, t[0] / t[2], 100.0 * t[1] / t[2], (long long)t[2], el);
          std::fflush(stdout);
          csv << "test," << epoch + 1 << "," << step << "," << t[0] / t[2] << "," << t[1] / t[2] << ","
              << sched.at(std::max<std::int64_t>(step - 1, 0)) << ",," << el << "\n";
          csv.flush();
        }
        if (!cfg.checkpoint_path.empty()) {
          comm.barrier(); // every rank's engine is current in sh.rngs
          if (rank == 0) {
            checkpoint ck;
            ck.put_int("ranks", cfg.ranks);
            ck.put_string("precision", cfg.precision);
            ck.put_module("model.", *model);
            if (mp) {
              auto mps = mp->master_params();
              for (std::size_t i = 0; i < mps.size(); ++i) ck.put("master." + std::to_string(i), mps[i]->value);
            }
            ck.put_optimizer("opt.", *opt);
            for (int r = 0; r < cfg.ranks; ++r) ck.put_rng("rng." + std::to_string(r), sh.rngs[std::size_t(r)]);
            ck.put_real("scaler.scale", scaler.scale());
            ck.put_int("scaler.clean", scaler.clean_steps());
            ck.put_int("scaler.skipped", std::int64_t(scaler.skipped()));
            ck.put_int("epoch", epoch + 1);
            ck.put_int("step", step);
            ck.save(cfg.checkpoint_path);
            std::printf("checkpoint: %s (epoch %lld)\n", cfg.checkpoint_path.c_str(), (long long)epoch + 1);
          }
          comm.barrier();
        }
      }
      if (rank == 0) std::cout << memory_pool::host().stats() << "\n";
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_fmnist: %s\n", e.what());
    rc = 1;
  }
  std::printf("curves: %s\n", cfg.csv.c_str());
  return rc;
}
