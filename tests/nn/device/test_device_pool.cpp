// tests/nn/device/test_device_pool.cpp — braid::nn::device_pool (include/braid/nn/device_pool.cuh) on
// the emulated CUDA device: same-stream reuse, the statistics over a sequence, record_stream (a block
// used by a stream whose work is still running is not handed out until that work is done), a block
// free on one stream not given to another while its free event is pending, refusals (double free,
// foreign pointers), release_cached, two threads at once, and the out-of-memory path (release the
// cache, retry once, raise).
//
// A stream is kept busy by hold(): a kernel, written in braid's kernel vocabulary, that waits for a
// host-set flag in pinned memory, with a deadline.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <braid/cuda/device/kernel.cuh>
#include <braid/cuda/runtime.cuh>
#include <braid/nn/device_pool.cuh>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;
using u64 = unsigned long long;
namespace gpu = braid::cuda::device;
using braid::nn::device_pool;
using braid::nn::pool_stats;

#define EMU_OK(expr) REQUIRE_EQ((expr), cudaSuccess)

constexpr u64 second = 1000000000ull;
constexpr std::size_t KiB = std::size_t(1) << 10, MiB = std::size_t(1) << 20, GiB = std::size_t(1) << 30;

// Thread 0 waits until *flag != 0 or timeout_ns have passed; then *result = 1 (released) or 2 (gave up).
BRAID_KERNEL void hold_kernel(unsigned* flag, u64 timeout_ns, unsigned* result) {
  if (gpu::thread_index() != 0 || gpu::block_index() != 0) return;
  const u64 t0 = gpu::clock_ns();
  unsigned r = 2;
  while (gpu::clock_ns() - t0 < timeout_ns) {
    if (gpu::atomic_ref<unsigned, gpu::scope::system>(*flag).load(gpu::memory_order::acquire) != 0) {
      r = 1;
      break;
    }
    gpu::sleep_ns(1000);
  }
  gpu::atomic_ref<unsigned, gpu::scope::system>(*result).store(r, gpu::memory_order::release);
}

// Keeps a stream busy until release().
struct hold {
  unsigned* words = nullptr; // [0] flag, [1] result: pinned host memory
  explicit hold(cudaStream_t s) {
    EMU_OK(cudaHostAlloc(reinterpret_cast<void**>(&words), 2 * sizeof(unsigned), cudaHostAllocMapped));
    words[0] = words[1] = 0;
    EMU_OK(gpu::launch(&hold_kernel, 1u, 32u, 0, s, words, 10 * second, words + 1));
  }
  ~hold() {
    release();
    (void)cudaDeviceSynchronize();
    (void)cudaFreeHost(words);
  }
  hold(const hold&) = delete;
  hold& operator=(const hold&) = delete;
  void release() { gpu::atomic_ref<unsigned, gpu::scope::system>(words[0]).store(1, gpu::memory_order::release); }
  unsigned result() const { return gpu::atomic_ref<unsigned, gpu::scope::system>(words[1]).load(gpu::memory_order::acquire); }
};

struct streams {
  cudaStream_t a = nullptr, b = nullptr, c = nullptr;
  streams() {
    EMU_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    EMU_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    EMU_OK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  }
  ~streams() {
    (void)cudaDeviceSynchronize();
    (void)cudaStreamDestroy(a);
    (void)cudaStreamDestroy(b);
    (void)cudaStreamDestroy(c);
  }
  streams(const streams&) = delete;
  streams& operator=(const streams&) = delete;
};

// What the emulated device has handed out to this process on device 0 (cudaMalloc'd bytes).
std::size_t device_bytes() { return braid::emu::detail::rt().memory().device_bytes(0); }

} // namespace

