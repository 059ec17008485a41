// tests/cuda/group/test_gpu.cpp — the CUDA backend on a real GPU: braid::cuda groups of 1, 2, 4 and 8 ranks
// sharing device 0, driven from this one host thread.
//
// How every collective runs here: each rank's part is enqueued on that rank's own stream, all ranks
// before any stream is synchronised (the kernels wait for each other on the device), then every
// stream is synchronised, check() is called on every rank, and the outputs are copied back and
// compared with the CPU reference of tests/comm/sweep.hpp (inputs chosen so that every partial result
// is exact: the comparison is bit for bit, floats included). Sentinel bytes around each output catch
// writes past its end, and out-of-place reduce must leave non-root outputs untouched.
//
// Sweeps (counts 0, 1, 7, an unaligned 1003 at offsets of 3 and 5 elements, and a large count;
// out-of-place and in-place):
//   all_reduce with braid::sum, every element type, every algorithm and the tuning table's choice;
//   float, every collective x every algorithm it supports x every operator.
// A third sweep uses 64 KiB of staging so that the large calls run many rounds (about 25 for the
// default large count of 100003 floats capped there, 8 for the emulator's 30011): in place, and every
// schedule with windows; out-of-place one_shot and direct calls of ranks on one GPU run one round
// (gpu in-place reads).
// Then: CUDA-graph capture and replay, a stalled rank (timeout error naming the peer; a fresh group
// works), and bad arguments (raised before anything is launched).
//
// Without a device this prints "SKIPPED: no CUDA device (...)" and exits with 77, which CTest
// reports as skipped (SKIP_RETURN_CODE), never as passed.
//
// Environment (bench/gpu-check.sh uses the first two under compute-sanitizer, which is slow):
//   BRAID_GPU_SWEEP_LARGE   the large count (default 1000003)
//   BRAID_GPU_SWEEP_NRANKS  rank counts of the sweeps, e.g. "2,4" (default "1,2,4,8")
//   BRAID_GPU_SWEEP_THREADS threads per block of the test groups (default: group_options' 512)
//   BRAID_GPU_SWEEP_SPREAD  1: rank r on device r % (device count), else every rank on device 0
//   BRAID_GPU_SWEEP_OPS     operators of the operator sweep, e.g. "sum" (default "sum,prod,min,max,avg")
//   BRAID_TIMEOUT           per-wait deadline of the sweep groups (default here: 60 s)
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <braid/cuda/runtime.cuh>
#ifdef BRAID_TEST_PROGRESS_POST_HOOK
#include <braid/cuda/device/signal.cuh>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <braid/schedule/schedule.hpp>

#include "comm/sweep.hpp"
#include "launch.hpp"

#ifndef BRAID_GPU_TEST_ARCHS
#define BRAID_GPU_TEST_ARCHS "?"
#endif

namespace {

namespace gt = braid::gpu_launch;
using braid::algo;
using braid::collective;
using braid::dtype;
using braid::errc;
using braid::op_kind;
using namespace std::chrono_literals;

#define GPU_OK(expr)                                                                                 \
  do {                                                                                               \
    const cudaError_t gpu_ok_e_ = (expr);                                                            \
    if (gpu_ok_e_ != cudaSuccess) FAIL(#expr << ": " << cudaGetErrorName(gpu_ok_e_) << ": " << cudaGetErrorString(gpu_ok_e_)); \
  } while (0)

cudaStream_t stream_of(const gt::group& g, int r) { return static_cast<cudaStream_t>(gt::stream(g, r)); }

// ---- configuration --------------------------------------------------------------------------------

std::size_t sweep_large() {
  const char* s = std::getenv("BRAID_GPU_SWEEP_LARGE");
  if (!s || !*s) return 1000003;
  const unsigned long long v = std::strtoull(s, nullptr, 10);
  return v >= 8 ? static_cast<std::size_t>(v) : 1000003;
}

std::vector<int> sweep_nranks() {
  std::vector<int> out;
  const char* s = std::getenv("BRAID_GPU_SWEEP_NRANKS");
  if (s && *s) {
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ','))
      if (const int n = std::atoi(item.c_str()); n >= 1 && n <= 64) out.push_back(n);
  }
  if (out.empty()) out = {1, 2, 4, 8};
  return out;
}

// The operator sweep's operators: BRAID_GPU_SWEEP_OPS (names as braid::name(op_kind) spells them),
// else all five. An unknown name fails the test rather than shrinking the sweep unnoticed.
std::vector<op_kind> sweep_ops() {
  constexpr op_kind all[] = {op_kind::sum, op_kind::prod, op_kind::min, op_kind::max, op_kind::avg};
  const char* s = std::getenv("BRAID_GPU_SWEEP_OPS");
  if (!s || !*s) return {std::begin(all), std::end(all)};
  std::vector<op_kind> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto* k = std::find_if(std::begin(all), std::end(all), [&](op_kind o) { return braid::name(o) == item; });
    if (k == std::end(all)) throw std::invalid_argument("BRAID_GPU_SWEEP_OPS: unknown operator '" + item + "'");
    out.push_back(*k);
  }
  if (out.empty()) throw std::invalid_argument("BRAID_GPU_SWEEP_OPS: no operator in '" + std::string(s) + "'");
  return out;
}

// Threads per block of the test groups: BRAID_GPU_SWEEP_THREADS, else (0) group_options' default.
// The shape sweep sets its own.
int sweep_threads() {
  const char* s = std::getenv("BRAID_GPU_SWEEP_THREADS");
  const int v = s && *s ? std::atoi(s) : 0;
  return v >= 1 && v <= 1024 ? v : 0;
}

// Rank r's device: 0 for every rank, or, with BRAID_GPU_SWEEP_SPREAD=1, r % (number of devices).
// (Under ThreadSanitizer on the emulated device the protocol test spreads the ranks: kernels that share
// a device are ordered by the emulator's own bookkeeping, which would hide a race between launches.)
std::vector<int> sweep_devices(int n) {
  const char* s = std::getenv("BRAID_GPU_SWEEP_SPREAD");
  int ndev = 1;
  if (s && s[0] == '1' && cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 1;
  std::vector<int> d(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) d[static_cast<std::size_t>(r)] = s && s[0] == '1' ? r % std::max(ndev, 1) : 0;
  return d;
}

// The sweeps' per-wait deadline: BRAID_TIMEOUT when set (0 here means "options::from_env()"), else a
// minute, so that a broken schedule fails the test instead of hanging it for 300 s per wait.
std::chrono::nanoseconds sweep_timeout() {
  const char* s = std::getenv("BRAID_TIMEOUT");
  return s && *s ? std::chrono::nanoseconds(0) : std::chrono::nanoseconds(60s);
}

// ---- a group with per-rank device buffers ---------------------------------------------------------

struct rig {
  int n;
  std::size_t bytes;
  std::chrono::nanoseconds timeout;
  std::size_t staging;
  std::vector<int> devices;                    // rank r's GPU
  int threads = 0, max_blocks = 0;             // the group's launch shape (0: defaults)
  bool by_streams = false;                     // call_order::streams
  std::shared_ptr<gt::group> g;
  std::vector<void*> in, out;                  // per rank, `bytes` each, on the rank's GPU
  std::vector<std::vector<unsigned char>> img; // per rank host scratch

  rig(int nranks, std::size_t buffer_bytes, std::chrono::nanoseconds t, std::size_t staging_bytes = 0,
      std::vector<int> devs = {}, int threads_per_block = 0, int max_blocks_per_rank = 0, bool streams_order = false)
      : n(nranks), bytes(buffer_bytes), timeout(t), staging(staging_bytes),
        devices(devs.empty() ? sweep_devices(nranks) : std::move(devs)),
        threads(threads_per_block ? threads_per_block : sweep_threads()), max_blocks(max_blocks_per_rank), by_streams(streams_order),
        in(static_cast<std::size_t>(nranks)),
        out(static_cast<std::size_t>(nranks)), img(static_cast<std::size_t>(nranks)) {
    renew();
    for (int r = 0; r < n; ++r) {
      GPU_OK(cudaSetDevice(devices[idx(r)]));
      GPU_OK(cudaMalloc(&in[idx(r)], bytes));
      GPU_OK(cudaMalloc(&out[idx(r)], bytes));
    }
    GPU_OK(cudaSetDevice(0));
  }
  rig(const rig&) = delete;
  rig& operator=(const rig&) = delete;
  ~rig() {
    g.reset();
    for (void* p : in) cudaFree(p);
    for (void* p : out) cudaFree(p);
  }
  static std::size_t idx(int r) { return static_cast<std::size_t>(r); }
  gt::group& group() { return *g; }
  // A fresh group (after an error poisoned the old one: every later call would raise it again).
  void renew() {
    g.reset();
    g = gt::make_group(devices, timeout, staging, threads, max_blocks, by_streams);
  }
  // Synchronises every device the ranks use, once each (the uploads run on legacy streams).
  void sync_uploads() {
    for (int d : std::set<int>(devices.begin(), devices.end())) {
      GPU_OK(cudaSetDevice(d));
      GPU_OK(cudaDeviceSynchronize());
    }
    GPU_OK(cudaSetDevice(0));
  }
  // Synchronises every rank's stream; returns the first CUDA error as text ("" if none).
  std::string sync() {
    std::string err;
    for (int r = 0; r < n; ++r) {
      const cudaError_t e = cudaStreamSynchronize(stream_of(*g, r));
      if (e != cudaSuccess && err.empty()) err = std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e);
    }
    return err;
  }
};

// ---- one case of the sweep ------------------------------------------------------------------------

struct shape {
  std::size_t count, offset;
  bool in_place;
};

std::vector<shape> sweep_shapes(std::size_t large, bool unaligned_large) {
  std::vector<shape> s = {{0, 0, false},    {0, 0, true},     {1, 0, false},     {1, 0, true},
                          {7, 0, false},    {7, 0, true},     {1003, 3, false},  {1003, 5, true},
                          {large, 0, false}, {large, 0, true}};
  if (unaligned_large) s.push_back({large, 1, false});
  return s;
}

// Bytes per rank buffer for counts up to `large` elements per block of T (offset and guard included).
std::size_t buffer_bytes(std::size_t large, int n, bool blocked, std::size_t elem) {
  return ((blocked ? large * static_cast<std::size_t>(n) : large) + 64) * elem + 4096;
}

