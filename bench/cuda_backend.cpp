// bench/cuda_backend.cpp — braid-bench --backend cuda (and, where NCCL was found at configure time,
// --backend nccl): the same tables as the host backends, for ranks that are GPUs driven by this one
// host thread (rank r on GPU r % device count; with one GPU every rank shares it — NCCL needs
// NCCL_MULTI_RANK_GPU_ENABLE=1, from 2.30, for that).
//
// Host-compiled: braid's kernels come from the launch layer (bench/launch/launch.hpp, shared with the GPU tests), so this
// adds no nvcc work. That layer instantiates all_reduce with sum for every type and float with every
// operator for every collective; other (collective, type, operator) rows print "not instantiated".
//
// Both engines go through the same harness, so braid and NCCL are timed and checked the same way.
// Method per row half: w warmup calls, then n calls enqueued back to back on every rank's stream (all
// ranks' parts of call i before call i + 1; NCCL: one ncclGroupStart/End per call), every stream
// synchronised, time = wall time / n. Check (-c 1): pattern inputs, poisoned outputs with 64 guard
// bytes each side, one call, every rank's output copied back and compared with the host reference of
// bench.hpp, inputs unchanged, guards intact, replicated results bit-identical to rank 0's.
// --enqueue-time adds the host's time inside the calls (a pass of its own); --graph captures n calls
// in CUDA graphs (braid: one per GPU, its ranks on one stream; NCCL: one, the ranks' streams forked
// from rank 0's) and times 3 replays after an untimed one, so host cost and GPU cost are told apart.
//
// --procs N: N forked processes, one braid::cuda::process_communicator each (rank r on GPU r % device
// count), all_reduce of float with sum only. Calls are blocking there, so time = wall time of n calls
// / n, max over ranks; check: inputs r + 1 + i % 7, every element of every rank compared exactly.
#include "bench.hpp"
#include "launch/launch.hpp"
#include "launch/launch_procs.hpp"

#include <braid/launch/fork.hpp>

#include <algorithm>
#include <functional>
#include <set>

#include <braid/cuda/runtime.cuh>
#ifdef BRAID_BENCH_NCCL
#include <cctype>
#include <sstream>

#include <nccl.h>
#ifdef BRAID_BENCH_NCCL_FUNCS_HEADER
#include BRAID_BENCH_NCCL_FUNCS_HEADER // nccl_only_funcs: the ONLY_FUNCS NCCL was built with (bench/build-nccl.sh)
#endif
#endif

