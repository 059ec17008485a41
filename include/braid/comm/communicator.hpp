// braid/comm/communicator.hpp — braid::communicator, what users hold: the collectives on the host.
//
// A communicator connects `size()` ranks: threads of one process (braid::run_threads, thread_group)
// or processes on one host (communicator::join with a unique_id, communicator_from_env() under
// torchrun or mpirun). Every rank calls the same collectives in the same order. Calls are blocking: when one
// returns, this rank's output is complete and its input is no longer read by anyone.
//
// Guarantees
//  * Results are bit-identical on every rank, for every type and operator: each output element is
//    computed once (or by the same expression in the same order) and copied. one_shot, two_shot and
//    direct reduce in rank order 0..n-1 in the accumulator type, and so agree with each other bit for
//    bit; ring, tree and halving_doubling use their own fixed orders and store partial results in T
//    between ranks. Integers with their default accumulator, and min/max without NaNs, agree across
//    all algorithms.
//  * Bad arguments raise invalid_argument before anything is read or written, on this rank only; the
//    communicator stays usable and the call may be repeated with good arguments.
//  * Every wait has a deadline (options::timeout, BRAID_TIMEOUT): waiting longer than that for one
//    peer is an error. A timeout, a peer that died or left, abort(), or any other error inside a call
//    (send/recv size mismatches included) is published to every rank: calls in progress raise, and
//    from then on the communicator refuses further calls (usage_error); build a new one to go on.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <tuple>
#include <chrono>
#include <utility>
#include <algorithm>
#include <vector>

#include <poll.h>

#include "../host/rendezvous/rendezvous.hpp"
#include "../host/rendezvous/unique_id.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/types.hpp"
#include "../schedule/schedule.hpp"
#include "../host/context.hpp"
#include "../host/executor.hpp"
#include "../host/memory.hpp"
#include "../host/p2p.hpp"
#include "../host/registry.hpp"
#include "../host/segment.hpp"
#include "buffer.hpp"
#include "fingerprint.hpp"
#include "options.hpp"
#include "registration.hpp"
#include "sendrecv.hpp"
#include "state.hpp"
#include "tuning.hpp"
#include "validate.hpp"

