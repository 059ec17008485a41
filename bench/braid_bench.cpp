// bench/braid_bench.cpp — braid-bench: one binary for every collective, printing nccl-tests' table.
//
//   braid-bench [collective|all] [flags]          (braid-bench --help for the flags)
//
// The method (timing, checking, output) is described in bench/bench.hpp; this file holds the command
// line and starts the ranks (threads, or processes through braid::fork_ranks).
#include "bench.hpp"

#include <braid/launch/fork.hpp>

#include <iterator>
#include <utility>

#include <sched.h>

namespace {

using namespace braid_bench;

// --bind: rank r of a procs run on the r-th CPU this process may use (mpirun binds its ranks to cores
// by default when there are at most 2; unbound, two ranks can share one CPU for a while and hand it to
// each other at every step). auto: only when every rank can have a CPU of its own.
void bind_rank(const config& cfg, int rank) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (cfg.bind == 0 || ::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  const int cpus = CPU_COUNT(&allowed);
  if (cfg.bind < 0 && cfg.nranks > cpus) return;
  for (int c = 0, seen = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (seen++ != rank % cpus) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    ::sched_setaffinity(0, sizeof one, &one);
    return;
  }
}

void print_help(const char* argv0) {
  std::printf(
      "Usage: %s [collective|all] [flags]\n"
      "\n"
      "Times braid's collectives and checks their results; prints nccl-tests' table.\n"
      "\n"
      "Collective (positional, or -C/--collective NAME; a comma list; default all_reduce):\n"
      "  all_reduce all_gather reduce_scatter broadcast reduce sendrecv barrier, or all\n"
      "\n"
      "Flags (lists are comma separated):\n"
      "  -b, --minbytes N      smallest size in bytes, K/M/G suffixes (1024-based)   [8]\n"
      "  -e, --maxbytes N      largest size in bytes                                [1M]\n"
      "  -f, --stepfactor N    multiply the size by N each step                     [2]\n"
      "  -i, --stepbytes N     add N bytes each step instead (when given)\n"
      "  -n, --iters N         timed calls per size; 0 = no timing, checks only     [20]\n"
      "  -w, --warmup_iters N  untimed calls before each size                       [5]\n"
      "  -c, --check N         N rounds of result checks after timing, 0 = none     [1]\n"
      "  -d, --datatype T      int8 uint8 int16 uint16 int32 uint32 int64 uint64 half float\n"
      "                        double bfloat16 f8e4m3 f8e5m2, or all                 [float]\n"
      "  -o, --op OP           sum prod min max avg, or all                         [sum]\n"
      "  -r, --root R          root of broadcast and reduce                         [0]\n"
      "  -a, --algo A          auto ring tree one_shot two_shot halving_doubling direct,\n"
      "                        or all (= every algorithm the collective implements)  [auto]\n"
      "  -np, --nranks N       ranks                                                [2]\n"
      "      --backend B       threads (= host: ranks are threads of this process),\n"
      "                        procs (ranks are forked processes over shared memory), or\n"
      "                        cuda (ranks are GPUs driven by this process, rank r on\n"
      "                        GPU r %% device count; builds with CUDA only), or\n"
      "                        nccl (NCCL in the same harness; builds that found NCCL) [threads]\n"
      "  -T, --timeout S       deadline of every wait in seconds   [BRAID_TIMEOUT or 300]\n"
      "      --bind B          with --backend procs: core (rank r on the r-th CPU this process\n"
      "                        may use), none, or auto (core when ranks <= CPUs: what mpirun\n"
      "                        does by default for 2 ranks)                           [auto]\n"
      "      --zero-copy-min N with --backend threads: options::zero_copy_min_bytes, the size\n"
      "                        from which peers read an out-of-place input in place [16K]\n"
      "      --csv FILE        also write the rows as CSV\n"
      "      --procs N         with --backend cuda or nccl: N ranks as N forked processes\n"
      "                        (braid::cuda::process_communicator over CUDA IPC, or NCCL ranks);\n"
      "                        all_reduce of float with sum only\n"
      "      --blocks N        with --backend cuda: at most N blocks per rank (group_options::\n"
      "                        max_blocks_per_rank; default: half the SMs shared by the GPU's ranks)\n"
      "      --threads N       with --backend cuda: threads per block, 32..512 [512]\n"
      "      --order O         with --backend cuda: who orders a rank's calls, braid or streams\n"
      "                        (group_options::order; streams: a call is its launch) [braid]\n"
      "      --enqueue-time    with --backend cuda or nccl: also the host's time from a call to its return\n"
      "                        (every rank's part of it), per call, beside the time per call\n"
      "      --graph           with --backend cuda or nccl: also n calls captured once in CUDA\n"
      "                        graphs (one per GPU; NCCL: one), replayed 3 times: time per call\n"
      "      --kernel          with --backend cuda: time the reduce-copy loop of the kernels\n"
      "                        alone (copy, sum of 2) against cudaMemcpy, sizes -b..-e\n"
      "      --inject-fault    test the checker: the last rank flips one bit of its result\n"
      "                        before the check (every checked row must then show #wrong > 0)\n"
      "  -h, --help\n"
      "\n"
      "Timing: per size, w warmup calls, a barrier, then n calls; time is the mean per call on\n"
      "each rank in microseconds and the table shows the maximum over ranks. algbw = size/time with\n"
      "GB = 1e9 bytes; busbw = algbw * {all_reduce 2(n-1)/n; all_gather, reduce_scatter (n-1)/n;\n"
      "broadcast, reduce, sendrecv 1}. all_gather/reduce_scatter: size is the whole n-block buffer\n"
      "and count is one rank's block (size/n/sizeof(T)), as in nccl-tests. sendrecv sends to rank+1\n"
      "and receives from rank-1; it has no in-place form (N/A). barrier prints one row of size 0.\n"
      "\n"
      "Check: exact for integers, min, max and for sum/prod on floating types (the patterns are small\n"
      "integers whose partial results are exact in every type, fp8 included); avg on floating types\n"
      "allows one ulp of the element type (the final division rounds). Also counted as wrong: changed\n"
      "out-of-place inputs, written guard bytes, written non-root reduce outputs, and outputs that\n"
      "differ from rank 0's bits where every rank must hold the same result.\n"
      "\n"
      "Exit status: 0 ok; 1 some #wrong > 0; 2 bad command line or backend not built; 3 braid error.\n"
      "Correctness sweep (as CTest runs it, label bench-check):\n"
      "  %s all -d all -o all -a all -c 1 -n 0 -b 0 -e 16807 -f 7 -np 8 --backend procs\n",
      argv0, argv0);
}

bool parse_u64(std::string_view s, std::uint64_t& out) {
  if (s.empty()) return false;
  std::uint64_t v = 0;
  std::size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) v = v * 10 + static_cast<std::uint64_t>(s[i] - '0');
  if (i == 0) return false;
  std::string_view unit = s.substr(i);
  if (unit == "K" || unit == "k" || unit == "KB" || unit == "KiB") v <<= 10;
  else if (unit == "M" || unit == "m" || unit == "MB" || unit == "MiB") v <<= 20;
  else if (unit == "G" || unit == "g" || unit == "GB" || unit == "GiB") v <<= 30;
  else if (!unit.empty()) return false;
  out = v;
  return true;
}

