// bench/micro_reduce.cpp — braid-micro: the host reduction loop braid::reduce_n (core/reduce.hpp)
// against std::memcpy, the copy-bandwidth reference.
//
//   reduce_n/<type>/<inputs>in/<bytes>   sum of 2, 4 or 8 inputs of <bytes> each into one output
//   memcpy/<bytes>                       one copy of <bytes>
//
// bytes_per_second counts every byte read and written: (inputs + 1) * bytes for reduce_n, 2 * bytes
// for memcpy, so the two columns compare directly against the machine's memory bandwidth. Sizes run
// from 4 KiB (in L1) to 64 MiB per buffer (in DRAM). Inputs hold small values (no denormals, no
// overflow: the same bits every iteration); the output is rewritten, not accumulated.
#include <benchmark/benchmark.h>

#include <braid/core/ops.hpp>
#include <braid/core/reduce.hpp>
#include <braid/core/types.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace {

constexpr std::int64_t min_bytes = std::int64_t{4} << 10;
constexpr std::int64_t max_bytes = std::int64_t{64} << 20;

struct aligned_deleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using aligned_bytes = std::unique_ptr<std::byte, aligned_deleter>;

aligned_bytes allocate(std::size_t bytes) {
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  if (!p) throw std::bad_alloc();
  return aligned_bytes(p);
}

template <class T> void fill(T* p, std::size_t count, int input) {
  for (std::size_t i = 0; i < count; ++i)
    p[i] = static_cast<T>(static_cast<float>((i + static_cast<std::size_t>(input)) % 4));
}

template <class T> void reduce_bench(benchmark::State& state, int inputs) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / sizeof(T);
  std::vector<aligned_bytes> storage;
  std::vector<const T*> src;
  for (int s = 0; s < inputs; ++s) {
    storage.push_back(allocate(bytes));
    T* p = reinterpret_cast<T*>(storage.back().get());
    fill(p, count, s);
    src.push_back(p);
  }
  aligned_bytes out_storage = allocate(bytes);
  T* out = reinterpret_cast<T*>(out_storage.get());
  std::memset(out, 0, bytes);
  for (auto _ : state) {
    braid::reduce_n<T>(src.data(), inputs, out, nullptr, count, braid::sum<>{}, false, inputs);
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * (inputs + 1) *
                          static_cast<std::int64_t>(count * sizeof(T)));
}

void memcpy_bench(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  aligned_bytes a = allocate(bytes), b = allocate(bytes);
  std::memset(a.get(), 1, bytes);
  std::memset(b.get(), 0, bytes);
  for (auto _ : state) {
    std::memcpy(b.get(), a.get(), bytes);
    benchmark::DoNotOptimize(b.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 2 * static_cast<std::int64_t>(bytes));
}

template <class T> void register_type() {
  for (int inputs : {2, 4, 8}) {
    const std::string name = "reduce_n/" + std::string(braid::name(braid::dtype_of_v<T>)) + "/" +
                             std::to_string(inputs) + "in";
    benchmark::RegisterBenchmark(name.c_str(), [inputs](benchmark::State& s) { reduce_bench<T>(s, inputs); })
        ->RangeMultiplier(4)
        ->Range(min_bytes, max_bytes);
  }
}

} // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("memcpy", memcpy_bench)->RangeMultiplier(4)->Range(min_bytes, max_bytes);
  register_type<float>();
  register_type<braid::bfloat16>();
  register_type<braid::half>();
  register_type<braid::fp8_e4m3>();
  register_type<braid::fp8_e5m2>();
  register_type<double>();
  register_type<std::int32_t>();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
