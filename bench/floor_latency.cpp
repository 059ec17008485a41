// braid-floor-latency: the per-call time of a tiny all_reduce on 2 thread ranks, to three decimals of a
// microsecond (braid-bench prints two, 10 ns, which is the size of the effects at the latency floor).
//   braid-floor-latency [bytes=4] [batches=20] [calls per batch=2000]
// Prints: bytes, then the fastest, median and slowest batch's time per call in µs (rank 0's clock;
// every batch starts after a barrier). bench/floor-pairs.sh builds it against several revisions and
// runs them in alternating passes.
#include <braid/braid.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const std::size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4;
  const int batches = argc > 2 ? std::atoi(argv[2]) : 20;
  const int calls = argc > 3 ? std::atoi(argv[3]) : 2000;
  const std::size_t count = bytes / sizeof(float) ? bytes / sizeof(float) : 1;
  if (batches < 1 || calls < 1) {
    std::fprintf(stderr, "usage: braid-floor-latency [bytes] [batches >= 1] [calls per batch >= 1]\n");
    return 2;
  }
  std::vector<double> us(static_cast<std::size_t>(batches));
  braid::run_threads(2, [&](braid::communicator& c) {
    std::vector<float> in(count, 1.0f), out(count);
    for (int i = 0; i < 200; ++i) c.all_reduce(in.data(), out.data(), count);
    for (int b = 0; b < batches; ++b) {
      c.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) c.all_reduce(in.data(), out.data(), count);
      const auto t1 = std::chrono::steady_clock::now();
      if (c.rank() == 0) us[static_cast<std::size_t>(b)] = std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
    }
  });
  std::sort(us.begin(), us.end());
  std::printf("%zu %.3f %.3f %.3f\n", count * sizeof(float), us.front(), us[us.size() / 2], us.back());
  return 0;
}
