// bench/launch/launch_float.cu — the test group, all_reduce with braid::sum for half, bfloat16, float
// and double, and float with every operator for every collective (every supported algorithm). With
// launch_sum.cu (integers, fp8) that is 14 x 6 all_reduce/sum kernels plus 4 operators x 6 for float:
// 108 kernels. reduce_scatter, reduce, broadcast and all_gather reuse them (the collective is a kernel
// argument, not a template parameter).
#include "group.cuh"

#include <cstdint>
#include <exception>
#include <string>

namespace braid::gpu_launch {

std::shared_ptr<group> make_group(const std::vector<int>& devices, std::chrono::nanoseconds timeout,
                                  std::size_t staging_bytes, int threads_per_block, int max_blocks_per_rank, bool by_streams) {
  braid::cuda::group_options o; // base = options::from_env()
  if (by_streams) o.order = braid::cuda::call_order::streams;
  if (timeout.count() > 0) o.base.with_timeout(timeout);
  if (staging_bytes) o.base.staging_bytes = staging_bytes;
  if (threads_per_block > 0) o.threads_per_block = threads_per_block;
  if (max_blocks_per_rank > 0) o.max_blocks_per_rank = max_blocks_per_rank;
  auto g = std::make_shared<group>();
  g->comms = braid::cuda::create_group(devices, o);
  int saved = 0;
  BRAID_CUDA_CHECK(cudaGetDevice(&saved));
  for (const auto& comm : g->comms) {
    BRAID_CUDA_CHECK(cudaSetDevice(comm.device()));
    cudaStream_t s = nullptr;
    BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    g->streams.push_back(s);
  }
  BRAID_CUDA_CHECK(cudaSetDevice(saved));
  return g;
}

void group_start() { braid::cuda::group_start(); }
void group_end() { braid::cuda::group_end(); }
void bracket::end() {
  if (ended) return;
  ended = true;
  group_end();
}
bracket::~bracket() noexcept(false) { braid::cuda::enqueue::end_scope(ended, uncaught); }

int size(const group& g) { return static_cast<int>(g.comms.size()); }
bool reads_in_place(const group& g, int rank, const void* p) { return g.comms.at(static_cast<std::size_t>(rank)).reads_in_place(p); }
std::uint64_t rounds(const group& g, int rank) { return g.comms.at(static_cast<std::size_t>(rank)).rounds(); }
int blocks_per_rank(const group& g) { return g.comms.at(0).blocks_per_rank(); }
int threads_per_block(const group& g) { return g.comms.at(0).threads_per_block(); }

void* stream(const group& g, int rank) { return g.streams.at(static_cast<std::size_t>(rank)); }

void check(const group& g, int rank) { g.comms.at(static_cast<std::size_t>(rank)).check(); }
algo algorithm_for(const group& g, int rank, collective c, std::uint64_t bytes) {
  return g.comms.at(static_cast<std::size_t>(rank)).algorithm_for(c, bytes);
}

bool instantiated(collective c, dtype t, op_kind k) {
  if (c == collective::all_reduce && k == op_kind::sum) return true;
  return t == dtype::float32 && k != op_kind::custom;
}

void enqueue(group& g, int rank, const call& c) {
  if (rank < 0 || rank >= size(g)) raise(errc::invalid_argument, "gpu_launch::enqueue: no rank " + std::to_string(rank));
  if (detail::enqueue_sum_narrow(g, rank, c)) return;
  if (c.coll == collective::all_reduce && c.op == op_kind::sum) {
    switch (c.type) {
    case dtype::float16: enqueue_typed<half>(g, rank, c, sum<>{}); return;
    case dtype::bfloat16: enqueue_typed<bfloat16>(g, rank, c, sum<>{}); return;
    case dtype::float32: enqueue_typed<float>(g, rank, c, sum<>{}); return;
    case dtype::float64: enqueue_typed<double>(g, rank, c, sum<>{}); return;
    default: break;
    }
  }
  if (!instantiated(c.coll, c.type, c.op))
    raise(errc::unsupported, std::string("the GPU test does not instantiate ") + std::string(name(c.coll)) + " for " +
                                 std::string(name(c.type)) + " with " + std::string(name(c.op)));
  braid::cuda::communicator& comm = g.comms.at(static_cast<std::size_t>(rank));
  cudaStream_t s = c.stream ? static_cast<cudaStream_t>(c.stream) : g.streams.at(static_cast<std::size_t>(rank));
  const call_options co{c.algorithm};
  switch (c.coll) {
  case collective::all_gather:
    comm.all_gather(static_cast<const float*>(c.in), static_cast<float*>(c.out), c.count, s, co);
    return;
  case collective::broadcast:
    comm.broadcast(static_cast<const float*>(c.in), static_cast<float*>(c.out), c.count, c.root, s, co);
    return;
  default:
    visit(c.op, [&](auto op) { enqueue_typed<float>(g, rank, c, op); });
    return;
  }
}

namespace {
template <class T> struct two_sources {
  const T* p[64]; // two used; reduce_copy may index up to ns - 1 for all the compiler knows
};
// The sources as a kernel parameter (reduce_copy reads them from the parameter space, as
// reduce_kernel does): a per-thread array would live in local memory. At most 512 threads a block.
template <class T>
BRAID_KERNEL_BOUNDED(512) void reduce_copy_kernel(const BRAID_GRID_CONSTANT two_sources<T> src, T* out, std::uint64_t count,
                                                  int nsrc) {
  const std::uint64_t tid = static_cast<std::uint64_t>(cuda::device::block_index()) * cuda::device::block_size() + cuda::device::thread_index();
  const std::uint64_t nthreads = static_cast<std::uint64_t>(cuda::device::grid_size()) * cuda::device::block_size();
  braid::cuda::device::reduce_copy<T>(src.p, nsrc, out, static_cast<T*>(nullptr), count, sum<float>{}, true, 1, tid, nthreads);
}

template <class T> double time_typed(int nsrc, std::size_t bytes, int iters, int blocks, int threads) {
  const std::uint64_t count = bytes / sizeof(T);
  void *a = nullptr, *b = nullptr, *o = nullptr;
  BRAID_CUDA_CHECK(cudaMalloc(&a, bytes));
  BRAID_CUDA_CHECK(cudaMalloc(&b, bytes));
  BRAID_CUDA_CHECK(cudaMalloc(&o, bytes));
  BRAID_CUDA_CHECK(cudaMemset(a, 0, bytes));
  BRAID_CUDA_CHECK(cudaMemset(b, 0, bytes));
  cudaEvent_t e0, e1;
  BRAID_CUDA_CHECK(cudaEventCreate(&e0));
  BRAID_CUDA_CHECK(cudaEventCreate(&e1));
  auto once = [&] {
    if (nsrc == 0) BRAID_CUDA_CHECK(cudaMemcpyAsync(o, a, bytes, cudaMemcpyDeviceToDevice, nullptr));
    else
      BRAID_CUDA_CHECK(cuda::device::launch(&reduce_copy_kernel<T>, static_cast<unsigned>(blocks), static_cast<unsigned>(threads), 0,
                                   nullptr, two_sources<T>{{static_cast<const T*>(a), static_cast<const T*>(b)}},
                                   static_cast<T*>(o), count, nsrc));
  };
  for (int i = 0; i < 3; ++i) once();
  BRAID_CUDA_CHECK(cudaEventRecord(e0, nullptr));
  for (int i = 0; i < iters; ++i) once();
  BRAID_CUDA_CHECK(cudaEventRecord(e1, nullptr));
  BRAID_CUDA_CHECK(cudaEventSynchronize(e1));
  BRAID_CUDA_CHECK(cudaGetLastError());
  float ms = 0;
  BRAID_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  cudaFree(o);
  return static_cast<double>(ms) * 1e-3 / iters;
}
} // namespace

double time_reduce_copy(dtype type, int nsrc, std::size_t bytes, int iters, int blocks, int threads) {
  if (nsrc < 0 || nsrc > 2 || iters < 1 || blocks < 1 || threads < 32 || threads > 512)
    raise(errc::invalid_argument, "time_reduce_copy: nsrc 0..2, iters >= 1, blocks >= 1, threads 32..512");
  switch (type) {
  case dtype::float32: return time_typed<float>(nsrc, bytes, iters, blocks, threads);
  case dtype::bfloat16: return time_typed<bfloat16>(nsrc, bytes, iters, blocks, threads);
  default: raise(errc::unsupported, "time_reduce_copy: float32 or bfloat16");
  }
}

namespace {
struct rgb { // a copy-only element: no arithmetic at all
  unsigned char c[3];
};
} // namespace

std::size_t copy_only_check(const std::vector<int>& devices, std::size_t count) {
  const int n = static_cast<int>(devices.size()), root = n - 1;
  const auto un = static_cast<std::size_t>(n);
  std::size_t wrong = 0;
  const std::pair<collective, algo> runs[] = {
      {collective::broadcast, algo::ring},       {collective::broadcast, algo::tree},
      {collective::broadcast, algo::direct},     {collective::all_gather, algo::ring},
      {collective::all_gather, algo::halving_doubling}, {collective::all_gather, algo::direct}};
  for (const auto& [coll, a] : runs) {
    auto g = make_group(devices, {}, std::size_t{64} << 10); // small staging: several rounds
    const std::size_t out_n = coll == collective::all_gather ? count * un : count;
    std::vector<rgb*> in(un), out(un);
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      BRAID_CUDA_CHECK(cudaSetDevice(devices[ur]));
      BRAID_CUDA_CHECK(cudaMalloc(&in[ur], count * sizeof(rgb)));
      BRAID_CUDA_CHECK(cudaMalloc(&out[ur], out_n * sizeof(rgb)));
      std::vector<rgb> h(count);
      for (std::size_t i = 0; i < count; ++i)
        h[i] = rgb{{static_cast<unsigned char>(r), static_cast<unsigned char>(i), static_cast<unsigned char>(i >> 8)}};
      BRAID_CUDA_CHECK(cudaMemcpy(in[ur], h.data(), count * sizeof(rgb), cudaMemcpyHostToDevice));
      BRAID_CUDA_CHECK(cudaMemset(out[ur], 0xEE, out_n * sizeof(rgb)));
      BRAID_CUDA_CHECK(cudaDeviceSynchronize());
    }
    braid::cuda::group_scope bracket;
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      braid::cuda::communicator& comm = g->comms.at(ur);
      if (coll == collective::broadcast) comm.broadcast(in[ur], out[ur], count, root, g->streams[ur], call_options{a});
      else comm.all_gather(in[ur], out[ur], count, g->streams[ur], call_options{a});
    }
    bracket.end();
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      BRAID_CUDA_CHECK(cudaSetDevice(devices[ur]));
      BRAID_CUDA_CHECK(cudaStreamSynchronize(g->streams[ur]));
      g->comms.at(ur).check();
      std::vector<rgb> h(out_n);
      BRAID_CUDA_CHECK(cudaMemcpy(h.data(), out[ur], out_n * sizeof(rgb), cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < out_n; ++i) {
        const std::size_t src = coll == collective::all_gather ? i / count : static_cast<std::size_t>(root);
        const std::size_t e = coll == collective::all_gather ? i % count : i;
        const rgb want{{static_cast<unsigned char>(src), static_cast<unsigned char>(e), static_cast<unsigned char>(e >> 8)}};
        for (int b = 0; b < 3; ++b) wrong += h[i].c[b] != want.c[b];
      }
      cudaFree(in[ur]);
      cudaFree(out[ur]);
    }
    BRAID_CUDA_CHECK(cudaSetDevice(0));
  }
  return wrong;
}

const char* device_kind() { return cuda::device::device_kind(); }
#if defined(BRAID_CUDA_EMULATED_RUNTIME)
bool emulated() { return true; }
#else
bool emulated() { return false; }
#endif

bool kernels_loadable(std::string& why) {
  cudaFuncAttributes attr{};
  const cudaError_t e =
      cudaFuncGetAttributes(&attr, braid::cuda::device::collective_kernel<schedule::one_shot, float, sum<>>);
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  return false;
}

} // namespace braid::gpu_launch
