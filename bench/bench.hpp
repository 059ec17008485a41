// bench/bench.hpp — braid-bench's rank harness, shared by bench/braid_bench.cpp (command line, main)
// and bench/rows_*.cpp, which instantiate the per-type rows in separate translation units: every type
// times every operator times every algorithm is a lot of code, and split this way it compiles in
// parallel and in less memory per compiler.
//
//   braid-bench [collective|all] [flags]          (braid-bench --help for the flags)
//
// Method (per collective, algorithm, type, operator and size, out-of-place then in-place):
//   w warmup calls; barrier; n timed calls; time = wall time / n in microseconds on each rank, the
//   maximum over ranks is reported. algbw = size / time (GB = 1e9 bytes); busbw = algbw times
//   nccl-tests' factor: all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n, broadcast, reduce
//   and sendrecv 1. `size` and `count` follow nccl-tests: all_gather and reduce_scatter report the
//   whole n-block buffer as size and the per-rank block as count.
//
// Check (-c 1, after the timed calls): inputs get a per-rank closed-form pattern, outputs a poison
// byte, 64 guard bytes surround every buffer; one call; then every rank compares every output element
// with a reference computed on the host, and also checks that out-of-place inputs are unchanged, that
// the guards are intact, that non-root outputs of reduce are untouched and (all_reduce, all_gather,
// broadcast) that every rank holds the same bits as rank 0. Each failure counts in #wrong (summed over
// ranks). The patterns keep every partial result exactly representable in the element type (see
// `pattern` below), so the comparison is exact, except for avg on floating types, whose final division
// rounds once: there |got - ref| <= |ref| * 2^-mantissa_bits (one ulp) is accepted.
//
// Per-rank results travel to rank 0 through a small shared mapping (created before the ranks start)
// and the harness waits in its own futex barrier, not through braid, so that a broken collective
// cannot corrupt the verdict about itself. With -n 0 nothing is timed: a pure correctness sweep.
//
// Exit status: 0 all checked values right; 1 some #wrong > 0; 2 bad command line (or a backend that
// is not built); 3 a braid error was raised (printed on stderr).
#pragma once

#include <braid/braid.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace braid_bench {

using braid::algo;
using braid::collective;
using braid::dtype;
using braid::op_kind;

constexpr int exit_ok = 0, exit_wrong = 1, exit_usage = 2, exit_error = 3;
constexpr int exit_harness = 104; // a forked rank that stopped because another one failed

// ---- collectives as braid-bench names them -------------------------------------------------------
constexpr collective bench_collectives[] = {collective::all_reduce, collective::all_gather, collective::reduce_scatter,
                                            collective::broadcast,  collective::reduce,     collective::send_recv,
                                            collective::barrier};

// nccl-tests calls it sendrecv; every other name is braid's.
inline std::string_view coll_name(collective c) { return c == collective::send_recv ? "sendrecv" : braid::name(c); }

inline bool parse_coll(std::string_view s, collective& out) {
  for (collective c : bench_collectives)
    if (s == coll_name(c) || s == braid::name(c)) { out = c; return true; }
  struct alias { std::string_view n; collective c; };
  constexpr alias more[] = {{"allreduce", collective::all_reduce},         {"allgather", collective::all_gather},
                            {"reducescatter", collective::reduce_scatter}, {"bcast", collective::broadcast}};
  for (const auto& a : more)
    if (a.n == s) { out = a.c; return true; }
  return false;
}

inline bool has_reduction(collective c) {
  return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
}
inline bool has_root(collective c) { return c == collective::broadcast || c == collective::reduce; }
inline bool has_algorithms(collective c) { return c != collective::send_recv && c != collective::barrier; }

inline double bus_factor(collective c, int n) {
  switch (c) {
  case collective::all_reduce: return 2.0 * (n - 1) / n;
  case collective::all_gather:
  case collective::reduce_scatter: return static_cast<double>(n - 1) / n;
  default: return 1.0;
  }
}

// ---- configuration -------------------------------------------------------------------------------
enum class backend_kind { threads, procs, cuda, nccl };

struct config {
  std::vector<collective> colls;
  std::uint64_t min_bytes = 8, max_bytes = 1 << 20, step_bytes = 0, factor = 2;
  int iters = 20, warmup = 5, check = 1, root = 0, nranks = 2;
  std::vector<dtype> types{dtype::float32};
  std::vector<op_kind> ops{op_kind::sum};
  std::vector<algo> algos{algo::automatic};
  bool algos_all = false;
  backend_kind backend = backend_kind::threads;
  std::string csv;
  double timeout_s = 0; // 0: options::from_env() (BRAID_TIMEOUT, default 300 s)
  bool inject_fault = false; // tests the checker: the last rank flips a bit of its output
  bool kernel = false;       // --kernel (CUDA): the reduce-copy loop alone against cudaMemcpy
  bool enqueue_time = false; // --enqueue-time (CUDA): the host's time from a call to its return, per call
  bool graph = false;        // --graph (CUDA): n calls captured once in CUDA graphs, their replays timed
  int bind = -1;             // --bind (procs): 1 core, 0 none, -1 auto (core when ranks <= usable CPUs, as mpirun)
  bool cuda_procs = false;   // --procs N (cuda, nccl): ranks are processes (braid::cuda::process_communicator, NCCL)
  int cuda_blocks = 0;       // --blocks N (cuda): group_options::max_blocks_per_rank (0: its default)
  int cuda_threads = 0;      // --threads N (cuda): group_options::threads_per_block (0: its default)
  bool streams_order = false; // --order streams (cuda): group_options::order = call_order::streams
  std::int64_t zero_copy_min = -1; // --zero-copy-min N (threads): options::zero_copy_min_bytes (-1: its default)
};

