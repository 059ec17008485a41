// braid/emu/runtime/core.hpp — the emulated runtime's machine (devices, streams, the per-thread
// error), its error names, and the device queries (braid/emu/runtime.hpp describes the whole).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../exec.hpp"
#include "../memory.hpp"
#include "../state.hpp"
#include "../types.hpp"

namespace braid::emu::detail {

inline constexpr std::size_t device_memory_bytes = std::size_t{16} << 30;
inline constexpr std::size_t max_pitch_bytes = std::size_t{2147483647};

inline void diag(const char* call, const std::string& what) {
  static const bool quiet = [] {
    const char* q = std::getenv("BRAID_EMU_QUIET");
    return q && q[0] == '1';
  }();
  if (!quiet) std::fprintf(stderr, "braid emulated CUDA device: %s: %s\n", call, what.c_str());
}

inline std::string hex(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

// Where a copy's side lives.
enum class side { pageable, pinned, device };

// False if [p, p + bytes) starts inside an allocation and runs past its end; else where it lives
// (memory the runtime did not hand out is pageable host memory).
inline bool classify(const void* p, std::size_t bytes, side& out) {
  allocation a;
  if (!rt().memory().find(p, bytes, a)) {
    allocation any;
    if (rt().memory().find(p, 0, any)) return false;
    out = side::pageable;
    return true;
  }
  out = a.kind == mem_kind::host ? side::pinned : side::device;
  return true;
}

// Checks the two sides of a copy (`dst_bytes` and `src_bytes` each: a 2D copy's extents differ)
// against its direction. Returns cudaSuccess or the error to give.
inline cudaError_t check_copy(const char* call, void* dst, std::size_t dst_bytes, const void* src, std::size_t src_bytes,
                              cudaMemcpyKind kind, side& ds, side& ss) {
  if (dst_bytes == 0) {
    ds = ss = side::pageable;
    return cudaSuccess;
  }
  if (!dst || !src) {
    diag(call, "null pointer");
    return cudaErrorInvalidValue;
  }
  if (!classify(dst, dst_bytes, ds)) {
    diag(call, "the destination " + hex(dst) + " + " + std::to_string(dst_bytes) + " bytes runs past the end of its allocation");
    return cudaErrorInvalidValue;
  }
  if (!classify(src, src_bytes, ss)) {
    diag(call, "the source " + hex(src) + " + " + std::to_string(src_bytes) + " bytes runs past the end of its allocation");
    return cudaErrorInvalidValue;
  }
  const bool dst_dev = ds == side::device, src_dev = ss == side::device;
  switch (kind) {
  case cudaMemcpyHostToHost: break;
  case cudaMemcpyDefault: break;
  case cudaMemcpyHostToDevice:
    if (!dst_dev && ds != side::pinned) {
      diag(call, "cudaMemcpyHostToDevice to " + hex(dst) + ", which is not device memory");
      return cudaErrorInvalidValue;
    }
    break;
  case cudaMemcpyDeviceToHost:
    if (!src_dev && ss != side::pinned) {
      diag(call, "cudaMemcpyDeviceToHost from " + hex(src) + ", which is not device memory");
      return cudaErrorInvalidValue;
    }
    break;
  case cudaMemcpyDeviceToDevice:
    if ((!dst_dev && ds != side::pinned) || (!src_dev && ss != side::pinned)) {
      diag(call, "cudaMemcpyDeviceToDevice between " + hex(dst) + " and " + hex(src) + ", not both device memory");
      return cudaErrorInvalidValue;
    }
    break;
  default: diag(call, "unknown cudaMemcpyKind " + std::to_string(static_cast<int>(kind))); return cudaErrorInvalidMemcpyDirection;
  }
  return cudaSuccess;
}

// Records `node` into the stream's capture if it has one; returns true if it did (or the capture
// was invalidated: then `err` says so).
inline bool captured(stream_state& s, const graph_node& node, cudaError_t& err) {
  std::lock_guard<std::mutex> lk(rt().lock());
  capture_state* c = s.capture;
  if (!c) return false;
  if (c->invalidated) {
    err = cudaErrorStreamCaptureInvalidated;
    return true;
  }
  c->graph->nodes.push_back(node);
  err = cudaSuccess;
  return true;
}

inline void invalidate_capture(stream_state& s) {
  std::lock_guard<std::mutex> lk(rt().lock());
  if (s.capture) s.capture->invalidated = true;
}

// A stream operation that cannot join a capture, called on a capturing stream: invalidates the
// capture, says why (where `why` is not null) and returns CUDA's error for it.
inline cudaError_t refuse_in_capture(stream_state& s, const char* call, const char* why) {
  invalidate_capture(s);
  if (why) diag(call, why);
  return cudaErrorStreamCaptureUnsupported;
}

// Common entry of a stream operation: the stream, or an error.
inline cudaError_t stream_for(const char* call, cudaStream_t h, std::shared_ptr<stream_state>& s) {
  if (h == cudaStreamPerThread) {
    diag(call, "the per-thread default stream is not emulated");
    return cudaErrorNotSupported;
  }
  s = rt().resolve(h, tls_device);
  if (!s) {
    diag(call, "stream " + hex(h) + " is not a live stream (destroyed, or never created)");
    return cudaErrorInvalidResourceHandle;
  }
  if (s->legacy && rt().prohibits_sync_here()) return cudaErrorStreamCaptureImplicit;
  return cudaSuccess;
}

// Enqueues (or captures) `run` on stream `h`.
inline cudaError_t submit(const char* call, cudaStream_t h, std::function<void()> run) {
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for(call, h, s)) return e;
  cudaError_t err = cudaSuccess;
  if (captured(*s, graph_node{run}, err)) return err;
  rt().enqueue(*s, std::move(run));
  return cudaSuccess;
}

// A copy from pageable host memory: the source is staged now (CUDA stages it before the call returns),
// the copy into `dst` runs when the stream reaches it.
inline std::function<void()> staged_copy(void* dst, const void* src, std::size_t bytes) {
  auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                             static_cast<const unsigned char*>(src) + bytes);
  return [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
}

// cudaGraphDestroy and cudaGraphExecDestroy: the handle must be live in `live`.
template <class H> inline cudaError_t destroy_handle(std::set<H*>& live, H* h) {
  {
    std::lock_guard<std::mutex> lk(rt().lock());
    if (!live.erase(h)) return fail(cudaErrorInvalidResourceHandle);
  }
  delete h; // a launch in flight holds its own copy of the nodes
  return cudaSuccess;
}

// The function cudaGetDriverEntryPoint hands out for "cuMemGetAddressRange" (CUresult: 0 success,
// 1 CUDA_ERROR_INVALID_VALUE).
inline int mem_get_address_range(unsigned long long* base, std::size_t* size, unsigned long long p) {
  allocation a;
  if (!rt().memory().find(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(p)), 0, a) ||
      a.base + a.size == static_cast<std::uintptr_t>(p))
    return 1;
  if (base) *base = a.base;
  if (size) *size = a.size;
  return 0;
}