bool parse_int(std::string_view s, int& out) {
  std::uint64_t v = 0;
  bool neg = !s.empty() && s[0] == '-';
  if (neg) s.remove_prefix(1);
  for (char ch : s)
    if (ch < '0' || ch > '9') return false;
  if (!parse_u64(s, v) || v > 1u << 30) return false;
  out = neg ? -static_cast<int>(v) : static_cast<int>(v);
  return true;
}

// Appends the items of the comma-separated list `s` to `out`, each read by `parse`; false at the
// first item `parse` refuses.
template <class T, class Parse> bool parse_list(std::string_view s, std::vector<T>& out, Parse parse) {
  while (true) {
    const std::size_t comma = s.find(',');
    T item{};
    if (!parse(s.substr(0, comma), item)) return false;
    out.push_back(item);
    if (comma == std::string_view::npos) return true;
    s.remove_prefix(comma + 1);
  }
}

// The flags that take no value, and the switch each turns on.
constexpr std::pair<std::string_view, bool config::*> switch_flags[] = {
    {"--inject-fault", &config::inject_fault},
    {"--enqueue-time", &config::enqueue_time},
    {"--graph", &config::graph},
    {"--kernel", &config::kernel},
};

// Returns exit_ok when `cfg` is ready, otherwise the exit status (help: -1 → exit 0 after printing).
int parse_args(int argc, char** argv, config& cfg) {
  auto bad = [&](const std::string& msg) {
    std::fprintf(stderr, "braid-bench: %s (see --help)\n", msg.c_str());
    return exit_usage;
  };
  bool coll_given = false;
  auto set_coll = [&](std::string_view v) -> bool {
    coll_given = true;
    if (v == "all") {
      cfg.colls.assign(std::begin(bench_collectives), std::end(bench_collectives));
      return true;
    }
    cfg.colls.clear();
    return parse_list(v, cfg.colls, parse_coll);
  };
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    std::string_view val;
    bool has_val = false;
    if (a.size() > 2 && a[0] == '-' && a.find('=') != std::string_view::npos) {
      val = a.substr(a.find('=') + 1);
      a = a.substr(0, a.find('='));
      has_val = true;
    }
    auto need = [&](std::string_view& v) -> bool {
      if (has_val) { v = val; return true; }
      if (i + 1 >= argc) return false;
      v = argv[++i];
      return true;
    };
    const auto sw = std::find_if(std::begin(switch_flags), std::end(switch_flags), [&](const auto& f) { return f.first == a; });
    if (sw != std::end(switch_flags)) {
      cfg.*(sw->second) = true;
      continue;
    }
    if (a == "-h" || a == "--help") {
      print_help(argv[0]);
      return -1;
    }
    if (!a.empty() && a[0] != '-') {
      if (coll_given) return bad("more than one collective given: '" + std::string(a) + "'");
      if (!set_coll(a)) return bad("unknown collective '" + std::string(a) + "'");
      continue;
    }
    std::string_view v;
    if (!need(v)) return bad("flag " + std::string(a) + " needs a value");
    const std::string vs(v);
    if (a == "-C" || a == "--collective") {
      if (!set_coll(v)) return bad("unknown collective '" + vs + "'");
    } else if (a == "-b" || a == "--minbytes") {
      if (!parse_u64(v, cfg.min_bytes)) return bad("bad size for -b: '" + vs + "'");
    } else if (a == "-e" || a == "--maxbytes") {
      if (!parse_u64(v, cfg.max_bytes)) return bad("bad size for -e: '" + vs + "'");
    } else if (a == "-f" || a == "--stepfactor") {
      if (!parse_u64(v, cfg.factor) || cfg.factor < 1) return bad("bad factor for -f: '" + vs + "'");
    } else if (a == "-i" || a == "--stepbytes") {
      if (!parse_u64(v, cfg.step_bytes)) return bad("bad step for -i: '" + vs + "'");
    } else if (a == "-n" || a == "--iters") {
      if (!parse_int(v, cfg.iters) || cfg.iters < 0) return bad("bad -n: '" + vs + "'");
    } else if (a == "-w" || a == "--warmup_iters") {
      if (!parse_int(v, cfg.warmup) || cfg.warmup < 0) return bad("bad -w: '" + vs + "'");
    } else if (a == "-c" || a == "--check") {
      if (!parse_int(v, cfg.check) || cfg.check < 0) return bad("bad -c: '" + vs + "'");
    } else if (a == "-r" || a == "--root") {
      if (!parse_int(v, cfg.root)) return bad("bad -r: '" + vs + "'");
    } else if (a == "-np" || a == "--np" || a == "--nranks" || a == "-g") {
      if (!parse_int(v, cfg.nranks) || cfg.nranks < 1 || cfg.nranks > static_cast<int>(braid::wire::max_ranks))
        return bad("bad rank count: '" + vs + "'");
    } else if (a == "-T" || a == "--timeout") {
      char* end = nullptr;
      cfg.timeout_s = std::strtod(vs.c_str(), &end);
      if (!end || *end || !(cfg.timeout_s > 0)) return bad("bad -T: '" + vs + "'");
    } else if (a == "-d" || a == "--datatype") {
      cfg.types.clear();
      if (v == "all") {
        cfg.types.assign(std::begin(braid::all_dtypes), std::end(braid::all_dtypes));
      } else if (!parse_list(v, cfg.types, braid::parse_dtype)) {
        return bad("unknown datatype in '" + vs + "'");
      }
    } else if (a == "-o" || a == "--op") {
      cfg.ops.clear();
      if (v == "all") {
        cfg.ops = {op_kind::sum, op_kind::prod, op_kind::min, op_kind::max, op_kind::avg};
      } else if (!parse_list(v, cfg.ops, braid::parse_op)) {
        return bad("unknown op in '" + vs + "'");
      }
    } else if (a == "-a" || a == "--algo" || a == "--algorithm") {
      cfg.algos.clear();
      cfg.algos_all = v == "all";
      if (!cfg.algos_all && !parse_list(v, cfg.algos, braid::parse_algo))
        return bad("unknown algorithm in '" + vs + "'");
    } else if (a == "--backend") {
      if (v == "threads" || v == "host" || v == "thread") cfg.backend = backend_kind::threads;
      else if (v == "procs" || v == "processes" || v == "process") cfg.backend = backend_kind::procs;
      else if (v == "cuda" || v == "nccl") {
#ifdef BRAID_BENCH_CUDA
        cfg.backend = v == "nccl" ? backend_kind::nccl : backend_kind::cuda;
#else
        std::fprintf(stderr, "braid-bench: CUDA backend not built (this braid-bench has the host backends "
                             "only: --backend threads or procs)\n");
        return exit_usage;
#endif
      } else {
        return bad("unknown backend '" + vs + "' (threads, procs, cuda, nccl)");
      }
    } else if (a == "--bind") {
      if (v == "core") cfg.bind = 1;
      else if (v == "none") cfg.bind = 0;
      else if (v == "auto") cfg.bind = -1;
      else return bad("--bind needs core, none or auto");
    } else if (a == "--order") {
      if (v != "braid" && v != "streams") return bad("--order needs braid or streams");
      cfg.streams_order = v == "streams";
    } else if (a == "--blocks") {
      if (!parse_int(v, cfg.cuda_blocks) || cfg.cuda_blocks < 1 || cfg.cuda_blocks > 1024) return bad("--blocks needs 1..1024");
    } else if (a == "--threads") {
      if (!parse_int(v, cfg.cuda_threads) || cfg.cuda_threads < 32 || cfg.cuda_threads > 512 || cfg.cuda_threads % 32)
        return bad("--threads needs a multiple of 32 from 32 to 512");
    } else if (a == "--procs") {
      if (!parse_int(v, cfg.nranks) || cfg.nranks < 1 || cfg.nranks > 64) return bad("--procs needs 1..64");
      cfg.cuda_procs = true;
    } else if (a == "--zero-copy-min") {
      std::uint64_t z = 0;
      if (!parse_u64(v, z) || z > (std::uint64_t{1} << 40)) return bad("bad size for --zero-copy-min: '" + vs + "'");
      cfg.zero_copy_min = static_cast<std::int64_t>(z);
    } else if (a == "--csv") {
      cfg.csv = vs;
    } else {
      return bad("unknown flag '" + std::string(a) + "'");
    }
  }
  if (cfg.colls.empty()) cfg.colls = {collective::all_reduce};
  if (cfg.kernel && cfg.backend != backend_kind::cuda) return bad("--kernel needs --backend cuda");
  if (cfg.enqueue_time && ((cfg.backend != backend_kind::cuda && cfg.backend != backend_kind::nccl) || cfg.cuda_procs || cfg.kernel))
    return bad("--enqueue-time times the one-process CUDA harness: --backend cuda or nccl, without --procs or --kernel");
  if (cfg.graph && ((cfg.backend != backend_kind::cuda && cfg.backend != backend_kind::nccl) || cfg.cuda_procs || cfg.kernel))
    return bad("--graph captures the one-process CUDA harness: --backend cuda or nccl, without --procs or --kernel");
  if ((cfg.cuda_blocks || cfg.cuda_threads || cfg.streams_order) && (cfg.backend != backend_kind::cuda || cfg.cuda_procs || cfg.kernel))
    return bad("--blocks, --threads and --order shape the one-process CUDA group: --backend cuda without --procs or --kernel");
  if (cfg.cuda_procs && cfg.backend != backend_kind::cuda && cfg.backend != backend_kind::nccl)
    return bad("--procs needs --backend cuda or nccl");
  if (cfg.cuda_procs && (cfg.colls != std::vector<collective>{collective::all_reduce} ||
                         cfg.types != std::vector<dtype>{dtype::float32} || cfg.ops != std::vector<op_kind>{op_kind::sum}))
    return bad("--procs measures all_reduce of float with sum only");
  if (cfg.min_bytes > cfg.max_bytes) return bad("-b is larger than -e");
  if (cfg.root < 0 || cfg.root >= cfg.nranks) return bad("root " + std::to_string(cfg.root) + " out of range for " +
                                                         std::to_string(cfg.nranks) + " ranks");
  // An algorithm that no requested collective implements is a mistake, not something to skip.
  if (!cfg.algos_all)
    for (algo al : cfg.algos) {
      bool any = al == algo::automatic;
      for (collective c : cfg.colls) any = any || !has_algorithms(c) || braid::supports(al, c);
      if (!any)
        return bad("algorithm " + std::string(braid::name(al)) + " implements none of the requested collectives");
    }
  return exit_ok;
}

} // namespace


