// braid/nn/pipeline_device.cuh — model parallelism on CUDA ranks: nn::pipeline's GPipe schedule
// (pipeline.hpp: fill, drain, re-materialisation, BatchNorm statistics kept from the fill) with
// fused::resnet stages, one per rank of a braid::cuda::communicator, activations and gradients over
// its send/recv. Namespace braid::nn::fused. Its tests run on the emulated device; on a GPU, the
// pipeline trainer (resnet_pipeline_cuda, 2 stages on one H200) has run 2 steps under memcheck with no
// error (bench/results).
//
//   fused::resnet<float> stage(blocks, 10, 1, width, pool, stream, blas, first, last); // rank r's children
//   fused::pipeline<braid::cuda::communicator, float> pipe(stage, comm, micro_batches);
//   pipe.train_step(x_dev, labels_dev, B, h, w);   // x on stage 0, labels on the last stage
//   ... each stage steps its own optimizer over {stage.values(), stage.grads(), ...} ...
//
// Schedule of train_step on stage r of P, for a batch of B images cut into M micro-batches
// (micro_batch_range: the first B % M get one more):
//  1. fill, i = 0 .. M-1: stage 0 takes micro-batch i from x, every other stage receives it from r-1
//     into a buffer of its own (kept until the drain); forward; the last stage computes the loss of
//     micro-batch i (running sums: take_sums() there gives the batch's summed loss and right answers),
//     the others send the output to r+1;
//  2. drain, i = M-1 .. 0: forward(input_i) again unless i = M-1 (the layers keep one forward's state;
//     the recomputation is the same arithmetic on the same input and weights); the last stage
//     back-propagates d(loss_i * n_i/B)/dlogits, the others receive d(output_i) from r+1 and run
//     backward_from; every stage but 0 sends d(input_i) to r-1. Gradients are ADDED into grads().
// The running statistics are copied after the fill and written back after the drain, so a step
// leaves those of the M fill forwards (micro-batches in order 0 .. M-1), as nn::pipeline does.
//
// Everything is enqueued on the stage's stream: the host never waits for the device. send/recv
// meet on the host when both sides have enqueued (braid::cuda's rule), and each rank's host thread
// issues its sends and receives in the order above, so the schedule cannot deadlock: the same
// argument as nn::pipeline's (the last stage never waits in the fill; in the drain each stage waits
// only for its successor). The activation's shape is not sent: every stage computes it from B, h and
// w (resnet::input_shape), and a disagreement shows as send/recv's size mismatch (mismatch_error on
// both ranks). A stage that fails on its own (a refused shape) does not reach its peers: the caller
// aborts the communicator (braid::cuda::communicator::abort), as for any rank that stops calling.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../cuda/check.cuh"
#include "model_device.cuh"
#include "pipeline.hpp"

