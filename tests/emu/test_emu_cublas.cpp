// tests/emu/test_emu_cublas.cpp — the emulated cuBLAS subset (include/braid/emu/cublas.hpp): every
// entry point; GEMM results against a naive triple loop in double (all four transpose pairs,
// non-square shapes, padded leading dimensions, alpha and beta, beta = 0 over a NaN-filled C, zero
// sizes, strided batches); cuBLAS's refusals; stream order (behind a host function on the same
// stream, behind a blocking stream through the legacy default stream, two handles on two streams);
// capture into a graph; device pointer mode.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <braid/cuda/runtime.cuh>
#include <braid/emu/cublas.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

#define EMU_OK(expr) REQUIRE_EQ((expr), cudaSuccess)
#define BLAS_OK(expr) REQUIRE_EQ((expr), CUBLAS_STATUS_SUCCESS)

// A device buffer and its host mirror.
template <class T> struct dbuf {
  T* d = nullptr;
  std::vector<T> h;
  explicit dbuf(std::size_t n, T fill = T{}) : h(n, fill) {
    EMU_OK(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(T)));
    put();
  }
  ~dbuf() { (void)cudaFree(d); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  // cudaMemcpy from pageable memory returns once the source is staged; the copy itself runs on the
  // legacy stream, which non-blocking streams do not wait for: wait for it here.
  void put() {
    EMU_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    EMU_OK(cudaStreamSynchronize(nullptr));
  }
  void get() { EMU_OK(cudaMemcpy(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost)); }
};

// Small values with few bits, deterministic.
template <class T> void fill_values(std::vector<T>& v, unsigned seed) {
  unsigned x = seed * 2654435761u + 12345u;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = static_cast<T>(static_cast<int>((x >> 16) % 17u) - 8) / T(4);
  }
}

cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* al,
                    const float* A, int lda, const float* B, int ldb, const float* be, float* C, int ldc) {
  return cublasSgemm(h, ta, tb, m, n, k, al, A, lda, B, ldb, be, C, ldc);
}
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const double* al,
                    const double* A, int lda, const double* B, int ldb, const double* be, double* C, int ldc) {
  return cublasDgemm(h, ta, tb, m, n, k, al, A, lda, B, ldb, be, C, ldc);
}
cublasStatus_t gemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* al,
                            const float* A, int lda, long long sa, const float* B, int ldb, long long sb, const float* be,
                            float* C, int ldc, long long sc, int batch) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, al, A, lda, sa, B, ldb, sb, be, C, ldc, sc, batch);
}
cublasStatus_t gemm_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const double* al,
                            const double* A, int lda, long long sa, const double* B, int ldb, long long sb, const double* be,
                            double* C, int ldc, long long sc, int batch) {
  return cublasDgemmStridedBatched(h, ta, tb, m, n, k, al, A, lda, sa, B, ldb, sb, be, C, ldc, sc, batch);
}

// The naive product in double: what C (column-major, ldc) must hold afterwards, and each entry's
// magnitude scale (for the tolerance). beta == 0 ignores C, as BLAS does.
template <class T>
void reference(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, double alpha, const T* A, int lda, const T* B,
               int ldb, double beta, const T* C, int ldc, std::vector<double>& want, std::vector<double>& scale) {
  want.assign(static_cast<std::size_t>(ldc) * static_cast<std::size_t>(n), 0.0);
  scale = want;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double sum = 0, mag = 0;
      for (int l = 0; l < k; ++l) {
        const double a = ta == CUBLAS_OP_N ? A[i + l * lda] : A[l + i * lda];
        const double b = tb == CUBLAS_OP_N ? B[l + j * ldb] : B[j + l * ldb];
        sum += a * b;
        mag += std::fabs(a * b);
      }
      const std::size_t at = static_cast<std::size_t>(i + j * ldc);
      const double c = beta == 0 ? 0.0 : beta * static_cast<double>(C[at]);
      want[at] = alpha * sum + c;
      scale[at] = std::fabs(alpha) * mag + std::fabs(c) + 1;
    }
}

template <class T> constexpr double tolerance() { return std::is_same_v<T, float> ? 1e-6 : 1e-14; }

// Checks C's m x n entries against `want`, and that the padding rows m..ldc-1 kept `pad`.
template <class T>
void check_result(const T* C, int m, int n, int ldc, const std::vector<double>& want, const std::vector<double>& scale, T pad,
                  const std::string& what) {
  int bad = 0, bad_pad = 0;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < ldc; ++i) {
      const std::size_t at = static_cast<std::size_t>(i + j * ldc);
      if (i < m) {
        if (!(std::fabs(static_cast<double>(C[at]) - want[at]) <= tolerance<T>() * scale[at])) ++bad;
      } else if (std::memcmp(&C[at], &pad, sizeof(T)) != 0) {
        ++bad_pad;
      }
    }
  INFO(what);
  CHECK(bad == 0);
  CHECK(bad_pad == 0);
}

