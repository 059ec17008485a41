// braid/nn/pipeline.hpp — model parallelism: a sequential model cut into contiguous stages, one stage
// per rank of a braid::communicator, trained with GPipe's schedule (fill and drain) over send/recv.
//
// Stages. Every rank builds the whole model the same way (same seed) and keeps its own stage:
// take_stage(net, cuts, rank) moves children [cuts[rank-1], cuts[rank]) out of `net` (see
// sequential::extract). Stage 0's parameters are then the first ones net->parameters() listed, stage
// 1's the next, and so on, so a stage's weights compare directly with the unsplit model's.
//
// Schedule of pipeline<T>::train_step(x, labels), for one batch of B samples cut into M micro-batches
// of B/M (the first B % M get one more), on stage r of P:
//  1. fill: for i = 0 .. M-1: stage 0 slices micro-batch i from x, every other stage receives it from
//     r-1; the stage runs forward and sends the output to r+1; the last stage computes the softmax
//     cross-entropy of micro-batch i and keeps d(loss_i * n_i/B)/dlogits (n_i/B = 1/M when M divides
//     B), so that the gradients accumulated over the M micro-batches are the full batch's gradient of
//     its mean loss (gradient accumulation, as ddp's no_sync with ce.backward(1.0/M));
//  2. drain: for i = M-1 .. 0: the stage receives d(output_i) from r+1 (the last stage has its own),
//     runs backward, which ADDS into each parameter's .grad, and sends d(input_i) to r-1.
// Then the caller steps its optimizer on its own stage's parameters (zero_grad before the step, as
// usual: train_step does not zero anything).
//
// Layers keep the state of ONE forward for their backward, and M micro-batches are in flight between
// fill and drain. We re-materialise (GPipe's recomputation): a stage keeps only its INPUT of each
// micro-batch (M activations at the stage boundary), and before the backward of micro-batch i < M-1
// it runs forward(input_i) again; micro-batch M-1 needs no recomputation, since it was the stage's last
// forward. The price is up to M-1 extra forwards per stage and step. The recomputed forward is the
// same computation on the same input with the same weights (no step happens in between, and
// batchnorm in training mode normalises with the micro-batch's own statistics), so its caches are
// those the first forward made.
//
// BatchNorm running statistics: the fill phase updates them exactly as the unsplit model trained
// with gradient accumulation does (micro-batches 0 .. M-1, in that order, one update each). The
// recomputation would update them again, so train_step copies every buffer of the stage after the
// fill and writes the copies back after the drain: the running statistics after a step are those of
// the M fill forwards only, as in the unsplit reference.
//
// Gradients are accumulated in the order M-1 .. 0 (gradient accumulation's usual order is 0 .. M-1),
// so the float sums differ in rounding only; the first step's loss is the same bits. An unsplit model
// that takes the micro-batches in the order M-1 .. 0 ends with the pipeline's weights to the bit
// (tests/nn/test_pipeline.cpp).
//
// Messages. Activations travel as a header of 10 int64 (a magic word, train or eval, M, the
// micro-batch's index, the element type, the shape's rank and its 4 dimensions) and then the data;
// the receiver checks the header against its own call (same kind, M, index and type; on the last
// stage, the micro-batch's size against the labels' split) and raises mismatch_error otherwise.
// Gradients go back without a header: their size is that of the activation sent, and braid's
// send/recv size check raises mismatch_error on any difference. An error found on this rank (a header
// mismatch, or a layer refusing its input: a wrong split) is published on the communicator
// (communicator::publish_failure) before it is rethrown, so the other stages, blocked in send or recv,
// fail at once with peer_error or mismatch_error instead of waiting for the timeout. The communicator
// is then failed on every rank, as after any braid error.
//
// send is blocking and unbuffered (it returns after the receiver copied), and messages only go from r
// to r+1 (fill) and from r+1 to r (drain), each stage doing all its sends of a phase in order, so the
// schedule cannot deadlock: the last stage never waits, and each stage waits only for its successor
// in the drain and its predecessor in the fill.
//
// The loss (the full batch's mean, sum_i loss_i * n_i/B) and the number of correctly classified
// samples are broadcast from the last stage, so train_step returns the same value on every rank.
//
// Not done: CUDA ranks (the layers run on the CPU only); interleaving forward and backward (1F1B),
// which would bound the stored inputs by P instead of M; data parallelism across pipeline replicas.
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../braid.hpp"
#include "layers.hpp"
#include "loss.hpp"