TEST_CASE("same-stream reuse: a cache hit with the same pointer, 256-byte aligned; 0 bytes is nullptr") {
  streams st;
  device_pool pool(0);
  CHECK(pool.allocate(0, st.a) == nullptr);
  CHECK(pool.stats().requests == 0);
  pool.deallocate(nullptr, st.a); // no-op

  void* p = pool.allocate(1000, st.a);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  EMU_OK(cudaMemsetAsync(p, 1, 1000, st.a)); // the block is device memory of at least its size class
  EMU_OK(cudaMemsetAsync(p, 2, 1024, st.a));
  pool.deallocate(p, st.a);
  void* q = pool.allocate(700, st.a); // the same class (1024 bytes), the same stream
  CHECK(q == p);
  const pool_stats s = pool.stats();
  CHECK(s.requests == 2);
  CHECK(s.hits == 1);
  CHECK(s.system_allocs == 1);
  void* r = pool.allocate(2000, st.a); // another class: a new block
  CHECK(r != p);
  CHECK(pool.stats().system_allocs == 2);
  pool.deallocate(q, st.a);
  pool.deallocate(r, st.a);
  EMU_OK(cudaStreamSynchronize(st.a));
}

TEST_CASE("stats: in_use, peak, cached, reserved, requests, hits, system_allocs over a sequence") {
  streams st;
  device_pool pool(0);
  CHECK(device_pool::size_class(100) == 256);
  CHECK(device_pool::size_class(3000) == 4096);
  CHECK(device_pool::size_class(4 * MiB) == 4 * MiB);
  CHECK(device_pool::size_class(5 * MiB + 1) == 6 * MiB);

  void* a = pool.allocate(100, st.a);         // 256
  void* b = pool.allocate(3000, st.a);        // 4096
  void* c = pool.allocate(5 * MiB + 1, st.a); // 6 MiB
  const std::size_t all = 256 + 4096 + 6 * MiB;
  pool_stats s = pool.stats();
  CHECK(s.in_use == all);
  CHECK(s.peak_in_use == all);
  CHECK(s.cached == 0);
  CHECK(s.reserved == all);
  CHECK(s.requests == 3);
  CHECK(s.hits == 0);
  CHECK(s.system_allocs == 3);

  pool.deallocate(b, st.a);
  s = pool.stats();
  CHECK(s.in_use == all - 4096);
  CHECK(s.peak_in_use == all);
  CHECK(s.cached == 4096);
  CHECK(s.reserved == all);

  void* b2 = pool.allocate(4096, st.a); // hit
  CHECK(b2 == b);
  pool.deallocate(c, st.a);
  pool.deallocate(a, st.a);
  s = pool.stats();
  CHECK(s.in_use == 4096);
  CHECK(s.cached == 256 + 6 * MiB);
  CHECK(s.reserved == all);
  CHECK(s.requests == 4);
  CHECK(s.hits == 1);
  CHECK(s.system_allocs == 3);

  pool.reset_peak();
  CHECK(pool.stats().peak_in_use == 4096);
  void* d = pool.allocate(8 * KiB, st.a); // a new class: a system allocation
  void* a2 = pool.allocate(1, st.a);      // 256: a hit
  CHECK(a2 == a);
  s = pool.stats();
  CHECK(s.in_use == 4096 + 8 * KiB + 256);
  CHECK(s.peak_in_use == 4096 + 8 * KiB + 256);
  CHECK(s.cached == 6 * MiB);
  CHECK(s.reserved == all + 8 * KiB);
  CHECK(s.requests == 6);
  CHECK(s.hits == 2);
  CHECK(s.system_allocs == 4);
  pool.deallocate(d, st.a);
  pool.deallocate(a2, st.a);
  pool.deallocate(b2, st.a);
  s = pool.stats();
  CHECK(s.in_use == 0);
  CHECK(s.peak_in_use == 4096 + 8 * KiB + 256);
  CHECK(s.cached == s.reserved);
  CHECK(s.reserved == all + 8 * KiB);
  EMU_OK(cudaDeviceSynchronize());
}

