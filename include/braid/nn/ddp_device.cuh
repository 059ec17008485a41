// braid/nn/ddp_device.cuh — data-parallel gradient averaging on CUDA devices, overlapped with backward:
// gradient buckets in device memory, each averaged with braid's all_reduce(avg) on a communication
// stream as soon as backward has produced it, ordered by events, with no host synchronisation per
// bucket. fused::resnet (model_device.cuh) drives it: set_buckets() gives the bucket boundaries and
// on_bucket_ready() reports each bucket as backward finishes it. Namespace braid::nn::fused, with the fused optimizers (optim_device.cuh).
//
// bucket_reducer<Comm, T> works with any communicator whose all_reduce has braid::cuda's form
// all_reduce(in, out, count, op, stream): braid::cuda::communicator (ranks as GPUs of one process:
// each rank's reducer driven by its own host thread, or several ranks' calls bracketed by
// braid::cuda::group_scope) and braid::cuda::process_communicator (one process per GPU). Every rank
// builds its reducer over the same bucket boundaries.
//
// Per step, on each rank:
//   ready(b, compute)  when bucket b's gradients are final on the `compute` stream (backward's stream):
//                      records an event there; the communication stream waits for it and averages the
//                      bucket in place. Buckets are averaged in bucket order on every rank (a bucket
//                      marked ready early waits for the ones before it), so every rank issues the
//                      same collectives in the same order, whatever order backward finishes them in.
//   finish(compute)    after the last ready(): the compute stream waits for the last average (an
//                      event), so work enqueued after it (the optimizer step) sees averaged gradients.
//                      A bucket never marked ready makes finish() raise usage_error (errc::invalid_usage) and start the
//                      next step afresh; the averages of the buckets before it are enqueued already,
//                      so peers that did mark it wait in their all_reduce until the communicator's
//                      timeout, as for any collective one rank skips. The host never waits for the device.
//   no_sync            set_sync(false): ready() and finish() check the same things but enqueue nothing,
//                      so gradients accumulate locally (the layers add into them); the first synchronised
//                      step averages the sums.
//
// The compute stream may go on with the rest of backward at once: the averages run on the
// communication stream beside it. That they run beside it is up to the device's scheduler (CUDA does
// not promise that kernels of two streams run at the same time); nothing here waits for it, so the
// result and the absence of deadlock do not depend on it. Results are braid's all_reduce's: the same
// bits on every rank.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../cuda/check.cuh"
#include "../cuda/handles.cuh"
#include "../cuda/runtime.cuh"

namespace braid::nn::fused {

template <class Comm, class T = float> class bucket_reducer {
public:
  // grad: the flat gradient buffer (device memory of this rank's device); bucket_begin: where each
  // bucket starts, 0 first, ascending, each below n (bucket b is [bucket_begin[b], bucket_begin[b+1]
  // or n)); comm_stream: a stream of this rank's device for the averages.
  bucket_reducer(Comm& comm, T* grad, std::int64_t n, std::vector<std::int64_t> bucket_begin, cudaStream_t comm_stream)
      : comm_(comm), grad_(grad), n_(n), begin_(std::move(bucket_begin)), stream_(comm_stream) {
    if (n <= 0 || grad == nullptr) raise(errc::invalid_argument, "bucket_reducer: needs n > 0 and a gradient buffer");
    if (begin_.empty() || begin_.front() != 0)
      raise(errc::invalid_argument, "bucket_reducer: bucket boundaries must start with 0");
    for (std::size_t b = 1; b < begin_.size(); ++b)
      if (begin_[b] <= begin_[b - 1] || begin_[b] >= n)
        raise(errc::invalid_argument, "bucket_reducer: bucket " + std::to_string(b) + " starts at " + std::to_string(begin_[b]) +
                                          ": boundaries must ascend and lie below n = " + std::to_string(n));
    cuda::detail::device_guard guard(comm_.device());
    ready_events_.resize(begin_.size());
    for (cuda::detail::owned_event& e : ready_events_) BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&e.h, cudaEventDisableTiming));
    BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&done_.h, cudaEventDisableTiming));
    marked_.assign(begin_.size(), false);
  }
  bucket_reducer(const bucket_reducer&) = delete;
  bucket_reducer& operator=(const bucket_reducer&) = delete;

  std::size_t buckets() const noexcept { return begin_.size(); }
  std::int64_t bucket_size(std::size_t b) const {
    check_bucket(b);
    return (b + 1 < begin_.size() ? begin_[b + 1] : n_) - begin_[b];
  }
  // Bucket b's gradients are final on `compute`.
  void ready(std::size_t b, cudaStream_t compute) {
    check_bucket(b);
    if (marked_[b]) raise(errc::invalid_argument, "bucket_reducer: bucket " + std::to_string(b) + " marked ready twice in one step");
    marked_[b] = true;
    if (!sync_) { // no_sync: the same bookkeeping, nothing enqueued
      while (next_ < begin_.size() && marked_[next_]) ++next_;
      return;
    }
    cuda::detail::device_guard guard(comm_.device());
    BRAID_CUDA_CHECK(cudaEventRecord(ready_events_[b].h, compute));
    while (next_ < begin_.size() && marked_[next_]) {
      BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_events_[next_].h, 0));
      T* p = grad_ + begin_[next_];
      comm_.all_reduce(p, p, std::size_t(bucket_size(next_)), avg<>{}, stream_);
      ++launched_;
      ++next_;
    }
  }
  // After every bucket's ready(): `compute` waits for the averages.
  void finish(cudaStream_t compute) {
    if (next_ != begin_.size()) {
      const std::size_t missing = next_;
      reset_step();
      raise(errc::invalid_usage, "bucket_reducer::finish: bucket " + std::to_string(missing) +
                                     " was never marked ready this step (nothing of the step was averaged after it)");
    }
    if (sync_) {
      cuda::detail::device_guard guard(comm_.device());
      BRAID_CUDA_CHECK(cudaEventRecord(done_.h, stream_));
      BRAID_CUDA_CHECK(cudaStreamWaitEvent(compute, done_.h, 0));
    }
    reset_step();
  }
  // false: steps until set_sync(true) accumulate locally (DDP's no_sync).
  void set_sync(bool on) {
    if (std::find(marked_.begin(), marked_.end(), true) != marked_.end()) raise(errc::invalid_usage, "bucket_reducer::set_sync: not between steps");
    sync_ = on;
  }
  bool sync() const noexcept { return sync_; }
  // all_reduce calls enqueued since construction (one per bucket per synchronised step).
  std::uint64_t reductions() const noexcept { return launched_; }
  cudaStream_t stream() const noexcept { return stream_; }

private:
  void check_bucket(std::size_t b) const {
    if (b >= begin_.size())
      raise(errc::invalid_argument, "bucket_reducer: no bucket " + std::to_string(b) + " (there are " + std::to_string(begin_.size()) + ")");
  }
  void reset_step() {
    marked_.assign(begin_.size(), false);
    next_ = 0;
  }

  Comm& comm_;
  T* grad_;
  std::int64_t n_;
  std::vector<std::int64_t> begin_;
  cudaStream_t stream_;
  std::vector<cuda::detail::owned_event> ready_events_;
  cuda::detail::owned_event done_;
  std::vector<bool> marked_;
  std::size_t next_ = 0;
  bool sync_ = true;
  std::uint64_t launched_ = 0;
};

} // namespace braid::nn::fused
