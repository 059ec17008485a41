// braid/emu/runtime.hpp — the emulated CUDA runtime: the runtime calls braid makes, with CUDA's names,
// CUDA's semantics where braid relies on them, and CUDA's error codes where CUDA refuses. Host code
// compiled by g++ with BRAID_CUDA_EMULATOR includes this instead of <cuda_runtime.h> (through
// braid/cuda/runtime.cuh); kernels are launched with braid::emu::launch (through braid::gpu::launch).
//
// The machine (docs/architecture.md, "The emulated CUDA device"): BRAID_EMU_DEVICES devices (default
// 2), each with BRAID_EMU_SMS streaming multiprocessors (default 16) of 2048 threads and 32 blocks,
// blocks of up to 1024 threads, 16 GiB of memory each (counted, not reserved), peer access possible
// between any two devices, compute capability 9.0, unified addressing.
//
// What is emulated as CUDA specifies it: streams as in-order queues and the legacy default stream's
// implicit synchronisation; which copies return before they are done (a cudaMemcpy from pageable host
// memory to the device returns once the source is staged, device-to-device copies and cudaMemset
// return at once); host functions on streams (cudaLaunchHostFunc); events; stream capture into graphs
// (kernels, copies, fills and host functions), instantiation and replay; CUDA IPC between real
// processes, refused in the exporting process; CUDA_LAUNCH_BLOCKING=1.
// Bad input (a range outside any allocation, a stale handle, a parameter the emulator does not
// implement) returns CUDA's error code and says what was wrong on stderr (BRAID_EMU_QUIET=1 silences
// it). Not modelled: registers and shared memory in occupancy, kernel faults as errors (a bad access
// in a kernel crashes the process), peer-access checks on loads inside kernels, any timing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "exec.hpp"
#include "memory.hpp"
#include "state.hpp"
#include "types.hpp"

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

#define BRAID_EMU_ENTER()                                                                         \
  do {                                                                                            \
    ++::braid::emu::detail::tls_runtime_calls;                                                    \
    if (!::braid::emu::detail::rt().usable()) return ::braid::emu::detail::fail(cudaErrorInitializationError); \
  } while (0)

} // namespace braid::emu::detail

namespace braid::emu {
// The number of runtime calls (kernel launches included) the calling thread has made so far. A call
// made by another runtime call (cudaMemset through cudaMemsetAsync) counts as well.
inline std::uint64_t runtime_calls() noexcept { return detail::tls_runtime_calls; }
// Of runtime_calls(), the polls of an event or a stream (cudaEventQuery, cudaStreamQuery).
inline std::uint64_t runtime_polls() noexcept { return detail::tls_runtime_polls; }
} // namespace braid::emu