inline std::vector<std::uint64_t> sizes_of(const config& cfg) {
  std::vector<std::uint64_t> s;
  for (std::uint64_t b = cfg.min_bytes; b <= cfg.max_bytes;) {
    s.push_back(b);
    std::uint64_t next;
    if (cfg.step_bytes) next = b + cfg.step_bytes;
    else if (cfg.factor > 1) next = b ? b * cfg.factor : 1;
    else break;
    if (next <= b) break;
    b = next;
  }
  return s;
}

inline std::vector<algo> algos_for(const config& cfg, collective c) {
  if (!has_algorithms(c)) return {algo::automatic};
  std::vector<algo> out;
  if (cfg.algos_all) {
    for (algo a : braid::all_algos)
      if (braid::supports(a, c)) out.push_back(a);
    return out;
  }
  for (algo a : cfg.algos)
    if (a == algo::automatic || braid::supports(a, c)) out.push_back(a);
  return out;
}

// ---- the harness's own shared state: results board and a blocking barrier -------------------------
// One MAP_SHARED mapping made before the ranks start, so threads and forked processes see the same
// memory. Records are double-buffered by exchange parity: a rank writes slot[p] only after the barrier
// of the previous exchange, which rank 0 enters only after it has read slot[p] of the one before.
//
// The harness synchronises with a futex barrier, not braid's: ranks that finished checking sleep in
// the kernel instead of spinning, so on machines with fewer cores than ranks the ranks still checking
// get the CPU; and the verdict does not depend on the collectives it is judging.
struct record {
  double time_us = 0;
  std::int64_t wrong = 0;
  std::uint64_t hash = 0;
  bool compare_hash = false;
};

struct alignas(64) board_slot {
  std::atomic<std::uint64_t> time_bits{0};
  std::atomic<std::int64_t> wrong{0};
  std::atomic<std::uint64_t> hash{0};
};

struct alignas(64) board_control {
  std::atomic<std::uint32_t> count{0};
  std::atomic<std::uint32_t> generation{0};
  std::atomic<std::uint32_t> failed{0}; // a rank raised: everyone leaves the harness barrier
};

struct harness_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class board {
public:
  explicit board(int n) : n_(n), spin_(n <= ::sysconf(_SC_NPROCESSORS_ONLN)) {
    const auto nn = static_cast<std::size_t>(n);
    bytes_ = sizeof(board_control) + sizeof(board_slot) * 2 * nn + sizeof(std::atomic<std::uint64_t>) * nn;
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = p;
    auto* b = static_cast<std::byte*>(p);
    control_ = new (b) board_control;
    slots_ = new (b + sizeof(board_control)) board_slot[2 * nn];
    arrived_ = new (b + sizeof(board_control) + sizeof(board_slot) * 2 * nn) std::atomic<std::uint64_t>[nn];
  }
  ~board() { ::munmap(base_, bytes_); }
  board(const board&) = delete;
  board& operator=(const board&) = delete;

  board_slot& slot(int parity, int rank) { return slots_[static_cast<std::size_t>(parity * n_ + rank)]; }
  std::atomic<std::uint64_t>& arrived(int rank) { return arrived_[static_cast<std::size_t>(rank)]; }
  void fail() {
    control_->failed.store(1, std::memory_order_release);
    control_->generation.fetch_add(1, std::memory_order_release);
    futex_wake(control_->generation);
  }

  // Blocks until all n ranks arrived. Everything written before arriving is visible after leaving.
  // Leaves with harness_failure when another rank failed or after `timeout`.
  void sync(std::chrono::nanoseconds timeout) {
    board_control& c = *control_;
    const std::uint32_t g = c.generation.load(std::memory_order_acquire);
    if (c.failed.load(std::memory_order_acquire)) throw harness_failure("another rank failed");
    if (c.count.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(n_)) {
      c.count.store(0, std::memory_order_relaxed);
      c.generation.fetch_add(1, std::memory_order_release);
      futex_wake(c.generation);
      return;
    }
    // With a core per rank, spin for up to ~100 us first (the others arrive within microseconds and a
    // futex wake-up costs more than that); with more ranks than cores, sleep at once.
    const auto start = std::chrono::steady_clock::now();
    if (spin_)
      for (int i = 0; i < 4096 && c.generation.load(std::memory_order_acquire) == g; ++i) {
        for (int k = 0; k < 16; ++k) BRAID_CPU_RELAX();
        if ((i & 63) == 63 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(100)) break;
      }
    const auto deadline = start + timeout;
    while (c.generation.load(std::memory_order_acquire) == g) {
      const timespec nap{0, 20'000'000}; // wake up now and then to honour the deadline
      ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&c.generation), FUTEX_WAIT, g, &nap, nullptr, 0);
      if (std::chrono::steady_clock::now() > deadline)
        throw harness_failure("braid-bench: a rank did not reach the harness barrier in time");
    }
    if (c.failed.load(std::memory_order_acquire)) throw harness_failure("another rank failed");
  }

