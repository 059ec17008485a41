// braid/emu/cublas.hpp — an emulated cuBLAS subset for the emulated CUDA device: cuBLAS's names,
// signatures, enumerations and status values (as NVIDIA's cublas_api.h and cublas_v2.h define them),
// so that host code written against <cublas_v2.h> compiles unchanged with BRAID_CUDA_EMULATOR. The
// arithmetic is the system's CBLAS (OpenBLAS on Debian: libopenblas-dev; link it, as braid::nn does).
//
// What is here (docs/architecture.md, "The emulated cuBLAS subset"):
// - cublasStatus_t (every status cublas_api.h defines, same values), cublasOperation_t,
//   cublasPointerMode_t, cublasHandle_t; cublasGetStatusName, cublasGetStatusString;
// - cublasCreate, cublasDestroy, cublasSetStream, cublasGetStream, cublasSetPointerMode,
//   cublasGetPointerMode (the _v2 functions behind cublas_v2.h's macros, as in cuBLAS);
// - cublasSgemm, cublasDgemm, cublasSgemmStridedBatched, cublasDgemmStridedBatched: column-major,
//   cuBLAS's argument checks (CUBLAS_STATUS_INVALID_VALUE for m, n, k or batchCount < 0, an unknown
//   operation, lda/ldb/ldc below their minimum, null alpha or beta, null C), m or n or batchCount 0
//   returns at once, k 0 scales C by beta, beta 0 never reads C (NaNs in C do not propagate);
//   CUBLAS_OP_C is CUBLAS_OP_T for these real types.
// Stream order: a GEMM is an operation of the handle's stream, like a kernel: it runs on the stream's
// thread after the stream's earlier work (with the legacy default stream's implicit synchronisation),
// and under stream capture it is recorded as a graph node that each replay runs. Host-mode alpha and
// beta are read at the call (as cuBLAS does, captures included); device-mode ones when the GEMM runs.
// Stricter than cuBLAS, in the emulator's way: every matrix (and device-mode scalar) must lie inside
// one allocation of the emulated runtime (device, pinned or managed memory), else
// CUBLAS_STATUS_INVALID_VALUE and a sentence on stderr (a GPU would fault later instead); a null,
// destroyed or never-created handle gives CUBLAS_STATUS_NOT_INITIALIZED; a stream the runtime
// refuses (destroyed, another device's, a capture forbidding the legacy stream) gives
// CUBLAS_STATUS_EXECUTION_FAILED, with the CUDA error also left for cudaGetLastError.
// Not here: every other cuBLAS function (no BLAS-1/2, no gemmEx, no half types, no batched pointer
// arrays, no _64 variants, no math modes or workspaces), cublasLt, and any timing.
#pragma once

#include "runtime.hpp"

#if !__has_include(<cblas.h>)
#error "braid/emu/cublas.hpp needs cblas.h (Debian: apt-get install libopenblas-dev)"
#endif
#include <cblas.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

// ==== types and constants (cublas_api.h) ==========================================================

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
  CUBLAS_OP_HERMITAN = 2, // synonym of CUBLAS_OP_C
  CUBLAS_OP_CONJG = 3     // a placeholder in cuBLAS too: refused
} cublasOperation_t;

typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;

// cuBLAS only declares its context; the emulator's is this.
struct cublasContext {
  int device = 0;                 // current device at cublasCreate
  cudaStream_t stream = nullptr;  // the legacy default stream until cublasSetStream
  cublasPointerMode_t mode = CUBLAS_POINTER_MODE_HOST;
};
typedef struct cublasContext* cublasHandle_t;

// cublas_v2.h's names for the _v2 entry points.
#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasSetStream cublasSetStream_v2
#define cublasGetStream cublasGetStream_v2
#define cublasGetPointerMode cublasGetPointerMode_v2
#define cublasSetPointerMode cublasSetPointerMode_v2
#define cublasSgemm cublasSgemm_v2
#define cublasDgemm cublasDgemm_v2

