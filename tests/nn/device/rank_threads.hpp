// tests/nn/device/rank_threads.hpp — ranks as threads of the test process (test_ddp_device.cpp,
// test_model_device.cpp, test_pipeline_device.cpp): each rank's work runs on its own thread, and
// what a rank raised fails the test case on the test's own thread, where doctest reports it.
#pragma once

#include <exception>
#include <thread>
#include <vector>

namespace rank_threads {

// Runs body(r) on its own thread for r = 0 .. n - 1 and joins them all; then rethrows the exception
// of the lowest rank that raised one. on_error(r) runs on rank r's thread right after it raised, for
// a test whose peers would otherwise wait for that rank forever (it aborts their communicators).
template <class F, class E> void run(int n, F body, E on_error) {
  std::vector<std::exception_ptr> err(static_cast<std::size_t>(n));
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r)
    t.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        err[static_cast<std::size_t>(r)] = std::current_exception();
        on_error(r);
      }
    });
  for (auto& x : t) x.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

template <class F> void run(int n, F body) {
  run(n, body, [](int) {});
}

} // namespace rank_threads
