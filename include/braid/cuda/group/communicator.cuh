// braid/cuda/group/communicator.cuh — collectives between ranks that are GPUs (or shares of one GPU) driven
// by one process. Each rank has its own buffers and staging memory; peers' memory is reached through
// cudaDeviceEnablePeerAccess (ranks on the same GPU need nothing).
//
//   auto comms = braid::cuda::create_group({0, 1, 2, 3});   // one rank per GPU
//   comms[r].all_reduce(d_in, d_out, count, braid::sum{}, stream_r);   // from rank r's thread, or
//                                                                     // one thread for all ranks
//   auto shared = braid::cuda::create_group({0, 0, 0, 0});  // four ranks sharing GPU 0: call each from
//   { braid::cuda::group_scope grp;                         // its own thread, or bracket the calls
//     for (int r = 0; r < 4; ++r) shared[r].all_reduce(in[r], out[r], count, braid::sum{}, s[r]); }
//
// Calls are stream-ordered. Every rank must make the same collectives in the same order. The ranks
// that share a GPU are served by one cooperative launch (braid/cuda/enqueue/launcher.cuh): a call waits on
// the host until the other ranks of its GPU have made it too (inside group_start()/group_end() it
// returns at once instead), then returns with its stream ordered after the launch; nothing waits for
// the kernel itself. A kernel that waits longer than the timeout, or sees the group aborted, returns
// early; check() raises that error on the host (call it after synchronising the stream, or
// periodically). A collective is capturable in a CUDA graph: round numbers live on the device, so
// every replay is a new round.
//
// Where it has run: test_gpu (several ranks sharing one GPU, one process) has passed on one H100 and
// one H200, under memcheck and racecheck too (bench/results). Ranks on different GPUs (peer access,
// NVLink) have run only on the emulated CUDA device (braid/emu: test_gpu_emu). In CI this file
// compiles with nvcc and runs on the emulated device; the nvcc build of the GPU tests runs only where
// a GPU is present.
#pragma once

#include "../runtime.cuh"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../../comm/options.hpp"
#include "../../comm/tuning.hpp"
#include "../../comm/validate.hpp"
#include "../../core/error.hpp"
#include "../../core/ops.hpp"
#include "../../core/types.hpp"
#include "../../schedule/call.hpp"
#include "../../schedule/schedule.hpp"
#include "../check.cuh"
#include "../collectives.cuh"
#include "../device/executor.cuh"
#include "../device/kernel.cuh"
#include "state.cuh"
#include "../enqueue/args.cuh"
#include "../enqueue/launcher.cuh"
#include "../tuning.cuh"

namespace braid::cuda {

// The tuning tables (tuning.cuh), group_options and the group's shared state (group_state.cuh).


class communicator : public detail::stream_collectives<communicator> {
public:
  communicator() = default;
  int rank() const { return live(), rank_; }
  int size() const { return live().nranks; }
  int device() const { return live().ranks[static_cast<std::size_t>(rank_)].device; }
  bool valid() const noexcept { return g_ != nullptr; }
  // The launch shape of this group's kernels (the same for every rank): blocks per rank, chosen by
  // create_group from the device's SMs, and threads per block (group_options::threads_per_block).
  int blocks_per_rank() const { return live().blocks; }
  int threads_per_block() const { return live().threads; }

  // Raises the error a kernel of this group recorded (timeout, abort), if any: it names the rank that
  // gave up, the peer it waited for and its call (collective and sequence number) where known.
  void check() const { enqueue::raise_recorded(live().abort, error_context{rank_, nullptr, 0, -1}); }
  // The rounds this rank's collective kernels have run. A call runs in rounds of what the staging
  // halves hold; one whose every rank reads its peers' inputs in place and keeps nothing in staging
  // (the ranks all on one GPU, out-of-place calls, one_shot or direct) runs in one round whatever its
  // size. Read from the device's round counter: call it once the rank's stream has finished.
  std::uint64_t rounds() const {
    const group::rank_memory& rm = live().ranks[static_cast<std::size_t>(rank_)];
    cuda::detail::device_guard dg(rm.device);
    std::uint64_t v = 0;
    BRAID_CUDA_CHECK(cudaMemcpy(&v, rm.view.round, sizeof v, cudaMemcpyDeviceToHost));
    return v;
  }
  // Makes every kernel of the group return at its next check (within microseconds), and every rank
  // waiting in send or recv raise aborted_error at once.
  void abort() {
    group::group_state& g = live();
    cuda::device::record_failure({g.abort, cuda::device::abort_host_slot},
                                cuda::device::device_error{static_cast<unsigned>(errc::aborted), rank_, -1, cuda::device::fail_step::aborted, 0, cuda::device::call_id{}});
    g.wake_p2p();
  }

