// A CUDA consumer of braid, built by each packaging consumer: with nvcc as a .cu file (consumer_cuda),
// and with the host compiler on braid's emulated device (consumer_emu, through emu.cpp). Two ranks
// on device 0 sum 1000 floats in place; exit 0 when every element is 3, 1 otherwise, 77 (CTest: skipped)
// when the CUDA runtime finds no device.
#include <braid/cuda.cuh>

#include <cstdio>
#include <vector>

#define CHECK(call)                                                                                                 \
  do {                                                                                                              \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) {                                                               \
      std::printf("%s: %s\n", #call, cudaGetErrorString(e_));                                                       \
      return 1;                                                                                                     \
    }                                                                                                               \
  } while (0)

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    std::puts("no CUDA device: built and linked, not run");
    return 77;
  }
  constexpr std::size_t n = 1000;
  auto comms = braid::cuda::create_group({0, 0});
  float* d[2] = {};
  cudaStream_t s[2] = {};
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> h(n, static_cast<float>(r + 1));
    CHECK(cudaMalloc(&d[r], n * sizeof(float)));
    CHECK(cudaMemcpy(d[r], h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaStreamCreate(&s[r]));
  }
  {
    braid::cuda::group_scope bracket; // one thread drives both ranks of device 0
    for (int r = 0; r < 2; ++r) comms[static_cast<std::size_t>(r)].all_reduce(d[r], d[r], n, braid::sum{}, s[r]);
  }
  std::size_t wrong = 0;
  for (int r = 0; r < 2; ++r) {
    CHECK(cudaStreamSynchronize(s[r]));
    comms[static_cast<std::size_t>(r)].check();
    std::vector<float> h(n);
    CHECK(cudaMemcpy(h.data(), d[r], n * sizeof(float), cudaMemcpyDeviceToHost));
    for (const float v : h) wrong += v != 3.0f;
    CHECK(cudaFree(d[r]));
    CHECK(cudaStreamDestroy(s[r]));
  }
  std::printf("%zu wrong elements\n", wrong);
  return wrong ? 1 : 0;
}
