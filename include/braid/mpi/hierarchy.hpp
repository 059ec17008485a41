// braid/mpi/hierarchy.hpp — braid::mpi's hierarchical collectives, written once over a stage.
//
// braid moves the data inside each host; MPI carries the step between hosts. Both of braid::mpi's
// communicators run these algorithms: communicator (communicator.hpp: the host's braid::communicator,
// host memory) and cuda_communicator (cuda.cuh: the host's CUDA communicator, device memory, MPI on
// pinned copies or on device memory). What differs between them is the stage, the derived class
// (CRTP), which provides:
//   memory     scratch<T>(n)   memory of the stage that the host's communicator reads in place;
//              pieces<T>(n)    memory MPI receives into; space<T>(n) memory MPI sends from;
//              mpi_in_place()  whether MPI reads and writes the stage's memory itself (no copies);
//              mpi_on_host()   whether the memory MPI works in is host memory (the CPU reduces it and
//                              the call check may carry it inline); otherwise device memory;
//   copies     copy(dst, src, n), zero(dst, n), copy_rows(dst, dst_pitch, src, src_pitch, width, rows)
//              inside the stage's memory; to_mpi(dst, src, n) and from_mpi(dst, src, n) between it and
//              MPI's (nothing where they are the same pointer); copy_mpi(dst, src, bytes) inside MPI's
//              memory, done when it returns; before_mpi(): the stage's work so far is done;
//   the host   local_all_reduce, local_reduce_scatter, local_all_gather, local_reduce, local_broadcast
//              (braid::communicator's semantics, partial results in T);
//   reduction  reduce_pieces_device(...) where MPI's memory is device memory;
//   pipeline   chunk_elements<T>(slice), pipeline_depth, mark(k) after chunk k's stage work,
//              wait_mark(k, enqueued) before its inter-host step;
//   errors     on_mismatch(message): what a failed call check tells the host.
//
// Algorithms (H hosts of L ranks each; "uniform" when every host has the same L). Every inter-host step
// starts with the call check (exchange(), call_check.hpp: one round of point-to-point messages, a
// 256-byte block from every member to every other, carrying the call word and, from host memory, up to
// 208 bytes of data, plus one data message per pair for the rest). The step's first data exchange rides
// in that round, so the check costs no round of its own:
//   all_reduce      uniform: reduce_scatter inside each host (slice l of ceil(count/L) to local rank l),
//                   the slices across hosts among the ranks with the same local rank (up to 1 KiB:
//                   every member sends its slice to all and each reduces all of it; above: two-shot,
//                   1/H pieces to their owners in the check's round, each piece reduced by its owner,
//                   MPI_Allgatherv), all_gather inside each host. The slice goes through in chunks
//                   where the stage pipelines (cuda_communicator: while MPI carries chunk k, the GPU
//                   works on chunk k+1). Otherwise: reduce to local rank 0, the same exchange among the
//                   local ranks 0, broadcast inside each host.
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
// With one host every call goes straight to the host's communicator.
//
// Reduction order: inside a host, the host communicator's algorithm; across hosts, the host partials
// in host order 0, 1, ..., H-1 in the operator's accumulator type, finalize (avg) once with the world
// size at the end. Each output element is computed once, by one rank, and copied, or (slices up to
// 1 KiB) by every rank from the same operands in the same order: identical bits on every rank, and the
// same bits from both communicators.
// Needs <mpi.h>: this header is not part of <braid/braid.hpp>.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/reduce.hpp"
#include "call_check.hpp"
#include "check.hpp"
#include "front.hpp"
#include "partition.hpp"