namespace braid::nn {

// Stage `s` of `net` cut before the children indexed by `cuts` (strictly increasing, each in
// (0, net.size())): children [cuts[s-1], cuts[s]), with cuts[-1] = 0 and cuts[cuts.size()] =
// net.size(). Moves them out of `net` (what remains there is not a model any more). invalid_argument
// for bad cuts or s outside [0, cuts.size()].
template <class T>
std::unique_ptr<sequential<T>> take_stage(sequential<T>& net, const std::vector<std::size_t>& cuts, int s) {
  const std::size_t n = net.size();
  for (std::size_t i = 0; i < cuts.size(); ++i)
    detail::require(cuts[i] > 0 && cuts[i] < n && (i == 0 || cuts[i] > cuts[i - 1]),
                    "take_stage: cuts must increase strictly within (0, " + std::to_string(n) + ")");
  detail::require(s >= 0 && std::size_t(s) <= cuts.size(),
                  "take_stage: stage " + std::to_string(s) + " of " + std::to_string(cuts.size() + 1));
  const std::size_t lo = s == 0 ? 0 : cuts[std::size_t(s) - 1];
  const std::size_t hi = std::size_t(s) == cuts.size() ? n : cuts[std::size_t(s)];
  return net.extract(lo, hi);
}

// Micro-batch i of M of a batch of B samples: its first sample and its size (the first B % M
// micro-batches get one sample more). pipeline<T> cuts batches this way; a reference run with
// gradient accumulation (examples/resnet_pipeline --stages 1) uses the same cut.
inline std::pair<std::int64_t, std::int64_t> micro_batch_range(std::int64_t B, std::int64_t M, std::int64_t i) {
  const std::int64_t q = B / M, r = B % M;
  return {i * q + std::min<std::int64_t>(i, r), q + (i < r ? 1 : 0)};
}
// Micro-batch i of M of the batch x (first dimension: the samples), copied.
template <class T> tensor micro_batch(const tensor& x, std::int64_t M, std::int64_t i) {
  const std::int64_t B = x.dim(0);
  const auto [lo, n] = micro_batch_range(B, M, i);
  const std::int64_t per = x.numel() / B;
  const shape_t& xs = x.shape();
  const shape_t s = xs.rank() == 1 ? shape_t{n} : xs.rank() == 2 ? shape_t{n, xs[1]}
                  : xs.rank() == 3 ? shape_t{n, xs[1], xs[2]} : shape_t{n, xs[1], xs[2], xs[3]};
  tensor out(s, dtype_of_v<T>);
  std::memcpy(out.raw(), x.template data<T>() + lo * per, std::size_t(n * per) * sizeof(T));
  return out;
}

template <class T> class pipeline {
public:
  // `stage` is this rank's stage (rank r of the communicator runs stage r; the communicator's size is
  // the number of stages); `micro_batches` = M >= 1. Both must outlive the pipeline.
  pipeline(module<T>& stage, communicator& comm, int micro_batches)
      : stage_(stage), comm_(comm), m_(micro_batches), rank_(comm.rank()), size_(comm.size()) {
    detail::require(micro_batches >= 1, "pipeline: micro_batches must be >= 1");
  }
  pipeline(const pipeline&) = delete;
  pipeline& operator=(const pipeline&) = delete;

  bool first() const noexcept { return rank_ == 0; }
  bool last() const noexcept { return rank_ == size_ - 1; }
  int micro_batches() const noexcept { return m_; }

  // One batch through the pipeline, forward and backward (the schedule at the top of this file).
  // x: the batch [B, ...], read on stage 0 only (other ranks may pass an empty tensor); labels: its B
  // labels, read on the last stage only (others may pass {}). B >= M. Gradients are ADDED into the
  // stage's parameters' .grad. Returns the batch's mean loss on every rank; correct() then gives the
  // number of samples classified correctly.
  double train_step(const tensor& x, const std::vector<std::int32_t>& labels) {
    const int M = m_;
    std::vector<tensor> inputs(static_cast<std::size_t>(M)), dlogits;
    std::vector<shape_t> out_shapes(static_cast<std::size_t>(M));
    double stats[2] = {0, 0}; // loss, correct (meaningful on the last stage until the broadcast)
    std::int64_t B = 0;
    if (first()) {
      B = x.shape().rank() > 0 ? x.dim(0) : 0;
      local([&] { detail::require(B >= M, "pipeline: a batch of " + std::to_string(B) + " for " + std::to_string(M) + " micro-batches"); });
    }
    if (last()) {
      B = std::int64_t(labels.size());
      local([&] { detail::require(B >= M, "pipeline: " + std::to_string(B) + " labels for " + std::to_string(M) + " micro-batches"); });
      dlogits.resize(std::size_t(M));
    }
    // Fill.
    for (int i = 0; i < M; ++i) {
      tensor in = first() ? local([&] { return slice(x, i); }) : recv_activation(kind_train, i, B);
      inputs[std::size_t(i)] = in;
      tensor out = local([&] { return stage_.forward(in); });
      out_shapes[std::size_t(i)] = out.shape();
      if (last()) {
        local([&] {
          const auto [lo, n] = range(B, i);
          const std::vector<std::int32_t> y(labels.begin() + lo, labels.begin() + lo + n);
          const double w = double(n) / double(B);
          stats[0] += ce_.forward(out, y) * w;
          stats[1] += double(ce_.correct());
          dlogits[std::size_t(i)] = ce_.backward(w);
        });
      } else {
        send_activation(out, kind_train, i);
      }
    }
    // The recomputed forwards below would update the running statistics a second time.
    std::vector<tensor> saved;
    if (M > 1)
      for (tensor* b : stage_.buffers()) saved.push_back(b->clone());
    // Drain.
    for (int i = M - 1; i >= 0; --i) {
      const tensor& in = inputs[std::size_t(i)];
      if (i != M - 1) local([&] { (void)stage_.forward(in); }); // re-materialise micro-batch i's caches
      tensor dy;
      if (last()) {
        dy = dlogits[std::size_t(i)];
      } else {
        dy = tensor(out_shapes[std::size_t(i)], dtype_of_v<T>);
        comm_.recv(dy.template data<T>(), std::size_t(dy.numel()), rank_ + 1);
      }
      tensor dx = local([&] {
        tensor d = stage_.backward(dy);
        detail::require(d.shape() == in.shape(), "pipeline: stage " + std::to_string(rank_) + "'s input gradient " +
                                                      d.shape().str() + " for an input " + in.shape().str());
        return d;
      });
      inputs[std::size_t(i)] = tensor(); // no longer needed
      if (!first()) comm_.send(dx.template data<T>(), std::size_t(dx.numel()), rank_ - 1);
    }
    if (M > 1) {
      std::vector<tensor*> bufs = stage_.buffers();
      for (std::size_t j = 0; j < bufs.size(); ++j)
        if (bufs[j]->bytes()) std::memcpy(bufs[j]->raw(), saved[j].raw(), bufs[j]->bytes());
    }
    if (size_ > 1) comm_.broadcast(std::span<double>(stats, 2), size_ - 1);
    correct_ = std::int64_t(stats[1]);
    return stats[0];
  }

  // Forward only (evaluation; the caller sets each stage's training flag): x on stage 0 as in
  // train_step, no micro-batching. Returns the last stage's output there, and elsewhere an empty tensor
  // (shape of rank 0, no data).
  tensor forward(const tensor& x) {
    tensor in = first() ? x : recv_activation(kind_eval, 0, 0);
    tensor out = local([&] { return stage_.forward(in); });
    if (last()) return out;
    send_activation(out, kind_eval, 0);
    return tensor();
  }

  // Samples classified correctly in the last train_step (on every rank).
  std::int64_t correct() const noexcept { return correct_; }

private:
  static constexpr std::int64_t magic = 0x6272616964706970; // "braidpip"
  static constexpr std::int64_t kind_train = 1, kind_eval = 2;
  static constexpr int header_len = 10;

  std::pair<std::int64_t, std::int64_t> range(std::int64_t B, int i) const { return micro_batch_range(B, m_, i); }

  tensor slice(const tensor& x, int i) const {
    detail::require(x.type() == dtype_of_v<T>, "pipeline: the batch's element type is not the model's");
    return micro_batch<T>(x, m_, i);
  }

  void send_activation(const tensor& out, std::int64_t kind, int i) {
    const shape_t& s = out.shape();
    std::int64_t h[header_len] = {magic, kind, m_, i, std::int64_t(dtype_of_v<T>), s.rank(), 0, 0, 0, 0};
    for (int d = 0; d < s.rank(); ++d) h[6 + d] = s[d];
    comm_.send(h, header_len, rank_ + 1);
    comm_.send(out.template data<T>(), std::size_t(out.numel()), rank_ + 1);
  }

  // B > 0 (the last stage in train_step): the micro-batch's size must be range(B, i)'s.
  tensor recv_activation(std::int64_t kind, int i, std::int64_t B) {
    std::int64_t h[header_len];
    comm_.recv(h, header_len, rank_ - 1);
    tensor t = local([&] {
      const std::string from = "pipeline: stage " + std::to_string(rank_) + " expected ";
      auto fail = [&](const std::string& what) { raise(errc::mismatch, from + what); };
      if (h[0] != magic) fail("a pipeline activation header from stage " + std::to_string(rank_ - 1));
      if (h[1] != kind) fail(kind == kind_train ? "a train_step's activation, got a forward's" : "a forward's activation, got a train_step's");
      if (h[2] != m_) fail(std::to_string(m_) + " micro-batches, stage " + std::to_string(rank_ - 1) + " uses " + std::to_string(h[2]));
      if (h[3] != i) fail("micro-batch " + std::to_string(i) + ", got " + std::to_string(h[3]));
      if (h[4] != std::int64_t(dtype_of_v<T>)) fail("activations of the model's element type");
      if (h[5] < 1 || h[5] > shape_t::max_rank) fail("an activation of rank 1 to 4, got rank " + std::to_string(h[5]));
      for (int d = 0; d < h[5]; ++d)
        if (h[6 + d] < 0) fail("non-negative dimensions");
      shape_t s = h[5] == 1 ? shape_t{h[6]} : h[5] == 2 ? shape_t{h[6], h[7]} : h[5] == 3 ? shape_t{h[6], h[7], h[8]}
                                                                                     : shape_t{h[6], h[7], h[8], h[9]};
      if (B > 0 && s[0] != range(B, i).second)
        fail(std::to_string(range(B, i).second) + " samples in micro-batch " + std::to_string(i) + " of " +
             std::to_string(B) + " labels, got " + std::to_string(s[0]));
      return tensor(s, dtype_of_v<T>);
    });
    comm_.recv(t.template data<T>(), std::size_t(t.numel()), rank_ - 1);
    return t;
  }

  // Runs f (work on this rank, no communication); if it throws, publishes the failure on the
  // communicator so that the peers do not wait for this rank, and rethrows.
  template <class F> auto local(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const error& e) {
      publish(e.code() == errc::mismatch ? errc::mismatch : errc::peer_failed, e.what());
      throw;
    } catch (const std::exception& e) {
      publish(errc::peer_failed, e.what());
      throw;
    }
  }
  void publish(errc code, const std::string& what) noexcept {
    if (size_ == 1) return;
    try {
      comm_.publish_failure(code, "pipeline stage " + std::to_string(rank_) + ": " + what);
    } catch (...) { // the communicator already failed: the peers know
    }
  }

  nn::module<T>& stage_; // "nn::": a line that starts with "module" is a C++20 module directive to nvcc (#3189)
  communicator& comm_;
  int m_, rank_, size_;
  softmax_cross_entropy<T> ce_;
  std::int64_t correct_ = 0;
};

} // namespace braid::nn
