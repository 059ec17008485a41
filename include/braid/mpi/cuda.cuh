// braid/mpi/cuda.cuh — braid::mpi::cuda_communicator: hierarchical collectives over hosts, on device
// buffers.
//
// The device-pointer twin of braid::mpi::communicator (communicator.hpp): inside each host braid's CUDA
// communicator of the host's processes (cuda::process_communicator: the device path where every
// process has a GPU of its own, the host path where processes share one) moves and reduces the data;
// MPI carries the step between hosts. The algorithms, the partition of the data among the ranks and
// the reduction order are hierarchy.hpp's, the same text as communicator.hpp's; this file is their
// device stage. Construction is collective over an MPI communicator; rank r uses GPU
// local_rank % (visible GPUs) unless told otherwise.
//
//   MPI_Init(&argc, &argv);
//   braid::mpi::cuda_communicator comm(MPI_COMM_WORLD);
//   comm.all_reduce(d_in, d_out, count, braid::sum{}, stream);
//
// How the inter-host step reaches device memory (cuda_options::buffers, describe()):
//  * host (staged): the rank's piece is copied to pinned host memory, MPI works there, the result is
//    copied back.
//  all_reduce on a uniform layout pipelines the inter-host step by chunks of chunk_bytes of the rank's
//  slice: while MPI exchanges chunk k, the GPU runs the intra-host reduce_scatter of chunk k+1 (and
//  its copy to the host) — on the host communicator's device path, whose calls return at once.
//  * device (CUDA-aware MPI): MPI reads and writes device memory itself; the pieces from other hosts
//    are reduced on the GPU (the same reduce kernel as process_communicator's host path).
//  automatic picks device where the MPI library says it is CUDA-aware (MPIX_CUDA_AWARE_SUPPORT at
//  compile time and MPIX_Query_cuda_support() at run time, Open MPI's extension), host otherwise;
//  BRAID_MPI_CUDA_AWARE=0|1 overrides automatic (1 only for an MPI that is CUDA-aware without saying
//  so: a plain MPI handed device pointers crashes).
//
// Guarantees, as communicator.hpp's:
//  * Identical bits on every rank; reduction order: inside a host, braid's CUDA communicator's
//    algorithm (for up to 16 ranks per host the direct reduce_scatter/reduce the host communicator
//    uses too), across hosts the host partials in host order 0..H-1 in the accumulator type, finalize
//    (avg) once with the world size at the end. test_mpi_cuda (tests/mpi/test_mpi.cpp) checks the bits against
//    braid::mpi::communicator's on the same inputs.
//  * Any element type and operator braid supports on the GPU; MPI moves bytes only.
//  * Calls take a stream. With one host a call is the CUDA communicator's (stream-ordered; on the
//    device path it returns at once). With several hosts a rank in the inter-host step waits for
//    `stream` (work enqueued before the call must be able to finish), runs MPI and returns with the
//    last intra-host stage still enqueued; a rank with no part in it only enqueues its stages.
//    Consecutive calls are ordered whatever their streams (each waits for the previous one's event).
//  * Mismatched calls across hosts raise mismatch_error before any MPI call whose size depends on the
//    call: every rank of the inter-host stage (uniform: all; otherwise local ranks 0) makes the call
//    check of communicator.hpp (call_check.hpp: one round of blocks between every pair of members,
//    carrying the chained call word, and the step's first data exchange with it: from pinned copies
//    up to 208 bytes inside the blocks, from device memory always beside them), so the check costs no
//    round of its own here either. Hosts of equal size: every rank compares
//    and raises it itself. Otherwise the leader publishes it to the host's CUDA communicator
//    (process_communicator::publish_failure): its other ranks raise mismatch_error from their host
//    waits (host path), or their kernels stop and they raise it from check() after synchronising the
//    stream, or from their next call (device path; also from a check() of the previous call that
//    runs after the leader published: the group has one error record).
//  * Bad arguments raise invalid_argument before anything moves; any error during a call (MPI's as
//    braid::system_error, the CUDA communicator's, a CUDA error), or raised by check(), makes the
//    communicator refuse further calls (usage_error); one during a call also aborts the host's CUDA
//    communicator. Waits inside MPI have MPI's semantics (no deadline); waits inside a host have
//    braid's deadline (BRAID_TIMEOUT), and on the device path they run inside kernels that wait for a
//    host peer still in MPI: an inter-host step longer than the deadline is reported as a timeout.
// Needs <mpi.h> and CUDA (nvcc, or braid's emulated device): not part of <braid/braid.hpp>.
#pragma once

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h> // Open MPI: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../cuda.cuh"
#include "bootstrap.hpp"
#include "check.hpp"
#include "communicator.hpp"
#include "front.hpp"
#include "hierarchy.hpp"

