// braid/mpi/partition.hpp — how both braid::mpi communicators (communicator.hpp on host memory,
// cuda.cuh on device memory) cut the data of an inter-host step among the hosts: counts and
// displacements in elements, as MPI's v-collectives take them. Pure arithmetic over the layout, so
// the two media cannot place data differently.
#pragma once

#include <cstddef>
#include <vector>

#include "bootstrap.hpp"

namespace braid::mpi::detail {

// Counts and displacements, one per member of the cross communicator (one per host).
struct piece_counts {
  std::vector<int> cnt, off;
  int of(int h) const { return cnt[static_cast<std::size_t>(h)]; }
  int at(int h) const { return off[static_cast<std::size_t>(h)]; }
};

// n elements split among H members: member j's piece is n / H elements, one more for the first
// n % H, the pieces one after another (two-shot's pieces, each reduced by its member).
inline piece_counts split_pieces(std::size_t n, int H) {
  piece_counts p;
  p.cnt.resize(static_cast<std::size_t>(H));
  p.off.resize(static_cast<std::size_t>(H));
  const std::size_t uh = static_cast<std::size_t>(H);
  for (std::size_t j = 0, o = 0; j < uh; ++j) {
    p.cnt[j] = static_cast<int>(n / uh + (j < n % uh));
    p.off[j] = static_cast<int>(o);
    o += static_cast<std::size_t>(p.cnt[j]);
  }
  return p;
}

// `each` elements from every one of H members, one after another (what a member receives when
// every member sends it the same amount).
inline piece_counts equal_pieces(int H, int each) {
  piece_counts p;
  p.cnt.assign(static_cast<std::size_t>(H), each);
  p.off.resize(static_cast<std::size_t>(H));
  for (int h = 0; h < H; ++h) p.off[static_cast<std::size_t>(h)] = h * each;
  return p;
}

// Host h's blocks, `per_rank` elements for each of its ranks (in local-rank order), hosts one after
// another: hosts of unequal size, where the leaders move every rank's block.
inline piece_counts host_blocks(const host_layout& L, std::size_t per_rank) {
  piece_counts p;
  p.cnt.resize(static_cast<std::size_t>(L.hosts));
  p.off.resize(static_cast<std::size_t>(L.hosts));
  for (std::size_t h = 0, o = 0; h < static_cast<std::size_t>(L.hosts); ++h) {
    p.cnt[h] = L.host_size[h] * static_cast<int>(per_rank);
    p.off[h] = static_cast<int>(o);
    o += static_cast<std::size_t>(p.cnt[h]);
  }
  return p;
}

} // namespace braid::mpi::detail
