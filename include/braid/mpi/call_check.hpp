// braid/mpi/call_check.hpp — the inter-host call check of braid::mpi's hierarchy (hierarchy.hpp),
// shared by both of its communicators; docs/guarantees.md, "Mismatched calls across hosts".
//
// Every rank that takes part in the inter-host stage (uniform layouts: every rank, on its cross
// communicator; otherwise the local ranks 0) folds each call with a non-zero count into a 64-bit call
// word, chained over its calls like the host transport's (schedule/call.hpp; count-0 calls, which
// move nothing, are not counted). Its first inter-host step, whatever the collective, is exchange():
// one round of point-to-point messages in which every member sends every other member exactly one
// block, {word, the call's description, the bytes it sends that member, up to inline_bytes of them
// where they lie in host memory}, and, where those bytes do not fit in the block (or lie in device
// memory), one data message after it. A block is at most
// block_bytes long (only the bytes used are sent) and is received into block_bytes, whatever the
// calls, so its receive always matches and is never truncated. Every member
// receives every other member's block and compares every word with its own before it posts a receive
// for any data message, so all members reach the same verdict, and nothing is written to the caller's
// memory before it. On a difference each member still receives (and drops) every data message announced
// to it, so no sender waits on a receive that never comes, then publishes the message (naming both
// calls) to its host's communicator and raises mismatch_error. So the check costs no round of its own:
// the call's data rides with the words (docs/benchmarks.md, "The inter-host call check"). Blocking MPI
// calls: MPI's semantics, no deadline.
// Needs <mpi.h>: this header is not part of <braid/braid.hpp>.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../schedule/call.hpp"
#include "bootstrap.hpp"
#include "check.hpp"

namespace braid::mpi::detail {

// What one member sends to member k of the exchange, and where what member k sends it goes: bytes of
// host memory (or memory MPI can read and write in place); a pointer may be null only where its count
// is 0.
struct route {
  const void* send = nullptr;
  std::size_t send_bytes = 0;
  void* recv = nullptr;
  std::size_t recv_bytes = 0;
};

class call_check {
public:
  static constexpr std::size_t block_bytes = 256, header_bytes = 48, inline_bytes = block_bytes - header_bytes;
  // Tags on the cross communicator (braid's own, used for nothing else); below the 32767 every MPI
  // must allow (MPI_TAG_UB).
  static constexpr int block_tag = 11, data_tag = 12;

  // Folds this call into the word if this rank takes part in the inter-host stage and the call moves
  // something; the exchange is then pending (the call's first inter-host MPI call must be exchange()).
  void start(const host_layout& L, braid::detail::call_record k) {
    if (L.hosts == 1 || (k.count == 0 && k.coll != collective::barrier) || !(L.uniform || L.local_rank == 0)) return;
    ++checked_;
    k.algorithm = algo::automatic;
    k.number = checked_;
    desc_ = braid::detail::describe(k);
    word_ = braid::detail::chain_call_word(word_, desc_, 0);
    pending_ = true;
  }
  bool pending() const noexcept { return pending_; }

  // The check on `hc`'s cross communicator (member j is host j), carrying the step's data: routes[k]
  // for every member k, this one's included (its bytes are copied). Every byte count is a multiple of
  // elem_bytes (the data messages are elem_bytes-byte elements of type `t`, at most INT_MAX of them).
  // What member j sends this member lands in routes[j].recv, whether it rode in the block or beside
  // it. On a difference: publish(message), then mismatch_error with that message.
  // The default copy into route memory: host memory, possibly overlapping (a member's own route).
  struct move_bytes {
    void operator()(void* dst, const void* src, std::size_t bytes) const { std::memmove(dst, src, bytes); }
  };