namespace braid {

class thread_group;

class communicator {
public:
  communicator() = default; // empty: every call raises usage_error
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      close();
      p_ = std::move(o.p_);
    }
    return *this;
  }
  ~communicator() { close(); }

  // Joins the processes of a communicator on this host. Every rank passes the same id and nranks.
  static communicator join(const unique_id& id, int rank, int nranks, const options& opts = options::from_env());

  int rank() const { return live().cx.rank; }
  int size() const { return live().cx.nranks; }
  bool valid() const noexcept { return p_ != nullptr; }
  // Bytes of shared memory this rank's communicator holds for staging and send/recv.
  std::size_t memory_bytes() const { return live().cx.seg.layout.staging_stride; }

  // Leaves the communicator; later calls raise usage_error. Peers still waiting for this rank raise
  // peer_failed. Idempotent; the destructor calls it.
  void close() noexcept {
    if (!p_) return;
    p_->cx.self().state.store(static_cast<std::uint32_t>(p_->failed ? host::rank_state::failed : host::rank_state::left),
                              std::memory_order_release);
    // Peers asleep on a word this rank posts see it leave now, not at their next recheck.
    p_->cx.wake_own_sleepers();
    for (int fd : p_->cx.peer_pidfd)
      if (fd >= 0) ::close(fd);
    if (p_->reg) p_->reg->drop_peers(); // nothing reads the peers' buffers any more; live buffers keep the registry
    p_.reset();
  }

  // Releases every rank blocked in a call of this communicator (any thread may call it): they raise
  // aborted_error within a millisecond or two, and the communicator refuses further calls.
  void abort() {
    impl& p = live();
    p.cx.publish_failure(errc::aborted, "abort() called on rank " + std::to_string(p.cx.rank));
  }

  // For a layer built over this communicator (braid::mpi, whose leaders compare calls across hosts):
  // publishes a failure the layer found outside this communicator's own calls as if a call had found
  // it. Every rank blocked in a call of this communicator, or entering one, raises it (errc::mismatch:
  // mismatch_error; errc::aborted: aborted_error; otherwise peer_error naming this rank), and this
  // communicator refuses further calls. The first failure published wins.
  void publish_failure(errc code, const std::string& message) {
    impl& p = live();
    p.failed = true;
    p.failure = message;
    p.cx.publish_failure(code, message);
    p.cx.self().state.store(static_cast<std::uint32_t>(host::rank_state::failed), std::memory_order_release);
    p.cx.wake_own_sleepers();
  }

  // Which algorithm a call would use (after per-call, environment and tuning table choices).
  algo algorithm_for(collective c, std::uint64_t bytes, algo requested = algo::automatic) const {
    const impl& p = live();
    if (requested != algo::automatic) return requested;
    const algo env = static_cast<int>(c) < 5 ? p.opts.algorithm[static_cast<int>(c)] : algo::automatic;
    if (env != algo::automatic && supports(env, c)) return env;
    return choose_algorithm(host_tuning, c, p.cx.nranks, bytes,
                            p.cx.mode == host::rank_mode::threads ? thread_ranks : process_ranks);
  }

  // ---- collectives: pointer forms ------------------------------------------------------------------
  // all_reduce: out[i] = op(in_0[i], ..., in_{n-1}[i]) on every rank. in == out is in-place.
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void all_reduce(const T* in, T* out, std::size_t count, Op op = {}, call_options co = {}) {
    run<collective::all_reduce, T>(in, out, count, 0, op, co);
  }
  // broadcast: out = root's in on every rank (in is read on the root only; in == out is in-place).
  template <element T>
  void broadcast(const T* in, T* out, std::size_t count, int root, call_options co = {}) {
    run<collective::broadcast, T>(in, out, count, root, detail::copy_only{}, co);
  }
  // reduce: the root's out = op over every rank's in (out is written on the root only).
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce(const T* in, T* out, std::size_t count, int root, Op op = {}, call_options co = {}) {
    run<collective::reduce, T>(in, out, count, root, op, co);
  }
  // reduce_scatter: in holds size() blocks of recv_count; out = block rank() of the reduction.
  // In-place: out == in + rank() * recv_count.
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce_scatter(const T* in, T* out, std::size_t recv_count, Op op = {}, call_options co = {}) {
    run<collective::reduce_scatter, T>(in, out, recv_count, 0, op, co);
  }
  // all_gather: out holds size() blocks of send_count; block r = rank r's in.
  // In-place: in == out + rank() * send_count.
  template <element T>
  void all_gather(const T* in, T* out, std::size_t send_count, call_options co = {}) {
    run<collective::all_gather, T>(in, out, send_count, 0, detail::copy_only{}, co);
  }
  void barrier() {
    busy_guard g(live());
    impl& p = enter(g.p, "barrier");
    guarded(p, [&] {
      if (p.cx.nranks == 1) return;
      const detail::call_description fp = detail::describe(detail::barrier_record(++p.collectives));
      if (p.opts.debug) detail::check_fingerprint(p, fp);
      p.cx.begin_rounds(fp);
      host::run_barrier(p.cx);
    });
  }

  // Point to point: blocking; send returns once `peer` has received everything. Sizes must match.
  template <element T> void send(const T* data, std::size_t count, int peer) {
    busy_guard g(live());
    impl& p = enter(g.p, "send");
    check_p2p<T>(p, data, count, peer, "send");
    guarded(p, [&] { detail::do_sendrecv(p, data, count * sizeof(T), peer, nullptr, 0, -1); });
  }
  template <element T> void recv(T* data, std::size_t count, int peer) {
    busy_guard g(live());
    impl& p = enter(g.p, "recv");
    check_p2p<T>(p, data, count, peer, "recv");
    guarded(p, [&] { detail::do_sendrecv(p, nullptr, 0, -1, data, count * sizeof(T), peer); });
  }
  // Sends to one peer while receiving from another (or the same): the ring-exchange step that plain
  // blocking send/recv would deadlock on.
  template <element T>
  void sendrecv(const T* send_data, std::size_t send_count, int send_peer, T* recv_data, std::size_t recv_count,
                int recv_peer) {
    busy_guard g(live());
    impl& p = enter(g.p, "sendrecv");
    check_p2p<T>(p, send_data, send_count, send_peer, "sendrecv (send side)");
    check_p2p<T>(p, recv_data, recv_count, recv_peer, "sendrecv (recv side)");
    if (send_count && recv_count && detail::overlaps(send_data, send_count * sizeof(T), recv_data, recv_count * sizeof(T)))
      raise(errc::invalid_argument, "sendrecv: send and receive buffers overlap", p.cx.ctx);
    guarded(p, [&] {
      detail::do_sendrecv(p, send_data, send_count * sizeof(T), send_peer, recv_data, recv_count * sizeof(T), recv_peer);
    });
  }

  // ---- collectives: span forms ---------------------------------------------------------------------
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void all_reduce(std::span<T> data, Op op = {}, call_options co = {}) {
    all_reduce(data.data(), data.data(), data.size(), op, co);
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void all_reduce(std::span<const T> in, std::span<T> out, Op op = {}, call_options co = {}) {
    if (out.size() != in.size()) size_error("all_reduce", "out.size() must equal in.size()");
    all_reduce(in.data(), out.data(), in.size(), op, co);
  }
  template <element T> void broadcast(std::span<T> data, int root, call_options co = {}) {
    broadcast(data.data(), data.data(), data.size(), root, co);
  }
  template <element T, class Op = sum<>>
    requires reduction_for<Op, T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, Op op = {}, call_options co = {}) {
    if (in.size() != out.size() * static_cast<std::size_t>(size()))
      size_error("reduce_scatter", "in.size() must equal out.size() * size()");
    reduce_scatter(in.data(), out.data(), out.size(), op, co);
  }
  template <element T> void all_gather(std::span<const T> in, std::span<T> out, call_options co = {}) {
    if (out.size() != in.size() * static_cast<std::size_t>(size()))
      size_error("all_gather", "out.size() must equal in.size() * size()");
    all_gather(in.data(), out.data(), in.size(), co);
  }

  std::uint64_t calls() const { return live().seq; }

  // Allocates `count` elements that peers can read in place (collective for processes: every rank
  // calls it, in the same order; sizes may differ). Zero-initialised.
  //
  // Freed buffers (processes). A rank frees its buffer on its own: buffer::release punches the pages
  // out of the memfd at once, and the id waits in the registry. Its next alloc sends the ids freed
  // since its previous one (exchange_registration), and every peer unmaps its copies there. Why no
  // peer is reading a buffer when its pages are punched or its mapping is dropped:
  //  * Peer q reads rank r's buffer only inside a collective in which r published a descriptor of it,
  //    i.e. whose input on r lies in that buffer. Such a call on r is zero-copy and returns only after
  //    every peer has finished the call's last round (run_schedule's final wait; guarantees.md,
  //    completion semantics), so every read of q happens before r's call returns. The owner can free
  //    only after its call returned (the buffer is its own object, the call blocks its thread), and
  //    after the free r describes the buffer to nobody (remove_own). So the punch comes after every
  //    read. (If the call raised instead, a peer may still be reading until it sees the failure: it
  //    then reads zeros, never faults, since the file keeps its size; its result is unspecified anyway.)
  //  * Peer q unmaps inside its own alloc, on the one thread that holds q's communicator (busy_guard),
  //    the same thread that reads through q's mappings, which it does only inside q's collectives.
  //    alloc is not a collective that reads anything, so q is between reads when it unmaps. And the
  //    id reaches q only after r freed the buffer, which (above) is after every read of it.
  template <element T> buffer<T> alloc(std::size_t count) {
    busy_guard g(live());
    impl& p = enter(g.p, "alloc");
    if (count > (std::size_t{1} << 40) / sizeof(T)) raise(errc::invalid_argument, "alloc: count too large", p.cx.ctx);
    const std::size_t bytes = std::max<std::size_t>(4096, (count * sizeof(T) + 4095) / 4096 * 4096);
    buffer<T> b;
    b.count_ = count;
    if (p.cx.mode == host::rank_mode::threads || p.cx.nranks == 1) {
      b.mem_ = host::mapped_memory::anonymous(bytes); // threads read each other's memory anyway
      return b;
    }
    guarded(p, [&] {
      b.mem_ = host::mapped_memory::create_shared(bytes, "braid-buffer");
      const std::uint64_t id = p.reg->next_id();
      detail::exchange_registration(p, id, b.mem_);
      p.reg->add_own(id, b.mem_.data(), count * sizeof(T));
      b.reg_ = p.reg;
      b.id_ = id;
    });
    return b;
  }

