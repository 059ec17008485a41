// tests/cuda/launch_float.cu — the test group, all_reduce with braid::sum for half, bfloat16, float
// and double, and float with every operator for every collective (every supported algorithm). With
// launch_sum.cu (integers, fp8) that is 14 x 6 all_reduce/sum kernels plus 4 operators x 6 for float:
// 108 kernels. reduce_scatter, reduce, broadcast and all_gather reuse them (the collective is a kernel
// argument, not a template parameter).
#include "group.cuh"

#include <string>

namespace braid::gpu_test {

std::shared_ptr<group> make_group(const std::vector<int>& devices, std::chrono::nanoseconds timeout,
                                  std::size_t staging_bytes) {
  braid::cuda::group_options o; // base = options::from_env()
  if (timeout.count() > 0) o.base.with_timeout(timeout);
  if (staging_bytes) o.base.staging_bytes = staging_bytes;
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

int size(const group& g) { return static_cast<int>(g.comms.size()); }

void* stream(const group& g, int rank) { return g.streams.at(static_cast<std::size_t>(rank)); }

void check(const group& g, int rank) { g.comms.at(static_cast<std::size_t>(rank)).check(); }

bool instantiated(collective c, dtype t, op_kind k) {
  if (c == collective::all_reduce && k == op_kind::sum) return true;
  return t == dtype::float32 && k != op_kind::custom;
}

void enqueue(group& g, int rank, const call& c) {
  if (rank < 0 || rank >= size(g)) raise(errc::invalid_argument, "gpu_test::enqueue: no rank " + std::to_string(rank));
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
  cudaStream_t s = g.streams.at(static_cast<std::size_t>(rank));
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

bool kernels_loadable(std::string& why) {
  cudaFuncAttributes attr{};
  const cudaError_t e =
      cudaFuncGetAttributes(&attr, braid::cuda_detail::collective_kernel<schedule::one_shot, float, sum<>>);
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  return false;
}

} // namespace braid::gpu_test