private:
  static void futex_wake(std::atomic<std::uint32_t>& w) {
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
  }
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  int n_;
  bool spin_;
  std::size_t bytes_;
  void* base_;
  board_control* control_;
  board_slot* slots_;
  std::atomic<std::uint64_t>* arrived_;
};

// ---- buffers with guard bytes --------------------------------------------------------------------
constexpr std::byte poison{0xA5};
constexpr std::byte guard_byte{0xCD};

class guarded_buffer {
public:
  static constexpr std::size_t guard = 64;
  explicit guarded_buffer(std::size_t bytes) : bytes_(bytes) {
    total_ = (bytes + 2 * guard + 63) / 64 * 64;
    base_.reset(static_cast<std::byte*>(std::aligned_alloc(64, total_)));
    if (!base_) throw std::bad_alloc();
    std::memset(base_.get(), 0, total_);
  }
  std::byte* data() const { return base_.get() + guard; }
  void arm() {
    std::memset(base_.get(), static_cast<int>(guard_byte), guard);
    std::memset(data() + bytes_, static_cast<int>(guard_byte), total_ - guard - bytes_);
  }
  std::int64_t guard_damage() const {
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < guard; ++i) bad += base_.get()[i] != guard_byte;
    for (std::size_t i = guard + bytes_; i < total_; ++i) bad += base_.get()[i] != guard_byte;
    return bad;
  }

private:
  struct freer { void operator()(std::byte* p) const { std::free(p); } };
  std::size_t bytes_, total_;
  std::unique_ptr<std::byte, freer> base_;
};

// ---- patterns and references ---------------------------------------------------------------------
inline std::uint64_t mix(std::uint64_t salt, int q, std::uint64_t g) {
  std::uint64_t x = salt * 0xD6E8FEB86659FD93ULL + (g + 1) * 0x9E3779B97F4A7C15ULL +
                    static_cast<std::uint64_t>(q + 1) * 0xD1B54A32D192ED03ULL;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A number in [0, range) from the high half of h (multiply-shift: no division on the check's hot path).
inline std::int64_t pick(std::uint64_t h, std::uint64_t range) {
  return static_cast<std::int64_t>(((h >> 32) * range) >> 32);
}

template <class T> constexpr bool is_int = std::is_integral_v<T>;

// Floating types: mantissa bits and the largest power of two exponent that is finite.
template <class T> constexpr int mantissa_bits() {
  if constexpr (std::is_same_v<T, double>) return 52;
  else if constexpr (std::is_same_v<T, float>) return 23;
  else if constexpr (std::is_same_v<T, braid::half>) return 10;
  else if constexpr (std::is_same_v<T, braid::bfloat16>) return 7;
  else if constexpr (std::is_same_v<T, braid::fp8_e4m3>) return 3;
  else return 2; // fp8_e5m2
}
template <class T> constexpr int max_pow2() {
  if constexpr (std::is_same_v<T, double>) return 1023;
  else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, braid::bfloat16>) return 127;
  else if constexpr (std::is_same_v<T, braid::fp8_e4m3>) return 8; // max finite 448
  else return 15;                                                   // half, e5m2
}

template <class T> double to_double(const T& x) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float> || is_int<T>) return static_cast<double>(x);
  else return static_cast<double>(static_cast<float>(x));
}
template <class T> T from_double(double v) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) return static_cast<T>(v);
  else return T(v);
}

