// braid/emu/memory.hpp — the emulated device's memory: what every pointer the runtime handed out is
// (device, pinned host, managed, mapped from another process), and CUDA IPC across real processes.
//
// Device memory lives in memfd files mapped into the process, so another process can map the same
// pages: an IPC handle names the exporting process and its descriptor (the opener maps
// /proc/<pid>/fd/<fd> after checking that it is the same allocation). Every allocation sits between
// two inaccessible guard pages and ends at the second one (rounded up to CUDA's 256-byte alignment),
// so a kernel or copy that runs past the end of a buffer by more than that rounding faults at once
// (an underrun is caught only when it leaves the allocation's first page). Freeing exported memory
// empties its file, so a process that still maps it faults at its next access.
// New device memory is filled with 0xDB (CUDA does not zero it), unless BRAID_EMU_POISON=0.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "exec.hpp"

namespace braid::emu::detail {

enum class mem_kind { device, host, managed, imported };

struct allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;     // as requested
  int device = -1;          // device memory: its device; host and managed: -1
  mem_kind kind = mem_kind::device;
  bool pool = false;        // from cudaMallocAsync (a stream-ordered pool): not exportable, not legacy IPC capable
  unsigned host_flags = 0;  // cudaHostAlloc flags
  // The mapping: [map, map + map_len) with guard pages at both ends.
  void* map = nullptr;
  std::size_t map_len = 0;
  int fd = -1;
  std::uint64_t id = 0;     // random: names the memfd, so an opener can check what it maps
  // Imported allocations: who exported it, with which id, and how often it is open here.
  int exporter_pid = 0;
  std::uint64_t exporter_id = 0;
  int open_count = 0;
  int opened_on = -1; // the device that was current when it was opened
  bool registered = false; // host memory of the caller's, registered: not the table's to unmap
};

// What a cudaIpcMemHandle_t carries (its 64 bytes).
struct ipc_wire {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t fd;
  std::int32_t device;
  std::uint64_t id;
  std::uint64_t size;
  std::uint64_t pages; // bytes of data pages in the memfd
  std::uint64_t tail;  // offset of the allocation's base from the start of the data pages
  std::uint64_t check; // id ^ size ^ pid mixed: a handle that was not produced here is refused
  std::uint64_t pad;
};
static_assert(sizeof(ipc_wire) == 64);
inline constexpr std::uint32_t ipc_magic = 0x42454d55u; // "BEMU"

inline std::uint64_t ipc_check(const ipc_wire& w) {
  std::uint64_t h = w.id ^ (w.size * 0x9E3779B97F4A7C15ull) ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(w.pid)) << 17);
  h ^= h >> 29;
  return h * 0xBF58476D1CE4E5B9ull;
}

