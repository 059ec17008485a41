// resnet_fmnist — a ResNet (ResNet-20 shape: three stages of 16/32/64 channels, 3 basic blocks each)
// trained on Fashion-MNIST in data parallel with braid::nn. Ranks are threads of this process
// (--backend host), or GPUs of this process (--backend cuda: braid::cuda::create_group, one host
// thread per GPU, the model on the device as nn::fused::resnet, gradients averaged in buckets while
// backward runs, fused optimizers; in the binaries built with BRAID_RESNET_CUDA: resnet_fmnist_emu on
// braid's emulated CUDA device, resnet_fmnist_cuda with nvcc). Both paths train in fp32, bf16 or fp16
// (mixed precision: fp32 master weights, compute-type weights and gradients, dynamic loss scaling).
// With --launch env each process is one rank instead, started by torchrun, mpirun or srun
// (communicator_from_env for the host backend, cuda::process_communicator::from_env for cuda).
//
//   resnet_fmnist --ranks 2 --epochs 10 --batch 128 --lr 0.1 --optimizer sgd --precision fp32
//
// Prints a progress line (epoch, step/steps, loss, running accuracy, images/s) every --log-every
// steps and the test accuracy after each epoch; writes the curves to --csv; saves a checkpoint after
// each epoch to --checkpoint (when given) and continues from one with --resume (--stop-after E ends
// the run after E epochs, as an interruption would).
#include <braid/braid.hpp>
#include <braid/nn.hpp>

#include "../common/cli.hpp"
#if BRAID_RESNET_CUDA
#include <braid/cuda.cuh>
#include <braid/nn/ddp_device.cuh>
#include <braid/nn/model_device.cuh>
#include <braid/nn/optim_device.cuh>

#include "../common/cuda_ranks.hpp"

#include <barrier>
#include <numeric>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <functional>
#include <mutex>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
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
  std::string launch = "threads"; // threads: ranks are threads (or GPUs) of this process; env: one process per rank
  int process_rank = 0;           // --launch env: this process's rank (0 otherwise)
  int gpus = 0;                   // --backend cuda: GPUs the ranks take in turn (0: one per rank)
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "resnet_fmnist: %s\n"
               "usage: resnet_fmnist [--ranks N] [--backend host|cuda] [--epochs E] [--batch B] [--lr X]\n"
               "         [--optimizer sgd|adamw|lamb] [--precision fp32|bf16|fp16] [--resume FILE]\n"
               "         [--checkpoint FILE] [--csv FILE] [--train-subset N] [--test-subset N] [--blocks n]\n"
               "         [--width W] [--wd X] [--log-every S] [--seed S] [--blas-threads T] [--no-augment]\n"
               "         [--stop-after E] [--data DIR] [--launch threads|env] [--gpus G]\n"
               "  --gpus G (--backend cuda): rank r runs on GPU r mod G (default: one GPU per rank)\n"
               "  --launch env: this process is one rank of a job started by torchrun, mpirun or srun (or with\n"
               "  BRAID_UNIQUE_ID, RANK and WORLD_SIZE set); --ranks is the job's size\n",
               why);
  std::exit(2);
}

config parse(int argc, char** argv) {
  config c;
  bool ranks_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&] { return braid_examples::flag_value(argc, argv, i, usage); };
    auto num = [&] { return braid_examples::flag_number(argc, argv, i, usage); };
    if (a == "--ranks") {
      c.ranks = int(num());
      ranks_given = true;
    } else if (a == "--launch") c.launch = val();
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
    else if (a == "--gpus") c.gpus = int(num());
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
  if (c.launch != "threads" && c.launch != "env") usage("--launch: threads or env");
  if (c.launch == "env") {
    braid::launch_info li;
    try {
      li = braid::launch_info_from_env();
    } catch (const braid::error& e) {
      usage((std::string("--launch env: ") + e.what()).c_str());
    }
    if (ranks_given && c.ranks != li.size)
      usage(("--launch env: --ranks " + std::to_string(c.ranks) + " but the launcher started " + std::to_string(li.size) +
             " processes")
                .c_str());
    c.ranks = li.size;
    c.process_rank = li.rank;
  }
  if (c.ranks < 1 || c.ranks > 64) usage("--ranks must be in 1..64");
  if (c.gpus < 0) usage("--gpus must be >= 1");
  if (c.gpus > 0 && (c.backend != "cuda" || c.launch != "threads")) usage("--gpus is for --backend cuda --launch threads");
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