private:
  friend class thread_group;
  using impl = detail::communicator_state;
  std::unique_ptr<impl> p_;

  impl& live() const {
    if (!p_) raise(errc::invalid_usage, "this communicator is empty (default-constructed, moved from or closed)");
    return *p_;
  }

  // Claims the communicator for this thread for the duration of a call.
  struct busy_guard {
    impl& p;
    explicit busy_guard(impl& q) : p(q) {
      if (p.busy.exchange(true, std::memory_order_acquire))
        raise(errc::invalid_usage, "the communicator is already in a call on another thread; a communicator "
                                   "is used by one thread at a time", error_context{p.cx.rank, nullptr, 0, -1});
    }
    busy_guard(const busy_guard&) = delete;
    ~busy_guard() { p.busy.store(false, std::memory_order_release); }
  };

  // Starts a call (the guard must already be held): checks the communicator is usable, including
  // that no other rank has failed or aborted it, and sets the call's context.
  impl& enter(impl& p, const char* what) {
    if (!p.failed && p.cx.seg.header().abort_word.load(std::memory_order_acquire) != 0) {
      p.cx.begin_call(what, p.seq + 1);
      try {
        p.cx.check_abort(-1);
      } catch (const error& e) {
        p.failed = true;
        p.failure = e.what();
        // Mismatched calls found by a peer after this rank's part of the call had returned (the root
        // of a staged broadcast, for one): this rank learns it here, as the same error.
        if (e.code() == errc::mismatch) throw;
      }
    }
    if (p.failed)
      raise(errc::invalid_usage, std::string("the communicator failed earlier and refuses further calls: ") + p.failure,
            error_context{p.cx.rank, what, p.seq + 1, -1});
    p.cx.begin_call(what, p.seq + 1);
    return p;
  }

  // Runs the data-moving part of a call; any error there poisons the communicator and is published
  // so that every rank stops waiting.
  template <class F> void guarded(impl& p, F&& f) {
    ++p.seq;
    auto poison = [&](errc code, const std::string& what) {
      p.failed = true;
      p.failure = what;
      if (code != errc::peer_failed && code != errc::aborted) p.cx.publish_failure(code, what);
      p.cx.self().state.store(static_cast<std::uint32_t>(host::rank_state::failed), std::memory_order_release);
      p.cx.wake_own_sleepers();
    };
    try {
      f();
    } catch (const error& e) {
      // Raised below the communicator without its context (a registry, a message check): it gets
      // this rank, the call and its sequence number here, so that every error says who and where.
      if (detail::lacks_context(e)) {
        try {
          detail::raise_in_context(e, p.cx.ctx);
        } catch (const error& full) {
          poison(full.code(), full.what());
          throw;
        }
      }
      poison(e.code(), e.what());
      throw;
    } catch (const std::exception& e) {
      poison(errc::internal, std::string("rank ") + std::to_string(p.cx.rank) + ": " + e.what());
      throw;
    } catch (...) {
      poison(errc::internal, "rank " + std::to_string(p.cx.rank) + ": an exception escaped the call");
      throw;
    }
  }

  [[noreturn]] void size_error(const char* what, const char* msg) const {
    raise(errc::invalid_argument, std::string(what) + ": " + msg, error_context{live().cx.rank, what, 0, -1});
  }

  template <class T> void check_p2p(impl& p, const void* data, std::size_t count, int peer, const char* what) {
    if (peer < 0 || peer >= p.cx.nranks)
      raise(errc::invalid_argument, std::string(what) + ": peer " + std::to_string(peer) + " out of range [0, " +
                                        std::to_string(p.cx.nranks) + ")", p.cx.ctx);
    if (peer == p.cx.rank) raise(errc::invalid_argument, std::string(what) + ": peer is this rank itself", p.cx.ctx);
    if (count > static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(T))
      raise(errc::invalid_argument, std::string(what) + ": count * sizeof(T) overflows", p.cx.ctx);
    if (count) detail::check_buffer<T>(data, "buffer", p.cx.ctx);
  }

  template <collective c, class T, class Op>
  void run(const T* in, T* out, std::size_t count, int root, const Op& op, call_options co) {
    busy_guard g(live());
    impl& p = enter(g.p, std::string_view(name(c)).data());
    const int n = p.cx.nranks, r = p.cx.rank;
    // ---- validation: nothing is touched before all of it passed ----
    detail::call_record k = detail::validate_call<c, T, Op>(in, out, count, root, n, r, co.algorithm, p.cx.ctx);
    if (count == 0) return; // not counted, synchronises nothing, in debug mode too (api.md)
    k.algorithm = algorithm_for(c, k.in_bytes(), co.algorithm);
    if (!supports(k.algorithm, c)) detail::raise_unsupported_algorithm(k.algorithm, c, p.cx.ctx);
    bool fits = true;
    schedule::with_supported_schedule<c>(k.algorithm, [&](auto s) { fits = host::per_round<decltype(s), T>(p.cx, c) > 0; });
    if (!fits)
      raise(errc::unsupported, "staging memory (options::staging_bytes) too small for " + std::string(name(k.algorithm)) +
                                   " with " + std::to_string(n) + " ranks and " + std::to_string(sizeof(T)) + "-byte elements", p.cx.ctx);
    guarded(p, [&] {
      // The call's description: compared across ranks in full in debug mode, and always through the
      // call word that each round publishes with its progress word (host::rank_context::begin_rounds).
      // It lives as long as the call: the context keeps its address for a mismatch's message.
      detail::call_description fp{};
      if (n > 1) {
        k.number = ++p.collectives;
        fp = detail::describe(k);
        if (p.opts.debug) detail::check_fingerprint(p, fp);
        p.cx.begin_rounds(fp);
      }
      if (n == 1) {
        if (!k.writes_out) return;
        const bool reduces = c == collective::all_reduce || c == collective::reduce || c == collective::reduce_scatter;
        if (reduces) {
          const T* src[1] = {in};
          reduce_n<T>(src, 1, out, nullptr, k.out_n, op, true, 1); // applies finalize, copies otherwise
        } else if (!k.in_place) {
          std::memcpy(out, in, k.out_n * sizeof(T));
        }
        return;
      }
      // Where peers read this rank's input in place: thread ranks from zero_copy_min_bytes, process
      // ranks inside a registered buffer.
      if (!k.in_place && k.reads_in) {
        if (p.cx.mode == host::rank_mode::threads) {
          if (k.in_bytes() >= p.opts.zero_copy_min_bytes) k.in_desc = reinterpret_cast<std::uint64_t>(in);
        } else if (p.reg) {
          k.in_desc = p.reg->describe(in, k.in_bytes());
        }
      }
      schedule::with_supported_schedule<c>(k.algorithm, [&](auto s) { host::run_schedule<decltype(s), T>(p.cx, k, op); });
    });
  }

  static communicator make(std::shared_ptr<host::mapped_memory> mem, const host::segment_layout& layout, int rank,
                           int nranks, host::rank_mode mode, const options& opts) {
    communicator c;
    c.p_ = std::make_unique<impl>();
    impl& p = *c.p_;
    p.memory = std::move(mem);
    p.opts = opts;
    p.cx.seg = host::segment_view{p.memory->data(), layout};
    p.cx.rank = rank;
    p.cx.nranks = nranks;
    p.cx.mode = mode;
    p.cx.timeout = opts.timeout;
    p.cx.policy.spin = opts.spin;
    // A process rank bound to one CPU was placed by a launcher (one CPU per rank, as mpirun does): it
    // is not the group's CPU count. Ranks that share a CPU see it anyway (rank_control::cpu). Thread
    // ranks share this process's CPUs.
    const int cpus = host::usable_cpus();
    p.cx.policy.oversubscribed = cpus > 0 && nranks > cpus && (cpus > 1 || mode == host::rank_mode::threads);
    p.cx.policy.membarrier = host::membarrier_ready();
    if (!p.cx.policy.membarrier) p.cx.seg.header().no_membarrier.store(1, std::memory_order_relaxed);
    p.cx.describe_call = &detail::describe_fingerprint;
    host::rank_control& me = p.cx.self();
    me.pid = ::getpid();
    me.cpu.store(-1, std::memory_order_relaxed);
    me.state.store(static_cast<std::uint32_t>(host::rank_state::active), std::memory_order_release);
    return c;
  }
};

