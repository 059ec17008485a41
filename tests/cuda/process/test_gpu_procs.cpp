// tests/cuda/process/test_gpu_procs.cpp — braid::cuda::process_communicator: GPU ranks in separate processes
// (forked by the test itself, no mpirun), all on device 0 unless BRAID_GPU_PROCS_DEVICES says how
// many GPUs to spread them over.
//
// Cases:
//   the reference sweep (tests/comm/sweep.hpp's inputs and judge, bit for bit) for 2 and 4 processes:
//     every collective x the 14 element types with sum, float with every operator; counts 0, 1, 7,
//     1003 at element offsets 3 and 5, and a large count; out-of-place and in-place; inputs staged
//     and registered; both data paths (copy engines for peers on other GPUs, and the reduce kernel
//     reading peers directly, always for peers on the same GPU);
//     a small staging size so that calls take many rounds;
//   a killed process: every survivor raises an error naming a failure within the deadline (device
//   path: peer_failed naming the dead rank, seen by a pidfd watcher, long before the deadline);
//   registration: memory that cannot be exported (managed) is refused with unsupported_error, a
//     registered input is read in place (no staging bytes), handles are closed by deregistration;
//   a mismatched call (different counts) raises mismatch_error on every rank;
//   the host path's pipeline: rounds staged beside the previous round's reads, host round trips per
//     call (asserted), and a long wait for the stream that sleeps instead of spinning (thread CPU time);
//   the overlap experiment: a compute-bound kernel's time beside a large all_reduce of the host path
//     (thread ranks in one process: kernels of one process can run concurrently) grows by <= 10%.
//
// The parent never initialises CUDA (it forks); a probe child counts the devices. Without one this
// prints "SKIPPED: no CUDA device" and exits 77, which CTest reports as skipped, never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <braid/braid.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <braid/cuda/process/host_layout.hpp>

#include "comm/orders_rule.hpp"
#include "comm/sweep.hpp"
#include "launch_procs.hpp"
#include "support/fork_ranks.hpp"