// --launch env: every rank's augmentation engine into every process's sh.rngs (rank 0 writes them
// all into the checkpoint), through the host communicator's all_gather; synchronises the ranks.
void share_rngs(braid::communicator& host, shared_state& sh) {
  constexpr std::size_t cap = 8192; // an mt19937_64's text is at most 312 numbers of 20 digits
  std::ostringstream os;
  os << sh.rngs[std::size_t(host.rank())];
  const std::string mine = os.str();
  if (mine.size() >= cap) throw braid::error(braid::errc::internal, "resnet_fmnist: an engine's state does not fit");
  std::vector<char> in(cap, '\0'), all(cap * std::size_t(host.size()));
  std::copy(mine.begin(), mine.end(), in.begin());
  host.all_gather(in.data(), all.data(), cap);
  for (int r = 0; r < host.size(); ++r) {
    std::istringstream is(std::string(all.data() + std::size_t(r) * cap));
    is >> sh.rngs[std::size_t(r)];
  }
}

// What every checkpoint of this trainer records of the run, host or CUDA: how it was run, where it
// stopped, every rank's augmentation engine (all current: the caller has synchronised the ranks) and
// the model (the host model: the CUDA path stores its weights there first).
void put_run(checkpoint& ck, const config& cfg, const shared_state& sh, module<float>& model, std::int64_t epochs_done,
             std::int64_t step) {
  ck.put_string("backend", cfg.backend);
  ck.put_int("ranks", cfg.ranks);
  ck.put_string("precision", cfg.precision);
  for (int r = 0; r < cfg.ranks; ++r) ck.put_rng("rng." + std::to_string(r), sh.rngs[std::size_t(r)]);
  ck.put_int("epoch", epochs_done);
  ck.put_int("step", step);
  ck.put_module("model.", model);
}
// On --resume: refuses a checkpoint of another run's shape, restores this rank's engine and the
// model, and returns {epochs done, steps done}.
std::pair<std::int64_t, std::int64_t> get_run(const checkpoint& ck, const config& cfg, int rank, std::mt19937_64& rng,
                                              module<float>& model) {
  const std::string backend = ck.has("backend") ? ck.get_string("backend") : "host";
  if (backend != cfg.backend || ck.get_int("ranks") != cfg.ranks || ck.get_string("precision") != cfg.precision)
    throw braid::invalid_argument("--resume: " + cfg.resume + " was written by a run with --backend " + backend + " --ranks " +
                                  std::to_string(ck.get_int("ranks")) + " --precision " + ck.get_string("precision") +
                                  "; this run has --backend " + cfg.backend + " --ranks " + std::to_string(cfg.ranks) +
                                  " --precision " + cfg.precision);
  ck.get_rng("rng." + std::to_string(rank), rng);
  const std::int64_t epoch = ck.get_int("epoch"), step = ck.get_int("step");
  if (rank == 0) std::printf("resumed from %s at epoch %lld, step %lld\n", cfg.resume.c_str(), (long long)epoch, (long long)step);
  ck.get_module("model.", model);
  return {epoch, step};
}
// --optimizer's optimizer, made as Sgd, Adam or Lamb<float>(args..., hyperparameters): nn's
// optimizers or their fused counterparts, with the same hyperparameters (SGD: Nesterov momentum 0.9;
// AdamW; LAMB; weight decay --wd).
template <class Base, template <class> class Sgd, template <class> class Adam, template <class> class Lamb, class... Args>
std::unique_ptr<Base> make_optimizer(const config& cfg, const Args&... args) {
  if (cfg.optimizer == "sgd") return std::make_unique<Sgd<float>>(args..., 0.9, cfg.wd, true);
  if (cfg.optimizer == "adamw") return std::make_unique<Adam<float>>(args..., cfg.wd, true);
  return std::make_unique<Lamb<float>>(args..., cfg.wd);
}
// The loss scaler's state in a checkpoint (mixed precision).
void put_scaler(checkpoint& ck, double scale, int clean, std::uint64_t skipped) {
  ck.put_real("scaler.scale", scale);
  ck.put_int("scaler.clean", clean);
  ck.put_int("scaler.skipped", std::int64_t(skipped));
}
// The progress line's mixed-precision part.
std::string scaler_note(double scale, std::uint64_t skipped) {
  return " scale " + std::to_string(std::int64_t(scale)) + " skipped " + std::to_string(skipped);
}