TEST_CASE("record_stream: a block used by a busy stream is not handed out until that work completes, then is") {
  streams st;
  device_pool pool(0);
  void* p = pool.allocate(4096, st.a);
  hold busy(st.b);
  pool.record_stream(p, st.b); // st.b's kernel "uses" p
  pool.record_stream(p, st.a); // its own stream: nothing
  pool.deallocate(p, st.a);
  EMU_OK(cudaStreamSynchronize(st.a)); // st.a itself is idle: only st.b's event holds p
  void* q = pool.allocate(4096, st.a);  // not p, though p is free on this very stream
  void* r = pool.allocate(4096, st.c);  // nor on another
  CHECK(q != p);
  CHECK(r != p);
  CHECK(pool.stats().cached == 4096); // p: cached, not available
  CHECK(pool.stats().hits == 0);
  CHECK(busy.result() == 0); // the kernel was still running throughout

  busy.release();
  EMU_OK(cudaStreamSynchronize(st.b));
  CHECK(busy.result() == 1);
  void* p2 = pool.allocate(4096, st.a); // st.b's event has completed: p is back on st.a
  CHECK(p2 == p);
  CHECK(pool.stats().hits == 1);
  CHECK(pool.stats().system_allocs == 3);

  // Then a free on st.a with no other user: another stream gets it once st.a is done with it.
  pool.deallocate(p2, st.a);
  EMU_OK(cudaStreamSynchronize(st.a));
  void* p3 = pool.allocate(4096, st.c);
  CHECK(p3 == p);
  CHECK(pool.stats().hits == 2);
  pool.deallocate(p3, st.c);
  pool.deallocate(q, st.a);
  pool.deallocate(r, st.c);
}

TEST_CASE("deallocate on another stream counts as a use on it: the block waits for that stream's work") {
  streams st;
  device_pool pool(0);
  void* p = pool.allocate(300, st.a);
  hold busy(st.b);
  pool.deallocate(p, st.b); // freed behind st.b's kernel
  void* q = pool.allocate(300, st.a);
  CHECK(q != p);
  busy.release();
  EMU_OK(cudaStreamSynchronize(st.b));
  CHECK(busy.result() == 1);
  void* p2 = pool.allocate(300, st.a);
  CHECK(p2 == p);
  pool.deallocate(p2, st.a);
  pool.deallocate(q, st.a);
}

TEST_CASE("a block free on stream A is not given to stream B while A's free event is pending") {
  streams st;
  device_pool pool(0);
  hold busy(st.a); // A is busy: the event recorded at the free is behind the kernel
  void* p = pool.allocate(64 * KiB, st.a);
  pool.deallocate(p, st.a);
  void* q = pool.allocate(64 * KiB, st.b); // B: not p
  CHECK(q != p);
  CHECK(pool.stats().hits == 0);
  CHECK(busy.result() == 0);
  busy.release();
  EMU_OK(cudaStreamSynchronize(st.a));
  CHECK(busy.result() == 1);
  void* r = pool.allocate(64 * KiB, st.b); // A's event has completed: p serves B now
  CHECK(r == p);
  CHECK(pool.stats().hits == 1);
  // p now belongs to B: freed there, it is B's to reuse at once.
  pool.deallocate(r, st.b);
  void* r2 = pool.allocate(64 * KiB, st.b);
  CHECK(r2 == p);
  pool.deallocate(r2, st.b);
  pool.deallocate(q, st.b);
  // A same-stream request on A is served at once even while A is busy (stream order covers it).
  hold busy2(st.a);
  void* s = pool.allocate(128 * KiB, st.a);
  pool.deallocate(s, st.a);
  CHECK(pool.allocate(128 * KiB, st.a) == s);
  CHECK(busy2.result() == 0);
  busy2.release();
  pool.deallocate(s, st.a);
}

