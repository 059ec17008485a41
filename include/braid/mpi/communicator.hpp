// braid/mpi/communicator.hpp — braid::mpi::communicator: hierarchical collectives over hosts.
//
// braid moves the data inside each host (shared memory between the processes of a host) and MPI
// carries the step between hosts. Construction is collective over an MPI communicator (see
// bootstrap.hpp for how hosts are found and BRAID_HOST_ID). Every rank calls the same collectives in
// the same order with the same counts, roots and operators; calls are blocking.
//
// Algorithms (H hosts of L ranks each; "uniform" when every host has the same L). Every inter-host step
// below starts with the call check (exchange(), call_check.hpp: one round of point-to-point messages,
// a 256-byte block from every member to every other, carrying the call word and up to 208 bytes of
// data, plus one data message per pair where the data does not fit). The step's first data exchange
// rides in that round, so the check costs no round of its own:
//   all_reduce      uniform: reduce_scatter inside each host (slice l of ceil(count/L) to local rank l),
//                   the slices across hosts among the ranks with the same local rank (up to 1 KiB:
//                   every member sends its slice to all and each reduces all of it; above: two-shot,
//                   1/H pieces to their owners in the check's round, each piece reduced by its owner,
//                   MPI_Allgatherv), all_gather inside each host. Otherwise: reduce to local rank 0,
//                   the same exchange among the local ranks 0, broadcast inside each host.
//   reduce_scatter  uniform: inputs repacked so that local rank l's block group holds the blocks of the
//                   ranks (h, l) of every host h, reduce_scatter inside the host, the blocks to their
//                   hosts in the check's round, reduction by the owner. Otherwise: reduce to local
//                   rank 0, each host's blocks to that host's local rank 0 in the check's round,
//                   broadcast inside the host (each rank keeps its block).
//   all_gather      uniform: the block to every host among equal local ranks in the check's round,
//                   all_gather inside the host. Otherwise: all_gather inside the host, the host's
//                   blocks to every local rank 0 in the check's round, broadcast inside the host.
//   broadcast       uniform: the root's host sends the data to the ranks with the root's local rank in
//                   the check's round (2 hosts, or (H - 1) x bytes <= 1 MiB; otherwise MPI_Bcast after
//                   the check), broadcast inside each host. Otherwise: the check among local ranks 0,
//                   broadcast on the root's host, MPI_Bcast among local ranks 0, broadcast inside the
//                   other hosts.
//   reduce          an all_reduce whose result only the root keeps (costs what all_reduce costs).
//   barrier         barrier inside the host, the call check (a round between every pair, so a barrier)
//                   among the ranks of the inter-host stage, barrier inside the host.
// With one host every call goes straight to the host communicator (exactly braid's own result).
//
// Guarantees
//  * Identical bits on every rank: each output element is computed once, by one rank, and copied, or
//    (all_reduce slices up to 1 KiB across hosts) by every rank from the same operands in the same order.
//  * Reduction order: inside a host, the host communicator's algorithm (its own fixed order; partial
//    results are stored in T); across hosts, the host partials in host order 0, 1, ..., H-1, in the
//    operator's accumulator type, with finalize (avg) applied once, with the world size, at the end.
//    Integers (default accumulator) and min/max without NaNs therefore equal the flat result exactly;
//    floating sums differ from a flat reduction only by the rounding of the host partials to T.
//  * Any element type and operator braid supports: MPI moves bytes (contiguous MPI_BYTE types) and
//    braid's reduction loop does the arithmetic, so no MPI_Op is involved and no MPI_Allreduce rounding.
//  * Mismatched calls across hosts raise mismatch_error on every rank before anything a peer sent is
//    written to a caller's buffer and before any MPI collective whose size depends on the call: the
//    first inter-host step of the ranks of the inter-host stage (uniform: all; otherwise local ranks 0)
//    is always the check's round (exchange(), call_check.hpp), whose fixed-size blocks carry a chained
//    call word and the size of any data message that follows; every word is compared before a data
//    message is received, and a difference is published to the host's ranks.
//    Inside a host the host communicator's call words compare the intra-host stages.
//  * Bad arguments raise invalid_argument on this rank before anything moves. Any error during a call
//    (an MPI error, converted to braid::system_error, or an error of the host communicator) makes this
//    communicator refuse further calls (usage_error). Waits inside a host have braid's deadline
//    (BRAID_TIMEOUT); MPI calls, the call check's included, have MPI's semantics (no
//    deadline): a rank that fails while others are inside the inter-host step can leave them
//    waiting — call MPI_Abort on such an error.
//  * Counts are limited to INT_MAX elements per MPI call (unsupported_error beyond).
// Needs <mpi.h>: this header is not part of <braid/braid.hpp>.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../comm/communicator.hpp"
#include "../core/reduce.hpp"
#include "bootstrap.hpp"
#include "call_check.hpp"
#include "check.hpp"
#include "front.hpp"
#include "partition.hpp"