inline communicator communicator::join(const unique_id& id, int rank, int nranks, const options& opts) {
  if (nranks < 1 || nranks > static_cast<int>(wire::max_ranks))
    raise(errc::invalid_argument, "join: nranks " + std::to_string(nranks) + " out of range");
  if (rank < 0 || rank >= nranks)
    raise(errc::invalid_argument, "join: rank " + std::to_string(rank) + " out of range [0, " + std::to_string(nranks) + ")");
  if (nranks == 1) {
    const auto layout = host::segment_layout::make(1, braid::detail::staging_half_bytes(opts.staging_bytes), opts.p2p_bytes);
    auto mem = std::make_shared<host::mapped_memory>(host::mapped_memory::anonymous(layout.total));
    host::segment_view{mem->data(), layout}.initialize();
    return make(std::move(mem), layout, 0, 1, host::rank_mode::processes, opts);
  }
  // Every error of a join names this rank and the collective "rendezvous"; a joining rank's only
  // peer is rank 0. The joining barrier is part of the join, not a call of the user's.
  const error_context in_join{rank, "rendezvous", 0, rank == 0 ? -1 : 0};
  try {
    const std::uint64_t half = braid::detail::staging_half_bytes(opts.staging_bytes), p2p = opts.p2p_bytes;
    auto res = host::rendezvous(id, rank, nranks, half, p2p,
                                [&](int n) { return host::segment_layout::make(static_cast<std::uint32_t>(n), half, p2p).total; },
                                [&](std::byte* base) {
                                  host::segment_view{base, host::segment_layout::make(static_cast<std::uint32_t>(nranks), half, p2p)}.initialize();
                                },
                                opts.timeout);
    const auto layout = host::segment_layout::make(static_cast<std::uint32_t>(nranks), res.half_bytes, res.p2p_bytes);
    if (layout.total != res.segment.size()) raise(errc::protocol, "shared segment size does not match its layout");
    if (!res.created) {
      const auto& h = *reinterpret_cast<const host::segment_header*>(res.segment.data());
      if (h.magic != host::segment_magic || h.version != host::segment_version || h.nranks != static_cast<std::uint32_t>(nranks))
        raise(errc::protocol, "shared segment header is not a braid segment of this size");
    }
    auto mem = std::make_shared<host::mapped_memory>(std::move(res.segment));
    communicator c = make(std::move(mem), layout, rank, nranks, host::rank_mode::processes, opts);
    impl& p = *c.p_;
    p.sockets = std::move(res.sockets);
    p.reg = std::make_shared<host::registry>();
    p.cx.reg = p.reg.get();
    p.cx.peer_pid = res.pids;
    p.cx.peer_pidfd.assign(static_cast<std::size_t>(nranks), -1);
    for (int q = 0; q < nranks; ++q)
      if (q != rank && res.pids[static_cast<std::size_t>(q)] > 0)
        p.cx.peer_pidfd[static_cast<std::size_t>(q)] =
            static_cast<int>(::syscall(SYS_pidfd_open, res.pids[static_cast<std::size_t>(q)], 0));
    // Everyone is attached once every rank passed this barrier; only then may a rank's exit be an error.
    const bool debug = p.opts.debug;
    p.opts.debug = false; // the joining barrier is not one of the user's calls: no fingerprint, no number
    try {
      c.barrier();
    } catch (const error& e) {
      detail::raise_in_context(e, error_context{rank, "rendezvous", 0, -1}, true);
    }
    p.opts.debug = debug;
    p.seq = 0;
    p.collectives = 0;
    return c;
  } catch (const error& e) {
    if (!detail::lacks_context(e)) throw;
    detail::raise_in_context(e, in_join);
  }
}

} // namespace braid