// The value rank q contributes at global input index g, and the reference for index g.
//
// Integers: sum/avg draw from [-1000, 1000] ([0, 2000] unsigned) and wrap like braid's integer
// operators (modulo 2^bits); prod from {±1, ±2, ±3} ({1, 2, 3}); min/max from the whole range.
// Floating types: small integers chosen so that every partial result of any reduction order is exact
// in T: sum/avg use |x| <= v on the first m ranks only (others give 0) with m*v <= E, E = 2^(mantissa+1)
// (every integer up to E is exact: 16 for e4m3, 8 for e5m2); prod uses ±1, and ±2 only on ranks below
// max_pow2 (so partial products are powers of two that fit: 2^8 = 256 < 448 for e4m3); min/max draw
// from [-W, W], W = min(E, 2^20).
// Copy collectives (all_gather, broadcast, sendrecv) use random bits and compare bytes.
template <class T> struct pattern {
  op_kind k = op_kind::sum;
  int n = 1;
  std::uint64_t salt = 0;
  bool copy = false;
  std::int64_t v = 1, m = 1, W = 1; // floating types
  int K = 0;

  pattern(op_kind kind, int nranks, std::uint64_t s, bool copy_collective)
      : k(kind), n(nranks), salt(s), copy(copy_collective) {
    if constexpr (!is_int<T>) {
      const std::int64_t E = std::int64_t{1} << std::min(mantissa_bits<T>() + 1, 20);
      v = std::clamp<std::int64_t>(E / n, 1, 1000);
      m = std::min<std::int64_t>(n, E / v);
      W = E;
      K = max_pow2<T>();
    }
  }

  T gen(int q, std::uint64_t g) const {
    const std::uint64_t h = mix(salt, q, g);
    if (copy) {
      T t;
      std::memcpy(&t, &h, sizeof(T));
      return t;
    }
    if constexpr (is_int<T>) {
      switch (k) {
      case op_kind::prod:
        if constexpr (std::is_signed_v<T>) {
          constexpr int vals[] = {-3, -2, -1, 1, 2, 3};
          return static_cast<T>(vals[pick(h, 6)]);
        } else {
          return static_cast<T>(1 + pick(h, 3));
        }
      case op_kind::min:
      case op_kind::max: return static_cast<T>(h);
      default:
        if constexpr (std::is_signed_v<T>) return static_cast<T>(pick(h, 2001) - 1000);
        else return static_cast<T>(pick(h, 2001));
      }
    } else {
      return from_double<T>(fval(q, h));
    }
  }

  double fval(int q, std::uint64_t h) const {
    switch (k) {
    case op_kind::prod: {
      const double s = (h & 1) ? -1.0 : 1.0;
      return (q < K && ((h >> 1) & 1)) ? 2 * s : s;
    }
    case op_kind::min:
    case op_kind::max: return static_cast<double>(pick(h, static_cast<std::uint64_t>(2 * W + 1)) - W);
    default: return q < m ? static_cast<double>(pick(h, static_cast<std::uint64_t>(2 * v + 1)) - v) : 0.0;
    }
  }

  // Integer reference, with braid's wrap-around semantics.
  T iref(std::uint64_t g) const {
    if constexpr (is_int<T>) {
      switch (k) {
      case op_kind::prod: {
        std::uint64_t acc = 1;
        for (int q = 0; q < n; ++q) acc *= static_cast<std::uint64_t>(gen(q, g));
        return static_cast<T>(acc);
      }
      case op_kind::min: {
        T acc = gen(0, g);
        for (int q = 1; q < n; ++q) acc = std::min(acc, gen(q, g));
        return acc;
      }
      case op_kind::max: {
        T acc = gen(0, g);
        for (int q = 1; q < n; ++q) acc = std::max(acc, gen(q, g));
        return acc;
      }
      default: {
        std::uint64_t acc = 0;
        for (int q = 0; q < n; ++q) acc += static_cast<std::uint64_t>(gen(q, g));
        const T s = static_cast<T>(acc);
        if (k != op_kind::avg) return s;
        if constexpr (std::is_signed_v<T>) return static_cast<T>(static_cast<std::int64_t>(s) / n);
        else return static_cast<T>(static_cast<std::uint64_t>(s) / static_cast<std::uint64_t>(n));
      }
      }
    }
    return T{};
  }

  // Floating reference in double (exact for everything but avg's final division).
  double fref(std::uint64_t g) const {
    double acc = fval(0, mix(salt, 0, g));
    for (int q = 1; q < n; ++q) {
      const double x = fval(q, mix(salt, q, g));
      switch (k) {
      case op_kind::prod: acc *= x; break;
      case op_kind::min: acc = std::min(acc, x); break;
      case op_kind::max: acc = std::max(acc, x); break;
      default: acc += x; break;
      }
    }
    return k == op_kind::avg ? acc / n : acc;
  }

  // Is `got` right for the reduction at global index g?
  bool reduced_ok(const T& got, std::uint64_t g) const {
    if constexpr (is_int<T>) {
      return got == iref(g);
    } else {
      const double want = fref(g), x = to_double(got);
      if (k == op_kind::avg) return std::fabs(x - want) <= std::fabs(want) * std::ldexp(1.0, -mantissa_bits<T>());
      return x == want;
    }
  }

  bool same_bits(const T& got, const T& want) const { return std::memcmp(&got, &want, sizeof(T)) == 0; }
};

// ---- the check: what each rank's buffers must hold after a call (both the host and CUDA harnesses) --

// send_recv's ring: rank r receives from rank r - 1.
inline int recv_peer(int r, int n) { return (r + n - 1) % n; }

// The elements of p[0..n_el) that are not, to the bit, rank src's pattern from global index g0.
template <class T> std::int64_t wrong_bits(const pattern<T>& pat, const T* p, std::uint64_t n_el, int src, std::uint64_t g0) {
  std::int64_t wrong = 0;
  for (std::uint64_t j = 0; j < n_el; ++j) wrong += !pat.same_bits(p[j], pat.gen(src, g0 + j));
  return wrong;
}

// What rank r of n got wrong in its output `out` (within the output buffer that starts at buf0) after
// collective c of `count` elements: elements that are not the reduction or the right rank's pattern,
// and, on reduce's other ranks out of place, bytes that are no longer the poison (out is the root's
// only).
template <class T>
std::int64_t wrong_in_output(const pattern<T>& pat, collective c, int r, int n, int root, bool in_place, const T* buf0,
                             const T* out, std::uint64_t count) {
  std::int64_t wrong = 0;
  auto expect_reduced = [&](const T* p, std::uint64_t n_el, std::uint64_t g0) {
    for (std::uint64_t j = 0; j < n_el; ++j) wrong += !pat.reduced_ok(p[j], g0 + j);
  };
  auto expect_bits = [&](const T* p, std::uint64_t n_el, int src, std::uint64_t g0) { wrong += wrong_bits(pat, p, n_el, src, g0); };
  auto expect_poison = [&](const T* p, std::uint64_t n_el) {
    const auto* b = reinterpret_cast<const std::byte*>(p);
    for (std::uint64_t j = 0; j < n_el * sizeof(T); ++j) wrong += b[j] != poison;
  };
  switch (c) {
  case collective::all_reduce: expect_reduced(out, count, 0); break;
  case collective::reduce:
    if (r == root) expect_reduced(out, count, 0);
    else if (!in_place) expect_poison(out, count);
    break;
  case collective::reduce_scatter: expect_reduced(out, count, static_cast<std::uint64_t>(r) * count); break;
  case collective::all_gather:
    for (int b = 0; b < n; ++b) expect_bits(buf0 + static_cast<std::uint64_t>(b) * count, count, b, 0);
    break;
  case collective::broadcast: expect_bits(out, count, root, 0); break;
  case collective::send_recv: expect_bits(out, count, recv_peer(r, n), 0); break;
  default: break;
  }
  return wrong;
}

