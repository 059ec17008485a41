// braid/transport/host/registry.hpp — buffers registered with a process communicator.
//
// communicator::alloc() creates each rank's buffer as a memfd and shares it with every peer, which
// maps it read-only. A rank whose input lies inside one of its registered buffers publishes a
// descriptor (allocation id and byte offset) instead of staging a copy, and peers read the buffer in
// place. Descriptors: bit 63 set, allocation id in bits 40..62, byte offset in bits 0..39.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "../../core/error.hpp"
#include "memory.hpp"

namespace braid::host {

class registry {
public:
  static constexpr std::uint64_t flag = std::uint64_t{1} << 63;
  static constexpr std::uint64_t offset_mask = (std::uint64_t{1} << 40) - 1;

  std::uint64_t next_id() { return ++last_id_; }

  void add_own(std::uint64_t id, const void* base, std::size_t bytes) {
    std::lock_guard<std::mutex> g(m_);
    own_.push_back({id, static_cast<const std::byte*>(base), bytes});
  }
  void remove_own(std::uint64_t id) {
    std::lock_guard<std::mutex> g(m_);
    for (std::size_t i = 0; i < own_.size(); ++i)
      if (own_[i].id == id) {
        own_[i] = own_.back();
        own_.pop_back();
        return;
      }
  }
  // Peers' mappings of allocation `id` (index: rank; this rank's own entry stays empty).
  void set_peers(std::uint64_t id, std::vector<mapped_memory> maps) {
    std::lock_guard<std::mutex> g(m_);
    if (peers_.size() <= id) peers_.resize(id + 1);
    peers_[id] = std::move(maps);
  }

  // Descriptor of [p, p + bytes) if it lies inside a live registered buffer of this rank, else 0.
  std::uint64_t describe(const void* p, std::size_t bytes) const {
    std::lock_guard<std::mutex> g(m_);
    const auto* b = static_cast<const std::byte*>(p);
    for (const auto& o : own_)
      if (b >= o.base && b + bytes <= o.base + o.bytes && o.id < (std::uint64_t{1} << 23))
        return flag | (o.id << 40) | static_cast<std::uint64_t>(b - o.base);
    return 0;
  }

  // Where peer's descriptor points in this process.
  const std::byte* resolve(int peer, std::uint64_t desc) const {
    const std::uint64_t id = (desc & ~flag) >> 40, off = desc & offset_mask;
    if (!(desc & flag) || id >= peers_.size() || peer < 0 || static_cast<std::size_t>(peer) >= peers_[id].size() ||
        !peers_[id][static_cast<std::size_t>(peer)].data() || off >= peers_[id][static_cast<std::size_t>(peer)].size())
      raise(errc::protocol, "rank " + std::to_string(peer) + " published an input descriptor that names no buffer registered with this communicator");
    return peers_[id][static_cast<std::size_t>(peer)].data() + off;
  }

private:
  struct own_entry {
    std::uint64_t id;
    const std::byte* base;
    std::size_t bytes;
  };
  mutable std::mutex m_;
  std::vector<own_entry> own_;
  std::vector<std::vector<mapped_memory>> peers_;
  std::uint64_t last_id_ = 0;
};

} // namespace braid::host