namespace {

namespace gp = braid::gpu_procs;
using braid::collective;
using braid::dtype;
using braid::errc;
using braid::op_kind;
using namespace std::chrono_literals;

int g_devices = 0;

int device_for(int rank) {
  const char* s = std::getenv("BRAID_GPU_PROCS_DEVICES");
  const int spread = s && *s ? std::max(1, std::min(std::atoi(s), g_devices)) : 1;
  return rank % spread;
}

std::size_t large_count() {
  const char* s = std::getenv("BRAID_GPU_SWEEP_LARGE");
  const unsigned long long v = s && *s ? std::strtoull(s, nullptr, 10) : 0;
  return v >= 8 ? static_cast<std::size_t>(v) : 1000003;
}

// Children print their failures; the parent checks every status.
void expect_all_zero(const std::vector<int>& st, const char* what) {
  for (std::size_t r = 0; r < st.size(); ++r) {
    INFO(what << ": rank " << r << " exit status " << st[r]);
    CHECK(st[r] == 0);
  }
}

// One case on one rank: inputs and sentinels through host images, the call, the judge.
template <class T, class Op>
bool check_case(gp::comm& c, int n, int r, collective coll, op_kind k, std::size_t count, std::size_t offset, bool in_place,
                bool registered, void* dev_in, void* dev_out, std::string& why, braid::algo algorithm = braid::algo::automatic) {
  const int root = n - 1;
  const std::size_t un = static_cast<std::size_t>(n);
  const std::size_t in_n = coll == collective::reduce_scatter ? count * un : count;
  const std::size_t span_n = braid::testing::span_elems(coll, n, count, in_place);
  T* out = static_cast<T*>(dev_out) + offset;
  T* in = in_place ? out : static_cast<T*>(dev_in) + offset;
  if (in_place && coll == collective::all_gather) in = out + static_cast<std::size_t>(r) * count;
  T* result = out;
  if (in_place && coll == collective::reduce_scatter) result = in + static_cast<std::size_t>(r) * count;
  std::vector<unsigned char> img((span_n + braid::testing::sweep_guard) * sizeof(T), 0xA5);
  gp::to_device(out, img.data(), img.size());
  std::vector<T> host_in(in_n);
  for (std::size_t i = 0; i < in_n; ++i) host_in[i] = braid::testing::input_value<T>(coll, k, r, count, i);
  if (in_n) gp::to_device(in, host_in.data(), in_n * sizeof(T));
  braid::gpu_launch::call call;
  call.coll = coll;
  call.algorithm = algorithm;
  call.type = braid::dtype_of_v<T>;
  call.op = k;
  call.in = in;
  call.out = coll == collective::reduce_scatter ? result : out;
  call.count = count;
  call.root = root;
  gp::run(c, call);
  gp::to_host(img.data(), out, img.size());
  const auto res_off = static_cast<std::size_t>(reinterpret_cast<const unsigned char*>(result) - reinterpret_cast<const unsigned char*>(out));
  const braid::testing::mismatch m =
      braid::testing::verify_output<T, Op>(coll, k, n, r, root, count, in_place, img.data(), img.data() + res_off);
  if (!m) return true;
  std::ostringstream s;
  s << braid::name(coll) << " " << braid::name(braid::dtype_of_v<T>) << " " << braid::name(k) << " n=" << n << " rank=" << r
    << " count=" << count << " offset=" << offset << (in_place ? " in-place" : "") << (registered ? " registered" : "")
    << (algorithm != braid::algo::automatic ? " " + std::string(braid::name(algorithm)) : std::string()) << ": "
    << m.what << " at " << m.at;
  why = s.str();
  return false;
}

// A float all_reduce call (sum) of `count` elements.
braid::gpu_launch::call float_all_reduce(const void* in, void* out, std::size_t count) {
  return braid::gpu_launch::call{.coll = collective::all_reduce, .type = dtype::float32, .in = in, .out = out, .count = count};
}

// Rank r's communicator on its device, with the given deadline (0: the default).
std::shared_ptr<gp::comm> join_rank(const braid::unique_id& id, int r, int n, std::chrono::nanoseconds timeout = {}) {
  gp::set_device(device_for(r));
  gp::comm_options o;
  o.timeout = timeout;
  braid::options ho = braid::options::from_env();
  if (timeout.count() > 0) ho.timeout = timeout; // the host communicator's waits too
  return gp::connect(braid::communicator::join(id, r, n, ho), device_for(r), o);
}

struct sweep_result {
  long cases = 0, failures = 0;
};

// The whole sweep on one rank (every rank runs the same sequence).
sweep_result sweep(gp::comm& c, int n, int r, std::size_t large) {
  sweep_result out;
  const std::size_t max_elems = (large + 64) * static_cast<std::size_t>(n) + 64;
  const std::size_t bytes = max_elems * 8;
  void* in = gp::dev_alloc(bytes);
  void* out_buf = gp::dev_alloc(bytes);
  void* reg = gp::dev_alloc(bytes);
  const int reg_id = gp::register_memory(c, reg, bytes);
  auto one = [&](auto tag, auto op, collective coll, op_kind k) {
    using T = typename decltype(tag)::type;
    using Op = decltype(op);
    std::vector<std::pair<std::size_t, std::size_t>> shapes = {{0, 0}, {1, 0}, {7, 0}, {1003, 3}, {1003, 5}};
    if (braid::testing::large_for_type<T>(false)) shapes.push_back({large, 0});
    for (auto [count, offset] : shapes)
      for (int variant = 0; variant < 3; ++variant) {
        const bool in_place = variant == 1, registered = variant == 2;
        std::string why;
        ++out.cases;
        if (!check_case<T, Op>(c, n, r, coll, k, count, offset, in_place, registered, registered ? reg : in, out_buf, why)) {
          ++out.failures;
          if (out.failures <= 20) std::fprintf(stderr, "rank %d: %s\n", r, why.c_str());
        }
      }
  };
  for (collective coll : braid::testing::sweep_collectives) {
    for (dtype t : braid::all_dtypes) braid::visit(t, [&](auto tag) { one(tag, braid::sum<>{}, coll, op_kind::sum); });
    if (coll == collective::all_gather || coll == collective::broadcast) continue;
    one(braid::type_tag<float>{}, braid::prod<>{}, coll, op_kind::prod);
    one(braid::type_tag<float>{}, braid::min<>{}, coll, op_kind::min);
    one(braid::type_tag<float>{}, braid::max<>{}, coll, op_kind::max);
    one(braid::type_tag<float>{}, braid::avg<>{}, coll, op_kind::avg);
  }
  gp::deregister_memory(c, reg_id);
  gp::dev_free(reg);
  gp::dev_free(in);
  gp::dev_free(out_buf);
  return out;
}

// Which data path a sweep configuration must have taken (from the communicator's statistics).
// many_rounds: more rounds than the same sweep took with the default staging (`more_rounds_than`, the
// rounds an earlier run_sweep reported through `rounds_out`), some of them staged ahead. "More rounds
// than cases" held at the full sweep size but not at the sanitizers' reduced one (gpu-check memcheck
// on an H100, 2026-11-25: 1152 rounds for 1326 cases, 1080 with the default staging).
enum class expect_path { copy_engines, direct_reads, many_rounds, device };

int run_sweep(int n, std::size_t large, const gp::comm_options& o, const char* label, expect_path want,
              std::uint64_t more_rounds_than = 0, std::uint64_t* rounds_out = nullptr) {
  int pipe_fds[2] = {-1, -1}; // rank 0 reports its round count to this process (rounds_out)
  if (rounds_out && ::pipe(pipe_fds) != 0) return 1;
  const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    gp::set_device(device_for(r));
    auto c = gp::connect(braid::communicator::join(id, r, n), device_for(r), o);
    const auto t0 = std::chrono::steady_clock::now();
    const sweep_result res = sweep(*c, n, r, large);
    const gp::stats s = gp::stats_of(*c);
    if (r == 0)
      std::printf("%s, %d processes: %ld cases, %ld failures on rank 0, %.1f s; %llu rounds, staged %llu B, copy engines %llu B, "
                  "direct reads %llu B; %llu host syncs (%llu asleep); %llu rounds staged ahead; device memory %zu B\n",
                  label, n, res.cases, res.failures,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  static_cast<unsigned long long>(s.rounds), static_cast<unsigned long long>(s.staged_bytes),
                  static_cast<unsigned long long>(s.copy_engine_bytes), static_cast<unsigned long long>(s.direct_read_bytes),
                  static_cast<unsigned long long>(s.host_syncs), static_cast<unsigned long long>(s.blocking_waits),
                  static_cast<unsigned long long>(s.staged_ahead), gp::memory_bytes(*c));
    if (r == 0 && rounds_out && ::write(pipe_fds[1], &s.rounds, sizeof s.rounds) != static_cast<ssize_t>(sizeof s.rounds)) return 4;
    // Copy engines bring only the pieces of peers on other GPUs; a peer on this rank's GPU is read
    // in place by the reduce kernel, whatever copy_engine_min_bytes says.
    bool peer_elsewhere = false, peer_here = false;
    for (int q = 0; q < n; ++q)
      if (q != r) (device_for(q) == device_for(r) ? peer_here : peer_elsewhere) = true;
    const bool path_ok = want == expect_path::device         ? gp::path_of(*c) == 2 && s.rounds > static_cast<std::uint64_t>(res.cases) &&
                                                                   s.direct_read_bytes == 0 && s.copy_engine_bytes == 0 && s.host_syncs == 0
                         : gp::path_of(*c) != 1                ? false
                         : want == expect_path::copy_engines   ? (peer_elsewhere ? s.copy_engine_bytes > 0 : true) &&
                                                                   (peer_here ? s.direct_read_bytes > 0 : s.direct_read_bytes == 0)
                         : want == expect_path::direct_reads ? s.direct_read_bytes > 0
                                                             : s.rounds > more_rounds_than && s.staged_ahead > 0 &&
                                                                   s.direct_read_bytes > 0 && s.copy_engine_bytes > 0;
    if (!path_ok) {
      std::fprintf(stderr, "rank %d: %s: the statistics do not show the expected data path\n", r, label);
      return 2;
    }
    if (gp::open_handles(*c) != static_cast<std::size_t>(n - 1)) {
      std::fprintf(stderr, "rank %d: %zu IPC handles open after deregistration, expected %d (staging only)\n", r,
                   gp::open_handles(*c), n - 1);
      return 3;
    }
    return res.failures ? 1 : 0;
  });
  int bad = 0;
  for (int s : st) bad += s != 0;
  if (rounds_out) {
    ::close(pipe_fds[1]); // the ranks have exited: a read now ends at the end of what rank 0 wrote
    if (::read(pipe_fds[0], rounds_out, sizeof *rounds_out) != static_cast<ssize_t>(sizeof *rounds_out)) ++bad;
    ::close(pipe_fds[0]);
  }
  return bad;
}

std::vector<int> sweep_nranks() {
  std::vector<int> out;
  if (const char* s = std::getenv("BRAID_GPU_PROCS_NRANKS"); s && *s) {
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ','))
      if (const int n = std::atoi(item.c_str()); n >= 1 && n <= 64) out.push_back(n);
  }
  if (out.empty()) out = {2, 4};
  return out;
}

} // namespace