  // Point to point, stream-ordered (docs/api.md, "Point to point on the device"). send posts `count`
  // elements of `data` (device memory of this rank's GPU) for `peer` and waits on the host until
  // peer's matching recv has enqueued the copy; `stream` then waits for the copy, so later work on it
  // may overwrite `data`. recv waits on the host for peer's matching send and enqueues, on `stream`,
  // a wait for the sender's stream (as of its send) and the copy into `data`. Messages of an ordered
  // pair match in call order; byte sizes must be equal (else mismatch_error on both ranks). Blocking:
  // one host thread per rank, never inside group_start()/group_end(). count == 0 returns at once.
  template <class T> void send(const T* data, std::size_t count, int peer, cudaStream_t stream) {
    static_assert(element<T>, "send: T must be trivially copyable (and not const or volatile)");
    const error_context ctx = p2p_check<T>(data, count, peer, stream, "send");
    if (count == 0) return;
    p2p_send(data, count * sizeof(T), sizeof(T), peer, stream, ctx);
  }
  template <class T> void recv(T* data, std::size_t count, int peer, cudaStream_t stream) {
    static_assert(element<T>, "recv: T must be trivially copyable (and not const or volatile)");
    const error_context ctx = p2p_check<T>(data, count, peer, stream, "recv");
    if (count == 0) return;
    p2p_recv(data, count * sizeof(T), sizeof(T), peer, stream, ctx);
  }


  // Whether the other ranks would read `in` (an out-of-place call's input) where it is, through peer
  // access, rather than from a staged copy. Peer access maps memory from cudaMalloc only: memory from
  // a stream-ordered pool (cudaMallocAsync) or from the VMM API (cuMemCreate, e.g. PyTorch's
  // expandable segments) is staged when a peer is on another GPU. Decided per call from the
  // pointer's attributes (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE); staged when unsure.
  bool reads_in_place(const void* in) const {
    const group::group_state& g = live();
    if (g.sets.size() == 1) return true; // every reader is on this GPU
    using attr_fn = int (*)(void*, int, unsigned long long);
    static const attr_fn fn = reinterpret_cast<attr_fn>(cuda::detail::driver_symbol("cuPointerGetAttribute"));
    if (!fn || !in) return false;
    unsigned long long capable = 0; // the driver writes a boolean
    constexpr int is_legacy_cuda_ipc_capable = 10; // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
    if (fn(&capable, is_legacy_cuda_ipc_capable, static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(in))) != 0) return false;
    return capable != 0;
  }

  algo algorithm_for(collective c, std::uint64_t bytes, algo requested = algo::automatic) const {
    const group::group_state& g = live();
    if (requested != algo::automatic) return requested;
    const algo env = static_cast<int>(c) < 5 ? g.opts.algorithm[static_cast<int>(c)] : algo::automatic;
    if (env != algo::automatic && supports(env, c)) return env;
    return g.sets.size() == 1 ? choose_algorithm(cuda_tuning_one_gpu, c, g.nranks, bytes)
                              : choose_algorithm(cuda_tuning, c, g.nranks, bytes);
  }

  friend std::vector<communicator> create_group(const std::vector<int>& devices, const group_options& o);

private:
  std::shared_ptr<group::group_state> g_;
  int rank_ = 0;

  group::group_state& live() const {
    if (!g_) raise(errc::invalid_usage, "this CUDA communicator is empty (default-constructed or moved from)");
    return *g_;
  }