const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
std::string op_letter(cublasOperation_t op) { return op == CUBLAS_OP_N ? "N" : "T"; }

template <class T> void gemm_against_reference() {
  cublasHandle_t h = nullptr;
  BLAS_OK(cublasCreate(&h));
  const T nan = std::numeric_limits<T>::quiet_NaN();
  struct shape {
    int m, n, k, pad;
    double alpha, beta;
  };
  const shape shapes[] = {{5, 3, 7, 0, 1.0, 0.0}, {7, 11, 4, 3, 0.5, 2.0}, {1, 9, 13, 1, -1.25, 1.0},
                          {16, 16, 16, 0, 2.0, -0.5}, {13, 1, 6, 2, 1.0, 0.0}, {3, 4, 1, 5, 1.5, 0.25}};
  for (const shape& s : shapes)
    for (cublasOperation_t ta : ops)
      for (cublasOperation_t tb : ops) {
        const int rows_a = ta == CUBLAS_OP_N ? s.m : s.k, cols_a = ta == CUBLAS_OP_N ? s.k : s.m;
        const int rows_b = tb == CUBLAS_OP_N ? s.k : s.n, cols_b = tb == CUBLAS_OP_N ? s.n : s.k;
        const int lda = rows_a + s.pad, ldb = rows_b + s.pad + 1, ldc = s.m + s.pad;
        dbuf<T> A(static_cast<std::size_t>(lda * cols_a)), B(static_cast<std::size_t>(ldb * cols_b)),
            C(static_cast<std::size_t>(ldc * s.n));
        fill_values(A.h, 1);
        fill_values(B.h, 2);
        fill_values(C.h, 3);
        // Padding (never read, never written) holds NaN in A and B, a sentinel in C.
        for (int j = 0; j < cols_a; ++j)
          for (int i = rows_a; i < lda; ++i) A.h[static_cast<std::size_t>(i + j * lda)] = nan;
        for (int j = 0; j < cols_b; ++j)
          for (int i = rows_b; i < ldb; ++i) B.h[static_cast<std::size_t>(i + j * ldb)] = nan;
        const T pad = T(-777);
        for (int j = 0; j < s.n; ++j)
          for (int i = s.m; i < ldc; ++i) C.h[static_cast<std::size_t>(i + j * ldc)] = pad;
        // beta = 0: C's entries are NaN and must not show through.
        if (s.beta == 0)
          for (int j = 0; j < s.n; ++j)
            for (int i = 0; i < s.m; ++i) C.h[static_cast<std::size_t>(i + j * ldc)] = nan;
        A.put();
        B.put();
        C.put();
        std::vector<double> want, scale;
        reference(ta, tb, s.m, s.n, s.k, s.alpha, A.h.data(), lda, B.h.data(), ldb, s.beta, C.h.data(), ldc, want, scale);
        const T alpha = static_cast<T>(s.alpha), beta = static_cast<T>(s.beta);
        BLAS_OK(gemm(h, ta, tb, s.m, s.n, s.k, &alpha, A.d, lda, B.d, ldb, &beta, C.d, ldc));
        C.get(); // cudaMemcpy on the legacy stream, which the handle's GEMM is on
        check_result(C.h.data(), s.m, s.n, ldc, want, scale, pad,
                     "m " + std::to_string(s.m) + " n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " " +
                         op_letter(ta) + op_letter(tb) + " beta " + std::to_string(s.beta));
      }
  // CUBLAS_OP_C is CUBLAS_OP_T for real types.
  {
    const int m = 4, n = 3, k = 5;
    dbuf<T> A(static_cast<std::size_t>(k * m)), B(static_cast<std::size_t>(n * k)), C1(static_cast<std::size_t>(m * n)),
        C2(static_cast<std::size_t>(m * n));
    fill_values(A.h, 4);
    fill_values(B.h, 5);
    A.put();
    B.put();
    const T one = 1, zero = 0;
    BLAS_OK(gemm(h, CUBLAS_OP_T, CUBLAS_OP_T, m, n, k, &one, A.d, k, B.d, n, &zero, C1.d, m));
    BLAS_OK(gemm(h, CUBLAS_OP_C, CUBLAS_OP_HERMITAN, m, n, k, &one, A.d, k, B.d, n, &zero, C2.d, m));
    C1.get();
    C2.get();
    CHECK(C1.h == C2.h);
  }
  BLAS_OK(cublasDestroy(h));
}

