// braid/comm/buffer.hpp — braid::buffer<T>, memory a communicator allocates (communicator::alloc)
// so that its peers read it in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "../host/memory.hpp"
#include "../host/registry.hpp"

namespace braid {

class communicator;

// Memory allocated through a communicator (communicator::alloc). For processes its peers map it, so
// collectives whose input lies in it are read in place: no staging copy. Owns its memory. Freeing it
// involves no peer and returns its pages to the system at once; the peers unmap their (then empty)
// copies at this rank's next alloc. Move-only.
template <class T> class buffer {
public:
  buffer() = default;
  buffer(buffer&&) noexcept = default;
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      release();
      mem_ = std::move(o.mem_);
      count_ = std::exchange(o.count_, 0);
      reg_ = std::move(o.reg_);
      id_ = std::exchange(o.id_, 0);
    }
    return *this;
  }
  ~buffer() { release(); }

  T* data() const { return reinterpret_cast<T*>(mem_.data()); }
  std::size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  T& operator[](std::size_t i) const { return data()[i]; }
  T* begin() const { return data(); }
  T* end() const { return data() + count_; }
  std::span<T> span() const { return {data(), count_}; }
  operator std::span<T>() const { return span(); }
  bool registered() const { return reg_ != nullptr; } // shared with the peers (processes)

private:
  friend class communicator;
  // Registered: no longer described to peers, and the pages are punched out of the memfd now (peers'
  // mappings stay valid and read zeros until the next alloc unmaps them; see communicator::alloc for
  // why no peer is reading them). Works also after the communicator was closed: it needs only the
  // memfd, which this buffer holds, and the registry, which it shares.
  void release() {
    if (reg_) {
      reg_->remove_own(id_);
      mem_.release_pages();
    }
    reg_.reset();
    mem_.reset();
    count_ = 0;
  }
  host::mapped_memory mem_;
  std::size_t count_ = 0;
  std::shared_ptr<host::registry> reg_;
  std::uint64_t id_ = 0;
};

} // namespace braid