TEST_CASE("reference sweep over processes (device 0, or spread by BRAID_GPU_PROCS_DEVICES): copy engines, direct reads, many rounds") {
  for (int n : sweep_nranks()) {
    gp::comm_options engines;
    engines.copy_engine_min_bytes = 0;
    engines.timeout = 60s;
    engines.path = 1; // the host path, also where the ranks are on distinct GPUs
    std::uint64_t default_rounds = 0;
    CHECK(run_sweep(n, large_count(), engines, "copy-engine path", expect_path::copy_engines, 0, &default_rounds) == 0);
    gp::comm_options direct;
    direct.copy_engine_min_bytes = std::size_t(1) << 62;
    direct.timeout = 60s;
    direct.path = 1;
    CHECK(run_sweep(n, large_count(), direct, "direct-read path", expect_path::direct_reads) == 0);
    gp::comm_options small = engines;
    small.staging_bytes = 128 << 10; // 64 KiB halves: the large count takes dozens of rounds
    small.copy_engine_min_bytes = 4096;
    CHECK(run_sweep(n, large_count(), small, "128 KiB staging, mixed paths", expect_path::many_rounds, default_rounds) == 0);
  }
}

// The host path replays every schedule: each collective under every algorithm that implements it,
// checked against the reference (tests/comm/sweep.hpp's judge) for counts that leave chunks empty,
// split unevenly and take many rounds (64 KiB halves), out of place, in place and registered. The
// statistics show each call took its own number of host meetings per round (the levels of its
// schedule): ring all_reduce meets more often than two_shot.
TEST_CASE("host path: every algorithm of every collective, against the reference") {
  for (int n : sweep_nranks()) {
    const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
      gp::set_device(device_for(r));
      gp::comm_options o;
      o.timeout = 60s;
      o.path = 1;
      o.staging_bytes = 128 << 10;
      o.copy_engine_min_bytes = 4096;
      auto c = gp::connect(braid::communicator::join(id, r, n), device_for(r), o);
      if (gp::path_of(*c) != 1) return 3;
      const std::size_t large = std::min<std::size_t>(large_count(), 40009);
      const std::size_t bytes = ((large + 64) * static_cast<std::size_t>(n) + 64) * 8;
      void* in = gp::dev_alloc(bytes);
      void* out = gp::dev_alloc(bytes);
      void* reg = gp::dev_alloc(bytes);
      const int reg_id = gp::register_memory(*c, reg, bytes);
      long cases = 0, failures = 0;
      std::uint64_t ring_syncs = 0, two_shot_syncs = 0;
      for (collective coll : braid::testing::sweep_collectives)
        for (braid::algo a : braid::all_algos) {
          if (!braid::supports(a, coll)) continue;
          const gp::stats before = gp::stats_of(*c);
          for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1003}, large})
            for (int variant = 0; variant < 3; ++variant) {
              const bool in_place = variant == 1, registered = variant == 2;
              std::string why;
              ++cases;
              const bool ok = check_case<float, braid::sum<>>(*c, n, r, coll, op_kind::sum, count, 1, in_place, registered,
                                                              registered ? reg : in, out, why, a);
              if (!ok && ++failures <= 10) std::fprintf(stderr, "rank %d: %s\n", r, why.c_str());
            }
          const gp::stats after = gp::stats_of(*c);
          if (coll == collective::all_reduce && a == braid::algo::ring) ring_syncs = after.host_syncs - before.host_syncs;
          if (coll == collective::all_reduce && a == braid::algo::two_shot) two_shot_syncs = after.host_syncs - before.host_syncs;
        }
      gp::deregister_memory(*c, reg_id);
      gp::dev_free(reg);
      gp::dev_free(in);
      gp::dev_free(out);
      if (r == 0)
        std::printf("host path, %d processes: %ld cases of every algorithm, %ld failures on rank 0; all_reduce host syncs: ring %llu, "
                    "two_shot %llu\n", n, cases, failures, static_cast<unsigned long long>(ring_syncs),
                    static_cast<unsigned long long>(two_shot_syncs));
      if (n > 2 && ring_syncs <= two_shot_syncs) return 2; // ring meets 2(n - 1) - 1 times a round, two_shot once
      return failures ? 1 : 0;
    });
    expect_all_zero(st, ("host path, every algorithm, " + std::to_string(n) + " processes").c_str());
  }
}

// Whether ranks 0..n-1 are each on a GPU of their own (device_for).
bool distinct_devices(int n) {
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < a; ++b)
      if (device_for(a) == device_for(b)) return false;
  return true;
}

// The same sweep on the device path (process_path::device: one cooperative launch of the executor's
// kernel per call, ranks waiting for each other in the kernel through IPC-mapped progress words).
// Needs every rank on a GPU of its own: BRAID_GPU_PROCS_DEVICES >= the largest of
// BRAID_GPU_PROCS_NRANKS (CTest's test_gpu_procs_emu_device); it fails, not skips, otherwise.
TEST_CASE("device path: reference sweep over processes on distinct GPUs, many rounds") {
  for (int n : sweep_nranks()) {
    REQUIRE_MESSAGE(distinct_devices(n), "the device path needs " << n << " ranks on distinct GPUs: set BRAID_GPU_PROCS_DEVICES");
    gp::comm_options o;
    o.timeout = 60s;
    o.path = 2;
    o.staging_bytes = 128 << 10; // 64 KiB halves: the large count takes many rounds
    o.reduce_blocks = 2;         // blocks per rank of the kernel (the emulator runs every thread)
    o.threads = 64;
    CHECK(run_sweep(n, large_count(), o, "device path, 128 KiB staging", expect_path::device) == 0);
  }
}

