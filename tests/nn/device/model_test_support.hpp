// tests/nn/device/model_test_support.hpp — what the fused::resnet tests share (test_model_device.cpp,
// test_pipeline_device.cpp): one rank's device side (pool, stream, cuBLAS handle), random images and
// labels, and the relative difference of two buffers.
#pragma once

#include <doctest/doctest.h>

#include <braid/cuda.cuh>
#include <braid/nn/model_device.cuh>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

namespace model_test {

using namespace braid::nn;

#define EMU_OK(expr) REQUIRE_EQ((expr), cudaSuccess)

// One rank's device side: pool, stream, cuBLAS handle (all of device `dev`).
struct device_side {
  int dev;
  device_pool pool;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  explicit device_side(int d) : dev(d), pool(d) {
    if (cudaSetDevice(d) != cudaSuccess || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("device_side: setup failed");
  }
  ~device_side() {
    cudaSetDevice(dev);
    cudaStreamSynchronize(stream);
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
  }
  template <class T> T* upload(const T* host, std::int64_t n) {
    T* p = static_cast<T*>(pool.allocate(std::size_t(n) * sizeof(T), stream));
    if (cudaMemcpyAsync(p, host, std::size_t(n) * sizeof(T), cudaMemcpyHostToDevice, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
      throw std::runtime_error("upload failed");
    return p;
  }
  template <class T> std::vector<T> download(const T* dev_p, std::int64_t n) {
    std::vector<T> v(static_cast<std::size_t>(n));
    if (cudaStreamSynchronize(stream) != cudaSuccess ||
        cudaMemcpyAsync(v.data(), dev_p, v.size() * sizeof(T), cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
      throw std::runtime_error("download failed");
    return v;
  }
};

template <class T> tensor random_images(std::int64_t n, int hw, std::mt19937_64& rng) {
  tensor t({n, 1, hw, hw}, braid::dtype_of_v<T>);
  std::normal_distribution<double> nd(0, 1);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = T(nd(rng));
  return t;
}
inline std::vector<std::int32_t> random_labels(std::int64_t n, std::mt19937_64& rng) {
  std::vector<std::int32_t> l(static_cast<std::size_t>(n));
  for (auto& v : l) v = std::int32_t(rng() % 10);
  return l;
}

// max |a - b| over max |b|
template <class T> double rel_err(const T* a, const T* b, std::int64_t n) {
  double diff = 0, big = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    big = std::max(big, std::fabs(double(b[i])));
  }
  return big > 0 ? diff / big : diff;
}

} // namespace model_test