// Rank 0's progress line and its CSV row.
void print_progress(std::ofstream& csv, const config& cfg, std::int64_t epoch, std::int64_t s, std::int64_t steps_per_epoch,
                    std::int64_t step, const double w[3], double loss_sum, double correct, double seen, double lr, double ips,
                    double elapsed, const std::string& extra) {
  std::printf("epoch %lld/%d step %lld/%lld loss %.4f acc %.2f%% lr %.4g images/s %.1f%s\n", (long long)epoch + 1, cfg.epochs,
              (long long)s + 1, (long long)steps_per_epoch, loss_sum / seen, 100.0 * correct / seen, lr, ips, extra.c_str());
  std::fflush(stdout);
  csv << "train," << epoch + 1 << "," << step + 1 << "," << w[0] / w[2] << "," << w[1] / w[2] << "," << lr << "," << ips << ","
      << elapsed << "\n";
}
// Rank 0's test line and its CSV row; t = {summed loss, right answers, images}.
void print_test(std::ofstream& csv, const config& cfg, std::int64_t epoch, std::int64_t step, const double t[3], double lr,
                double elapsed) {
  std::printf("epoch %lld/%d test loss %.4f test accuracy %.2f%% (%lld images) elapsed %.1f s\n", (long long)epoch + 1,
              cfg.epochs, t[0] / t[2], 100.0 * t[1] / t[2], (long long)t[2], elapsed);
  std::fflush(stdout);
  csv << "test," << epoch + 1 << "," << step << "," << t[0] / t[2] << "," << t[1] / t[2] << "," << lr << ",," << elapsed << "\n";
  csv.flush();
}

#if BRAID_RESNET_CUDA
// --backend cuda: rank r on GPU r of this process (braid::cuda::create_group), one host thread each.
// The model is nn::resnet's, initialised on the host from --seed as the host path does, then trained
// as nn::fused::resnet on the device: batches go up through a pinned buffer, gradients are averaged
// in 256 KiB buckets by fused::bucket_reducer on a second stream while backward runs, and the fused
// optimizer steps on the device. The host waits for the device only to reuse the pinned buffer (the
// previous step's upload), at the progress lines, at evaluation and for checkpoints.
// A cuBLAS handle, destroyed with its owner.
struct blas_handle {
  cublasHandle_t h = nullptr;
  blas_handle() {
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw braid::error(braid::errc::cuda, "resnet_fmnist: cublasCreate failed");
  }
  blas_handle(const blas_handle&) = delete;
  blas_handle& operator=(const blas_handle&) = delete;
  ~blas_handle() { (void)cublasDestroy(h); }
};
// One rank's streams, cuBLAS handle and pinned upload buffers. Each member releases its own handle,
// so a constructor that fails partway leaks nothing; the destructor first lets both streams finish
// (the pinned buffers may still be read by an upload).
struct cuda_rank_resources {
  braid::cuda::detail::owned_stream compute, comm;
  blas_handle blas;
  braid::cuda::detail::owned_event uploaded;
  braid::cuda::detail::grow_only<braid::cuda::detail::memory_kind::pinned> x_mem, l_mem;
  float* pinned_x = nullptr;
  std::int32_t* pinned_l = nullptr;
  cuda_rank_resources(std::int64_t images, std::int64_t pixels) {
    BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&compute.h, cudaStreamNonBlocking));
    BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&comm.h, cudaStreamNonBlocking));
    BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded.h, cudaEventDisableTiming));
    pinned_x = x_mem.get<float>(std::size_t(images * pixels), uploaded.h);
    pinned_l = l_mem.get<std::int32_t>(std::size_t(images), uploaded.h);
  }
  cuda_rank_resources(const cuda_rank_resources&) = delete;
  cuda_rank_resources& operator=(const cuda_rank_resources&) = delete;
  ~cuda_rank_resources() {
    (void)cudaStreamSynchronize(compute.h);
    (void)cudaStreamSynchronize(comm.h);
  }
};