// Runs one collective on every rank of x and checks every rank's output. Returns "" when everything
// matches, else what went wrong first (and renews the group when an error poisoned it). `offset`:
// elements from the start of the rank's output buffer (the bytes before it are sentinels too) and,
// unless `in_offset` says otherwise, of its input buffer (out of place).
inline constexpr std::size_t same_offset = ~std::size_t{0};
template <class T, class Op>
std::string run_case(rig& x, collective c, algo a, op_kind k, std::size_t count, std::size_t offset, bool in_place,
                     std::size_t in_offset = same_offset) {
  using braid::testing::sweep_guard;
  const int n = x.n, root = n - 1;
  const auto un = static_cast<std::size_t>(n);
  const std::size_t in_n = c == collective::reduce_scatter ? count * un : count;
  const std::size_t out_n = c == collective::all_gather ? count * un : count;
  const std::size_t span_n = braid::testing::span_elems(c, n, count, in_place);
  const std::size_t span_bytes = (span_n + sweep_guard) * sizeof(T);
  if (in_offset == same_offset || in_place) in_offset = offset;
  const std::size_t need = (std::max(offset, in_offset) + std::max(in_n, out_n) + sweep_guard) * sizeof(T);
  if (need > x.bytes) return "test bug: buffers too small";

  auto where = [&](int r, std::size_t i, const std::string& what) {
    std::ostringstream s;
    s << name(c) << "/" << name(a) << " " << name(braid::dtype_of_v<T>) << " " << name(k) << " n=" << n << " rank=" << r
      << " count=" << count << " offset=" << offset;
    if (in_offset != offset) s << " input offset=" << in_offset;
    s << (in_place ? " in-place" : "") << ": " << what << " at " << i;
    return s.str();
  };

  std::vector<T*> din(un), dout(un), dres(un);
  for (int r = 0; r < n; ++r) {
    const std::size_t ur = static_cast<std::size_t>(r);
    T* o = static_cast<T*>(x.out[ur]) + offset;
    T* i = in_place ? o : static_cast<T*>(x.in[ur]) + in_offset;
    if (offset) GPU_OK(cudaMemset(x.out[ur], 0xA5, offset * sizeof(T))); // sentinels before the output
    if (in_place && c == collective::all_gather) i = o + ur * count;
    dout[ur] = o;
    din[ur] = i;
    dres[ur] = in_place && c == collective::reduce_scatter ? i + ur * count : o;

    // The host image of the output span: sentinel bytes, and the input where it lives inside the span.
    std::vector<unsigned char>& img = x.img[ur];
    if (img.size() < std::max(span_bytes, in_n * sizeof(T))) img.resize(std::max(span_bytes, in_n * sizeof(T)));
    std::memset(img.data(), 0xA5, span_bytes);
    if (in_place) {
      T* at = reinterpret_cast<T*>(img.data()) + (i - o);
      for (std::size_t e = 0; e < in_n; ++e) at[e] = braid::testing::input_value<T>(c, k, r, count, e);
      GPU_OK(cudaMemcpy(o, img.data(), span_bytes, cudaMemcpyHostToDevice));
    } else {
      GPU_OK(cudaMemcpy(o, img.data(), span_bytes, cudaMemcpyHostToDevice));
      T* at = reinterpret_cast<T*>(img.data());
      for (std::size_t e = 0; e < in_n; ++e) at[e] = braid::testing::input_value<T>(c, k, r, count, e);
      if (in_n) GPU_OK(cudaMemcpy(i, img.data(), in_n * sizeof(T), cudaMemcpyHostToDevice));
    }
  }

  // The uploads above run on the legacy default stream, and a cudaMemcpy from pageable memory may
  // return before its copy has landed; the ranks' streams are non-blocking (not ordered after the
  // legacy stream). Without this, a kernel can read an input that is still being written (the
  // emulated device showed it: wrong values at the start of in-place buffers).
  x.sync_uploads();

  // Every rank's call is enqueued before any stream is synchronised: they wait for each other. One
  // thread drives every rank, so the calls are bracketed (the ranks of a GPU launch together).
  std::string failure;
  gt::group_start();
  for (int r = 0; r < n && failure.empty(); ++r) {
    const std::size_t ur = static_cast<std::size_t>(r);
    gt::call cl;
    cl.coll = c;
    cl.algorithm = a;
    cl.type = braid::dtype_of_v<T>;
    cl.op = k;
    cl.in = din[ur];
    cl.out = dres[ur];
    cl.count = count;
    cl.root = root;
    try {
      gt::enqueue(x.group(), r, cl);
    } catch (const std::exception& e) {
      failure = where(r, 0, std::string("enqueue raised: ") + e.what());
    }
  }
  try {
    gt::group_end();
  } catch (const std::exception& e) {
    if (failure.empty()) failure = where(0, 0, std::string("group_end raised: ") + e.what());
  }
  if (std::string e = x.sync(); !e.empty() && failure.empty()) failure = where(0, 0, e);
  for (int r = 0; r < n && failure.empty(); ++r) {
    try {
      gt::check(x.group(), r);
    } catch (const std::exception& e) {
      failure = where(r, 0, std::string("check() raised: ") + e.what());
    }
  }
  if (!failure.empty()) {
    x.renew(); // a failed call (or a kernel that gave up) leaves the group unusable
    return failure;
  }

  // Compare, on a host copy of each rank's output span, with the CPU sweep's judge.
  for (int r = 0; r < n; ++r) {
    const std::size_t ur = static_cast<std::size_t>(r);
    std::vector<unsigned char>& img = x.img[ur];
    if (offset) {
      if (img.size() < offset * sizeof(T)) img.resize(offset * sizeof(T));
      GPU_OK(cudaMemcpy(img.data(), x.out[ur], offset * sizeof(T), cudaMemcpyDeviceToHost));
      for (std::size_t b = 0; b < offset * sizeof(T); ++b)
        if (img[b] != 0xA5) return where(r, b, "wrote before the output (byte)");
    }
    GPU_OK(cudaMemcpy(img.data(), dout[ur], span_bytes, cudaMemcpyDeviceToHost));
    const unsigned char* result = img.data() + static_cast<std::size_t>(dres[ur] - dout[ur]) * sizeof(T);
    if (const braid::testing::mismatch m =
            braid::testing::verify_output<T, Op>(c, k, n, r, root, count, in_place, img.data(), result))
      return where(r, m.at, m.what);
  }
  return {};
}

// Collects failures; reports the first few in full.
struct tally {
  long cases = 0, failures = 0;
  void add(const std::string& failure) {
    ++cases;
    if (failure.empty()) return;
    if (++failures <= 25) FAIL_CHECK(failure);
  }
  void report(const char* what) {
    MESSAGE(std::string(what) << ": " << cases << " cases, " << failures << " failed");
    CHECK(failures == 0);
  }
};

std::vector<algo> algos_for(collective c) {
  std::vector<algo> out = {algo::automatic}; // the tuning table's choice
  for (algo a : braid::all_algos)
    if (braid::supports(a, c)) out.push_back(a);
  return out;
}

std::string rank_list() {
  std::string s;
  for (int n : sweep_nranks()) {
    if (!s.empty()) s += ',';
    s += std::to_string(n);
  }
  return s;
}

// ---- plain float helpers for the non-sweep tests --------------------------------------------------

struct float_buffers {
  int n;
  std::size_t count;
  std::vector<float*> in, out;
  // Rank r's buffers on its device (sweep_devices).
  float_buffers(int nranks, std::size_t cnt, std::vector<int> devs = {})
      : n(nranks), count(cnt), in(static_cast<std::size_t>(nranks)), out(static_cast<std::size_t>(nranks)) {
    if (devs.empty()) devs = sweep_devices(nranks);
    for (std::size_t r = 0; r < in.size(); ++r) {
      GPU_OK(cudaSetDevice(devs[r]));
      GPU_OK(cudaMalloc(reinterpret_cast<void**>(&in[r]), std::max<std::size_t>(count, 1) * sizeof(float)));
      GPU_OK(cudaMalloc(reinterpret_cast<void**>(&out[r]), std::max<std::size_t>(count, 1) * sizeof(float)));
    }
    GPU_OK(cudaSetDevice(0));
  }
  float_buffers(const float_buffers&) = delete;
  float_buffers& operator=(const float_buffers&) = delete;
  ~float_buffers() {
    for (float* p : in) cudaFree(p);
    for (float* p : out) cudaFree(p);
  }
};

// Small integers: every sum over up to 64 ranks is exact in float.
float input_value(int r, std::size_t i, int rep) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3 + static_cast<std::size_t>(rep) * 5) % 17) - 8);
}

void upload_inputs(float_buffers& b, int rep, bool in_place) {
  std::vector<float> h(b.count);
  for (int r = 0; r < b.n; ++r) {
    for (std::size_t i = 0; i < b.count; ++i) h[i] = input_value(r, i, rep);
    float* dst = in_place ? b.out[static_cast<std::size_t>(r)] : b.in[static_cast<std::size_t>(r)];
    GPU_OK(cudaMemcpy(dst, h.data(), b.count * sizeof(float), cudaMemcpyHostToDevice));
    if (!in_place) GPU_OK(cudaMemset(b.out[static_cast<std::size_t>(r)], 0xA5, b.count * sizeof(float)));
  }
  GPU_OK(cudaDeviceSynchronize()); // legacy-stream uploads, read next by kernels on non-blocking streams
}