namespace braid::emu {

// Launches `kernel` on `grid` blocks of `block` threads on `stream` (stream-ordered, like <<<>>>):
// the emulated side of braid::gpu::launch. Returns what cudaGetLastError would after a launch.
// A cooperative launch (cudaLaunchCooperativeKernel): refused with cudaErrorCooperativeLaunchTooLarge
// when the grid cannot be resident all at once on an idle device; otherwise its blocks start only
// together, when the device has room for all of them.
template <class... P, class... A>
cudaError_t launch_as(bool cooperative, void (*kernel)(P...), unsigned grid, unsigned block, std::size_t shared_bytes,
                      cudaStream_t stream, A&&... args) {
  using namespace detail;
  static_assert(sizeof...(P) == sizeof...(A), "braid::emu::launch: the arguments do not match the kernel's parameters");
  BRAID_EMU_ENTER();
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

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define BRAID_EMU_NAME(x) \
  case x: return #x;
    BRAID_EMU_NAME(cudaSuccess)
    BRAID_EMU_NAME(cudaErrorInvalidValue)
    BRAID_EMU_NAME(cudaErrorMemoryAllocation)
    BRAID_EMU_NAME(cudaErrorInitializationError)
    BRAID_EMU_NAME(cudaErrorCudartUnloading)
    BRAID_EMU_NAME(cudaErrorInvalidConfiguration)
    BRAID_EMU_NAME(cudaErrorInvalidPitchValue)
    BRAID_EMU_NAME(cudaErrorInvalidDevicePointer)
    BRAID_EMU_NAME(cudaErrorInvalidMemcpyDirection)
    BRAID_EMU_NAME(cudaErrorInsufficientDriver)
    BRAID_EMU_NAME(cudaErrorInvalidDeviceFunction)
    BRAID_EMU_NAME(cudaErrorNoDevice)
    BRAID_EMU_NAME(cudaErrorInvalidDevice)
    BRAID_EMU_NAME(cudaErrorDeviceUninitialized)
    BRAID_EMU_NAME(cudaErrorMapBufferObjectFailed)
    BRAID_EMU_NAME(cudaErrorAlreadyMapped)
    BRAID_EMU_NAME(cudaErrorNotMapped)
    BRAID_EMU_NAME(cudaErrorPeerAccessUnsupported)
    BRAID_EMU_NAME(cudaErrorOperatingSystem)
    BRAID_EMU_NAME(cudaErrorInvalidResourceHandle)
    BRAID_EMU_NAME(cudaErrorIllegalState)
    BRAID_EMU_NAME(cudaErrorSymbolNotFound)
    BRAID_EMU_NAME(cudaErrorNotReady)
    BRAID_EMU_NAME(cudaErrorIllegalAddress)
    BRAID_EMU_NAME(cudaErrorLaunchOutOfResources)
    BRAID_EMU_NAME(cudaErrorPeerAccessAlreadyEnabled)
    BRAID_EMU_NAME(cudaErrorPeerAccessNotEnabled)
    BRAID_EMU_NAME(cudaErrorContextIsDestroyed)
    BRAID_EMU_NAME(cudaErrorTooManyPeers)
    BRAID_EMU_NAME(cudaErrorHostMemoryAlreadyRegistered)
    BRAID_EMU_NAME(cudaErrorHostMemoryNotRegistered)
    BRAID_EMU_NAME(cudaErrorLaunchFailure)
    BRAID_EMU_NAME(cudaErrorCooperativeLaunchTooLarge)
    BRAID_EMU_NAME(cudaErrorNotSupported)
    BRAID_EMU_NAME(cudaErrorStreamCaptureUnsupported)
    BRAID_EMU_NAME(cudaErrorStreamCaptureInvalidated)
    BRAID_EMU_NAME(cudaErrorStreamCaptureUnmatched)
    BRAID_EMU_NAME(cudaErrorStreamCaptureImplicit)
    BRAID_EMU_NAME(cudaErrorStreamCaptureWrongThread)
    BRAID_EMU_NAME(cudaErrorUnknown)
#undef BRAID_EMU_NAME
  }
  return "cudaErrorUnknown";
}

inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInitializationError: return "initialization error (the emulated runtime was started before fork())";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidPitchValue: return "invalid pitch argument";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorDeviceUninitialized: return "invalid device context";
  case cudaErrorMapBufferObjectFailed: return "mapping of buffer object failed";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
  case cudaErrorPeerAccessNotEnabled: return "peer access has not been enabled";
  case cudaErrorNotSupported: return "operation not supported";
  case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
  case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
  case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
  case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
  case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
  default: return "an error the emulated runtime names in cudaGetErrorName";
  }
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

// ---- memory -------------------------------------------------------------------------------------

namespace braid::emu::detail {
// Allocation and freeing are among the calls a stream capture prohibits (global mode from any thread,
// thread-local mode from the capturing thread): refused, and the capture is invalidated.
inline bool refused_by_capture(const char* call) {
  if (!rt().prohibits_sync_here()) return false;
  diag(call, "not permitted while a stream capture is in progress (the capture is now invalid)");
  return true;
}
} // namespace braid::emu::detail

inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (refused_by_capture("cudaMalloc")) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (bytes > device_memory_bytes || rt().memory().device_bytes(tls_device) + bytes > device_memory_bytes)
    return fail(cudaErrorMemoryAllocation);
  void* m = rt().memory().alloc_device(tls_device, bytes, rt().poison());
  if (!m) return fail(cudaErrorMemoryAllocation);
  *p = m;
  return cudaSuccess;
}
template <class T> inline cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}