namespace braid::mpi::detail {

// The user's operator without its finalize: what the stages before the last one reduce with, so that
// avg divides once, by the world size, at the very end. Same accumulator as Op on T.
template <class Op, class T> struct without_finalize {
  using accumulator_type = accumulator_t<T, Op>;
  Op op;
  template <class A> BRAID_HD A operator()(const A& a, const A& b) const { return static_cast<A>(op(a, b)); }
};

template <class Stage> class hierarchy : public front {
protected:
  explicit hierarchy(const char* kind) noexcept : front(kind) {}
  hierarchy(const char* kind, host_comms hc) : front(kind, std::move(hc)) {}
  hierarchy& operator=(hierarchy&& o) noexcept {
    if (this != &o) {
      front::operator=(std::move(o));
      routes_ = std::move(o.routes_);
    }
    return *this;
  }

  // Up to this many bytes of slice, cross_all_reduce sends all of it to every member and each reduces
  // every member's copy (one round) instead of two-shot (two rounds); measured at 2 hosts: 0.62-0.80x
  // the two-shot time at 256 bytes-1 KiB (docs/benchmarks.md).
  static constexpr std::size_t one_round_bytes = 1024;
  // A broadcast's data rides in the check's exchange (the root's host sends it to every other host)
  // where there are 2 hosts or (hosts - 1) x its bytes are at most this; otherwise MPI_Bcast follows.
  static constexpr std::size_t fanout_bytes = std::size_t{1} << 20;

  // Private host memory of at least `count` elements of T, grown as needed (what MPI receives into,
  // or sends from, where that is host memory).
  template <class T> static T* grow_host(std::vector<std::uint64_t>& v, std::size_t count) {
    if (v.size() * sizeof(std::uint64_t) < count * sizeof(T)) v.resize((count * sizeof(T) + 7) / 8);
    return reinterpret_cast<T*>(v.data());
  }

  // The call check without data, if this call's is still to come.
  void check_only() {
    if (check_.pending()) check_.exchange(hc_, ctx(), [&](const std::string& m) { stage().on_mismatch(m); });
  }

  // A call that moves nothing, or whose layout has one host (`local`, the stage's own collective, then
  // serves it whole): true when nothing is left for the hierarchy.
  template <class F> bool served_locally(std::size_t count, F&& local) {
    if (count == 0) return true;
    if (hc_.layout.hosts != 1) return false;
    local();
    return true;
  }

  template <class T, class Op> void do_all_reduce(const T* in, T* out, std::size_t count, const Op& op) {
    if (served_locally(count, [&] { stage().local_all_reduce(in, out, count, op); })) return;
    const host_layout& L = hc_.layout;
    Stage& st = stage();
    const without_finalize<Op, T> part{op};
    if (!L.uniform) {
      const bool leader = L.local_rank == 0;
      T* buf = st.template scratch<T>(count);
      T* x = !leader || st.mpi_in_place() ? buf : st.template space<T>(count);
      st.local_reduce(in, buf, count, 0, part);
      if (leader) {
        st.to_mpi(x, buf, count);
        st.before_mpi();
        cross_all_reduce(x, count, op);
        st.from_mpi(buf, x, count);
      }
      st.local_broadcast(buf, out, count, 0);
      return;
    }
    // Slice l of s = ceil(count / n) elements per local rank (zero-padded to n * s). The slice goes
    // through the inter-host step in K chunks of c elements: chunk k of every block is packed (n rows of
    // c), reduce_scattered inside the host (rank l keeps its row: the elements of its slice, reduced in
    // the same order as by one reduce_scatter of the whole), exchanged across hosts, all_gathered inside
    // the host and unpacked into place. One chunk needs no packing: its rows are the blocks themselves.
    const std::size_t n = static_cast<std::size_t>(L.local_size);
    const std::size_t s = (count + n - 1) / n, padded = s * n;
    const std::size_t c = std::max<std::size_t>(1, std::min(s, st.template chunk_elements<T>(s)));
    const std::size_t K = (s + c - 1) / c;
    constexpr std::size_t depth = Stage::pipeline_depth; // chunks in flight
    // Scratch: the padded copy (when count is not a multiple of n), `depth` packed chunks, the slice.
    const std::size_t pad_elems = padded == count ? 0 : padded, pack_elems = K > 1 ? depth * n * c : 0;
    T* base = st.template scratch<T>(pad_elems + pack_elems + s);
    T* work = pad_elems ? base : nullptr;
    T* packed = base + pad_elems;
    T* slice = packed + pack_elems;
    T* mslice = st.mpi_in_place() ? slice : st.template space<T>(s); // the slice where MPI works on it
    const T* src = in;
    T* dst = out;
    if (work) {
      st.copy(work, in, count);
      st.zero(work + count, padded - count);
      src = work;
      dst = work;
    }
    std::size_t enqueued = 0; // chunks whose intra-host stage is enqueued
    auto enqueue = [&](std::size_t k) {
      enqueued = k + 1;
      const std::size_t o = k * c, w = std::min(c, s - o);
      const T* rows = src;
      if (K > 1) {
        T* pk = packed + (k % depth) * n * c;
        st.copy_rows(pk, w, src + o, s, w, n);
        rows = pk;
      }
      st.local_reduce_scatter(rows, slice + o, w, part);
      st.to_mpi(mslice + o, slice + o, w);
      st.mark(k);
    };
    for (std::size_t k = 0; k < std::min(depth, K); ++k) enqueue(k);
    for (std::size_t k = 0; k < K; ++k) {
      const std::size_t o = k * c, w = std::min(c, s - o);
      st.wait_mark(k, enqueued);
      cross_all_reduce(mslice + o, w, op);
      st.from_mpi(slice + o, mslice + o, w);
      if (K == 1) {
        st.local_all_gather(slice, dst, s);
      } else {
        T* pk = packed + (k % depth) * n * c;
        st.local_all_gather(slice + o, pk, w);
        st.copy_rows(dst + o, s, pk, w, w, n);
      }
      if (k + depth < K) enqueue(k + depth);
    }
    if (work) st.copy(out, work, count);
  }

  template <class T, class Op> void do_reduce_scatter(const T* in, T* out, std::size_t rc, const Op& op) {
    if (served_locally(rc, [&] { stage().local_reduce_scatter(in, out, rc, op); })) return;
    const host_layout& L = hc_.layout;
    Stage& st = stage();
    const without_finalize<Op, T> part{op};
    const std::size_t H = static_cast<std::size_t>(L.hosts), N = static_cast<std::size_t>(L.size);
    if (L.uniform) {
      const std::size_t n = static_cast<std::size_t>(L.local_size), l = static_cast<std::size_t>(L.local_rank);
      T* packed = st.template scratch<T>(N * rc); // group g = blocks of ranks (0, g), (1, g), ..., (H-1, g)
      for (std::size_t g = 0; g < n; ++g)
        for (std::size_t h = 0; h < H; ++h) st.copy(packed + (g * H + h) * rc, in + static_cast<std::size_t>(L.members[h][g]) * rc, rc);
      T* group = packed + l * H * rc;
      st.local_reduce_scatter(packed, group, H * rc, part);
      // Block h of the group to host h (an MPI_Alltoall), in the check's exchange; the owner reduces.
      T* mgroup = st.mpi_in_place() ? group : st.template space<T>(H * rc + rc);
      T* mout = st.mpi_in_place() ? out : mgroup + H * rc;
      st.to_mpi(mgroup, group, H * rc);
      st.before_mpi();
      T* pieces = st.template pieces<T>(H * rc);
      auto& r = routes(H);
      for (std::size_t h = 0; h < H; ++h) r[h] = {mgroup + h * rc, rc * sizeof(T), pieces + h * rc, rc * sizeof(T)};
      exchange<T>();
      reduce_pieces(pieces, L.hosts, rc, mout, op);
      st.from_mpi(out, mout, rc);
      return;
    }
    // Leaders: the host's partial of everything, then each leader reduces its own host's blocks.
    const std::size_t hn = static_cast<std::size_t>(L.local_size) * rc;
    T* buf = st.template scratch<T>(N * rc + hn);
    T* host_result = buf + N * rc; // this host's blocks, by local rank
    st.local_reduce(in, buf, N * rc, 0, part);
    if (L.local_rank == 0) {
      const piece_counts out_p = host_blocks(L, rc); // host h's ranks' blocks, to host h
      const std::size_t mine = static_cast<std::size_t>(out_p.of(L.host));
      const piece_counts in_p = equal_pieces(L.hosts, static_cast<int>(mine)); // this host's blocks, from every host
      T* send = st.template space<T>(N * rc + (st.mpi_in_place() ? 0 : mine));
      T* mres = st.mpi_in_place() ? host_result : send + N * rc;
      for (std::size_t h = 0, o = 0; h < H; ++h)
        for (int q : L.members[h]) {
          st.to_mpi(send + o, buf + static_cast<std::size_t>(q) * rc, rc);
          o += rc;
        }
      st.before_mpi();
      T* recv = st.template pieces<T>(H * mine);
      auto& r = routes(H); // host h's blocks to host h (an MPI_Alltoallv), in the check's exchange
      for (std::size_t h = 0; h < H; ++h)
        r[h] = {send + out_p.off[h], static_cast<std::size_t>(out_p.cnt[h]) * sizeof(T), recv + in_p.off[h],
                static_cast<std::size_t>(in_p.cnt[h]) * sizeof(T)};
      exchange<T>();
      reduce_pieces(recv, L.hosts, mine, mres, op);
      st.from_mpi(host_result, mres, mine);
    }
    st.local_broadcast(host_result, host_result, hn, 0);
    st.copy(out, host_result + static_cast<std::size_t>(L.local_rank) * rc, rc);
  }

  template <class T> void do_all_gather(const T* in, T* out, std::size_t sc) {
    if (served_locally(sc, [&] { stage().local_all_gather(in, out, sc); })) return;
    const host_layout& L = hc_.layout;
    Stage& st = stage();
    const std::size_t H = static_cast<std::size_t>(L.hosts), N = static_cast<std::size_t>(L.size);
    if (L.uniform) {
      const std::size_t n = static_cast<std::size_t>(L.local_size), l = static_cast<std::size_t>(L.local_rank);
      T* buf = st.template scratch<T>(N * sc); // group g = blocks of ranks (0, g), ..., (H-1, g)
      T* group = buf + l * H * sc;
      const T* min = in;
      T* mgroup = group;
      if (!st.mpi_in_place()) {
        T* m = st.template space<T>(sc + H * sc);
        st.to_mpi(m, in, sc);
        min = m;
        mgroup = m + sc;
      }
      st.before_mpi();
      auto& r = routes(H); // the block to every host (an MPI_Allgather), in the check's exchange
      for (std::size_t h = 0; h < H; ++h) r[h] = {min, sc * sizeof(T), mgroup + h * sc, sc * sizeof(T)};
      exchange<T>();
      st.from_mpi(group, mgroup, H * sc);
      st.local_all_gather(group, buf, H * sc);
      for (std::size_t g = 0; g < n; ++g)
        for (std::size_t h = 0; h < H; ++h) st.copy(out + static_cast<std::size_t>(L.members[h][g]) * sc, buf + (g * H + h) * sc, sc);
      return;
    }
    const std::size_t hn = static_cast<std::size_t>(L.local_size) * sc;
    T* buf = st.template scratch<T>(hn + N * sc);
    T* all = buf + hn; // blocks by (host, local rank)
    st.local_all_gather(in, buf, sc);
    if (L.local_rank == 0) {
      T* mbuf = st.mpi_in_place() ? buf : st.template space<T>(hn + N * sc);
      T* mall = mbuf + hn;
      st.to_mpi(mbuf, buf, hn);
      st.before_mpi();
      const piece_counts p = host_blocks(L, sc);
      auto& r = routes(H); // this host's blocks to every host (an MPI_Allgatherv), in the check's exchange
      for (std::size_t h = 0; h < H; ++h) r[h] = {mbuf, hn * sizeof(T), mall + p.off[h], static_cast<std::size_t>(p.cnt[h]) * sizeof(T)};
      exchange<T>();
      st.from_mpi(all, mall, N * sc);
    }
    st.local_broadcast(all, all, N * sc, 0);
    for (std::size_t h = 0, o = 0; h < H; ++h)
      for (int q : L.members[h]) {
        st.copy(out + static_cast<std::size_t>(q) * sc, all + o, sc);
        o += sc;
      }
  }

  template <class T> void do_broadcast(const T* in, T* out, std::size_t count, int root) {
    if (served_locally(count, [&] { stage().local_broadcast(in, out, count, root); })) return;
    const host_layout& L = hc_.layout;
    Stage& st = stage();
    const int rh = L.host_of[static_cast<std::size_t>(root)], rl = L.local_of[static_cast<std::size_t>(root)];
    const std::size_t bytes = count * sizeof(T);
    if (L.uniform) {
      if (L.rank == root) st.copy(out, in, count);
      // Every rank checks; the members of the root's local rank carry the data: in the check's
      // exchange, the root's host sending it to every other host, where that costs the root's host
      // little (2 hosts, or at most fanout_bytes in all), otherwise by MPI_Bcast after the check.
      const std::size_t H = static_cast<std::size_t>(L.hosts);
      const bool carries = L.local_rank == rl, rides = H == 2 || (H - 1) * bytes <= fanout_bytes;
      T* x = !carries || st.mpi_in_place() ? out : st.template space<T>(count);
      if (carries) {
        if (L.host == rh) st.to_mpi(x, out, count);
        st.before_mpi();
      }
      auto& r = routes(H);
      if (carries && rides && L.host == rh) {
        for (std::size_t h = 0; h < H; ++h)
          if (h != static_cast<std::size_t>(rh)) r[h] = {x, bytes, nullptr, 0};
      } else if (carries && rides) {
        r[static_cast<std::size_t>(rh)] = {nullptr, 0, x, bytes};
      }
      exchange<T>();
      if (carries && !rides) cross_broadcast(x, count, rh);
      if (carries && L.host != rh) st.from_mpi(out, x, count);
      st.local_broadcast(out, out, count, rl);
      return;
    }
    // The leaders compare before the root's host moves anything: its other ranks may leave the call
    // (or, on a device, enqueue their local broadcast) after it, so they must find a mismatch
    // published by then.
    const bool leader = L.local_rank == 0;
    if (leader) check_only();
    if (L.host == rh) st.local_broadcast(in, out, count, rl);
    if (leader) {
      T* x = st.mpi_in_place() ? out : st.template space<T>(count);
      if (L.host == rh) st.to_mpi(x, out, count);
      st.before_mpi();
      cross_broadcast(x, count, rh);
      if (L.host != rh) st.from_mpi(out, x, count);
    }
    if (L.host != rh) st.local_broadcast(out, out, count, 0);
  }

private:
  Stage& stage() { return static_cast<Stage&>(*this); }

  std::vector<route>& routes(std::size_t H) {
    routes_.assign(H, route{});
    return routes_;
  }
  // The check carrying the step's data (routes_, one per member; call_check.hpp), elements of T.
  template <class T> void exchange() {
    Stage& st = stage();
    auto publish = [&](const std::string& m) { st.on_mismatch(m); };
    auto copy = [&](void* dst, const void* src, std::size_t n) { st.copy_mpi(dst, src, n); };
    check_.exchange(std::span<const route>(routes_), type_of(sizeof(T)), sizeof(T), hc_, ctx(), publish, st.mpi_on_host(), copy);
  }

  // Across the hosts (the members of the cross communicator, this one is member `host`): data[0, n), in
  // MPI's memory, becomes the reduction, in member order, of every member's data. Up to
  // one_round_bytes: every member sends all of it to every member in the check's round and reduces
  // every member's copy; above: two-shot, piece j reduced by member j (the pieces ride in the check's
  // round), then gathered. Each element is reduced over the same operands in the same order either way
  // (the same bits).
  template <class T, class Op> void cross_all_reduce(T* data, std::size_t n, const Op& op) {
    const int H = hc_.layout.hosts, me = hc_.layout.host;
    auto& r = routes(static_cast<std::size_t>(H));
    if (n * sizeof(T) <= one_round_bytes) {
      T* copies = stage().template pieces<T>(static_cast<std::size_t>(H) * n); // member j's copy at j * n
      for (std::size_t j = 0; j < r.size(); ++j) r[j] = {data, n * sizeof(T), copies + j * n, n * sizeof(T)};
      exchange<T>();
      reduce_pieces(copies, H, n, data, op);
      return;
    }
    const piece_counts p = split_pieces(n, H);
    const std::size_t mine = static_cast<std::size_t>(p.of(me));
    T* pieces = stage().template pieces<T>(static_cast<std::size_t>(H) * mine);
    for (std::size_t j = 0; j < r.size(); ++j)
      r[j] = {data + p.off[j], static_cast<std::size_t>(p.cnt[j]) * sizeof(T), pieces + j * mine, mine * sizeof(T)};
    exchange<T>(); // every member's piece j to member j: the MPI_Alltoallv of two-shot
    reduce_pieces(pieces, H, mine, data + p.at(me), op);
    const MPI_Datatype t = type_of(sizeof(T));
    BRAID_MPI_CHECK_CTX(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, p.cnt.data(), p.off.data(), t, hc_.cross.get()), ctx());
  }

  // MPI_Bcast of data[0, count), in MPI's memory, over the cross communicator from member `root`.
  template <class T> void cross_broadcast(T* data, std::size_t count, int root) {
    BRAID_MPI_CHECK_CTX(MPI_Bcast(data, static_cast<int>(count), type_of(sizeof(T)), root, hc_.cross.get()), ctx());
  }

  // dst[i] = finalize(op(piece_0[i], ..., piece_{H-1}[i])) in the accumulator type, pieces of m
  // elements one after another, in order; in MPI's memory (the CPU's loop or the device's kernel).
  template <class T, class Op> void reduce_pieces(const T* pieces, int H, std::size_t m, T* dst, const Op& op) {
    if (!m) return;
    if (!stage().mpi_on_host()) return stage().reduce_pieces_device(pieces, H, m, dst, op);
    std::vector<const T*> src(static_cast<std::size_t>(H));
    for (int j = 0; j < H; ++j) src[static_cast<std::size_t>(j)] = pieces + static_cast<std::size_t>(j) * m;
    reduce_n<T>(src.data(), H, dst, nullptr, m, op, true, hc_.layout.size);
  }

  std::vector<route> routes_; // the call check's exchange's routes, one per member
};

} // namespace braid::mpi::detail