// Number of elements of every rank's output that differ from the all_reduce sum (first bad one in `first`).
std::size_t count_wrong_sums(float_buffers& b, int rep, std::string& first) {
  std::vector<float> h(b.count);
  std::size_t wrong = 0;
  for (int r = 0; r < b.n; ++r) {
    GPU_OK(cudaMemcpy(h.data(), b.out[static_cast<std::size_t>(r)], b.count * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < b.count; ++i) {
      double want = 0;
      for (int q = 0; q < b.n; ++q) want += input_value(q, i, rep);
      if (h[i] != static_cast<float>(want)) {
        if (!wrong) first = "rank " + std::to_string(r) + " element " + std::to_string(i) + ": " + std::to_string(h[i]) + " != " + std::to_string(want);
        ++wrong;
      }
    }
  }
  return wrong;
}

gt::call float_all_reduce(const float* in, float* out, std::size_t count) {
  return gt::call{.coll = collective::all_reduce, .type = dtype::float32, .op = op_kind::sum, .in = in, .out = out, .count = count};
}

// Every rank's float all_reduce of b (in -> out), each enqueued from a thread of its own; returns
// what each rank's call raised ("" if nothing).
std::vector<std::string> all_reduce_from_threads(gt::group& g, float_buffers& b, std::size_t count) {
  const int n = gt::size(g);
  std::vector<std::string> err(static_cast<std::size_t>(n));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        gt::enqueue(g, r, float_all_reduce(b.in[static_cast<std::size_t>(r)], b.out[static_cast<std::size_t>(r)], count));
      } catch (const std::exception& e) {
        err[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : th) t.join();
  return err;
}

// Runs a float all_reduce on every rank of g and checks it.
void expect_working_all_reduce(gt::group& g, std::size_t count) {
  const int n = gt::size(g);
  float_buffers b(n, count);
  upload_inputs(b, 0, false);
  {
    gt::bracket one_thread_for_every_rank;
    for (int r = 0; r < n; ++r) gt::enqueue(g, r, float_all_reduce(b.in[static_cast<std::size_t>(r)], b.out[static_cast<std::size_t>(r)], count));
  }
  for (int r = 0; r < n; ++r) GPU_OK(cudaStreamSynchronize(stream_of(g, r)));
  for (int r = 0; r < n; ++r) gt::check(g, r);
  std::string first;
  CHECK_MESSAGE(count_wrong_sums(b, 0, first) == 0, first);
}

} // namespace

// ---- the sweeps -----------------------------------------------------------------------------------

TEST_CASE("gpu sweep: all_reduce with braid::sum, every element type and algorithm") {
  const std::size_t large = sweep_large();
  tally t;
  for (int n : sweep_nranks()) {
    const auto t0 = std::chrono::steady_clock::now();
    rig x(n, buffer_bytes(large, n, false, 8), sweep_timeout());
    for (dtype d : braid::all_dtypes) {
      braid::visit(d, [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (algo a : algos_for(collective::all_reduce))
          for (const shape& s : sweep_shapes(large, false))
            t.add(run_case<T, braid::sum<>>(x, collective::all_reduce, a, op_kind::sum, s.count, s.offset, s.in_place));
      });
    }
    MESSAGE("all_reduce/sum sweep, " << n << " rank(s): " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  }
  t.report(("all_reduce/sum, 14 types, ranks " + rank_list() + ", large count " + std::to_string(large)).c_str());
}

TEST_CASE("gpu sweep: float, every collective, algorithm and operator") {
  const std::size_t large = sweep_large();
  const std::vector<op_kind> ops = sweep_ops();
  tally t;
  for (int n : sweep_nranks()) {
    const auto t0 = std::chrono::steady_clock::now();
    rig x(n, buffer_bytes(large, n, true, sizeof(float)), sweep_timeout());
    for (collective c : braid::testing::sweep_collectives) {
      const bool reduces = c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
      for (algo a : algos_for(c))
        for (op_kind k : ops) {
          if (!reduces && k != op_kind::sum) continue;
          braid::visit(k, [&](auto op) {
            using Op = decltype(op);
            for (const shape& s : sweep_shapes(large, k == op_kind::sum))
              t.add(run_case<float, Op>(x, c, a, k, s.count, s.offset, s.in_place));
          });
        }
    }
    MESSAGE("float sweep, " << n << " rank(s): " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  }
  std::string op_list;
  for (op_kind k : ops) op_list += (op_list.empty() ? "" : ",") + std::string(braid::name(k));
  t.report(("float x every collective/algorithm, operators " + op_list + ", ranks " + rank_list() + ", large count " + std::to_string(large)).c_str());
}

// Small staging memory: many rounds per large call, so the two staging halves are reused many times
// (the round-parity protocol: a rank waits for its peers to finish round R-2 before it writes half
// R%2 again), and blocks of one kernel may drift apart by whole rounds.
TEST_CASE("gpu sweep: 64 KiB staging, many rounds per call (float, every collective and algorithm)") {
  const std::size_t big = std::min<std::size_t>(sweep_large(), 100003);
  tally t;
  for (int n : {2, 3, 4, 5, 8}) {
    rig x(n, buffer_bytes(big, n, true, sizeof(float)), sweep_timeout(), std::size_t{64} << 10);
    for (collective c : braid::testing::sweep_collectives)
      for (algo a : algos_for(c))
        for (const shape& s : {shape{1003, 0, false}, shape{1003, 0, true}, shape{big, 0, false}, shape{big, 0, true}, shape{big, 3, false}})
          t.add(run_case<float, braid::sum<>>(x, c, a, op_kind::sum, s.count, s.offset, s.in_place));
  }
  t.report(("64 KiB staging, float sum, ranks 2,3,4,5,8, count " + std::to_string(big)).c_str());
}

// Launch shapes and device layouts. A kernel must be right for every launch shape (indexing mistakes
// hide at the default one): blocks of 3 threads, a grid of 1 block, a grid of 5, the largest block.
// Ranks share one GPU or are spread over the GPUs (peer access between them).
// Calls fn(n, spread, devices) for each rank count in `counts`, with every rank on GPU 0 and, where
// there are two GPUs or more, spread over them (rank r on GPU r % ndev).
template <class F> void for_each_layout(std::initializer_list<int> counts, int ndev, F&& fn) {
  for (int n : counts)
    for (const bool spread : {false, true}) {
      if (spread && ndev < 2) {
        MESSAGE("one GPU: the layout with ranks on different GPUs is not run");
        continue;
      }
      std::vector<int> devs(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) devs[static_cast<std::size_t>(r)] = spread ? r % ndev : 0;
      fn(n, spread, devs);
    }
}

TEST_CASE("gpu sweep: launch shapes and device layouts (float sum, every collective and algorithm)") {
  int ndev = 0;
  GPU_OK(cudaGetDeviceCount(&ndev));
  const std::size_t big = std::min<std::size_t>(sweep_large(), 20011);
  struct launch {
    int threads, max_blocks;
  };
  tally t;
  std::vector<std::pair<int, int>> seen; // (threads, blocks) that ran
  for_each_layout({2, 3, 4}, ndev, [&](int n, bool spread, const std::vector<int>& devs) {
      for (const launch l : {launch{3, 1}, launch{32, 5}, launch{96, 32}, launch{512, 2}}) {
        rig x(n, buffer_bytes(big, n, true, sizeof(float)), sweep_timeout(), 0, devs, l.threads, l.max_blocks);
        const int grid = gt::blocks_per_rank(x.group()), threads = gt::threads_per_block(x.group());
        CHECK(threads == l.threads);
        CHECK(grid >= 1);
        CHECK(grid <= l.max_blocks);
        seen.emplace_back(threads, grid);
        std::ostringstream label;
        label << (spread ? "ranks on GPUs r % " + std::to_string(ndev) : std::string("ranks on GPU 0")) << ", " << grid
              << " block(s) of " << threads << " threads: ";
        for (collective c : braid::testing::sweep_collectives)
          for (algo a : algos_for(c))
            for (const shape& s : {shape{1, 0, false}, shape{7, 0, true}, shape{1003, 3, false}, shape{big, 0, false},
                                   shape{big, 5, true}}) {
              const std::string f = run_case<float, braid::sum<>>(x, c, a, op_kind::sum, s.count, s.offset, s.in_place);
              t.add(f.empty() ? f : label.str() + f);
            }
      }
  });
  auto ran = [&](int threads, int blocks) {
    return std::any_of(seen.begin(), seen.end(), [&](const std::pair<int, int>& p) {
      return (threads == 0 || p.first == threads) && (blocks == 0 || p.second == blocks);
    });
  };
  CHECK_MESSAGE(ran(3, 1), "no group ran blocks of 3 threads in a grid of 1");
  CHECK_MESSAGE(ran(512, 0), "no group ran blocks of 512 threads");
  // 512 is the kernels' launch bound: more is refused by create_group.
  CHECK_THROWS_AS(gt::make_group({0, 0}, sweep_timeout(), 0, 513), braid::invalid_argument);
  if (ndev >= 2) CHECK_MESSAGE(ran(0, 5), "no group ran a grid of 5 blocks");
  t.report(("launch shapes x layouts, float sum, ranks 2,3,4, count " + std::to_string(big)).c_str());
}

// call_order::streams: the caller's streams order a rank's calls and braid enqueues the launch alone
// (in the steady state). Every collective and algorithm at 2 and 3 ranks, on one GPU (a stream per
// rank: their streams joined to the launch) and spread over the GPUs (nothing joined), in place and
// not, with this thread's current device GPU 0 whatever the rank's; then 12 ranks on one GPU, whose
// parts beyond the launch's parameter block are read from host-mapped memory.
TEST_CASE("gpu sweep: call_order::streams, every collective and algorithm (float sum)") {
  int ndev = 0;
  GPU_OK(cudaGetDeviceCount(&ndev));
  tally t;
  for_each_layout({2, 3}, ndev, [&](int n, bool spread, const std::vector<int>& devs) {
      rig x(n, buffer_bytes(5000, n, true, sizeof(float)), sweep_timeout(), 0, devs, 0, 0, true);
      const std::string label = spread ? "streams order, ranks on GPUs r % " + std::to_string(ndev) + ": " : std::string("streams order, ranks on GPU 0: ");
      for (collective c : braid::testing::sweep_collectives)
        for (algo a : algos_for(c))
          for (const shape& s : {shape{1, 0, false}, shape{1003, 3, true}, shape{5000, 0, false}}) {
            const std::string f = run_case<float, braid::sum<>>(x, c, a, op_kind::sum, s.count, s.offset, s.in_place);
            t.add(f.empty() ? f : label + f);
          }
  });
  {
    rig x(12, buffer_bytes(3000, 12, true, sizeof(float)), sweep_timeout(), 0, std::vector<int>(12, 0), 64, 0, true);
    for (collective c : braid::testing::sweep_collectives) {
      const std::string f = run_case<float, braid::sum<>>(x, c, algo::automatic, op_kind::sum, 3000, 0, false);
      t.add(f.empty() ? f : "streams order, 12 ranks on GPU 0: " + f);
    }
  }
  t.report("call_order::streams, float sum, ranks 2, 3 and 12");
}

// Misaligned buffers: api.md asks only for alignment to alignof(T). reduce_copy picks its word width
// from the pointers, so a rank's staging copy of its input and the step that later overwrites that
// input in place may give the same bytes to threads of different blocks, which only a wait orders.
// one_shot did not wait: an in-place float all_reduce 8 bytes past a 16-byte boundary (staged in
// 8-byte words, reduced element by element) overwrote elements before other blocks had staged them,
// so peers reduced results instead of inputs (wrong values, different on every rank); blocks of fewer
// than 16 threads did the same to an aligned buffer's tail, and an aligned in-place rank whose peer's
// misaligned input it read in place. Every offset below 16 bytes (in elements), in place and out of
// place with the input or the output misaligned alone, one_shot forced, bit for bit against the host
// reference; then every algorithm of every collective in place; then those two launch shapes.
TEST_CASE("gpu misaligned buffers: every offset below 16 bytes, in place and out of place, one_shot and every algorithm") {
  int ndev = 0;
  GPU_OK(cudaGetDeviceCount(&ndev));
  const std::size_t big = std::min<std::size_t>(sweep_large(), 20011);
  tally t;
  auto offsets = [](std::size_t elem) {
    std::vector<std::size_t> o;
    for (std::size_t b = 0; b < 16; b += elem) o.push_back(b / elem);
    return o;
  };
  auto one_shot_sweep = [&](rig& x, auto tag, std::size_t count) {
    using T = typename decltype(tag)::type;
    for (const std::size_t o : offsets(sizeof(T))) {
      t.add(run_case<T, braid::sum<>>(x, collective::all_reduce, algo::one_shot, op_kind::sum, count, o, true));
      if (o == 0) continue;
      t.add(run_case<T, braid::sum<>>(x, collective::all_reduce, algo::one_shot, op_kind::sum, count, o, false, 0));
      t.add(run_case<T, braid::sum<>>(x, collective::all_reduce, algo::one_shot, op_kind::sum, count, 0, false, o));
    }
  };
  for (int n : {2, 3}) {
    std::vector<int> devs(static_cast<std::size_t>(n)); // a GPU of its own for each rank where there are enough
    for (int r = 0; r < n; ++r) devs[static_cast<std::size_t>(r)] = r % std::max(ndev, 1);
    // 8 blocks of 64 threads per rank: a rank's blocks are what must be ordered.
    rig x(n, buffer_bytes(big, n, true, sizeof(double)), sweep_timeout(), 0, devs, 64, 8);
    for (const std::size_t count : {std::size_t{1003}, big}) {
      one_shot_sweep(x, braid::type_tag<float>{}, count);
      one_shot_sweep(x, braid::type_tag<braid::half>{}, count);
    }
    one_shot_sweep(x, braid::type_tag<double>{}, big);
    one_shot_sweep(x, braid::type_tag<std::int8_t>{}, big);
    for (const std::size_t o : offsets(sizeof(float))) // the call as reported: avg, in place
      t.add(run_case<float, braid::avg<>>(x, collective::all_reduce, algo::one_shot, op_kind::avg, big, o, true));
    for (collective c : braid::testing::sweep_collectives)
      for (algo a : algos_for(c))
        for (const std::size_t o : {std::size_t{1}, std::size_t{2}})
          t.add(run_case<float, braid::sum<>>(x, c, a, op_kind::sum, 4099, o, true));
  }
  { // forms mixed across ranks: rank 0 in place on an aligned buffer, rank 1 out of place from an input
    // 8 bytes past a 16-byte boundary that rank 0 reads in place (one GPU), so rank 0's reduction
    // moves single elements while its staging copy moved 16-byte words
    const std::size_t count = big;
    rig x(2, buffer_bytes(big, 2, true, sizeof(float)), sweep_timeout(), 0, {0, 0}, 64, 8);
    float* const io0 = static_cast<float*>(x.out[0]);
    float* const in1 = static_cast<float*>(x.in[1]) + 2;
    float* const out1 = static_cast<float*>(x.out[1]);
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<float> h(count);
      for (int r = 0; r < 2; ++r) {
        for (std::size_t i = 0; i < count; ++i) h[i] = input_value(r, i, rep);
        GPU_OK(cudaMemcpy(r == 0 ? io0 : in1, h.data(), count * sizeof(float), cudaMemcpyHostToDevice));
      }
      x.sync_uploads();
      {
        gt::bracket one_thread_for_both_ranks;
        gt::call c0 = float_all_reduce(io0, io0, count), c1 = float_all_reduce(in1, out1, count);
        c0.algorithm = c1.algorithm = algo::one_shot;
        gt::enqueue(x.group(), 0, c0);
        gt::enqueue(x.group(), 1, c1);
      }
      CHECK(x.sync().empty());
      for (int r = 0; r < 2; ++r) gt::check(x.group(), r);
      std::size_t wrong = 0;
      for (int r = 0; r < 2; ++r) {
        GPU_OK(cudaMemcpy(h.data(), r == 0 ? io0 : out1, count * sizeof(float), cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < count; ++i) wrong += h[i] != input_value(0, i, rep) + input_value(1, i, rep);
      }
      t.add(wrong ? "mixed forms (rank 0 in place, rank 1's input misaligned by 8 bytes), one_shot, rep " + std::to_string(rep) +
                        ": " + std::to_string(wrong) + " wrong elements"
                  : std::string());
    }
  }
  { // blocks of 4 threads: the tail of a 16-byte-aligned float buffer (under 16 bytes) spans blocks
    rig x(2, buffer_bytes(big, 2, true, sizeof(float)), sweep_timeout(), 0, {0, std::min(1, ndev - 1)}, 4, 8);
    for (const std::size_t count : {std::size_t{1003}, std::size_t{4099}})
      for (const std::size_t o : {std::size_t{0}, std::size_t{2}})
        t.add(run_case<float, braid::sum<>>(x, collective::all_reduce, algo::one_shot, op_kind::sum, count, o, true));
  }
  t.report(("misaligned buffers, ranks 2 and 3, counts 1003, 4099 and " + std::to_string(big)).c_str());
}

// api.md promises that broadcast and all_gather move any trivially copyable type. This did not even
// compile for a type without operator+ (the staging copy named braid::sum: issue 18, item 8).
TEST_CASE("gpu copy-only element type: broadcast and all_gather of a 3-byte struct, every algorithm") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    CHECK(gt::copy_only_check(sweep_devices(n), 1003) == 0);
    CHECK(gt::copy_only_check(sweep_devices(n), std::min<std::size_t>(sweep_large(), 100003)) == 0);
  }
}

