// tests/emu/test_emu.cpp — the emulated CUDA device itself (include/braid/emu): the semantics braid
// relies on, and CUDA's refusals, checked with small kernels written in braid's kernel vocabulary.
//
// Cases that fork processes must run in a process that has not started the emulated runtime (as with
// CUDA, a child cannot use a runtime its parent started): CTest runs them on their own
// (test_emu_processes, "process" in their names); test_emu runs the others. CUDA_LAUNCH_BLOCKING=1 is
// read when the runtime starts: test_emu_launch_blocking runs the one case that needs it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <braid/cuda/device/signal.cuh>
#include <braid/cuda/device/kernel.cuh>
#include <braid/cuda/runtime.cuh>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <sys/mman.h>
#include <unistd.h>

namespace {

using namespace std::chrono_literals;
using u64 = unsigned long long;
namespace cd = braid::cuda::device;
namespace gpu = braid::cuda::device;

#define EMU_OK(expr) REQUIRE_EQ((expr), cudaSuccess)

// ---- kernels ------------------------------------------------------------------------------------

// Thread 0 of block 0 waits (bounded, with braid's wait_ge) until *word >= target, then adds 1 to *done.
BRAID_KERNEL void wait_kernel(u64* word, u64 target, cd::device_abort* ab, u64 timeout_ns, u64* done) {
  if (gpu::thread_index() == 0 && gpu::block_index() == 0) {
    if (cd::wait_ge(word, target, cd::abort_ref{ab, 1}, timeout_ns, 0, 1, 0)) cd::sys_u64(*done).fetch_add(1, gpu::memory_order::release);
  }
}

// wait_ge with an abort-flag interval: result[0] = 1 if the word arrived, 2 if the wait gave up; result[1]
// = how long the wait took, in ns (the device clock).
BRAID_KERNEL void wait_every_kernel(u64* word, u64 target, cd::device_abort* ab, u64 timeout_ns, u64 every_ns, u64* result) {
  if (gpu::thread_index() == 0 && gpu::block_index() == 0) {
    const u64 t0 = gpu::clock_ns();
    const bool ok = cd::wait_ge(word, target, cd::abort_ref{ab, 1}, timeout_ns, 0, 1, 0, every_ns);
    result[1] = gpu::clock_ns() - t0;
    cd::sys_u64(result[0]).store(ok ? 1 : 2, gpu::memory_order::release);
  }
}

// Raises *word to v (release).
BRAID_KERNEL void post_kernel(u64* word, u64 v) {
  if (gpu::thread_index() == 0 && gpu::block_index() == 0) cd::post_max_release(word, v);
}

// out[i] = out[i] * 2 + 1 over a grid-stride loop.
BRAID_KERNEL void twice_plus_one(u64* out, u64 n) {
  const u64 tid = static_cast<u64>(gpu::block_index()) * gpu::block_size() + gpu::thread_index();
  for (u64 i = tid; i < n; i += static_cast<u64>(gpu::grid_size()) * gpu::block_size()) out[i] = out[i] * 2 + 1;
}

// Every thread writes its coordinates; a block-shared sum through the barrier checks BRAID_SHARED.
BRAID_KERNEL void coordinates(unsigned* tids, unsigned* bids, unsigned* dims, unsigned* sums) {
  BRAID_SHARED unsigned acc;
  const unsigned t = gpu::thread_index(), b = gpu::block_index(), bd = gpu::block_size();
  const unsigned i = b * bd + t;
  tids[i] = t;
  bids[i] = b;
  dims[i] = bd * 1000 + gpu::grid_size();
  if (t == 0) acc = 0;
  gpu::sync_block();
  gpu::atomic_ref<unsigned, gpu::scope::device>(acc).fetch_add(t + 1, gpu::memory_order::relaxed);
  gpu::sync_block();
  if (t == 0) sums[b] = acc;
}

// Some threads leave early; the rest still pass the barrier (exited threads do not count).
BRAID_KERNEL void early_exit(unsigned* out) {
  const unsigned t = gpu::thread_index();
  if (t % 2 == 1) return;
  gpu::sync_block();
  out[t] = 1;
}

// A software grid barrier: thread 0 of each block arrives, then waits for all gridDim blocks; those
// that get through count themselves in *passed.
BRAID_KERNEL void grid_barrier(u64* counter, cd::device_abort* ab, u64 timeout_ns, u64* passed) {
  if (gpu::thread_index() == 0) {
    cd::sys_u64(*counter).fetch_add(1, gpu::memory_order::acq_rel);
    if (cd::wait_ge(counter, gpu::grid_size(), cd::abort_ref{ab, 1}, timeout_ns, static_cast<int>(gpu::block_index()), -1, 0))
      cd::sys_u64(*passed).fetch_add(1, gpu::memory_order::relaxed);
  }
  gpu::sync_block();
}

// Sets *running, then waits (bounded) for *word >= 1; counts success in *done.
BRAID_KERNEL void announce_and_wait(u64* running, u64* word, cd::device_abort* ab, u64 timeout_ns, u64* done) {
  if (gpu::thread_index() == 0 && gpu::block_index() == 0) {
    cd::post_max_release(running, 1);
    if (cd::wait_ge(word, 1, cd::abort_ref{ab, 1}, timeout_ns, 0, 1, 0)) cd::sys_u64(*done).fetch_add(1, gpu::memory_order::release);
  }
}

// ---- helpers -------------------------------------------------------------------------------------

struct abort_block {
  cd::device_abort* ab = nullptr;
  abort_block() {
    REQUIRE_EQ(cudaHostAlloc(reinterpret_cast<void**>(&ab), sizeof *ab, cudaHostAllocMapped | cudaHostAllocPortable), cudaSuccess);
    *ab = cd::device_abort{};
  }
  ~abort_block() { cudaFreeHost(ab); }
  bool timed_out() const {
    const cd::device_error* e = cd::abort_record(ab);
    return e && e->code == static_cast<unsigned>(braid::errc::timeout);
  }
};

template <class T> T* device_alloc(std::size_t n) {
  void* p = nullptr;
  REQUIRE_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  REQUIRE_EQ(cudaMemset(p, 0, n * sizeof(T)), cudaSuccess);
  REQUIRE_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return static_cast<T*>(p);
}

u64 read_u64(const u64* p) {
  u64 v = 0;
  REQUIRE_EQ(cudaMemcpy(&v, p, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

constexpr u64 second = 1000000000ull;

// A new stream that does not wait for the legacy default stream (nor it for this one).
cudaStream_t nonblocking_stream() {
  cudaStream_t s = nullptr;
  REQUIRE_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  return s;
}

} // namespace

TEST_CASE("coordinates, block-shared memory and the block barrier, for odd launch shapes") {
  for (const auto& [grid, block] : {std::pair<unsigned, unsigned>{1, 1}, {1, 3}, {5, 3}, {2, 1024}, {7, 33}}) {
    CAPTURE(grid);
    CAPTURE(block);
    const std::size_t n = std::size_t{grid} * block;
    auto* tids = device_alloc<unsigned>(n);
    auto* bids = device_alloc<unsigned>(n);
    auto* dims = device_alloc<unsigned>(n);
    auto* sums = device_alloc<unsigned>(grid);
    EMU_OK(gpu::launch(&coordinates, grid, block, 0, nullptr, tids, bids, dims, sums));
    EMU_OK(cudaDeviceSynchronize());
    std::vector<unsigned> t(n), b(n), d(n), s(grid);
    EMU_OK(cudaMemcpy(t.data(), tids, n * 4, cudaMemcpyDeviceToHost));
    EMU_OK(cudaMemcpy(b.data(), bids, n * 4, cudaMemcpyDeviceToHost));
    EMU_OK(cudaMemcpy(d.data(), dims, n * 4, cudaMemcpyDeviceToHost));
    EMU_OK(cudaMemcpy(s.data(), sums, grid * 4, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(t[i] == i % block);
      CHECK(b[i] == i / block);
      CHECK(d[i] == block * 1000 + grid);
    }
    for (unsigned k = 0; k < grid; ++k) CHECK(s[k] == block * (block + 1) / 2);
    for (void* p : {static_cast<void*>(tids), static_cast<void*>(bids), static_cast<void*>(dims), static_cast<void*>(sums)})
      EMU_OK(cudaFree(p));
  }
}

TEST_CASE("threads that exit do not hold up the barrier of the others") {
  auto* out = device_alloc<unsigned>(64);
  EMU_OK(gpu::launch(&early_exit, 1, 64, 0, nullptr, out));
  EMU_OK(cudaDeviceSynchronize());
  std::vector<unsigned> h(64);
  EMU_OK(cudaMemcpy(h.data(), out, sizeof(unsigned) * 64, cudaMemcpyDeviceToHost));
  for (unsigned t = 0; t < 64; ++t) CHECK(h[t] == (t % 2 == 0 ? 1u : 0u));
  EMU_OK(cudaFree(out));
}

TEST_CASE("a stream runs its work in order; kernels of two streams run side by side") {
  const u64 n = 10000;
  auto* a = device_alloc<u64>(n);
  cudaStream_t s1 = nonblocking_stream(), s2 = nonblocking_stream();
  for (int i = 0; i < 5; ++i) EMU_OK(gpu::launch(&twice_plus_one, 3u, 64u, 0, s1, a, n)); // x -> 2x+1, five times: 31
  EMU_OK(cudaStreamSynchronize(s1));
  std::vector<u64> h(n);
  EMU_OK(cudaMemcpy(h.data(), a, n * sizeof(u64), cudaMemcpyDeviceToHost));
  for (u64 v : h) REQUIRE(v == 31);
  // Concurrency: a kernel on s1 waits for a word that a kernel enqueued later on s2 posts.
  abort_block ab;
  auto* word = device_alloc<u64>(2);
  EMU_OK(gpu::launch(&wait_kernel, 1u, 32u, 0, s1, word, u64{7}, ab.ab, 10 * second, word + 1));
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, s2, word, u64{7}));
  EMU_OK(cudaStreamSynchronize(s1));
  CHECK(read_u64(word + 1) == 1);
  CHECK_FALSE(ab.timed_out());
  EMU_OK(cudaStreamDestroy(s1));
  EMU_OK(cudaStreamDestroy(s2));
  EMU_OK(cudaFree(a));
  EMU_OK(cudaFree(word));
}

namespace {
// A blocking and a non-blocking stream, words to wait on and post to, and an abort record.
struct two_streams {
  abort_block ab;
  u64* word = device_alloc<u64>(4);
  cudaStream_t blocking = nullptr, nonblocking = nullptr;
  two_streams() {
    REQUIRE_EQ(cudaStreamCreate(&blocking), cudaSuccess);
    REQUIRE_EQ(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking), cudaSuccess);
  }
  ~two_streams() {
    CHECK(cudaStreamDestroy(blocking) == cudaSuccess);
    CHECK(cudaStreamDestroy(nonblocking) == cudaSuccess);
    CHECK(cudaFree(word) == cudaSuccess);
  }
};
} // namespace

TEST_CASE("the legacy default stream orders blocking streams, not non-blocking ones") {
  two_streams x;
  auto& [ab, word, blocking, nonblocking] = x;
  // The legacy stream's kernel waits for word[0] >= 1 (posted by the host later).
  EMU_OK(gpu::launch(&wait_kernel, 1u, 32u, 0, nullptr, word, u64{1}, ab.ab, 20 * second, word + 1));
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, blocking, word + 2, u64{5}));    // after the legacy kernel
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, nonblocking, word + 3, u64{5})); // not ordered
  EMU_OK(cudaStreamSynchronize(nonblocking));
  std::this_thread::sleep_for(50ms);
  CHECK(cudaStreamQuery(blocking) == cudaErrorNotReady);
  CHECK(cudaStreamQuery(nullptr) == cudaErrorNotReady);
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, nonblocking, word, u64{1})); // releases the legacy kernel
  EMU_OK(cudaStreamSynchronize(blocking));
  CHECK(read_u64(word + 1) == 1);
  CHECK(read_u64(word + 2) == 5);
  CHECK(read_u64(word + 3) == 5);
}