// Whether rank r's input is also its output (in place, where the call overwrites it); any other input
// must come back unchanged.
inline bool input_is_output(collective c, bool in_place, int r, int root) {
  return in_place && (c == collective::all_reduce || c == collective::broadcast || c == collective::reduce_scatter ||
                      (c == collective::reduce && r == root));
}

inline std::uint64_t hash_bytes(const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  std::uint64_t h = 0xcbf29ce484222325ULL;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ULL;
  return h;
}

// ---- output --------------------------------------------------------------------------------------
// nccl-tests' number format: as many decimals as fit the width.
inline std::string fmt_num(double value, int width) {
  char buf[64];
  int power = 0;
  for (double val = 1; value >= val && power < 40; val *= 10) power++;
  if (power < width - 2) std::snprintf(buf, sizeof buf, "%*.2f", width, value);
  else if (power < width - 1) std::snprintf(buf, sizeof buf, "%*.1f", width, value);
  else if (power < width + 1) std::snprintf(buf, sizeof buf, "%*.0f", width, value);
  else std::snprintf(buf, sizeof buf, "%*.1e", width, value);
  return buf;
}

struct half_result {
  bool valid = false; // false: N/A (no in-place form)
  double time_us = 0, algbw = 0, busbw = 0;
  double enqueue_us = -1; // --enqueue-time: host time from the call to its return (every rank's part), per call
  double graph_us = -1;   // --graph: time per call of n calls captured in CUDA graphs, replayed
  std::int64_t wrong = 0;
  bool checked = false;
};

// ---- the table: nccl-tests' layout, one per collective and algorithm ------------------------------
// Used on the rank that prints (rank 0, or the one host thread of the CUDA backend).
class table_printer {
public:
  table_printer(const config& cfg, int nranks, const char* backend) : cfg_(cfg), n_(nranks), backend_(backend) {}
  table_printer(const table_printer&) = delete;
  table_printer& operator=(const table_printer&) = delete;
  ~table_printer() {
    if (csv_) std::fclose(csv_);
  }

  // Rows keep #wrong but print no time or bandwidth (the emulated CUDA device: its times are CPU
  // times of the emulator, not GPU figures).
  void untimed(const char* why) { untimed_ = why; }

  void open_csv() {
    if (cfg_.csv.empty()) return;
    csv_ = std::fopen(cfg_.csv.c_str(), "w");
    if (!csv_) std::fprintf(stderr, "braid-bench: cannot write %s\n", cfg_.csv.c_str());
    else std::fprintf(csv_, "collective,algorithm,backend,nranks,size,count,type,redop,root,time_us,algbw,busbw,"
                            "wrong,time_us_ip,algbw_ip,busbw_ip,wrong_ip\n");
  }

  void print_global_header() {
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    std::printf("# braid-bench %d.%d.%d: nranks %d backend %s\n", BRAID_VERSION_MAJOR, BRAID_VERSION_MINOR,
                BRAID_VERSION_PATCH, n_, backend_);
    std::printf("# minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %" PRIu64 "(%s) warmup iters: %d iters: %d "
                "validation: %d\n",
                cfg_.min_bytes, cfg_.max_bytes, cfg_.step_bytes ? cfg_.step_bytes : cfg_.factor,
                cfg_.step_bytes ? "bytes" : "factor", cfg_.warmup, cfg_.iters, cfg_.check);
    std::printf("# host %s, %ld cpus online; time = mean per call, max over ranks; GB = 1e9 bytes\n", host,
                ::sysconf(_SC_NPROCESSORS_ONLN));
    if (untimed_)
      std::printf("# running on the %s: results are checked, and no time or bandwidth is printed (\"-\"):\n"
                  "# an emulator's time is not a GPU figure\n", untimed_);
  }

