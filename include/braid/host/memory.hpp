// braid/host/memory.hpp — memory mappings: anonymous (threads) and memfd-backed (processes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../core/error.hpp"

namespace braid::host {

// Owns a mapping (and the descriptor it came from, if any).
class mapped_memory {
public:
  mapped_memory() = default;
  mapped_memory(void* base, std::size_t bytes, int fd) : base_(base), bytes_(bytes), fd_(fd) {}
  mapped_memory(mapped_memory&& o) noexcept { swap(o); }
  mapped_memory& operator=(mapped_memory&& o) noexcept { reset(); swap(o); return *this; }
  mapped_memory(const mapped_memory&) = delete;
  mapped_memory& operator=(const mapped_memory&) = delete;
  ~mapped_memory() { reset(); }

  std::byte* data() const { return static_cast<std::byte*>(base_); }
  std::size_t size() const { return bytes_; }
  int fd() const { return fd_; }
  // Gives the pages of a memfd-backed mapping back to the system now, keeping the file's size: every
  // mapping of the memfd, in every process, stays valid and reads zeros from then on (a read-only
  // mapping that touches a page again gets a fresh zero page; nothing raises SIGBUS, the size is
  // unchanged). fallocate(PUNCH_HOLE) on the descriptor, else madvise(MADV_REMOVE) on the mapping
  // (the same operation for shmem); both unmap the pages from every process's page tables. Errors are
  // ignored: the pages then come back only when the last mapping goes.
  void release_pages() noexcept {
    if (!base_ || !bytes_) return;
    if (fd_ >= 0 && ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes_)) == 0) return;
    (void)::madvise(base_, bytes_, MADV_REMOVE);
  }
  void reset() {
    if (base_) ::munmap(base_, bytes_);
    if (fd_ >= 0) ::close(fd_);
    base_ = nullptr;
    bytes_ = 0;
    fd_ = -1;
  }

  static mapped_memory anonymous(std::size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) braid::detail::raise_errno("mmap(anonymous)", __FILE__, __LINE__, errno);
    return mapped_memory(p, bytes, -1);
  }
  static mapped_memory create_shared(std::size_t bytes, const char* label) {
    const int fd = static_cast<int>(::syscall(SYS_memfd_create, label, MFD_CLOEXEC));
    if (fd < 0) braid::detail::raise_errno("memfd_create", __FILE__, __LINE__, errno);
    // A memfd has no name in any filesystem; peers get it only as a descriptor over the rendezvous
    // socket. Mode 0600 (memfds start at 0777) also closes /proc/<pid>/fd/<n> to other users.
    if (::fchmod(fd, 0600) != 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int e = errno;
      ::close(fd);
      braid::detail::raise_errno("ftruncate(memfd)", __FILE__, __LINE__, e);
    }
    return map_shared(fd, bytes);
  }
  // Takes ownership of fd. The descriptor must hold at least `bytes` (what the peer announced): a
  // shorter one would map, then raise SIGBUS at the first touch past its end, so it is refused here
  // with protocol_error. (A peer that shrinks it later can still cause SIGBUS; peers are trusted.)
  static mapped_memory map_shared(int fd, std::size_t bytes, bool writable = true) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      braid::detail::raise_errno("fstat(shared memory)", __FILE__, __LINE__, e);
    }
    if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < bytes) {
      ::close(fd);
      raise(errc::protocol, "a shared-memory descriptor from a peer holds " + std::to_string(st.st_size) +
                                " bytes, fewer than the " + std::to_string(bytes) + " announced");
    }
    void* p = ::mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      braid::detail::raise_errno("mmap(shared)", __FILE__, __LINE__, e);
    }
    return mapped_memory(p, bytes, fd);
  }

private:
  void swap(mapped_memory& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    std::swap(fd_, o.fd_);
  }
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  int fd_ = -1;
};

} // namespace braid::host
