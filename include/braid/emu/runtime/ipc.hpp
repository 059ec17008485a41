// braid/emu/runtime/ipc.hpp — the emulated runtime's IPC handles, driver entry points, occupancy and function attributes.
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

#include "streams.hpp"

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