// One rank, over braid::cuda::communicator (a GPU of this process) or process_communicator (one
// process per GPU). sync(): before a checkpoint, every rank's engine is current in sh.rngs (and, with
// thread ranks, again after it: rank 0 has read them).
template <class Comm>
void train_cuda_rank(const config& cfg, Comm& comm, const image_dataset& train, const image_dataset& test, double mean,
                     double stdev, std::int64_t steps_per_epoch, const schedule& sched, shared_state& sh,
                     const std::function<void()>& sync, std::ofstream& csv) {
  const int rank = comm.rank();
  BRAID_CUDA_CHECK(cudaSetDevice(comm.device()));
  const int local = cfg.batch / cfg.ranks, test_batch = 250;
  const std::int64_t pixels = std::int64_t(train.rows) * train.cols, most = std::max(local, test_batch);
  device_pool pool(comm.device());
  {
    cuda_rank_resources res(most, pixels);
    std::mt19937_64 init(cfg.seed);
    auto host_model = resnet<float>(cfg.blocks, 10, init, 1, cfg.width, false);
    fused::resnet<float> net(cfg.blocks, 10, 1, cfg.width, pool, res.compute.h, res.blas.h);
    net.load(*host_model);
    net.set_buckets(std::int64_t(1) << 16);
    // bf16 and fp16: the optimizer steps fp32 master weights, rounded into the model after each step
    // (fused::round_into), the loss is scaled by a device loss scaler, and each averaged gradient is
    // rounded to the compute type, checked and unscaled before the step; a step with an overflow is
    // skipped on the device. The rules are the host path's (mixed_precision, loss_scaler); the
    // gradients are averaged in float here (the host path averages them in the compute type).
    const bool mixed = cfg.precision != "fp32", bf16 = cfg.precision == "bf16";
    pool_buffer<float> master_mem;
    if (mixed) master_mem = pool_buffer<float>(pool, net.size(), res.compute.h);
    float* const master = master_mem.get();
    fused::loss_scaler scaler(res.compute.h);
    const fused::flat_params<float> fp{mixed ? master : net.values(), net.grads(), net.size(), net.segments()};
    const auto opt = make_optimizer<fused::optimizer<float>, fused::sgd, fused::adam, fused::lamb>(cfg, fp, res.compute.h);
    std::mt19937_64& rng = sh.rngs[std::size_t(rank)];
    std::int64_t epoch = 0, step = 0;
    if (!cfg.resume.empty()) {
      checkpoint ck = checkpoint::load(cfg.resume);
      std::tie(epoch, step) = get_run(ck, cfg, rank, rng, *host_model);
      net.load(*host_model);
      for (std::size_t k = 0; k < opt->state_count(); ++k) {
        tensor st({net.size()}, braid::dtype::float32);
        ck.get("opt.state." + std::to_string(k), st);
        BRAID_CUDA_CHECK(cudaMemcpy(opt->state(k), st.data<float>(), std::size_t(net.size()) * sizeof(float), cudaMemcpyHostToDevice));
      }
      if (mixed) {
        tensor m({net.size()}, braid::dtype::float32);
        ck.get("master", m);
        BRAID_CUDA_CHECK(cudaMemcpy(master, m.data<float>(), std::size_t(net.size()) * sizeof(float), cudaMemcpyHostToDevice));
        scaler.set_state(ck.get_real("scaler.scale"), int(ck.get_int("scaler.clean")), std::uint64_t(ck.get_int("scaler.skipped")));
      }
      BRAID_CUDA_CHECK(cudaDeviceSynchronize());
      opt->set_steps(ck.get_int("opt.steps"));
    }
    // Every collective of this rank goes on the one communication stream (the bucket averages run
    // there), in the same order on every rank; the compute stream is synchronised around the few
    // outside the steps. DDP's start: every rank takes rank 0's parameters and statistics.
    auto broadcast_from_0 = [&](float* p, std::int64_t n) {
      BRAID_CUDA_CHECK(cudaStreamSynchronize(res.compute.h));
      comm.broadcast(p, p, std::size_t(n), 0, res.comm.h);
      BRAID_CUDA_CHECK(cudaStreamSynchronize(res.comm.h));
    };
    broadcast_from_0(net.values(), net.size());
    broadcast_from_0(net.buffers(), net.buffer_size());
    if (mixed && cfg.resume.empty()) { // the masters start as rank 0's weights; the model holds them rounded
      BRAID_CUDA_CHECK(cudaMemcpyAsync(master, net.values(), std::size_t(net.size()) * sizeof(float), cudaMemcpyDeviceToDevice,
                                       res.compute.h));
      fused::round_into(master, net.values(), net.size(), bf16, res.compute.h);
    }
    fused::bucket_reducer<Comm> reducer(comm, net.grads(), net.size(), net.bucket_begin(), res.comm.h);
    net.on_bucket_ready([&](std::size_t b) { reducer.ready(b, res.compute.h); });

    const pool_buffer<float> x_mem(pool, most * pixels, res.compute.h);
    const pool_buffer<std::int32_t> l_mem(pool, most, res.compute.h);
    const pool_buffer<double> sum_mem(pool, 3, res.compute.h);
    float* const x_dev = x_mem.get();
    std::int32_t* const l_dev = l_mem.get();
    double* const sum_dev = sum_mem.get();
    // A batch up to the device (the pinned buffer is reused once the last upload has run).
    std::vector<std::int32_t> labels;
    // Training batches are rounded to the compute type in mixed precision (the host path's rule).
    auto upload = [&](const image_dataset& d, const std::int64_t* idx, std::int64_t k, const augment& aug, bool round) {
      tensor x = make_batch(d, idx, k, mean, stdev, aug, rng, labels);
      if (round)
        for (float& v : std::span<float>(x.data<float>(), std::size_t(x.numel()))) v = braid::nn::rules::round_to(v, bf16);
      BRAID_CUDA_CHECK(cudaEventSynchronize(res.uploaded.h));
      std::copy(x.data<float>(), x.data<float>() + x.numel(), res.pinned_x);
      std::copy(labels.begin(), labels.end(), res.pinned_l);
      BRAID_CUDA_CHECK(cudaMemcpyAsync(x_dev, res.pinned_x, std::size_t(x.numel()) * sizeof(float), cudaMemcpyHostToDevice, res.compute.h));
      BRAID_CUDA_CHECK(cudaMemcpyAsync(l_dev, res.pinned_l, std::size_t(k) * sizeof(std::int32_t), cudaMemcpyHostToDevice, res.compute.h));
      BRAID_CUDA_CHECK(cudaEventRecord(res.uploaded.h, res.compute.h));
      return x.shape();
    };
    // Sums v[0..2] over the ranks (on the device, through braid::cuda's all_reduce).
    auto sum_ranks = [&](double* v) {
      BRAID_CUDA_CHECK(cudaStreamSynchronize(res.compute.h));
      BRAID_CUDA_CHECK(cudaMemcpyAsync(sum_dev, v, 3 * sizeof(double), cudaMemcpyHostToDevice, res.comm.h));
      comm.all_reduce(sum_dev, sum_dev, 3, braid::sum{}, res.comm.h);
      BRAID_CUDA_CHECK(cudaMemcpyAsync(v, sum_dev, 3 * sizeof(double), cudaMemcpyDeviceToHost, res.comm.h));
      BRAID_CUDA_CHECK(cudaStreamSynchronize(res.comm.h));
      comm.check(); // what a collective's kernel recorded (a timeout, a dead peer), as an exception
    };

    distributed_sampler sampler(train.n, cfg.ranks, rank, cfg.seed);
    const augment aug = cfg.augment ? augment{2, true} : augment{};
    const auto t0 = clock_type::now();
    int epochs_run = 0;
    for (; epoch < cfg.epochs && !(cfg.stop_after > 0 && epochs_run == cfg.stop_after); ++epoch, ++epochs_run) {
      net.set_training(true);
      const auto idx = sampler.indices(epoch);
      double loss_sum = 0, seen = 0, correct = 0, win_n = 0;
      auto win_t = clock_type::now();
      (void)net.take_sums();
      for (std::int64_t s = 0; s < steps_per_epoch; ++s, ++step) {
        const shape_t shape = upload(train, idx.data() + s * local, local, aug, mixed);
        net.zero_grad();
        net.forward(x_dev, shape);
        net.loss(l_dev);
        const double lr = sched.at(step);
        if (mixed) {
          net.backward(scaler, bf16);
          reducer.finish(res.compute.h);
          scaler.unscale(net.grads(), net.size(), bf16);
          scaler.update();
          opt->step(lr, &scaler);
          fused::round_into(master, net.values(), net.size(), bf16, res.compute.h);
        } else {
          net.backward();
          reducer.finish(res.compute.h);
          opt->step(lr);
        }
        win_n += local;
        const bool last = s + 1 == steps_per_epoch;
        if ((cfg.log_every > 0 && (s + 1) % cfg.log_every == 0) || last) {
          const auto [l, r] = net.take_sums();
          double w[3] = {l, r, win_n};
          sum_ranks(w);
          loss_sum += w[0];
          correct += w[1];
          seen += w[2];
          const double ips = w[2] / std::chrono::duration<double>(clock_type::now() - win_t).count();
          if (rank == 0)
            print_progress(csv, cfg, epoch, s, steps_per_epoch, step, w, loss_sum, correct, seen, lr, ips,
                           std::chrono::duration<double>(clock_type::now() - t0).count(),
                           mixed ? [&] { const auto st = scaler.read(); return scaler_note(st.scale, st.skipped); }() : std::string());
          win_n = 0;
          win_t = clock_type::now();
        }
      }
      // Rank 0's BatchNorm running statistics for everyone, then each rank tests a disjoint slice.
      broadcast_from_0(net.buffers(), net.buffer_size());
      net.set_training(false);
      const std::int64_t per = (test.n + cfg.ranks - 1) / cfg.ranks;
      const std::int64_t lo = std::min<std::int64_t>(test.n, rank * per), hi = std::min<std::int64_t>(test.n, lo + per);
      std::vector<std::int64_t> tidx;
      for (std::int64_t i = lo; i < hi; ++i) tidx.push_back(i);
      for (std::int64_t i = lo; i < hi; i += test_batch) {
        const std::int64_t k = std::min<std::int64_t>(test_batch, hi - i);
        const shape_t shape = upload(test, tidx.data() + (i - lo), k, augment{}, false);
        net.forward(x_dev, shape);
        net.loss(l_dev);
      }
      const auto [tl, tr] = net.take_sums();
      double t[3] = {tl, tr, double(hi - lo)};
      sum_ranks(t);
      if (rank == 0)
        print_test(csv, cfg, epoch, step, t, sched.at(std::max<std::int64_t>(step - 1, 0)),
                   std::chrono::duration<double>(clock_type::now() - t0).count());
      if (!cfg.checkpoint_path.empty()) {
        sync(); // every rank's engine is current in sh.rngs
        if (rank == 0) {
          net.store(*host_model);
          checkpoint ck;
          put_run(ck, cfg, sh, *host_model, epoch + 1, step);
          for (std::size_t k = 0; k < opt->state_count(); ++k) {
            tensor st({net.size()}, braid::dtype::float32);
            BRAID_CUDA_CHECK(cudaMemcpyAsync(st.data<float>(), opt->state(k), std::size_t(net.size()) * sizeof(float),
                                             cudaMemcpyDeviceToHost, res.compute.h));
            BRAID_CUDA_CHECK(cudaStreamSynchronize(res.compute.h));
            ck.put("opt.state." + std::to_string(k), st);
          }
          ck.put_int("opt.steps", opt->steps());
          if (mixed) {
            tensor m({net.size()}, braid::dtype::float32);
            BRAID_CUDA_CHECK(cudaMemcpyAsync(m.data<float>(), master, std::size_t(net.size()) * sizeof(float), cudaMemcpyDeviceToHost,
                                             res.compute.h));
            BRAID_CUDA_CHECK(cudaStreamSynchronize(res.compute.h));
            ck.put("master", m);
            const auto st = scaler.read();
            put_scaler(ck, st.scale, st.clean, st.skipped);
          }
          ck.save(cfg.checkpoint_path);
          std::printf("checkpoint: %s (epoch %lld)\n", cfg.checkpoint_path.c_str(), (long long)epoch + 1);
        }
        sync();
      }
    }
    BRAID_CUDA_CHECK(cudaStreamSynchronize(res.compute.h));
  }
  if (rank == 0) std::cout << "device " << pool.stats() << "\n";
}