namespace braid::mpi {

// Where the inter-host step's MPI calls find the data (see the file comment).
enum class mpi_buffers { automatic, host, device };

struct cuda_options {
  cuda::process_options local = {};                 // the host's CUDA communicator
  mpi_buffers buffers = mpi_buffers::automatic;
  std::size_t chunk_bytes = std::size_t{4} << 20;   // all_reduce pipeline: chunk of a rank's slice
};

namespace cuda_mpi_detail {

// Does this MPI library take device pointers? Compile time and run time must both say so.
inline bool mpi_says_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

using cuda::detail::owned_event;
using cuda::detail::owned_stream;
using pinned_memory = cuda::detail::grow_only<cuda::detail::memory_kind::pinned>;
using device_scratch = cuda::detail::grow_only<cuda::detail::memory_kind::device>;

} // namespace cuda_mpi_detail

// valid(), rank(), size(), host(), hosts(), local_rank(), local_size(), uniform(), layout(),
// cross_comm() and calls() come from detail::front (front.hpp), as for communicator.
class cuda_communicator : public detail::hierarchy<cuda_communicator> {
  friend class detail::hierarchy<cuda_communicator>;

public:
  cuda_communicator() noexcept : hierarchy("cuda_communicator") {} // empty: every call raises usage_error
  cuda_communicator(cuda_communicator&& o) noexcept : hierarchy("cuda_communicator") { *this = std::move(o); }
  cuda_communicator& operator=(cuda_communicator&& o) noexcept {
    if (this != &o) {
      release();
      local_ = std::move(o.local_);
      device_ = o.device_;
      max_pitch_ = o.max_pitch_;
      direct_ = o.direct_;
      chunk_bytes_ = o.chunk_bytes_;
      hierarchy::operator=(std::move(o));
      mismatch_everywhere_ = std::exchange(o.mismatch_everywhere_, false);
      scratch_ = std::move(o.scratch_);
      pieces_dev_ = std::move(o.pieces_dev_);
      space_dev_ = std::move(o.space_dev_);
      sink_ = std::move(o.sink_);
      done_ = std::move(o.done_);
      pinned_ = std::move(o.pinned_);
      staging_ = std::move(o.staging_);
      events_ = std::move(o.events_);
      side_ = std::move(o.side_);
      stats_ = o.stats_;
    }
    return *this;
  }
  ~cuda_communicator() { release(); }