TEST_CASE("status values and names are cublas_api.h's; cublas_v2.h's names reach the _v2 functions") {
  static_assert(CUBLAS_STATUS_SUCCESS == 0 && CUBLAS_STATUS_NOT_INITIALIZED == 1 && CUBLAS_STATUS_ALLOC_FAILED == 3 &&
                CUBLAS_STATUS_INVALID_VALUE == 7 && CUBLAS_STATUS_ARCH_MISMATCH == 8 && CUBLAS_STATUS_MAPPING_ERROR == 11 &&
                CUBLAS_STATUS_EXECUTION_FAILED == 13 && CUBLAS_STATUS_INTERNAL_ERROR == 14 &&
                CUBLAS_STATUS_NOT_SUPPORTED == 15 && CUBLAS_STATUS_LICENSE_ERROR == 16);
  static_assert(CUBLAS_OP_N == 0 && CUBLAS_OP_T == 1 && CUBLAS_OP_C == 2 && CUBLAS_OP_HERMITAN == 2 && CUBLAS_OP_CONJG == 3);
  static_assert(CUBLAS_POINTER_MODE_HOST == 0 && CUBLAS_POINTER_MODE_DEVICE == 1);
  CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_SUCCESS)) == "CUBLAS_STATUS_SUCCESS");
  CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE)) == "CUBLAS_STATUS_INVALID_VALUE");
  CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_LICENSE_ERROR)) == "CUBLAS_STATUS_LICENSE_ERROR");
  CHECK(std::string(cublasGetStatusName(static_cast<cublasStatus_t>(2))) == "CUBLAS_STATUS_UNKNOWN");
  CHECK(std::string(cublasGetStatusString(CUBLAS_STATUS_SUCCESS)) == "success");
  CHECK(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED)) == "the library was not initialized");
  CHECK(std::string(cublasGetStatusString(CUBLAS_STATUS_EXECUTION_FAILED)) == "the function failed to launch on the GPU");
  for (int s : {0, 1, 3, 7, 8, 11, 13, 14, 15, 16}) {
    CHECK(std::string(cublasGetStatusName(static_cast<cublasStatus_t>(s))) != "CUBLAS_STATUS_UNKNOWN");
    CHECK(std::string(cublasGetStatusString(static_cast<cublasStatus_t>(s))) != "unknown error");
  }
  // The macros, as in cublas_v2.h: taking the address through either name gives the same function.
  CHECK((&cublasCreate == &cublasCreate_v2));
  CHECK((&cublasDestroy == &cublasDestroy_v2));
  CHECK((&cublasSetStream == &cublasSetStream_v2));
  CHECK((&cublasGetStream == &cublasGetStream_v2));
  CHECK((&cublasSetPointerMode == &cublasSetPointerMode_v2));
  CHECK((&cublasGetPointerMode == &cublasGetPointerMode_v2));
  CHECK((&cublasSgemm == &cublasSgemm_v2));
  CHECK((&cublasDgemm == &cublasDgemm_v2));
}