// algo::automatic: ranks sharing one GPU take cuda_tuning_one_gpu (all_reduce one_shot at every size
// up to 8 ranks, all_gather halving_doubling for small blocks at 8 ranks; measured on an H100), ranks
// on different GPUs cuda_tuning (two_shot above 256 KiB); otherwise direct. Needs BRAID_ALGO unset.
TEST_CASE("gpu tuning: ranks sharing one GPU all_reduce one_shot at every size, ranks on different GPUs two_shot when large") {
  int ndev = 0;
  GPU_OK(cudaGetDeviceCount(&ndev));
  using braid::algo;
  using braid::collective;
  {
    // 8 ranks on one GPU: all_gather by halving_doubling up to 256 KiB per rank (measured), direct above.
    auto eight = gt::make_group(std::vector<int>(8, 0));
    CHECK(gt::algorithm_for(*eight, 0, collective::all_gather, std::uint64_t{256} << 10) == algo::halving_doubling);
    CHECK(gt::algorithm_for(*eight, 7, collective::all_gather, (std::uint64_t{256} << 10) + 4) == algo::direct);
    CHECK(gt::algorithm_for(*eight, 0, collective::all_reduce, std::uint64_t{256} << 20) == algo::one_shot);
  }
  for (int n : {2, 4}) {
    CAPTURE(n);
    auto one = gt::make_group(std::vector<int>(static_cast<std::size_t>(n), 0));
    for (std::uint64_t bytes : {std::uint64_t{8}, std::uint64_t{256} << 10, std::uint64_t{1} << 20, std::uint64_t{256} << 20}) {
      CAPTURE(bytes);
      for (int r = 0; r < n; ++r) CHECK(gt::algorithm_for(*one, r, collective::all_reduce, bytes) == algo::one_shot);
      for (collective c : {collective::reduce_scatter, collective::all_gather, collective::broadcast, collective::reduce})
        CHECK(gt::algorithm_for(*one, 0, c, bytes) == algo::direct);
      // The spread table takes two_shot from 256 KiB + 1: these tell the two tables apart.
      if (bytes > (std::uint64_t{256} << 10)) CHECK(gt::algorithm_for(*one, 0, collective::all_reduce, bytes) != algo::two_shot);
    }
    if (ndev < 2) {
      MESSAGE("one GPU: the spread layout's table is not checked here (the emulated run checks it)");
      continue;
    }
    std::vector<int> spread(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) spread[static_cast<std::size_t>(r)] = r % 2;
    auto two = gt::make_group(spread);
    CHECK(gt::algorithm_for(*two, 0, collective::all_reduce, std::uint64_t{256} << 10) == algo::one_shot);
    CHECK(gt::algorithm_for(*two, 1, collective::all_reduce, (std::uint64_t{256} << 10) + 4) == algo::two_shot);
    CHECK(gt::algorithm_for(*two, 0, collective::all_reduce, std::uint64_t{256} << 20) == algo::two_shot);
    CHECK(gt::algorithm_for(*two, 0, collective::broadcast, std::uint64_t{256} << 20) == algo::direct);
  }
}

// ---- CUDA graphs ----------------------------------------------------------------------------------

