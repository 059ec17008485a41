// braid/nn/blas.hpp — the matrix products of the CPU layers, done by the system's CBLAS (OpenBLAS on
// Debian: libopenblas-dev). Link a CBLAS library (the braid::nn CMake target does).
#pragma once

#include "../core/config.hpp"

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
// Sets the BLAS's thread count where the library allows it (OpenBLAS); returns whether it could.
inline bool set_threads(int n) {
  if (&openblas_set_num_threads == nullptr) return false;
  openblas_set_num_threads(n);
  return true;
}
} // namespace braid::nn::blas