inline std::size_t page_size() {
  static const std::size_t p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

inline std::uint64_t random64() {
  static std::mutex m;
  static std::mt19937_64 g{[] {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }()};
  std::lock_guard<std::mutex> lk(m);
  return g();
}

class memory_table {
public:
  // Pages for `bytes` of memory between guard pages; the returned allocation's base is 256-byte
  // aligned and its rounded-up end touches the upper guard page. fd < 0: anonymous private memory.
  static bool map_with_guards(allocation& a, int fd, std::size_t data_pages_bytes, std::size_t tail) {
    const std::size_t pg = page_size();
    const std::size_t len = data_pages_bytes + 2 * pg;
    void* m = ::mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    void* d = fd >= 0 ? ::mmap(static_cast<char*>(m) + pg, data_pages_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
                      : ::mmap(static_cast<char*>(m) + pg, data_pages_bytes, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (d == MAP_FAILED) {
      ::munmap(m, len);
      return false;
    }
    a.map = m;
    a.map_len = len;
    a.base = reinterpret_cast<std::uintptr_t>(d) + tail;
    return true;
  }

  static std::size_t rounded(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
  static std::size_t pages_for(std::size_t bytes) {
    const std::size_t pg = page_size();
    return (rounded(bytes) + pg - 1) / pg * pg;
  }

  // Device memory on `device` (shareable with other processes). Null on failure.
  void* alloc_device(int device, std::size_t bytes, bool poison, bool pool = false) {
    allocation a;
    a.id = random64();
    a.device = device;
    a.pool = pool;
    a.kind = mem_kind::device;
    a.size = bytes;
    char name[64];
    std::snprintf(name, sizeof name, "braid-emu:%016llx", static_cast<unsigned long long>(a.id));
    a.fd = ::memfd_create(name, MFD_CLOEXEC);
    if (a.fd < 0) return nullptr;
    const std::size_t pages = pages_for(bytes);
    if (::ftruncate(a.fd, static_cast<off_t>(pages)) != 0 || !map_with_guards(a, a.fd, pages, pages - rounded(bytes))) {
      ::close(a.fd);
      return nullptr;
    }
    if (poison) std::memset(reinterpret_cast<void*>(a.base), 0xDB, rounded(bytes));
    return insert(a);
  }

  // Pinned host memory (cudaHostAlloc / cudaMallocHost) or managed memory: private to this process.
  void* alloc_private(mem_kind kind, std::size_t bytes, unsigned flags) {
    allocation a;
    a.kind = kind;
    a.size = bytes;
    a.host_flags = flags;
    const std::size_t pages = pages_for(bytes);
    if (!map_with_guards(a, -1, pages, pages - rounded(bytes))) return nullptr;
    return insert(a);
  }

  // Host memory the caller owns, registered (cudaHostRegister): recorded as pinned host memory with
  // no mapping of the table's own, so that unregistering leaves the caller's pages alone. False if
  // any byte of it is known already.
  bool register_host(void* p, std::size_t bytes, unsigned flags) {
    allocation a;
    a.kind = mem_kind::host;
    a.size = bytes;
    a.host_flags = flags;
    a.base = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lk(m_);
    auto it = by_base_.lower_bound(a.base);
    if (it != by_base_.end() && it->first < a.base + bytes) return false;
    if (it != by_base_.begin() && std::prev(it)->second.base + std::prev(it)->second.size > a.base) return false;
    a.registered = true;
    by_base_[a.base] = a;
    return true;
  }
  bool unregister_host(const void* p) {
    std::lock_guard<std::mutex> lk(m_);
    auto it = by_base_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == by_base_.end() || !it->second.registered) return false;
    by_base_.erase(it);
    return true;
  }

  // The allocation holding [p, p + bytes), copied out; false if none does.
  bool find(const void* p, std::size_t bytes, allocation& out) const {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lk(m_);
    auto it = by_base_.upper_bound(at);
    if (it == by_base_.begin()) return false;
    --it;
    const allocation& a = it->second;
    if (at < a.base) return false;
    const std::size_t off = at - a.base; // one past the end is inside when no byte is touched
    if (off > a.size || bytes > a.size - off) return false;
    out = a;
    return true;
  }

  // Frees an allocation of one of `kinds` that starts at p. False if p is not such a base.
  bool free_base(const void* p, mem_kind kind) {
    allocation a;
    {
      std::lock_guard<std::mutex> lk(m_);
      auto it = by_base_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == by_base_.end() || it->second.kind != kind || it->second.registered) return false;
      a = it->second;
      by_base_.erase(it);
    }
    unmap(a);
    return true;
  }

  // Exports the device allocation holding p.
  bool export_handle(const void* p, ipc_wire& w) const {
    allocation a;
    if (!find(p, 0, a) || a.kind != mem_kind::device || a.pool) return false;
    std::memset(&w, 0, sizeof w);
    w.magic = ipc_magic;
    w.pid = ::getpid();
    w.fd = a.fd;
    w.device = a.device;
    w.id = a.id;
    w.size = a.size;
    w.pages = pages_for(a.size);
    w.tail = w.pages - rounded(a.size);
    w.check = ipc_check(w);
    return true;
  }

  enum class open_result { ok, own_process, bad_handle, gone, other_device };

  // Maps a peer process's allocation (or counts one more opening of a mapping this process has).
  open_result open_handle(const ipc_wire& w, int current_device, void** out) {
    if (w.magic != ipc_magic || w.check != ipc_check(w) || w.pages < w.size || w.tail + w.size > w.pages)
      return open_result::bad_handle;
    if (w.pid == ::getpid()) return open_result::own_process;
    // Under the table's lock throughout: two threads opening one handle get one mapping.
    std::lock_guard<std::mutex> lk(m_);
    {
      for (auto& [base, a] : by_base_)
        if (a.kind == mem_kind::imported && a.exporter_pid == w.pid && a.exporter_id == w.id) {
          if (a.opened_on != current_device) return open_result::other_device;
          ++a.open_count;
          *out = reinterpret_cast<void*>(a.base);
          return open_result::ok;
        }
    }
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/fd/%d", w.pid, w.fd);
    char target[256] = {};
    const ssize_t n = ::readlink(path, target, sizeof target - 1);
    char want[64];
    std::snprintf(want, sizeof want, "braid-emu:%016llx", static_cast<unsigned long long>(w.id));
    if (n <= 0 || !std::strstr(target, want)) return open_result::gone;
    const int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return open_result::gone;
    allocation a;
    a.kind = mem_kind::imported;
    a.size = w.size;
    a.device = w.device;
    a.fd = fd;
    a.exporter_pid = w.pid;
    a.exporter_id = w.id;
    a.open_count = 1;
    a.opened_on = current_device;
    if (!map_with_guards(a, fd, w.pages, w.tail)) {
      ::close(fd);
      return open_result::gone;
    }
    by_base_[a.base] = a;
    *out = reinterpret_cast<void*>(a.base);
    return open_result::ok;
  }

  // Closes one opening of an imported mapping that starts at p; false if p is not one.
  bool close_handle(const void* p) {
    allocation a;
    {
      std::lock_guard<std::mutex> lk(m_);
      auto it = by_base_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == by_base_.end() || it->second.kind != mem_kind::imported) return false;
      if (--it->second.open_count > 0) return true;
      a = it->second;
      by_base_.erase(it);
    }
    unmap(a);
    return true;
  }

  std::size_t device_bytes(int device) const {
    std::lock_guard<std::mutex> lk(m_);
    std::size_t s = 0;
    for (const auto& [b, a] : by_base_)
      if (a.kind == mem_kind::device && a.device == device) s += a.size;
    return s;
  }

private:
  mutable std::mutex m_;
  std::map<std::uintptr_t, allocation> by_base_;

  void* insert(const allocation& a) {
    std::lock_guard<std::mutex> lk(m_);
    by_base_[a.base] = a;
    return reinterpret_cast<void*>(a.base);
  }
  static void unmap(const allocation& a) {
    // Freeing exported memory while another process still has it open is undefined in CUDA: make it
    // visible. Emptying the file makes every other mapping of it fault (SIGBUS) at its next access.
    if (a.kind == mem_kind::device && a.fd >= 0) (void)::ftruncate(a.fd, 0);
    if (a.map) ::munmap(a.map, a.map_len);
    if (a.fd >= 0) ::close(a.fd);
  }
};

} // namespace braid::emu::detail