namespace braid_bench {
namespace {

namespace gt = braid::gpu_launch;

struct cuda_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw cuda_failure(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device buffer with 64 guard bytes on each side.
class device_buffer {
public:
  static constexpr std::size_t guard = 64;
  device_buffer(int device, std::size_t bytes) : bytes_(bytes) {
    ok(cudaSetDevice(device), "cudaSetDevice");
    ok(cudaMalloc(&base_, bytes + 2 * guard), "cudaMalloc");
  }
  ~device_buffer() { cudaFree(base_); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(base_) + guard; }
  std::size_t bytes() const { return bytes_; }
  // Guards get guard_byte, the data poison.
  void arm() {
    ok(cudaMemset(base_, static_cast<int>(guard_byte), bytes_ + 2 * guard), "cudaMemset");
    ok(cudaMemset(data(), static_cast<int>(poison), bytes_), "cudaMemset");
  }
  // Copies the data back; counts damaged guard bytes into `wrong`.
  std::vector<std::byte> fetch(std::int64_t& wrong) const {
    std::vector<std::byte> all(bytes_ + 2 * guard);
    ok(cudaMemcpy(all.data(), base_, all.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (std::size_t i = 0; i < guard; ++i) wrong += (all[i] != guard_byte) + (all[guard + bytes_ + i] != guard_byte);
    return {all.begin() + guard, all.begin() + static_cast<std::ptrdiff_t>(guard + bytes_)};
  }

private:
  std::size_t bytes_;
  void* base_ = nullptr;
};

// What the harness needs from a library: every rank's part of one call, and a wait for all of it.
class engine {
public:
  virtual ~engine() = default;
  virtual const char* name() const = 0;
  virtual bool has(collective c, dtype t, op_kind k, algo a) const = 0;
  virtual void launch(const std::vector<gt::call>& calls) = 0;
  virtual void sync() = 0; // every rank's stream; raises the library's error, if any
  // --graph: captures `n` calls (every rank's part of each) in CUDA graphs once, replays them once
  // untimed and then `replays` times; returns the wall time per call of the timed replays, in µs.
  virtual double graph_us(const std::vector<gt::call>& calls, int n, int replays) = 0;

protected:
  // Instantiates what the captures on `streams` (begun by the caller, on their devices) hold once
  // `enqueue` has run, times the replays and destroys the graphs. A failure ends every capture first.
  double capture_and_time(const std::vector<cudaStream_t>& streams, const std::vector<int>& devices,
                          const std::function<void()>& enqueue, int n, int replays) {
    std::vector<cudaGraphExec_t> execs(streams.size(), nullptr);
    auto end_all = [&](bool keep) {
      for (std::size_t k = 0; k < streams.size(); ++k) {
        cudaSetDevice(devices[k]);
        cudaGraph_t gr = nullptr;
        const cudaError_t e = cudaStreamEndCapture(streams[k], &gr);
        if (keep) ok(e, "cudaStreamEndCapture");
        if (keep && gr) ok(cudaGraphInstantiate(&execs[k], gr, 0), "cudaGraphInstantiate");
        if (gr) cudaGraphDestroy(gr);
      }
    };
    auto destroy = [&] {
      for (cudaGraphExec_t x : execs)
        if (x) cudaGraphExecDestroy(x);
    };
    try {
      enqueue();
    } catch (...) {
      end_all(false);
      throw;
    }
    try {
      end_all(true);
      auto replay = [&] {
        for (std::size_t k = 0; k < streams.size(); ++k) {
          ok(cudaSetDevice(devices[k]), "cudaSetDevice");
          ok(cudaGraphLaunch(execs[k], streams[k]), "cudaGraphLaunch");
        }
      };
      replay();
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < replays; ++i) replay();
      sync();
      const auto t1 = std::chrono::steady_clock::now();
      destroy();
      return std::chrono::duration<double, std::micro>(t1 - t0).count() / (static_cast<double>(replays) * n);
    } catch (...) {
      destroy();
      throw;
    }
  }
};

class braid_engine final : public engine {
public:
  braid_engine(const std::vector<int>& devices, std::chrono::nanoseconds timeout, int threads, int max_blocks, bool by_streams)
      : devices_(devices), g_(gt::make_group(devices, timeout, 0, threads, max_blocks, by_streams)) {
    std::printf("# grid: %d blocks of %d threads per rank\n", gt::blocks_per_rank(*g_), gt::threads_per_block(*g_));
    std::printf("# calls ordered by %s\n", by_streams ? "the streams (call_order::streams)" : "braid (call_order::braid)");
  }
  const char* name() const override { return "cuda"; }
  bool has(collective c, dtype t, op_kind k, algo) const override {
    // What the launch layer instantiates (copy collectives are asked with sum: their rows carry no operator).
    return gt::instantiated(c, t, has_reduction(c) ? k : op_kind::sum);
  }
  void launch(const std::vector<gt::call>& calls) override {
    gt::bracket one_thread_for_every_rank; // the ranks of a GPU launch together
    for (std::size_t r = 0; r < calls.size(); ++r) gt::enqueue(*g_, static_cast<int>(r), calls[r]);
  }
  void sync() override {
    const int n = gt::size(*g_);
    for (int r = 0; r < n; ++r) ok(cudaStreamSynchronize(static_cast<cudaStream_t>(gt::stream(*g_, r))), "cudaStreamSynchronize");
    for (int r = 0; r < n; ++r) gt::check(*g_, r);
  }
  // One capture per GPU, on its first rank's stream: inside a capture the ranks of a GPU enqueue on one
  // stream (the launch layer's rule), so every rank's calls go there.
  double graph_us(const std::vector<gt::call>& calls, int n, int replays) override {
    std::vector<gt::call> on(calls);
    std::vector<cudaStream_t> streams;
    std::vector<int> devs;
    for (std::size_t r = 0; r < on.size(); ++r) {
      const auto first = static_cast<std::size_t>(std::find(devices_.begin(), devices_.end(), devices_[r]) - devices_.begin());
      on[r].stream = gt::stream(*g_, static_cast<int>(first));
      if (first == r) {
        streams.push_back(static_cast<cudaStream_t>(on[r].stream));
        devs.push_back(devices_[r]);
      }
    }
    for (std::size_t k = 0; k < streams.size(); ++k) {
      ok(cudaSetDevice(devs[k]), "cudaSetDevice");
      if (const cudaError_t e = cudaStreamBeginCapture(streams[k], cudaStreamCaptureModeThreadLocal); e != cudaSuccess) {
        for (std::size_t j = 0; j < k; ++j) {
          cudaGraph_t gr = nullptr;
          cudaSetDevice(devs[j]);
          cudaStreamEndCapture(streams[j], &gr);
          if (gr) cudaGraphDestroy(gr);
        }
        ok(e, "cudaStreamBeginCapture");
      }
    }
    return capture_and_time(streams, devs, [&] { for (int i = 0; i < n; ++i) launch(on); }, n, replays);
  }

private:
  std::vector<int> devices_;
  std::shared_ptr<gt::group> g_;
};

#ifdef BRAID_BENCH_NCCL
// Whether an NCCL built with ONLY_FUNCS = `funcs` (src/device/generate.py's pattern: alternatives
// split by '|', each a list of words, '*' any one word, matched case-insensitively against
// "Coll RedOp Type Algo Proto", or "Coll Algo Proto" for collectives without a reduction) has every
// algorithm and protocol of this function: a call NCCL sends to a kernel the build filtered out
// indexes past its kernel table. An empty pattern: NCCL built whole.
bool nccl_built(const std::string& funcs, const std::vector<std::string>& fn) {
  if (funcs.empty()) return true;
  auto lower = [](std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  std::stringstream alts(funcs);
  for (std::string alt; std::getline(alts, alt, '|');) {
    std::stringstream words(alt);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(lower(x));
    if (w.size() != fn.size() + 2 || w[w.size() - 1] != "*" || w[w.size() - 2] != "*") continue;
    bool ok = true;
    for (std::size_t i = 0; i < fn.size() && ok; ++i) ok = w[i] == "*" || w[i] == lower(fn[i]);
    if (ok) return true;
  }
  return false;
}

// NCCL's device-function names for a braid-bench call ({} where NCCL has no such function).
std::vector<std::vector<std::string>> nccl_functions(collective c, dtype t, op_kind k) {
  const char* coll = c == collective::all_reduce ? "AllReduce" : c == collective::all_gather ? "AllGather"
                     : c == collective::reduce_scatter ? "ReduceScatter" : c == collective::broadcast ? "Broadcast"
                     : c == collective::reduce ? "Reduce" : nullptr;
  if (!coll) return {};
  if (c == collective::all_gather || c == collective::broadcast) return {{coll}};
  const bool integer = t != dtype::float16 && t != dtype::bfloat16 && t != dtype::float32 && t != dtype::float64;
  const char* op = k == op_kind::sum ? "Sum" : k == op_kind::prod ? "Prod" : k == op_kind::min || k == op_kind::max ? "MinMax"
                   : k == op_kind::avg ? (integer ? "SumPostDiv" : "PreMulSum") : nullptr;
  if (!op) return {};
  std::vector<const char*> types;
  switch (t) { // NCCL runs a signed integer's sum and product with the unsigned type's kernel: both must be there
  case dtype::int8: case dtype::uint8: types = {"i8", "u8"}; break;
  case dtype::int32: case dtype::uint32: types = {"i32", "u32"}; break;
  case dtype::int64: case dtype::uint64: types = {"i64", "u64"}; break;
  case dtype::float16: types = {"f16"}; break;
  case dtype::bfloat16: types = {"bf16"}; break;
  case dtype::float32: types = {"f32"}; break;
  case dtype::float64: types = {"f64"}; break;
  default: return {};
  }
  std::vector<std::vector<std::string>> fns;
  for (const char* ty : types) fns.push_back({coll, op, ty});
  return fns;
}

void nccl_ok(ncclResult_t e, const char* what) {
  if (e != ncclSuccess) throw cuda_failure(std::string(what) + ": " + ncclGetErrorString(e));
}

class nccl_engine final : public engine {
public:
  explicit nccl_engine(const std::vector<int>& devices) : devices_(devices) {
    const int n = static_cast<int>(devices.size());
    int v = 0;
    ncclGetVersion(&v);
    std::vector<int> sorted(devices);
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() && v < 23000)
      // Seen on an H100 with NCCL 2.28.9: ncclCommInitAll answers only "invalid usage".
      throw cuda_failure("NCCL " + std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100) +
                         " puts at most one rank on a GPU; " + std::to_string(n) +
                         " ranks on fewer GPUs need NCCL 2.30 or later with NCCL_MULTI_RANK_GPU_ENABLE=1");
    comms_.resize(devices.size());
    nccl_ok(ncclCommInitAll(comms_.data(), n, devices.data()), "ncclCommInitAll");
    for (int d : devices) {
      ok(cudaSetDevice(d), "cudaSetDevice");
      cudaStream_t s = nullptr;
      ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      streams_.push_back(s);
    }
    std::printf("# NCCL %d.%d.%d\n", v / 10000, (v / 100) % 100, v % 100);
  }
  ~nccl_engine() override {
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }
  const char* name() const override { return "nccl"; }
  bool has(collective c, dtype t, op_kind k, algo a) const override {
    ncclDataType_t d;
    ncclRedOp_t o;
    if (a != algo::automatic || !type_of(t, d) || !op_of(k, o)) return false;
#ifdef BRAID_BENCH_NCCL_FUNCS_HEADER
    const std::string funcs = nccl_only_funcs;
#else
    const std::string funcs;
#endif
    const auto fns = nccl_functions(c, t, k);
    if (fns.empty()) return false;
    for (const auto& fn : fns)
      if (!nccl_built(funcs, fn)) return false;
    return true;
  }
  void launch(const std::vector<gt::call>& calls) override {
    nccl_ok(ncclGroupStart(), "ncclGroupStart");
    for (std::size_t r = 0; r < calls.size(); ++r) {
      const gt::call& c = calls[r];
      ncclDataType_t d{};
      ncclRedOp_t o{};
      type_of(c.type, d);
      op_of(c.op, o);
      ncclComm_t m = comms_[r];
      cudaStream_t s = streams_[r];
      switch (c.coll) {
      case collective::all_reduce: nccl_ok(ncclAllReduce(c.in, c.out, c.count, d, o, m, s), "ncclAllReduce"); break;
      case collective::all_gather: nccl_ok(ncclAllGather(c.in, c.out, c.count, d, m, s), "ncclAllGather"); break;
      case collective::reduce_scatter:
        nccl_ok(ncclReduceScatter(c.in, c.out, c.count, d, o, m, s), "ncclReduceScatter");
        break;
      case collective::broadcast: nccl_ok(ncclBroadcast(c.in, c.out, c.count, d, c.root, m, s), "ncclBroadcast"); break;
      case collective::reduce: nccl_ok(ncclReduce(c.in, c.out, c.count, d, o, c.root, m, s), "ncclReduce"); break;
      default: break;
      }
    }
    nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
  }
  void sync() override {
    for (cudaStream_t s : streams_) ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    for (ncclComm_t c : comms_) {
      ncclResult_t async = ncclSuccess;
      nccl_ok(ncclCommGetAsyncError(c, &async), "ncclCommGetAsyncError");
      nccl_ok(async, "NCCL asynchronous error");
    }
  }
  // One capture on rank 0's stream; every other rank's stream forks from it (an event) and joins it
  // again at the end, as a multi-stream capture must.
  double graph_us(const std::vector<gt::call>& calls, int n, int replays) override {
    const std::size_t R = streams_.size();
    std::vector<cudaEvent_t> ev(R, nullptr);
    auto free_events = [&] {
      for (std::size_t r = 0; r < R; ++r)
        if (ev[r]) {
          cudaSetDevice(devices_[r]);
          cudaEventDestroy(ev[r]);
        }
    };
    try {
      for (std::size_t r = 0; r < R; ++r) {
        ok(cudaSetDevice(devices_[r]), "cudaSetDevice");
        ok(cudaEventCreateWithFlags(&ev[r], cudaEventDisableTiming), "cudaEventCreate");
      }
      ok(cudaSetDevice(devices_[0]), "cudaSetDevice");
      ok(cudaStreamBeginCapture(streams_[0], cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      const double us = capture_and_time({streams_[0]}, {devices_[0]}, [&] {
        ok(cudaEventRecord(ev[0], streams_[0]), "cudaEventRecord (fork)");
        for (std::size_t r = 1; r < R; ++r) ok(cudaStreamWaitEvent(streams_[r], ev[0], 0), "cudaStreamWaitEvent (fork)");
        for (int i = 0; i < n; ++i) launch(calls);
        for (std::size_t r = 1; r < R; ++r) {
          ok(cudaSetDevice(devices_[r]), "cudaSetDevice");
          ok(cudaEventRecord(ev[r], streams_[r]), "cudaEventRecord (join)");
          ok(cudaSetDevice(devices_[0]), "cudaSetDevice");
          ok(cudaStreamWaitEvent(streams_[0], ev[r], 0), "cudaStreamWaitEvent (join)");
        }
      }, n, replays);
      free_events();
      return us;
    } catch (...) {
      free_events();
      throw;
    }
  }

private:
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;

  static bool type_of(dtype t, ncclDataType_t& d) {
    switch (t) {
    case dtype::int8: d = ncclInt8; return true;
    case dtype::uint8: d = ncclUint8; return true;
    case dtype::int32: d = ncclInt32; return true;
    case dtype::uint32: d = ncclUint32; return true;
    case dtype::int64: d = ncclInt64; return true;
    case dtype::uint64: d = ncclUint64; return true;
    case dtype::float16: d = ncclFloat16; return true;
    case dtype::bfloat16: d = ncclBfloat16; return true;
    case dtype::float32: d = ncclFloat32; return true;
    case dtype::float64: d = ncclFloat64; return true;
    default: return false; // 16-bit integers and fp8: not compared here
    }
  }
  static bool op_of(op_kind k, ncclRedOp_t& o) {
    switch (k) {
    case op_kind::sum: o = ncclSum; return true;
    case op_kind::prod: o = ncclProd; return true;
    case op_kind::min: o = ncclMin; return true;
    case op_kind::max: o = ncclMax; return true;
    case op_kind::avg: o = ncclAvg; return true;
    default: return false;
    }
  }
};
#endif

class cuda_runner {
public:
  cuda_runner(const config& cfg, engine& e, const std::vector<int>& devices)
      : cfg_(cfg), n_(static_cast<int>(devices.size())), devices_(devices), e_(e), out_(cfg, n_, e.name()) {
    if (gt::emulated()) out_.untimed(gt::device_kind());
  }

  int run() {
    out_.open_csv();
    out_.print_global_header();
    std::printf("# GPUs: ");
    for (int r = 0; r < n_; ++r) {
      cudaDeviceProp p{};
      ok(cudaGetDeviceProperties(&p, devices_[static_cast<std::size_t>(r)]), "cudaGetDeviceProperties");
      std::printf("%srank %d on %d (%s)", r ? ", " : "", r, devices_[static_cast<std::size_t>(r)], p.name);
    }
    std::printf("\n");
    const auto sizes = sizes_of(cfg_);
    for (collective c : cfg_.colls) {
      if (!has_algorithms(c)) {
        std::printf("#\n# %s: not implemented by the CUDA backend: skipped\n", std::string(coll_name(c)).c_str());
        continue;
      }
      for (algo a : algos_for(cfg_, c)) {
        out_.print_table_header(c, a);
        for (dtype t : cfg_.types) {
          const std::vector<op_kind> ops = has_reduction(c) ? cfg_.ops : std::vector<op_kind>{op_kind::sum};
          for (op_kind k : ops) {
            if (!e_.has(c, t, k, a)) {
              std::printf("# %s %s %s %s: not available with --backend %s: skipped\n", std::string(coll_name(c)).c_str(),
                          std::string(braid::name(a)).c_str(), std::string(braid::name(t)).c_str(),
                          std::string(braid::name(k)).c_str(), e_.name());
              continue;
            }
            for (std::uint64_t size : sizes)
              braid::visit(t, [&](auto tag) { row<typename decltype(tag)::type>(c, a, t, k, size); });
          }
        }
        out_.print_table_footer();
      }
    }
    return out_.print_summary();
  }

private:
  const config& cfg_;
  int n_;
  std::vector<int> devices_;
  engine& e_;
  table_printer out_;
  std::uint64_t salt_ = 0;


  template <class T> void row(collective c, algo a, dtype t, op_kind k, std::uint64_t size) {
    const std::uint64_t es = sizeof(T);
    const bool blocked = c == collective::all_gather || c == collective::reduce_scatter;
    const std::uint64_t count = blocked ? size / static_cast<std::uint64_t>(n_) / es : size / es;
    const std::uint64_t shown = blocked ? count * static_cast<std::uint64_t>(n_) * es : count * es;
    const half_result oop = half<T>(c, a, t, k, count, false, shown);
    const half_result ip = half<T>(c, a, t, k, count, true, shown);
    out_.print_row(c, a, braid::name(t), has_reduction(c) ? braid::name(k) : std::string_view("none"),
                   has_root(c) ? cfg_.root : -1, shown, count, oop, ip);
  }

  template <class T>
  half_result half(collective c, algo a, dtype t, op_kind k, std::uint64_t count, bool in_place, std::uint64_t shown) {
    const auto n = static_cast<std::uint64_t>(n_);
    const int root = cfg_.root;
    const std::uint64_t in_n = c == collective::reduce_scatter ? count * n : count;
    const std::uint64_t out_n = c == collective::all_gather ? count * n : count;
    const std::uint64_t buf_n = std::max(in_n, out_n);
    const bool copy = !has_reduction(c);
    const bool replicated = c == collective::all_reduce || c == collective::all_gather || c == collective::broadcast;

    std::vector<std::unique_ptr<device_buffer>> bin(static_cast<std::size_t>(n_)), bout(static_cast<std::size_t>(n_));
    std::vector<gt::call> calls(static_cast<std::size_t>(n_));
    std::vector<T*> ins(static_cast<std::size_t>(n_)), outs(static_cast<std::size_t>(n_));
    for (int r = 0; r < n_; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const int dev = devices_[ur];
      bout[ur] = std::make_unique<device_buffer>(dev, (in_place ? buf_n : out_n) * sizeof(T));
      T* buf = reinterpret_cast<T*>(bout[ur]->data());
      if (in_place) {
        ins[ur] = c == collective::all_gather ? buf + ur * count : buf;
        outs[ur] = c == collective::reduce_scatter ? buf + ur * count : buf;
      } else {
        bin[ur] = std::make_unique<device_buffer>(dev, in_n * sizeof(T));
        ins[ur] = reinterpret_cast<T*>(bin[ur]->data());
        outs[ur] = buf;
      }
      gt::call& cl = calls[ur];
      cl.coll = c;
      cl.algorithm = a;
      cl.type = t;
      cl.op = k;
      cl.in = ins[ur];
      cl.out = outs[ur];
      cl.count = count;
      cl.root = root;
    }

    pattern<T> pat(k, n_, ++salt_, copy);
    std::vector<T> host(in_n);
    auto fill_inputs = [&] {
      for (int r = 0; r < n_; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        ok(cudaSetDevice(devices_[ur]), "cudaSetDevice");
        bout[ur]->arm();
        if (bin[ur]) bin[ur]->arm();
        if (c == collective::broadcast && in_place && r != root) continue; // only the root's input is read
        for (std::uint64_t g = 0; g < in_n; ++g) host[g] = pat.gen(r, g);
        if (in_n) ok(cudaMemcpy(ins[ur], host.data(), in_n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
      }
      // cudaMemset and a cudaMemcpy from pageable memory may return before they land, on the legacy
      // stream, and the ranks' streams are non-blocking: wait for them before any kernel reads.
      for (int d : std::set<int>(devices_.begin(), devices_.end())) {
        ok(cudaSetDevice(d), "cudaSetDevice");
        ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      }
    };
    auto once = [&] { e_.launch(calls); };
    fill_inputs();

    double time_us = 0, enqueue_us = -1, graph = -1;
    if (cfg_.iters > 0) {
      for (int i = 0; i < cfg_.warmup; ++i) once();
      e_.sync();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < cfg_.iters; ++i) once();
      e_.sync();
      const auto t1 = std::chrono::steady_clock::now();
      time_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / cfg_.iters;
      if (cfg_.enqueue_time) {
        // A pass of its own, so the clock reads do not touch the time above: host time in the calls,
        // the GPU left to run behind them.
        double in_calls = 0;
        for (int i = 0; i < cfg_.iters; ++i) {
          const auto a0 = std::chrono::steady_clock::now();
          once();
          in_calls += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a0).count();
        }
        e_.sync();
        enqueue_us = in_calls / cfg_.iters;
      }
      if (cfg_.graph) graph = e_.graph_us(calls, cfg_.iters, 3);
    }

    std::int64_t wrong = 0;
    for (int rep = 0; rep < cfg_.check; ++rep) {
      pat = pattern<T>(k, n_, ++salt_, copy);
      fill_inputs();
      once();
      e_.sync();
      std::vector<std::byte> first; // rank 0's result where it is replicated
      for (int r = 0; r < n_; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        std::vector<std::byte> ob = bout[ur]->fetch(wrong);
        const std::ptrdiff_t out_at = outs[ur] - reinterpret_cast<T*>(bout[ur]->data());
        // Tests the checker: the last rank's first output byte flips (after the kernel, before the check).
        if (cfg_.inject_fault && r == n_ - 1 && count > 0) ob[static_cast<std::size_t>(out_at) * sizeof(T)] ^= std::byte{0x40};
        const T* buf0 = reinterpret_cast<const T*>(ob.data());
        const T* out = buf0 + out_at;
        wrong += wrong_in_output(pat, c, r, n_, root, in_place, buf0, out, count);
        if (!input_is_output(c, in_place, r, root)) {
          std::vector<std::byte> ib_storage;
          const T* in_host = nullptr;
          if (bin[ur]) {
            ib_storage = bin[ur]->fetch(wrong);
            in_host = reinterpret_cast<const T*>(ib_storage.data());
          } else {
            in_host = buf0 + (ins[ur] - reinterpret_cast<T*>(bout[ur]->data()));
          }
          wrong += wrong_bits(pat, in_host, in_n, r, 0);
        }
        if (replicated) {
          const std::size_t bytes = out_n * sizeof(T);
          if (r == 0) first.assign(ob.begin(), ob.begin() + static_cast<std::ptrdiff_t>(bytes));
          else if (std::memcmp(first.data(), ob.data(), bytes) != 0) ++wrong; // differs from rank 0's bits
        }
      }
    }
    half_result h = out_.finish(c, shown, time_us, wrong, cfg_.check > 0);
    h.enqueue_us = enqueue_us;
    h.graph_us = graph;
    return h;
  }
};

// --kernel: bandwidth counts every byte read and written (memcpy and copy: 2 x size; sum of two:
// 3 x size), so the ratio to cudaMemcpy says how close the loop comes to the memory system's limit.
int run_kernel_table(const config& cfg) {
  if (gt::emulated()) {
    std::fprintf(stderr, "braid-bench: --kernel times the reduce-copy loop, and this build runs on the %s, which has no "
                         "GPU timings\n", gt::device_kind());
    return exit_usage;
  }
  cudaDeviceProp p{};
  ok(cudaSetDevice(0), "cudaSetDevice");
  ok(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  const int iters = std::max(cfg.iters, 1);
  std::printf("# braid-bench --kernel: reduce-copy loop (cuda/device/reduce_copy.cuh) vs cudaMemcpyAsync on GPU 0 (%s, %d SMs),\n"
              "# %d timed launches after 3 warm-up, CUDA events; GB/s = (bytes read + written) / time / 1e9\n",
              p.name, p.multiProcessorCount, iters);
  std::printf("# %10s  %8s  %6s  %7s  %9s  %9s  %9s  %7s  %7s\n", "size (B)", "type", "blocks", "threads",
              "memcpy", "copy", "sum of 2", "copy/", "sum2/");
  std::printf("# %10s  %8s  %6s  %7s  %9s  %9s  %9s  %7s  %7s\n", "", "", "", "", "(GB/s)", "(GB/s)", "(GB/s)",
              "memcpy", "memcpy");
  // create_group's grid for one rank alone on a GPU (half the SMs, one block each), and the whole GPU
  const int grids[] = {std::max(1, p.multiProcessorCount / 2), 4 * p.multiProcessorCount};
  for (dtype t : cfg.types) {
    if (t != dtype::float32 && t != dtype::bfloat16) {
      std::printf("# %s: --kernel times float and bfloat16 only: skipped\n", std::string(braid::name(t)).c_str());
      continue;
    }
    for (std::uint64_t size : sizes_of(cfg)) {
      if (size < 1024) continue;
      for (int blocks : grids) {
        const double tm = gt::time_reduce_copy(t, 0, size, iters, 1, 32);
        const double tc = gt::time_reduce_copy(t, 1, size, iters, blocks, 512);
        const double ts = gt::time_reduce_copy(t, 2, size, iters, blocks, 512);
        const double bm = 2.0 * static_cast<double>(size) / tm / 1e9, bc = 2.0 * static_cast<double>(size) / tc / 1e9,
                     bs = 3.0 * static_cast<double>(size) / ts / 1e9;
        std::printf("%12" PRIu64 "  %8s  %6d  %7d  %9.1f  %9.1f  %9.1f  %7.2f  %7.2f\n", size,
                    std::string(braid::name(t)).c_str(), blocks, 512, bm, bc, bs, bc / bm, bs / bm);
      }
    }
  }
  return exit_ok;
}

} // namespace

int run_cuda_backend(const config& cfg, std::chrono::nanoseconds timeout, bool nccl) {
  int ndev = 0;
  const cudaError_t err = cudaGetDeviceCount(&ndev);
  if (err != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "braid-bench: --backend %s: no CUDA device (%s)\n", nccl ? "nccl" : "cuda",
                 err != cudaSuccess ? cudaGetErrorString(err) : "device count 0");
    return exit_usage;
  }
  std::vector<int> devices(static_cast<std::size_t>(cfg.nranks));
  for (int r = 0; r < cfg.nranks; ++r) devices[static_cast<std::size_t>(r)] = r % ndev;
  try {
    if (cfg.kernel) return run_kernel_table(cfg);
    std::unique_ptr<engine> e;
#ifdef BRAID_BENCH_NCCL
    if (nccl) e = std::make_unique<nccl_engine>(devices);
#endif
    if (!e) {
      if (nccl) {
        std::fprintf(stderr, "braid-bench: --backend nccl: NCCL was not found when this braid-bench was built\n");
        return exit_usage;
      }
      e = std::make_unique<braid_engine>(devices, timeout, cfg.cuda_threads, cfg.cuda_blocks, cfg.streams_order);
    }
    cuda_runner runner(cfg, *e, devices);
    return runner.run();
  } catch (const std::exception& ex) {
    std::fflush(stdout);
    std::fprintf(stderr, "braid-bench: error: %s\n", ex.what());
    return exit_error;
  }
}

#ifdef BRAID_BENCH_NCCL
// --backend nccl --procs N: one NCCL rank per forked process (the id travels over braid's host
// communicator), timed and checked like braid's --procs rows: w warmup calls, n calls enqueued back to
// back and the stream synchronised (NCCL calls do not block the host, braid's process calls do: the
// per-call time of NCCL is a pipelined one), max over ranks; the same r + 1 + i % 7 check.
struct nccl_rank {
  braid::communicator& host;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  nccl_rank(braid::communicator& h, int device) : host(h) {
    ok(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id{};
    if (h.rank() == 0) nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    h.broadcast(reinterpret_cast<std::uint8_t*>(&id), reinterpret_cast<std::uint8_t*>(&id), sizeof id, 0);
    nccl_ok(ncclCommInitRank(&comm, h.size(), id, h.rank()), "ncclCommInitRank");
    ok(cudaStreamCreate(&stream), "cudaStreamCreate"); // blocking: ordered after legacy-stream copies
  }
  nccl_rank(const nccl_rank&) = delete;
  nccl_rank& operator=(const nccl_rank&) = delete;
  ~nccl_rank() {
    if (stream) cudaStreamSynchronize(stream);
    if (comm) ncclCommDestroy(comm);
    if (stream) cudaStreamDestroy(stream);
  }
  void all_reduce(const float* in, float* out, std::size_t count) {
    nccl_ok(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, stream), "ncclAllReduce");
  }
  void sync() {
    ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    ncclResult_t async = ncclSuccess;
    nccl_ok(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError");
    nccl_ok(async, "NCCL asynchronous error");
  }
  double time(std::size_t count, int warmup, int iters, bool in_place) {
    device_buffer a(device_of(), count * sizeof(float)), b(device_of(), count * sizeof(float));
    float* in = reinterpret_cast<float*>(a.data());
    float* out = in_place ? in : reinterpret_cast<float*>(b.data());
    for (int i = 0; i < warmup; ++i) all_reduce(in, out, count);
    sync();
    host.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) all_reduce(in, out, count);
    sync();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(iters, 1);
  }
  std::int64_t check(std::size_t count, bool in_place) {
    const int n = host.size(), r = host.rank();
    std::vector<float> h(count);
    for (std::size_t i = 0; i < count; ++i) h[i] = braid::gpu_procs::check_input(r, i);
    device_buffer a(device_of(), count * sizeof(float)), b(device_of(), count * sizeof(float));
    float* in = reinterpret_cast<float*>(a.data());
    float* out = in_place ? in : reinterpret_cast<float*>(b.data());
    if (count) ok(cudaMemcpy(in, h.data(), count * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    all_reduce(in, out, count);
    sync();
    if (count) ok(cudaMemcpy(h.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += h[i] != braid::gpu_procs::check_sum(n, i);
    return wrong;
  }
  static int device_of() {
    int d = 0;
    ok(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
};
#endif

int run_cuda_procs(const config& cfg, std::chrono::nanoseconds timeout, bool nccl) {
  namespace gp = braid::gpu_procs;
  const int n = cfg.nranks;
  // Fork first: the parent must not initialise CUDA.
  const std::vector<int> st = braid::fork_ranks(
      n,
      [&](int r, const braid::unique_id& id) {
        const int ndev = gp::device_count();
        if (ndev == 0) {
          if (r == 0) std::fprintf(stderr, "braid-bench: --backend %s --procs: no CUDA device\n", nccl ? "nccl" : "cuda");
          return exit_usage;
        }
        braid::options o = braid::options::from_env();
        o.timeout = timeout;
        braid::communicator host = braid::communicator::join(id, r, n, o);
        // One of the two libraries, behind three operations.
        std::shared_ptr<gp::comm> c;
        std::function<double(std::uint64_t, bool)> time_one;
        std::function<std::int64_t(std::uint64_t, bool)> check_one;
        std::function<double(double)> max_all;
        std::function<std::int64_t(std::int64_t)> sum_all;
        std::string what;
#ifdef BRAID_BENCH_NCCL
        std::unique_ptr<nccl_rank> nr;
        int nccl_version = 0;
        if (nccl) ncclGetVersion(&nccl_version);
        if (nccl && n > ndev && nccl_version < 23000) {
          if (r == 0)
            std::fprintf(stderr, "braid-bench: --backend nccl --procs %d: only %d GPU(s), and NCCL %d.%d.%d puts at most one rank "
                                 "on a GPU (2.30 or later with NCCL_MULTI_RANK_GPU_ENABLE=1 takes several)\n", n, ndev,
                         nccl_version / 10000, (nccl_version / 100) % 100, nccl_version % 100);
          return exit_usage;
        }
        if (nccl && n > ndev && !std::getenv("NCCL_MULTI_RANK_GPU_ENABLE")) {
          if (r == 0)
            std::fprintf(stderr, "braid-bench: --backend nccl --procs %d: only %d GPU(s); NCCL takes several ranks per GPU "
                                 "only with NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL 2.30 or later)\n", n, ndev);
          return exit_usage;
        }
        if (nccl) {
          nr = std::make_unique<nccl_rank>(host, r % ndev);
          int v = 0;
          ncclGetVersion(&v);
          what = "NCCL " + std::to_string(v);
          time_one = [&](std::uint64_t k, bool ip) { return nr->time(k, cfg.warmup, cfg.iters, ip); };
          check_one = [&](std::uint64_t k, bool ip) { return nr->check(k, ip); };
        }
#endif
        if (nccl && !time_one) {
          if (r == 0) std::fprintf(stderr, "braid-bench: --backend nccl: NCCL was not found when this braid-bench was built\n");
          return exit_usage;
        }
        if (!nccl) {
          gp::comm_options co;
          co.timeout = timeout;
          c = gp::connect(std::move(host), r % ndev, co);
          what = "braid process_communicator, " + gp::describe(*c) + ", staging " + std::to_string(gp::memory_bytes(*c)) +
                 " bytes of device memory per rank";
          time_one = [&](std::uint64_t k, bool ip) { return gp::time_all_reduce(*c, k, cfg.warmup, cfg.iters, ip); };
          check_one = [&](std::uint64_t k, bool ip) { return gp::check_all_reduce(*c, k, ip); };
          max_all = [&](double v) { return gp::max_over_ranks(*c, v); };
          sum_all = [&](std::int64_t v) { return gp::sum_over_ranks(*c, v); };
        } else {
          max_all = [&](double v) {
            double m = 0;
            host.all_reduce(&v, &m, 1, braid::max<>{});
            return m;
          };
          sum_all = [&](std::int64_t v) {
            std::int64_t m = 0;
            host.all_reduce(&v, &m, 1, braid::sum<>{});
            return m;
          };
        }
        std::unique_ptr<table_printer> out;
        if (r == 0) {
          out = std::make_unique<table_printer>(cfg, n, nccl ? "nccl-procs" : "cuda-procs");
          if (gt::emulated()) out->untimed(gt::device_kind());
          out->open_csv();
          out->print_global_header();
          std::printf("# ranks are processes, rank r on GPU r %% %d; %s\n", ndev, what.c_str());
          out->print_table_header(collective::all_reduce, algo::automatic);
        }
        for (std::uint64_t size : sizes_of(cfg)) {
          const std::uint64_t count = size / sizeof(float);
          half_result halves[2];
          for (int ip = 0; ip < 2; ++ip) {
            const double t = max_all(time_one(count, ip == 1));
            std::int64_t wrong = 0;
            for (int k = 0; k < cfg.check; ++k) wrong += check_one(count, ip == 1);
            wrong = sum_all(wrong);
            if (out) halves[ip] = out->finish(collective::all_reduce, count * sizeof(float), t * 1e6, wrong, cfg.check > 0);
          }
          if (out)
            out->print_row(collective::all_reduce, algo::automatic, "float", "sum", -1, count * sizeof(float), count, halves[0],
                           halves[1]);
        }
        if (!out) return exit_ok;
        out->print_table_footer();
        return out->print_summary();
      },
      std::chrono::seconds(7 * 24 * 3600));
  int worst = exit_ok;
  for (std::size_t q = 0; q < st.size(); ++q) {
    if (st[q] == exit_ok || st[q] == exit_usage || (q == 0 && st[q] == exit_wrong)) {
      worst = std::max(worst, st[q]);
      continue;
    }
    std::fprintf(stderr, "braid-bench: rank %zu exited with status %d\n", q, st[q]);
    worst = std::max(worst, exit_error);
  }
  return worst;
}

} // namespace braid_bench
