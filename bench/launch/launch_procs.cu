// bench/launch/launch_procs.cu — braid::cuda::process_communicator behind launch_procs.hpp's plain
// functions: every collective for the 14 element types with sum, float with the other operators. The
// typed calls are in launch_procs_narrow.cu and launch_procs_wide.cu (procs.cuh).
#include "procs.cuh"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace braid::gpu_procs {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::shared_ptr<comm> connect(braid::communicator host, int device, const comm_options& o) {
  braid::cuda::process_options po;
  if (o.staging_bytes) po.staging_bytes = o.staging_bytes;
  if (o.copy_engine_min_bytes != std::size_t(-1)) po.copy_engine_min_bytes = o.copy_engine_min_bytes;
  if (o.timeout.count() > 0) po.base.with_timeout(o.timeout);
  if (o.reduce_blocks > 0) po.reduce_blocks = o.reduce_blocks;
  if (o.threads > 0) po.threads = o.threads;
  po.path = static_cast<braid::cuda::process_path>(o.path);
  if (o.spin_us >= 0) po.spin = std::chrono::microseconds(o.spin_us);
  auto c = std::make_shared<comm>();
  c->pc = braid::cuda::process_communicator(std::move(host), device, po);
  BRAID_CUDA_CHECK(cudaSetDevice(c->pc.device()));
  BRAID_CUDA_CHECK(cudaStreamCreate(&c->stream)); // blocking: ordered after legacy-stream copies
  return c;
}

void run(comm& c, const gpu_launch::call& k) {
  enqueue(c, k);
  if (c.pc.path() == braid::cuda::process_path::device) finish(c);
}

namespace {
void sleep_ms(void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::intptr_t>(p))); }
} // namespace
void hold_stream(comm& c, int ms) {
  BRAID_CUDA_CHECK(cudaLaunchHostFunc(c.stream, &sleep_ms, reinterpret_cast<void*>(static_cast<std::intptr_t>(ms))));
}

bool stream_busy(comm& c) {
  const cudaError_t e = cudaStreamQuery(c.stream);
  if (e == cudaErrorNotReady) return true;
  BRAID_CUDA_CHECK(e);
  return false;
}
void finish(comm& c) {
  BRAID_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  c.pc.check();
}
int path_of(const comm& c) { return c.pc.path() == braid::cuda::process_path::device ? 2 : 1; }
std::string describe(const comm& c) { return c.pc.describe(); }

struct graph {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
};
void* capture(comm& c, const gpu_launch::call& k) {
  auto gr = std::make_unique<graph>();
  BRAID_CUDA_CHECK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeGlobal));
  try {
    enqueue(c, k);
  } catch (...) {
    cudaStreamEndCapture(c.stream, &gr->g);
    if (gr->g) cudaGraphDestroy(gr->g);
    throw;
  }
  BRAID_CUDA_CHECK(cudaStreamEndCapture(c.stream, &gr->g));
  BRAID_CUDA_CHECK(cudaGraphInstantiate(&gr->exec, gr->g, 0));
  return gr.release();
}
void replay(comm& c, void* g) { BRAID_CUDA_CHECK(cudaGraphLaunch(static_cast<graph*>(g)->exec, c.stream)); }
void destroy_graph(void* g) noexcept {
  auto* gr = static_cast<graph*>(g);
  if (!gr) return;
  if (gr->exec) cudaGraphExecDestroy(gr->exec);
  if (gr->g) cudaGraphDestroy(gr->g);
  delete gr;
}

void enqueue(comm& c, const gpu_launch::call& k) {
  if (detail::enqueue_narrow(c, k) || detail::enqueue_wide(c, k)) return;
  raise(errc::unsupported, std::string("the GPU process test does not instantiate ") + std::string(name(k.coll)) + " for " +
                               std::string(name(k.type)) + " with " + std::string(name(k.op)));
}

