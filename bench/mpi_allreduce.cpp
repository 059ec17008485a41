// bench/mpi_allreduce.cpp — braid-mpi-allreduce: MPI_Allreduce (float, MPI_SUM, out-of-place) timed
// exactly as braid-bench times braid: per size, w warmup calls, MPI_Barrier, n timed calls; time =
// wall time / n in microseconds on each rank; the maximum over ranks is reported. Rank 0 prints CSV:
//
//   size,count,time_us,algbw,busbw,wrong
//
// algbw = size / time (GB = 1e9 bytes), busbw = algbw * 2(n-1)/n as in nccl-tests. `wrong` counts
// result elements (summed over ranks) that differ from the exact sum of a small-integer pattern,
// checked once after the timed calls.
//
//   mpirun -np N braid-mpi-allreduce [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]
// Sizes take K/M/G suffixes (1024-based); defaults: -b 4 -e 64M -f 2 -n 20 -w 5.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "parse_size.hpp"

namespace {

// Small integers: every partial sum of up to 2^16 ranks is exact in float.
float pattern(int rank, std::uint64_t i) { return static_cast<float>((static_cast<std::uint64_t>(rank) * 7 + i) % 13); }

} // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  std::uint64_t min_bytes = 4, max_bytes = 64ull << 20, factor = 2;
  int iters = 20, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_next = i + 1 < argc;
    bool ok = has_next;
    if (ok && a == "-b") ok = braid_bench::parse_size(argv[++i], min_bytes);
    else if (ok && a == "-e") ok = braid_bench::parse_size(argv[++i], max_bytes);
    else if (ok && a == "-f") ok = braid_bench::parse_size(argv[++i], factor) && factor >= 2;
    else if (ok && a == "-n") iters = std::atoi(argv[++i]);
    else if (ok && a == "-w") warmup = std::atoi(argv[++i]);
    else ok = false;
    if (!ok || iters < 1 || warmup < 0) {
      if (rank == 0)
        std::fprintf(stderr, "usage: mpirun -np N %s [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n", argv[0]);
      MPI_Finalize();
      return 2;
    }
  }

  const std::size_t max_count = max_bytes / sizeof(float);
  std::vector<float> in(std::max<std::size_t>(max_count, 1)), out(std::max<std::size_t>(max_count, 1));
  if (rank == 0) std::printf("size,count,time_us,algbw,busbw,wrong\n");
  for (std::uint64_t bytes = min_bytes; bytes <= max_bytes; bytes = bytes ? bytes * factor : 1) {
    const std::size_t count = bytes / sizeof(float);
    for (std::size_t i = 0; i < count; ++i) in[i] = pattern(rank, i);
    const int c = static_cast<int>(count);
    for (int i = 0; i < warmup; ++i) MPI_Allreduce(in.data(), out.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) MPI_Allreduce(in.data(), out.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double mine = (MPI_Wtime() - t0) / iters * 1e6;
    double worst = 0;
    MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    // Check once, on fresh output.
    std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(count), -1.0f);
    MPI_Allreduce(in.data(), out.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long long wrong = 0, total_wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += pattern(q, i);
      wrong += out[i] != want;
    }
    MPI_Reduce(&wrong, &total_wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

    if (rank == 0) {
      const double size = static_cast<double>(count * sizeof(float));
      const double algbw = worst > 0 ? size / 1e9 / (worst * 1e-6) : 0.0;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      std::printf("%llu,%llu,%.3f,%.4f,%.4f,%lld\n", static_cast<unsigned long long>(count * sizeof(float)),
                  static_cast<unsigned long long>(count), worst, algbw, busbw, total_wrong);
      std::fflush(stdout);
    }
    if (bytes * factor <= bytes) break;
  }
  MPI_Finalize();
  return 0;
}