TEST_CASE("handles: create, set and get the stream and pointer mode, destroy; null and stale handles are refused") {
  cublasHandle_t h = nullptr;
  BLAS_OK(cublasCreate(&h));
  REQUIRE(h != nullptr);
  cudaStream_t got = reinterpret_cast<cudaStream_t>(1);
  BLAS_OK(cublasGetStream(h, &got));
  CHECK(got == nullptr); // the default stream
  cudaStream_t s = nullptr;
  EMU_OK(cudaStreamCreate(&s));
  BLAS_OK(cublasSetStream(h, s));
  BLAS_OK(cublasGetStream(h, &got));
  CHECK(got == s);
  BLAS_OK(cublasSetStream(h, nullptr));
  BLAS_OK(cublasGetStream(h, &got));
  CHECK(got == nullptr);
  cublasPointerMode_t mode = CUBLAS_POINTER_MODE_DEVICE;
  BLAS_OK(cublasGetPointerMode(h, &mode));
  CHECK(mode == CUBLAS_POINTER_MODE_HOST);
  BLAS_OK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
  BLAS_OK(cublasGetPointerMode(h, &mode));
  CHECK(mode == CUBLAS_POINTER_MODE_DEVICE);
  CHECK(cublasGetPointerMode(h, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasGetStream(h, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasCreate(nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  // Two handles are independent.
  cublasHandle_t h2 = nullptr;
  BLAS_OK(cublasCreate(&h2));
  CHECK(h2 != h);
  BLAS_OK(cublasGetPointerMode(h2, &mode));
  CHECK(mode == CUBLAS_POINTER_MODE_HOST);
  BLAS_OK(cublasDestroy(h2));
  BLAS_OK(cublasDestroy(h));
  // Null, destroyed: CUBLAS_STATUS_NOT_INITIALIZED everywhere.
  for (cublasHandle_t bad : {static_cast<cublasHandle_t>(nullptr), h}) {
    float x = 0;
    CHECK(cublasSetStream(bad, s) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(cublasGetStream(bad, &got) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(cublasSetPointerMode(bad, CUBLAS_POINTER_MODE_HOST) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(cublasGetPointerMode(bad, &mode) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(cublasSgemm(bad, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &x, &x, 1, &x, 1, &x, &x, 1) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(cublasDestroy(bad) == CUBLAS_STATUS_NOT_INITIALIZED);
  }
  EMU_OK(cudaStreamDestroy(s));
}

TEST_CASE("cublasSgemm against a naive product: all transposes, non-square, padded leading dimensions, alpha and beta") {
  gemm_against_reference<float>();
}

TEST_CASE("cublasDgemm against a naive product: all transposes, non-square, padded leading dimensions, alpha and beta") {
  gemm_against_reference<double>();
}

TEST_CASE("zero sizes: m or n 0 leaves C alone, k 0 scales C by beta (beta 0 clears NaNs)") {
  cublasHandle_t h = nullptr;
  BLAS_OK(cublasCreate(&h));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  dbuf<double> A(16, 1.0), B(16, 1.0), C(16, 3.0);
  const double one = 1, two = 2, zero = 0;
  // m = 0, n = 0: nothing computed (C may even be null).
  BLAS_OK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 4, 4, &one, A.d, 1, B.d, 4, &two, C.d, 1));
  BLAS_OK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 0, 4, &one, A.d, 4, B.d, 4, &two, C.d, 4));
  BLAS_OK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 0, 0, &one, nullptr, 1, nullptr, 1, &two, nullptr, 1));
  BLAS_OK(cublasDgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, A.d, 4, 16, B.d, 4, 16, &two, C.d, 4, 16, 0));
  C.get();
  for (double c : C.h) CHECK(c == 3.0);
  // k = 0: C = beta C, A and B not read (null is fine).
  BLAS_OK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 0, &one, nullptr, 4, nullptr, 1, &two, C.d, 4));
  C.get();
  for (double c : C.h) CHECK(c == 6.0);
  // k = 0, beta = 0: C = 0 even where it held NaN.
  std::fill(C.h.begin(), C.h.end(), nan);
  C.put();
  BLAS_OK(cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 4, 0, &one, A.d, 1, B.d, 1, &zero, C.d, 4));
  C.get();
  for (double c : C.h) CHECK(c == 0.0);
  BLAS_OK(cublasDestroy(h));
}

template <class T> void strided_batched() {
  cublasHandle_t h = nullptr;
  BLAS_OK(cublasCreate(&h));
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const int m = 5, n = 4, k = 3;
  for (int batch : {1, 3})
    for (cublasOperation_t ta : ops)
      for (cublasOperation_t tb : ops) {
        const int rows_a = ta == CUBLAS_OP_N ? m : k, cols_a = ta == CUBLAS_OP_N ? k : m;
        const int rows_b = tb == CUBLAS_OP_N ? k : n, cols_b = tb == CUBLAS_OP_N ? n : k;
        const int lda = rows_a + 1, ldb = rows_b, ldc = m + 2;
        // Strides larger than each matrix: gaps (NaN in A and B, a sentinel in C) between them.
        const long long sa = lda * cols_a + 7, sb = ldb * cols_b + 3, sc = ldc * n + 5;
        dbuf<T> A(static_cast<std::size_t>(sa * batch)), B(static_cast<std::size_t>(sb * batch)),
            C(static_cast<std::size_t>(sc * batch));
        fill_values(A.h, 7);
        fill_values(B.h, 8);
        const T pad = T(-555);
        std::fill(C.h.begin(), C.h.end(), pad);
        for (int b = 0; b < batch; ++b) {
          for (long long i = lda * cols_a; i < sa; ++i) A.h[static_cast<std::size_t>(b * sa + i)] = nan;
          for (int j = 0; j < cols_a; ++j) A.h[static_cast<std::size_t>(b * sa + rows_a + j * lda)] = nan;
          for (long long i = ldb * cols_b; i < sb; ++i) B.h[static_cast<std::size_t>(b * sb + i)] = nan;
          for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) C.h[static_cast<std::size_t>(b * sc + i + j * ldc)] = nan; // beta = 0
        }
        A.put();
        B.put();
        C.put();
        const T alpha = T(1.5), beta = 0;
        BLAS_OK(gemm_batched(h, ta, tb, m, n, k, &alpha, A.d, lda, sa, B.d, ldb, sb, &beta, C.d, ldc, sc, batch));
        C.get();
        for (int b = 0; b < batch; ++b) {
          std::vector<double> want, scale;
          const std::size_t oa = static_cast<std::size_t>(b * sa), ob = static_cast<std::size_t>(b * sb),
                            oc = static_cast<std::size_t>(b * sc);
          reference(ta, tb, m, n, k, 1.5, A.h.data() + oa, lda, B.h.data() + ob, ldb, 0.0, C.h.data() + oc, ldc, want, scale);
          check_result(C.h.data() + oc, m, n, ldc, want, scale, pad,
                       "batch " + std::to_string(b) + " of " + std::to_string(batch));
          for (long long i = ldc * n; i < sc; ++i) CHECK(C.h[oc + static_cast<std::size_t>(i)] == pad); // the gap
        }
        // beta != 0 over the same batch: C = alpha op(A) op(B) + beta C, per matrix.
        std::vector<T> before = C.h;
        const T beta2 = T(-2);
        BLAS_OK(gemm_batched(h, ta, tb, m, n, k, &alpha, A.d, lda, sa, B.d, ldb, sb, &beta2, C.d, ldc, sc, batch));
        C.get();
        for (int b = 0; b < batch; ++b) {
          std::vector<double> want, scale;
          const std::size_t oa = static_cast<std::size_t>(b * sa), ob = static_cast<std::size_t>(b * sb),
                            oc = static_cast<std::size_t>(b * sc);
          reference(ta, tb, m, n, k, 1.5, A.h.data() + oa, lda, B.h.data() + ob, ldb, -2.0, before.data() + oc, ldc, want, scale);
          check_result(C.h.data() + oc, m, n, ldc, want, scale, pad, "beta -2, batch " + std::to_string(b));
        }
      }
  // Stride 0 for A: one A against three Bs.
  {
    dbuf<T> A(static_cast<std::size_t>(m * k)), B(static_cast<std::size_t>(k * n * 3)), C(static_cast<std::size_t>(m * n * 3));
    fill_values(A.h, 9);
    fill_values(B.h, 10);
    A.put();
    B.put();
    const T one = 1, zero = 0;
    BLAS_OK(gemm_batched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A.d, m, 0, B.d, k, k * n, &zero, C.d, m, m * n, 3));
    C.get();
    for (int b = 0; b < 3; ++b) {
      std::vector<double> want, scale;
      reference(CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, 1.0, A.h.data(), m, B.h.data() + b * k * n, k, 0.0,
                C.h.data() + b * m * n, m, want, scale);
      check_result(C.h.data() + b * m * n, m, n, m, want, scale, T{}, "stride 0, batch " + std::to_string(b));
    }
  }
  BLAS_OK(cublasDestroy(h));
}