TEST_CASE("the legacy default stream waits for blocking streams' earlier work") {
  two_streams x;
  auto& [ab, word, blocking, nonblocking] = x;
  EMU_OK(gpu::launch(&wait_kernel, 1u, 32u, 0, blocking, word, u64{1}, ab.ab, 20 * second, word + 1));
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, nullptr, word + 2, u64{5})); // legacy: after the blocking kernel
  std::this_thread::sleep_for(50ms);
  CHECK(cudaStreamQuery(nullptr) == cudaErrorNotReady);
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, nonblocking, word, u64{1}));
  EMU_OK(cudaStreamSynchronize(nullptr));
  CHECK(read_u64(word + 1) == 1);
  CHECK(read_u64(word + 2) == 5);
}

TEST_CASE("a destroyed stream's work still runs, and device synchronisation waits for it") {
  abort_block ab;
  auto* word = device_alloc<u64>(2);
  cudaStream_t s = nonblocking_stream(), other = nonblocking_stream();
  EMU_OK(gpu::launch(&wait_kernel, 1u, 32u, 0, s, word, u64{1}, ab.ab, 20 * second, word + 1));
  EMU_OK(cudaStreamDestroy(s)); // returns at once; the kernel is still waiting
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, other, word, u64{1}));
  EMU_OK(cudaDeviceSynchronize());
  CHECK(read_u64(word + 1) == 1); // the destroyed stream's kernel finished before the synchronisation returned
  EMU_OK(cudaStreamDestroy(other));
  EMU_OK(cudaFree(word));
}

