// resnet_pipeline — the ResNet of resnet_fmnist (ResNet-20 shape by default) trained on Fashion-MNIST
// with model parallelism: the model cut into two stages, one per rank (threads of this process), with
// braid::nn::pipeline (GPipe fill and drain over send/recv, M micro-batches per batch). --stages 1
// trains the same model unsplit on one rank with gradient accumulation over the same micro-batches:
// the same mathematics, so the two should reach the same accuracy (the weights differ only by float
// rounding: the gradients of the micro-batches are summed in another order). With --reverse-micro
// the unsplit run takes the micro-batches in the order M-1 .. 0, which sums the gradients in the
// pipeline's order: its weights are then the pipeline's to the bit (the losses --log-every 1 prints
// agree in all 9 digits), and only the BatchNorm running statistics, updated in that order, differ.
//
//   resnet_pipeline --stages 2 --micro 4 --batch 128 --epochs 2 --train-subset 4096
//
// Every rank draws the same batches (same sampler seed and augmentation engine), so stage 0 has the
// images and the last stage the labels without sending them. Prints the mean training loss and the
// test accuracy after each epoch (--log-every S: also the loss of every S-th step, to 9 digits).
//
// --backend cuda (the binaries built with BRAID_PIPELINE_CUDA: resnet_pipeline_emu on braid's emulated
// CUDA device, resnet_pipeline_cuda with nvcc): stage r on GPU r of this process
// (braid::cuda::create_group), each a fused::resnet of its children, trained with
// fused::pipeline (nn/pipeline_device.cuh: the same schedule, activations and gradients over
// braid::cuda's send/recv) and the fused SGD; --stages 1 is the unsplit network on GPU 0 with the
// same gradient accumulation. The same output as the host run.
#include <braid/braid.hpp>
#include <braid/nn.hpp>

#include "../common/cli.hpp"
#if BRAID_PIPELINE_CUDA
#include <braid/cuda.cuh>
#include <braid/nn/model_device.cuh>
#include <braid/nn/optim_device.cuh>
#include <braid/nn/pipeline_device.cuh>

#include "../common/cuda_ranks.hpp"

#include <exception>
#include <thread>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

using namespace braid::nn;
using clock_type = std::chrono::steady_clock;

namespace {

struct config {
  int stages = 2, micro = 4, epochs = 2, batch = 128, blocks = 3, width = 16, blas_threads = 1;
  int log_every = 0; // print the step's loss every so many steps (0: never)
  int cut = -1; // the first child of stage 1 (default: the middle basic block)
  double lr = 0.1, wd = 5e-4;
  std::int64_t train_subset = 4096, test_subset = 0; // 0 = all
  std::uint64_t seed = 1;
  bool augment = true;
  bool reverse = false; // --stages 1: micro-batches in the order M-1 .. 0 (the pipeline's gradient order)
  std::string backend = "host";
  std::string data_dir = fashion_mnist_dir;
  int gpus = 0; // --backend cuda: GPUs the stages take in turn (0: one per stage)
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "resnet_pipeline: %s\n"
               "usage: resnet_pipeline [--stages 1|2] [--micro M] [--epochs E] [--batch B] [--lr X] [--wd X]\n"
               "         [--train-subset N] [--test-subset N] [--blocks n] [--width W] [--cut C] [--seed S]\n"
               "         [--blas-threads T] [--log-every S] [--reverse-micro] [--no-augment] [--data DIR]\n"
               "         [--backend host|cuda] [--gpus G]\n"
               "  --gpus G (--backend cuda): stage s runs on GPU s mod G (default: one GPU per stage)\n",
               why);
  std::exit(2);
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&] { return braid_examples::flag_value(argc, argv, i, usage); };
    auto num = [&] { return braid_examples::flag_number(argc, argv, i, usage); };
    if (a == "--stages") c.stages = int(num());
    else if (a == "--micro") c.micro = int(num());
    else if (a == "--epochs") c.epochs = int(num());
    else if (a == "--batch") c.batch = int(num());
    else if (a == "--lr") c.lr = num();
    else if (a == "--wd") c.wd = num();
    else if (a == "--train-subset") c.train_subset = std::int64_t(num());
    else if (a == "--test-subset") c.test_subset = std::int64_t(num());
    else if (a == "--blocks") c.blocks = int(num());
    else if (a == "--width") c.width = int(num());
    else if (a == "--cut") c.cut = int(num());
    else if (a == "--seed") c.seed = std::uint64_t(num());
    else if (a == "--blas-threads") c.blas_threads = int(num());
    else if (a == "--log-every") c.log_every = int(num());
    else if (a == "--no-augment") c.augment = false;
    else if (a == "--reverse-micro") c.reverse = true;
    else if (a == "--data") c.data_dir = val();
    else if (a == "--backend") c.backend = val();
    else if (a == "--gpus") c.gpus = int(num());
    else if (a == "-h" || a == "--help") usage("help");
    else usage(("unknown flag " + a).c_str());
  }
  if (c.stages != 1 && c.stages != 2) usage("--stages: 1 (unsplit) or 2");
  if (c.backend != "host" && c.backend != "cuda") usage("--backend: host or cuda");
  if (c.gpus < 0) usage("--gpus must be >= 1");
  if (c.gpus > 0 && c.backend != "cuda") usage("--gpus is for --backend cuda");
  if (c.reverse && c.stages != 1) usage("--reverse-micro is for --stages 1");
  if (c.micro < 1 || c.batch < c.micro) usage("--micro must be in 1..--batch");
  if (c.epochs < 1) usage("--epochs must be >= 1");
  if (c.blocks < 1) usage("--blocks must be >= 1");
  // resnet(n) has 3n + 5 children: conv, bn, relu, 3n basic blocks, global pooling, linear.
  if (c.cut < 0) c.cut = 3 + (3 * c.blocks + 1) / 2;
  if (c.cut < 1 || c.cut >= 3 * c.blocks + 5) usage("--cut must be in 1 .. 3 * blocks + 4");
  return c;
}

