// braid/emu/runtime/memory.hpp — the emulated runtime's allocations, copies and fills.
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

#include "core.hpp"

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
  if (s->capture) return fail(refuse_in_capture(*s, "cudaMallocAsync", "allocation nodes in a capture are not emulated"));
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
    if (s->capture) return fail(refuse_in_capture(*s, "cudaMemcpyAsync", "a copy from pageable host memory cannot be captured"));
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