int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  config cfg;
  const int parsed = parse_args(argc, argv, cfg);
  if (parsed == -1) return exit_ok;
  if (parsed != exit_ok) return parsed;

  braid::options opts;
  try {
    opts = braid::options::from_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-bench: %s\n", e.what());
    return exit_usage;
  }
  if (cfg.timeout_s > 0) opts.timeout = std::chrono::nanoseconds(static_cast<std::int64_t>(cfg.timeout_s * 1e9));
  if (cfg.zero_copy_min >= 0) opts.zero_copy_min_bytes = static_cast<std::size_t>(cfg.zero_copy_min);

  if (cfg.backend == backend_kind::cuda || cfg.backend == backend_kind::nccl) {
#ifdef BRAID_BENCH_CUDA
    if (cfg.cuda_procs) return run_cuda_procs(cfg, opts.timeout, cfg.backend == backend_kind::nccl);
    return run_cuda_backend(cfg, opts.timeout, cfg.backend == backend_kind::nccl);
#endif
  }
  board bd(cfg.nranks);
  if (cfg.backend == backend_kind::threads) {
    std::atomic<int> status{exit_ok};
    try {
      braid::run_threads(
          cfg.nranks,
          [&](braid::communicator& comm) {
            try {
              rank_runner rr(comm, cfg, bd, opts.timeout);
              const int s = rr.run();
              if (comm.rank() == 0) status.store(s);
            } catch (const harness_failure&) {
              // another rank failed first; its error is the one to report
            } catch (...) {
              bd.fail();
              throw;
            }
          },
          opts);
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "braid-bench: error: %s\n", e.what());
      return exit_error;
    }
    return status.load();
  }

  const std::vector<int> st = braid::fork_ranks(
      cfg.nranks,
      [&](int rank, const braid::unique_id& id) {
        bind_rank(cfg, rank);
        try {
          braid::communicator comm = braid::communicator::join(id, rank, cfg.nranks, opts);
          rank_runner rr(comm, cfg, bd, opts.timeout);
          return rr.run();
        } catch (const harness_failure&) {
          return exit_harness; // another rank failed first and reports why
        } catch (...) {
          bd.fail();
          throw; // fork_ranks prints it
        }
      },
      std::chrono::seconds(7 * 24 * 3600));
  int worst = exit_ok;
  for (std::size_t q = 0; q < st.size(); ++q) {
    if (st[q] == exit_ok) continue;
    if (st[q] == exit_wrong && q == 0) {
      worst = std::max(worst, exit_wrong);
      continue;
    }
    if (st[q] == exit_harness) {
      worst = exit_error;
      continue;
    }
    std::fprintf(stderr, "braid-bench: rank %zu exited with status %d\n", q, st[q]);
    worst = exit_error;
  }
  return worst;
}

