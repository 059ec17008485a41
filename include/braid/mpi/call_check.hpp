// braid/mpi/call_check.hpp — the inter-host call check shared by braid::mpi::communicator
// (communicator.hpp) and braid::mpi::cuda_communicator (cuda.cuh); docs/guarantees.md, "Mismatched
// calls across hosts".
//
// Every rank that takes part in the inter-host stage (uniform layouts: every rank, on its cross
// communicator; otherwise the local ranks 0) folds each call with a non-zero count into a 64-bit call
// word, chained over its calls like the host transport's (schedule/call_word.hpp; count-0 calls, which
// move nothing, are not counted). Its first inter-host MPI call, whatever the collective, is
// exchange(): an MPI_Allgather of one block_bytes block per member, {word, the call's description, up
// to inline_bytes of the call's data}. Every member receives the same H blocks and compares every word
// with its own before it reads any payload, so all members reach the same verdict; on a difference
// each publishes the message (naming both calls) to its host's communicator and raises mismatch_error.
// The exchange has the same size and type whatever the calls, so it is always a matching MPI call, and
// the exchanges whose sizes depend on the call (where MPI may truncate, hang or mix messages) start
// only after it passed. A blocking MPI call: MPI's semantics, no deadline.
// Needs <mpi.h>: this header is not part of <braid/braid.hpp>.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../schedule/call_word.hpp"
#include "bootstrap.hpp"
#include "check.hpp"

namespace braid::mpi::detail {

class call_check {
public:
  static constexpr std::size_t block_bytes = 256, header_bytes = 48, inline_bytes = block_bytes - header_bytes;

  // Folds this call into the word if this rank takes part in the inter-host stage and the call moves
  // something; the exchange is then pending (the call's first inter-host MPI call must be exchange()).
  template <collective c, class T, class Op> void start(const host_layout& L, std::size_t count, int root) {
    if (L.hosts == 1 || count == 0 || !(L.uniform || L.local_rank == 0)) return;
    ++checked_;
    desc_ = braid::detail::describe_call<T, Op>(c, algo::automatic, count, root, checked_);
    if (c == collective::barrier) desc_ = {static_cast<std::uint64_t>(collective::barrier) | std::uint64_t{0xffffff} << 8, 0, 0, checked_};
    word_ = braid::detail::chain_call_word(word_, desc_, 0);
    pending_ = true;
  }
  bool pending() const noexcept { return pending_; }

  // The check on `hc`'s cross communicator, carrying `bytes` (<= inline_bytes) of `payload` (host
  // memory); returns the H blocks, member j's at j * block_bytes, its payload at header_bytes (16-byte
  // aligned). Cross-communicator member j is host j. On a difference: publish(message), then
  // mismatch_error with that message.
  template <class Publish>
  const std::byte* exchange(const void* payload, std::size_t bytes, const host_comms& hc, const error_context& ctx, Publish&& publish) {
    pending_ = false;
    const std::size_t H = static_cast<std::size_t>(hc.layout.hosts), words = block_bytes / sizeof(std::uint64_t);
    if (xbuf_.size() < (H + 1) * words) xbuf_.resize((H + 1) * words);
    std::uint64_t* mine = xbuf_.data();
    mine[0] = word_;
    for (std::size_t i = 0; i < 4; ++i) mine[1 + i] = desc_[i];
    if (bytes) std::memcpy(reinterpret_cast<std::byte*>(mine) + header_bytes, payload, bytes);
    std::byte* all = reinterpret_cast<std::byte*>(xbuf_.data() + words);
    BRAID_MPI_CHECK_CTX(MPI_Allgather(mine, static_cast<int>(block_bytes), MPI_BYTE, all, static_cast<int>(block_bytes), MPI_BYTE, hc.cross.get()), ctx);
    for (std::size_t j = 0; j < H; ++j) {
      std::uint64_t h[5];
      std::memcpy(h, all + j * block_bytes, sizeof(h));
      if (BRAID_UNLIKELY(h[0] != word_)) {
        const std::string m = mismatch_message(hc.layout, static_cast<int>(j), {h[1], h[2], h[3], h[4]});
        publish(m);
        raise(errc::mismatch, m, ctx);
      }
    }
    return all;
  }
  template <class T> static const T* payload_of(const std::byte* all, std::size_t j) {
    return reinterpret_cast<const T*>(all + j * block_bytes + header_bytes);
  }

private:
  static std::string describe(const braid::detail::call_description& d) {
    std::string s = std::string(name(static_cast<collective>(d[0] & 0xff)));
    if ((d[0] & 0xffffff00u) != 0xffffff00u) {
      s += " of " + std::to_string(d[1]) + " " + std::string(name(static_cast<dtype>((d[0] >> 8) & 0xff))) + " (" +
           std::to_string(d[0] >> 32) + "-byte elements), operator " + std::string(name(static_cast<op_kind>((d[0] >> 16) & 0xff)));
      if (d[2]) s += ", root " + std::to_string(d[2] - 1);
    }
    return s + ", its inter-host call " + std::to_string(d[3]);
  }
  std::string mismatch_message(const host_layout& L, int host, const braid::detail::call_description& theirs) const {
    return "mismatched calls across hosts: rank " + std::to_string(L.rank) + " (host " + std::to_string(L.host) + ") called " +
           describe(desc_) + "; host " + std::to_string(host) + "'s rank of its inter-host step called " + describe(theirs) +
           (theirs == desc_ ? " (the same call: an earlier call differed)" : "");
  }

  // Calls counted, the chained word, this call's description, whether this call's exchange is still to
  // come, and the exchange's blocks (this member's, then H).
  std::uint64_t checked_ = 0, word_ = 0;
  braid::detail::call_description desc_{};
  bool pending_ = false;
  std::vector<std::uint64_t> xbuf_;
};

} // namespace braid::mpi::detail