inline cudaError_t cudaMallocManaged(void** p, std::size_t bytes, unsigned flags = cudaMemAttachGlobal) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (refused_by_capture("cudaMallocManaged")) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p || flags != cudaMemAttachGlobal) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* m = rt().memory().alloc_private(mem_kind::managed, bytes, 0);
  if (!m) return fail(cudaErrorMemoryAllocation);
  *p = m;
  return cudaSuccess;
}
template <class T> inline cudaError_t cudaMallocManaged(T** p, std::size_t bytes, unsigned flags = cudaMemAttachGlobal) {
  return cudaMallocManaged(reinterpret_cast<void**>(p), bytes, flags);
}

// Frees device or managed memory; waits for the device's work first (cudaFree synchronises).
// Stream-ordered pool memory: allocated at once (a valid order), freed when the stream reaches the
// free. Marked as pool memory: not exportable over IPC, not legacy-IPC capable (cuPointerGetAttribute),
// as CUDA's pools are; peer access to it is not enforced here (nor is any peer access).
inline cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t stream) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!p) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for("cudaMallocAsync", stream, s)) return fail(e);
  if (s->capture) {
    invalidate_capture(*s);
    diag("cudaMallocAsync", "allocation nodes in a capture are not emulated");
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (bytes == 0) return cudaSuccess;
  const int dev = s->legacy ? tls_device : s->device;
  if (bytes > device_memory_bytes || rt().memory().device_bytes(dev) + bytes > device_memory_bytes)
    return fail(cudaErrorMemoryAllocation);
  void* m = rt().memory().alloc_device(dev, bytes, rt().poison(), true);
  if (!m) return fail(cudaErrorMemoryAllocation);
  *p = m;
  return cudaSuccess;
}
template <class T> inline cudaError_t cudaMallocAsync(T** p, std::size_t bytes, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(p), bytes, stream);
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!p) return cudaSuccess;
  allocation a;
  if (!rt().memory().find(p, 0, a) || a.base != reinterpret_cast<std::uintptr_t>(p) || a.kind != mem_kind::device) {
    diag("cudaFreeAsync", hex(p) + " is not the start of a device allocation");
    return fail(cudaErrorInvalidValue);
  }
  return fail(submit("cudaFreeAsync", stream, [p] { rt().memory().free_base(p, mem_kind::device); }));
}

inline cudaError_t cudaFree(void* p) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (refused_by_capture("cudaFree")) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p) return cudaSuccess;
  allocation a;
  if (!rt().memory().find(p, 0, a) || a.base != reinterpret_cast<std::uintptr_t>(p) ||
      (a.kind != mem_kind::device && a.kind != mem_kind::managed)) {
    diag("cudaFree", hex(p) + " is not the start of a device or managed allocation" +
                         (a.kind == mem_kind::imported ? " (memory opened with cudaIpcOpenMemHandle is closed with cudaIpcCloseMemHandle)" : ""));
    return fail(cudaErrorInvalidValue);
  }
  for (int d = 0; d < rt().device_count(); ++d)
    if (a.kind == mem_kind::managed || d == a.device)
      for (auto& s : rt().streams_of(d)) s->wait_for(s->last_enqueued());
  rt().memory().free_base(p, a.kind);
  return cudaSuccess;
}

inline cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned flags) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (refused_by_capture("cudaHostAlloc")) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p || (flags & ~(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* m = rt().memory().alloc_private(mem_kind::host, bytes, flags);
  if (!m) return fail(cudaErrorMemoryAllocation);
  *p = m;
  return cudaSuccess;
}
template <class T> inline cudaError_t cudaHostAlloc(T** p, std::size_t bytes, unsigned flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(p), bytes, flags);
}
inline cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocDefault); }