  // Loads `kernel` on every GPU of the group before its first launch (so CUDA's lazy loading never
  // has to synchronise a GPU on which a kernel of the group may be waiting), and refuses it if the
  // grid of a call cannot be resident at once with this instantiation's resources.
  template <class K> static void load_everywhere(group::group_state& g, K kernel, unsigned grid, const error_context& ctx) {
    {
      std::lock_guard<std::mutex> lk(g.loaded_m);
      if (g.loaded.count(reinterpret_cast<const void*>(kernel))) return;
    }
    for (const auto& set : g.sets) {
      cuda::detail::device_guard dg(set->device);
      enqueue::check_resident(kernel, set->device, g.threads, static_cast<std::uint64_t>(g.blocks) * set->ranks.size(),
                             std::to_string(set->ranks.size()) + " ranks x " + std::to_string(g.blocks),
                             "lower group_options::max_blocks_per_rank or threads_per_block", ctx);
    }
    (void)grid;
    std::lock_guard<std::mutex> lk(g.loaded_m);
    g.loaded.insert(reinterpret_cast<const void*>(kernel));
  }

  // ---- point to point ------------------------------------------------------------------------------
  // How often a rank waiting in send or recv looks at the group's abort flag besides being woken by
  // abort(): a kernel's recorded failure wakes nobody.
  static constexpr std::chrono::milliseconds p2p_poll{2};

  // Checks shared by send and recv, in the host communicator's order and words; returns the call's
  // context. Nothing is posted or enqueued before all of them passed.
  template <class T>
  error_context p2p_check(const void* data, std::size_t count, int peer, cudaStream_t stream, const char* what) {
    group::group_state& g = live();
    error_context ctx{rank_, what, 0, peer};
    enqueue::raise_recorded(g.abort, ctx); // a stopped group refuses every call
    const std::string w(what);
    if (g.nranks == 1) raise(errc::invalid_argument, w + ": a group of one rank has no peer", ctx);
    if (peer < 0 || peer >= g.nranks)
      raise(errc::invalid_argument, w + ": peer " + std::to_string(peer) + " out of range [0, " + std::to_string(g.nranks) + ")", ctx);
    if (peer == rank_) raise(errc::invalid_argument, w + ": peer is this rank itself", ctx);
    if (count > static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(T))
      raise(errc::invalid_argument, w + ": count * sizeof(T) overflows", ctx);
    if (count) braid::detail::check_buffer<T>(data, (w + " buffer").c_str(), ctx);
    if (enqueue::bracket().depth > 0)
      raise(errc::invalid_usage,
            w + " inside group_start()/group_end() (or a group_scope): send and recv wait on the host until the peer "
                "makes the matching call, so they need one host thread per rank, calling them outside any bracket",
            ctx);
    if (count) {
      cuda::detail::device_guard dg(g.ranks[static_cast<std::size_t>(rank_)].device);
      if (enqueue::is_capturing(stream))
        raise(errc::unsupported, w + " cannot be captured in a CUDA graph: it meets its peer on the host when it is enqueued", ctx);
    }
    return ctx;
  }