TEST_CASE("cublasSgemmStridedBatched: batches of 1 and 3, strides larger than the matrices, stride 0") { strided_batched<float>(); }
TEST_CASE("cublasDgemmStridedBatched: batches of 1 and 3, strides larger than the matrices, stride 0") { strided_batched<double>(); }

TEST_CASE("invalid arguments: cuBLAS's CUBLAS_STATUS_INVALID_VALUE cases; ranges outside allocations") {
  cublasHandle_t h = nullptr;
  BLAS_OK(cublasCreate(&h));
  dbuf<float> A(64, 1.0f), B(64, 1.0f), C(64, 5.0f);
  const float one = 1, zero = 0;
  const auto N = CUBLAS_OP_N, T = CUBLAS_OP_T;
  const cublasStatus_t bad = CUBLAS_STATUS_INVALID_VALUE;
  // Negative sizes.
  CHECK(cublasSgemm(h, N, N, -1, 2, 2, &one, A.d, 2, B.d, 2, &zero, C.d, 2) == bad);
  CHECK(cublasSgemm(h, N, N, 2, -1, 2, &one, A.d, 2, B.d, 2, &zero, C.d, 2) == bad);
  CHECK(cublasSgemm(h, N, N, 2, 2, -1, &one, A.d, 2, B.d, 2, &zero, C.d, 2) == bad);
  CHECK(cublasSgemmStridedBatched(h, N, N, 2, 2, 2, &one, A.d, 2, 4, B.d, 2, 4, &zero, C.d, 2, 4, -1) == bad);
  // Unknown operations.
  CHECK(cublasSgemm(h, CUBLAS_OP_CONJG, N, 2, 2, 2, &one, A.d, 2, B.d, 2, &zero, C.d, 2) == bad);
  CHECK(cublasSgemm(h, N, CUBLAS_OP_CONJG, 2, 2, 2, &one, A.d, 2, B.d, 2, &zero, C.d, 2) == bad);
  // Leading dimensions: lda >= max(1, m) for N, max(1, k) for T; ldb >= max(1, k) for N, max(1, n) for T;
  // ldc >= max(1, m). Exactly the minimum passes.
  CHECK(cublasSgemm(h, N, N, 3, 2, 4, &one, A.d, 2, B.d, 4, &zero, C.d, 3) == bad);
  CHECK(cublasSgemm(h, N, N, 3, 2, 4, &one, A.d, 3, B.d, 4, &zero, C.d, 3) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemm(h, T, N, 3, 2, 4, &one, A.d, 3, B.d, 4, &zero, C.d, 3) == bad);
  CHECK(cublasSgemm(h, T, N, 3, 2, 4, &one, A.d, 4, B.d, 4, &zero, C.d, 3) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemm(h, N, N, 3, 2, 4, &one, A.d, 3, B.d, 3, &zero, C.d, 3) == bad);
  CHECK(cublasSgemm(h, N, T, 3, 2, 4, &one, A.d, 3, B.d, 1, &zero, C.d, 3) == bad);
  CHECK(cublasSgemm(h, N, T, 3, 2, 4, &one, A.d, 3, B.d, 2, &zero, C.d, 3) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemm(h, N, N, 3, 2, 4, &one, A.d, 3, B.d, 4, &zero, C.d, 2) == bad);
  // max(1, ...): a leading dimension of 0 is refused even with zero sizes.
  CHECK(cublasSgemm(h, N, N, 0, 2, 0, &one, A.d, 0, B.d, 1, &zero, C.d, 1) == bad);
  CHECK(cublasSgemm(h, N, N, 0, 2, 0, &one, A.d, 1, B.d, 1, &zero, C.d, 0) == bad);
  // Null alpha, beta, C.
  CHECK(cublasSgemm(h, N, N, 2, 2, 2, nullptr, A.d, 2, B.d, 2, &zero, C.d, 2) == bad);
  CHECK(cublasSgemm(h, N, N, 2, 2, 2, &one, A.d, 2, B.d, 2, nullptr, C.d, 2) == bad);
  CHECK(cublasSgemm(h, N, N, 2, 2, 2, &one, A.d, 2, B.d, 2, &zero, nullptr, 2) == bad);
  // The emulator's own check: matrices inside allocations (host memory, or one element past the end).
  std::vector<float> host(64);
  CHECK(cublasSgemm(h, N, N, 2, 2, 2, &one, host.data(), 2, B.d, 2, &zero, C.d, 2) == bad);
  CHECK(cublasSgemm(h, N, N, 8, 8, 8, &one, A.d, 8, B.d + 1, 8, &zero, C.d, 8) == bad);
  CHECK(cublasSgemm(h, N, N, 8, 8, 8, &one, A.d, 8, B.d, 8, &zero, C.d, 9) == bad);
  CHECK(cublasSgemm(h, N, N, 8, 8, 8, &one, A.d, 8, B.d, 8, &zero, C.d, 8) == CUBLAS_STATUS_SUCCESS); // exactly fits
  CHECK(cublasSgemmStridedBatched(h, N, N, 4, 4, 4, &one, A.d, 4, 16, B.d, 4, 16, &zero, C.d, 4, 16, 4) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemmStridedBatched(h, N, N, 4, 4, 4, &one, A.d, 4, 16, B.d, 4, 16, &zero, C.d, 4, 17, 4) == bad);
  CHECK(cublasSgemmStridedBatched(h, N, N, 4, 4, 4, &one, A.d + 48, 4, -16, B.d, 4, 16, &zero, C.d, 4, 16, 4) ==
        CUBLAS_STATUS_SUCCESS); // a negative stride, backwards inside A
  CHECK(cublasSgemmStridedBatched(h, N, N, 4, 4, 4, &one, A.d + 47, 4, -16, B.d, 4, 16, &zero, C.d, 4, 16, 4) == bad);
  CHECK(cublasSgemmStridedBatched(h, N, N, 4, 4, 4, &one, A.d, 4, 1LL << 62, B.d, 4, 16, &zero, C.d, 4, 16, 4) == bad);
  // Nothing refused above was enqueued: C holds what the accepted calls wrote (all ones products).
  EMU_OK(cudaDeviceSynchronize());
  // A GEMM on a stream the runtime refuses: CUBLAS_STATUS_EXECUTION_FAILED, the CUDA error left behind.
  cudaStream_t s = nullptr;
  EMU_OK(cudaStreamCreate(&s));
  EMU_OK(cudaStreamDestroy(s));
  (void)cudaGetLastError();
  BLAS_OK(cublasSetStream(h, s));
  CHECK(cublasSgemm(h, N, N, 2, 2, 2, &one, A.d, 2, B.d, 2, &zero, C.d, 2) == CUBLAS_STATUS_EXECUTION_FAILED);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  BLAS_OK(cublasDestroy(h));
}