inline cudaError_t cudaFreeHost(void* p) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (refused_by_capture("cudaFreeHost")) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p) return cudaSuccess;
  if (!rt().memory().free_base(p, mem_kind::host)) {
    diag("cudaFreeHost", hex(p) + " is not the start of pinned host memory from cudaHostAlloc/cudaMallocHost");
    return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

// Registers host memory the caller owns (for example shared memory several processes map) as pinned
// and, with cudaHostRegisterMapped, reachable from kernels at the same address.
inline cudaError_t cudaHostRegister(void* p, std::size_t bytes, unsigned flags) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (refused_by_capture("cudaHostRegister")) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p || bytes == 0 || (flags & ~(cudaHostRegisterPortable | cudaHostRegisterMapped))) return fail(cudaErrorInvalidValue);
  if (!rt().memory().register_host(p, bytes, flags)) {
    diag("cudaHostRegister", hex(p) + " overlaps memory the runtime knows already");
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  }
  return cudaSuccess;
}
inline cudaError_t cudaHostUnregister(void* p) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (refused_by_capture("cudaHostUnregister")) return fail(cudaErrorStreamCaptureUnsupported);
  if (!p || !rt().memory().unregister_host(p)) return fail(cudaErrorHostMemoryNotRegistered);
  return cudaSuccess;
}

inline cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned flags) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  allocation a;
  if (!d || flags != 0 || !rt().memory().find(h, 0, a) || a.kind != mem_kind::host || !(a.host_flags & cudaHostAllocMapped))
    return fail(cudaErrorInvalidValue);
  *d = h; // unified addressing: the same address on host and device
  return cudaSuccess;
}

inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* at, const void* p) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!at) return fail(cudaErrorInvalidValue);
  *at = cudaPointerAttributes{};
  at->device = -2;
  allocation a;
  if (!p || !rt().memory().find(p, 0, a)) {
    at->type = cudaMemoryTypeUnregistered;
    return cudaSuccess;
  }
  switch (a.kind) {
  case mem_kind::device:
  case mem_kind::imported:
    at->type = cudaMemoryTypeDevice;
    at->device = a.device;
    at->devicePointer = const_cast<void*>(p);
    break;
  case mem_kind::host:
    at->type = cudaMemoryTypeHost;
    at->device = tls_device;
    at->hostPointer = const_cast<void*>(p);
    at->devicePointer = (a.host_flags & cudaHostAllocMapped) ? const_cast<void*>(p) : nullptr;
    break;
  case mem_kind::managed:
    at->type = cudaMemoryTypeManaged;
    at->device = tls_device;
    at->hostPointer = at->devicePointer = const_cast<void*>(p);
    break;
  }
  return cudaSuccess;
}

// ---- copies and fills ---------------------------------------------------------------------------

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t stream = nullptr) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  side ds, ss;
  if (const cudaError_t e = check_copy("cudaMemcpyAsync", dst, bytes, src, bytes, kind, ds, ss)) return fail(e);
  if (bytes == 0) return cudaSuccess;
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for("cudaMemcpyAsync", stream, s)) return fail(e);
  std::function<void()> run;
  if (ss == side::pageable) { // staged now, as CUDA stages pageable sources
    if (s->capture) {
      invalidate_capture(*s);
      diag("cudaMemcpyAsync", "a copy from pageable host memory cannot be captured");
      return fail(cudaErrorStreamCaptureUnsupported);
    }
    run = staged_copy(dst, src, bytes);
  } else {
    run = [dst, src, bytes] { std::memmove(dst, src, bytes); };
  }
  cudaError_t err = cudaSuccess;
  if (captured(*s, graph_node{run}, err)) return fail(err);
  rt().enqueue(*s, std::move(run));
  return cudaSuccess;
}

// Synchronous copy on the legacy stream, with CUDA's exceptions: from pageable host memory to the
// device it returns once the source is staged; device to device it returns at once.
inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  side ds, ss;
  if (const cudaError_t e = check_copy("cudaMemcpy", dst, bytes, src, bytes, kind, ds, ss)) return fail(e);
  if (bytes == 0) return cudaSuccess;
  if (rt().prohibits_sync_here()) return fail(cudaErrorStreamCaptureImplicit);
  auto l = rt().legacy(tls_device);
  if (ds == side::device && ss == side::device) { // no host synchronisation
    rt().enqueue(*l, [dst, src, bytes] { std::memmove(dst, src, bytes); });
    return cudaSuccess;
  }
  if (ds == side::device && ss == side::pageable) {
    l->wait_for(l->last_enqueued()); // "a stream sync is performed before the copy is initiated"
    rt().enqueue(*l, staged_copy(dst, src, bytes));
    return cudaSuccess;
  }
  const std::uint64_t seq = rt().enqueue(*l, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  l->wait_for(seq);
  return cudaSuccess;
}

inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream = nullptr) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (bytes == 0) return cudaSuccess;
  allocation a;
  if (!p || !rt().memory().find(p, bytes, a)) {
    diag("cudaMemsetAsync", hex(p) + " + " + std::to_string(bytes) + " bytes is not inside one allocation of the runtime");
    return fail(cudaErrorInvalidValue);
  }
  return fail(submit("cudaMemsetAsync", stream, [p, value, bytes] { std::memset(p, value, bytes); }));
}

// A host function run by the stream's thread once the stream's earlier work is done; the stream's
// later work waits for it (CUDA: it must not call the CUDA API). Captured as a node like the others.
inline cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!fn) {
    diag("cudaLaunchHostFunc", "null function");
    return fail(cudaErrorInvalidValue);
  }
  return fail(submit("cudaLaunchHostFunc", stream, [fn, data] { fn(data); }));
}

// On the legacy stream: asynchronous for device memory, as CUDA's cudaMemset is; synchronous for
// pinned host and managed memory.
inline cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (rt().prohibits_sync_here()) return fail(cudaErrorStreamCaptureImplicit);
  if (const cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr)) return e;
  allocation a;
  if (bytes && rt().memory().find(p, bytes, a) && (a.kind == mem_kind::host || a.kind == mem_kind::managed)) {
    auto l = rt().legacy(tls_device);
    l->wait_for(l->last_enqueued());
  }
  return cudaSuccess;
}

inline cudaError_t cudaMemcpy2DAsync(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                                     std::size_t height, cudaMemcpyKind kind, cudaStream_t stream = nullptr) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch || dpitch > max_pitch_bytes || spitch > max_pitch_bytes) {
    diag("cudaMemcpy2DAsync", "width " + std::to_string(width) + " and pitches " + std::to_string(dpitch) + ", " +
                                  std::to_string(spitch) + " (width must not exceed a pitch, pitches at most cudaDevAttrMaxPitch)");
    return fail(cudaErrorInvalidPitchValue);
  }
  side ds, ss;
  const std::size_t dext = (height - 1) * dpitch + width, sext = (height - 1) * spitch + width;
  if (const cudaError_t e = check_copy("cudaMemcpy2DAsync", dst, dext, src, sext, kind, ds, ss)) return fail(e);
  if (ss == side::pageable) {
    diag("cudaMemcpy2DAsync", "copies from pageable host memory are not emulated for 2D copies");
    return fail(cudaErrorNotSupported);
  }
  return fail(submit("cudaMemcpy2DAsync", stream, [=] {
    for (std::size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  }));
}

// ---- streams ------------------------------------------------------------------------------------

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!s || (flags & ~cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
  *s = reinterpret_cast<cudaStream_t>(rt().create_stream(tls_device, flags).get());
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!rt().destroy_stream(s)) {
    diag("cudaStreamDestroy", "stream " + hex(s) + " is not a live stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for("cudaStreamSynchronize", stream, s)) return fail(e);
  if (s->capture) {
    invalidate_capture(*s);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  s->wait_for(s->last_enqueued());
  return cudaSuccess;
}

inline cudaError_t cudaStreamQuery(cudaStream_t stream) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  ++tls_runtime_polls;
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for("cudaStreamQuery", stream, s)) return fail(e);
  if (s->capture) {
    invalidate_capture(*s);
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  return s->done_through(s->last_enqueued()) ? cudaSuccess : cudaErrorNotReady;
}

// ---- events -------------------------------------------------------------------------------------

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!e || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming))) return fail(cudaErrorInvalidValue);
  *e = reinterpret_cast<cudaEvent_t>(rt().create_event(flags));
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!rt().destroy_event(reinterpret_cast<event_state*>(e))) {
    diag("cudaEventDestroy", "event " + hex(e) + " is not a live event");
    return fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream = nullptr) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) {
    diag("cudaEventRecord", "event " + hex(e) + " is not a live event");
    return fail(cudaErrorInvalidResourceHandle);
  }
  std::shared_ptr<stream_state> s;
  if (const cudaError_t err = stream_for("cudaEventRecord", stream, s)) return fail(err);
  if (s->capture) {
    invalidate_capture(*s);
    diag("cudaEventRecord", "recording an event into a capture is not emulated");
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  auto rec = std::make_shared<event_record>();
  rec->stream = s;
  rec->seq = rt().enqueue(*s, [rec] { rec->at_ns.store(now_ns()); });
  rt().set_record(ev, rec);
  return cudaSuccess;
}