// The function cudaGetDriverEntryPoint hands out for "cuPointerGetAttribute": only
// CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE (10) is emulated (CUresult 1 otherwise, and for a
// pointer outside every allocation).
inline int pointer_get_attribute(void* data, int attribute, unsigned long long p) {
  if (attribute != 10 || !data) return 1;
  allocation a;
  if (!rt().memory().find(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(p)), 0, a)) return 1;
  *static_cast<unsigned char*>(data) = a.kind == mem_kind::device && !a.pool; // a boolean
  return 0;
}

// One kernel launch, type-erased: the kernel and a copy of its arguments converted to the parameter
// types (each emulated thread calls the kernel with its own copy, as CUDA gives each thread its own
// parameters).
template <class... P> struct kernel_call {
  void (*kernel)(P...);
  std::tuple<std::decay_t<P>...> args;
  static void invoke(const void* self) {
    const auto& c = *static_cast<const kernel_call*>(self);
    std::apply([&](const auto&... a) { c.kernel(a...); }, c.args);
  }
};

// The runtime calls this thread has made (every entry point below that reaches the runtime, kernel
// launches included): what a collective costs on the host, counted (braid::emu::runtime_calls).
inline thread_local std::uint64_t tls_runtime_calls = 0;
// Of those, the polls (cudaEventQuery, cudaStreamQuery): how many a wait makes depends on timing.
inline thread_local std::uint64_t tls_runtime_polls = 0;