// Misaligned buffers on the device path (the one-process kernel, so the same fault as test_gpu's
// "misaligned buffers" case): an in-place one_shot all_reduce overwrote its input before the rank's
// other blocks had staged it wherever the staging copy and the reduction moved different widths (a
// float buffer 8 bytes past a 16-byte boundary). Every offset below 16 bytes, in place and out of
// place, one_shot and two_shot; reduce_scatter and reduce (direct) in place.
TEST_CASE("device path: misaligned buffers, every offset below 16 bytes, in place and out of place") {
  for (int n : sweep_nranks()) {
    REQUIRE_MESSAGE(distinct_devices(n), "the device path needs " << n << " ranks on distinct GPUs: set BRAID_GPU_PROCS_DEVICES");
    const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
      gp::set_device(device_for(r));
      gp::comm_options o;
      o.timeout = 60s;
      o.path = 2;
      o.reduce_blocks = 8; // blocks per rank: what must be ordered
      o.threads = 64;
      auto c = gp::connect(braid::communicator::join(id, r, n), device_for(r), o);
      const std::size_t large = 20011;
      const std::size_t bytes = ((large + 64) * static_cast<std::size_t>(n) + 64) * 8;
      void* in = gp::dev_alloc(bytes);
      void* out = gp::dev_alloc(bytes);
      long failures = 0;
      auto one = [&](auto tag, collective coll, braid::algo a, std::size_t count, bool in_place) {
        using T = typename decltype(tag)::type;
        for (std::size_t b = 0; b < 16; b += sizeof(T)) {
          std::string why;
          if (!check_case<T, braid::sum<>>(*c, n, r, coll, op_kind::sum, count, b / sizeof(T), in_place, false, in, out, why, a) &&
              ++failures <= 10)
            std::fprintf(stderr, "rank %d: %s\n", r, why.c_str());
        }
      };
      for (const std::size_t count : {std::size_t{1003}, large})
        for (const bool in_place : {true, false}) {
          one(braid::type_tag<float>{}, collective::all_reduce, braid::algo::one_shot, count, in_place);
          one(braid::type_tag<braid::half>{}, collective::all_reduce, braid::algo::one_shot, count, in_place);
          one(braid::type_tag<std::int8_t>{}, collective::all_reduce, braid::algo::one_shot, count, in_place);
          one(braid::type_tag<float>{}, collective::all_reduce, braid::algo::two_shot, count, in_place);
        }
      one(braid::type_tag<float>{}, collective::reduce_scatter, braid::algo::direct, 4099, true);
      one(braid::type_tag<float>{}, collective::reduce, braid::algo::direct, 4099, true);
      gp::dev_free(in);
      gp::dev_free(out);
      return failures ? 1 : 0;
    });
    expect_all_zero(st, ("misaligned buffers, " + std::to_string(n) + " processes").c_str());
  }
}

// docs/guarantees.md's orders for process_communicator, bit for bit: the host path reduces every
// element in rank order 0, 1, ..., n-1 (direct); the device path runs the one-process kernels'
// one_shot, two_shot and direct schedules, whose rule (tests/comm/orders_rule.hpp) is rank order too.
// float sum on values of mixed magnitudes (orders_rule::value): from 3 ranks on, the reversed rank
// order gives different bits on this data (checked), so a different order could not pass. Both paths
// with every process on a GPU of its own; a 128 KiB staging so that the large count takes many rounds.
TEST_CASE("device path: reduction orders of process_communicator (host and device paths) follow docs/guarantees.md") {
  using braid::algo;
  namespace ord = orders_rule;
  const std::size_t count = std::min<std::size_t>(large_count(), 50021);
  for (int n : sweep_nranks()) {
    if (n < 3) continue;
    REQUIRE_MESSAGE(distinct_devices(n), "the device path needs " << n << " ranks on distinct GPUs: set BRAID_GPU_PROCS_DEVICES");
    // The data tells rank order from its reverse (else the test could not fail).
    const std::vector<int> order = ord::rank_order(n), backwards = ord::reversed(order);
    bool differs = false;
    for (std::uint64_t g = 0; g < count && !differs; ++g)
      differs = ord::fold(ord::opk::sum, order, g) != ord::fold(ord::opk::sum, backwards, g);
    REQUIRE(differs);
    for (int path : {1, 2}) {
      struct one { collective coll; algo a; };
      std::vector<one> calls;
      if (path == 1)
        calls = {{collective::all_reduce, algo::direct}, {collective::all_reduce, algo::one_shot}, {collective::all_reduce, algo::two_shot},
                 {collective::reduce, algo::direct}, {collective::reduce_scatter, algo::direct}};
      else
        calls = {{collective::all_reduce, algo::one_shot}, {collective::all_reduce, algo::two_shot}, {collective::all_reduce, algo::direct},
                 {collective::reduce, algo::direct}, {collective::reduce_scatter, algo::direct}};
      const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
        gp::set_device(device_for(r));
        gp::comm_options o;
        o.timeout = 60s;
        o.path = path;
        o.staging_bytes = 128 << 10;
        o.reduce_blocks = 2;
        o.threads = 64;
        auto c = gp::connect(braid::communicator::join(id, r, n), device_for(r), o);
        if (gp::path_of(*c) != path) {
          std::fprintf(stderr, "rank %d: path %d, asked for %d\n", r, gp::path_of(*c), path);
          return 3;
        }
        const std::size_t un = static_cast<std::size_t>(n);
        float* din = static_cast<float*>(gp::dev_alloc(count * un * sizeof(float)));
        float* dout = static_cast<float*>(gp::dev_alloc(count * sizeof(float)));
        int bad = 0;
        for (const one& k : calls) {
          const bool rs = k.coll == collective::reduce_scatter;
          const std::size_t in_n = rs ? count * un : count;
          std::vector<float> h(in_n);
          for (std::size_t i = 0; i < in_n; ++i) h[i] = ord::value(r, i);
          gp::to_device(din, h.data(), in_n * sizeof(float));
          gp::dev_fill(dout, 0, count * sizeof(float));
          braid::gpu_launch::call call;
          call.coll = k.coll;
          call.algorithm = k.a;
          call.in = din;
          call.out = dout;
          call.count = count;
          call.root = n - 1;
          gp::run(*c, call);
          if (k.coll == collective::reduce && r != n - 1) continue;
          std::vector<float> got(count);
          gp::to_host(got.data(), dout, count * sizeof(float));
          const std::uint64_t off = rs ? static_cast<std::uint64_t>(r) * count : 0;
          for (std::size_t i = 0; i < count; ++i) {
            const float want = ord::fold(ord::opk::sum, order, off + i);
            if (std::memcmp(&got[i], &want, sizeof want) != 0) {
              std::fprintf(stderr, "rank %d, path %d, %s %s n=%d: element %zu is %a, rank order gives %a\n", r, path,
                           braid::name(k.coll).data(), braid::name(k.a).data(), n, i, static_cast<double>(got[i]), static_cast<double>(want));
              ++bad;
              break;
            }
          }
        }
        gp::dev_free(din);
        gp::dev_free(dout);
        if (r == 0) std::printf("orders, path %d, %d processes: %zu calls of %zu floats checked bit for bit\n", path, n, calls.size(), count);
        return bad ? 2 : 0;
      });
      expect_all_zero(st, path == 1 ? "orders, host path" : "orders, device path");
    }
  }
}

// A float all_reduce of `count` elements through `c`, with rank r's input r + 1 + i % 5 written first;
// returns the number of wrong elements (expected: the sum over n ranks).
std::size_t all_reduce_and_count_wrong(gp::comm& c, int n, int r, float* in, float* out, std::size_t count, int salt) {
  std::vector<float> h(count);
  for (std::size_t i = 0; i < count; ++i) h[i] = static_cast<float>(r + 1 + static_cast<int>((i + static_cast<std::size_t>(salt)) % 5));
  gp::to_device(in, h.data(), count * sizeof(float));
  gp::run(c, float_all_reduce(in, out, count));
  gp::to_host(h.data(), out, count * sizeof(float));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    wrong += h[i] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>((i + static_cast<std::size_t>(salt)) % 5));
  return wrong;
}