inline cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t stream = nullptr, unsigned flags = 0) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (flags == cudaEventRecordDefault) return cudaEventRecord(e, stream);
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) return fail(cudaErrorInvalidResourceHandle);
  if (flags != cudaEventRecordExternal) return fail(cudaErrorInvalidValue);
  std::shared_ptr<stream_state> s;
  if (const cudaError_t err = stream_for("cudaEventRecordWithFlags", stream, s)) return fail(err);
  cudaError_t err = cudaSuccess;
  if (captured(*s, graph_node{{}, nullptr, ev}, err)) return fail(err);
  diag("cudaEventRecordWithFlags", "cudaEventRecordExternal is valid only during a stream capture");
  return fail(cudaErrorInvalidValue);
}

inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  ++tls_runtime_polls;
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) return fail(cudaErrorInvalidResourceHandle);
  auto rec = rt().record_of(ev);
  if (!rec) return cudaSuccess;
  return rec->stream->done_through(rec->seq) ? cudaSuccess : cudaErrorNotReady;
}

inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) return fail(cudaErrorInvalidResourceHandle);
  if (auto rec = rt().record_of(ev)) rec->stream->wait_for(rec->seq);
  return cudaSuccess;
}

// Milliseconds between two completed records: CPU time on the emulator, never a GPU timing.
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  auto *ea = reinterpret_cast<event_state*>(a), *eb = reinterpret_cast<event_state*>(b);
  if (!ms || !rt().live_event(ea) || !rt().live_event(eb)) return fail(cudaErrorInvalidResourceHandle);
  if ((ea->flags | eb->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  auto ra = rt().record_of(ea), rb = rt().record_of(eb);
  if (!ra || !rb) return fail(cudaErrorInvalidResourceHandle);
  if (!ra->stream->done_through(ra->seq) || !rb->stream->done_through(rb->seq)) return fail(cudaErrorNotReady);
  *ms = static_cast<float>(static_cast<double>(rb->at_ns.load() - ra->at_ns.load()) * 1e-6);
  return cudaSuccess;
}

inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned flags = 0) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  auto* ev = reinterpret_cast<event_state*>(e);
  if (!rt().live_event(ev)) return fail(cudaErrorInvalidResourceHandle);
  if (flags & ~cudaEventWaitExternal) return fail(cudaErrorInvalidValue);
  std::shared_ptr<stream_state> s;
  if (const cudaError_t err = stream_for("cudaStreamWaitEvent", stream, s)) return fail(err);
  if (flags & cudaEventWaitExternal) {
    cudaError_t err = cudaSuccess;
    if (captured(*s, graph_node{{}, ev, nullptr}, err)) return fail(err);
    diag("cudaStreamWaitEvent", "cudaEventWaitExternal is valid only during a stream capture");
    return fail(cudaErrorInvalidValue);
  }
  auto rec = rt().record_of(ev);
  if (!rec) return cudaSuccess;
  if (s->capture) {
    invalidate_capture(*s);
    diag("cudaStreamWaitEvent", "waiting for an event inside a capture is not emulated");
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  rt().enqueue(*s, {}, {dependency{rec->stream, rec->seq}});
  return cudaSuccess;
}

// ---- capture and graphs -------------------------------------------------------------------------

inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (stream == nullptr || stream == cudaStreamLegacy) return fail(cudaErrorStreamCaptureUnsupported);
  std::shared_ptr<stream_state> s;
  if (const cudaError_t e = stream_for("cudaStreamBeginCapture", stream, s)) return fail(e);
  std::lock_guard<std::mutex> lk(rt().lock());
  if (s->capture) return fail(cudaErrorIllegalState);
  auto* c = new capture_state;
  c->mode = mode;
  c->owner = std::this_thread::get_id();
  c->graph = new graph_state;
  s->capture = c;
  rt().captures().insert(c);
  return cudaSuccess;
}