  void print_table_header(collective c, algo a) {
    table_oob_ = 0;
    bw_sum_ = 0;
    bw_count_ = 0;
    ++tables_;
    std::printf("#\n# braid-bench collective %s nranks %d backend %s algorithm %s\n#\n",
                std::string(coll_name(c)).c_str(), n_, backend_,
                has_algorithms(c) ? std::string(braid::name(a)).c_str() : "n/a");
    std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
                "", "", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
                "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "",
                "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }

  void print_table_footer() {
    std::printf("# Out of bounds values : %d %s\n", table_oob_, table_oob_ ? "FAILED" : "OK");
    if (untimed_) std::printf("# Avg bus bandwidth    : - (not timed: %s)\n", untimed_);
    else std::printf("# Avg bus bandwidth    : %g \n", bw_count_ ? bw_sum_ / bw_count_ : 0.0);
    std::fflush(stdout);
  }

  // The run's summary line; returns the exit status.
  int print_summary() {
    if (tables_ > 1)
      std::printf("#\n# braid-bench summary: %d tables, %d rows, %" PRId64 " wrong values in %d results: %s\n",
                  tables_, rows_, total_wrong_, total_oob_, total_oob_ ? "FAILED" : "OK");
    std::fflush(stdout);
    return total_oob_ ? exit_wrong : exit_ok;
  }

  // A timed (and maybe checked) half row from the time per call (max over ranks) and the wrong count.
  half_result finish(collective c, std::uint64_t size, double time_us, std::int64_t wrong, bool checked) const {
    half_result h;
    h.valid = true;
    h.time_us = time_us;
    h.algbw = time_us > 0 ? static_cast<double>(size) / 1e9 / (time_us * 1e-6) : 0.0;
    h.busbw = h.algbw * bus_factor(c, n_);
    h.wrong = wrong;
    h.checked = checked;
    return h;
  }

  void account(const half_result& h) {
    if (!h.valid) return;
    bw_sum_ += h.busbw;
    ++bw_count_;
    if (h.checked && h.wrong) {
      ++table_oob_;
      ++total_oob_;
      total_wrong_ += h.wrong;
    }
  }

  void print_row(collective c, algo a, std::string_view type, std::string_view redop, int root, std::uint64_t size,
                 std::uint64_t count, const half_result& oop, const half_result& ip) {
    ++rows_;
    account(oop);
    account(ip);
    char rootname[16];
    std::snprintf(rootname, sizeof rootname, "%6i", root);
    std::printf("%12" PRIu64 "  %12" PRIu64 "  %8s  %6s  %6s", size, count, std::string(type).c_str(),
                std::string(redop).c_str(), rootname);
    for (const half_result* h : {&oop, &ip}) {
      if (!h->valid) {
        std::printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
        continue;
      }
      if (untimed_) std::printf("  %7s  %6s  %6s", "-", "-", "-");
      else
        std::printf("  %7s  %6s  %6s", fmt_num(h->time_us, 7).c_str(), fmt_num(h->algbw, 6).c_str(),
                    fmt_num(h->busbw, 6).c_str());
      if (h->checked) std::printf("  %5g", static_cast<double>(h->wrong));
      else std::printf("  %5s", "N/A");
    }
    std::printf("\n");
    if (oop.enqueue_us >= 0 || ip.enqueue_us >= 0) {
      // --enqueue-time: below its row, the host's time in the calls (out-of-place, in-place).
      auto us = [&](const half_result& h) { return !h.valid || h.enqueue_us < 0 ? std::string("N/A") : untimed_ ? std::string("-") : fmt_num(h.enqueue_us, 7); };
      std::printf("#%11" PRIu64 "  enqueue (host us per call, every rank's part): %s  %s\n", size, us(oop).c_str(), us(ip).c_str());
    }
    if (oop.graph_us >= 0 || ip.graph_us >= 0) {
      // --graph: below its row, the time per call of the calls captured in CUDA graphs and replayed.
      auto us = [&](const half_result& h) { return !h.valid || h.graph_us < 0 ? std::string("N/A") : untimed_ ? std::string("-") : fmt_num(h.graph_us, 7); };
      std::printf("#%11" PRIu64 "  graph (us per call, n calls captured, replays timed): %s  %s\n", size, us(oop).c_str(), us(ip).c_str());
    }
    std::fflush(stdout);
    if (csv_) {
      std::fprintf(csv_, "%s,%s,%s,%d,%" PRIu64 ",%" PRIu64 ",%s,%s,%d", std::string(coll_name(c)).c_str(),
                   has_algorithms(c) ? std::string(braid::name(a)).c_str() : "n/a", backend_, n_, size, count,
                   std::string(type).c_str(), std::string(redop).c_str(), root);
      for (const half_result* h : {&oop, &ip}) {
        if (!h->valid) std::fprintf(csv_, ",,,,");
        else if (untimed_) h->checked ? std::fprintf(csv_, ",,,,%" PRId64, h->wrong) : std::fprintf(csv_, ",,,,");
        else if (h->checked) std::fprintf(csv_, ",%.3f,%.4f,%.4f,%" PRId64, h->time_us, h->algbw, h->busbw, h->wrong);
        else std::fprintf(csv_, ",%.3f,%.4f,%.4f,", h->time_us, h->algbw, h->busbw);
      }
      std::fprintf(csv_, "\n");
      std::fflush(csv_);
    }
  }

private:
  const config& cfg_;
  int n_;
  const char* backend_;
  FILE* csv_ = nullptr;
  const char* untimed_ = nullptr;
  int tables_ = 0, rows_ = 0, total_oob_ = 0;
  std::int64_t total_wrong_ = 0;
  int table_oob_ = 0;
  double bw_sum_ = 0;
  int bw_count_ = 0;
};

// ---- one rank ------------------------------------------------------------------------------------
class rank_runner {
public:
  rank_runner(braid::communicator& comm, const config& cfg, board& bd, std::chrono::nanoseconds timeout)
      : comm_(comm), cfg_(cfg), bd_(bd), timeout_(timeout), r_(comm.rank()), n_(comm.size()),
        out_(cfg, comm.size(), cfg.backend == backend_kind::threads ? "threads" : "procs") {}