std::shared_ptr<gp::comm> join_device_path(const braid::unique_id& id, int r, int n, std::chrono::nanoseconds timeout) {
  gp::set_device(r);
  gp::comm_options o;
  o.timeout = timeout;
  o.reduce_blocks = 2;
  o.threads = 64;
  braid::options ho = braid::options::from_env();
  ho.timeout = timeout;
  return gp::connect(braid::communicator::join(id, r, n, ho), r, o); // path automatic
}

TEST_CASE("device path: chosen for distinct GPUs, stream-ordered, capturable, mixed layouts keep the host path") {
  REQUIRE_MESSAGE(g_devices >= 3, "needs 3 GPUs (the emulator's BRAID_EMU_DEVICES)");
  // 3 processes on GPUs 0, 1, 2: the device path, chosen without being asked.
  const int n = 3;
  auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    auto c = join_device_path(id, r, n, 60s);
    if (gp::path_of(*c) != 2 || gp::describe(*c).find("device path") == std::string::npos) {
      std::fprintf(stderr, "rank %d: path %d (%s), expected the device path\n", r, gp::path_of(*c), gp::describe(*c).c_str());
      return 1;
    }
    const std::size_t count = 5000;
    auto* in = static_cast<float*>(gp::dev_alloc(count * sizeof(float)));
    auto* out = static_cast<float*>(gp::dev_alloc(count * sizeof(float)));
    if (all_reduce_and_count_wrong(*c, n, r, in, out, count, 0) != 0) return 2;
    if (gp::stats_of(*c).host_syncs != 0) return 7; // no host round trip in a call
    // Stream-ordered: rank 2 makes its call only after ranks 0 and 1 have returned from theirs and
    // looked at their streams (a host all_reduce orders it), so their kernels are still waiting for
    // rank 2 when they look: the call returned before the data moved.
    std::vector<float> h(count, static_cast<float>(r + 1));
    gp::to_device(in, h.data(), count * sizeof(float));
    gp::barrier(*c);
    std::int64_t busy = 0;
    if (r != 2) {
      gp::enqueue(*c, float_all_reduce(in, out, count));
      busy = gp::stream_busy(*c) ? 1 : 0;
    }
    const std::int64_t busy_ranks = gp::sum_over_ranks(*c, busy);
    if (r == 2) gp::enqueue(*c, float_all_reduce(in, out, count));
    gp::finish(*c);
    if (busy_ranks != 2) {
      std::fprintf(stderr, "rank %d: %lld of ranks 0 and 1 returned with their stream busy: not stream-ordered\n", r,
                   static_cast<long long>(busy_ranks));
      return 3;
    }
    gp::to_host(h.data(), out, count * sizeof(float));
    for (float v : h)
      if (v != 6.0f) return 4;
    // A CUDA graph: captured once, replayed with new inputs; each replay is a new call.
    void* g = gp::capture(*c, float_all_reduce(in, out, count));
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<float> x(count, static_cast<float>((r + 1) * (rep + 2)));
      gp::to_device(in, x.data(), count * sizeof(float));
      gp::replay(*c, g);
      gp::finish(*c);
      gp::to_host(x.data(), out, count * sizeof(float));
      for (float v : x)
        if (v != static_cast<float>(6 * (rep + 2))) {
          std::fprintf(stderr, "rank %d: replay %d gave %g, expected %d\n", r, rep, static_cast<double>(v), 6 * (rep + 2));
          return 5;
        }
    }
    gp::destroy_graph(g);
    // Calls after the replays continue the rounds.
    if (all_reduce_and_count_wrong(*c, n, r, in, out, count, 3) != 0) return 6;
    gp::dev_free(in);
    gp::dev_free(out);
    return 0;
  }, std::chrono::seconds(300));
  expect_all_zero(st, "device path");

  // 3 processes, two of them on GPU 0: the host path; asking for the device path is refused on
  // every rank.
  st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    const int dev = r == 2 ? 1 : 0;
    gp::set_device(dev);
    gp::comm_options forced;
    forced.path = 2;
    try {
      gp::connect(braid::communicator::join(id, r, n), dev, forced);
      return 1;
    } catch (const braid::error& e) {
      std::printf("rank %d: %s\n", r, e.what());
      return e.code() == errc::invalid_argument ? 0 : 2;
    }
  }, std::chrono::seconds(120));
  expect_all_zero(st, "device path refused where GPUs are shared");
  st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    const int dev = r == 2 ? 1 : 0;
    gp::set_device(dev);
    auto c = gp::connect(braid::communicator::join(id, r, n), dev, {});
    if (gp::path_of(*c) != 1 || gp::describe(*c).find("host path") == std::string::npos) return 3;
    const std::size_t count = 1000;
    auto* in = static_cast<float*>(gp::dev_alloc(count * sizeof(float)));
    auto* out = static_cast<float*>(gp::dev_alloc(count * sizeof(float)));
    if (all_reduce_and_count_wrong(*c, n, r, in, out, count, 1) != 0) return 4;
    // One round of the host path's all_reduce blocks the host 5 times: stream wait, all_gather of the
    // call descriptors, stream wait, barrier, stream wait.
    const gp::stats st1 = gp::stats_of(*c);
    if (st1.rounds != 1 || st1.host_syncs != 5) {
      std::fprintf(stderr, "rank %d: host path all_reduce: %llu rounds, %llu host syncs (expected 1 and 5)\n", r,
                   static_cast<unsigned long long>(st1.rounds), static_cast<unsigned long long>(st1.host_syncs));
      return 5;
    }
    return 0;
  }, std::chrono::seconds(120));
  expect_all_zero(st, "mixed layout");
}