inline cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* g) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!g) return fail(cudaErrorInvalidValue);
  *g = nullptr;
  std::shared_ptr<stream_state> s;
  if (stream == nullptr || stream == cudaStreamLegacy) return fail(cudaErrorIllegalState);
  s = rt().resolve(stream, tls_device);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lk(rt().lock());
  capture_state* c = s->capture;
  if (!c) return fail(cudaErrorIllegalState);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->owner != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  s->capture = nullptr;
  rt().captures().erase(c);
  const bool bad = c->invalidated;
  graph_state* graph = c->graph;
  delete c;
  if (bad) {
    delete graph;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  rt().graphs().insert(graph);
  *g = reinterpret_cast<cudaGraph_t>(graph);
  return cudaSuccess;
}

inline cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* st) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!st) return fail(cudaErrorInvalidValue);
  if (stream == nullptr || stream == cudaStreamLegacy) {
    std::lock_guard<std::mutex> lk(rt().lock());
    for (capture_state* c : rt().captures())
      if (c->mode == cudaStreamCaptureModeGlobal) return fail(cudaErrorStreamCaptureImplicit);
    *st = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  auto s = rt().resolve(stream, tls_device);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lk(rt().lock());
  *st = !s->capture ? cudaStreamCaptureStatusNone
                    : s->capture->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long flags = 0) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!e || flags != 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lk(rt().lock());
  auto* graph = reinterpret_cast<graph_state*>(g);
  if (!rt().graphs().count(graph)) return fail(cudaErrorInvalidResourceHandle);
  auto* x = new graph_exec_state;
  x->nodes = graph->nodes;
  rt().graph_execs().insert(x);
  *e = reinterpret_cast<cudaGraphExec_t>(x);
  return cudaSuccess;
}

inline cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t stream) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  std::vector<graph_node> nodes;
  {
    std::lock_guard<std::mutex> lk(rt().lock());
    auto* x = reinterpret_cast<graph_exec_state*>(e);
    if (!rt().graph_execs().count(x)) return fail(cudaErrorInvalidResourceHandle);
    nodes = x->nodes;
  }
  std::shared_ptr<stream_state> s;
  if (const cudaError_t err = stream_for("cudaGraphLaunch", stream, s)) return fail(err);
  if (s->capture) {
    invalidate_capture(*s);
    diag("cudaGraphLaunch", "launching a graph into a capture is not emulated");
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  // External event nodes take the events as they are now: a wait node waits for the record current at
  // this launch; a record node's record is this launch (complete when all of it is).
  std::vector<std::function<void()>> run;
  std::vector<event_state*> records;
  for (const graph_node& n : nodes) {
    if (n.wait || n.record) {
      event_state* ev = n.wait ? n.wait : n.record;
      if (!rt().live_event(ev)) {
        diag("cudaGraphLaunch", "the graph's external event " + hex(ev) + " was destroyed");
        return fail(cudaErrorInvalidResourceHandle);
      }
    }
    if (n.wait) {
      if (auto rec = rt().record_of(n.wait)) run.push_back([rec] { rec->stream->wait_for(rec->seq); });
    } else if (n.record) {
      records.push_back(n.record);
    } else {
      run.push_back(n.run);
    }
  }
  auto rec = std::make_shared<event_record>();
  rec->stream = s;
  rec->seq = rt().enqueue(*s, [run = std::move(run), rec] {
    for (const auto& f : run) f();
    rec->at_ns.store(now_ns());
  });
  for (event_state* ev : records) rt().set_record(ev, rec);
  return cudaSuccess;
}

inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  BRAID_EMU_ENTER();
  return braid::emu::detail::destroy_handle(braid::emu::detail::rt().graphs(), reinterpret_cast<braid::emu::detail::graph_state*>(g));
}

inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  BRAID_EMU_ENTER();
  return braid::emu::detail::destroy_handle(braid::emu::detail::rt().graph_execs(),
                                            reinterpret_cast<braid::emu::detail::graph_exec_state*>(e));
}

// ---- IPC ----------------------------------------------------------------------------------------