// ---- stream order ---------------------------------------------------------------------------------

struct writer {
  float* a = nullptr;
  float* b = nullptr;
  int n = 0;
  std::chrono::milliseconds delay{0};
  std::atomic<int> done{0};
};
// Sleeps, then writes A = 2 and B = 3 everywhere (emulated device memory is host memory).
void write_inputs(void* p) {
  auto* w = static_cast<writer*>(p);
  std::this_thread::sleep_for(w->delay);
  for (int i = 0; i < w->n; ++i) {
    w->a[i] = 2;
    w->b[i] = 3;
  }
  w->done.store(1);
}

// Enqueues write_inputs on s: after `delay`, A (n elements at a) = 2 and B = 3.
void launch_writer(writer& w, cudaStream_t s, float* a, float* b, int n, std::chrono::milliseconds delay) {
  w.a = a;
  w.b = b;
  w.n = n;
  w.delay = delay;
  EMU_OK(cudaLaunchHostFunc(s, &write_inputs, &w));
}

cudaStream_t nonblocking_stream() {
  cudaStream_t s = nullptr;
  EMU_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// A new handle whose GEMMs go to s.
cublasHandle_t handle_on(cudaStream_t s) {
  cublasHandle_t h = nullptr;
  BLAS_OK(cublasCreate(&h));
  BLAS_OK(cublasSetStream(h, s));
  return h;
}

// How many entries of v are not exactly `want` (0 when the GEMM wrote the right value everywhere).
template <class T> int count_not(const std::vector<T>& v, T want) {
  int wrong = 0;
  for (T x : v) wrong += x != want;
  return wrong;
}

// A non-blocking stream s and a handle h on it; n x n floats A = B = 0 and C = -1; on s a host function
// that after `delay` sets A = 2 and B = 3, and behind it C = A B (cublasSgemm, N N). The tests below
// check what that GEMM saw and when it ran; each destroys h and s itself.
struct gemm_behind_writer {
  int n;
  cudaStream_t s = nonblocking_stream();
  cublasHandle_t h = handle_on(s);
  dbuf<float> A, B, C;
  writer w;
  gemm_behind_writer(int n_, std::chrono::milliseconds delay) : n(n_), A(n * n, 0.0f), B(n * n, 0.0f), C(n * n, -1.0f) {
    launch_writer(w, s, A.d, B.d, n * n, delay);
    const float one = 1, zero = 0;
    BLAS_OK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A.d, n, B.d, n, &zero, C.d, n));
  }
};