void train_cuda(const config& cfg, const image_dataset& train, const image_dataset& test, double mean, double stdev,
                std::int64_t steps_per_epoch, const schedule& sched, shared_state& sh, std::ofstream& csv) {
  auto comms = braid::cuda::create_group(braid_examples::gpu_of_ranks(cfg.ranks, cfg.gpus, "rank(s)"));
  std::barrier<> sync(cfg.ranks);
  const std::function<void()> arrive = [&] { sync.arrive_and_wait(); };
  braid_examples::run_cuda_ranks(
      comms,
      [&](std::size_t, braid::cuda::communicator& comm) {
        train_cuda_rank(cfg, comm, train, test, mean, stdev, steps_per_epoch, sched, sh, arrive, csv);
      },
      [&](std::size_t) { sync.arrive_and_drop(); });
}

// --backend cuda --launch env: this process is one rank, on GPU (rank % visible GPUs)
// (process_communicator::from_env). An error aborts the communicator, so the peers' collectives end
// with `aborted` instead of waiting for their timeout.
void train_cuda_process(const config& cfg, const image_dataset& train, const image_dataset& test, double mean, double stdev,
                        std::int64_t steps_per_epoch, const schedule& sched, shared_state& sh, std::ofstream& csv) {
  auto comm = braid::cuda::process_communicator::from_env();
  if (comm.rank() == 0) std::printf("process path: %s\n", comm.describe().c_str());
  const std::function<void()> sync = [&] { share_rngs(comm.host(), sh); };
  try {
    train_cuda_rank(cfg, comm, train, test, mean, stdev, steps_per_epoch, sched, sh, sync, csv);
  } catch (...) {
    comm.abort();
    throw;
  }
  comm.close();
}
#endif

} // namespace