int register_memory(comm& c, void* p, std::size_t bytes) { return c.pc.register_memory(p, bytes); }
void deregister_memory(comm& c, int id) { c.pc.deregister_memory(id); }
void barrier(comm& c) { c.pc.barrier(c.stream); }
void abort(comm& c) { c.pc.abort(); }
std::size_t memory_bytes(const comm& c) { return c.pc.memory_bytes(); }
std::size_t open_handles(const comm& c) { return c.pc.open_handles(); }
int device_of(const comm& c) { return c.pc.device(); }
int multiprocessors(const comm& c) {
  int sms = 0;
  BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c.pc.device()));
  return sms;
}
stats stats_of(const comm& c) {
  const auto& s = c.pc.stats();
  return {s.calls,      s.rounds,       s.staged_bytes, s.copy_engine_bytes, s.direct_read_bytes,
          s.host_syncs, s.staged_ahead, s.reduce_grid,  s.blocking_waits};
}

void* dev_alloc(std::size_t bytes) {
  void* p = nullptr;
  BRAID_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}
void dev_free(void* p) noexcept { cudaFree(p); }
void* dev_alloc_managed(std::size_t bytes) {
  void* p = nullptr;
  BRAID_CUDA_CHECK(cudaMallocManaged(&p, bytes));
  return p;
}
void set_device(int d) { BRAID_CUDA_CHECK(cudaSetDevice(d)); }
// Synchronised, so that a peer process reading the memory next sees the bytes (a pageable cudaMemcpy
// may return before its DMA ends; cudaMemset is asynchronous).
void to_device(void* dst, const void* src, std::size_t bytes) {
  BRAID_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  BRAID_CUDA_CHECK(cudaDeviceSynchronize());
}
void to_host(void* dst, const void* src, std::size_t bytes) { BRAID_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost)); }
void dev_fill(void* dst, unsigned char byte, std::size_t bytes) {
  BRAID_CUDA_CHECK(cudaMemset(dst, byte, bytes));
  BRAID_CUDA_CHECK(cudaDeviceSynchronize());
}

namespace {

// Compute-bound: `iters` dependent FMAs per thread, no memory traffic but one store.
BRAID_KERNEL void fma_kernel(float* out, int iters) {
  float a = 1.0f + static_cast<float>(cuda::device::thread_index()) * 1e-7f, b = 0.999999f, c = 1e-7f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, b, c);
    b = fmaf(b, a, -c);
  }
  if (a == 12345.0f) out[cuda::device::block_index()] = b; // practically never: keeps the loop alive
}

double time_kernel(cudaStream_t s, float* sink, int blocks, int iters) {
  cudaEvent_t a, b;
  BRAID_CUDA_CHECK(cudaEventCreate(&a));
  BRAID_CUDA_CHECK(cudaEventCreate(&b));
  BRAID_CUDA_CHECK(cudaEventRecord(a, s));
  BRAID_CUDA_CHECK(cuda::device::launch(&fma_kernel, static_cast<unsigned>(blocks), 256u, 0, s, sink, iters));
  BRAID_CUDA_CHECK(cudaEventRecord(b, s));
  BRAID_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  BRAID_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / 1e3;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One thread per rank with device 0 current; join() raises the first rank's error. The destructor
// joins threads that were not joined (their bodies must end on their own).
class rank_threads {
public:
  template <class F> rank_threads(int n, F body) : errs_(static_cast<std::size_t>(n)) {
    for (int r = 0; r < n; ++r)
      th_.emplace_back([this, body, r] {
        try {
          BRAID_CUDA_CHECK(cudaSetDevice(0));
          body(r);
        } catch (const std::exception& e) {
          errs_[static_cast<std::size_t>(r)] = e.what();
        }
      });
  }
  rank_threads(const rank_threads&) = delete;
  rank_threads& operator=(const rank_threads&) = delete;
  ~rank_threads() {
    for (auto& t : th_)
      if (t.joinable()) t.join();
  }
  void join(const char* what) {
    for (auto& t : th_) t.join();
    for (const auto& e : errs_)
      if (!e.empty()) raise(errc::internal, std::string("measure_overlap: ") + what + ": " + e);
  }

private:
  std::vector<std::string> errs_;
  std::vector<std::thread> th_;
};

} // namespace