// The host path (ranks sharing device 0, its layout) as a pipeline: round k + 1 is staged beside
// round k's reads, and a call of R rounds blocks the host 3R + 2 times (all_reduce: a wait for the
// stream before round 0, then per round the all_gather, a wait, a barrier; a last wait) or 2R + 1
// (reduce_scatter: no barrier). A wait for work that runs long sleeps: the waiting thread's CPU time
// stays a small part of the wait.
TEST_CASE("host path: rounds staged ahead, host round trips per call, a long wait for the stream sleeps") {
  const int n = 3;
  const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    gp::set_device(0);
    gp::comm_options o;
    o.staging_bytes = 128 << 10; // 64 KiB halves: many rounds
    o.timeout = 60s;
    auto c = gp::connect(braid::communicator::join(id, r, n), 0, o);
    if (gp::path_of(*c) != 1) return 1;
    const std::uint64_t half = 64 << 10;
    const std::size_t count = 40000;
    auto* in = static_cast<float*>(gp::dev_alloc(n * count * sizeof(float)));
    auto* out = static_cast<float*>(gp::dev_alloc(n * count * sizeof(float)));
    auto expect = [&](const char* what, const gp::stats& a, const gp::stats& b, std::uint64_t rounds, std::uint64_t syncs) {
      const std::uint64_t got_r = b.rounds - a.rounds, got_s = b.host_syncs - a.host_syncs, got_a = b.staged_ahead - a.staged_ahead;
      if (r == 0)
        std::printf("host path %s, %d processes: %llu rounds, %llu host syncs (%llu asleep), %llu staged ahead, reduce grid %llu\n", what,
                    n, static_cast<unsigned long long>(got_r), static_cast<unsigned long long>(got_s),
                    static_cast<unsigned long long>(b.blocking_waits - a.blocking_waits), static_cast<unsigned long long>(got_a),
                    static_cast<unsigned long long>(b.reduce_grid));
      if (got_r == rounds && got_s == syncs && got_a == rounds - 1) return true;
      std::fprintf(stderr, "rank %d: %s: %llu rounds, %llu host syncs, %llu staged ahead; expected %llu, %llu, %llu\n", r, what,
                   static_cast<unsigned long long>(got_r), static_cast<unsigned long long>(got_s),
                   static_cast<unsigned long long>(got_a), static_cast<unsigned long long>(rounds),
                   static_cast<unsigned long long>(syncs), static_cast<unsigned long long>(rounds - 1));
      return false;
    };
    // all_reduce of 40000 floats.
    {
      const auto L = braid::cuda::process::fit_host_half<braid::schedule::two_shot, float>(collective::all_reduce, n, half);
      const std::uint64_t R = (count + L.per - 1) / L.per;
      if (R < 4) return 2; // the case must take several rounds
      const gp::stats a = gp::stats_of(*c);
      if (all_reduce_and_count_wrong(*c, n, r, in, out, count, 3) != 0) return 3;
      if (!expect("all_reduce", a, gp::stats_of(*c), R, 3 * R + 2)) return 4;
    }
    // reduce_scatter of 40000 floats per block: rank r gets the sum of every rank's block r.
    {
      std::vector<float> h(n * count);
      // i % 7: a period prime to a round's length, so a slice of another round differs from the right one.
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(r + 1 + static_cast<int>(i % 7));
      gp::to_device(in, h.data(), h.size() * sizeof(float));
      braid::gpu_launch::call call = float_all_reduce(in, out, count);
      call.coll = collective::reduce_scatter;
      const auto L = braid::cuda::process::fit_host_half<braid::schedule::direct, float>(collective::reduce_scatter, n, half);
      const std::uint64_t R = (count + L.per - 1) / L.per;
      if (R < 4) return 5;
      const gp::stats a = gp::stats_of(*c);
      gp::run(*c, call);
      if (!expect("reduce_scatter", a, gp::stats_of(*c), R, 2 * R + 1)) return 6;
      gp::to_host(h.data(), out, count * sizeof(float));
      for (std::size_t i = 0; i < count; ++i)
        if (h[i] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>((static_cast<std::size_t>(r) * count + i) % 7))) return 7;
    }
    // A wait for 300 ms of earlier work on the stream: the thread sleeps once its spin is over.
    {
      std::vector<float> h(1000, static_cast<float>(r + 1));
      gp::to_device(in, h.data(), h.size() * sizeof(float)); // before the hold: this copy waits for the stream
      gp::hold_stream(*c, 300);
      const gp::stats a = gp::stats_of(*c);
      timespec c0{}, c1{};
      rusage u0{}, u1{};
      getrusage(RUSAGE_THREAD, &u0);
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
      const auto w0 = std::chrono::steady_clock::now();
      gp::run(*c, float_all_reduce(in, out, h.size()));
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
      getrusage(RUSAGE_THREAD, &u1);
      const long wakeups = u1.ru_nvcsw - u0.ru_nvcsw; // voluntary context switches: sleeps
      const double cpu = static_cast<double>(c1.tv_sec - c0.tv_sec) + static_cast<double>(c1.tv_nsec - c0.tv_nsec) * 1e-9;
      const gp::stats b = gp::stats_of(*c);
      std::printf("rank %d: a call behind 300 ms of stream work: %.1f ms wall, %.2f ms of this thread's CPU, %ld sleeps; %llu waits "
                  "asleep\n", r, wall * 1e3, cpu * 1e3, wakeups, static_cast<unsigned long long>(b.blocking_waits - a.blocking_waits));
      // A 20 us nap loop in its place measured 39-49 ms of CPU and about 3200 sleeps here (emulator,
      // 2 cores); this wait polls an eventfd in 10 ms slices: about 30.
      if (wall < 0.3 || b.blocking_waits == a.blocking_waits || cpu > 0.05 * wall || wakeups > 200) return 11;
      gp::to_host(h.data(), out, h.size() * sizeof(float));
      for (float v : h)
        if (v != static_cast<float>(n * (n + 1) / 2)) return 12;
    }
    gp::dev_free(in);
    gp::dev_free(out);
    return 0;
  }, std::chrono::seconds(300));
  expect_all_zero(st, "host path pipeline");
  // A large all_reduce on the default staging: one round, the reduce grid from the device (the
  // chunk of one rank in 32 KiB blocks, at most one block per SM).
  const auto big = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    gp::set_device(0);
    auto c = gp::connect(braid::communicator::join(id, r, n), 0, {});
    const std::size_t m = 300000;
    auto* in = static_cast<float*>(gp::dev_alloc(m * sizeof(float)));
    auto* out = static_cast<float*>(gp::dev_alloc(m * sizeof(float)));
    if (all_reduce_and_count_wrong(*c, n, r, in, out, m, 5) != 0) return 1;
    // two_shot: rank r reduces chunk r of the round, the last reduce of this rank's call.
    const std::uint64_t mine = braid::schedule::chunk_at(collective::all_reduce, m, static_cast<std::uint32_t>(n),
                                                         static_cast<std::uint32_t>(r), braid::schedule::chunk_unit<float>())
                                   .count;
    const int sms = gp::multiprocessors(*c);
    const std::uint64_t want = braid::cuda::process::reduce_grid(mine, sizeof(float), 0, sms, 512);
    const std::uint64_t got = gp::stats_of(*c).reduce_grid;
    std::printf("rank %d: host path all_reduce of %zu floats: reduce grid %llu (expected %llu) on a device of %d SMs\n", r, m,
                static_cast<unsigned long long>(got), static_cast<unsigned long long>(want), sms);
    gp::dev_free(in);
    gp::dev_free(out);
    return got == want && want >= 2 ? 0 : 2;
  }, std::chrono::seconds(300));
  expect_all_zero(big, "host path reduce grid");
}

