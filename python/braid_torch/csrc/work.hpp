// braid_torch/csrc/work.hpp — the Work a braid operation returns: completed by the thread that ran the
// operation, with a future (DDP's comm hooks chain on it) that completes with its output tensors.
//
// For CUDA tensors the future is CUDA-aware (it knows the device, and settles on the stream the
// result is on), as ProcessGroupNCCL's is: callbacks chained on it see the result.
//
// The future is made only when asked for (a synchronous call never asks), and the operation's name
// is spelled out only for a message: a small call pays for neither.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace braid_torch {

class work final : public c10d::Work {
public:
  // describe() names the operation in messages: "all_reduce (call 7 of this group, rank 1)".
  // stream: where the outputs are complete (CUDA tensors), nullopt for CPU tensors.
  work(int rank, c10d::OpType type, std::function<std::string()> describe, std::vector<at::Tensor> outputs,
       std::optional<c10::Stream> stream = std::nullopt)
      : c10d::Work(rank, type), describe_(std::move(describe)), outputs_(std::move(outputs)), stream_(stream) {}

  // Called once, by the thread that ran the operation.
  void complete(std::exception_ptr error) {
    c10::intrusive_ptr<c10::ivalue::Future> f;
    {
      std::lock_guard<std::mutex> lk(mutex_);
      completed_ = true;
      exception_ = error;
      f = future_;
    }
    cv_.notify_all();
    if (f) settle(*f);
  }

  // Waits for completion; a finite timeout that passes raises DistBackendError naming the operation
  // (the operation itself goes on: its own deadline is the group's timeout).
  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lk(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lk, [&] { return completed_; });
    } else if (!cv_.wait_for(lk, timeout, [&] { return completed_; })) {
      C10_THROW_ERROR(DistBackendError, "braid: " + describe_() + " did not complete within the " +
                                            std::to_string(timeout.count()) + " ms given to Work.wait()");
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    c10::intrusive_ptr<c10::ivalue::Future> f;
    bool done = false;
    {
      std::lock_guard<std::mutex> lk(mutex_);
      if (!future_) {
        std::vector<c10::Device> devices;
        if (stream_) devices.push_back(stream_->device());
        future_ = c10::make_intrusive<c10::ivalue::Future>(tensor_list_type(), devices);
      }
      f = future_;
      done = completed_;
    }
    if (done && !f->completed()) settle(*f);
    return f;
  }
  std::string what() const { return describe_(); }
  // The rank a receive from any source got its message from (-1 until known, and for other operations).
  int sourceRank() const override { return source_.load(); }
  void set_source(int r) { source_.store(r); }

private:
  static const c10::TypePtr& tensor_list_type() {
    static const c10::TypePtr t = c10::ListType::create(c10::TensorType::get());
    return t;
  }
  // Completes the future once (complete() and getFuture() may race to it: the second finds it done).
  void settle(c10::ivalue::Future& f) {
    std::lock_guard<std::mutex> lk(settle_m_);
    if (f.completed()) return;
    c10::OptionalStreamGuard on(stream_); // a CUDA-aware future records its events on the current stream
    if (exception_) f.setError(exception_);
    else f.markCompleted(c10::IValue(outputs_));
  }

  std::function<std::string()> describe_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex settle_m_;
  std::atomic<int> source_{-1};
  std::optional<c10::Stream> stream_;
};

} // namespace braid_torch