  // Routes in memory the CPU cannot read (device memory handed to a CUDA-aware MPI): cpu_reads false,
  // and `copy(dst, src, bytes)` makes every copy into route memory (this member's own route, and the
  // bytes another member sent inline); nothing is sent inline from such memory. A block says whether
  // its bytes are inline (the top bit of its size), so members of either kind meet in one exchange.
  template <class Publish, class Copy = move_bytes>
  void exchange(std::span<const route> routes, MPI_Datatype t, std::size_t elem_bytes, const host_comms& hc, const error_context& ctx,
                Publish&& publish, bool cpu_reads = true, Copy&& copy = {}) {
    pending_ = false;
    const std::size_t H = static_cast<std::size_t>(hc.layout.hosts), me = static_cast<std::size_t>(hc.layout.host);
    const MPI_Comm comm = hc.cross.get();
    constexpr std::size_t words = block_bytes / sizeof(std::uint64_t);
    if (xbuf_.size() < 2 * H * words) xbuf_.resize(2 * H * words);
    std::byte* out = reinterpret_cast<std::byte*>(xbuf_.data()); // the blocks this member sends, by member
    std::byte* all = out + H * block_bytes;                         // the blocks it receives, by member
    reqs_.clear();
    drop_.clear();
    // Two members: one MPI_Sendrecv of the blocks (after the data message, if any). More: the block
    // receives first (they lead reqs_), so that the blocks land in place, then every send.
    const bool pair = H == 2;
    const std::size_t blocks = pair ? 0 : H - 1;
    if (!pair)
      for (std::size_t k = 0; k < H; ++k)
        if (k != me) post(MPI_Irecv(all + k * block_bytes, static_cast<int>(block_bytes), MPI_BYTE, static_cast<int>(k), block_tag, comm, &next()), ctx);
    std::size_t used = 0;
    for (std::size_t k = 0; k < H; ++k) {
      const route& r = routes[k];
      std::byte* b = k == me ? all + k * block_bytes : out + k * block_bytes;
      const bool in_line = cpu_reads && r.send_bytes <= inline_bytes;
      const std::uint64_t h[6] = {word_, desc_[0], desc_[1], desc_[2], desc_[3], r.send_bytes | (in_line ? inline_flag : 0)};
      std::memcpy(b, h, sizeof(h));
      if (in_line && r.send_bytes && k != me) std::memcpy(b + header_bytes, r.send, r.send_bytes);
      if (k == me) continue;
      if (!in_line && r.send_bytes)
        post(MPI_Isend(r.send, elements(r.send_bytes, elem_bytes, ctx), t, static_cast<int>(k), data_tag, comm, &next()), ctx);
      used = header_bytes + (in_line ? r.send_bytes : 0); // a receive may be longer than its message
      if (!pair) post(MPI_Isend(b, static_cast<int>(used), MPI_BYTE, static_cast<int>(k), block_tag, comm, &next()), ctx);
    }
    if (pair) {
      const std::size_t k = 1 - me;
      BRAID_MPI_CHECK_CTX(MPI_Sendrecv(out + k * block_bytes, static_cast<int>(used), MPI_BYTE, static_cast<int>(k), block_tag, all + k * block_bytes,
                                       static_cast<int>(block_bytes), MPI_BYTE, static_cast<int>(k), block_tag, comm, MPI_STATUS_IGNORE),
                          ctx);
    } else {
      BRAID_MPI_CHECK_CTX(MPI_Waitall(static_cast<int>(blocks), reqs_.data(), MPI_STATUSES_IGNORE), ctx);
    }
    // The verdict, from the words alone; then the sizes (equal words: the same call, so the same sizes).
    std::size_t differs = H;
    bool sizes_agree = true;
    for (std::size_t j = 0; j < H; ++j) {
      const std::uint64_t* h = header(all, j);
      if (h[0] != word_ && differs == H) differs = j;
      if (sent_bytes(h) != routes[j].recv_bytes) sizes_agree = false;
    }
    const bool ok = differs == H && sizes_agree;
    for (std::size_t j = 0; j < H; ++j) {
      const std::uint64_t* h = header(all, j);
      const std::size_t bytes = sent_bytes(h);
      const route& r = routes[j];
      if (!bytes) continue;
      if (j == me) {
        if (ok) copy(r.recv, r.send, bytes);
      } else if (!(h[5] & inline_flag)) {
        if (ok) post(MPI_Irecv(r.recv, elements(bytes, elem_bytes, ctx), t, static_cast<int>(j), data_tag, comm, &next()), ctx);
        else drain(all, j, comm, ctx);
      } else if (ok) {
        copy(r.recv, all + j * block_bytes + header_bytes, bytes);
      }
    }
    BRAID_MPI_CHECK_CTX(MPI_Waitall(static_cast<int>(reqs_.size() - blocks), reqs_.data() + blocks, MPI_STATUSES_IGNORE), ctx);
    if (BRAID_UNLIKELY(!ok)) {
      if (differs == H) raise(errc::internal, "braid::mpi: the inter-host exchange's sizes differ between equal calls (a bug in braid)", ctx);
      const std::uint64_t* h = header(all, differs);
      const std::string m = mismatch_message(hc.layout, static_cast<int>(differs), {h[1], h[2], h[3], h[4]});
      publish(m);
      raise(errc::mismatch, m, ctx);
    }
  }
  // The check alone: blocks without data.
  template <class Publish> void exchange(const host_comms& hc, const error_context& ctx, Publish&& publish) {
    routes_.assign(static_cast<std::size_t>(hc.layout.hosts), route{});
    exchange(routes_, MPI_BYTE, 1, hc, ctx, publish);
  }

private:
  static constexpr std::uint64_t inline_flag = std::uint64_t{1} << 63; // in a block's size: the bytes follow the header
  static std::size_t sent_bytes(const std::uint64_t* h) { return h[5] & ~inline_flag; }
  static const std::uint64_t* header(const std::byte* all, std::size_t j) {
    return reinterpret_cast<const std::uint64_t*>(all + j * block_bytes); // blocks are 8-byte aligned
  }
  MPI_Request& next() { return reqs_.emplace_back(MPI_REQUEST_NULL); }
  static void post(int rc, const error_context& ctx) { BRAID_MPI_CHECK_CTX(rc, ctx); }
  static int elements(std::size_t bytes, std::size_t elem_bytes, const error_context& ctx) {
    if (bytes % elem_bytes || bytes / elem_bytes > static_cast<std::size_t>(INT_MAX))
      raise(errc::internal, "braid::mpi: an inter-host data message of " + std::to_string(bytes) + " bytes is not a whole number of at most INT_MAX elements", ctx);
    return static_cast<int>(bytes / elem_bytes);
  }
  // Receives and drops the data message member j announced (a mismatched call: its size is the
  // sender's). Elements of the sender's element size (its description's), so that any size its own
  // checks allowed fits in one int count; memory not zeroed.
  void drain(const std::byte* all, std::size_t j, MPI_Comm comm, const error_context& ctx) {
    const std::uint64_t* h = header(all, j);
    const std::uint64_t bytes = sent_bytes(h);
    std::uint64_t esize = h[1] >> 32;
    if (esize == 0 || bytes % esize) esize = 1;
    if (bytes / esize > std::uint64_t{INT_MAX})
      raise(errc::internal, "braid::mpi: a peer announced an inter-host data message of " + std::to_string(bytes) + " bytes, more than INT_MAX elements", ctx);
    drop_.emplace_back(new std::byte[bytes]);
    MPI_Datatype dt = MPI_BYTE;
    if (esize > 1) {
      BRAID_MPI_CHECK_CTX(MPI_Type_contiguous(static_cast<int>(esize), MPI_BYTE, &dt), ctx);
      BRAID_MPI_CHECK_CTX(MPI_Type_commit(&dt), ctx);
    }
    const int rc = MPI_Irecv(drop_.back().get(), static_cast<int>(bytes / esize), dt, static_cast<int>(j), data_tag, comm, &next());
    if (esize > 1) MPI_Type_free(&dt); // freed types stay valid for pending requests
    post(rc, ctx);
  }
  static std::string describe(const braid::detail::call_description& d) {
    return braid::detail::call_text(braid::detail::unpack(d)) + ", its inter-host call " + std::to_string(d[3]);
  }
  std::string mismatch_message(const host_layout& L, int host, const braid::detail::call_description& theirs) const {
    return "mismatched calls across hosts: rank " + std::to_string(L.rank) + " (host " + std::to_string(L.host) + ") called " +
           describe(desc_) + "; host " + std::to_string(host) + "'s rank of its inter-host step called " + describe(theirs) +
           (theirs == desc_ ? " (the same call: an earlier call differed)" : "");
  }

  // Calls counted, the chained word, this call's description, whether this call's exchange is still to
  // come, the blocks (sent, by member; then received, by member), the requests of one exchange (the
  // block receives first), the routes of a check without data, and dropped data of a mismatch.
  std::uint64_t checked_ = 0, word_ = 0;
  braid::detail::call_description desc_{};
  bool pending_ = false;
  std::vector<std::uint64_t> xbuf_;
  std::vector<MPI_Request> reqs_;
  std::vector<route> routes_;
  std::vector<std::unique_ptr<std::byte[]>> drop_;
};

} // namespace braid::mpi::detail