// Per entry point, the calls this thread makes while a braid::emu::runtime_call_log is open (the
// innermost one); null otherwise.
inline thread_local std::map<std::string_view, std::uint64_t>* tls_runtime_log = nullptr;

#define BRAID_EMU_ENTER_NAMED(name)                                                               \
  do {                                                                                            \
    ++::braid::emu::detail::tls_runtime_calls;                                                    \
    if (auto* braid_log_ = ::braid::emu::detail::tls_runtime_log) ++(*braid_log_)[name];          \
    if (!::braid::emu::detail::rt().usable()) return ::braid::emu::detail::fail(cudaErrorInitializationError); \
  } while (0)
#define BRAID_EMU_ENTER() BRAID_EMU_ENTER_NAMED(__func__)

} // namespace braid::emu::detail

namespace braid::emu {
// The number of runtime calls (kernel launches included) the calling thread has made so far. A call
// made by another runtime call (cudaMemset through cudaMemsetAsync) counts as well.
inline std::uint64_t runtime_calls() noexcept { return detail::tls_runtime_calls; }
// Of runtime_calls(), the polls of an event or a stream (cudaEventQuery, cudaStreamQuery).
inline std::uint64_t runtime_polls() noexcept { return detail::tls_runtime_polls; }

// While it lives, counts the calling thread's runtime calls per entry point, by CUDA's names (kernel
// launches as cudaLaunchKernel and cudaLaunchCooperativeKernel): which calls a collective makes, not
// only how many. Logs nest; a call counts in the innermost one only.
class runtime_call_log {
public:
  runtime_call_log() noexcept : outer_(detail::tls_runtime_log) { detail::tls_runtime_log = &counts_; }
  runtime_call_log(const runtime_call_log&) = delete;
  runtime_call_log& operator=(const runtime_call_log&) = delete;
  ~runtime_call_log() { detail::tls_runtime_log = outer_; }
  // Calls of entry point `name` so far.
  std::uint64_t count(std::string_view name) const {
    const auto it = counts_.find(name);
    return it == counts_.end() ? 0 : it->second;
  }
  // Every entry point called so far, with its count.
  const std::map<std::string_view, std::uint64_t>& counts() const noexcept { return counts_; }

private:
  std::map<std::string_view, std::uint64_t> counts_;
  std::map<std::string_view, std::uint64_t>* outer_;
};
} // namespace braid::emu

namespace braid::emu {

// Launches `kernel` on `grid` blocks of `block` threads on `stream` (stream-ordered, like <<<>>>):
// the emulated side of braid::cuda::device::launch. Returns what cudaGetLastError would after a launch.
// A cooperative launch (cudaLaunchCooperativeKernel): refused with cudaErrorCooperativeLaunchTooLarge
// when the grid cannot be resident all at once on an idle device; otherwise its blocks start only
// together, when the device has room for all of them.
template <class... P, class... A>
cudaError_t launch_as(bool cooperative, void (*kernel)(P...), unsigned grid, unsigned block, std::size_t shared_bytes,
                      cudaStream_t stream, A&&... args) {
  using namespace detail;
  static_assert(sizeof...(P) == sizeof...(A), "braid::emu::launch: the arguments do not match the kernel's parameters");
  BRAID_EMU_ENTER_NAMED(cooperative ? "cudaLaunchCooperativeKernel" : "cudaLaunchKernel");
  const machine_shape& m = rt().shape();
  if (grid == 0 || grid > 0x7fffffffu || block == 0 || block > m.max_threads_per_block || shared_bytes > (48u << 10)) {
    diag("kernel launch", "invalid configuration: " + std::to_string(grid) + " blocks of " + std::to_string(block) +
                              " threads, " + std::to_string(shared_bytes) + " bytes of dynamic shared memory");
    return fail(cudaErrorInvalidConfiguration);
  }
  if (cooperative && grid > m.blocks_per_sm_for(block) * m.sms) {
    diag("cooperative kernel launch", std::to_string(grid) + " blocks of " + std::to_string(block) + " threads cannot be resident at once (" +
                                          std::to_string(m.blocks_per_sm_for(block) * m.sms) + " at most)");
    return fail(cudaErrorCooperativeLaunchTooLarge);
  }
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for("kernel launch", stream, s)) return fail(e);
  if (!s->legacy && s->device != tls_device) {
    diag("kernel launch", "the stream belongs to device " + std::to_string(s->device) + " and the current device is " +
                              std::to_string(tls_device) + " (CUDA refuses a launch into another device's stream)");
    return fail(cudaErrorInvalidResourceHandle);
  }
  auto call = std::make_shared<kernel_call<P...>>(kernel_call<P...>{kernel, {std::forward<A>(args)...}});
  device_exec* dev = &rt().device(s->device);
  std::function<void()> run = [call, dev, grid, block, cooperative] {
    kernel_job j;
    j.invoke = &kernel_call<P...>::invoke;
    j.args = call;
    j.grid = grid;
    j.block = block;
    j.cooperative = cooperative;
    dev->execute(j);
  };
  cudaError_t err = cudaSuccess;
  if (captured(*s, graph_node{run}, err)) return fail(err);
  rt().enqueue(*s, std::move(run));
  return cudaSuccess;
}