  // Runs everything; returns the exit status (meaningful on rank 0).
  int run() {
    if (r_ == 0) {
      out_.open_csv();
      out_.print_global_header();
    }
    const auto sizes = sizes_of(cfg_);
    for (collective c : cfg_.colls) {
      if (c == collective::send_recv && n_ < 2) {
        if (r_ == 0) std::printf("#\n# sendrecv needs at least 2 ranks: skipped\n");
        continue;
      }
      const auto algos = algos_for(cfg_, c);
      if (algos.empty() && r_ == 0) std::printf("#\n# %s: none of the requested algorithms implements it: skipped\n",
                                                std::string(coll_name(c)).c_str());
      for (algo a : algos) run_table(c, a, sizes);
    }
    return r_ == 0 ? out_.print_summary() : exit_ok;
  }

private:
  braid::communicator& comm_;
  const config& cfg_;
  board& bd_;
  std::chrono::nanoseconds timeout_;
  int r_, n_;
  int parity_ = 0;
  std::uint64_t salt_ = 0;
  std::uint64_t barrier_epoch_ = 0;
  table_printer out_; // rank 0 prints

  void run_table(collective c, algo a, const std::vector<std::uint64_t>& sizes) {
    if (r_ == 0) out_.print_table_header(c, a);
    if (c == collective::barrier) {
      run_barrier_row();
    } else {
      for (dtype t : cfg_.types) {
        const std::vector<op_kind> ops = has_reduction(c) ? cfg_.ops : std::vector<op_kind>{op_kind::sum};
        for (op_kind k : ops)
          for (std::uint64_t size : sizes)
            braid::visit(t, [&](auto tag) { run_row<typename decltype(tag)::type>(c, a, t, k, size); });
      }
    }
    if (r_ == 0) out_.print_table_footer();
  }

  half_result finish(collective c, std::uint64_t size, const record& all, bool checked) const {
    return out_.finish(c, size, all.time_us, all.wrong, checked);
  }

  // Publishes this rank's record; returns the aggregate (valid on rank 0).
  record exchange(const record& mine) {
    board_slot& s = bd_.slot(parity_, r_);
    s.time_bits.store(std::bit_cast<std::uint64_t>(mine.time_us), std::memory_order_relaxed);
    s.wrong.store(mine.wrong, std::memory_order_relaxed);
    s.hash.store(mine.hash, std::memory_order_release);
    bd_.sync(timeout_);
    record all;
    if (r_ == 0) {
      for (int q = 0; q < n_; ++q) {
        board_slot& o = bd_.slot(parity_, q);
        const std::uint64_t h = o.hash.load(std::memory_order_acquire);
        all.time_us = std::max(all.time_us, std::bit_cast<double>(o.time_bits.load(std::memory_order_relaxed)));
        all.wrong += o.wrong.load(std::memory_order_relaxed);
        if (mine.compare_hash && h != mine.hash) ++all.wrong; // this rank's bits differ from rank 0's
      }
    }
    parity_ ^= 1;
    return all;
  }

  // ---- barrier ----
  void run_barrier_row() {
    for (int i = 0; i < cfg_.warmup; ++i) comm_.barrier();
    comm_.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < cfg_.iters; ++i) comm_.barrier();
    const auto t1 = std::chrono::steady_clock::now();
    record mine;
    mine.time_us = cfg_.iters ? std::chrono::duration<double, std::micro>(t1 - t0).count() / cfg_.iters : 0.0;
    // Check: after barrier k returns, every rank has arrived at barrier k.
    const int rounds = cfg_.check ? std::max(cfg_.iters, 10) * cfg_.check : 0;
    for (int i = 0; i < rounds; ++i) {
      ++barrier_epoch_;
      bd_.arrived(r_).store(barrier_epoch_, std::memory_order_relaxed);
      comm_.barrier();
      for (int q = 0; q < n_; ++q)
        if (bd_.arrived(q).load(std::memory_order_relaxed) < barrier_epoch_) ++mine.wrong;
    }
    const record all = exchange(mine);
    if (r_ == 0) {
      half_result oop = finish(collective::barrier, 0, all, cfg_.check > 0), ip;
      out_.print_row(collective::barrier, algo::automatic, "none", "none", -1, 0, 0, oop, ip);
    }
  }

public:
  // One row: a size of one type and operator, out-of-place then in-place. Defined in bench/rows.hpp
  // and instantiated once per element type in bench/rows_*.cpp (not inline, so that this header's
  // other users do not compile every type's collectives again).
  template <class T> void run_row(collective c, algo a, dtype t, op_kind k, std::uint64_t size);

private:
  template <class T, class Op>
  void run_row_op(collective c, algo a, dtype t, op_kind k, const Op& op, std::uint64_t size) {
    const std::uint64_t es = sizeof(T);
    const bool blocked = c == collective::all_gather || c == collective::reduce_scatter;
    const std::uint64_t count = blocked ? size / static_cast<std::uint64_t>(n_) / es : size / es;
    const std::uint64_t shown = blocked ? count * static_cast<std::uint64_t>(n_) * es : count * es;
    const half_result oop = run_half<T>(c, a, k, op, count, false, shown);
    half_result ip;
    if (c != collective::send_recv) ip = run_half<T>(c, a, k, op, count, true, shown);
    if (r_ == 0)
      out_.print_row(c, a, braid::name(t), has_reduction(c) ? braid::name(k) : std::string_view("none"),
                has_root(c) ? cfg_.root : -1, shown, count, oop, ip);
  }