overlap_result measure_overlap(std::size_t bytes, int nranks, int runs) {
  BRAID_CUDA_CHECK(cudaSetDevice(0));
  const std::size_t count = bytes / sizeof(float);
  braid::thread_group tg(nranks);
  std::vector<std::shared_ptr<comm>> comms(static_cast<std::size_t>(nranks));
  std::vector<float*> buf(static_cast<std::size_t>(nranks), nullptr);
  // Destruction is collective (a host barrier): every rank's communicator closes on its own thread.
  auto cleanup = [&] {
    rank_threads(nranks, [&](int r) { comms[static_cast<std::size_t>(r)].reset(); }).join("closing");
    for (float* p : buf)
      if (p) cudaFree(p);
  };
  overlap_result res;
  res.runs = runs;
  try {
    rank_threads(nranks, [&](int r) {
      comm_options o;
      o.copy_engine_min_bytes = 0; // peers on the same GPU: the reduce kernel reads their memory directly
      o.threads = 256;             // the reduce kernel's blocks fit the kernel's 256-thread holes
      o.reduce_blocks = 16;        // the grid the experiment leaves room for (below)
      comms[static_cast<std::size_t>(r)] = connect(tg.make(r), 0, o);
      void* p = nullptr;
      BRAID_CUDA_CHECK(cudaMalloc(&p, bytes));
      buf[static_cast<std::size_t>(r)] = static_cast<float*>(p);
      BRAID_CUDA_CHECK(cudaMemset(p, 0, bytes));
    }).join("setting up");
    cudaStream_t s = nullptr;
    BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* sink = nullptr;
    BRAID_CUDA_CHECK(cudaMalloc(&sink, 1 << 20));
    int sms = 0;
    BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // Three quarters of one wave of 256-thread blocks: compute bound on every SM, with room left for
    // the collective's reduce kernel (16 blocks of 256 threads per rank) to be scheduled beside it.
    int per_sm = 0;
    BRAID_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fma_kernel, 256, 0));
    const int blocks = std::max(1, std::min(sms * per_sm * 3 / 4, sms * per_sm - 16 * nranks));
    // Size the kernel to about 200 ms.
    int iters = 1 << 16;
    (void)time_kernel(s, sink, blocks, iters);
    const double t0 = time_kernel(s, sink, blocks, iters);
    iters = static_cast<int>(std::min<double>(1 << 30, iters * std::max(1.0, 0.2 / std::max(t0, 1e-6))));
    // The collective alone: one warm-up, then the mean of 3, max over ranks.
    std::vector<double> took(static_cast<std::size_t>(nranks));
    rank_threads(nranks, [&](int r) {
      comm& c = *comms[static_cast<std::size_t>(r)];
      float* p = buf[static_cast<std::size_t>(r)];
      c.pc.all_reduce(p, p, count, sum<>{}, c.stream);
      const auto a = std::chrono::steady_clock::now();
      for (int i = 0; i < 3; ++i) c.pc.all_reduce(p, p, count, sum<>{}, c.stream);
      took[static_cast<std::size_t>(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / 3;
    }).join("the collective alone");
    res.collective_s = *std::max_element(took.begin(), took.end());
    std::vector<double> alone, beside;
    for (int i = 0; i < runs; ++i) alone.push_back(time_kernel(s, sink, blocks, iters));
    // The collective in a loop beside the kernel. Every rank makes the same number of calls: rank 0
    // decides when to stop, and tells the others through a host all_reduce before each call.
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> done{0};
    {
      rank_threads loop(nranks, [&](int r) {
        comm& c = *comms[static_cast<std::size_t>(r)];
        float* p = buf[static_cast<std::size_t>(r)];
        for (;;) {
          int flag = r == 0 && stop.load() ? 1 : 0, any = 0;
          c.pc.host().all_reduce(&flag, &any, 1, max<>{});
          if (any) break;
          c.pc.all_reduce(p, p, count, sum<>{}, c.stream);
          done.fetch_add(1);
        }
      });
      try {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const std::uint64_t before = done.load();
        for (int i = 0; i < runs; ++i) beside.push_back(time_kernel(s, sink, blocks, iters));
        res.collectives_beside = (done.load() - before) / static_cast<std::uint64_t>(nranks);
      } catch (...) {
        stop.store(true);
        throw;
      }
      stop.store(true);
      loop.join("the collective beside the kernel");
    }
    res.alone_s = median(alone);
    res.beside_s = median(beside);
    cudaFree(sink);
    cudaStreamDestroy(s);
  } catch (...) {
    try {
      cleanup();
    } catch (...) {
    }
    throw;
  }
  cleanup();
  return res;
}

