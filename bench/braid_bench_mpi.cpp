// bench/braid_bench_mpi.cpp — braid-bench-mpi: braid's hierarchical collectives (braid::mpi) beside
// the plain MPI collective on the same sizes, in one run, in nccl-tests' columns.
//
//   mpirun -np N braid-bench-mpi [all_reduce|all_gather|reduce_scatter|broadcast|all]
//                                [-d float|double|int32] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]
//
// Method, per collective and size, for braid::mpi then for MPI: w warmup calls, MPI_Barrier, n timed
// calls (out-of-place); time = wall time / n in microseconds on each rank, the maximum over ranks is
// reported. algbw = size / time (GB = 1e9 bytes), busbw = algbw * nccl-tests' factor (all_reduce
// 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1); size and count follow nccl-tests
// (all_gather and reduce_scatter: size is the n-block buffer, count the per-rank block). The MPI
// baseline is MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block or MPI_Bcast on MPI_COMM_WORLD.
// #wrong: after the timed calls, one more call of each on small-integer inputs (exact in every type),
// output elements that differ from the reference, summed over ranks. Root 0 for broadcast.
// Sizes take K/M/G suffixes (1024-based); defaults -b 8 -e 16M -f 4 -n 20 -w 5.
// Exit status: 0, 1 when some #wrong > 0, 2 bad command line, 3 a braid error.
#include <braid/mpi.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "parse_size.hpp"

namespace {

int rank = 0, nranks = 1;

double bus_factor(braid::collective c) {
  if (c == braid::collective::all_reduce) return 2.0 * (nranks - 1) / nranks;
  if (c == braid::collective::broadcast) return 1.0;
  return static_cast<double>(nranks - 1) / nranks;
}

// Small integers: every partial sum of up to 2^16 ranks is exact.
int pattern(int q, std::uint64_t i) { return static_cast<int>((static_cast<std::uint64_t>(q) * 7 + i) % 13); }

template <class T> MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else return MPI_INT32_T;
}

struct result {
  double time_us = 0;
  long long wrong = 0;
};

template <class F> double timed(F&& f, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) f();
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) f();
  const double mine = (MPI_Wtime() - t0) / iters * 1e6;
  double worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

// One collective at one size: `count` as nccl-tests reports it. Returns {braid, mpi}.
template <class T>
std::pair<result, result> measure(braid::mpi::communicator& comm, braid::collective c, std::size_t count, int iters, int warmup) {
  const std::size_t N = static_cast<std::size_t>(nranks);
  const std::size_t in_n = c == braid::collective::reduce_scatter ? count * N : count;
  const std::size_t out_n = c == braid::collective::all_gather ? count * N : count;
  std::vector<T> in(std::max<std::size_t>(in_n, 1)), out(std::max<std::size_t>(out_n, 1));
  for (std::size_t i = 0; i < in_n; ++i) {
    const std::uint64_t g = c == braid::collective::all_gather ? static_cast<std::uint64_t>(rank) * count + i : i;
    in[i] = static_cast<T>(pattern(c == braid::collective::broadcast ? 0 : rank, g));
  }
  const MPI_Datatype t = mpi_type<T>();
  const int ci = static_cast<int>(count);
  auto run_braid = [&] {
    switch (c) {
    case braid::collective::all_reduce: comm.all_reduce(in.data(), out.data(), count); break;
    case braid::collective::all_gather: comm.all_gather(in.data(), out.data(), count); break;
    case braid::collective::reduce_scatter: comm.reduce_scatter(in.data(), out.data(), count); break;
    default: comm.broadcast(in.data(), out.data(), count, 0); break;
    }
  };
  auto run_mpi = [&] {
    switch (c) {
    case braid::collective::all_reduce: MPI_Allreduce(in.data(), out.data(), ci, t, MPI_SUM, MPI_COMM_WORLD); break;
    case braid::collective::all_gather: MPI_Allgather(in.data(), ci, t, out.data(), ci, t, MPI_COMM_WORLD); break;
    case braid::collective::reduce_scatter: MPI_Reduce_scatter_block(in.data(), out.data(), ci, t, MPI_SUM, MPI_COMM_WORLD); break;
    default:
      if (rank == 0) std::memcpy(out.data(), in.data(), count * sizeof(T));
      MPI_Bcast(out.data(), ci, t, 0, MPI_COMM_WORLD);
      break;
    }
  };
  auto check = [&](auto&& f) {
    std::fill(out.begin(), out.end(), static_cast<T>(-1));
    f();
    long long wrong = 0, total = 0;
    for (std::size_t i = 0; i < out_n; ++i) {
      long long want = 0;
      if (c == braid::collective::all_gather) want = pattern(static_cast<int>(i / count), i);
      else if (c == braid::collective::broadcast) want = pattern(0, i);
      else {
        const std::uint64_t g = c == braid::collective::reduce_scatter ? static_cast<std::uint64_t>(rank) * count + i : i;
        for (int q = 0; q < nranks; ++q) want += pattern(q, g);
      }
      wrong += out[i] != static_cast<T>(want);
    }
    MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    return total;
  };
  result b, m;
  b.time_us = timed(run_braid, iters, warmup);
  b.wrong = check(run_braid);
  m.time_us = timed(run_mpi, iters, warmup);
  m.wrong = check(run_mpi);
  return {b, m};
}

