// braid/cuda/process/ipc.cuh — CUDA IPC for process_communicator: which allocation a device pointer lies in,
// exporting a region (handle of the allocation's base plus an offset), and the peers' mappings, opened
// once per (peer, allocation) and closed before the memory they map can be freed.
#pragma once

#include "../runtime.cuh"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "../../core/error.hpp"
#include "../check.cuh"
#include "../device/signal.cuh"
#include "host_layout.hpp"

namespace braid::cuda {

namespace process {

inline constexpr int max_ranks = 64;

// The allocation a device pointer lies in (base and size), from the driver; raises unsupported for
// memory that is not ordinary device memory.
struct allocation {
  u64 base = 0;
  std::size_t size = 0;
};

inline allocation find_allocation(const void* p, const error_context& ctx) {
  cudaPointerAttributes at{};
  const cudaError_t e = cudaPointerGetAttributes(&at, p);
  if (e != cudaSuccess) cuda::detail::raise_cuda(e, "cudaPointerGetAttributes", __FILE__, __LINE__, ctx);
  if (at.type != cudaMemoryTypeDevice)
    raise(errc::unsupported,
          std::string("the buffer is ") + (at.type == cudaMemoryTypeManaged ? "managed memory" : at.type == cudaMemoryTypeHost ? "host memory" : "not CUDA memory") +
              ": only device memory (cudaMalloc) can be shared with other processes",
          ctx);
  using range_fn = int (*)(unsigned long long*, std::size_t*, unsigned long long);
  static const range_fn fn = reinterpret_cast<range_fn>(cuda::detail::driver_symbol("cuMemGetAddressRange"));
  if (!fn) raise(errc::unsupported, "the CUDA driver does not provide cuMemGetAddressRange", ctx);
  unsigned long long base = 0;
  std::size_t size = 0;
  if (const int rc = fn(&base, &size, reinterpret_cast<unsigned long long>(p)); rc != 0)
    raise(errc::cuda, "cuMemGetAddressRange failed (CUresult " + std::to_string(rc) + ") for a device pointer", ctx);
  return {base, size};
}

// What a rank tells its peers about one range of device memory it shares.
struct wire_region {
  cudaIpcMemHandle_t handle; // of the whole allocation
  u64 base;                  // the exporter's address of the allocation
  u64 offset;                // start of the shared range within it
  u64 bytes;                 // length of the shared range
  u64 process;               // a random token of the exporting process (pids repeat across namespaces)
  std::int32_t device;
  std::int32_t valid;
};
static_assert(std::is_trivially_copyable_v<wire_region>);

// A random 64-bit token of this process, drawn once: "same process" means the same token.
inline u64 process_token() {
  static const u64 token = [] {
    std::random_device rd;
    return (static_cast<u64>(rd()) << 32) ^ rd() ^ (static_cast<u64>(::getpid()) << 16);
  }();
  return token;
}

// Exports [p, p + bytes) (which must lie in one cudaMalloc allocation).
inline wire_region export_region(void* p, std::size_t bytes, int device, const error_context& ctx) {
  const allocation a = find_allocation(p, ctx);
  const u64 at = reinterpret_cast<u64>(p);
  if (at + bytes > a.base + a.size)
    raise(errc::invalid_argument,
          "the range of " + std::to_string(bytes) + " bytes runs past the end of its allocation (" +
              std::to_string(a.base + a.size - at) + " bytes left)",
          ctx);
  wire_region w{};
  const cudaError_t e = cudaIpcGetMemHandle(&w.handle, reinterpret_cast<void*>(a.base));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    raise(errc::unsupported,
          std::string("this memory cannot be exported with cudaIpcGetMemHandle (") + cudaGetErrorName(e) +
              "): allocate it with cudaMalloc (not cudaMallocAsync pools, managed or virtual memory without an IPC handle type)",
          ctx);
  }
  w.base = a.base;
  w.offset = at - a.base;
  w.bytes = bytes;
  w.process = process_token();
  w.device = device;
  w.valid = 1;
  return w;
}

// Peers' memory mapped into this process: each (peer, allocation) is opened once with
// cudaIpcOpenMemHandle and closed when its last user unmaps it or when the table is destroyed (on
// every path, errors included). A peer in this same process is reached through its own address.
class peer_mappings {
public:
  peer_mappings() = default;
  peer_mappings(const peer_mappings&) = delete;
  peer_mappings& operator=(const peer_mappings&) = delete;
  ~peer_mappings() { close_all(); }

  // Start of the peer's shared range in this process.
  std::byte* map(int peer, const wire_region& w, int my_device, const error_context& ctx) {
    if (!w.valid) raise(errc::protocol, "rank " + std::to_string(peer) + " shared no memory", ctx);
    for (auto& e : v_)
      if (e.peer == peer && e.remote_base == w.base) {
        ++e.refs;
        return static_cast<std::byte*>(e.local) + w.offset;
      }
    entry e{peer, w.base, nullptr, 1, false};
    if (w.process == process_token()) {
      e.local = reinterpret_cast<void*>(w.base);
      if (w.device != my_device) enable_peer(my_device, w.device, ctx);
    } else {
      const cudaError_t rc = cudaIpcOpenMemHandle(&e.local, w.handle, cudaIpcMemLazyEnablePeerAccess);
      if (rc != cudaSuccess) {
        error_context c = ctx;
        c.peer = peer;
        cuda::detail::raise_cuda(rc, "cudaIpcOpenMemHandle (a peer's memory)", __FILE__, __LINE__, c);
      }
      e.opened = true;
    }
    v_.push_back(e);
    return static_cast<std::byte*>(e.local) + w.offset;
  }

  void unmap(int peer, u64 remote_base) {
    for (std::size_t i = 0; i < v_.size(); ++i) {
      entry& e = v_[i];
      if (e.peer != peer || e.remote_base != remote_base || --e.refs > 0) continue;
      if (e.opened) cudaIpcCloseMemHandle(e.local);
      v_.erase(v_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }

  // Closes every handle this rank opened (before a barrier after which peers may free their memory).
  void close_all() noexcept {
    for (auto& e : v_)
      if (e.opened) cudaIpcCloseMemHandle(e.local);
    v_.clear();
  }

  std::size_t open_handles() const {
    return static_cast<std::size_t>(std::count_if(v_.begin(), v_.end(), [](const entry& e) { return e.opened; }));
  }

private:
  struct entry {
    int peer;
    u64 remote_base;
    void* local;
    int refs;
    bool opened;
  };
  std::vector<entry> v_;

  static void enable_peer(int mine, int theirs, const error_context& ctx) {
    int ok = 0;
    BRAID_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, mine, theirs));
    if (!ok)
      raise(errc::unsupported, "GPU " + std::to_string(mine) + " cannot access GPU " + std::to_string(theirs) + " peer to peer", ctx);
    const cudaError_t e = cudaDeviceEnablePeerAccess(theirs, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
    else if (e != cudaSuccess) cuda::detail::raise_cuda(e, "cudaDeviceEnablePeerAccess", __FILE__, __LINE__, ctx);
  }
};

} // namespace process

} // namespace braid::cuda