// The ranks of a GPU are one launch, so they are captured together: per GPU, one capture on the
// stream of its first rank, every rank of that GPU enqueued on that stream inside a bracket.
TEST_CASE("gpu graph: one captured all_reduce per GPU, replayed with new inputs, every capture mode") {
  const int n = 4;
  const std::size_t large = sweep_large();
  struct variant {
    std::size_t count;
    bool in_place;
  };
  // 7 elements: one round (one_shot); the large count: several rounds (two_shot, 64 KiB of staging),
  // read in place.
  // Every capture mode for the small call (api.md: any mode works, braid makes no call that a
  // global-mode capture forbids while a capture is under way); thread-local for the large one.
  const cudaStreamCaptureMode modes[] = {cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal,
                                         cudaStreamCaptureModeRelaxed};
  for (const variant v : {variant{7, true}, variant{large, false}})
  for (const cudaStreamCaptureMode mode : modes) {
    if (v.count != 7 && mode != cudaStreamCaptureModeThreadLocal) continue;
    CAPTURE(v.count);
    CAPTURE(v.in_place);
    CAPTURE(static_cast<int>(mode));
    const std::vector<int> devs = sweep_devices(n);
    auto g = gt::make_group(devs, sweep_timeout(), std::size_t{64} << 10, sweep_threads());
    float_buffers b(n, v.count);
    std::vector<int> firsts; // the first rank of each GPU
    for (int r = 0; r < n; ++r)
      if (std::find(devs.begin(), devs.begin() + r, devs[static_cast<std::size_t>(r)]) == devs.begin() + r) firsts.push_back(r);
    std::vector<cudaGraph_t> graphs(firsts.size(), nullptr);
    std::vector<cudaGraphExec_t> execs(firsts.size(), nullptr);
    for (std::size_t k = 0; k < firsts.size(); ++k) {
      const int d = devs[static_cast<std::size_t>(firsts[k])];
      cudaStream_t s = stream_of(*g, firsts[k]);
      GPU_OK(cudaSetDevice(d));
      GPU_OK(cudaStreamBeginCapture(s, mode));
      try {
        gt::bracket ranks_of_this_gpu;
        for (int r = 0; r < n; ++r) {
          const std::size_t ur = static_cast<std::size_t>(r);
          if (devs[ur] != d) continue;
          gt::call c = float_all_reduce(v.in_place ? b.out[ur] : b.in[ur], b.out[ur], v.count);
          c.stream = s;
          gt::enqueue(*g, r, c);
        }
      } catch (...) {
        cudaGraph_t dropped = nullptr;
        cudaStreamEndCapture(s, &dropped);
        if (dropped) cudaGraphDestroy(dropped);
        throw;
      }
      GPU_OK(cudaStreamEndCapture(s, &graphs[k]));
      GPU_OK(cudaGraphInstantiate(&execs[k], graphs[k], 0));
    }
    GPU_OK(cudaSetDevice(0));
    for (int rep = 0; rep < 3; ++rep) {
      CAPTURE(rep);
      upload_inputs(b, rep, v.in_place);
      for (std::size_t k = 0; k < firsts.size(); ++k) GPU_OK(cudaGraphLaunch(execs[k], stream_of(*g, firsts[k])));
      for (std::size_t k = 0; k < firsts.size(); ++k) GPU_OK(cudaStreamSynchronize(stream_of(*g, firsts[k])));
      for (int r = 0; r < n; ++r) gt::check(*g, r);
      std::string first;
      CHECK_MESSAGE(count_wrong_sums(b, rep, first) == 0, first);
    }
    // Stream launches after graph replays continue the same round sequence.
    expect_working_all_reduce(*g, v.count);
    for (auto e : execs) cudaGraphExecDestroy(e);
    for (auto gr : graphs) cudaGraphDestroy(gr);
  }
}

// api.md, "Streams, devices and buffers": the current device need not be the rank's (a call sets
// and restores it), and once a call is enqueued, work enqueued after it on the same stream may
// overwrite its input (the kernel ends only after every peer has read the input in place). With two
// devices rank 0's call is made while device 1 is current and each input is zeroed on its stream
// right behind the call, so an input released early would reach a peer as zeros.
TEST_CASE("gpu stream rules: any current device; an input may be overwritten by the stream's next work") {
  int ndev = 0;
  GPU_OK(cudaGetDeviceCount(&ndev));
  const std::vector<int> devs = ndev >= 2 ? std::vector<int>{0, 1, 1} : std::vector<int>{0, 0, 0};
  const int n = static_cast<int>(devs.size());
  const std::size_t count = 3001; // several chunks; out of place, so peers read the inputs in place
  auto g = gt::make_group(devs, sweep_timeout(), 0, sweep_threads());
  float_buffers b(n, count, devs);
  for (int rep = 0; rep < 3; ++rep) {
    CAPTURE(rep);
    upload_inputs(b, rep, false);
    const int current = devs.back();
    GPU_OK(cudaSetDevice(current));
    {
      gt::bracket every_rank;
      for (int r = 0; r < n; ++r) {
        const std::size_t ur = static_cast<std::size_t>(r);
        CHECK(gt::reads_in_place(*g, r, b.in[ur]));
        gt::enqueue(*g, r, float_all_reduce(b.in[ur], b.out[ur], count));
      }
    }
    int after = -1;
    GPU_OK(cudaGetDevice(&after));
    CHECK(after == current); // the calls restored the caller's device
    for (int r = 0; r < n; ++r) {
      const std::size_t ur = static_cast<std::size_t>(r);
      GPU_OK(cudaSetDevice(devs[ur]));
      GPU_OK(cudaMemsetAsync(b.in[ur], 0, count * sizeof(float), stream_of(*g, r)));
    }
    for (int r = 0; r < n; ++r) GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
    for (int r = 0; r < n; ++r) gt::check(*g, r);
    GPU_OK(cudaSetDevice(0));
    std::string first;
    CHECK_MESSAGE(count_wrong_sums(b, rep, first) == 0, first);
  }
}

// ---- failures -------------------------------------------------------------------------------------

