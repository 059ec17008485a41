// braid/nn/blas.hpp — the matrix products of the CPU layers, done by the system's CBLAS (OpenBLAS on
// Debian: libopenblas-dev). Link a CBLAS library (the braid::nn CMake target does).
#pragma once

#include "../core/config.hpp"

#include <atomic>

#include <cblas.h>

namespace braid::nn::blas {

// C(m x n) = alpha * op(A) * op(B) + beta * C, row-major; op(A) is m x k, op(B) is k x n.
inline void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
              alpha, a, lda, b, ldb, beta, c, ldc);
}

} // namespace braid::nn::blas

// OpenBLAS's own threading control, when the BLAS is OpenBLAS (weak: absent elsewhere).
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace braid::nn::blas {
namespace detail {
// The thread count per rank that set_threads asked for (0: never asked). The oneDNN layers apply it
// in each calling thread (their OpenMP thread count is a per-thread setting, and ranks are threads).
inline std::atomic<int>& threads_per_rank() {
  static std::atomic<int> n{0};
  return n;
}
} // namespace detail
// Sets the thread count of the CPU layers' libraries: the BLAS's where the library allows it
// (OpenBLAS, a process-wide setting), and the oneDNN layers' (applied by each rank thread before it
// runs a oneDNN primitive). Returns whether the BLAS could be set.
inline bool set_threads(int n) {
  detail::threads_per_rank().store(n, std::memory_order_relaxed);
  if (&openblas_set_num_threads == nullptr) return false;
  openblas_set_num_threads(n);
  return true;
}
} // namespace braid::nn::blas