int main(int argc, char** argv) {
  const config cfg = parse(argc, argv);
  if (cfg.backend == "cuda") {
#if !BRAID_RESNET_CUDA
    std::fprintf(stderr, "resnet_fmnist: this binary has no CUDA path: run resnet_fmnist_cuda (built with nvcc where CMake "
                         "found CUDA) or resnet_fmnist_emu (braid's emulated CUDA device)\n");
    return 2;
#endif
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

  // --launch env: every process runs this; only rank 0 prints and writes the curves.
  const bool speaker = cfg.process_rank == 0;
  if (!speaker && !std::freopen("/dev/null", "w", stdout)) return 1;
  std::printf("resnet_fmnist: ResNet-%d (widths %d/%d/%d), %d rank(s) as %s, batch %d (%d per rank), %s, lr %g, "
              "wd %g, %s, cosine schedule with %lld warmup steps, %d epoch(s) x %lld steps\n",
              6 * cfg.blocks + 2, cfg.width, cfg.width * 2, cfg.width * 4, cfg.ranks,
              cfg.launch == "env"      ? (cfg.backend == "cuda" ? "processes (one GPU each)" : "processes")
              : cfg.backend == "cuda" ? "GPUs of this process"
                                      : "threads",
              cfg.batch, local,
              cfg.optimizer.c_str(), cfg.lr, cfg.wd, cfg.precision.c_str(),
              (long long)std::max<std::int64_t>(1, total_steps * cfg.warmup_epochs_pct / 100), cfg.epochs,
              (long long)steps_per_epoch);
  std::printf("data: %lld training and %lld test images (%s), mean %.4f std %.4f, augmentation %s; BLAS and oneDNN threads per rank: %d\n",
              (long long)train.n, (long long)test.n, cfg.data_dir.c_str(), mean, stdev,
              cfg.augment ? "crop (pad 2) + flip" : "off", blas_threads);
  std::fflush(stdout);

  std::ofstream csv;
  if (speaker) {
    csv.open(cfg.csv);
    csv << "kind,epoch,step,loss,accuracy,lr,images_per_s,elapsed_s\n";
  }
  shared_state sh;
  sh.rngs.resize(std::size_t(cfg.ranks));
  for (int r = 0; r < cfg.ranks; ++r) sh.rngs[std::size_t(r)].seed(cfg.seed * 1000003 + std::uint64_t(r));

  int rc = 0;
#if BRAID_RESNET_CUDA
  if (cfg.backend == "cuda") {
    try {
#if defined(BRAID_CUDA_EMULATOR)
      std::printf("%s\n", braid_examples::emulated_device_banner());
#endif
      if (cfg.launch == "env") train_cuda_process(cfg, train, test, mean, stdev, steps_per_epoch, sched, sh, csv);
      else train_cuda(cfg, train, test, mean, stdev, steps_per_epoch, sched, sh, csv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "resnet_fmnist: %s\n", e.what());
      rc = 1;
    }
    std::printf("curves: %s\n", cfg.csv.c_str());
    return rc;
  }
#endif
  try {
    auto host_rank = [&](braid::communicator& comm) {
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
      const auto opt = make_optimizer<optimizer<float>, sgd, adam, lamb>(cfg, opt_params);
      loss_scaler scaler;
      std::mt19937_64& rng = sh.rngs[std::size_t(rank)];
      std::int64_t epoch = 0, step = 0;
      if (!cfg.resume.empty()) {
        checkpoint ck = checkpoint::load(cfg.resume);
        std::tie(epoch, step) = get_run(ck, cfg, rank, rng, *model);
        if (mp) {
          auto mps = mp->master_params();
          for (std::size_t i = 0; i < mps.size(); ++i) ck.get("master." + std::to_string(i), mps[i]->value);
        }
        ck.get_optimizer("opt.", *opt);
        scaler.set_state(ck.get_real("scaler.scale"), int(ck.get_int("scaler.clean")), std::uint64_t(ck.get_int("scaler.skipped")));
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
            if (rank == 0)
              print_progress(csv, cfg, epoch, s, steps_per_epoch, step, w, loss_sum, correct, seen, lr, ips,
                             std::chrono::duration<double>(clock_type::now() - t0).count(),
                             mp ? scaler_note(scaler.scale(), scaler.skipped()) : std::string());
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
        if (rank == 0)
          print_test(csv, cfg, epoch, step, t, sched.at(std::max<std::int64_t>(step - 1, 0)),
                     std::chrono::duration<double>(clock_type::now() - t0).count());
        if (!cfg.checkpoint_path.empty()) {
          if (cfg.launch == "env") share_rngs(comm, sh); // every rank's engine is current in sh.rngs
          else comm.barrier();
          if (rank == 0) {
            checkpoint ck;
            put_run(ck, cfg, sh, *model, epoch + 1, step);
            if (mp) {
              auto mps = mp->master_params();
              for (std::size_t i = 0; i < mps.size(); ++i) ck.put("master." + std::to_string(i), mps[i]->value);
            }
            ck.put_optimizer("opt.", *opt);
            put_scaler(ck, scaler.scale(), scaler.clean_steps(), scaler.skipped());
            ck.save(cfg.checkpoint_path);
            std::printf("checkpoint: %s (epoch %lld)\n", cfg.checkpoint_path.c_str(), (long long)epoch + 1);
          }
          comm.barrier();
        }
      }
      if (rank == 0) std::cout << memory_pool::host().stats() << "\n";
    };
    if (cfg.launch == "env") {
      braid::communicator comm = braid::communicator_from_env();
      try {
        host_rank(comm);
      } catch (...) {
        comm.abort();
        throw;
      }
    } else {
      braid::run_threads(cfg.ranks, host_rank);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_fmnist: %s\n", e.what());
    rc = 1;
  }
  std::printf("curves: %s\n", cfg.csv.c_str());
  return rc;
}