namespace braid::mpi {

namespace detail {
// The user's operator without its finalize: what the stages before the last one reduce with, so that
// avg divides once, by the world size, at the very end. Same accumulator as Op on T.
template <class Op, class T> struct without_finalize {
  using accumulator_type = accumulator_t<T, Op>;
  Op op;
  template <class A> BRAID_HD A operator()(const A& a, const A& b) const { return static_cast<A>(op(a, b)); }
};
} // namespace detail

// valid(), rank(), size(), host(), hosts(), local_rank(), local_size(), uniform(), layout(),
// cross_comm() and calls() come from detail::front (front.hpp), as for cuda_communicator.
class communicator : public detail::front {
public:
  communicator() noexcept : front("communicator") {} // empty: every call raises usage_error
  communicator(communicator&& o) noexcept : front("communicator") { *this = std::move(o); }
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      scratch_ = std::move(o.scratch_);
      local_ = std::move(o.local_);
      front::operator=(std::move(o));
      staging_ = std::move(o.staging_);
    }
    return *this;
  }
  // Frees the scratch memory before leaving the host communicator, which it is registered with.
  ~communicator() { scratch_ = buffer<std::uint64_t>(); }

  // Collective over `comm` (every rank of it calls this). MPI must be initialised; `comm` is
  // duplicated, so the caller may free it afterwards.
  explicit communicator(MPI_Comm comm, const options& opts = options::from_env()) : front("communicator", split_hosts(comm)) {
    local_ = join_local(hc_.world.get(), hc_.local.get(), opts);
    live_ = true;
  }

  braid::communicator& local() { return (void)lay(), local_; } // this host's communicator
  MPI_Comm world_comm() const { return (void)lay(), hc_.world.get(); }

  // ---- collectives (pointer forms; semantics and in-place forms as braid::communicator's, with
  // ranks numbered as in the MPI communicator) ---------------------------------------------------------
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void all_reduce(const T* in, T* out, std::size_t count, Op op = {}) {
    check_call<collective::all_reduce>(in, out, count, 0);
    call("all_reduce", [&] {
      start_check<collective::all_reduce, T, Op>(count, 0);
      do_all_reduce(in, out, count, op);
    });
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce_scatter(const T* in, T* out, std::size_t recv_count, Op op = {}) {
    check_call<collective::reduce_scatter>(in, out, recv_count, 0);
    call("reduce_scatter", [&] {
      start_check<collective::reduce_scatter, T, Op>(recv_count, 0);
      do_reduce_scatter(in, out, recv_count, op);
    });
  }
  template <element T> void all_gather(const T* in, T* out, std::size_t send_count) {
    check_call<collective::all_gather>(in, out, send_count, 0);
    call("all_gather", [&] {
      start_check<collective::all_gather, T, braid::detail::copy_only>(send_count, 0);
      do_all_gather(in, out, send_count);
    });
  }
  template <element T> void broadcast(const T* in, T* out, std::size_t count, int root) {
    check_call<collective::broadcast>(in, out, count, root);
    call("broadcast", [&] {
      start_check<collective::broadcast, T, braid::detail::copy_only>(count, root);
      do_broadcast(in, out, count, root);
    });
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce(const T* in, T* out, std::size_t count, int root, Op op = {}) {
    check_call<collective::reduce>(in, out, count, root);
    call("reduce", [&] {
      start_check<collective::reduce, T, Op>(count, root);
      if (rank() == root) return do_all_reduce(in, out, count, op);
      std::vector<T> sink(count);
      do_all_reduce(in, sink.data(), count, op);
    });
  }
  void barrier() {
    call("barrier", [&] {
      local_.barrier();
      // The call check among the ranks that take part in the inter-host stage (every rank of a
      // uniform layout, the local ranks 0 otherwise) is a round between every pair of them: it is the
      // inter-host barrier.
      start_check<collective::barrier, std::uint8_t, braid::detail::copy_only>(1, 0);
      if (check_.pending()) check_only();
      local_.barrier();
    });
  }

  // span forms
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void all_reduce(std::span<T> data, Op op = {}) { all_reduce(data.data(), data.data(), data.size(), op); }
  template <element T> void broadcast(std::span<T> data, int root) { broadcast(data.data(), data.data(), data.size(), root); }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, Op op = {}) {
    if (in.size() != out.size() * static_cast<std::size_t>(size()))
      raise(errc::invalid_argument, "reduce_scatter: in.size() must equal out.size() * size()", error_context{rank(), "reduce_scatter", 0, -1});
    reduce_scatter(in.data(), out.data(), out.size(), op);
  }
  template <element T> void all_gather(std::span<const T> in, std::span<T> out) {
    if (out.size() != in.size() * static_cast<std::size_t>(size()))
      raise(errc::invalid_argument, "all_gather: out.size() must equal in.size() * size()", error_context{rank(), "all_gather", 0, -1});
    all_gather(in.data(), out.data(), in.size());
  }

private:
  // Runs a call; any error marks the communicator failed.
  template <class F> void call(const char* what, F&& f) {
    begin_call(what);
    try {
      f();
      if (check_.pending()) check_only(); // a checking rank without an exchange: none with these algorithms
    } catch (const std::exception& e) {
      mark_failed(e);
      throw;
    }
  }

  // ---- the inter-host call check (mpi/call_check.hpp) -----------------------------------------------
  // Each collective's first inter-host exchange rides in the check's round (routes_: what goes to each
  // member, where what it sends lands), so the word costs no round of its own. A mismatch is published
  // to the host communicator, whose other ranks raise it from their waits.
  // Up to this many bytes of slice, cross_all_reduce sends all of it to every member and each reduces
  // every member's copy (one round) instead of two-shot (two rounds); measured at 2 hosts: 0.62-0.80x
  // the two-shot time at 256 bytes-1 KiB (docs/benchmarks.md).
  static constexpr std::size_t one_round_bytes = 1024;
  // A broadcast's data rides in the check's exchange (the root's host sends it to every other host)
  // where there are 2 hosts or (hosts - 1) x its bytes are at most this; otherwise MPI_Bcast follows.
  static constexpr std::size_t fanout_bytes = std::size_t{1} << 20;
  // The check carrying the step's data (routes_, one per member; call_check.hpp), elements of T.
  template <class T> void exchange() {
    check_.exchange(std::span<const detail::route>(routes_), type_of(sizeof(T)), sizeof(T), hc_, ctx(),
                           [&](const std::string& m) { local_.publish_failure(errc::mismatch, m); });
  }
  void check_only() { check_.exchange(hc_, ctx(), [&](const std::string& m) { local_.publish_failure(errc::mismatch, m); }); }
  std::vector<detail::route>& routes(std::size_t H) {
    routes_.assign(H, detail::route{});
    return routes_;
  }

  // Scratch in memory the host's peers map (so local collectives read it in place), grown by
  // powers of two. Collective over the host: every local rank asks for the same size in the same call.
  template <class T> T* scratch(std::size_t count) {
    const std::size_t bytes = count * sizeof(T);
    if (bytes > scratch_.size() * sizeof(std::uint64_t)) {
      std::size_t words = 512;
      while (words * sizeof(std::uint64_t) < bytes) words *= 2;
      scratch_ = buffer<std::uint64_t>();
      scratch_ = local_.alloc<std::uint64_t>(words);
    }
    return reinterpret_cast<T*>(scratch_.data());
  }
  template <class T> T* staging(std::size_t count) { // private memory for MPI receives
    if (staging_.size() * sizeof(std::uint64_t) < count * sizeof(T)) staging_.resize((count * sizeof(T) + 7) / 8);
    return reinterpret_cast<T*>(staging_.data());
  }

  // Across the members of `comm` (H of them, this one is `me`): data[0, n) becomes the reduction, in
  // member order, of every member's data. Up to one_round_bytes: every member sends all of it to every
  // member in the check's round (inside the blocks up to their 208 bytes) and reduces every member's copy;
  // above: two-shot, piece j reduced by member j (the pieces ride in the check's round), then
  // gathered. Each element is reduced over the same operands in the same order either way (the same
  // bits).
  template <class T, class Op> void cross_all_reduce(T* data, std::size_t n, MPI_Comm comm, int H, int me, const Op& op) {
    auto& r = routes(static_cast<std::size_t>(H));
    if (n * sizeof(T) <= one_round_bytes) {
      T* copies = staging<T>(static_cast<std::size_t>(H) * n); // member j's copy at j * n
      for (std::size_t j = 0; j < r.size(); ++j) r[j] = {data, n * sizeof(T), copies + j * n, n * sizeof(T)};
      exchange<T>();
      reduce_pieces(copies, H, n, data, op);
      return;
    }
    const detail::piece_counts p = detail::split_pieces(n, H);
    const std::size_t mine = static_cast<std::size_t>(p.of(me));
    T* pieces = staging<T>(static_cast<std::size_t>(H) * mine);
    const MPI_Datatype t = type_of(sizeof(T));
    for (std::size_t j = 0; j < r.size(); ++j)
      r[j] = {data + p.off[j], static_cast<std::size_t>(p.cnt[j]) * sizeof(T), pieces + j * mine, mine * sizeof(T)};
    exchange<T>(); // every member's piece j to member j: the MPI_Alltoallv of two-shot
    reduce_pieces(pieces, H, mine, data + p.at(me), op);
    BRAID_MPI_CHECK_CTX(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, p.cnt.data(), p.off.data(), t, comm), ctx());
  }

  // dst[i] = finalize(op(piece_0[i], ..., piece_{H-1}[i])) in the accumulator type, pieces in order.
  template <class T, class Op> void reduce_pieces(const T* pieces, int H, std::size_t m, T* dst, const Op& op) {
    std::vector<const T*> src(static_cast<std::size_t>(H));
    for (int j = 0; j < H; ++j) src[static_cast<std::size_t>(j)] = pieces + static_cast<std::size_t>(j) * m;
    reduce_n<T>(src.data(), H, dst, nullptr, m, op, true, hc_.layout.size);
  }

  template <class T, class Op> void do_all_reduce(const T* in, T* out, std::size_t count, const Op& op) {
    const host_layout& L = hc_.layout;
    if (count == 0) return;
    if (L.hosts == 1) return local_.all_reduce(in, out, count, op);
    const detail::without_finalize<Op, T> part{op};
    const std::size_t n = static_cast<std::size_t>(L.local_size);
    const std::size_t l = static_cast<std::size_t>(L.local_rank);
    if (L.uniform) {
      const std::size_t s = (count + n - 1) / n, padded = s * n;
      T* buf = scratch<T>(padded);
      T* slice = buf + l * s;
      if (padded == count) {
        local_.reduce_scatter(in, slice, s, part);
      } else {
        std::memcpy(static_cast<void*>(buf), in, count * sizeof(T));
        std::memset(static_cast<void*>(buf + count), 0, (padded - count) * sizeof(T));
        local_.reduce_scatter(buf, slice, s, part);
      }
      cross_all_reduce(slice, s, hc_.cross.get(), L.hosts, L.host, op);
      if (padded == count) {
        local_.all_gather(slice, out, s);
      } else {
        local_.all_gather(slice, buf, s);
        std::memcpy(static_cast<void*>(out), buf, count * sizeof(T));
      }
      return;
    }
    T* buf = scratch<T>(count);
    local_.reduce(in, buf, count, 0, part);
    if (L.local_rank == 0) cross_all_reduce(buf, count, hc_.cross.get(), L.hosts, L.host, op);
    local_.broadcast(buf, out, count, 0);
  }

  template <class T, class Op> void do_reduce_scatter(const T* in, T* out, std::size_t rc, const Op& op) {
    const host_layout& L = hc_.layout;
    if (rc == 0) return;
    if (L.hosts == 1) return local_.reduce_scatter(in, out, rc, op);
    const detail::without_finalize<Op, T> part{op};
    const std::size_t H = static_cast<std::size_t>(L.hosts), N = static_cast<std::size_t>(L.size);
    if (L.uniform) {
      const std::size_t n = static_cast<std::size_t>(L.local_size), l = static_cast<std::size_t>(L.local_rank);
      T* packed = scratch<T>(N * rc); // group l = blocks of ranks (0, l), (1, l), ..., (H-1, l)
      for (std::size_t g = 0; g < n; ++g)
        for (std::size_t h = 0; h < H; ++h)
          std::memcpy(static_cast<void*>(packed + (g * H + h) * rc), in + static_cast<std::size_t>(L.members[h][g]) * rc, rc * sizeof(T));
      T* group = packed + l * H * rc;
      local_.reduce_scatter(packed, group, H * rc, part);
      T* pieces = staging<T>(H * rc);
      auto& r = routes(H); // block h of the group to host h (an MPI_Alltoall), in the check's exchange
      for (std::size_t h = 0; h < H; ++h) r[h] = {group + h * rc, rc * sizeof(T), pieces + h * rc, rc * sizeof(T)};
      exchange<T>();
      reduce_pieces(pieces, L.hosts, rc, out, op);
      return;
    }
    // Leaders: the host's partial of everything, then each leader reduces its own host's blocks.
    T* buf = scratch<T>(N * rc + static_cast<std::size_t>(L.local_size) * rc);
    T* host_result = buf + N * rc; // this host's blocks, by local rank
    local_.reduce(in, buf, N * rc, 0, part);
    if (L.local_rank == 0) {
      const detail::piece_counts out_p = detail::host_blocks(L, rc); // host h's ranks' blocks, to host h
      const int mine = out_p.of(L.host);
      const detail::piece_counts in_p = detail::equal_pieces(L.hosts, mine); // this host's blocks, from every host
      T* send = staging<T>(N * rc + H * static_cast<std::size_t>(mine));
      T* recv = send + N * rc; // H pieces of `mine` elements
      for (std::size_t h = 0, o = 0; h < H; ++h)
        for (int q : L.members[h]) {
          std::memcpy(static_cast<void*>(send + o), buf + static_cast<std::size_t>(q) * rc, rc * sizeof(T));
          o += rc;
        }
      auto& r = routes(H); // host h's blocks to host h (an MPI_Alltoallv), in the check's exchange
      for (std::size_t h = 0; h < H; ++h)
        r[h] = {send + out_p.off[h], static_cast<std::size_t>(out_p.cnt[h]) * sizeof(T), recv + in_p.off[h],
                static_cast<std::size_t>(in_p.cnt[h]) * sizeof(T)};
      exchange<T>();
      reduce_pieces(recv, L.hosts, static_cast<std::size_t>(mine), host_result, op);
    }
    const std::size_t hn = static_cast<std::size_t>(L.local_size) * rc;
    local_.broadcast(host_result, host_result, hn, 0);
    std::memcpy(static_cast<void*>(out), host_result + static_cast<std::size_t>(L.local_rank) * rc, rc * sizeof(T));
  }

  template <class T> void do_all_gather(const T* in, T* out, std::size_t sc) {
    const host_layout& L = hc_.layout;
    if (sc == 0) return;
    if (L.hosts == 1) return local_.all_gather(in, out, sc);
    const std::size_t H = static_cast<std::size_t>(L.hosts), N = static_cast<std::size_t>(L.size);
    if (L.uniform) {
      const std::size_t n = static_cast<std::size_t>(L.local_size), l = static_cast<std::size_t>(L.local_rank);
      T* buf = scratch<T>(N * sc); // group g = blocks of ranks (0, g), ..., (H-1, g)
      auto& r = routes(H); // the block to every host (an MPI_Allgather), in the check's exchange
      for (std::size_t h = 0; h < H; ++h) r[h] = {in, sc * sizeof(T), buf + (l * H + h) * sc, sc * sizeof(T)};
      exchange<T>();
      local_.all_gather(buf + l * H * sc, buf, H * sc);
      for (std::size_t g = 0; g < n; ++g)
        for (std::size_t h = 0; h < H; ++h)
          std::memcpy(static_cast<void*>(out + static_cast<std::size_t>(L.members[h][g]) * sc), buf + (g * H + h) * sc, sc * sizeof(T));
      return;
    }
    const std::size_t hn = static_cast<std::size_t>(L.local_size) * sc;
    T* buf = scratch<T>(hn + N * sc);
    T* all = buf + hn; // blocks by (host, local rank)
    local_.all_gather(in, buf, sc);
    if (L.local_rank == 0) {
      const detail::piece_counts p = detail::host_blocks(L, sc);
      auto& r = routes(H); // this host's blocks to every host (an MPI_Allgatherv), in the check's exchange
      for (std::size_t h = 0; h < H; ++h) r[h] = {buf, hn * sizeof(T), all + p.off[h], static_cast<std::size_t>(p.cnt[h]) * sizeof(T)};
      exchange<T>();
    }
    local_.broadcast(all, all, N * sc, 0);
    for (std::size_t h = 0, o = 0; h < H; ++h)
      for (int q : L.members[h]) {
        std::memcpy(static_cast<void*>(out + static_cast<std::size_t>(q) * sc), all + o, sc * sizeof(T));
        o += sc;
      }
  }

  template <class T> void do_broadcast(const T* in, T* out, std::size_t count, int root) {
    const host_layout& L = hc_.layout;
    if (count == 0) return;
    if (L.hosts == 1) return local_.broadcast(in, out, count, root);
    const int rh = L.host_of[static_cast<std::size_t>(root)], rl = L.local_of[static_cast<std::size_t>(root)];
    const MPI_Datatype t = type_of(sizeof(T));
    const int c = static_cast<int>(count);
    if (L.uniform) {
      if (L.rank == root && in != out) std::memcpy(static_cast<void*>(out), in, count * sizeof(T));
      // Every rank checks; the members of the root's local rank carry the data: in the check's
      // exchange, the root's host sending it to every other host, where that costs the root's host
      // little (2 hosts, or at most fanout_bytes in all), otherwise by MPI_Bcast after the check.
      const std::size_t H = static_cast<std::size_t>(L.hosts), bytes = count * sizeof(T);
      const bool carries = L.local_rank == rl, rides = H == 2 || (H - 1) * bytes <= fanout_bytes;
      auto& r = routes(H);
      if (carries && rides && L.host == rh) {
        for (std::size_t h = 0; h < H; ++h)
          if (h != static_cast<std::size_t>(rh)) r[h] = {out, bytes, nullptr, 0};
      } else if (carries && rides) {
        r[static_cast<std::size_t>(rh)] = {nullptr, 0, out, bytes};
      }
      exchange<T>();
      if (carries && !rides) BRAID_MPI_CHECK_CTX(MPI_Bcast(out, c, t, rh, hc_.cross.get()), ctx());
      local_.broadcast(out, out, count, rl);
      return;
    }
    // The leaders compare before the root's host moves anything: its other ranks leave the call after
    // this local broadcast, so they must find a mismatch published by then.
    if (L.local_rank == 0) check_only();
    if (L.host == rh) local_.broadcast(in, out, count, rl);
    if (L.local_rank == 0) BRAID_MPI_CHECK_CTX(MPI_Bcast(out, c, t, rh, hc_.cross.get()), ctx());
    if (L.host != rh) local_.broadcast(out, out, count, 0);
  }

  braid::communicator local_;
  std::vector<detail::route> routes_; // the call check's exchange's routes, one per member
  buffer<std::uint64_t> scratch_;
  std::vector<std::uint64_t> staging_;
};

} // namespace braid::mpi
