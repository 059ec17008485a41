// braid/mpi/communicator.hpp — braid::mpi::communicator: hierarchical collectives over hosts.
//
// braid moves the data inside each host (shared memory between the processes of a host) and MPI
// carries the step between hosts. Construction is collective over an MPI communicator (see
// bootstrap.hpp for how hosts are found and BRAID_HOST_ID). Every rank calls the same collectives in
// the same order with the same counts, roots and operators; calls are blocking.
//
// The algorithms are hierarchy.hpp's, written once for both of braid::mpi's communicators; this file
// is their host stage: the host's braid::communicator inside each host, host memory for MPI.
//   reduce          an all_reduce whose result only the root keeps (costs what all_reduce costs).
//   barrier         barrier inside the host, the call check (a round between every pair, so a barrier)
//                   among the ranks of the inter-host stage, barrier inside the host.
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
#include "bootstrap.hpp"
#include "check.hpp"
#include "front.hpp"
#include "hierarchy.hpp"

namespace braid::mpi {


// valid(), rank(), size(), host(), hosts(), local_rank(), local_size(), uniform(), layout(),
// cross_comm() and calls() come from detail::front (front.hpp), as for cuda_communicator.
class communicator : public detail::hierarchy<communicator> {
  friend class detail::hierarchy<communicator>;

public:
  communicator() noexcept : hierarchy("communicator") {} // empty: every call raises usage_error
  communicator(communicator&& o) noexcept : hierarchy("communicator") { *this = std::move(o); }
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      scratch_ = std::move(o.scratch_);
      local_ = std::move(o.local_);
      hierarchy::operator=(std::move(o));
      pieces_ = std::move(o.pieces_);
      space_ = std::move(o.space_);
    }
    return *this;
  }
  // Frees the scratch memory before leaving the host communicator, which it is registered with.
  ~communicator() { scratch_ = buffer<std::uint64_t>(); }

  // Collective over `comm` (every rank of it calls this). MPI must be initialised; `comm` is
  // duplicated, so the caller may free it afterwards.
  explicit communicator(MPI_Comm comm, const options& opts = options::from_env()) : hierarchy("communicator", split_hosts(comm)) {
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
    call(check_call<collective::all_reduce, Op>(in, out, count, 0), [&] { do_all_reduce(in, out, count, op); });
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce_scatter(const T* in, T* out, std::size_t recv_count, Op op = {}) {
    call(check_call<collective::reduce_scatter, Op>(in, out, recv_count, 0), [&] { do_reduce_scatter(in, out, recv_count, op); });
  }
  template <element T> void all_gather(const T* in, T* out, std::size_t send_count) {
    call(check_call<collective::all_gather, braid::detail::copy_only>(in, out, send_count, 0), [&] { do_all_gather(in, out, send_count); });
  }
  template <element T> void broadcast(const T* in, T* out, std::size_t count, int root) {
    call(check_call<collective::broadcast, braid::detail::copy_only>(in, out, count, root), [&] { do_broadcast(in, out, count, root); });
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce(const T* in, T* out, std::size_t count, int root, Op op = {}) {
    call(check_call<collective::reduce, Op>(in, out, count, root), [&] {
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
      start_check(braid::detail::barrier_record(0));
      check_only();
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
  // Runs collective call `k` (its record, from check_call): its inter-host call check starts first.
  template <class F> void call(const braid::detail::call_record& k, F&& f) {
    call(std::string_view(name(k.coll)).data(), [&] {
      start_check(k);
      f();
    });
  }
  // Runs a call; any error marks the communicator failed.
  template <class F> void call(const char* what, F&& f) {
    begin_call(what);
    try {
      f();
      check_only(); // a checking rank without an exchange: none with these algorithms
    } catch (const std::exception& e) {
      mark_failed(e);
      throw;
    }
  }

  // ---- the host stage of detail::hierarchy (hierarchy.hpp) -------------------------------------------
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
  // Private memory for what MPI receives (pieces) and sends (space).
  template <class T> T* pieces(std::size_t count) { return grow_host<T>(pieces_, count); }
  template <class T> T* space(std::size_t count) { return grow_host<T>(space_, count); }
  static constexpr bool mpi_in_place() { return true; } // MPI works on host memory: the stage's own
  static constexpr bool mpi_on_host() { return true; }
  template <class T> static void copy(T* dst, const T* src, std::size_t n) {
    if (n && dst != src) std::memcpy(static_cast<void*>(dst), src, n * sizeof(T));
  }
  template <class T> static void zero(T* dst, std::size_t n) {
    if (n) std::memset(static_cast<void*>(dst), 0, n * sizeof(T));
  }
  template <class T> static void copy_rows(T* dst, std::size_t dpitch, const T* src, std::size_t spitch, std::size_t width, std::size_t rows) {
    for (std::size_t i = 0; i < rows; ++i) copy(dst + i * dpitch, src + i * spitch, width);
  }
  template <class T> static void to_mpi(T* dst, const T* src, std::size_t n) { copy(dst, src, n); }
  template <class T> static void from_mpi(T* dst, const T* src, std::size_t n) { copy(dst, src, n); }
  static void copy_mpi(void* dst, const void* src, std::size_t bytes) { std::memmove(dst, src, bytes); }
  static void before_mpi() {} // the host communicator's calls are done when they return
  template <class T, class Op> void local_all_reduce(const T* in, T* out, std::size_t n, const Op& op) { local_.all_reduce(in, out, n, op); }
  template <class T, class Op> void local_reduce_scatter(const T* in, T* out, std::size_t n, const Op& op) { local_.reduce_scatter(in, out, n, op); }
  template <class T> void local_all_gather(const T* in, T* out, std::size_t n) { local_.all_gather(in, out, n); }
  template <class T, class Op> void local_reduce(const T* in, T* out, std::size_t n, int root, const Op& op) { local_.reduce(in, out, n, root, op); }
  template <class T> void local_broadcast(const T* in, T* out, std::size_t n, int root) { local_.broadcast(in, out, n, root); }
  template <class T, class Op> void reduce_pieces_device(const T*, int, std::size_t, T*, const Op&) {} // MPI's memory is host memory
  // No pipeline: a host collective returns when it is done, so the slice goes through in one chunk.
  static constexpr std::size_t pipeline_depth = 1;
  template <class T> static std::size_t chunk_elements(std::size_t slice) { return slice; }
  static void mark(std::size_t) {}
  static void wait_mark(std::size_t, std::size_t) {}
  // A mismatch found by the call check is published to the host communicator, whose other ranks
  // raise it from their waits.
  void on_mismatch(const std::string& m) { local_.publish_failure(errc::mismatch, m); }

  braid::communicator local_;
  buffer<std::uint64_t> scratch_;
  std::vector<std::uint64_t> pieces_, space_;
};

} // namespace braid::mpi