  template <class T, class Op>
  half_result run_half(collective c, algo a, op_kind k, const Op& op, std::uint64_t count, bool in_place,
                       std::uint64_t shown) {
    const auto n = static_cast<std::uint64_t>(n_), r = static_cast<std::uint64_t>(r_);
    const int root = cfg_.root;
    const std::uint64_t in_n = c == collective::reduce_scatter ? count * n : count;
    const std::uint64_t out_n = c == collective::all_gather ? count * n : count;
    const std::uint64_t buf_n = std::max(in_n, out_n);
    std::unique_ptr<guarded_buffer> bin, bout;
    T* in;
    T* out;
    if (in_place) {
      bout = std::make_unique<guarded_buffer>(buf_n * sizeof(T));
      T* buf = reinterpret_cast<T*>(bout->data());
      in = c == collective::all_gather ? buf + r * count : buf;
      out = c == collective::reduce_scatter ? buf + r * count : buf;
    } else {
      bin = std::make_unique<guarded_buffer>(in_n * sizeof(T));
      bout = std::make_unique<guarded_buffer>(out_n * sizeof(T));
      in = reinterpret_cast<T*>(bin->data());
      out = reinterpret_cast<T*>(bout->data());
    }
    T* const buf0 = reinterpret_cast<T*>(bout->data());
    const bool copy = !has_reduction(c);
    const bool replicated = c == collective::all_reduce || c == collective::all_gather || c == collective::broadcast;
    const int src_peer = recv_peer(r_, n_);
    const braid::call_options co{a};

    auto once = [&] {
      switch (c) {
      case collective::all_reduce: comm_.all_reduce(in, out, count, op, co); break;
      case collective::all_gather: comm_.all_gather(in, out, count, co); break;
      case collective::reduce_scatter: comm_.reduce_scatter(in, out, count, op, co); break;
      case collective::broadcast: comm_.broadcast(in, out, count, root, co); break;
      case collective::reduce: comm_.reduce(in, out, count, root, op, co); break;
      case collective::send_recv: comm_.sendrecv(in, count, (r_ + 1) % n_, out, count, src_peer); break;
      default: break;
      }
    };

    // Inputs: pattern values (also while timing, so floating data stays normal and finite for a while).
    pattern<T> pat(k, n_, ++salt_, copy);
    auto fill_inputs = [&] {
      if (in_place) std::memset(bout->data(), static_cast<int>(poison), buf_n * sizeof(T));
      else std::memset(bout->data(), static_cast<int>(poison), out_n * sizeof(T));
      // broadcast: only the root's input is read; the others' in-place buffers are poisoned.
      if (!(c == collective::broadcast && in_place && r_ != root))
        for (std::uint64_t g = 0; g < in_n; ++g) in[g] = pat.gen(r_, g);
      if (bin) bin->arm();
      bout->arm();
    };
    fill_inputs();

    record mine;
    if (cfg_.iters > 0) {
      for (int i = 0; i < cfg_.warmup; ++i) once();
      comm_.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < cfg_.iters; ++i) once();
      const auto t1 = std::chrono::steady_clock::now();
      mine.time_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / cfg_.iters;
    }

    for (int rep = 0; rep < cfg_.check; ++rep) {
      pat = pattern<T>(k, n_, ++salt_, copy);
      fill_inputs();
      bd_.sync(timeout_); // everyone enters the checked call together
      once();
      if (cfg_.inject_fault && r_ == n_ - 1 && count > 0) reinterpret_cast<unsigned char*>(out)[0] ^= 0x40;
      std::int64_t wrong = wrong_in_output(pat, c, r_, n_, root, in_place, buf0, out, count);
      if (!input_is_output(c, in_place, r_, root)) wrong += wrong_bits(pat, in, in_n, r_, 0);
      wrong += bout->guard_damage();
      if (bin) wrong += bin->guard_damage();
      mine.wrong += wrong;
      // Every rank must hold the same bits where the result is replicated (rank 0 compares).
      if (replicated) mine.hash = mine.hash * 31 + hash_bytes(buf0, out_n * sizeof(T));
    }
    mine.compare_hash = replicated && cfg_.check > 0;
    const record all = exchange(mine);
    return r_ == 0 ? finish(c, shown, all, cfg_.check > 0) : half_result{};
  }
};

// bench/cuda_backend.cpp (built where CUDA is, with BRAID_BENCH_CUDA defined): the whole run for
// --backend cuda (braid's CUDA backend) or nccl (NCCL, where found at configure time: BRAID_BENCH_NCCL);
// returns the exit status.
int run_cuda_backend(const config& cfg, std::chrono::nanoseconds timeout, bool nccl);
int run_cuda_procs(const config& cfg, std::chrono::nanoseconds timeout, bool nccl);

} // namespace braid_bench