TEST_CASE("refusals: a double free, a foreign pointer, an interior pointer: invalid_argument, nothing changed") {
  streams st;
  device_pool pool(0);
  void* p = pool.allocate(1024, st.a);
  void* keep = pool.allocate(1024, st.a);
  pool.deallocate(p, st.a);
  const pool_stats before = pool.stats();
  CHECK_THROWS_AS(pool.deallocate(p, st.a), braid::invalid_argument);
  CHECK_THROWS_WITH_AS(pool.deallocate(p, st.a), doctest::Contains("already free"), braid::invalid_argument);
  CHECK_THROWS_AS(pool.record_stream(p, st.b), braid::invalid_argument);

  void* foreign = nullptr;
  EMU_OK(cudaMalloc(&foreign, 1024));
  CHECK_THROWS_WITH_AS(pool.deallocate(foreign, st.a), doctest::Contains("not allocated by this pool"), braid::invalid_argument);
  CHECK_THROWS_AS(pool.deallocate(static_cast<char*>(keep) + 256, st.a), braid::invalid_argument);
  int on_stack = 0;
  CHECK_THROWS_AS(pool.deallocate(&on_stack, st.a), braid::invalid_argument);
  device_pool other(0);
  CHECK_THROWS_AS(other.deallocate(keep, st.a), braid::invalid_argument);
  EMU_OK(cudaFree(foreign));

  const pool_stats after = pool.stats();
  CHECK(after.in_use == before.in_use);
  CHECK(after.cached == before.cached);
  CHECK(after.reserved == before.reserved);
  // The pool still works: p comes back once, keep frees once.
  CHECK(pool.allocate(1024, st.a) == p);
  pool.deallocate(p, st.a);
  pool.deallocate(keep, st.a);
  CHECK_THROWS_AS(pool.deallocate(keep, st.a), braid::invalid_argument);
  CHECK_THROWS_AS(device_pool(99), braid::invalid_argument);
}

TEST_CASE("release_cached: cudaFree's the cache (cached == 0, reserved == in_use), waiting for pending work") {
  streams st;
  const std::size_t base = device_bytes();
  {
    device_pool pool(0);
    void* a = pool.allocate(1 * MiB, st.a);
    void* b = pool.allocate(2 * MiB, st.a);
    void* c = pool.allocate(8 * MiB, st.b);
    CHECK(device_bytes() == base + 11 * MiB);
    hold busy(st.c);
    pool.record_stream(b, st.c); // b: pending behind st.c's kernel
    pool.deallocate(b, st.a);
    pool.deallocate(c, st.b);
    CHECK(pool.stats().cached == 10 * MiB);
    // release_cached must wait for st.c's kernel before freeing b: let it go in 100 ms.
    std::thread releaser([&busy] {
      std::this_thread::sleep_for(100ms);
      busy.release();
    });
    pool.release_cached();
    CHECK(busy.result() == 1); // it waited for the kernel that used b
    releaser.join();
    pool_stats s = pool.stats();
    CHECK(s.cached == 0);
    CHECK(s.reserved == s.in_use);
    CHECK(s.in_use == 1 * MiB);
    CHECK(device_bytes() == base + 1 * MiB);
    // Allocating again goes to the system.
    void* d = pool.allocate(2 * MiB, st.a);
    CHECK(pool.stats().system_allocs == 4);
    pool.deallocate(d, st.a);
    pool.deallocate(a, st.a);
    CHECK(device_bytes() == base + 3 * MiB); // all cached
  }
  CHECK(device_bytes() == base); // the destructor freed the cache
}

TEST_CASE("destruction with a block in use: the block stays allocated (not freed), nothing crashes") {
  streams st;
  const std::size_t base = device_bytes();
  void* p = nullptr;
  {
    device_pool pool(0);
    p = pool.allocate(4096, st.a);
    pool.deallocate(pool.allocate(256, st.a), st.a);
  }
  CHECK(device_bytes() == base + 4096); // the cached 256 bytes were freed, p was not
  EMU_OK(cudaMemsetAsync(p, 0, 4096, st.a)); // still valid device memory
  EMU_OK(cudaStreamSynchronize(st.a));
  EMU_OK(cudaFree(p));
}

// A missing lock shows here under ThreadSanitizer (scripts/sanitize.sh tsan runs this test), seldom as
// wrong counts in a plain build.
TEST_CASE("threads: two threads allocating and freeing on their own streams keep the statistics exact") {
  streams st;
  device_pool pool(0);
  constexpr int rounds = 2000;
  auto work = [&pool](cudaStream_t s, std::size_t bytes) {
    for (int i = 0; i < rounds; ++i) {
      void* p = pool.allocate(bytes + std::size_t(i % 3) * 1024, s);
      void* q = pool.allocate(bytes, s);
      pool.deallocate(q, s);
      pool.deallocate(p, s);
    }
  };
  std::thread t1(work, st.a, 1000), t2(work, st.b, 3000);
  t1.join();
  t2.join();
  const pool_stats s = pool.stats();
  CHECK(s.in_use == 0);
  CHECK(s.requests == 4u * rounds);
  CHECK(s.hits + s.system_allocs == s.requests);
  CHECK(s.cached == s.reserved);
  // A handful of blocks per class (blocks of 4096 bytes may move between the streams, and a free event
  // not yet complete makes the other thread allocate); all else came from the cache.
  MESSAGE("system allocations: " << s.system_allocs);
  CHECK(s.system_allocs <= 32);
  CHECK(s.peak_in_use >= 1024 + 4096);
}