namespace {

// Input and output of `count` floats on the communicator's device, freed on every path.
struct float_pair {
  float* in = nullptr;
  float* out = nullptr;
  explicit float_pair(std::size_t count) {
    const std::size_t bytes = std::max<std::size_t>(count, 1) * sizeof(float);
    BRAID_CUDA_CHECK(cudaMalloc(&in, bytes));
    if (const cudaError_t e = cudaMalloc(&out, bytes); e != cudaSuccess) {
      cudaFree(in);
      cuda::detail::raise_cuda(e, "cudaMalloc", __FILE__, __LINE__);
    }
    BRAID_CUDA_CHECK(cudaMemset(in, 0, bytes));
    BRAID_CUDA_CHECK(cudaDeviceSynchronize());
  }
  float_pair(const float_pair&) = delete;
  float_pair& operator=(const float_pair&) = delete;
  ~float_pair() {
    cudaFree(in);
    cudaFree(out);
  }
};

} // namespace

double time_all_reduce(comm& c, std::size_t count, int warmup, int iters, bool in_place) {
  BRAID_CUDA_CHECK(cudaSetDevice(c.pc.device()));
  float_pair b(count);
  float* out = in_place ? b.in : b.out;
  for (int i = 0; i < warmup; ++i) c.pc.all_reduce(b.in, out, count, sum<>{}, c.stream);
  c.pc.barrier(c.stream);
  const auto a = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) c.pc.all_reduce(b.in, out, count, sum<>{}, c.stream);
  // The device path returns at once: the calls are complete when the stream is (the host path's
  // calls block, and this wait finds the stream done).
  BRAID_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  c.pc.check();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / std::max(iters, 1);
}

std::int64_t check_all_reduce(comm& c, std::size_t count, bool in_place) {
  BRAID_CUDA_CHECK(cudaSetDevice(c.pc.device()));
  const int n = c.pc.size(), r = c.pc.rank();
  std::vector<float> host(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = check_input(r, i);
  float_pair b(count);
  float* out = in_place ? b.in : b.out;
  if (count) BRAID_CUDA_CHECK(cudaMemcpy(b.in, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  c.pc.all_reduce(b.in, out, count, sum<>{}, c.stream);
  BRAID_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  c.pc.check();
  if (count) BRAID_CUDA_CHECK(cudaMemcpy(host.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost));
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    wrong += host[i] != check_sum(n, i);
  return wrong;
}

double max_over_ranks(comm& c, double v) {
  double out = 0;
  c.pc.host().all_reduce(&v, &out, 1, max<>{});
  return out;
}

std::int64_t sum_over_ranks(comm& c, std::int64_t v) {
  std::int64_t out = 0;
  c.pc.host().all_reduce(&v, &out, 1, sum<>{});
  return out;
}

} // namespace braid::gpu_procs