#if BRAID_PIPELINE_CUDA
// One stage's CUDA resources: a stream and a cuBLAS handle on the current device.
struct cuda_stage_resources {
  braid::cuda::detail::owned_stream stream;
  cublasHandle_t blas = nullptr;
  cuda_stage_resources() {
    BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&stream.h, cudaStreamNonBlocking));
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) throw braid::error(braid::errc::cuda, "resnet_pipeline: cublasCreate failed");
  }
  cuda_stage_resources(const cuda_stage_resources&) = delete;
  cuda_stage_resources& operator=(const cuda_stage_resources&) = delete;
  ~cuda_stage_resources() {
    (void)cudaStreamSynchronize(stream.h);
    (void)cublasDestroy(blas);
  }
};

// Stage `comm.rank()` of --stages on its GPU. Every stage draws the same batches; stage 0 uploads the
// images, the last stage the labels, and the last stage prints (it holds the loss).
void cuda_stage(const config& cfg, braid::cuda::communicator& comm, const image_dataset& train, const image_dataset& test,
                double mean, double stdev, std::int64_t steps_per_epoch, const schedule& sched) {
  const int rank = comm.rank(), P = comm.size();
  BRAID_CUDA_CHECK(cudaSetDevice(comm.device()));
  const bool first = rank == 0, last = rank == P - 1;
  device_pool pool(comm.device());
  {
    cuda_stage_resources res;
    const cudaStream_t st = res.stream.h;
    std::mt19937_64 init(cfg.seed);
    std::unique_ptr<sequential<float>> net = resnet<float>(cfg.blocks, 10, init, 1, cfg.width, false);
    std::unique_ptr<sequential<float>> host = P == 2 ? take_stage(*net, {std::size_t(cfg.cut)}, rank) : std::move(net);
    const std::size_t lo_child = P == 2 && rank == 1 ? std::size_t(cfg.cut) : 0;
    const std::size_t hi_child = P == 2 && rank == 0 ? std::size_t(cfg.cut) : std::size_t(-1);
    fused::resnet<float> stage(cfg.blocks, 10, 1, cfg.width, pool, st, res.blas, lo_child, hi_child);
    stage.load(*host);
    fused::pipeline<braid::cuda::communicator, float> pp(stage, comm, cfg.micro);
    fused::sgd<float> opt({stage.values(), stage.grads(), stage.size(), stage.segments()}, st, 0.9, cfg.wd, true);
    distributed_sampler sampler(train.n, 1, 0, cfg.seed);
    std::mt19937_64 rng(cfg.seed * 1000003);
    const augment aug = cfg.augment ? augment{2, true} : augment{};
    const std::int64_t h = train.rows, w = train.cols, per = h * w, most = std::max<std::int64_t>(cfg.batch, 250);
    const pool_buffer<float> x_mem(pool, most * per, st);
    const pool_buffer<std::int32_t> l_mem(pool, most, st);
    float* const x_dev = x_mem.get();
    std::int32_t* const l_dev = l_mem.get();
    std::vector<std::int32_t> labels;
    auto upload = [&](const tensor& x) { // the pageable copies return once the host data is taken
      if (first) BRAID_CUDA_CHECK(cudaMemcpyAsync(x_dev, x.data<float>(), std::size_t(x.numel()) * sizeof(float), cudaMemcpyHostToDevice, st));
      if (last) BRAID_CUDA_CHECK(cudaMemcpyAsync(l_dev, labels.data(), labels.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, st));
      BRAID_CUDA_CHECK(cudaStreamSynchronize(st));
    };
    const auto t0 = clock_type::now();
    double train_secs = 0;
    std::int64_t step = 0;
    for (int e = 0; e < cfg.epochs; ++e) {
      const auto te = clock_type::now();
      stage.set_training(true);
      const auto idx = sampler.indices(e);
      double loss_sum = 0, correct = 0;
      for (std::int64_t s = 0; s < steps_per_epoch; ++s, ++step) {
        const tensor x = make_batch(train, idx.data() + s * cfg.batch, cfg.batch, mean, stdev, aug, rng, labels);
        upload(x);
        stage.zero_grad();
        if (P == 2) {
          pp.train_step(first ? x_dev : nullptr, last ? l_dev : nullptr, cfg.batch, h, w);
        } else { // the unsplit reference: gradient accumulation, micro-batch by micro-batch
          for (int ii = 0; ii < cfg.micro; ++ii) {
            const int i = cfg.reverse ? cfg.micro - 1 - ii : ii;
            const auto [lo, n] = micro_batch_range(cfg.batch, cfg.micro, i);
            stage.forward(x_dev + lo * per, shape_t({n, 1, h, w}));
            stage.loss(l_dev + lo);
            stage.backward(double(n) / double(cfg.batch));
          }
        }
        if (cfg.log_every > 0 && last) { // the step's loss: read back (a synchronisation per step)
          const auto [l, r] = stage.take_sums();
          loss_sum += l / double(cfg.batch);
          correct += r;
          if ((step + 1) % cfg.log_every == 0) std::printf("step %lld loss %.9f\n", (long long)step + 1, l / double(cfg.batch));
        }
        opt.step(sched.at(step));
      }
      if (last && cfg.log_every <= 0) {
        const auto [l, r] = stage.take_sums();
        loss_sum = l / double(cfg.batch);
        correct = r;
      }
      BRAID_CUDA_CHECK(cudaStreamSynchronize(st));
      train_secs += std::chrono::duration<double>(clock_type::now() - te).count();
      // Test accuracy, 250 images at a time through the stages.
      stage.set_training(false);
      std::vector<std::int64_t> tidx(static_cast<std::size_t>(test.n));
      for (std::int64_t i = 0; i < test.n; ++i) tidx[std::size_t(i)] = i;
      for (std::int64_t i = 0; i < test.n; i += 250) {
        const std::int64_t k = std::min<std::int64_t>(250, test.n - i);
        const tensor x = make_batch(test, tidx.data() + i, k, mean, stdev, augment{}, rng, labels);
        upload(x);
        (void)pp.forward(first ? x_dev : nullptr, k, h, w);
        if (last) stage.loss(l_dev);
      }
      if (last) {
        const auto [tl, tr] = stage.take_sums();
        const double el = std::chrono::duration<double>(clock_type::now() - t0).count();
        std::printf("epoch %d/%d train loss %.4f train acc %.2f%% test loss %.4f test accuracy %.2f%% (%lld images) "
                    "elapsed %.1f s (training %.1f s)\n",
                    e + 1, cfg.epochs, loss_sum / double(steps_per_epoch), 100.0 * correct / double(steps_per_epoch * cfg.batch),
                    tl / double(test.n), 100.0 * tr / double(test.n), (long long)test.n, el, train_secs);
        std::fflush(stdout);
      }
    }
    BRAID_CUDA_CHECK(cudaStreamSynchronize(st));
  }
}