  // Collective over `comm`. MPI must be initialised; `comm` is duplicated. `device` -1: GPU
  // local_rank % (number of visible GPUs).
  explicit cuda_communicator(MPI_Comm comm, int device = -1, const cuda_options& o = {}) : hierarchy("cuda_communicator", split_hosts(comm)) {
    const host_layout& L = hc_.layout;
    if (o.chunk_bytes < 256) raise(errc::invalid_argument, "cuda_options::chunk_bytes must be at least 256", error_context{L.rank, "cuda_communicator", 0, -1});
    // The host's CPU communicator first (MPI carries its id), then the CUDA communicator over it.
    const error_context cx{L.rank, "cuda_communicator", 0, -1};
    direct_ = o.buffers == mpi_buffers::device || (o.buffers == mpi_buffers::automatic && cuda_mpi_detail::mpi_says_cuda_aware());
    const char* env = o.buffers == mpi_buffers::automatic ? std::getenv("BRAID_MPI_CUDA_AWARE") : nullptr;
    braid::communicator host = join_local(hc_.world.get(), hc_.local.get(), o.local.base);
    std::exception_ptr failure;
    try {
      if (env && *env) {
        if (std::strcmp(env, "0") != 0 && std::strcmp(env, "1") != 0)
          raise(errc::invalid_argument, std::string("BRAID_MPI_CUDA_AWARE must be 0 or 1, got '") + env + "'", cx);
        direct_ = env[0] == '1';
      }
      // The device-memory reduction takes at most max_ranks pieces (process_communicator's bound).
      if (direct_ && L.hosts > cuda::process::max_ranks)
        raise(errc::unsupported, "MPI on device memory: at most " + std::to_string(cuda::process::max_ranks) + " hosts", cx);
      if (device < 0) {
        int count = 0;
        BRAID_CUDA_CHECK(cudaGetDeviceCount(&count));
        if (count < 1) raise(errc::unsupported, "no CUDA device", cx);
        device = L.local_rank % count;
      }
      local_ = cuda::process_communicator(std::move(host), device, o.local);
      cuda::detail::device_guard dg(device);
      int pitch = 0;
      BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, device));
      max_pitch_ = static_cast<std::size_t>(static_cast<unsigned>(pitch));
      for (auto& e : events_) BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&e.h, cudaEventDisableTiming));
      BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&done_.h, cudaEventDisableTiming));
      BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&side_.h, cudaStreamNonBlocking));
    } catch (...) {
      failure = std::current_exception();
      // Release this host's peers: from the host communicator if it was not handed on yet, else from
      // the CUDA communicator (which aborts its own host communicator when its constructor fails).
      try {
        if (host.valid()) host.abort();
        else if (local_.valid()) local_.abort();
      } catch (...) {
      }
    }
    // Every rank learns here whether every other one is set up, rather than hanging in a first call.
    int bad = failure ? 1 : 0, any = 0;
    BRAID_MPI_CHECK(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, hc_.world.get()));
    if (failure) std::rethrow_exception(failure);
    if (any) {
      try {
        local_.abort(); // closing would wait at a barrier for peers that failed
      } catch (...) {
      }
      raise(errc::peer_failed, "braid::mpi::cuda_communicator: another rank failed to set up its CUDA communicator");
    }
    device_ = device;
    chunk_bytes_ = o.chunk_bytes;
    live_ = true;
  }

  int device() const { return (void)lay(), device_; }
  cuda::process_communicator& local() { return (void)lay(), local_; } // this host's CUDA communicator
  // Whether MPI is handed device pointers (mpi_buffers::device) or pinned host copies.
  bool mpi_on_device() const { return (void)lay(), direct_; }
  // One line for logs: hosts, layout, the host communicator's path, where MPI's buffers are.
  std::string describe() const {
    const host_layout& L = lay();
    return std::to_string(L.size) + " ranks on " + std::to_string(L.hosts) + (L.hosts == 1 ? " host" : " hosts") +
           (L.uniform ? "" : " (uneven)") + "; inside the host: " + local_.describe() + "; between hosts: MPI on " +
           (direct_ ? "device memory (CUDA-aware)" : "pinned host copies");
  }
  // What the inter-host step did, for tests: chunks pipelined, bytes copied to/from pinned memory.
  struct stats_t {
    std::uint64_t chunks = 0;        // all_reduce chunks through the inter-host step
    std::uint64_t staged_bytes = 0;  // device <-> pinned host copies of the inter-host step
    std::uint64_t ahead = 0;         // chunks whose MPI exchange began with a later chunk already enqueued
    std::uint64_t gpu_busy = 0;      // ... and that later chunk's GPU work not yet done (measured: overlap)
  };
  const stats_t& stats() const { return stats_; }

  // ---- collectives: device pointers; semantics and in-place forms as braid::mpi::communicator's ----
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void all_reduce(const T* in, T* out, std::size_t count, Op op, cudaStream_t stream) {
    call(check_call<collective::all_reduce, Op>(in, out, count, 0), stream, [&] { do_all_reduce(in, out, count, op); });
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce(const T* in, T* out, std::size_t count, int root, Op op, cudaStream_t stream) {
    call(check_call<collective::reduce, Op>(in, out, count, root), stream, [&] {
      if (rank() == root) return do_all_reduce(in, out, count, op);
      T* sink = sink_.get<T>(count, done_.h);
      do_all_reduce(in, sink, count, op);
    });
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce_scatter(const T* in, T* out, std::size_t recv_count, Op op, cudaStream_t stream) {
    call(check_call<collective::reduce_scatter, Op>(in, out, recv_count, 0), stream, [&] { do_reduce_scatter(in, out, recv_count, op); });
  }
  template <element T> void all_gather(const T* in, T* out, std::size_t send_count, cudaStream_t stream) {
    call(check_call<collective::all_gather, braid::detail::copy_only>(in, out, send_count, 0), stream, [&] { do_all_gather(in, out, send_count); });
  }
  template <element T> void broadcast(const T* in, T* out, std::size_t count, int root, cudaStream_t stream) {
    call(check_call<collective::broadcast, braid::detail::copy_only>(in, out, count, root), stream, [&] { do_broadcast(in, out, count, root); });
  }
  // span forms (device memory)
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void all_reduce(std::span<T> data, Op op, cudaStream_t stream) { all_reduce(data.data(), data.data(), data.size(), op, stream); }
  template <element T> void broadcast(std::span<T> data, int root, cudaStream_t stream) { broadcast(data.data(), data.data(), data.size(), root, stream); }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, Op op, cudaStream_t stream) {
    if (in.size() != out.size() * static_cast<std::size_t>(size()))
      raise(errc::invalid_argument, "reduce_scatter: in.size() must equal out.size() * size()", error_context{rank(), "reduce_scatter", 0, -1});
    reduce_scatter(in.data(), out.data(), out.size(), op, stream);
  }
  template <element T> void all_gather(std::span<const T> in, std::span<T> out, cudaStream_t stream) {
    if (out.size() != in.size() * static_cast<std::size_t>(size()))
      raise(errc::invalid_argument, "all_gather: out.size() must equal in.size() * size()", error_context{rank(), "all_gather", 0, -1});
    all_gather(in.data(), out.data(), in.size(), stream);
  }
  // Raises what a kernel of this host's group recorded (a timeout, an abort, a mismatch across hosts
  // that this host's leader published), if anything: call it after synchronising the stream (the
  // device path reports kernel errors no other way). After it raised, the communicator refuses further
  // calls (usage_error), as after an error raised by a call.
  void check() const {
    (void)lay();
    try {
      local_.check();
    } catch (const std::exception& e) {
      mark_failed(e);
      throw;
    }
  }

  // Returns when the stream's earlier work is done on every rank.
  void barrier(cudaStream_t stream) {
    call("barrier", stream, [&] {
      sync(stream);
      local_.barrier(stream);
      // The call check among the ranks that take part in the inter-host stage (every rank of a
      // uniform layout, the local ranks 0 otherwise) is a round between every pair of them: it is the
      // inter-host barrier.
      start_check(braid::detail::barrier_record(0));
      check_only();
      local_.barrier(stream);
    });
  }

private:
  void release() noexcept {
    if (!live_) return;
    try {
      cuda::detail::device_guard dg(device_);
      if (done_.h) cudaEventSynchronize(done_.h); // the last call's copies may still read pinned memory
      if (side_.h) cudaStreamSynchronize(side_.h);
    } catch (...) {
    }
    free_types();
    live_ = false;
  }

  // Runs collective call `k` (its record, from check_call): its inter-host call check starts first.
  template <class F> void call(const braid::detail::call_record& k, cudaStream_t stream, F&& f) {
    call(std::string_view(name(k.coll)).data(), stream, [&] {
      start_check(k);
      f();
    });
  }
  // Runs a call on this communicator's GPU, after the previous call's copies are done with the
  // scratch and pinned memory; any error marks the communicator failed.
  template <class F> void call(const char* what, cudaStream_t stream, F&& f) {
    begin_call(what);
    stream_ = stream;
    try {
      cuda::detail::device_guard dg(device_);
      BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream, done_.h, 0));
      f();
      check_only(); // a checking rank without an inter-host MPI call: none with these algorithms
      BRAID_CUDA_CHECK(cudaEventRecord(done_.h, stream));
    } catch (const std::exception& e) {
      mark_failed(e);
      // This host's peers may wait for this rank in the CUDA communicator: release them (they raise
      // aborted_error, or mismatch_error where the call check published a mismatch first: the first
      // failure recorded wins), unless every rank found the mismatch itself (on_mismatch); and let
      // the destructor wait for whatever this call left on the stream.
      try {
        if (!mismatch_everywhere_) local_.abort();
      } catch (...) {
      }
      (void)cudaEventRecord(done_.h, stream);
      throw;
    }
  }

  // ---- the device stage of detail::hierarchy (hierarchy.hpp) -----------------------------------------
  // Every stage operation of a call works on the call's stream (stream_), in call order.
  //
  // A mismatch found by the call check. Hosts of unequal size: the leader publishes it to the host's
  // CUDA communicator, so that its other ranks raise mismatch_error from their host waits, or their
  // kernels stop and they raise it from check() or their next call. Uniform layouts: every rank
  // compares on its own cross communicator and all reach the same verdict (a host's ranks make the
  // same calls, so every cross communicator links the same calls), so nothing is published and the
  // group is not aborted: a host peer told through the group's record could raise from it (check() at
  // a stream wait) before its own exchange and leave its cross-communicator peers waiting in MPI.
  void on_mismatch(const std::string& m) {
    if (hc_.layout.uniform) mismatch_everywhere_ = true;
    else local_.publish_failure(errc::mismatch, m);
  }

  // The host waits for `stream`, then raises what a kernel of the host's group recorded, if anything.
  void sync(cudaStream_t stream) {
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream));
    local_.check();
  }
  void before_mpi() { sync(stream_); }

  // Memory: scratch in device memory (the host's CUDA communicator reads it in place); MPI receives
  // into and sends from device memory (CUDA-aware MPI) or host memory (pieces in private memory, what
  // is copied to and from the device in pinned memory). Each is taken once per call, before the call
  // enqueues work that uses it (a larger size reallocates).
  template <class T> T* scratch(std::size_t count) { return scratch_.get<T>(count, done_.h); }
  template <class T> T* pieces(std::size_t count) {
    return direct_ ? pieces_dev_.get<T>(count, done_.h) : grow_host<T>(staging_, count);
  }
  template <class T> T* space(std::size_t count) { return direct_ ? space_dev_.get<T>(count, done_.h) : pinned_.get<T>(count, done_.h); }
  bool mpi_in_place() const { return direct_; }
  bool mpi_on_host() const { return !direct_; }

  template <class T> void copy(T* dst, const T* src, std::size_t n) {
    if (n && dst != src) BRAID_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
  }
  template <class T> void zero(T* dst, std::size_t n) {
    if (n) BRAID_CUDA_CHECK(cudaMemsetAsync(dst, 0, n * sizeof(T), stream_));
  }
  // rows x width elements between pitched layouts (pitches in elements).
  template <class T> void copy_rows(T* dst, std::size_t dpitch, const T* src, std::size_t spitch, std::size_t width, std::size_t rows) {
    if (!width || !rows) return;
    if (std::max(dpitch, spitch) * sizeof(T) > max_pitch_) {
      for (std::size_t i = 0; i < rows; ++i) copy(dst + i * dpitch, src + i * spitch, width);
      return;
    }
    BRAID_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch * sizeof(T), src, spitch * sizeof(T), width * sizeof(T), rows, cudaMemcpyDeviceToDevice, stream_));
  }
  // Between the device and MPI's memory: nothing in place, else pinned copies (counted in stats).
  template <class T> void to_mpi(T* dst, const T* src, std::size_t n) {
    if (!n || dst == src) return;
    if (direct_) return copy(dst, src, n);
    BRAID_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    stats_.staged_bytes += n * sizeof(T);
  }
  template <class T> void from_mpi(T* dst, const T* src, std::size_t n) {
    if (!n || dst == src) return;
    if (direct_) return copy(dst, src, n);
    BRAID_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, stream_));
    stats_.staged_bytes += n * sizeof(T);
  }
  // A copy inside MPI's memory (the call check's own route, or bytes a peer sent inline), done when it
  // returns: MPI and the reduction read it next. Host memory (pinned copies): memmove; device memory:
  // a copy on the side stream.
  void copy_mpi(void* dst, const void* src, std::size_t bytes) {
    if (!direct_) return (void)std::memmove(dst, src, bytes);
    BRAID_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, side_.h));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(side_.h));
  }

  template <class T, class Op> void local_all_reduce(const T* in, T* out, std::size_t n, const Op& op) { local_.all_reduce(in, out, n, op, stream_); }
  template <class T, class Op> void local_reduce_scatter(const T* in, T* out, std::size_t n, const Op& op) { local_.reduce_scatter(in, out, n, op, stream_); }
  template <class T> void local_all_gather(const T* in, T* out, std::size_t n) { local_.all_gather(in, out, n, stream_); }
  template <class T, class Op> void local_reduce(const T* in, T* out, std::size_t n, int root, const Op& op) { local_.reduce(in, out, n, root, op, stream_); }
  template <class T> void local_broadcast(const T* in, T* out, std::size_t n, int root) { local_.broadcast(in, out, n, root, stream_); }

  // dst[i] = finalize(op(piece_0[i], ..., piece_{H-1}[i])) in device memory: process_communicator's
  // reduce kernel on the side stream, pieces in order in the accumulator type (the CPU loop's order).
  template <class T, class Op> void reduce_pieces_device(const T* pieces, int H, std::size_t m, T* dst, const Op& op) {
    cuda::process::sources<T> src{};
    for (int j = 0; j < H; ++j) src.p[j] = pieces + static_cast<std::size_t>(j) * m;
    const unsigned threads = 256;
    const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(64, (m + threads - 1) / threads));
    const cuda::process::u64 m64 = m; // the kernel's parameter type (a cast would be useless where it is size_t)
    BRAID_CUDA_CHECK(cuda::device::launch(&cuda::process::reduce_kernel<T, Op>, blocks, threads, 0, side_.h, src, H, dst,
                                 static_cast<T*>(nullptr), m64, op, true, hc_.layout.size));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(side_.h));
  }

  // The all_reduce pipeline: chunks of chunk_bytes of the slice, `pipeline_depth` in flight. While MPI
  // carries chunk k, the GPU runs the intra-host reduce_scatter of chunk k+1 (and its copy to the
  // host), on the host communicator's device path, whose calls return at once.
  static constexpr std::size_t pipeline_depth = 2;
  template <class T> std::size_t chunk_elements(std::size_t) const { return chunk_bytes_ / sizeof(T); }
  void mark(std::size_t k) { BRAID_CUDA_CHECK(cudaEventRecord(events_[k % pipeline_depth].h, stream_)); }
  void wait_mark(std::size_t k, std::size_t enqueued) {
    BRAID_CUDA_CHECK(cudaEventSynchronize(events_[k % pipeline_depth].h));
    local_.check();
    if (enqueued > k + 1) {
      ++stats_.ahead; // a later chunk's GPU work is queued beside this MPI step
      if (cudaEventQuery(events_[(k + 1) % pipeline_depth].h) == cudaErrorNotReady) ++stats_.gpu_busy;
      (void)cudaGetLastError();
    }
    ++stats_.chunks;
  }

  cuda::process_communicator local_;
  int device_ = 0;
  std::size_t max_pitch_ = 0; // cudaDevAttrMaxPitch: 2-D copies with a wider pitch go row by row
  bool direct_ = false;
  std::size_t chunk_bytes_ = 0;
  bool mismatch_everywhere_ = false; // a uniform layout's check failed: every rank raises it itself
  cudaStream_t stream_ = nullptr; // the stream of the call in progress
  cuda_mpi_detail::device_scratch scratch_, pieces_dev_, space_dev_, sink_;
  cuda_mpi_detail::pinned_memory pinned_;
  std::vector<std::uint64_t> staging_;
  std::array<cuda_mpi_detail::owned_event, pipeline_depth> events_;
  cuda_mpi_detail::owned_event done_;
  cuda_mpi_detail::owned_stream side_;
  stats_t stats_;
};

} // namespace braid::mpi