// Mismatched calls on the device path: different counts; then a broadcast whose two ranks both think
// they are the root (neither reads the other, so that call compares nothing) followed by an
// all_reduce, whose chained call word carries the difference. Every rank raises mismatch_error, naming
// that call, well before the 60 s deadline.
TEST_CASE("device path: mismatched calls raise mismatch_error on every rank") {
  REQUIRE_MESSAGE(g_devices >= 2, "needs 2 GPUs (the emulator's BRAID_EMU_DEVICES)");
  const int n = 2;
  for (int kind = 0; kind < 2; ++kind) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
      auto c = join_device_path(id, r, n, 60s);
      if (gp::path_of(*c) != 2) return 1;
      const std::size_t count = 1000;
      void* p = gp::dev_alloc(count * sizeof(float));
      gp::dev_fill(p, 0, count * sizeof(float));
      try {
        if (kind == 0) {
          gp::run(*c, float_all_reduce(p, p, r == 0 ? count : count / 2));
        } else {
          braid::gpu_launch::call b = float_all_reduce(p, p, count);
          b.coll = collective::broadcast;
          b.root = r;
          gp::enqueue(*c, b);
          gp::run(*c, float_all_reduce(p, p, count));
        }
        return 2;
      } catch (const braid::error& e) {
        std::printf("rank %d: %s\n", r, e.what());
        if (e.code() != errc::mismatch) return 3;
        // The call during which a kernel found the difference: each rank's first all_reduce (#1), or
        // the all_reduce after the broadcast (#2); the rank that found it and the other as the peer.
        if (e.collective() != "all_reduce" || e.sequence() != (kind == 0 ? 1u : 2u) || e.peer() != 1 - e.rank()) return 4;
        return 0;
      }
    }, std::chrono::seconds(120));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("device path mismatch, kind " << kind << ": " << took << " s (deadline 60 s)");
    expect_all_zero(st, "device path mismatch");
    CHECK(took < 20);
  }
}

TEST_CASE("device path: an aborted rank and a killed process stop every kernel, errors within the deadline") {
  REQUIRE_MESSAGE(g_devices >= 3, "needs 3 GPUs (the emulator's BRAID_EMU_DEVICES)");
  const int n = 3;
  // abort(): rank 0 never makes the call and aborts; the others' kernels, waiting for it, return at
  // their next check, and check() raises aborted long before the 60 s deadline.
  auto t0 = std::chrono::steady_clock::now();
  auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    auto c = join_device_path(id, r, n, 60s);
    const std::size_t count = 1000;
    void* p = gp::dev_alloc(count * sizeof(float));
    gp::dev_fill(p, 0, count * sizeof(float));
    if (r == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      gp::abort(*c);
      return 0;
    }
    gp::enqueue(*c, float_all_reduce(p, p, count));
    try {
      gp::finish(*c);
      return 1;
    } catch (const braid::error& e) {
      std::printf("rank %d: %s\n", r, e.what());
      return e.code() == errc::aborted ? 0 : 2;
    }
  }, std::chrono::seconds(120));
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("device path, aborted rank: " << took << " s (deadline 60 s)");
  expect_all_zero(st, "device path abort");
  CHECK(took < 30);
  // A killed process: each survivor's watcher (a pidfd per peer) sees it end and records peer_failed;
  // the survivors' kernels, waiting for it, return at their next check and the survivors raise
  // peer_failed naming rank 2, long before the 60 s deadline.
  t0 = std::chrono::steady_clock::now();
  st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    auto c = join_device_path(id, r, n, 60s);
    const std::size_t count = 1000;
    void* p = gp::dev_alloc(count * sizeof(float));
    gp::dev_fill(p, 0, count * sizeof(float));
    for (int i = 0;; ++i) {
      if (r == 2 && i == 3) ::raise(SIGKILL);
      try {
        gp::run(*c, float_all_reduce(p, p, count));
      } catch (const braid::error& e) {
        std::printf("rank %d: after %d calls: %s\n", r, i, e.what());
        const bool named = e.code() == errc::peer_failed && std::strstr(e.what(), "rank 2's process ended");
        // Rank 2 returned from call 2 before it died, but a survivor can still be inside call 2 (its
        // kernel not yet past its last check) when the watcher records the death: call 2 may raise,
        // calls 0 and 1 may not (rank 2 could not finish call 2 before every rank was in it).
        return named && i >= 2 ? 0 : 4;
      }
      if (i > 100000) return 5;
    }
  }, std::chrono::seconds(120));
  took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("device path, killed process: " << took << " s (deadline 60 s)");
  CHECK(st[2] == 128 + SIGKILL);
  CHECK(st[0] == 0);
  CHECK(st[1] == 0);
  CHECK(took < 20);
}

TEST_CASE("a killed process makes every survivor raise within the deadline") {
  const int n = 3;
  const auto t0 = std::chrono::steady_clock::now();
  const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    auto c = join_rank(id, r, n, 10s);
    const std::size_t count = 1 << 20;
    void* p = gp::dev_alloc(count * sizeof(float));
    gp::dev_fill(p, 0, count * sizeof(float));
    const braid::gpu_launch::call call = float_all_reduce(p, p, count);
    for (int i = 0;; ++i) {
      if (r == 2 && i == 5) ::raise(SIGKILL);
      try {
        gp::run(*c, call);
      } catch (const braid::error& e) {
        // The failure itself, or (a rank entering a host call after the other survivor published
        // it) usage_error carrying it.
        const bool named = e.code() == errc::peer_failed || e.code() == errc::aborted || e.code() == errc::timeout ||
                           (e.code() == errc::invalid_usage && std::strstr(e.what(), "rank 2"));
        std::printf("rank %d: after %d calls: %s\n", r, i, e.what());
        // As above: the last call rank 2 took part in (call 4) may raise on a survivor still inside it.
        return named && i >= 4 ? 0 : 4;
      }
      if (i > 100000) return 5;
    }
  }, std::chrono::seconds(120));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("killed-process case took " << took << " s (deadline 10 s)");
  CHECK(st[2] == 128 + SIGKILL);
  CHECK(st[0] == 0);
  CHECK(st[1] == 0);
  CHECK(took < 60);
}