// A rank that never calls. Ranks on one GPU meet on the host: the call of rank 0 raises the timeout
// itself, naming the ranks it waited for. Ranks on different GPUs wait in their kernels: rank 0's
// kernel gives up, and check() names the peer.
TEST_CASE("gpu stalled rank: a call on a shared GPU raises, a kernel on its own GPU times out, a fresh group works") {
  int ndev = 0;
  GPU_OK(cudaGetDeviceCount(&ndev));
  for (int n : {2, 4}) {
    CAPTURE(n);
    const std::size_t count = 1000;
    {
      const std::vector<int> devs(static_cast<std::size_t>(n), 0);
      auto g = gt::make_group(devs, 200ms, 0, sweep_threads());
      float_buffers b(n, count, devs);
      upload_inputs(b, 0, false);
      const auto t0 = std::chrono::steady_clock::now();
      bool raised = false;
      try {
        gt::enqueue(*g, 0, float_all_reduce(b.in[0], b.out[0], count)); // from this thread, the first call: it waits
      } catch (const braid::timeout_error& e) {
        raised = true;
        MESSAGE("rank 0's call: " << std::string(e.what()));
        CHECK(std::string(e.what()).find("rank 0 waited more than the timeout for rank(s) 1") != std::string::npos);
        CHECK(std::string(e.what()).find("group_start()") != std::string::npos);
        CHECK(e.rank() == 0);
        CHECK(e.collective() == "all_reduce"); // the call that waited, and its number on rank 0
        CHECK(e.sequence() == 1);
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      CHECK_MESSAGE(raised, "rank 0's call did not raise braid::timeout_error");
      CHECK(waited < 10.0);
      CHECK(cudaStreamQuery(stream_of(*g, 0)) == cudaSuccess); // nothing was launched
      // The group is failed: the next call raises at once, naming rank 0's call that gave up.
      try {
        gt::enqueue(*g, n - 1, float_all_reduce(b.in[static_cast<std::size_t>(n - 1)], b.out[static_cast<std::size_t>(n - 1)], count));
        FAIL("the next call did not raise");
      } catch (const braid::timeout_error& e) {
        MESSAGE("rank " << n - 1 << "'s next call: " << std::string(e.what()));
        CHECK(std::string(e.what()).find("for the other ranks of its GPU") != std::string::npos);
        CHECK(std::string(e.what()).find("group_start()") != std::string::npos); // the rule, here too
        CHECK(e.rank() == 0);
        CHECK(e.collective() == "all_reduce");
        CHECK(e.sequence() == 1);
      }
    }
    if (ndev >= 2) {
      std::vector<int> devs(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) devs[static_cast<std::size_t>(r)] = r % ndev;
      if (std::count(devs.begin(), devs.end(), 0) == 1) {
        auto g = gt::make_group(devs, 200ms, 0, sweep_threads());
        float_buffers b(n, count, devs);
        upload_inputs(b, 0, false);
        gt::enqueue(*g, 0, float_all_reduce(b.in[0], b.out[0], count)); // alone on its GPU: launched at once
        const auto t0 = std::chrono::steady_clock::now();
        GPU_OK(cudaStreamSynchronize(stream_of(*g, 0)));
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        MESSAGE("rank 0's kernel returned after " << waited << " s (timeout 0.2 s)");
        CHECK(waited < 10.0);
        bool raised = false;
        try {
          gt::check(*g, 0);
        } catch (const braid::timeout_error& e) {
          raised = true;
          MESSAGE("check(): " << std::string(e.what()));
          CHECK(e.peer() >= 1);
          CHECK(e.peer() < n);
          CHECK(std::string(e.what()).find("rank 0 waited") != std::string::npos);
          CHECK(e.rank() == 0);
          CHECK(e.collective() == "all_reduce"); // the call during which rank 0's kernel gave up
          CHECK(e.sequence() == 1);
        }
        CHECK_MESSAGE(raised, "check() did not raise braid::timeout_error");
        try {
          gt::check(*g, n - 1);
          FAIL("rank " << n - 1 << "'s check() did not raise");
        } catch (const braid::timeout_error& e) { // another rank's check(): the same record
          CHECK(e.rank() == 0);
          CHECK(e.collective() == "all_reduce");
          CHECK(e.sequence() == 1);
        }
      }
    }
    auto fresh = gt::make_group(sweep_devices(n), sweep_timeout(), 0, sweep_threads());
    expect_working_all_reduce(*fresh, count);
  }
}

// Rank 0's float all_reduce from this thread, without a bracket, while the GPU's other ranks have not
// called: checks that it raises invalid_usage naming `why` and the bracket rule; returns the seconds
// it waited.
static double unbracketed_call_raises(gt::group& g, std::size_t count, const char* why) {
  const std::vector<int> devs(static_cast<std::size_t>(gt::size(g)), 0);
  float_buffers b(gt::size(g), count, devs);
  const auto t0 = std::chrono::steady_clock::now();
  bool raised = false;
  try {
    gt::enqueue(g, 0, float_all_reduce(b.in[0], b.out[0], count));
  } catch (const braid::error& e) {
    raised = true;
    CHECK(e.code() == errc::invalid_usage);
    MESSAGE(std::string(e.what()));
    CHECK(std::string(e.what()).find(why) != std::string::npos);
    CHECK(std::string(e.what()).find("group_start()") != std::string::npos);
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("raised after " << waited << " s");
  CHECK_MESSAGE(raised, "no error");
  return waited;
}

// One thread that drives several ranks of a GPU without a bracket: once it is known to drive them (its
// earlier calls), the call raises at once and the group stays usable.
TEST_CASE("gpu one thread, several ranks of a GPU, no bracket: a clear error at once, the group stays usable") {
  const int n = 3;
  const std::size_t count = 100;
  const std::vector<int> devs(static_cast<std::size_t>(n), 0);
  auto g = gt::make_group(devs, 60s, 0, sweep_threads());
  expect_working_all_reduce(*g, count); // bracketed: this thread made every rank's latest call
  CHECK(unbracketed_call_raises(*g, count, "whose latest calls came from this same thread") < 5.0);
  expect_working_all_reduce(*g, count);
}

// The same mistake on a group's first call: nothing has been called, so the missing ranks are taken
// for the thread that created the group after a grace of 5 s (launcher.cuh's grace_before_first_call), not
// the timeout (60 s here). A rank with a thread of its own that starts within that time still works.
TEST_CASE("gpu one thread, the group's first call without a bracket: a clear error after the grace, not the timeout") {
  const int n = 2;
  const std::size_t count = 100;
  const std::vector<int> devs(static_cast<std::size_t>(n), 0);
  {
    auto g = gt::make_group(devs, 60s, 0, sweep_threads());
    const double waited = unbracketed_call_raises(*g, count, "which have made no call");
    CHECK(waited >= 4.5);
    CHECK(waited < 30.0);
    CHECK(cudaStreamQuery(stream_of(*g, 0)) == cudaSuccess); // nothing was launched
    expect_working_all_reduce(*g, count);                     // undone: the group stays usable
  }
  {
    // The creating thread drives rank 0; rank 1's own thread makes its first call 1.5 s later.
    auto g = gt::make_group(devs, 60s, 0, sweep_threads());
    float_buffers b(n, count, devs);
    upload_inputs(b, 0, false);
    std::string late_error;
    std::thread late([&] {
      std::this_thread::sleep_for(1500ms);
      try {
        gt::enqueue(*g, 1, float_all_reduce(b.in[1], b.out[1], count));
      } catch (const std::exception& e) {
        late_error = e.what();
      }
    });
    std::string error;
    try {
      gt::enqueue(*g, 0, float_all_reduce(b.in[0], b.out[0], count));
    } catch (const std::exception& e) {
      error = e.what();
    }
    late.join();
    CHECK(error == "");
    CHECK(late_error == "");
    for (int r = 0; r < n; ++r) GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
    for (int r = 0; r < n; ++r) gt::check(*g, r);
    std::string first;
    CHECK_MESSAGE(count_wrong_sums(b, 0, first) == 0, first);
  }
}

// Ranks of one GPU that disagree about a call: the call raises invalid_usage, and, since the ranks are
// now at different call counts, the group is stopped: every later call raises at once.
TEST_CASE("gpu ranks of one GPU make different calls: invalid_usage, the group stops") {
  const int n = 2;
  const std::vector<int> devs(static_cast<std::size_t>(n), 0);
  auto g = gt::make_group(devs, 60s, 0, sweep_threads());
  float_buffers b(n, 100, devs);
  const auto t0 = std::chrono::steady_clock::now();
  bool raised = false;
  try {
    gt::bracket both;
    gt::enqueue(*g, 0, float_all_reduce(b.in[0], b.out[0], 100));
    gt::enqueue(*g, 1, float_all_reduce(b.in[1], b.out[1], 50));
  } catch (const braid::error& e) {
    raised = true;
    CHECK(e.code() == errc::invalid_usage);
    MESSAGE(std::string(e.what()));
    CHECK(std::string(e.what()).find("different calls") != std::string::npos);
    CHECK(e.collective() == "all_reduce"); // the group's first call
    CHECK(e.sequence() == 1);
  }
  CHECK_MESSAGE(raised, "no error");
  try {
    gt::check(*g, 0);
    FAIL("check() did not raise");
  } catch (const braid::error& e) { // the record of the stopped group names the call that stopped it
    MESSAGE("check(): " << std::string(e.what()));
    CHECK(e.collective() == "all_reduce");
    CHECK(e.sequence() == 1);
  }
  CHECK_THROWS_AS(gt::enqueue(*g, 1, float_all_reduce(b.in[1], b.out[1], 100)), braid::error);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

// Ranks on different GPUs whose calls differ (count, then a rooted call whose two ranks both think
// they are the root, so that neither reads the other): the kernels compare call words before reading
// a peer (executor.cuh, same_call) and every rank's check() raises mismatch_error, long before the
// 60 s deadline; nothing is read past a buffer (the outputs' guards stay intact).
TEST_CASE("gpu ranks on different GPUs make different calls: mismatch_error, well before the deadline") {
  int ndev = 0;
  GPU_OK(cudaGetDeviceCount(&ndev));
  if (ndev < 2) {
    // Not a pass: the log says so (the emulated run, BRAID_EMU_DEVICES=2, is where this case runs).
    MESSAGE("SKIPPED (one GPU): this case needs 2 GPUs; it did not run");
    return;
  }
  const std::vector<int> devs{0, 1};
  for (int kind = 0; kind < 2; ++kind) {
    CAPTURE(kind);
    auto g = gt::make_group(devs, 60s, 0, sweep_threads());
    float_buffers b(2, 1000, devs);
    upload_inputs(b, 0, false);
    const auto t0 = std::chrono::steady_clock::now();
    if (kind == 0) {
      gt::enqueue(*g, 0, float_all_reduce(b.in[0], b.out[0], 1000));
      gt::enqueue(*g, 1, float_all_reduce(b.in[1], b.out[1], 500));
    } else {
      for (int r = 0; r < 2; ++r) {
        gt::call c = float_all_reduce(b.in[static_cast<std::size_t>(r)], b.out[static_cast<std::size_t>(r)], 1000);
        c.coll = collective::broadcast;
        c.root = r; // each thinks it is the root: nothing read, nothing compared in this call
        gt::enqueue(*g, r, c);
      }
      for (int r = 0; r < 2; ++r) // the next call carries the difference in its chained word
        gt::enqueue(*g, r, float_all_reduce(b.in[static_cast<std::size_t>(r)], b.out[static_cast<std::size_t>(r)], 1000));
    }
    for (int r = 0; r < 2; ++r) GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int r = 0; r < 2; ++r) {
      bool raised = false;
      try {
        gt::check(*g, r);
      } catch (const braid::error& e) {
        raised = e.code() == errc::mismatch;
        MESSAGE("rank " << r << ": " << std::string(e.what()));
        // The call during which a kernel found the difference: the first all_reduce, or the
        // all_reduce after the two broadcasts (each rank's call #2).
        CHECK(e.collective() == "all_reduce");
        CHECK(e.sequence() == (kind == 0 ? 1u : 2u));
        CHECK(e.peer() == 1 - e.rank());
      }
      CHECK_MESSAGE(raised, "rank " << r << "'s check() did not raise mismatch_error");
    }
    CHECK(waited < 10.0);
  }
}

// Ranks of one GPU driven by one thread each, no bracket: 12 ranks on GPU 0, several calls.
TEST_CASE("gpu 12 ranks on one GPU from 12 threads") {
  const int n = 12;
  const std::size_t count = 3000;
  const std::vector<int> devs(static_cast<std::size_t>(n), 0);
  auto g = gt::make_group(devs, sweep_timeout(), 0, 64);
  float_buffers b(n, count, devs);
  for (int rep = 0; rep < 3; ++rep) {
    CAPTURE(rep);
    upload_inputs(b, rep, false);
    const std::vector<std::string> err = all_reduce_from_threads(*g, b, count);
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(err[static_cast<std::size_t>(r)].empty(), err[static_cast<std::size_t>(r)]);
    for (int r = 0; r < n; ++r) GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
    for (int r = 0; r < n; ++r) gt::check(*g, r);
    std::string first;
    CHECK_MESSAGE(count_wrong_sums(b, rep, first) == 0, first);
  }
}

// Two groups on the same GPU, their calls in flight at once (each group one launch per call).
TEST_CASE("gpu two groups in flight on one GPU") {
  const int n = 3;
  const std::size_t count = 5000;
  const std::vector<int> devs(static_cast<std::size_t>(n), 0);
  auto g1 = gt::make_group(devs, sweep_timeout(), std::size_t{64} << 10, 64);
  auto g2 = gt::make_group(devs, sweep_timeout(), std::size_t{64} << 10, 64);
  float_buffers b1(n, count, devs), b2(n, count, devs);
  upload_inputs(b1, 1, false);
  upload_inputs(b2, 2, false);
  std::vector<std::string> err(static_cast<std::size_t>(2 * n));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    for (int which = 0; which < 2; ++which)
      th.emplace_back([&, r, which] {
        gt::group& g = which ? *g2 : *g1;
        float_buffers& b = which ? b2 : b1;
        try {
          gt::enqueue(g, r, float_all_reduce(b.in[static_cast<std::size_t>(r)], b.out[static_cast<std::size_t>(r)], count));
        } catch (const std::exception& e) {
          err[static_cast<std::size_t>(2 * r + which)] = e.what();
        }
      });
  for (auto& t : th) t.join();
  for (const auto& e : err) CHECK_MESSAGE(e.empty(), e);
  for (int r = 0; r < n; ++r) {
    GPU_OK(cudaStreamSynchronize(stream_of(*g1, r)));
    GPU_OK(cudaStreamSynchronize(stream_of(*g2, r)));
    gt::check(*g1, r);
    gt::check(*g2, r);
  }
  std::string first;
  CHECK_MESSAGE(count_wrong_sums(b1, 1, first) == 0, first);
  CHECK_MESSAGE(count_wrong_sums(b2, 2, first) == 0, first);
}

// A rank's calls are ordered whatever streams they are enqueued on, and graph replays between them too:
// every rank alternates between two streams, calls are not synchronised in between, and a captured
// call is replayed between stream calls. Each call's output feeds the next call's input (out-of-place
// into a second buffer), so any reordering changes the result.
TEST_CASE("gpu two streams per rank: interleaved calls and graph replays stay in order") {
  const int n = 3;
  const std::size_t count = 2000;
  const std::vector<int> devs = sweep_devices(n);
  auto g = gt::make_group(devs, sweep_timeout(), std::size_t{64} << 10, sweep_threads());
  float_buffers b(n, count, devs); // ping: in, pong: out
  std::vector<cudaStream_t> second(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    GPU_OK(cudaSetDevice(devs[static_cast<std::size_t>(r)]));
    GPU_OK(cudaStreamCreateWithFlags(&second[static_cast<std::size_t>(r)], cudaStreamNonBlocking));
  }
  // The captured call: pong -> ping, on each GPU's first rank's second stream.
  std::vector<int> firsts;
  for (int r = 0; r < n; ++r)
    if (std::find(devs.begin(), devs.begin() + r, devs[static_cast<std::size_t>(r)]) == devs.begin() + r) firsts.push_back(r);
  std::vector<cudaGraph_t> graphs(firsts.size());
  std::vector<cudaGraphExec_t> execs(firsts.size());
  for (std::size_t k = 0; k < firsts.size(); ++k) {
    const int d = devs[static_cast<std::size_t>(firsts[k])];
    cudaStream_t s = second[static_cast<std::size_t>(firsts[k])];
    GPU_OK(cudaSetDevice(d));
    GPU_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    {
      gt::bracket ranks_of_this_gpu;
      for (int r = 0; r < n; ++r) {
        const std::size_t ur = static_cast<std::size_t>(r);
        if (devs[ur] != d) continue;
        gt::call c = float_all_reduce(b.out[ur], b.in[ur], count);
        c.stream = s;
        gt::enqueue(*g, r, c);
      }
    }
    GPU_OK(cudaStreamEndCapture(s, &graphs[k]));
    GPU_OK(cudaGraphInstantiate(&execs[k], graphs[k], 0));
  }
  GPU_OK(cudaSetDevice(0));
  upload_inputs(b, 0, false);
  // After the first call every rank holds S, the sum of the inputs; each later call multiplies by n.
  std::vector<double> model(count);
  for (std::size_t i = 0; i < count; ++i)
    for (int q = 0; q < n; ++q) model[i] += input_value(q, i, 0);
  int calls = 0;
  auto stream_call = [&](bool to_pong, bool use_second) {
    gt::bracket all_ranks;
    for (int r = 0; r < n; ++r) {
      const std::size_t ur = static_cast<std::size_t>(r);
      gt::call c = to_pong ? float_all_reduce(b.in[ur], b.out[ur], count) : float_all_reduce(b.out[ur], b.in[ur], count);
      if (use_second) c.stream = second[ur];
      gt::enqueue(*g, r, c);
    }
    ++calls;
  };
  auto replay = [&] {
    for (std::size_t k = 0; k < firsts.size(); ++k) GPU_OK(cudaGraphLaunch(execs[k], second[static_cast<std::size_t>(firsts[k])]));
  };
  stream_call(true, false); // ping -> pong (S), first streams
  replay();                 // pong -> ping (n S)
  stream_call(true, true);  // ping -> pong (n^2 S), second streams
  replay();                 // pong -> ping (n^3 S)
  stream_call(true, false); // ping -> pong (n^4 S), first streams
  for (int r = 0; r < n; ++r) {
    GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
    GPU_OK(cudaStreamSynchronize(second[static_cast<std::size_t>(r)]));
    gt::check(*g, r);
  }
  CHECK(calls == 3);
  std::size_t wrong = 0;
  std::string first;
  std::vector<float> h(count);
  for (int r = 0; r < n; ++r)
    for (const bool pong : {false, true}) {
      GPU_OK(cudaMemcpy(h.data(), pong ? b.out[static_cast<std::size_t>(r)] : b.in[static_cast<std::size_t>(r)], count * sizeof(float),
                        cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < count; ++i) {
        const double want = model[i] * n * n * n * (pong ? n : 1);
        if (h[i] != static_cast<float>(want)) {
          if (!wrong)
            first = "rank " + std::to_string(r) + (pong ? " pong" : " ping") + " element " + std::to_string(i) + ": " +
                    std::to_string(h[i]) + " != " + std::to_string(want);
          ++wrong;
        }
      }
    }
  CHECK_MESSAGE(wrong == 0, first);
  for (auto e : execs) cudaGraphExecDestroy(e);
  for (auto gr : graphs) cudaGraphDestroy(gr);
  for (cudaStream_t s : second) cudaStreamDestroy(s);
}

namespace {
// Runs body(two_gpus, devs) for two ranks on one GPU (devs {0, 0}), then on two GPUs (devs {0, 1})
// where the machine has two; a MESSAGE says when it has not. CAPTURE names the layout in every
// failure inside body.
template <class F> void on_one_and_two_gpus(F body) {
  int ndev = 0;
  GPU_OK(cudaGetDeviceCount(&ndev));
  for (const bool two_gpus : {false, true}) {
    if (two_gpus && ndev < 2) {
      MESSAGE("one GPU: the two-GPU layout is not run");
      continue;
    }
    CAPTURE(two_gpus);
    body(two_gpus, two_gpus ? std::vector<int>{0, 1} : std::vector<int>{0, 0});
  }
}
} // namespace

// Inputs from a stream-ordered pool (cudaMallocAsync): peer access does not map them, so a peer on
// another GPU must not read them in place. The call stages them (reads_in_place says so) and the
// result is right; on one GPU they are read in place.
TEST_CASE("gpu pool-allocated inputs: staged when a peer is on another GPU, read in place on one GPU") {
  const std::size_t count = 4000;
  on_one_and_two_gpus([&](const bool two_gpus, const std::vector<int>& devs) {
    const int n = 2;
    auto g = gt::make_group(devs, sweep_timeout(), std::size_t{64} << 10, sweep_threads());
    float_buffers b(n, count, devs); // outputs (cudaMalloc) and plain inputs
    std::vector<float*> pool(n);
    for (int r = 0; r < n; ++r) {
      const std::size_t ur = static_cast<std::size_t>(r);
      GPU_OK(cudaSetDevice(devs[ur]));
      GPU_OK(cudaMallocAsync(reinterpret_cast<void**>(&pool[ur]), count * sizeof(float), stream_of(*g, r)));
      GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
      CHECK(gt::reads_in_place(*g, r, b.in[ur]));
      CHECK(gt::reads_in_place(*g, r, pool[ur]) == !two_gpus);
    }
    GPU_OK(cudaSetDevice(0));
    upload_inputs(b, 3, false);
    for (int r = 0; r < n; ++r) {
      const std::size_t ur = static_cast<std::size_t>(r);
      GPU_OK(cudaMemcpy(pool[ur], b.in[ur], count * sizeof(float), cudaMemcpyDeviceToDevice));
    }
    GPU_OK(cudaDeviceSynchronize());
    {
      gt::bracket one_thread;
      for (int r = 0; r < n; ++r) gt::enqueue(*g, r, float_all_reduce(pool[static_cast<std::size_t>(r)], b.out[static_cast<std::size_t>(r)], count));
    }
    for (int r = 0; r < n; ++r) {
      GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
      gt::check(*g, r);
    }
    std::string first;
    CHECK_MESSAGE(count_wrong_sums(b, 3, first) == 0, first);
    for (int r = 0; r < n; ++r) {
      const std::size_t ur = static_cast<std::size_t>(r);
      GPU_OK(cudaSetDevice(devs[ur]));
      GPU_OK(cudaFreeAsync(pool[ur], stream_of(*g, r)));
      GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
    }
    GPU_OK(cudaSetDevice(0));
  });
}

// Rounds per call (communicator::rounds()): with 64 KiB of staging a large out-of-place call of ranks
// that all share one GPU reads every input in place, keeps nothing in staging and runs in one round
// (one_shot all_reduce, direct reduce_scatter, all_gather, broadcast and reduce); an in-place rank
// stages its input and a schedule with windows (two_shot) keeps them in staging, so those run as many
// rounds as staging bounds, as do ranks on two GPUs (each GPU's launch serves only its own ranks).
TEST_CASE("gpu in-place reads: ranks of one GPU run a large out-of-place call in one round, staged calls in many") {
  const int n = 2;
  const std::size_t count = 100000;
  const std::size_t staging = std::size_t{64} << 10, half = staging / 2; // 4 KiB pages: the half as asked
  const std::uint64_t staged_rounds =
      braid::schedule::nrounds(count, braid::schedule::per_round<braid::schedule::one_shot, float>(collective::all_reduce, n, half));
  REQUIRE(staged_rounds > 8);
  on_one_and_two_gpus([&](const bool two_gpus, const std::vector<int>& devs) {
    auto g = gt::make_group(devs, sweep_timeout(), staging, sweep_threads());
    float_buffers b(n, count * n, devs); // room for every collective's blocks
    b.count = count;
    // Rounds each rank's kernels run for one call of every rank (rank r's call from make(r)).
    auto rounds_of = [&](auto make) {
      std::vector<std::uint64_t> before(n), used(n);
      for (int r = 0; r < n; ++r) before[static_cast<std::size_t>(r)] = gt::rounds(*g, r);
      {
        gt::bracket one_thread;
        for (int r = 0; r < n; ++r) gt::enqueue(*g, r, make(r));
      }
      for (int r = 0; r < n; ++r) {
        GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
        gt::check(*g, r);
        used[static_cast<std::size_t>(r)] = gt::rounds(*g, r) - before[static_cast<std::size_t>(r)];
      }
      CHECK(used[0] == used[1]);
      return used[0];
    };
    std::string first;
    // one_shot all_reduce, out of place on every rank: one round on one GPU.
    upload_inputs(b, 1, false);
    const std::uint64_t out_of_place = rounds_of([&](int r) {
      gt::call c = float_all_reduce(b.in[static_cast<std::size_t>(r)], b.out[static_cast<std::size_t>(r)], count);
      c.algorithm = algo::one_shot;
      return c;
    });
    CHECK(out_of_place == (two_gpus ? staged_rounds : 1));
    CHECK_MESSAGE(count_wrong_sums(b, 1, first) == 0, first);
    // Rank 0 in place: its input is staged, so every rank runs the staged rounds.
    upload_inputs(b, 2, false);
    GPU_OK(cudaMemcpy(b.out[0], b.in[0], count * sizeof(float), cudaMemcpyDeviceToDevice));
    const std::uint64_t one_in_place = rounds_of([&](int r) {
      const std::size_t ur = static_cast<std::size_t>(r);
      gt::call c = float_all_reduce(r == 0 ? b.out[0] : b.in[ur], b.out[ur], count);
      c.algorithm = algo::one_shot;
      return c;
    });
    CHECK(one_in_place == staged_rounds);
    CHECK_MESSAGE(count_wrong_sums(b, 2, first) == 0, first);
    // two_shot keeps its reduced chunks in staging windows: many rounds.
    upload_inputs(b, 3, false);
    const std::uint64_t windows = rounds_of([&](int r) {
      gt::call c = float_all_reduce(b.in[static_cast<std::size_t>(r)], b.out[static_cast<std::size_t>(r)], count);
      c.algorithm = algo::two_shot;
      return c;
    });
    CHECK(windows > 1);
    CHECK_MESSAGE(count_wrong_sums(b, 3, first) == 0, first);
    // direct: every collective but all_reduce keeps no windows (their results: the sweeps).
    for (const collective coll : {collective::reduce_scatter, collective::all_gather, collective::broadcast, collective::reduce}) {
      CAPTURE(static_cast<int>(coll));
      const std::uint64_t used = rounds_of([&](int r) {
        gt::call c = float_all_reduce(b.in[static_cast<std::size_t>(r)], b.out[static_cast<std::size_t>(r)], count);
        c.coll = coll;
        c.algorithm = algo::direct;
        return c;
      });
      if (two_gpus) CHECK(used > 1);
      else CHECK(used == 1);
    }
  });
}

// Run by CTest with CUDA_LAUNCH_BLOCKING=1 (test_gpu_emu_launch_blocking): every launch returns only
// when its kernel has ended. Ranks of one GPU are one launch, so one thread for every rank works, and
// so does one thread per rank; one thread launching for ranks on two GPUs is refused at once. Without
// the variable the case only says so.
TEST_CASE("gpu CUDA_LAUNCH_BLOCKING=1: ranks of one GPU work from one thread or many; one thread for two GPUs is refused") {
  const char* lb = std::getenv("CUDA_LAUNCH_BLOCKING");
  if (!(lb && lb[0] == '1')) {
    MESSAGE("CUDA_LAUNCH_BLOCKING is not 1: nothing to check here (CTest runs this case with it set)");
    return;
  }
  const int n = 2;
  const std::size_t count = 1000;
  const std::vector<int> devs(n, 0);
  {
    auto g = gt::make_group(devs, sweep_timeout(), 0, sweep_threads());
    float_buffers b(n, count, devs);
    upload_inputs(b, 0, false);
    const std::vector<std::string> err = all_reduce_from_threads(*g, b, count);
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(err[static_cast<std::size_t>(r)].empty(), err[static_cast<std::size_t>(r)]);
    for (int r = 0; r < n; ++r) GPU_OK(cudaStreamSynchronize(stream_of(*g, r)));
    for (int r = 0; r < n; ++r) CHECK_NOTHROW(gt::check(*g, r));
    std::string first;
    CHECK_MESSAGE(count_wrong_sums(b, 0, first) == 0, first);
  }
  {
    auto g = gt::make_group(devs, 60s, 0, sweep_threads());
    expect_working_all_reduce(*g, count); // one thread, one bracket
  }
  int ndev = 0;
  GPU_OK(cudaGetDeviceCount(&ndev));
  if (ndev >= 2) {
    auto g = gt::make_group({0, 1}, 60s, 0, sweep_threads());
    float_buffers b(n, count, {0, 1});
    const auto t0 = std::chrono::steady_clock::now();
    bool raised = false;
    try {
      gt::bracket both;
      gt::enqueue(*g, 0, float_all_reduce(b.in[0], b.out[0], count));
    } catch (const braid::error& e) {
      raised = true;
      MESSAGE("one thread for two GPUs: " << std::string(e.what()));
      CHECK(std::string(e.what()).find("CUDA_LAUNCH_BLOCKING=1") != std::string::npos);
    }
    CHECK_MESSAGE(raised, "one thread launching for two GPUs was not refused under CUDA_LAUNCH_BLOCKING=1");
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  }
}

TEST_CASE("gpu bad arguments: raised before anything is launched, the group stays usable") {
  const int n = 2;
  const std::size_t K = 5;
  // A short deadline: if a bad call did launch rank 0's kernel, it would give up (and poison the
  // group, which the final all_reduce would show) instead of hanging.
  auto g = gt::make_group(std::vector<int>(n, 0), 2s, 0, sweep_threads());
  float_buffers b(n, 64);
  for (int r = 0; r < n; ++r) GPU_OK(cudaMemset(b.out[static_cast<std::size_t>(r)], 0xA5, 64 * sizeof(float)));
  float* in = b.in[0];
  float* out = b.out[0];

  auto expect_error = [&](const char* what, gt::call c, errc code) {
    CAPTURE(what);
    bool raised = false;
    try {
      gt::enqueue(*g, 0, c);
    } catch (const braid::error& e) {
      raised = true;
      CHECK(e.code() == code);
      CHECK(e.rank() == 0);
      CHECK(e.collective() == name(c.coll));
    }
    CHECK_MESSAGE(raised, std::string(what) << ": no error raised");
    CHECK_MESSAGE(cudaStreamQuery(stream_of(*g, 0)) == cudaSuccess, std::string(what) << ": something was enqueued");
  };
  auto call = [&](collective c, const float* i, float* o, std::size_t count, int root = 0, algo a = algo::automatic) {
    return gt::call{.coll = c, .algorithm = a, .in = i, .out = o, .count = count, .root = root};
  };
  expect_error("all_reduce, null input", call(collective::all_reduce, nullptr, out, K), errc::invalid_argument);
  expect_error("all_reduce, null output", call(collective::all_reduce, in, nullptr, K), errc::invalid_argument);
  expect_error("reduce_scatter, null input", call(collective::reduce_scatter, nullptr, out, K), errc::invalid_argument);
  expect_error("all_gather, null output", call(collective::all_gather, in, nullptr, K), errc::invalid_argument);
  expect_error("broadcast, root -1", call(collective::broadcast, in, out, K, -1), errc::invalid_argument);
  expect_error("broadcast, root n", call(collective::broadcast, in, out, K, n), errc::invalid_argument);
  expect_error("reduce, root n", call(collective::reduce, in, out, K, n), errc::invalid_argument);
  expect_error("reduce, root -1", call(collective::reduce, in, out, K, -1), errc::invalid_argument);
  expect_error("all_reduce, overlapping buffers", call(collective::all_reduce, out, out + 1, K), errc::invalid_argument);
  expect_error("all_reduce, count overflows", call(collective::all_reduce, in, out, SIZE_MAX / 2), errc::invalid_argument);
  expect_error("reduce_scatter with one_shot", call(collective::reduce_scatter, in, out, K, 0, algo::one_shot),
               errc::unsupported);
  // Count 0 with null pointers is valid and does nothing.
  CHECK_NOTHROW(gt::enqueue(*g, 0, call(collective::all_reduce, nullptr, nullptr, 0)));
  CHECK(cudaStreamQuery(stream_of(*g, 0)) == cudaSuccess);

  // Nothing was written, nothing failed, and the group still works.
  std::vector<unsigned char> h(64 * sizeof(float));
  GPU_OK(cudaMemcpy(h.data(), out, h.size(), cudaMemcpyDeviceToHost));
  CHECK(std::all_of(h.begin(), h.end(), [](unsigned char v) { return v == 0xA5; }));
  CHECK_NOTHROW(gt::check(*g, 0));
  expect_working_all_reduce(*g, 1000);

  // create_group's own checks.
  int devices = 0;
  GPU_OK(cudaGetDeviceCount(&devices));
  CHECK_THROWS_AS(gt::make_group({}), braid::invalid_argument);
  CHECK_THROWS_AS(gt::make_group(std::vector<int>(65, 0)), braid::invalid_argument);
  CHECK_THROWS_AS(gt::make_group({0, devices}), braid::invalid_argument);
  CHECK_THROWS_AS(gt::make_group({-1}), braid::invalid_argument);
}

// ---- main: skip visibly without a device ----------------------------------------------------------

namespace {
// doctest options that only print something (--help, --list-test-cases, ...): no device needed.
bool informational(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    a.erase(0, a.find_first_not_of('-'));
    if (a.rfind("dt-", 0) == 0) a.erase(0, 3);
    a = a.substr(0, a.find('='));
    for (const char* o : {"?", "h", "help", "v", "version", "c", "count", "ltc", "list-test-cases", "lts",
                          "list-test-suites", "lr", "list-reporters"})
      if (a == o) return true;
  }
  return false;
}
} // namespace

int main(int argc, char** argv) {
#ifdef BRAID_TEST_PROGRESS_POST_HOOK
  // The mutation test (ThreadSanitizer build; tests/cuda/CMakeLists.txt): the progress post relaxed.
  if (const char* m = std::getenv("BRAID_TEST_PROGRESS_POST_RELAXED"); m && m[0] == '1') {
    braid::cuda::device::test_progress_post_relaxed = true;
    std::printf("test_gpu: the progress post is weakened to relaxed (BRAID_TEST_PROGRESS_POST_RELAXED=1)\n");
  }
#endif
  if (informational(argc, argv)) {
    doctest::Context ctx(argc, argv);
    return ctx.run();
  }
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    const std::size_t tests = doctest::detail::getRegisteredTests().size();
    std::printf("SKIPPED: no CUDA device (%zu GPU tests not run)\n", tests);
    if (e != cudaSuccess) std::printf("  cudaGetDeviceCount: %s: %s\n", cudaGetErrorName(e), cudaGetErrorString(e));
    std::fflush(stdout);
    return 77;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
    std::printf("test_gpu: running on the %s; device 0 of %d: %s, sm_%d%d, %d SMs, %.1f GiB; test kernels built for %s\n",
                gt::device_kind(), devices, p.name, p.major, p.minor, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / (1u << 30),
                gt::emulated() ? "the host (emulated device)" : "CUDA architectures " BRAID_GPU_TEST_ARCHS);
  std::string why;
  if (!gt::kernels_loadable(why)) {
    std::printf("FAILED: the test kernels cannot run on GPU 0 (%s): rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d\n",
                why.c_str(), p.major, p.minor);
    return 1;
  }
  std::fflush(stdout);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