template <class... P, class... A>
cudaError_t launch(void (*kernel)(P...), unsigned grid, unsigned block, std::size_t shared_bytes, cudaStream_t stream,
                   A&&... args) {
  return launch_as(false, kernel, grid, block, shared_bytes, stream, std::forward<A>(args)...);
}
template <class... P, class... A>
cudaError_t launch_cooperative(void (*kernel)(P...), unsigned grid, unsigned block, std::size_t shared_bytes,
                               cudaStream_t stream, A&&... args) {
  return launch_as(true, kernel, grid, block, shared_bytes, stream, std::forward<A>(args)...);
}

// Which runtime a binary runs on (for logs and test headers).
inline const char* device_kind() { return "emulated CUDA device (CPU threads; braid/emu)"; }

} // namespace braid::emu

// ==== the runtime API ============================================================================

inline cudaError_t cudaGetLastError() {
  const cudaError_t e = braid::emu::detail::tls_last_error;
  braid::emu::detail::tls_last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return braid::emu::detail::tls_last_error; }

namespace braid::emu::detail {
// An error or status code with its name and the sentence the library gives for it (null: the
// library's general sentence), for cudaGetErrorName/String and cublasGetStatusName/String.
template <class E> struct status_text {
  E code;
  const char* name;
  const char* sentence;
};
// A status_text row: `code`, named as it is spelled.
#define BRAID_EMU_TEXT(code, sentence) {code, #code, sentence}

// `code`'s row in `table`, or null.
template <class E, std::size_t N> const status_text<E>* status_row(const status_text<E> (&table)[N], E code) {
  for (const status_text<E>& t : table)
    if (t.code == code) return &t;
  return nullptr;
}
// `code`'s name in `table`, or `otherwise` where the table has no row for it.
template <class E, std::size_t N>
const char* status_name(const status_text<E> (&table)[N], E code, const char* otherwise) {
  const status_text<E>* t = status_row(table, code);
  return t ? t->name : otherwise;
}
// `code`'s sentence in `table`, or `otherwise` where the table has none for it.
template <class E, std::size_t N>
const char* status_sentence(const status_text<E> (&table)[N], E code, const char* otherwise) {
  const status_text<E>* t = status_row(table, code);
  return t && t->sentence ? t->sentence : otherwise;
}

// Every error the emulated runtime gives, with CUDA's sentence where the emulator has one.
inline constexpr status_text<cudaError_t> cuda_errors[] = {
    BRAID_EMU_TEXT(cudaSuccess, "no error"),
    BRAID_EMU_TEXT(cudaErrorInvalidValue, "invalid argument"),
    BRAID_EMU_TEXT(cudaErrorMemoryAllocation, "out of memory"),
    BRAID_EMU_TEXT(cudaErrorInitializationError, "initialization error (the emulated runtime was started before fork())"),
    BRAID_EMU_TEXT(cudaErrorCudartUnloading, nullptr),
    BRAID_EMU_TEXT(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    BRAID_EMU_TEXT(cudaErrorInvalidPitchValue, "invalid pitch argument"),
    BRAID_EMU_TEXT(cudaErrorInvalidDevicePointer, nullptr),
    BRAID_EMU_TEXT(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    BRAID_EMU_TEXT(cudaErrorInsufficientDriver, nullptr),
    BRAID_EMU_TEXT(cudaErrorInvalidDeviceFunction, nullptr),
    BRAID_EMU_TEXT(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    BRAID_EMU_TEXT(cudaErrorInvalidDevice, "invalid device ordinal"),
    BRAID_EMU_TEXT(cudaErrorDeviceUninitialized, "invalid device context"),
    BRAID_EMU_TEXT(cudaErrorMapBufferObjectFailed, "mapping of buffer object failed"),
    BRAID_EMU_TEXT(cudaErrorAlreadyMapped, nullptr),
    BRAID_EMU_TEXT(cudaErrorNotMapped, nullptr),
    BRAID_EMU_TEXT(cudaErrorPeerAccessUnsupported, nullptr),
    BRAID_EMU_TEXT(cudaErrorOperatingSystem, nullptr),
    BRAID_EMU_TEXT(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    BRAID_EMU_TEXT(cudaErrorIllegalState, nullptr),
    BRAID_EMU_TEXT(cudaErrorSymbolNotFound, nullptr),
    BRAID_EMU_TEXT(cudaErrorNotReady, "device not ready"),
    BRAID_EMU_TEXT(cudaErrorIllegalAddress, nullptr),
    BRAID_EMU_TEXT(cudaErrorLaunchOutOfResources, nullptr),
    BRAID_EMU_TEXT(cudaErrorPeerAccessAlreadyEnabled, "peer access is already enabled"),
    BRAID_EMU_TEXT(cudaErrorPeerAccessNotEnabled, "peer access has not been enabled"),
    BRAID_EMU_TEXT(cudaErrorContextIsDestroyed, nullptr),
    BRAID_EMU_TEXT(cudaErrorTooManyPeers, nullptr),
    BRAID_EMU_TEXT(cudaErrorHostMemoryAlreadyRegistered, nullptr),
    BRAID_EMU_TEXT(cudaErrorHostMemoryNotRegistered, nullptr),
    BRAID_EMU_TEXT(cudaErrorLaunchFailure, nullptr),
    BRAID_EMU_TEXT(cudaErrorCooperativeLaunchTooLarge, nullptr),
    BRAID_EMU_TEXT(cudaErrorNotSupported, "operation not supported"),
    BRAID_EMU_TEXT(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"),
    BRAID_EMU_TEXT(cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture"),
    BRAID_EMU_TEXT(cudaErrorStreamCaptureUnmatched, "capture was not initiated in this stream"),
    BRAID_EMU_TEXT(cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a capturing blocking stream"),
    BRAID_EMU_TEXT(cudaErrorStreamCaptureWrongThread, "attempt to terminate a thread-local capture sequence from another thread"),
    BRAID_EMU_TEXT(cudaErrorUnknown, nullptr),
};
} // namespace braid::emu::detail

inline const char* cudaGetErrorName(cudaError_t e) {
  return braid::emu::detail::status_name(braid::emu::detail::cuda_errors, e, "cudaErrorUnknown");
}

inline const char* cudaGetErrorString(cudaError_t e) {
  return braid::emu::detail::status_sentence(braid::emu::detail::cuda_errors, e,
                                             "an error the emulated runtime names in cudaGetErrorName");
}

inline cudaError_t cudaRuntimeGetVersion(int* v) {
  if (!v) return braid::emu::detail::fail(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}
inline cudaError_t cudaDriverGetVersion(int* v) {
  if (!v) return braid::emu::detail::fail(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

// ---- devices ------------------------------------------------------------------------------------

inline cudaError_t cudaGetDeviceCount(int* n) {
  BRAID_EMU_ENTER();
  if (!n) return braid::emu::detail::fail(cudaErrorInvalidValue);
  *n = braid::emu::detail::rt().device_count();
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
  BRAID_EMU_ENTER();
  if (!d) return braid::emu::detail::fail(cudaErrorInvalidValue);
  *d = braid::emu::detail::tls_device;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
  BRAID_EMU_ENTER();
  if (d < 0 || d >= braid::emu::detail::rt().device_count()) return braid::emu::detail::fail(cudaErrorInvalidDevice);
  braid::emu::detail::tls_device = d;
  return cudaSuccess;
}

inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!p) return fail(cudaErrorInvalidValue);
  if (d < 0 || d >= rt().device_count()) return fail(cudaErrorInvalidDevice);
  const machine_shape& m = rt().shape();
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "braid emulated CUDA device %d (CPU threads)", d);
  p->totalGlobalMem = device_memory_bytes;
  p->sharedMemPerBlock = 48 << 10;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->memPitch = max_pitch_bytes;
  p->maxThreadsPerBlock = static_cast<int>(m.max_threads_per_block);
  p->maxThreadsDim[0] = static_cast<int>(m.max_threads_per_block);
  p->maxThreadsDim[1] = p->maxThreadsDim[2] = 1;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = p->maxGridSize[2] = 1;
  p->clockRate = 0;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = static_cast<int>(m.sms);
  p->maxThreadsPerMultiProcessor = static_cast<int>(m.threads_per_sm);
  p->maxBlocksPerMultiProcessor = static_cast<int>(m.blocks_per_sm);
  p->concurrentKernels = 1;
  p->unifiedAddressing = 1;
  p->canMapHostMemory = 1;
  p->cooperativeLaunch = 0;
  p->pciBusID = d;
  return cudaSuccess;
}

inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int d) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!v) return fail(cudaErrorInvalidValue);
  if (d < 0 || d >= rt().device_count()) return fail(cudaErrorInvalidDevice);
  const machine_shape& m = rt().shape();
  switch (attr) {
  case cudaDevAttrMaxThreadsPerBlock:
  case cudaDevAttrMaxBlockDimX: *v = static_cast<int>(m.max_threads_per_block); return cudaSuccess;
  case cudaDevAttrMaxGridDimX: *v = 0x7fffffff; return cudaSuccess;
  case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 << 10; return cudaSuccess;
  case cudaDevAttrWarpSize: *v = 32; return cudaSuccess;
  case cudaDevAttrMaxPitch: *v = static_cast<int>(max_pitch_bytes); return cudaSuccess;
  case cudaDevAttrClockRate: *v = 0; return cudaSuccess;
  case cudaDevAttrMultiProcessorCount: *v = static_cast<int>(m.sms); return cudaSuccess;
  case cudaDevAttrCanMapHostMemory: *v = 1; return cudaSuccess;
  case cudaDevAttrConcurrentKernels: *v = 1; return cudaSuccess;
  case cudaDevAttrPciBusId: *v = d; return cudaSuccess;
  case cudaDevAttrL2CacheSize: *v = 0; return cudaSuccess;
  case cudaDevAttrMaxThreadsPerMultiProcessor: *v = static_cast<int>(m.threads_per_sm); return cudaSuccess;
  case cudaDevAttrUnifiedAddressing: *v = 1; return cudaSuccess;
  case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
  case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
  case cudaDevAttrHostNativeAtomicSupported: *v = 1; return cudaSuccess;
  case cudaDevAttrCooperativeLaunch: *v = 1; return cudaSuccess;
  case cudaDevAttrMaxBlocksPerMultiprocessor: *v = static_cast<int>(m.blocks_per_sm); return cudaSuccess;
  case cudaDevAttrMemoryPoolsSupported: *v = 0; return cudaSuccess;
  }
  diag("cudaDeviceGetAttribute", "attribute " + std::to_string(static_cast<int>(attr)) + " is not emulated");
  return fail(cudaErrorNotSupported);
}

inline cudaError_t cudaDeviceCanAccessPeer(int* ok, int d, int peer) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!ok) return fail(cudaErrorInvalidValue);
  const int n = rt().device_count();
  if (d < 0 || d >= n || peer < 0 || peer >= n) return fail(cudaErrorInvalidDevice);
  *ok = d != peer ? 1 : 0;
  return cudaSuccess;
}

inline cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (flags != 0) return fail(cudaErrorInvalidValue);
  if (peer < 0 || peer >= rt().device_count() || peer == tls_device) return fail(cudaErrorInvalidDevice);
  if (!rt().enable_peer(tls_device, peer)) return fail(cudaErrorPeerAccessAlreadyEnabled);
  return cudaSuccess;
}

inline cudaError_t cudaDeviceSynchronize() {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (rt().prohibits_sync_here()) return fail(cudaErrorStreamCaptureUnsupported);
  for (auto& s : rt().streams_of(tls_device)) s->wait_for(s->last_enqueued());
  return cudaSuccess;
}