  static std::string p2p_ms(std::chrono::nanoseconds t) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(t).count()) + " ms";
  }
  static std::string p2p_size(std::size_t bytes, std::size_t elem) {
    return std::to_string(bytes) + " bytes (" + std::to_string(bytes / elem) + " elements of " + std::to_string(elem) + " bytes)";
  }

  // Waits on `b` (lock held) until `ready()`, the group's abort flag or the deadline; says which.
  enum class p2p_wake { done, aborted, timed_out };
  template <class Done>
  static p2p_wake p2p_wait(group::group_state& g, group::p2p_box& b, std::unique_lock<std::mutex>& lk,
                           std::chrono::steady_clock::time_point deadline, bool abort_first, Done ready) {
    for (;;) {
      const bool aborted = cuda::device::abort_raised(g.abort);
      if (aborted && abort_first) return p2p_wake::aborted;
      if (ready()) return p2p_wake::done;
      if (aborted) return p2p_wake::aborted;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return p2p_wake::timed_out;
      b.cv.wait_until(lk, std::min(deadline, now + p2p_poll));
    }
  }

  void p2p_send(const void* data, std::size_t bytes, std::size_t elem, int peer, cudaStream_t stream, error_context ctx) {
    group::group_state& g = live();
    const int dev = g.ranks[static_cast<std::size_t>(rank_)].device;
    cuda::detail::device_guard dg(dev);
    auto post = std::make_shared<group::p2p_post>();
    post->src = data;
    post->bytes = bytes;
    if (const cudaError_t e = cudaEventCreateWithFlags(&post->ready, cudaEventDisableTiming); e != cudaSuccess)
      cuda::detail::raise_cuda(e, "cudaEventCreateWithFlags (send)", __FILE__, __LINE__, ctx);
    if (const cudaError_t e = cudaEventRecord(post->ready, stream); e != cudaSuccess) {
      cudaEventDestroy(post->ready);
      cuda::detail::raise_cuda(e, "cudaEventRecord (the sender's stream)", __FILE__, __LINE__, ctx);
    }
    group::p2p_box& b = g.box(rank_, peer);
    std::unique_lock<std::mutex> lk(b.m);
    b.q.push_back(post);
    b.cv.notify_all();
    const auto deadline = std::chrono::steady_clock::now() + g.opts.timeout;
    const p2p_wake w = p2p_wait(g, b, lk, deadline, false, [&] { return post->taken; });
    if (w != p2p_wake::done) {
      // Not taken: withdraw the message, so that no later recv copies from a buffer the sender no
      // longer promises to keep.
      const auto it = std::find(b.q.begin(), b.q.end(), post);
      ctx.seq = b.taken + static_cast<std::uint64_t>(it - b.q.begin()) + 1;
      if (it != b.q.end()) b.q.erase(it);
      lk.unlock();
      cudaEventDestroy(post->ready);
      if (w == p2p_wake::aborted) enqueue::raise_recorded(g.abort, ctx);
      raise(errc::timeout, "rank " + std::to_string(rank_) + "'s send of " + p2p_size(bytes, elem) + " waited more than the timeout (" +
                               p2p_ms(g.opts.timeout) + ") for rank " + std::to_string(peer) +
                               " to make the matching recv; the message was withdrawn",
            ctx);
    }
    lk.unlock();
    ctx.seq = post->seq;
    // Taken: the receiver's stream waits on `ready` already (or it refused the message).
    cudaEventDestroy(post->ready);
    if (!post->failure.empty())
      raise(errc::peer_failed, "rank " + std::to_string(peer) + " could not enqueue the copy of this message: " + post->failure, ctx);
    if (post->expected != bytes)
      raise(errc::mismatch, "rank " + std::to_string(peer) + " refused a message of " + p2p_size(bytes, elem) + ": its recv expects " +
                                std::to_string(post->expected) + " bytes; the message is dropped on both ranks",
            ctx);
    const cudaError_t e = cudaStreamWaitEvent(stream, post->copied, 0);
    {
      cuda::detail::device_guard pg(g.ranks[static_cast<std::size_t>(peer)].device); // the event is the receiver's
      cudaEventDestroy(post->copied); // released by CUDA once the copy is done
    }
    if (e != cudaSuccess) cuda::detail::raise_cuda(e, "cudaStreamWaitEvent (the sender's stream, after the copy)", __FILE__, __LINE__, ctx);
  }

  void p2p_recv(void* data, std::size_t bytes, std::size_t elem, int peer, cudaStream_t stream, error_context ctx) {
    group::group_state& g = live();
    cuda::detail::device_guard dg(g.ranks[static_cast<std::size_t>(rank_)].device);
    group::p2p_box& b = g.box(peer, rank_);
    std::unique_lock<std::mutex> lk(b.m);
    const auto deadline = std::chrono::steady_clock::now() + g.opts.timeout;
    const p2p_wake w = p2p_wait(g, b, lk, deadline, true, [&] { return !b.q.empty(); });
    if (w != p2p_wake::done) {
      ctx.seq = b.taken + 1;
      lk.unlock();
      if (w == p2p_wake::aborted) enqueue::raise_recorded(g.abort, ctx);
      raise(errc::timeout, "rank " + std::to_string(rank_) + "'s recv of " + p2p_size(bytes, elem) + " waited more than the timeout (" +
                               p2p_ms(g.opts.timeout) + ") for rank " + std::to_string(peer) + " to make the matching send",
            ctx);
    }
    const std::shared_ptr<group::p2p_post> post = b.q.front();
    b.q.pop_front();
    post->seq = ++b.taken;
    post->expected = bytes;
    ctx.seq = post->seq;
    // Whatever happens now, the sender is told (taken) and raises too where this call raises.
    auto hand_back = [&] {
      post->taken = true;
      b.cv.notify_all();
    };
    if (post->bytes != bytes) {
      const std::size_t theirs = post->bytes;
      hand_back();
      lk.unlock();
      raise(errc::mismatch, "rank " + std::to_string(peer) + " sent " + std::to_string(theirs) + " bytes but this recv expects " +
                                p2p_size(bytes, elem) + "; the message is dropped on both ranks",
            ctx);
    }
    cudaEvent_t copied = nullptr;
    const char* call = "cudaEventCreateWithFlags (recv)";
    cudaError_t e = cudaEventCreateWithFlags(&copied, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      call = "cudaStreamWaitEvent (the receiver's stream, for the sender's)";
      e = cudaStreamWaitEvent(stream, post->ready, 0);
    }
    if (e == cudaSuccess) {
      call = "cudaMemcpyAsync (recv)";
      e = cudaMemcpyAsync(data, post->src, bytes, cudaMemcpyDefault, stream);
    }
    if (e == cudaSuccess) {
      call = "cudaEventRecord (the receiver's stream, after the copy)";
      e = cudaEventRecord(copied, stream);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (copied) cudaEventDestroy(copied);
      post->failure = std::string(call) + " failed: " + cudaGetErrorName(e);
      hand_back();
      lk.unlock();
      cuda::detail::raise_cuda(e, call, __FILE__, __LINE__, ctx);
    }
    post->copied = copied;
    hand_back();
  }

  friend class detail::stream_collectives<communicator>;
  template <collective c, class T, class Op>
  void collective_call(const T* in, T* out, std::size_t count, int root, const Op& op, cudaStream_t stream, call_options co) {
    group::group_state& g = live();
    const int n = g.nranks, r = rank_;
    group::rank_memory& rm = g.ranks[static_cast<std::size_t>(r)];
    // This call's number on this rank: calls that count (count > 0, two ranks or more) are numbered
    // from 1; errors name it, and so does a failure its kernel records.
    error_context ctx{r, std::string_view(name(c)).data(), rm.calls + 1, -1};
    enqueue::raise_recorded(g.abort, ctx);
    braid::detail::call_record k = braid::detail::validate_call<c, T, Op>(in, out, count, root, n, r, co.algorithm, ctx);
    if (count == 0) return;
    const int device = g.ranks[static_cast<std::size_t>(r)].device;
    const auto& set = g.sets[static_cast<std::size_t>(g.set_of[static_cast<std::size_t>(r)])];
    // Under call_order::streams the launcher makes the device current only where it must.
    std::optional<cuda::detail::device_guard> dg;
    if (set->order == call_order::braid || n == 1) dg.emplace(device);
    if (n == 1) {
      if (k.writes_out && !k.in_place)
        BRAID_CUDA_CHECK(cudaMemcpyAsync(out, in, k.out_n * sizeof(T), cudaMemcpyDeviceToDevice, stream));
      return;
    }
    k.algorithm = algorithm_for(c, k.in_bytes(), co.algorithm);
    if (!supports(k.algorithm, c)) braid::detail::raise_unsupported_algorithm(k.algorithm, c, ctx);
    k.number = rm.calls + 1;
    if (!k.in_place && k.reads_in && reads_in_place(in)) k.in_desc = reinterpret_cast<std::uintptr_t>(in);
    // The chain advances only once the call counts in (arrive returns): a call that arrive undoes
    // (a thread that would wait for ranks it drives itself) leaves the rank where it was.
    const std::uint64_t word = braid::detail::chain_call_word(rm.call_word, braid::detail::describe(k), 0);
    schedule::with_supported_schedule<c>(k.algorithm, [&](auto s) {
      using S = decltype(s);
      const cuda::device::launch_args la =
          enqueue::launch_args_for<S, T>(k, word, n, r, g.half_bytes, g.ranks[static_cast<std::size_t>(r)].table, g.abort, g.opts.timeout, ctx);
      const unsigned threads = static_cast<unsigned>(g.threads);
      const cuda::device::rank_call mine = enqueue::rank_call_for<T>(k, r, la.per_round, threads);
      const bool staging = cuda::device::uses_staging<S, T>(c, n, r, k.root, k.count, k.in_desc != 0);
      auto kernel = &cuda::device::collective_kernel<S, T, Op>;
      const unsigned grid = static_cast<unsigned>(g.blocks) * static_cast<unsigned>(set->ranks.size());
      load_everywhere(g, kernel, grid, ctx);
      enqueue::arrive(g_, set, g.local_of[static_cast<std::size_t>(r)], r, k, reinterpret_cast<const void*>(kernel), la, mine, staging,
                      stream, g.opts.timeout, g.abort, static_cast<int>(g.sets.size()),
                      [&](cudaStream_t st, const cuda::device::launch_args& args) {
                        return device::launch_cooperative(kernel, grid, threads, 0, st, args, op);
                      },
                      ctx);
      rm.call_word = word;
      ++rm.calls;
    });
  }
};