TEST_CASE("registration: unexportable memory is refused, registered inputs are read in place") {
  const int n = 2;
  const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    auto c = join_rank(id, r, n);
    const std::size_t count = 1 << 18;
    // Registered input: no staging copy on either rank.
    void* in = gp::dev_alloc(count * sizeof(float) + 256);
    void* out = gp::dev_alloc(count * sizeof(float));
    const int id_reg = gp::register_memory(*c, in, count * sizeof(float) + 256);
    std::vector<float> host(count, static_cast<float>(r + 1));
    float* in_f = static_cast<float*>(in) + 16; // an offset into the registration
    gp::to_device(in_f, host.data(), count * sizeof(float));
    const gp::stats before = gp::stats_of(*c);
    gp::run(*c, float_all_reduce(in_f, out, count));
    // A registered input may be overwritten as soon as the call returns (api.md): no peer reads it
    // any more. Overwritten here before the output is checked, on both ranks.
    gp::dev_fill(in, 0, count * sizeof(float) + 256);
    const gp::stats after = gp::stats_of(*c);
    gp::to_host(host.data(), out, count * sizeof(float));
    for (std::size_t i = 0; i < count; ++i)
      if (host[i] != 3.0f) {
        std::fprintf(stderr, "rank %d: element %zu is %g, expected 3\n", r, i, host[i]);
        return 1;
      }
    if (after.staged_bytes != before.staged_bytes) {
      std::fprintf(stderr, "rank %d: a registered input was staged (%llu bytes)\n", r,
                   static_cast<unsigned long long>(after.staged_bytes - before.staged_bytes));
      return 2;
    }
    if (gp::open_handles(*c) != 2) return 3; // staging + registration of the one peer
    gp::deregister_memory(*c, id_reg);
    if (gp::open_handles(*c) != 1) return 4;
    // Managed memory cannot be exported: unsupported on the rank that tries; the other rank is
    // released (aborted or peer_failed), not left waiting.
    if (r == 0) {
      void* m = gp::dev_alloc_managed(4096);
      try {
        gp::register_memory(*c, m, 4096);
        return 5;
      } catch (const braid::error& e) {
        gp::dev_free(m);
        std::printf("rank 0: %s\n", e.what());
        if (e.code() != errc::unsupported) return 6;
      }
    } else {
      void* m = gp::dev_alloc(4096);
      try {
        gp::register_memory(*c, m, 4096);
        return 7;
      } catch (const braid::error& e) {
        std::printf("rank 1: %s\n", e.what());
        // Released by rank 0's abort: inside the exchange (aborted), or at its entry (usage_error
        // carrying the abort).
        const bool released = e.code() == errc::aborted || e.code() == errc::peer_failed ||
                              (e.code() == errc::invalid_usage && std::strstr(e.what(), "abort"));
        if (!released) return 8;
      }
    }
    gp::dev_free(in);
    gp::dev_free(out);
    return 0;
  }, std::chrono::seconds(120));
  expect_all_zero(st, "registration");
}

// api.md: device -1 picks the host rank modulo the devices this process sees, and barrier(stream)
// returns only once every rank has reached it (rank 1 arrives 300 ms late).
TEST_CASE("device -1 is host rank % device count; barrier(stream) waits for every rank") {
  const int n = 2;
  const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    const int ndev = gp::device_count();
    if (ndev < 1) return 1;
    auto c = gp::connect(braid::communicator::join(id, r, n), -1);
    if (gp::device_of(*c) != r % ndev) {
      std::fprintf(stderr, "rank %d: device %d, expected %d\n", r, gp::device_of(*c), r % ndev);
      return 2;
    }
    gp::barrier(*c); // both constructed and past a first barrier
    const auto t0 = std::chrono::steady_clock::now();
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    gp::barrier(*c);
    const auto waited = std::chrono::steady_clock::now() - t0;
    if (r == 0 && waited < std::chrono::milliseconds(250)) {
      std::fprintf(stderr, "rank 0 left the barrier after %lld ms, before rank 1 reached it\n",
                   static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()));
      return 3;
    }
    return 0;
  }, std::chrono::seconds(120));
  expect_all_zero(st, "device and barrier");
}

TEST_CASE("a mismatched call raises mismatch_error on every rank") {
  const int n = 2;
  const auto st = braid::testing::fork_ranks(n, [&](int r, const braid::unique_id& id) {
    auto c = join_rank(id, r, n, 10s);
    void* p = gp::dev_alloc(4096);
    try {
      gp::run(*c, float_all_reduce(p, p, r == 0 ? 100 : 200));
      return 1;
    } catch (const braid::error& e) {
      std::printf("rank %d: %s\n", r, e.what());
      return e.code() == errc::mismatch ? 0 : 2;
    }
  }, std::chrono::seconds(60));
  expect_all_zero(st, "mismatch");
}

// A timing bar: run only by `test_gpu_procs --timing` (CTest's test_gpu_procs_timing), and only on a
// real GPU (the emulated device has no timings to judge).
TEST_SUITE("timing") {
TEST_CASE("overlap: a compute-bound kernel beside a large all_reduce of the host path (16 reduce blocks)") {
  const auto st = braid::testing::fork_ranks(1, [&](int, const braid::unique_id&) {
    const std::size_t bytes = std::size_t(256) << 20;
    const gp::overlap_result o = gp::measure_overlap(bytes, 2, 5);
    const double growth = o.beside_s / o.alone_s - 1;
    std::printf("overlap: compute kernel %.2f ms alone, %.2f ms beside 2-rank all_reduce of 256 MiB (%.1f%% longer); "
                "all_reduce alone %.2f ms; %llu all_reduce calls completed while the kernel ran\n",
                o.alone_s * 1e3, o.beside_s * 1e3, growth * 100, o.collective_s * 1e3,
                static_cast<unsigned long long>(o.collectives_beside));
    if (o.collectives_beside == 0) return 2; // nothing ran beside the kernel: no evidence either way
    return growth <= 0.10 ? 0 : 1;
  }, std::chrono::seconds(300));
  CHECK(st[0] == 0);
}
} // TEST_SUITE("timing")

int main(int argc, char** argv) {
  // --timing: only the timing bars (the suite "timing"); without it, everything else.
  bool timing = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--timing") == 0) timing = true;
    else args.push_back(argv[i]);
  }
  if (timing && braid::gpu_launch::emulated()) {
    std::printf("SKIPPED: the overlap bar is a timing bar and needs a real GPU; this build runs on the %s\n",
                braid::gpu_launch::device_kind());
    return 77;
  }
  // Counting devices initialises CUDA; do it in a child so this process can still fork ranks.
  const auto st = braid::testing::fork_ranks(1, [](int, const braid::unique_id&) { return std::min(gp::device_count(), 100); },
                                             std::chrono::seconds(60));
  g_devices = st[0] > 100 ? 0 : st[0];
  if (g_devices < 1) {
    std::printf("SKIPPED: no CUDA device (the probe child found none): test_gpu_procs did not run\n");
    return 77;
  }
  std::printf("test_gpu_procs: running on the %s; %d device(s); ranks on %s\n", braid::gpu_launch::device_kind(), g_devices,
              std::getenv("BRAID_GPU_PROCS_DEVICES") ? "the devices BRAID_GPU_PROCS_DEVICES names" : "device 0");
  doctest::Context ctx(static_cast<int>(args.size()), args.data());
  ctx.addFilter(timing ? "test-suite" : "test-suite-exclude", "timing");
  return ctx.run();
}