TEST_CASE("stream order: a GEMM behind a slow host function on the same stream reads what the host function wrote") {
  gemm_behind_writer g(32, 200ms);
  CHECK(cudaStreamQuery(g.s) == cudaErrorNotReady); // the call returned before the work ran
  CHECK(g.w.done.load() == 0);
  EMU_OK(cudaStreamSynchronize(g.s));
  CHECK(g.w.done.load() == 1);
  g.C.get();
  CHECK(count_not(g.C.h, 2.0f * 3.0f * static_cast<float>(g.n)) == 0);
  BLAS_OK(cublasDestroy(g.h));
  EMU_OK(cudaStreamDestroy(g.s));
}

TEST_CASE("stream order: a GEMM on the legacy default stream waits for a blocking stream's earlier work") {
  const int n = 16;
  cudaStream_t s = nullptr;
  EMU_OK(cudaStreamCreate(&s)); // blocking
  cublasHandle_t h = nullptr;
  BLAS_OK(cublasCreate(&h)); // the legacy default stream
  dbuf<double> A(n * n, 0.0), B(n * n, 0.0), C(n * n, -1.0);
  std::vector<float> a(n * n), b(n * n); // the writer writes floats: staging areas, copied below
  writer w;
  launch_writer(w, s, a.data(), b.data(), n * n, 150ms);
  // The GEMM goes to the legacy stream, which waits for s; it reads A and B, which s's host function
  // fills through a kernel-free path: a host function after it on s copies a, b into A, B.
  struct copy_in {
    const float* a;
    const float* b;
    double* A;
    double* B;
    int n;
    static void run(void* p) {
      auto* c = static_cast<copy_in*>(p);
      for (int i = 0; i < c->n; ++i) {
        c->A[i] = c->a[i];
        c->B[i] = c->b[i];
      }
    }
  } ci{a.data(), b.data(), A.d, B.d, n * n};
  EMU_OK(cudaLaunchHostFunc(s, &copy_in::run, &ci));
  const double one = 1, zero = 0;
  BLAS_OK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, n, n, n, &one, A.d, n, B.d, n, &zero, C.d, n));
  CHECK(w.done.load() == 0);
  C.get(); // cudaMemcpy on the legacy stream: after the GEMM
  CHECK(w.done.load() == 1);
  CHECK(count_not(C.h, 6.0 * n) == 0);
  BLAS_OK(cublasDestroy(h));
  EMU_OK(cudaStreamDestroy(s));
}

