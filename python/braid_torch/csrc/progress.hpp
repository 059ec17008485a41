// braid_torch/csrc/progress.hpp — the progress thread: runs a group's (or a channel's) operations one
// at a time, in the order they were posted, on a thread of its own.
//
// A blocking call whose thread would otherwise only wait runs on the caller's thread instead, when
// nothing is queued or running (run_or_post): call order is kept, and a small synchronous call pays
// no thread hand-off.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace braid_torch {

class progress {
public:
  progress() : thread_([this] { loop(); }) {}
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  ~progress() { stop(); }

  void post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(m_);
      q_.push_back(std::move(f));
    }
    cv_.notify_all();
  }

  // Runs f here if the thread is idle with nothing queued; otherwise queues it. Returns whether it ran.
  bool run_or_post(std::function<void()> f) {
    {
      std::unique_lock<std::mutex> lk(m_);
      if (!q_.empty() || busy_) {
        q_.push_back(std::move(f));
        lk.unlock();
        cv_.notify_all();
        return false;
      }
      busy_ = true;
    }
    f(); // f does not throw: the tasks catch everything and finish their Work with it
    {
      std::lock_guard<std::mutex> lk(m_);
      busy_ = false;
    }
    cv_.notify_all();
    return true;
  }

  // Whether anything is queued or running.
  bool pending() {
    std::lock_guard<std::mutex> lk(m_);
    return busy_ || !q_.empty();
  }

  // Runs what is queued, then ends the thread. Idempotent.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

private:
  void loop() {
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return (!q_.empty() && !busy_) || (stopping_ && q_.empty() && !busy_); });
      if (q_.empty()) return; // stopping, and everything ran
      auto f = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      lk.unlock();
      f();
      lk.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool busy_ = false, stopping_ = false;
  std::thread thread_;
};

} // namespace braid_torch