TEST_CASE("a kernel launched into another device's stream is refused") {
  EMU_OK(cudaSetDevice(1));
  cudaStream_t s1 = nonblocking_stream(); // on device 1
  EMU_OK(cudaSetDevice(0));
  CHECK(gpu::launch(&post_kernel, 1u, 32u, 0, s1, static_cast<u64*>(nullptr), u64{1}) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  EMU_OK(cudaStreamDestroy(s1));
}

TEST_CASE("events: record, query, synchronize, a stream waiting for another stream's event") {
  abort_block ab;
  auto* word = device_alloc<u64>(4);
  cudaStream_t s1 = nonblocking_stream(), s2 = nonblocking_stream();
  cudaEvent_t e = nullptr;
  EMU_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CHECK(cudaEventQuery(e) == cudaSuccess); // never recorded: complete
  EMU_OK(gpu::launch(&wait_kernel, 1u, 32u, 0, s1, word, u64{1}, ab.ab, 20 * second, word + 1));
  EMU_OK(cudaEventRecord(e, s1));
  EMU_OK(cudaStreamWaitEvent(s2, e, 0));
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, s2, word + 2, u64{9})); // after s1's kernel
  std::this_thread::sleep_for(50ms);
  CHECK(cudaEventQuery(e) == cudaErrorNotReady);
  CHECK(cudaStreamQuery(s2) == cudaErrorNotReady);
  cudaStream_t s3 = nonblocking_stream();
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, s3, word, u64{1}));
  EMU_OK(cudaEventSynchronize(e));
  EMU_OK(cudaStreamSynchronize(s2));
  CHECK(read_u64(word + 2) == 9);
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e, e) == cudaErrorInvalidResourceHandle); // timing disabled
  EMU_OK(cudaEventDestroy(e));
  CHECK(cudaEventDestroy(e) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventRecord(e, s1) == cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  for (cudaStream_t s : {s1, s2, s3}) EMU_OK(cudaStreamDestroy(s));
  CHECK(cudaStreamSynchronize(s1) == cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  EMU_OK(cudaFree(word));
}

namespace hostfn {
struct probe {
  u64* word = nullptr;
  u64 seen = 0;          // *word when the host function ran
  std::atomic<int> runs{0};
};
void run(void* p) {
  auto* x = static_cast<probe*>(p);
  x->seen = *x->word; // emulated device memory is host memory; CUDA forbids runtime calls here
  x->runs.fetch_add(1);
}
} // namespace hostfn

TEST_CASE("cudaLaunchHostFunc: runs after the stream's earlier work, and the later work waits for it") {
  abort_block ab;
  auto* word = device_alloc<u64>(4);
  cudaStream_t s1 = nonblocking_stream(), s2 = nonblocking_stream();
  hostfn::probe pr;
  pr.word = word + 2;
  // s1: wait for word[0] (posted from s2 later), write word[2] = 5, the host function, write word[2] = 7.
  EMU_OK(gpu::launch(&wait_kernel, 1u, 32u, 0, s1, word, u64{1}, ab.ab, 20 * second, word + 1));
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, s1, word + 2, u64{5}));
  EMU_OK(cudaLaunchHostFunc(s1, &hostfn::run, &pr));
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, s1, word + 2, u64{7}));
  std::this_thread::sleep_for(30ms);
  CHECK(pr.runs.load() == 0); // the kernel before it still waits
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, s2, word, u64{1}));
  EMU_OK(cudaStreamSynchronize(s1));
  CHECK(pr.runs.load() == 1);
  CHECK(pr.seen == 5);
  CHECK(read_u64(word + 2) == 7);
  CHECK(cudaLaunchHostFunc(s1, nullptr, nullptr) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  // Captured into a graph: the capture does not run it; each replay does, in the replay's order.
  EMU_OK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, s1, word + 2, u64{11}));
  EMU_OK(cudaLaunchHostFunc(s1, &hostfn::run, &pr));
  cudaGraph_t g = nullptr;
  EMU_OK(cudaStreamEndCapture(s1, &g));
  CHECK(pr.runs.load() == 1);
  cudaGraphExec_t x = nullptr;
  EMU_OK(cudaGraphInstantiate(&x, g, 0));
  for (int i = 0; i < 2; ++i) EMU_OK(cudaGraphLaunch(x, s1));
  EMU_OK(cudaStreamSynchronize(s1));
  CHECK(pr.runs.load() == 3);
  CHECK(pr.seen == 11);
  EMU_OK(cudaGraphExecDestroy(x));
  EMU_OK(cudaGraphDestroy(g));
  for (cudaStream_t s : {s1, s2}) EMU_OK(cudaStreamDestroy(s));
  EMU_OK(cudaFree(word));
}

