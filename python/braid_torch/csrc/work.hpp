// braid_torch/csrc/work.hpp — the Work a braid operation returns: completed by the progress thread,
// with a future (DDP's comm hooks chain on it) that completes with the operation's output tensors.
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace braid_torch {

class work final : public c10d::Work {
public:
  work(int rank, c10d::OpType type, std::string what, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), what_(std::move(what)), outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  // Called once, by the thread that ran the operation.
  void complete(std::exception_ptr error) {
    finish(error);
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(outputs_));
  }

  // Waits for completion; a finite timeout that passes raises DistBackendError naming the operation
  // (the operation itself goes on: its own deadline is the group's timeout).
  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lk(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lk, [&] { return completed_; });
    } else if (!cv_.wait_for(lk, timeout, [&] { return completed_; })) {
      C10_THROW_ERROR(DistBackendError, "braid: " + what_ + " did not complete within the " +
                                            std::to_string(timeout.count()) + " ms given to Work.wait()");
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  const std::string& what() const { return what_; }

private:
  std::string what_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

} // namespace braid_torch