TEST_CASE("out of memory: the cache is released and the allocation retried once; then cuda_error with the stats") {
  // 16 GiB per emulated device, counted. The big blocks are never touched (BRAID_EMU_POISON=0, set in
  // main): they cost address space, not memory.
  REQUIRE_FALSE(braid::emu::detail::rt().poison());
  streams st;
  const std::size_t base = device_bytes();
  device_pool pool(0);
  void* big = pool.allocate(12 * GiB, st.a);
  pool.deallocate(big, st.a);
  CHECK(pool.stats().cached == 12 * GiB);
  void* other = pool.allocate(8 * GiB, st.a); // 20 GiB would not fit: the cache goes, the retry succeeds
  REQUIRE(other != nullptr);
  pool_stats s = pool.stats();
  CHECK(s.cached == 0);
  CHECK(s.reserved == 8 * GiB);
  CHECK(s.system_allocs == 2);
  CHECK(device_bytes() == base + 8 * GiB);

  void* small = pool.allocate(4096, st.a);
  pool.deallocate(small, st.a); // 4096 bytes cached
  bool raised = false;
  try {
    (void)pool.allocate(9 * GiB, st.a); // 8 + 9 > 16 even without the cache
  } catch (const braid::cuda_error& e) {
    raised = true;
    CHECK(e.code() == braid::errc::cuda);
    CHECK(e.sys_errno() == static_cast<int>(cudaErrorMemoryAllocation));
    CHECK(e.call() == "cudaMalloc");
    const std::string m = e.message();
    CHECK(m.find(std::to_string(9 * GiB) + " bytes asked") != std::string::npos);
    CHECK(m.find("out of memory on device 0") != std::string::npos);
    CHECK(m.find("pool: in use 8192 MiB") != std::string::npos);
    MESSAGE(e.what());
  }
  CHECK(raised);
  CHECK(cudaGetLastError() == cudaSuccess); // nothing left behind for an unrelated call
  s = pool.stats();
  CHECK(s.cached == 0); // released on the way
  CHECK(s.in_use == 8 * GiB);
  CHECK(s.reserved == 8 * GiB);
  CHECK(s.requests == 4);
  CHECK(s.system_allocs == 3);
  CHECK(device_bytes() == base + 8 * GiB);
  // A request no device could hold: the same error.
  CHECK_THROWS_AS((void)pool.allocate(~std::size_t(0) - 5, st.a), braid::cuda_error);
  pool.deallocate(other, st.a);
  pool.release_cached();
  CHECK(device_bytes() == base);
}

int main(int argc, char** argv) {
  // The out-of-memory case reserves 20 GiB of emulated device memory; unpoisoned it is never touched.
  ::setenv("BRAID_EMU_POISON", "0", 1);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

TEST_CASE("pool_buffer: a block of the pool, given back when its owner goes (also when moved from)") {
  streams st;
  device_pool pool(0);
  {
    braid::nn::pool_buffer<float> a(pool, 1000, st.a);
    CHECK(a.get() != nullptr);
    CHECK(pool.stats().in_use == device_pool::size_class(1000 * sizeof(float)));
    braid::nn::pool_buffer<float> b(std::move(a));
    CHECK(a.get() == nullptr);
    CHECK(b.get() != nullptr);
    braid::nn::pool_buffer<float> c;
    c = std::move(b);
    CHECK(pool.stats().in_use == device_pool::size_class(1000 * sizeof(float)));
  }
  CHECK(pool.stats().in_use == 0);
  CHECK(pool.stats().cached == device_pool::size_class(1000 * sizeof(float)));
}