TEST_CASE("stream capture: kernels and copies replay in order; synchronising calls invalidate the capture") {
  const u64 n = 1000;
  auto* a = device_alloc<u64>(n);
  auto* b = device_alloc<u64>(n);
  cudaStream_t s = nonblocking_stream();
  EMU_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaStreamCaptureStatus st{};
  EMU_OK(cudaStreamIsCapturing(s, &st));
  CHECK(st == cudaStreamCaptureStatusActive);
  EMU_OK(gpu::launch(&twice_plus_one, 2u, 32u, 0, s, a, n));
  EMU_OK(cudaMemcpyAsync(b, a, n * sizeof(u64), cudaMemcpyDeviceToDevice, s));
  EMU_OK(gpu::launch(&twice_plus_one, 2u, 32u, 0, s, b, n));
  // A device-wide synchronisation by the capturing thread is refused, and breaks the capture.
  CHECK(cudaDeviceSynchronize() == cudaErrorStreamCaptureUnsupported);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated); // the device sync broke it
  CHECK(g == nullptr);
  (void)cudaGetLastError();
  CHECK(read_u64(a) == 0);
  // Again, properly.
  EMU_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EMU_OK(gpu::launch(&twice_plus_one, 2u, 32u, 0, s, a, n));
  EMU_OK(cudaMemcpyAsync(b, a, n * sizeof(u64), cudaMemcpyDeviceToDevice, s));
  EMU_OK(gpu::launch(&twice_plus_one, 2u, 32u, 0, s, b, n));
  EMU_OK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t x = nullptr;
  EMU_OK(cudaGraphInstantiate(&x, g, 0));
  CHECK(read_u64(a) == 0);
  u64 av = 0;
  for (int rep = 0; rep < 3; ++rep) {
    EMU_OK(cudaGraphLaunch(x, s));
    av = av * 2 + 1;
    EMU_OK(cudaStreamSynchronize(s));
    CHECK(read_u64(a + n - 1) == av);
    CHECK(read_u64(b + n - 1) == av * 2 + 1);
  }
  EMU_OK(cudaGraphExecDestroy(x));
  EMU_OK(cudaGraphDestroy(g));
  CHECK(cudaGraphDestroy(g) == cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  // Allocating during a global capture is refused and breaks the capture.
  EMU_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  void* tmp = nullptr;
  CHECK(cudaMalloc(&tmp, 64) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  // A synchronisation of the capturing stream itself is refused, and so is capturing the legacy stream.
  EMU_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  (void)cudaGetLastError();
  EMU_OK(cudaStreamDestroy(s));
  EMU_OK(cudaFree(a));
  EMU_OK(cudaFree(b));
}

TEST_CASE("bad input: ranges outside allocations, stale handles, bad launch shapes are refused with CUDA's codes") {
  auto* a = static_cast<unsigned char*>(nullptr);
  EMU_OK(cudaMalloc(&a, 1000));
  std::vector<unsigned char> h(4096);
  CHECK(cudaMemcpy(a, h.data(), 1001, cudaMemcpyHostToDevice) == cudaErrorInvalidValue); // one byte past the end
  CHECK(cudaMemcpy(h.data(), a + 500, 600, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(h.data(), h.data() + 8, 8, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue); // not device memory
  CHECK(cudaMemsetAsync(a + 999, 0, 2, nullptr) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess); // read and cleared
  CHECK(cudaFree(a + 1) == cudaErrorInvalidValue);
  CHECK(gpu::launch(&twice_plus_one, 0u, 32u, 0, nullptr, static_cast<u64*>(nullptr), u64{0}) == cudaErrorInvalidConfiguration);
  CHECK(gpu::launch(&twice_plus_one, 1u, 1025u, 0, nullptr, static_cast<u64*>(nullptr), u64{0}) == cudaErrorInvalidConfiguration);
  CHECK(cudaSetDevice(99) == cudaErrorInvalidDevice);
  int ok = -1;
  EMU_OK(cudaDeviceCanAccessPeer(&ok, 0, 0));
  CHECK(ok == 0);
  EMU_OK(cudaDeviceCanAccessPeer(&ok, 0, 1));
  CHECK(ok == 1);
  CHECK(cudaDeviceEnablePeerAccess(0, 0) == cudaErrorInvalidDevice); // itself
  EMU_OK(cudaDeviceEnablePeerAccess(1, 0));
  CHECK(cudaDeviceEnablePeerAccess(1, 0) == cudaErrorPeerAccessAlreadyEnabled);
  (void)cudaGetLastError();
  // Memory attributes and the driver's address range.
  cudaPointerAttributes at{};
  EMU_OK(cudaPointerGetAttributes(&at, a + 10));
  CHECK(at.type == cudaMemoryTypeDevice);
  CHECK(at.device == 0);
  EMU_OK(cudaPointerGetAttributes(&at, h.data()));
  CHECK(at.type == cudaMemoryTypeUnregistered);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  EMU_OK(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q));
  REQUIRE(q == cudaDriverEntryPointSuccess);
  unsigned long long base = 0;
  std::size_t size = 0;
  CHECK(reinterpret_cast<int (*)(unsigned long long*, std::size_t*, unsigned long long)>(fn)(
            &base, &size, reinterpret_cast<unsigned long long>(a + 700)) == 0);
  CHECK(base == reinterpret_cast<unsigned long long>(a));
  CHECK(size == 1000);
  EMU_OK(cudaGetDriverEntryPointByVersion("cuNotAFunction", &fn, 12000, cudaEnableDefault, &q));
  CHECK(q == cudaDriverEntryPointSymbolNotFound);
  // IPC: refused for managed memory and inside the exporting process.
  void* m = nullptr;
  EMU_OK(cudaMallocManaged(&m, 4096));
  cudaIpcMemHandle_t hd{};
  CHECK(cudaIpcGetMemHandle(&hd, m) == cudaErrorInvalidValue);
  EMU_OK(cudaIpcGetMemHandle(&hd, a));
  void* opened = nullptr;
  CHECK(cudaIpcOpenMemHandle(&opened, hd, cudaIpcMemLazyEnablePeerAccess) == cudaErrorDeviceUninitialized);
  cudaIpcMemHandle_t junk{};
  std::memset(junk.reserved, 0x5a, sizeof junk.reserved);
  CHECK(cudaIpcOpenMemHandle(&opened, junk, cudaIpcMemLazyEnablePeerAccess) == cudaErrorInvalidValue);
  CHECK(cudaIpcCloseMemHandle(a) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  EMU_OK(cudaFree(m));
  EMU_OK(cudaFree(a));
  // Use after free: a stale pointer is no longer an allocation.
  CHECK(cudaMemset(a, 0, 1) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST_CASE("a grid larger than the device holds, whose blocks wait for each other, times out with braid's error") {
  // Each block's thread 0 arrives on a counter, then waits (braid's bounded wait_ge) until every block
  // of the grid has arrived: a software grid barrier, which completes only if all blocks are resident
  // at once. The occupancy query says how many fit.
  cudaDeviceProp p{};
  EMU_OK(cudaGetDeviceProperties(&p, 0));
  // 16-thread blocks: fits x 16 emulated threads stays within what ThreadSanitizer can track.
  const unsigned threads = 16;
  int per_sm = 0;
  EMU_OK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, &grid_barrier, threads, 0));
  REQUIRE(per_sm > 0);
  const unsigned fits = static_cast<unsigned>(per_sm * p.multiProcessorCount);
  for (const unsigned grid : {fits, fits + 1}) {
    CAPTURE(grid);
    abort_block ab;
    auto* counter = device_alloc<u64>(2);
    const auto t0 = std::chrono::steady_clock::now();
    // When every block fits, the barrier completes as soon as all have started (a generous deadline
    // for a slow machine); when one does not fit, the others must give up at the deadline.
    const u64 deadline = grid == fits ? 60 * second : second;
    EMU_OK(gpu::launch(&grid_barrier, grid, threads, 0, nullptr, counter, ab.ab, deadline, counter + 1));
    EMU_OK(cudaDeviceSynchronize());
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const u64 passed = read_u64(counter + 1);
    MESSAGE(grid << " blocks (" << fits << " fit at once): " << passed << " passed the barrier, " << took << " s");
    if (grid == fits) {
      CHECK(passed == grid);
      CHECK_FALSE(ab.timed_out());
    } else {
      CHECK(ab.timed_out()); // the resident blocks gave up at the deadline
      CHECK(passed < grid);
      CHECK(took >= 1.0);
    }
    EMU_OK(cudaFree(counter));
  }
}

// The group's error record: one slot per writer kind (the host, each GPU), so no claim word is ever
// contended by two devices (atomics on host-mapped memory are not atomic across devices over PCIe).
TEST_CASE("the error record keeps one complete entry per GPU and one for the host; the host's is reported first") {
  abort_block b;
  CHECK_FALSE(cd::abort_raised(b.ab));
  CHECK(cd::abort_record(b.ab) == nullptr);
  const auto timeout = static_cast<unsigned>(braid::errc::timeout), aborted = static_cast<unsigned>(braid::errc::aborted);
  cd::record_failure(cd::abort_ref{b.ab, 2}, cd::device_error{timeout, 3, 1, 7, 5, {}});
  cd::record_failure(cd::abort_ref{b.ab, 2}, cd::device_error{timeout, 4, 0, 9, 6, {}}); // same GPU, later: kept out
  CHECK(cd::abort_raised(b.ab));
  const cd::device_error* e = cd::abort_record(b.ab);
  REQUIRE(e != nullptr);
  CHECK(e->rank == 3);
  CHECK(e->peer == 1);
  CHECK(e->step == 7);
  cd::record_failure(cd::abort_ref{b.ab, 1}, cd::device_error{timeout, 0, 3, 2, 8, {}}); // another GPU: its own slot
  CHECK(b.ab->slot[1].e.rank == 0);
  CHECK(b.ab->slot[2].e.rank == 3);
  cd::record_failure(cd::abort_ref{b.ab, cd::abort_host_slot}, cd::device_error{aborted, 5, -1, -1, 0, {}});
  e = cd::abort_record(b.ab);
  REQUIRE(e != nullptr);
  CHECK(e->code == aborted);
  CHECK(e->rank == 5);
}

TEST_CASE("wait_ge reads the abort flag once per abort_every_ns of a wait, not in waits that end sooner") {
  // The flag is up before any wait starts. With an interval of 1 s a wait does not see it for 1 s: a
  // post that comes sooner ends the wait normally, and a word that never comes ends it at the first
  // read after 1 s. With interval 0 (a read every 64 polls) the wait gives up at once.
  abort_block ab;
  cd::sys_u32(ab.ab->flag).store(1u, gpu::memory_order::release);
  auto* word = device_alloc<u64>(1);
  auto* result = device_alloc<u64>(2);
  cudaStream_t s1 = nonblocking_stream(), s2 = nonblocking_stream();
  // The word comes after 0.1 s: the wait passes.
  EMU_OK(gpu::launch(&wait_every_kernel, 1u, 32u, 0, s1, word, u64{1}, ab.ab, 20 * second, second, result));
  std::this_thread::sleep_for(100ms);
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, s2, word, u64{1}));
  EMU_OK(cudaDeviceSynchronize());
  CHECK(read_u64(result) == 1);
  // The word never comes: the wait gives up at its first read of the flag, after 1 s, not before.
  EMU_OK(gpu::launch(&wait_every_kernel, 1u, 32u, 0, s1, word, u64{2}, ab.ab, 20 * second, second, result));
  EMU_OK(cudaDeviceSynchronize());
  CHECK(read_u64(result) == 2);
  const u64 waited = read_u64(result + 1);
  MESSAGE("interval 1 s: the wait saw the raised flag after " << static_cast<double>(waited) / 1e9 << " s");
  CHECK(waited >= second);
  CHECK(waited < 10 * second);
  // Interval 0: the first check (64 polls) sees it.
  EMU_OK(gpu::launch(&wait_every_kernel, 1u, 32u, 0, s1, word, u64{2}, ab.ab, 20 * second, u64{0}, result));
  EMU_OK(cudaDeviceSynchronize());
  CHECK(read_u64(result) == 2);
  MESSAGE("interval 0: the wait saw the raised flag after " << static_cast<double>(read_u64(result + 1)) / 1e9 << " s");
  CHECK(read_u64(result + 1) < second / 2);
  CHECK_FALSE(ab.timed_out());
  EMU_OK(cudaStreamDestroy(s1));
  EMU_OK(cudaStreamDestroy(s2));
  EMU_OK(cudaFree(word));
  EMU_OK(cudaFree(result));
}

TEST_CASE("CUDA_LAUNCH_BLOCKING=1 serialises launches: a kernel waiting for a later launch times out") {
  const char* lb = std::getenv("CUDA_LAUNCH_BLOCKING");
  const bool blocking = lb && lb[0] == '1';
  abort_block ab;
  auto* word = device_alloc<u64>(2);
  cudaStream_t s1 = nonblocking_stream(), s2 = nonblocking_stream();
  const auto t0 = std::chrono::steady_clock::now();
  EMU_OK(gpu::launch(&wait_kernel, 1u, 32u, 0, s1, word, u64{1}, ab.ab, second / 2, word + 1));
  const double launch_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EMU_OK(gpu::launch(&post_kernel, 1u, 32u, 0, s2, word, u64{1}));
  EMU_OK(cudaDeviceSynchronize());
  MESSAGE(std::string(blocking ? "CUDA_LAUNCH_BLOCKING=1" : "CUDA_LAUNCH_BLOCKING unset") << ": the first launch returned after " << launch_s << " s");
  if (blocking) {
    CHECK(launch_s >= 0.5);
    CHECK(ab.timed_out());
    CHECK(read_u64(word + 1) == 0);
  } else {
    CHECK(launch_s < 0.5);
    CHECK_FALSE(ab.timed_out());
    CHECK(read_u64(word + 1) == 1);
  }
  EMU_OK(cudaStreamDestroy(s1));
  EMU_OK(cudaStreamDestroy(s2));
  EMU_OK(cudaFree(word));
}

// ---- processes (run by test_emu_processes, in a process that never starts the runtime itself) -----

namespace {

// Runs body() in a forked child; returns its exit status (or 128 + signal).
template <class F> int in_child(F body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = 99;
    try {
      rc = body();
    } catch (...) {
      rc = 98;
    }
    std::fflush(stdout);
    ::_exit(rc);
  }
  return pid;
}
int wait_child(int pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
struct channel { // a pipe for small messages between forked processes
  int fd[2] = {-1, -1};
  channel() { REQUIRE(::pipe(fd) == 0); }
  ~channel() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  template <class T> void send(const T& v) { (void)!::write(fd[1], &v, sizeof v); }
  template <class T> T recv() {
    T v{};
    std::size_t got = 0;
    while (got < sizeof v) {
      const ssize_t k = ::read(fd[0], reinterpret_cast<char*>(&v) + got, sizeof v - got);
      if (k <= 0) break;
      got += static_cast<std::size_t>(k);
    }
    return v;
  }
};
#define CHILD_CHECK(cond, code) \
  do {                            \
    if (!(cond)) {                \
      std::printf("child: %s failed\n", #cond); \
      return code;                \
    }                             \
  } while (0)

// In a child: 4096 bytes of device memory at p, their IPC handle sent on `to`. 0, or the code of the
// CHILD_CHECK that failed.
int export_block(void*& p, channel& to) {
  CHILD_CHECK(cudaMalloc(&p, 4096) == cudaSuccess, 10);
  cudaIpcMemHandle_t h{};
  CHILD_CHECK(cudaIpcGetMemHandle(&h, p) == cudaSuccess, 11);
  to.send(h);
  return 0;
}

} // namespace

TEST_CASE("cudaHostRegister: the caller's memory, mapped for kernels at its own address; CUDA's errors for misuse") {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(m != MAP_FAILED);
  auto* words = static_cast<u64*>(m);
  for (int i = 0; i < 64; ++i) words[i] = static_cast<u64>(i);
  REQUIRE_EQ(cudaHostRegister(m, page, cudaHostRegisterMapped | cudaHostRegisterPortable), cudaSuccess);
  void* d = nullptr;
  REQUIRE_EQ(cudaHostGetDevicePointer(&d, m, 0), cudaSuccess);
  CHECK(d == m);
  cudaPointerAttributes at{};
  REQUIRE_EQ(cudaPointerGetAttributes(&at, words + 3), cudaSuccess);
  CHECK(at.type == cudaMemoryTypeHost);
  CHECK(at.devicePointer == words + 3);
  REQUIRE_EQ(gpu::launch(&twice_plus_one, 2u, 32u, 0, nullptr, static_cast<u64*>(d), u64{64}), cudaSuccess);
  REQUIRE_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int i = 0; i < 64; ++i) CHECK(words[i] == static_cast<u64>(2 * i + 1));
  // Overlapping a registration, freeing it as if allocated, unregistering what is not registered.
  CHECK(cudaHostRegister(static_cast<char*>(m) + 64, 64, cudaHostRegisterMapped) == cudaErrorHostMemoryAlreadyRegistered);
  CHECK(cudaFreeHost(m) == cudaErrorInvalidValue);
  CHECK(cudaHostRegister(m, page, 0x80) == cudaErrorInvalidValue);
  CHECK(cudaHostUnregister(static_cast<char*>(m) + page) == cudaErrorHostMemoryNotRegistered);
  REQUIRE_EQ(cudaHostUnregister(m), cudaSuccess);
  CHECK(cudaHostUnregister(m) == cudaErrorHostMemoryNotRegistered);
  // Unregistering leaves the caller's pages alone.
  CHECK(words[5] == 11);
  (void)cudaGetLastError();
  ::munmap(m, 2 * page);
}

TEST_CASE("process: CUDA IPC between two real processes: open, reference counts, writes seen by the exporter") {
  channel to_importer, to_exporter;
  const int exporter = in_child([&] {
    void* p = nullptr;
    CHILD_CHECK(cudaMalloc(&p, 4096) == cudaSuccess, 10);
    CHILD_CHECK(cudaMemset(p, 0x11, 4096) == cudaSuccess, 11);
    CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess, 12);
    cudaIpcMemHandle_t h{};
    CHILD_CHECK(cudaIpcGetMemHandle(&h, static_cast<char*>(p) + 100) == cudaSuccess, 13); // any pointer into it
    to_importer.send(h);
    CHILD_CHECK(to_exporter.recv<int>() == 1, 14);
    unsigned char b[4096];
    CHILD_CHECK(cudaMemcpy(b, p, 4096, cudaMemcpyDeviceToHost) == cudaSuccess, 15);
    for (unsigned char v : b) CHILD_CHECK(v == 0x22, 16);
    CHILD_CHECK(cudaFree(p) == cudaSuccess, 17);
    return 0;
  });
  const int importer = in_child([&] {
    const cudaIpcMemHandle_t h = to_importer.recv<cudaIpcMemHandle_t>();
    CHILD_CHECK(cudaSetDevice(1) == cudaSuccess, 20);
    void* p = nullptr;
    CHILD_CHECK(cudaIpcOpenMemHandle(&p, h, 0) == cudaErrorInvalidValue, 21); // the flag CUDA requires
    CHILD_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess, 22);
    cudaPointerAttributes at{};
    CHILD_CHECK(cudaPointerGetAttributes(&at, p) == cudaSuccess && at.type == cudaMemoryTypeDevice && at.device == 0, 23);
    unsigned char b[4096];
    CHILD_CHECK(cudaMemcpy(b, p, 4096, cudaMemcpyDeviceToHost) == cudaSuccess, 24);
    for (unsigned char v : b) CHILD_CHECK(v == 0x11, 25);
    void* again = nullptr;
    CHILD_CHECK(cudaIpcOpenMemHandle(&again, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess && again == p, 26);
    CHILD_CHECK(cudaSetDevice(0) == cudaSuccess, 27);
    void* other = nullptr;
    CHILD_CHECK(cudaIpcOpenMemHandle(&other, h, cudaIpcMemLazyEnablePeerAccess) == cudaErrorInvalidValue, 28); // second context
    CHILD_CHECK(cudaMemset(p, 0x22, 4096) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, 29);
    CHILD_CHECK(cudaMemcpy(b, static_cast<char*>(p) + 4000, 97, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue, 30);
    CHILD_CHECK(cudaIpcCloseMemHandle(p) == cudaSuccess, 31);
    CHILD_CHECK(cudaIpcCloseMemHandle(p) == cudaSuccess, 32);
    CHILD_CHECK(cudaIpcCloseMemHandle(p) == cudaErrorInvalidValue, 33); // opened twice, closed twice: gone
    to_exporter.send(1);
    return 0;
  });
  CHECK(wait_child(importer) == 0);
  CHECK(wait_child(exporter) == 0);
}

TEST_CASE("process: memory its exporter freed faults in the process that still maps it") {
  channel to_importer, to_exporter;
  const int exporter = in_child([&] {
    void* p = nullptr;
    if (const int failed = export_block(p, to_importer)) return failed;
    CHILD_CHECK(to_exporter.recv<int>() == 1, 12); // the importer has it mapped
    CHILD_CHECK(cudaFree(p) == cudaSuccess, 13);   // freed first: undefined in CUDA, a fault here
    to_importer.send(cudaIpcMemHandle_t{});
    return 0;
  });
  const int importer = in_child([&] {
    const cudaIpcMemHandle_t h = to_importer.recv<cudaIpcMemHandle_t>();
    void* p = nullptr;
    CHILD_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess, 20);
    volatile unsigned char* b = static_cast<unsigned char*>(p);
    b[0] = 1; // fine while the exporter holds it
    to_exporter.send(1);
    (void)to_importer.recv<cudaIpcMemHandle_t>();
    struct sigaction sa{};
    sa.sa_handler = [](int) { ::_exit(42); }; // the expected fault (sanitizers would report it otherwise)
    ::sigaction(SIGBUS, &sa, nullptr);
    b[0] = 2; // the exporter freed it: SIGBUS
    return 0;
  });
  CHECK(wait_child(exporter) == 0);
  CHECK(wait_child(importer) == 42); // died at the access, by SIGBUS
}