// Creates one communicator per entry of `devices` (rank r runs on GPU devices[r]; repeat a device to
// put several ranks on it). Enables peer access between the GPUs used, or raises unsupported.
inline std::vector<communicator> create_group(const std::vector<int>& devices, const group_options& o = {}) {
  const int n = static_cast<int>(devices.size());
  if (n < 1 || n > 64) raise(errc::invalid_argument, "create_group: between 1 and 64 ranks");
  int count = 0;
  BRAID_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int d : devices)
    if (d < 0 || d >= count) raise(errc::invalid_argument, "create_group: device " + std::to_string(d) + " does not exist");
  if (o.max_blocks_per_rank < 1) raise(errc::invalid_argument, "create_group: max_blocks_per_rank must be at least 1");
  for (int d : devices) {
    int most = 0, coop = 0;
    BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxThreadsPerBlock, d));
    most = std::min(most, cuda::device::max_threads_per_block);
    if (o.threads_per_block < 1 || o.threads_per_block > most)
      raise(errc::invalid_argument, "create_group: threads_per_block must be within [1, " + std::to_string(most) + "] on GPU " +
                                        std::to_string(d));
    BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, d));
    if (!coop)
      raise(errc::unsupported, "create_group: GPU " + std::to_string(d) +
                                   " does not support cooperative launches, which braid's kernels need to be resident at once");
  }
  auto g = std::make_shared<group::group_state>();
  g->nranks = n;
  g->opts = o.base;
  g->threads = o.threads_per_block;
  // Peer access between distinct GPUs.
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int ok = 0;
      BRAID_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
      if (!ok) raise(errc::unsupported, "GPU " + std::to_string(a) + " cannot access GPU " + std::to_string(b) + " peer to peer");
      cuda::detail::device_guard dg(a);
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else if (e != cudaSuccess) cuda::detail::raise_cuda(e, "cudaDeviceEnablePeerAccess", __FILE__, __LINE__);
    }
  // The ranks of a GPU share one cooperative launch (launcher.cuh), which CUDA runs only when all of
  // its blocks fit: use at most half the SMs (one block each), so that the user's kernels keep room
  // beside braid's. Whether a given instantiation fits is checked before its first launch.
  int blocks = o.max_blocks_per_rank;
  for (int d : devices) {
    const int on_d = static_cast<int>(std::count(devices.begin(), devices.end(), d));
    if (on_d > cuda::device::max_local_ranks)
      raise(errc::invalid_argument, "create_group: at most " + std::to_string(cuda::device::max_local_ranks) + " ranks on one GPU");
    int sms = 0;
    BRAID_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
    blocks = std::min(blocks, std::max(1, sms / on_d / 2));
  }
  g->blocks = blocks;
  BRAID_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&g->abort), sizeof(cuda::device::device_abort),
                                 cudaHostAllocMapped | cudaHostAllocPortable));
  *g->abort = cuda::device::device_abort{};
  g->ranks.resize(static_cast<std::size_t>(n));
  const cuda::device::rank_segment layout = cuda::device::rank_segment::make(o.base.staging_bytes);
  g->half_bytes = layout.half_bytes;
  for (int r = 0; r < n; ++r) {
    auto& m = g->ranks[static_cast<std::size_t>(r)];
    m.device = devices[static_cast<std::size_t>(r)];
    cuda::detail::device_guard dg(m.device);
    BRAID_CUDA_CHECK(cudaMalloc(&m.segment, layout.bytes()));
    BRAID_CUDA_CHECK(cudaMemset(m.segment, 0, layout.control_bytes));
    m.view = layout.view(static_cast<std::byte*>(m.segment));
  }
  std::vector<cuda::device::device_rank> views(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) views[static_cast<std::size_t>(r)] = g->ranks[static_cast<std::size_t>(r)].view;
  for (int r = 0; r < n; ++r) {
    auto& m = g->ranks[static_cast<std::size_t>(r)];
    cuda::detail::device_guard dg(m.device);
    BRAID_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&m.table), sizeof(cuda::device::device_rank) * static_cast<std::size_t>(n)));
    BRAID_CUDA_CHECK(cudaMemcpy(m.table, views.data(), sizeof(cuda::device::device_rank) * static_cast<std::size_t>(n), cudaMemcpyHostToDevice));
  }
  for (int r = 0; r < n; ++r) {
    cuda::detail::device_guard dg(g->ranks[static_cast<std::size_t>(r)].device);
    BRAID_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // The ranks of each GPU, and what their launches share.
  g->set_of.assign(static_cast<std::size_t>(n), -1);
  g->local_of.assign(static_cast<std::size_t>(n), -1);
  for (int r = 0; r < n; ++r) {
    const int d = devices[static_cast<std::size_t>(r)];
    int k = 0;
    while (k < static_cast<int>(g->sets.size()) && g->sets[static_cast<std::size_t>(k)]->device != d) ++k;
    if (k == static_cast<int>(g->sets.size())) {
      if (k == cuda::device::max_abort_gpus)
        raise(errc::invalid_argument, "create_group: at most " + std::to_string(cuda::device::max_abort_gpus) +
                                          " GPUs in one group (one error-record slot each)");
      auto set = std::make_shared<enqueue::device_set>();
      set->device = d;
      set->index = static_cast<int>(g->sets.size());
      set->blocks_per_rank = static_cast<unsigned>(g->blocks);
      // The in-flight word and exit counter live in the control page of the GPU's first rank.
      void* ctl = g->ranks[static_cast<std::size_t>(r)].segment;
      set->busy = cuda::device::rank_segment::word(ctl, cuda::device::rank_segment::busy_at);
      set->exits = cuda::device::rank_segment::word(ctl, cuda::device::rank_segment::exits_at);
      g->sets.push_back(set);
    }
    auto& set = *g->sets[static_cast<std::size_t>(k)];
    g->set_of[static_cast<std::size_t>(r)] = k;
    g->local_of[static_cast<std::size_t>(r)] = static_cast<int>(set.ranks.size());
    set.ranks.push_back(r);
  }
  for (auto& set : g->sets) {
    cuda::detail::device_guard dg(set->device);
    const std::size_t L = set->ranks.size();
    set->next_seq.assign(L, 0);
    set->last_thread.assign(L, 0);
    set->creator = enqueue::this_thread_token();
    set->abort = g->abort;
    set->timeout = g->opts.timeout;
    set->order = o.order;
    set->more.allocate(static_cast<int>(L));
    set->join_at_launch = g->sets.size() == 1;
    BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&set->chain, cudaEventDisableTiming));
    if (set->join_at_launch) BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&set->joiner, cudaEventDisableTiming));
  }
  std::vector<communicator> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    out[static_cast<std::size_t>(r)].g_ = g;
    out[static_cast<std::size_t>(r)].rank_ = r;
  }
  return out;
}

} // namespace braid::cuda