void train_cuda(const config& cfg, const image_dataset& train, const image_dataset& test, double mean, double stdev,
                std::int64_t steps_per_epoch, const schedule& sched) {
  auto comms = braid::cuda::create_group(braid_examples::gpu_of_ranks(cfg.stages, cfg.gpus, "stage(s)"));
  braid_examples::run_cuda_ranks(comms, [&](std::size_t, braid::cuda::communicator& comm) {
    cuda_stage(cfg, comm, train, test, mean, stdev, steps_per_epoch, sched);
  });
}
#endif

} // namespace

int main(int argc, char** argv) {
  const config cfg = parse(argc, argv);
  image_dataset train, test;
  try {
    train = load_fashion_mnist(true, cfg.data_dir);
    test = load_fashion_mnist(false, cfg.data_dir);
  } catch (const braid::error& e) {
    std::fprintf(stderr, "resnet_pipeline: %s\n", e.what());
    return 1;
  }
  if (cfg.train_subset > 0) train = train.head(cfg.train_subset);
  if (cfg.test_subset > 0) test = test.head(cfg.test_subset);
  const auto [mean, stdev] = pixel_mean_std(train);
  blas::set_threads(cfg.blas_threads);
  const std::int64_t steps_per_epoch = train.n / cfg.batch;
  if (steps_per_epoch < 1) usage("the training set is smaller than one batch");
  const std::int64_t total = steps_per_epoch * cfg.epochs;
  const schedule sched = schedule::cosine_lr(cfg.lr, total, std::max<std::int64_t>(1, total * 3 / 100));
  std::printf("resnet_pipeline: ResNet-%d (widths %d/%d/%d), %s, batch %d in %d micro-batches, SGD Nesterov lr %g "
              "wd %g, cosine schedule, %d epoch(s) x %lld steps, seed %llu\n",
              6 * cfg.blocks + 2, cfg.width, 2 * cfg.width, 4 * cfg.width,
              cfg.stages == 2 ? ("2 stages on 2 ranks (" + std::string(cfg.backend == "cuda" ? "GPUs of this process" : "threads") +
                                 "), cut before child " + std::to_string(cfg.cut))
                                    .c_str()
              : cfg.reverse   ? "unsplit on 1 rank, gradient accumulation over the micro-batches in reverse order"
                              : "unsplit on 1 rank, gradient accumulation",
              cfg.batch, cfg.micro, cfg.lr, cfg.wd, cfg.epochs, (long long)steps_per_epoch, (unsigned long long)cfg.seed);
  std::printf("data: %lld training and %lld test images (%s), augmentation %s; BLAS and oneDNN threads per rank: %d\n",
              (long long)train.n, (long long)test.n, cfg.data_dir.c_str(), cfg.augment ? "crop (pad 2) + flip" : "off",
              cfg.blas_threads);
  std::fflush(stdout);

  int rc = 0;
  if (cfg.backend == "cuda") {
#if BRAID_PIPELINE_CUDA
#if defined(BRAID_CUDA_EMULATOR)
    std::printf("%s\n", braid_examples::emulated_device_banner());
#endif
    try {
      train_cuda(cfg, train, test, mean, stdev, steps_per_epoch, sched);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "resnet_pipeline: %s\n", e.what());
      rc = 1;
    }
    return rc;
#else
    std::fprintf(stderr, "resnet_pipeline: this binary has no CUDA path: run resnet_pipeline_cuda (built with nvcc where CMake "
                         "found CUDA) or resnet_pipeline_emu (braid's emulated CUDA device)\n");
    return 2;
#endif
  }
  try {
    braid::run_threads(cfg.stages, [&](braid::communicator& comm) {
      std::mt19937_64 init(cfg.seed);
      std::unique_ptr<sequential<float>> net = resnet<float>(cfg.blocks, 10, init, 1, cfg.width);
      std::unique_ptr<sequential<float>> model =
          cfg.stages == 2 ? take_stage(*net, {std::size_t(cfg.cut)}, comm.rank()) : std::move(net);
      pipeline<float> pp(*model, comm, cfg.micro);
      sgd<float> opt(model->parameters(), 0.9, cfg.wd, true);
      // The same batches on every rank: one sampler order, one augmentation engine per rank, seeded alike.
      distributed_sampler sampler(train.n, 1, 0, cfg.seed);
      std::mt19937_64 rng(cfg.seed * 1000003);
      const augment aug = cfg.augment ? augment{2, true} : augment{};
      softmax_cross_entropy<float> ce;
      std::vector<std::int32_t> labels;
      const auto t0 = clock_type::now();
      double train_secs = 0; // all epochs' training so far, without the evaluations
      std::int64_t step = 0;
      for (int e = 0; e < cfg.epochs; ++e) {
        const auto te = clock_type::now();
        model->set_training(true);
        const auto idx = sampler.indices(e);
        double loss_sum = 0, correct = 0;
        for (std::int64_t s = 0; s < steps_per_epoch; ++s, ++step) {
          tensor x = make_batch(train, idx.data() + s * cfg.batch, cfg.batch, mean, stdev, aug, rng, labels);
          model->zero_grad();
          double loss = 0;
          if (cfg.stages == 2) {
            loss = pp.train_step(x, labels);
            correct += double(pp.correct());
          } else { // the unsplit reference: gradient accumulation, micro-batch by micro-batch
            for (int ii = 0; ii < cfg.micro; ++ii) {
              const int i = cfg.reverse ? cfg.micro - 1 - ii : ii;
              const auto [lo, n] = micro_batch_range(cfg.batch, cfg.micro, i); // the pipeline's cut
              const tensor xi = micro_batch<float>(x, cfg.micro, i);
              const std::vector<std::int32_t> yi(labels.begin() + lo, labels.begin() + lo + n);
              const double w = double(n) / double(cfg.batch);
              loss += ce.forward(model->forward(xi), yi) * w;
              correct += double(ce.correct());
              model->backward(ce.backward(w));
            }
          }
          loss_sum += loss;
          if (cfg.log_every > 0 && (step + 1) % cfg.log_every == 0 && comm.rank() == 0)
            std::printf("step %lld loss %.9f\n", (long long)step + 1, loss);
          opt.step(sched.at(step));
        }
        train_secs += std::chrono::duration<double>(clock_type::now() - te).count();
        // Test accuracy, 250 images at a time through the stages.
        model->set_training(false);
        double t[2] = {0, 0}; // loss sum, correct (on the last stage)
        std::vector<std::int64_t> tidx(static_cast<std::size_t>(test.n));
        for (std::int64_t i = 0; i < test.n; ++i) tidx[std::size_t(i)] = i;
        for (std::int64_t i = 0; i < test.n; i += 250) {
          const std::int64_t k = std::min<std::int64_t>(250, test.n - i);
          tensor x = make_batch(test, tidx.data() + i, k, mean, stdev, augment{}, rng, labels);
          tensor y = pp.forward(x);
          if (pp.last()) {
            t[0] += ce.forward(y, labels) * double(k);
            t[1] += double(ce.correct());
          }
        }
        if (comm.size() > 1) comm.broadcast(std::span<double>(t, 2), comm.size() - 1);
        if (comm.rank() == 0) {
          const double el = std::chrono::duration<double>(clock_type::now() - t0).count();
          std::printf("epoch %d/%d train loss %.4f train acc %.2f%% test loss %.4f test accuracy %.2f%% (%lld images) "
                      "elapsed %.1f s (training %.1f s)\n",
                      e + 1, cfg.epochs, loss_sum / double(steps_per_epoch),
                      100.0 * correct / double(steps_per_epoch * cfg.batch), t[0] / double(test.n),
                      100.0 * t[1] / double(test.n), (long long)test.n, el, train_secs);
          std::fflush(stdout);
        }
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_pipeline: %s\n", e.what());
    rc = 1;
  }
  return rc;
}