namespace braid::nn::fused {

template <class Comm, class T = float> class pipeline {
public:
  // `stage` is this rank's stage (rank r runs stage r; the communicator's size is the number of
  // stages; stage 0 starts at child 0 and the last stage ends with the classifier). Both must outlive
  // the pipeline.
  pipeline(resnet<T>& stage, Comm& comm, int micro_batches)
      : stage_(stage), comm_(comm), m_(micro_batches), rank_(comm.rank()), size_(comm.size()) {
    detail::require_shape(micro_batches >= 1, "pipeline: micro_batches must be >= 1");
    detail::require_shape(!first() || stage.first_child() == 0, "pipeline: stage 0 must start at child 0");
    detail::require_shape(!last() || stage.has_loss(), "pipeline: the last stage must end with the classifier");
    detail::require_shape(last() || !stage.has_loss(), "pipeline: only the last stage may hold the classifier");
  }
  pipeline(const pipeline&) = delete;
  pipeline& operator=(const pipeline&) = delete;
  ~pipeline() { release(); }

  bool first() const noexcept { return rank_ == 0; }
  bool last() const noexcept { return rank_ == size_ - 1; }
  int micro_batches() const noexcept { return m_; }

  // One batch of B images of h x w (every rank passes B, h, w): x [B, in_ch, h, w] in device memory
  // on stage 0 (ignored elsewhere), labels (B, device memory) on the last stage (ignored elsewhere).
  void train_step(const T* x, const std::int32_t* labels, std::int64_t B, std::int64_t h, std::int64_t w) {
    const int M = m_;
    detail::require_shape(B >= M && h > 0 && w > 0, "pipeline: a batch of at least micro_batches images");
    detail::require_shape((!first() || x != nullptr) && (!last() || labels != nullptr), "pipeline: a null batch or labels");
    const cudaStream_t s = stage_.stream();
    std::vector<const T*> in(static_cast<std::size_t>(M));
    inputs_.resize(static_cast<std::size_t>(M), {nullptr, 0});
    // Fill.
    for (int i = 0; i < M; ++i) {
      const auto [lo, n] = micro_batch_range(B, M, i);
      const shape_t is = stage_.input_shape(n, h, w);
      if (first()) in[std::size_t(i)] = x + lo * (is.numel() / n);
      else in[std::size_t(i)] = receive(inputs_[std::size_t(i)], is.numel(), s);
      const T* out = stage_.forward(in[std::size_t(i)], is);
      if (last()) stage_.loss(labels + lo);
      else comm_.send(out, std::size_t(stage_.output_shape().numel()), rank_ + 1, s);
    }
    // The recomputed forwards would update the running statistics again.
    const std::int64_t nb = stage_.buffer_size();
    if (M > 1 && nb > 0) {
      T* saved = grow(saved_, nb, s);
      BRAID_CUDA_CHECK(cudaMemcpyAsync(saved, stage_.buffers(), std::size_t(nb) * sizeof(T), cudaMemcpyDeviceToDevice, s));
    }
    // Drain.
    for (int i = M - 1; i >= 0; --i) {
      const auto [lo, n] = micro_batch_range(B, M, i);
      const shape_t is = stage_.input_shape(n, h, w);
      if (i != M - 1) {
        (void)stage_.forward(in[std::size_t(i)], is);
        if (last()) stage_.loss(labels + lo, false);
      }
      const T* dx;
      if (last()) {
        dx = stage_.backward(double(n) / double(B));
      } else {
        const std::int64_t k = stage_.output_shape().numel();
        dx = stage_.backward_from(receive(dy_, k, s, rank_ + 1));
      }
      if (!first()) comm_.send(dx, std::size_t(is.numel()), rank_ - 1, s);
    }
    if (M > 1 && nb > 0)
      BRAID_CUDA_CHECK(cudaMemcpyAsync(stage_.buffers(), saved_.first, std::size_t(nb) * sizeof(T), cudaMemcpyDeviceToDevice, s));
  }

  // Forward only (evaluation; set each stage's training flag first): n images of h x w, x on stage 0.
  // Returns the logits [n, classes] on the last stage (device memory, valid until its next forward;
  // loss() there adds the test loss to the running sums), nullptr elsewhere.
  const T* forward(const T* x, std::int64_t n, std::int64_t h, std::int64_t w) {
    detail::require_shape(n > 0 && h > 0 && w > 0 && (!first() || x != nullptr), "pipeline::forward: bad batch");
    const cudaStream_t s = stage_.stream();
    const shape_t is = stage_.input_shape(n, h, w);
    const T* in = first() ? x : receive(eval_, is.numel(), s);
    const T* out = stage_.forward(in, is);
    if (last()) return out;
    comm_.send(out, std::size_t(stage_.output_shape().numel()), rank_ + 1, s);
    return nullptr;
  }

private:
  using buffer = std::pair<T*, std::int64_t>; // from the stage's pool, with its capacity

  T* grow(buffer& b, std::int64_t n, cudaStream_t s) {
    if (n > b.second) {
      if (b.first) stage_.pool().deallocate(b.first, s);
      b.first = static_cast<T*>(stage_.pool().allocate(std::size_t(n) * sizeof(T), s));
      b.second = n;
    }
    return b.first;
  }
  // n elements from `from` (default: the previous stage) into b.
  const T* receive(buffer& b, std::int64_t n, cudaStream_t s, int from = -1) {
    T* p = grow(b, n, s);
    comm_.recv(p, std::size_t(n), from < 0 ? rank_ - 1 : from, s);
    return p;
  }
  void release() noexcept {
    auto give = [&](buffer& b) {
      if (!b.first) return;
      try {
        stage_.pool().deallocate(b.first, stage_.stream());
      } catch (...) { // an event that cannot be recorded: the block stays in use (the pool's rule)
      }
      b = {nullptr, 0};
    };
    for (buffer& b : inputs_) give(b);
    give(dy_);
    give(eval_);
    give(saved_);
  }

  resnet<T>& stage_;
  Comm& comm_;
  int m_, rank_, size_;
  std::vector<buffer> inputs_;
  buffer dy_{nullptr, 0}, eval_{nullptr, 0}, saved_{nullptr, 0};
};

} // namespace braid::nn::fused