namespace braid::emu::detail {

// The live handles (a call with any other is refused, as the emulator refuses stale CUDA handles).
struct cublas_handles {
  std::mutex m;
  std::set<const cublasContext*> live;
};
inline cublas_handles& cublas_live() {
  static auto* h = new cublas_handles; // never destroyed, like the runtime
  return *h;
}

// A copy of the handle's settings if it is live; else says so on stderr and returns false.
inline bool cublas_handle(const char* call, cublasHandle_t h, cublasContext& out) {
  {
    auto& l = cublas_live();
    std::lock_guard<std::mutex> lk(l.m);
    if (h && l.live.count(h)) {
      out = *h;
      return true;
    }
  }
  diag(call, "handle " + hex(h) + " is not a live cuBLAS handle (null, destroyed, or never created)");
  return false;
}

// cublasSet*: stores value in one setting of a live handle, under the lock so that a concurrent
// cublasDestroy cannot free it first. A non-empty `invalid` says why value is refused (after the
// handle is found live).
template <class V>
cublasStatus_t cublas_set(const char* call, cublasHandle_t h, V cublasContext::*field, V value,
                          const std::string& invalid = {}) {
  auto& l = cublas_live();
  std::lock_guard<std::mutex> lk(l.m);
  if (!h || !l.live.count(h)) {
    diag(call, "handle " + hex(h) + " is not a live cuBLAS handle (null, destroyed, or never created)");
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  if (!invalid.empty()) {
    diag(call, invalid);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  h->*field = value;
  return CUBLAS_STATUS_SUCCESS;
}

// cublasGet*: copies one setting of a live handle to *out; `what` names it in the null-pointer message.
template <class V>
cublasStatus_t cublas_get(const char* call, cublasHandle_t handle, V* out, V cublasContext::*field, const char* what) {
  cublasContext h;
  if (!cublas_handle(call, handle, h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!out) {
    diag(call, std::string("null ") + what + " pointer");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *out = h.*field;
  return CUBLAS_STATUS_SUCCESS;
}

inline const char* cublas_op_name(cublasOperation_t op) {
  switch (op) {
  case CUBLAS_OP_N: return "CUBLAS_OP_N";
  case CUBLAS_OP_T: return "CUBLAS_OP_T";
  case CUBLAS_OP_C: return "CUBLAS_OP_C";
  case CUBLAS_OP_CONJG: break;
  }
  return "an unknown cublasOperation_t";
}

// Whether the `rows` x `cols` column-major matrices at `p` with leading dimension `ld`, `batch` of
// them `stride` elements apart, lie inside one allocation; says which does not on stderr.
template <class T>
inline bool cublas_in_allocation(const char* call, const char* what, const T* p, long long rows, long long cols,
                                 long long ld, long long stride, long long batch) {
  if (!p) {
    diag(call, std::string(what) + " is a null pointer");
    return false;
  }
  long long extent = 0, span = 0, lo = 0, bytes = 0, lo_bytes = 0;
  const bool overflow = __builtin_mul_overflow(cols - 1, ld, &extent) || __builtin_add_overflow(extent, rows, &extent) ||
                        __builtin_mul_overflow(batch - 1, stride, &span);
  if (!overflow) {
    lo = span < 0 ? span : 0;
    const long long hi = span < 0 ? 0 : span;
    if (__builtin_add_overflow(hi - lo, extent, &bytes) ||
        __builtin_mul_overflow(bytes, static_cast<long long>(sizeof(T)), &bytes) ||
        __builtin_mul_overflow(lo, static_cast<long long>(sizeof(T)), &lo_bytes)) {
      bytes = -1;
    }
  }
  const std::string desc = std::string(what) + " at " + hex(p) + " (" + std::to_string(rows) + " x " + std::to_string(cols) +
                           ", leading dimension " + std::to_string(ld) +
                           (batch > 1 ? ", " + std::to_string(batch) + " of them " + std::to_string(stride) + " elements apart" : "") + ")";
  if (overflow || bytes < 0) {
    diag(call, desc + " spans more bytes than an address can count");
    return false;
  }
  const auto start = reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(lo_bytes); // lo_bytes <= 0: wraps back
  allocation a;
  if (!rt().memory().find(reinterpret_cast<const void*>(start), static_cast<std::size_t>(bytes), a)) {
    diag(call, desc + ": " + std::to_string(bytes) + " bytes from " + hex(reinterpret_cast<const void*>(start)) +
                   " are not inside one allocation of the emulated device");
    return false;
  }
  return true;
}

inline void cblas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a, int lda,
                       const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void cblas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* a, int lda,
                       const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasColMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Every GEMM entry point: checks as cuBLAS does, then enqueues the product(s) on the handle's stream.
template <class T>
inline cublasStatus_t cublas_gemm(const char* call, cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                  int m, int n, int k, const T* alpha, const T* A, int lda, long long strideA, const T* B,
                                  int ldb, long long strideB, const T* beta, T* C, int ldc, long long strideC, int batch) {
  if (!rt().usable()) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasContext h;
  if (!cublas_handle(call, handle, h)) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto invalid = [&](const std::string& what) {
    diag(call, what);
    return CUBLAS_STATUS_INVALID_VALUE;
  };
  for (const cublasOperation_t op : {transa, transb})
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C)
      return invalid("operation " + std::to_string(static_cast<int>(op)) + " is not CUBLAS_OP_N, CUBLAS_OP_T or CUBLAS_OP_C");
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return invalid("negative size: m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " + std::to_string(k) +
                   (batch != 1 ? ", batchCount " + std::to_string(batch) : ""));
  const int rows_a = transa == CUBLAS_OP_N ? m : k, cols_a = transa == CUBLAS_OP_N ? k : m;
  const int rows_b = transb == CUBLAS_OP_N ? k : n, cols_b = transb == CUBLAS_OP_N ? n : k;
  auto least = [](int rows) { return rows > 1 ? rows : 1; };
  if (lda < least(rows_a))
    return invalid("lda " + std::to_string(lda) + " is below max(1, " + std::to_string(rows_a) + ") for A with " +
                   cublas_op_name(transa));
  if (ldb < least(rows_b))
    return invalid("ldb " + std::to_string(ldb) + " is below max(1, " + std::to_string(rows_b) + ") for B with " +
                   cublas_op_name(transb));
  if (ldc < least(m)) return invalid("ldc " + std::to_string(ldc) + " is below max(1, m = " + std::to_string(m) + ")");
  if (!alpha || !beta) return invalid(std::string(!alpha ? "alpha" : "beta") + " is a null pointer");
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS; // nothing to compute, nothing launched

  const bool device_scalars = h.mode == CUBLAS_POINTER_MODE_DEVICE;
  if (device_scalars && (!cublas_in_allocation(call, "alpha (device pointer mode)", alpha, 1, 1, 1, 0, 1) ||
                         !cublas_in_allocation(call, "beta (device pointer mode)", beta, 1, 1, 1, 0, 1)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (k > 0 && (!cublas_in_allocation(call, "A", A, rows_a, cols_a, lda, strideA, batch) ||
                !cublas_in_allocation(call, "B", B, rows_b, cols_b, ldb, strideB, batch)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!cublas_in_allocation(call, "C", C, m, n, ldc, strideC, batch)) return CUBLAS_STATUS_INVALID_VALUE;

  std::shared_ptr<stream_state> s;
  cudaError_t e = stream_for(call, h.stream, s);
  if (e == cudaSuccess && !s->legacy && s->device != tls_device) {
    diag(call, "the handle's stream belongs to device " + std::to_string(s->device) + " and the current device is " +
                   std::to_string(tls_device) + " (CUDA refuses a launch into another device's stream)");
    e = cudaErrorInvalidResourceHandle;
  }
  if (e != cudaSuccess) {
    fail(e);
    diag(call, std::string("the GEMM could not be launched on the handle's stream: ") + cudaGetErrorName(e));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const CBLAS_TRANSPOSE ta = transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
  const CBLAS_TRANSPOSE tb = transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
  const T alpha_now = device_scalars ? T{} : *alpha, beta_now = device_scalars ? T{} : *beta;
  std::function<void()> run = [=] {
    const T al = device_scalars ? *alpha : alpha_now, be = device_scalars ? *beta : beta_now;
    for (long long i = 0; i < batch; ++i)
      cblas_gemm(ta, tb, m, n, k, al, k > 0 ? A + i * strideA : A, lda, k > 0 ? B + i * strideB : B, ldb, be, C + i * strideC, ldc);
  };
  if (captured(*s, graph_node{run}, e)) {
    if (e == cudaSuccess) return CUBLAS_STATUS_SUCCESS;
    fail(e);
    diag(call, std::string("the stream's capture was invalidated earlier: ") + cudaGetErrorName(e));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  rt().enqueue(*s, std::move(run));
  return CUBLAS_STATUS_SUCCESS;
}

} // namespace braid::emu::detail

// ==== the cuBLAS API ==============================================================================

namespace braid::emu::detail {
// Every status, with the sentence libcublas 13 gives.
inline constexpr status_text<cublasStatus_t> cublas_statuses[] = {
    BRAID_EMU_TEXT(CUBLAS_STATUS_SUCCESS, "success"),
    BRAID_EMU_TEXT(CUBLAS_STATUS_NOT_INITIALIZED, "the library was not initialized"),
    BRAID_EMU_TEXT(CUBLAS_STATUS_ALLOC_FAILED, "the resource allocation failed"),
    BRAID_EMU_TEXT(CUBLAS_STATUS_INVALID_VALUE, "an unsupported value or parameter was passed to the function"),
    BRAID_EMU_TEXT(CUBLAS_STATUS_ARCH_MISMATCH, "the function requires an architectural feature absent from the device"),
    BRAID_EMU_TEXT(CUBLAS_STATUS_MAPPING_ERROR, "an access to GPU memory space failed"),
    BRAID_EMU_TEXT(CUBLAS_STATUS_EXECUTION_FAILED, "the function failed to launch on the GPU"),
    BRAID_EMU_TEXT(CUBLAS_STATUS_INTERNAL_ERROR, "an internal operation failed"),
    BRAID_EMU_TEXT(CUBLAS_STATUS_NOT_SUPPORTED, "the requested functionality is not supported"),
    BRAID_EMU_TEXT(CUBLAS_STATUS_LICENSE_ERROR, "the license check failed"),
};
} // namespace braid::emu::detail

inline const char* cublasGetStatusName(cublasStatus_t status) {
  return braid::emu::detail::status_name(braid::emu::detail::cublas_statuses, status, "CUBLAS_STATUS_UNKNOWN");
}

inline const char* cublasGetStatusString(cublasStatus_t status) {
  return braid::emu::detail::status_sentence(braid::emu::detail::cublas_statuses, status, "unknown error");
}

// A handle on the current device, on its legacy default stream, host pointer mode.
inline cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  using namespace braid::emu::detail;
  if (!rt().usable()) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!handle) {
    diag("cublasCreate", "null handle pointer");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  auto* h = new cublasContext;
  h->device = tls_device;
  auto& l = cublas_live();
  std::lock_guard<std::mutex> lk(l.m);
  l.live.insert(h);
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

// As in cuBLAS, destroying a handle synchronises the device first (work already enqueued with the
// handle does not need it: each GEMM holds what it uses).
inline cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  using namespace braid::emu::detail;
  if (!rt().usable()) return CUBLAS_STATUS_NOT_INITIALIZED;
  {
    auto& l = cublas_live();
    std::lock_guard<std::mutex> lk(l.m);
    if (!handle || !l.live.erase(handle)) {
      diag("cublasDestroy", "handle " + hex(handle) + " is not a live cuBLAS handle (null, destroyed, or never created)");
      return CUBLAS_STATUS_NOT_INITIALIZED;
    }
  }
  const int device = handle->device;
  delete handle;
  int current = 0;
  (void)cudaGetDevice(&current);
  if (current != device) (void)cudaSetDevice(device);
  (void)cudaDeviceSynchronize();
  if (current != device) (void)cudaSetDevice(current);
  return CUBLAS_STATUS_SUCCESS;
}

// The stream the handle's later work goes to (0: the legacy default stream). Checked when a GEMM
// is enqueued, as cuBLAS launches there.
inline cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  return braid::emu::detail::cublas_set("cublasSetStream", handle, &cublasContext::stream, streamId);
}

inline cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
  return braid::emu::detail::cublas_get("cublasGetStream", handle, streamId, &cublasContext::stream, "stream");
}

inline cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  const bool known = mode == CUBLAS_POINTER_MODE_HOST || mode == CUBLAS_POINTER_MODE_DEVICE;
  return braid::emu::detail::cublas_set("cublasSetPointerMode", handle, &cublasContext::mode, mode,
                                        known ? "" : "unknown pointer mode " + std::to_string(static_cast<int>(mode)));
}

inline cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
  return braid::emu::detail::cublas_get("cublasGetPointerMode", handle, mode, &cublasContext::mode, "mode");
}

// C = alpha op(A) op(B) + beta C, column-major; op(A) is m x k, op(B) k x n, C m x n.
inline cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                     int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                                     const float* beta, float* C, int ldc) {
  return braid::emu::detail::cublas_gemm("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta,
                                         C, ldc, 0, 1);
}
inline cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                     int k, const double* alpha, const double* A, int lda, const double* B, int ldb,
                                     const double* beta, double* C, int ldc) {
  return braid::emu::detail::cublas_gemm("cublasDgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta,
                                         C, ldc, 0, 1);
}

// batchCount products, the i-th at A + i strideA, B + i strideB, C + i strideC (elements).
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                                int m, int n, int k, const float* alpha, const float* A, int lda,
                                                long long int strideA, const float* B, int ldb, long long int strideB,
                                                const float* beta, float* C, int ldc, long long int strideC, int batchCount) {
  return braid::emu::detail::cublas_gemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, lda, strideA,
                                         B, ldb, strideB, beta, C, ldc, strideC, batchCount);
}
inline cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                                int m, int n, int k, const double* alpha, const double* A, int lda,
                                                long long int strideA, const double* B, int ldb, long long int strideB,
                                                const double* beta, double* C, int ldc, long long int strideC, int batchCount) {
  return braid::emu::detail::cublas_gemm("cublasDgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, lda, strideA,
                                         B, ldb, strideB, beta, C, ldc, strideC, batchCount);
}