template <class T>
long long table(braid::mpi::communicator& comm, braid::collective c, std::uint64_t min_b, std::uint64_t max_b, std::uint64_t factor,
                int iters, int warmup) {
  const std::size_t N = static_cast<std::size_t>(nranks);
  const bool blocked = c == braid::collective::all_gather || c == braid::collective::reduce_scatter;
  if (rank == 0) {
    std::printf("#\n# %s: braid::mpi (hierarchical, %d hosts%s) vs MPI (%s), out-of-place\n", std::string(braid::name(c)).c_str(),
                comm.hosts(), comm.uniform() ? "" : ", uneven", c == braid::collective::all_reduce ? "MPI_Allreduce"
                : c == braid::collective::all_gather ? "MPI_Allgather" : c == braid::collective::reduce_scatter ? "MPI_Reduce_scatter_block" : "MPI_Bcast");
    std::printf("# %10s %12s %8s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "", "", "", "", "", "braid::mpi", "", "", "",
                "MPI", "", "", "");
    std::printf("# %10s %12s %8s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "size", "count", "type", "redop", "root", "time",
                "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::printf("# %10s %12s %8s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
                "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  long long wrong = 0;
  for (std::uint64_t bytes = min_b; bytes <= max_b;) {
    const std::size_t count = blocked ? bytes / sizeof(T) / N : bytes / sizeof(T);
    const auto [b, m] = measure<T>(comm, c, count, iters, warmup);
    wrong += b.wrong + m.wrong;
    if (rank == 0) {
      const double size = static_cast<double>(count * sizeof(T) * (blocked ? N : 1));
      auto bw = [&](double us) { return us > 0 ? size / 1e9 / (us * 1e-6) : 0.0; };
      const bool reduces = c == braid::collective::all_reduce || c == braid::collective::reduce_scatter;
      std::printf("  %10.0f %12zu %8s %6s %5s   %9.2f %7.3f %7.3f %6lld   %9.2f %7.3f %7.3f %6lld\n", size, count,
                  std::string(braid::name(braid::dtype_of_v<T>)).c_str(), reduces ? "sum" : "none",
                  c == braid::collective::broadcast ? "0" : "-1", b.time_us, bw(b.time_us), bw(b.time_us) * bus_factor(c), b.wrong,
                  m.time_us, bw(m.time_us), bw(m.time_us) * bus_factor(c), m.wrong);
      std::fflush(stdout);
    }
    const std::uint64_t next = bytes ? bytes * factor : 1;
    if (next <= bytes) break;
    bytes = next;
  }
  return wrong;
}

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  std::uint64_t min_b = 8, max_b = 16ull << 20, factor = 4;
  int iters = 20, warmup = 5;
  std::string type = "float";
  std::vector<braid::collective> colls;
  bool ok = true;
  for (int i = 1; i < argc && ok; ++i) {
    const std::string a = argv[i];
    const bool next = i + 1 < argc;
    braid::collective c = braid::collective::all_reduce;
    if (a == "all") colls = {braid::collective::all_reduce, braid::collective::all_gather, braid::collective::reduce_scatter, braid::collective::broadcast};
    else if (a == "all_reduce" || a == "all_gather" || a == "reduce_scatter" || a == "broadcast") {
      for (braid::collective k : {braid::collective::all_reduce, braid::collective::all_gather, braid::collective::reduce_scatter, braid::collective::broadcast})
        if (braid::name(k) == a) c = k;
      colls.push_back(c);
    } else if (next && a == "-b") ok = braid_bench::parse_size(argv[++i], min_b);
    else if (next && a == "-e") ok = braid_bench::parse_size(argv[++i], max_b);
    else if (next && a == "-f") ok = braid_bench::parse_size(argv[++i], factor) && factor >= 2;
    else if (next && a == "-n") ok = (iters = std::atoi(argv[++i])) >= 1;
    else if (next && a == "-w") ok = (warmup = std::atoi(argv[++i])) >= 0;
    else if (next && a == "-d") ok = (type = argv[++i]) == "float" || type == "double" || type == "int32";
    else ok = false;
  }
  if (!ok) {
    if (rank == 0)
      std::fprintf(stderr, "usage: mpirun -np N %s [all_reduce|all_gather|reduce_scatter|broadcast|all] [-d float|double|int32] "
                           "[-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  if (colls.empty()) colls = {braid::collective::all_reduce};
  long long wrong = 0;
  int status = 0;
  try {
    braid::mpi::communicator comm(MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("# braid-bench-mpi: %d ranks, %d hosts (%s), host sizes", nranks, comm.hosts(),
                  comm.layout().overridden ? "BRAID_HOST_ID" : "MPI_COMM_TYPE_SHARED");
      for (int s : comm.layout().host_size) std::printf(" %d", s);
      std::printf("; %d timed calls after %d warmup, max over ranks\n", iters, warmup);
    }
    for (braid::collective c : colls) {
      if (type == "double") wrong += table<double>(comm, c, min_b, max_b, factor, iters, warmup);
      else if (type == "int32") wrong += table<std::int32_t>(comm, c, min_b, max_b, factor, iters, warmup);
      else wrong += table<float>(comm, c, min_b, max_b, factor, iters, warmup);
    }
    status = wrong ? 1 : 0;
  } catch (const braid::error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    status = 3;
  }
  if (rank == 0) std::printf("# total #wrong %lld\n", wrong);
  MPI_Finalize();
  return status;
}