inline cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!h) return fail(cudaErrorInvalidValue);
  ipc_wire w{};
  if (!p || !rt().memory().export_handle(p, w)) {
    diag("cudaIpcGetMemHandle", hex(p) + " is not device memory from cudaMalloc (managed, host, pool and imported memory cannot be exported)");
    return fail(cudaErrorInvalidValue);
  }
  std::memcpy(h->reserved, &w, sizeof w);
  return cudaSuccess;
}

inline cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned flags) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!p || flags != cudaIpcMemLazyEnablePeerAccess) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  ipc_wire w{};
  std::memcpy(&w, h.reserved, sizeof w);
  switch (rt().memory().open_handle(w, tls_device, p)) {
  case memory_table::open_result::ok: break;
  case memory_table::open_result::own_process:
    diag("cudaIpcOpenMemHandle", "the handle was exported by this very process, and CUDA refuses to open it here");
    return fail(cudaErrorDeviceUninitialized);
  case memory_table::open_result::bad_handle:
    diag("cudaIpcOpenMemHandle", "not a memory handle from cudaIpcGetMemHandle");
    return fail(cudaErrorInvalidValue);
  case memory_table::open_result::gone:
    diag("cudaIpcOpenMemHandle", "the exporting process (pid " + std::to_string(w.pid) + ") or its allocation is gone");
    return fail(cudaErrorMapBufferObjectFailed);
  case memory_table::open_result::other_device:
    diag("cudaIpcOpenMemHandle", "this handle is already open in this process under another current device "
                                 "(CUDA allows one context per device to open it)");
    return fail(cudaErrorInvalidValue);
  }
  if (w.device != tls_device && w.device >= 0 && w.device < rt().device_count()) rt().enable_peer(tls_device, w.device);
  return cudaSuccess;
}

inline cudaError_t cudaIpcCloseMemHandle(void* p) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!rt().memory().close_handle(p)) {
    diag("cudaIpcCloseMemHandle", hex(p) + " is not a pointer cudaIpcOpenMemHandle returned (or it is closed already)");
    return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

// ---- driver entry points, occupancy, function attributes ----------------------------------------

inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version, unsigned long long flags,
                                                    cudaDriverEntryPointQueryResult* q = nullptr) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  (void)flags;
  if (!symbol || !fn) return fail(cudaErrorInvalidValue);
  *fn = nullptr;
  if (std::strcmp(symbol, "cuMemGetAddressRange") == 0 && version >= 3020) {
    *fn = reinterpret_cast<void*>(&mem_get_address_range);
    if (q) *q = cudaDriverEntryPointSuccess;
    return cudaSuccess;
  }
  if (std::strcmp(symbol, "cuPointerGetAttribute") == 0 && version >= 4000) {
    *fn = reinterpret_cast<void*>(&pointer_get_attribute);
    if (q) *q = cudaDriverEntryPointSuccess;
    return cudaSuccess;
  }
  diag("cudaGetDriverEntryPoint", std::string("driver symbol '") + symbol + "' is not emulated (only cuMemGetAddressRange and cuPointerGetAttribute)");
  if (q) *q = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
inline cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                           cudaDriverEntryPointQueryResult* q = nullptr) {
  return cudaGetDriverEntryPointByVersion(symbol, fn, CUDART_VERSION, flags, q);
}

template <class... P>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, void (*kernel)(P...), int block, std::size_t shared_bytes) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!n || !kernel || block <= 0) return fail(cudaErrorInvalidValue);
  *n = shared_bytes > (48u << 10) ? 0 : static_cast<int>(rt().shape().blocks_per_sm_for(static_cast<unsigned>(block)));
  return cudaSuccess;
}

template <class... P> inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, void (*kernel)(P...)) {
  using namespace braid::emu::detail;
  BRAID_EMU_ENTER();
  if (!a || !kernel) return fail(cudaErrorInvalidValue);
  *a = cudaFuncAttributes{};
  a->maxThreadsPerBlock = static_cast<int>(rt().shape().max_threads_per_block);
  a->ptxVersion = a->binaryVersion = 90;
  a->maxDynamicSharedSizeBytes = 48 << 10;
  return cudaSuccess;
}