TEST_CASE("two handles on two streams: each GEMM in its own stream's order, both results right") {
  const int n = 24;
  cudaStream_t s1 = nonblocking_stream(), s2 = nonblocking_stream();
  cublasHandle_t h1 = handle_on(s1), h2 = handle_on(s2);
  dbuf<float> A1(n * n, 0.0f), B1(n * n, 0.0f), C1(n * n, -1.0f);
  dbuf<float> A2(n * n, 1.0f), B2(n * n, 1.0f), C2(n * n, -1.0f);
  writer w;
  launch_writer(w, s1, A1.d, B1.d, n * n, 200ms);
  const float one = 1, zero = 0, half = 0.5f;
  BLAS_OK(cublasSgemm(h1, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A1.d, n, B1.d, n, &zero, C1.d, n));
  BLAS_OK(cublasSgemm(h2, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &half, A2.d, n, B2.d, n, &zero, C2.d, n));
  // s2 does not wait for s1's slow host function.
  EMU_OK(cudaStreamSynchronize(s2));
  CHECK(w.done.load() == 0);
  C2.get();
  CHECK(count_not(C2.h, 0.5f * n) == 0);
  EMU_OK(cudaStreamSynchronize(s1));
  C1.get();
  CHECK(count_not(C1.h, 6.0f * n) == 0);
  BLAS_OK(cublasDestroy(h1));
  BLAS_OK(cublasDestroy(h2));
  for (cudaStream_t s : {s1, s2}) EMU_OK(cudaStreamDestroy(s));
}

TEST_CASE("cublasDestroy synchronises the device: a GEMM enqueued before it has run when it returns") {
  gemm_behind_writer g(8, 100ms);
  BLAS_OK(cublasDestroy(g.h));
  CHECK(cudaStreamQuery(g.s) == cudaSuccess);
  EMU_OK(cudaStreamDestroy(g.s));
}

// ---- capture and device pointer mode --------------------------------------------------------------

TEST_CASE("stream capture: a captured GEMM runs at each replay on the inputs of that moment, not at capture") {
  const int n = 6;
  cudaStream_t s = nonblocking_stream();
  cublasHandle_t h = handle_on(s);
  dbuf<double> A(n * n, 1.0), B(n * n, 1.0), C(n * n, -1.0);
  double alpha = 1, zero = 0;
  EMU_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  BLAS_OK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A.d, n, B.d, n, &zero, C.d, n));
  cudaGraph_t g = nullptr;
  EMU_OK(cudaStreamEndCapture(s, &g));
  alpha = 100; // host pointer mode: the value at capture is the graph's
  C.get();
  for (double c : C.h) CHECK(c == -1.0); // not run by the capture
  cudaGraphExec_t x = nullptr;
  EMU_OK(cudaGraphInstantiate(&x, g, 0));
  EMU_OK(cudaGraphLaunch(x, s));
  EMU_OK(cudaStreamSynchronize(s));
  C.get();
  for (double c : C.h) CHECK(c == 1.0 * n);
  std::fill(A.h.begin(), A.h.end(), 3.0);
  A.put();
  EMU_OK(cudaGraphLaunch(x, s));
  EMU_OK(cudaStreamSynchronize(s));
  C.get();
  for (double c : C.h) CHECK(c == 3.0 * n);
  EMU_OK(cudaGraphExecDestroy(x));
  EMU_OK(cudaGraphDestroy(g));
  // Into an invalidated capture: CUBLAS_STATUS_EXECUTION_FAILED.
  EMU_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported); // invalidates it
  CHECK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, A.d, n, B.d, n, &zero, C.d, n) ==
        CUBLAS_STATUS_EXECUTION_FAILED);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  BLAS_OK(cublasDestroy(h));
  EMU_OK(cudaStreamDestroy(s));
}

TEST_CASE("device pointer mode: alpha and beta are read from device memory when the GEMM runs") {
  const int n = 4;
  cudaStream_t s = nonblocking_stream();
  cublasHandle_t h = handle_on(s);
  BLAS_OK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));
  dbuf<float> A(n * n, 1.0f), B(n * n, 1.0f), C(n * n, 10.0f), scalars(2, 0.0f);
  // alpha and beta are still 0 when the GEMM is enqueued; the host function ahead of it sets them.
  struct setter {
    float* s;
    static void run(void* p) {
      auto* x = static_cast<setter*>(p);
      std::this_thread::sleep_for(50ms);
      x->s[0] = 2;
      x->s[1] = 0.5f;
    }
  } st{scalars.d};
  EMU_OK(cudaLaunchHostFunc(s, &setter::run, &st));
  BLAS_OK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, scalars.d, A.d, n, B.d, n, scalars.d + 1, C.d, n));
  EMU_OK(cudaStreamSynchronize(s));
  C.get();
  for (float c : C.h) CHECK(c == 2.0f * n + 5.0f);
  // Host scalars in device mode: outside every allocation, refused.
  const float one = 1;
  CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A.d, n, B.d, n, &one, C.d, n) == CUBLAS_STATUS_INVALID_VALUE);
  BLAS_OK(cublasDestroy(h));
  EMU_OK(cudaStreamDestroy(s));
}

} // namespace