TEST_CASE("process: a handle whose exporter has exited cannot be opened") {
  channel ch;
  const int exporter = in_child([&] {
    void* p = nullptr;
    return export_block(p, ch);
  });
  REQUIRE(wait_child(exporter) == 0);
  const int importer = in_child([&] {
    const cudaIpcMemHandle_t h = ch.recv<cudaIpcMemHandle_t>();
    void* p = nullptr;
    CHILD_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) == cudaErrorMapBufferObjectFailed, 20);
    return 0;
  });
  CHECK(wait_child(importer) == 0);
}

TEST_CASE("process: kernels of two processes never share a device; on different devices they run together") {
  // Process B owns a word and a flag (device memory it exports); process A's kernel announces that it
  // runs, then waits (1 s deadline) for B's kernel to post the word. On one device, B's kernel cannot
  // start while A's runs: A times out. On two devices, B's kernel runs at once: A succeeds.
  for (const int b_device : {0, 1}) {
    CAPTURE(b_device);
    channel to_a, to_b;
    const int a = in_child([&] {
      const cudaIpcMemHandle_t h = to_a.recv<cudaIpcMemHandle_t>();
      void* mem = nullptr;
      CHILD_CHECK(cudaIpcOpenMemHandle(&mem, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess, 10);
      auto* w = static_cast<u64*>(mem);
      abort_block ab;
      u64* done = nullptr;
      CHILD_CHECK(cudaMalloc(&done, sizeof(u64)) == cudaSuccess && cudaMemset(done, 0, 8) == cudaSuccess, 11);
      CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess, 12);
      CHILD_CHECK(gpu::launch(&announce_and_wait, 1u, 32u, 0, nullptr, w + 1, w, ab.ab, second, done) == cudaSuccess, 13);
      CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess, 14);
      u64 ok = 0;
      CHILD_CHECK(cudaMemcpy(&ok, done, 8, cudaMemcpyDeviceToHost) == cudaSuccess, 15);
      to_b.send(1);
      CHILD_CHECK(cudaIpcCloseMemHandle(mem) == cudaSuccess, 16);
      std::printf("process A: %s\n", ok ? "B's kernel ran beside A's" : "A's kernel timed out (B's could not run)");
      return ok ? 1 : (ab.timed_out() ? 2 : 3);
    });
    const int b = in_child([&] {
      CHILD_CHECK(cudaSetDevice(b_device) == cudaSuccess, 20);
      u64* w = nullptr;
      CHILD_CHECK(cudaMalloc(&w, 2 * sizeof(u64)) == cudaSuccess && cudaMemset(w, 0, 16) == cudaSuccess, 21);
      CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess, 22);
      cudaIpcMemHandle_t h{};
      CHILD_CHECK(cudaIpcGetMemHandle(&h, w) == cudaSuccess, 23);
      to_a.send(h);
      for (u64 running = 0; running == 0;) // A's kernel is running once it announced itself
        CHILD_CHECK(cudaMemcpy(&running, w + 1, 8, cudaMemcpyDeviceToHost) == cudaSuccess, 24);
      CHILD_CHECK(gpu::launch(&post_kernel, 1u, 32u, 0, nullptr, w, u64{1}) == cudaSuccess, 25);
      CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess, 26);
      (void)to_b.recv<int>(); // A has closed its mapping: now the memory may go
      CHILD_CHECK(cudaFree(w) == cudaSuccess, 27);
      return 0;
    });
    const int sa = wait_child(a), sb = wait_child(b);
    CHECK(sb == 0);
    CHECK(sa == (b_device == 0 ? 2 : 1));
  }
}

TEST_CASE("process: a child cannot use the runtime its parent started (cudaErrorInitializationError)") {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 64) == cudaSuccess); // this process starts its runtime now
  const int child = in_child([] {
    void* q = nullptr;
    return cudaMalloc(&q, 64) == cudaErrorInitializationError ? 0 : 1;
  });
  CHECK(wait_child(child) == 0);
  CHECK(cudaFree(p) == cudaSuccess);
}
