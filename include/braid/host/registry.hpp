// braid/host/registry.hpp — buffers registered with a process communicator.
//
// communicator::alloc() creates each rank's buffer as a memfd and shares it with every peer, which
// maps it read-only. A rank whose input lies inside one of its registered buffers publishes a
// descriptor (allocation id and byte offset) instead of staging a copy, and peers read the buffer in
// place. Descriptors: bit 63 set, allocation id in bits 40..62, byte offset in bits 0..39.
//
// Freeing: the owner releases a freed buffer's pages at once (buffer::release punches them
// out of the memfd) and remembers its id here; its next alloc tells every peer, which then unmaps its
// copy (drop_peer). So the pages come back when the buffer is freed, and a peer holds at most the
// mappings of live buffers plus those freed since the owner's last alloc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "../core/error.hpp"
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
  // The owner freed buffer `id` (any thread, also after the communicator is gone): it is no longer
  // described to peers, and the next alloc announces it (take_freed).
  void remove_own(std::uint64_t id) {
    std::lock_guard<std::mutex> g(m_);
    for (std::size_t i = 0; i < own_.size(); ++i)
      if (own_[i].id == id) {
        own_[i] = own_.back();
        own_.pop_back();
        freed_.push_back(id);
        return;
      }
  }
  // Up to `max` of the ids freed since the last call, smallest first; the rest wait for the next one.
  std::vector<std::uint64_t> take_freed(std::size_t max) {
    std::lock_guard<std::mutex> g(m_);
    std::sort(freed_.begin(), freed_.end());
    const std::size_t k = std::min(max, freed_.size());
    std::vector<std::uint64_t> out(freed_.begin(), freed_.begin() + static_cast<std::ptrdiff_t>(k));
    freed_.erase(freed_.begin(), freed_.begin() + static_cast<std::ptrdiff_t>(k));
    return out;
  }

  // Peers' mappings of allocation `id` (index: rank; this rank's own entry stays empty). The
  // mappings are added and dropped only inside this communicator's alloc and close, on the thread
  // that holds the communicator, the same thread that reads through them (resolve, in collectives).
  void set_peers(std::uint64_t id, std::vector<mapped_memory> maps) {
    std::lock_guard<std::mutex> g(m_);
    peers_[id] = std::move(maps);
  }
  bool maps_peer(std::uint64_t id, int peer) const {
    std::lock_guard<std::mutex> g(m_);
    const auto it = peers_.find(id);
    return it != peers_.end() && peer >= 0 && static_cast<std::size_t>(peer) < it->second.size() &&
           it->second[static_cast<std::size_t>(peer)].data() != nullptr;
  }
  // Unmaps peer's buffer of allocation `id` (peer freed it).
  void drop_peer(std::uint64_t id, int peer) {
    std::lock_guard<std::mutex> g(m_);
    const auto it = peers_.find(id);
    if (it == peers_.end() || peer < 0 || static_cast<std::size_t>(peer) >= it->second.size()) return;
    it->second[static_cast<std::size_t>(peer)].reset();
    if (std::none_of(it->second.begin(), it->second.end(), [](const mapped_memory& m) { return m.data() != nullptr; }))
      peers_.erase(it);
  }
  // Unmaps every peer buffer (the communicator is closed: nothing reads them any more).
  void drop_peers() noexcept {
    std::lock_guard<std::mutex> g(m_);
    peers_.clear();
  }
  std::size_t peer_mappings() const {
    std::lock_guard<std::mutex> g(m_);
    std::size_t k = 0;
    for (const auto& [id, maps] : peers_)
      for (const auto& m : maps) k += m.data() != nullptr;
    return k;
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
  // Unlocked: peers_ changes only on this thread (see set_peers).
  const std::byte* resolve(int peer, std::uint64_t desc) const {
    const std::uint64_t id = (desc & ~flag) >> 40, off = desc & offset_mask;
    const auto it = (desc & flag) ? peers_.find(id) : peers_.end();
    if (it == peers_.end() || peer < 0 || static_cast<std::size_t>(peer) >= it->second.size() ||
        !it->second[static_cast<std::size_t>(peer)].data() || off >= it->second[static_cast<std::size_t>(peer)].size())
      raise(errc::protocol, "rank " + std::to_string(peer) + " published an input descriptor that names no buffer registered with this communicator",
            error_context{-1, nullptr, 0, peer}); // the communicator adds this rank and the call
    return it->second[static_cast<std::size_t>(peer)].data() + off;
  }

private:
  struct own_entry {
    std::uint64_t id;
    const std::byte* base;
    std::size_t bytes;
  };
  mutable std::mutex m_;
  std::vector<own_entry> own_;
  std::vector<std::uint64_t> freed_; // freed own ids not yet announced to the peers
  std::unordered_map<std::uint64_t, std::vector<mapped_memory>> peers_;
  std::uint64_t last_id_ = 0;
};

} // namespace braid::host
