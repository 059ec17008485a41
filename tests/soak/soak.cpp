// braid-soak — randomized collectives for a set time, every output element checked against a reference
// computed here from the same input formula (not by braid), wrong elements counted.
//
// Usage: braid-soak [--seconds S] [--seed X] [--mode threads|processes|both] [--max-ranks N]
//                   [--epoch SEED --epoch-mode threads|processes --epoch-ranks N]   (replay one epoch)
//
// The run is a sequence of epochs. Each epoch draws (from its own 64-bit seed) the rank count (1..8),
// whether ranks are threads or forked processes, the staging size, and a list of calls: collective,
// element type, operator, algorithm (or automatic), count (0, tiny, primes, up to 2^18), in-place or
// not, unaligned element offsets, a registered (communicator::alloc) input for processes, the root.
// Every rank draws the same list from the same seed, so all ranks agree without talking.
//
// Checks per call and rank: every output element equals the reference (bit for bit: the inputs are
// small integers, so every partial result any algorithm forms is exact in every type); 64 guard bytes
// before and after every output buffer are untouched; a non-root's output of reduce is untouched; an
// out-of-place input is unchanged. Any braid error, or a rank that does not finish, is a failure too.
// The first failure of an epoch prints its epoch seed, so `--epoch SEED ...` replays it exactly.
// Exit status: 0 when there was no wrong element and no failure. --self-check corrupts one bit per call
// on rank 0 after the call: such a run must fail (the test_soak_self_check CTest test expects it to).
#include <braid/braid.hpp>
#include <support/fork_ranks.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <sys/mman.h>

namespace {

using namespace braid;

std::uint64_t mix(std::uint64_t x) { // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct rng {
  std::uint64_t s;
  std::uint64_t next() { return s = mix(s); }
  std::uint64_t below(std::uint64_t n) { return n ? next() % n : 0; }
  bool chance(int percent) { return below(100) < static_cast<std::uint64_t>(percent); }
};

constexpr dtype soak_types[] = {dtype::int8,    dtype::uint16,   dtype::int32,   dtype::uint64, dtype::float16,
                                dtype::bfloat16, dtype::float32, dtype::float64, dtype::fp8_e4m3};
constexpr op_kind soak_ops[] = {op_kind::sum, op_kind::prod, op_kind::min, op_kind::max, op_kind::avg};
constexpr collective soak_colls[] = {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                                     collective::broadcast, collective::reduce};

struct call_spec {
  collective coll;
  dtype type;
  op_kind op;
  algo algorithm;
  std::size_t count; // elements (per block for reduce_scatter / all_gather)
  bool in_place;
  std::size_t off_in, off_out; // element offsets from a 64-byte aligned base
  bool registered;             // input from communicator::alloc (processes)
  int root;
  std::uint64_t seed;          // input values
};

struct epoch_spec {
  std::uint64_t seed;
  bool processes;
  int nranks;
  std::size_t staging;
  std::vector<call_spec> calls;
};

bool reduces(collective c) {
  return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
}

epoch_spec draw_epoch(std::uint64_t seed, int mode, int max_ranks, int forced_ranks) {
  rng g{seed};
  epoch_spec e;
  e.seed = seed;
  e.processes = mode == 2 ? g.chance(50) : mode == 1;
  e.nranks = forced_ranks > 0 ? forced_ranks : 1 + static_cast<int>(g.below(static_cast<std::uint64_t>(max_ranks)));
  const std::size_t staging[] = {std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{8} << 20};
  e.staging = staging[g.below(3)];
  const int ncalls = 10 + static_cast<int>(g.below(60));
  std::uint64_t bytes = 0;
  for (int i = 0; i < ncalls && bytes < (std::uint64_t{96} << 20); ++i) {
    call_spec c{};
    c.coll = soak_colls[g.below(std::size(soak_colls))];
    c.type = soak_types[g.below(std::size(soak_types))];
    c.op = reduces(c.coll) ? soak_ops[g.below(std::size(soak_ops))] : op_kind::custom;
    std::vector<algo> algos{algo::automatic};
    for (algo a : all_algos)
      if (supports(a, c.coll)) algos.push_back(a);
    c.algorithm = algos[g.below(algos.size())];
    const auto size_class = g.below(100);
    const std::size_t primes[] = {7, 13, 251, 1021, 4099, 65537, 1000003};
    if (size_class < 5) c.count = 0;
    else if (size_class < 25) c.count = 1 + g.below(16);
    else if (size_class < 40) c.count = primes[g.below(std::size(primes) - (c.coll == collective::all_reduce ? 0 : 1))];
    else if (size_class < 80) c.count = 1 + g.below(4096);
    else c.count = 1 + g.below(std::size_t{1} << 18);
    if (c.coll == collective::reduce_scatter || c.coll == collective::all_gather) c.count = std::max<std::size_t>(c.count / static_cast<std::size_t>(e.nranks), c.count ? 1 : 0);
    c.in_place = g.chance(30);
    c.off_in = g.below(4);
    c.off_out = c.in_place ? c.off_in : g.below(4);
    c.registered = e.processes && !c.in_place && g.chance(25);
    c.root = static_cast<int>(g.below(static_cast<std::uint64_t>(e.nranks)));
    c.seed = g.next();
    const std::size_t blocks = (c.coll == collective::reduce_scatter || c.coll == collective::all_gather) ? static_cast<std::size_t>(e.nranks) : 1;
    bytes += c.count * blocks * size_of(c.type);
    e.calls.push_back(c);
  }
  return e;
}

// Input element g of rank r: a small integer chosen so that every partial result is exact in T.
template <class T> long long input_int(const call_spec& c, int nranks, int r, std::size_t g) {
  const std::uint64_t h = mix(c.seed ^ mix(static_cast<std::uint64_t>(r) * 0x100000001b3ull + g));
  constexpr bool is_unsigned = std::is_integral_v<T> && std::is_unsigned_v<T>;
  constexpr bool tiny = sizeof(T) == 1 && !std::is_integral_v<T>; // fp8: integers exact up to 16
  switch (c.op) {
  case op_kind::prod: { // ±1 everywhere except one rank per element, which gives 2 or 3
    const int special = static_cast<int>((g + c.seed) % static_cast<std::uint64_t>(nranks));
    if (r == special) return 2 + static_cast<long long>(h % 2);
    return is_unsigned || (h & 1) ? 1 : -1;
  }
  case op_kind::min:
  case op_kind::max: return is_unsigned ? static_cast<long long>(h % 9) : static_cast<long long>(h % 9) - 4;
  default:
    if (tiny) return static_cast<long long>(h % 3) - 1;
    return is_unsigned ? static_cast<long long>(h % 5) : static_cast<long long>(h % 5) - 2;
  }
}

template <class T> T from_int(long long v) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(v);
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(v);
  else return T(static_cast<float>(v));
}

// Copy collectives move arbitrary bits: input element g of rank r is a hash.
template <class T> T input_bits(const call_spec& c, int r, std::size_t g) {
  T t;
  unsigned char b[sizeof(T)];
  std::uint64_t h = mix(c.seed ^ mix(static_cast<std::uint64_t>(r) * 0x9e3779b97f4a7c15ull + g + 1));
  for (std::size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<unsigned char>(h >> (8 * (i % 8)));
  std::memcpy(&t, b, sizeof(T));
  return t;
}

template <class T> T input_value(const call_spec& c, int nranks, int r, std::size_t g) {
  return reduces(c.coll) ? from_int<T>(input_int<T>(c, nranks, r, g)) : input_bits<T>(c, r, g);
}

// The reference: reduction over ranks of input element g, in exact integer arithmetic, converted once.
template <class T, class Op> T expected_reduction(const call_spec& c, int n, std::size_t g) {
  long long acc = input_int<T>(c, n, 0, g);
  for (int r = 1; r < n; ++r) {
    const long long x = input_int<T>(c, n, r, g);
    switch (c.op) {
    case op_kind::prod: acc *= x; break;
    case op_kind::min: acc = std::min(acc, x); break;
    case op_kind::max: acc = std::max(acc, x); break;
    default: acc += x; break;
    }
  }
  if (c.op != op_kind::avg) return from_int<T>(acc);
  if constexpr (std::is_integral_v<T>) return static_cast<T>(acc / n); // truncation toward zero
  else {
    using A = accumulator_t<T, Op>;
    return static_cast<T>(static_cast<A>(static_cast<A>(acc) / static_cast<A>(n)));
  }
}

constexpr std::size_t guard = 64;
constexpr unsigned char canary = 0xA5;

struct region { // an element range inside a byte buffer with guards on both sides
  std::vector<unsigned char> raw;
  std::size_t begin = 0, bytes = 0;
  void make(std::size_t nbytes, std::size_t offset_bytes) {
    raw.assign(guard + offset_bytes + nbytes + guard + 64, canary);
    const auto base = reinterpret_cast<std::uintptr_t>(raw.data());
    const std::size_t align = (64 - base % 64) % 64;
    begin = align + guard + offset_bytes;
    bytes = nbytes;
  }
  unsigned char* data() { return raw.data() + begin; }
  std::size_t guards_damaged() const {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < begin; ++i) bad += raw[i] != canary;
    for (std::size_t i = begin + bytes; i < raw.size(); ++i) bad += raw[i] != canary;
    return bad;
  }
};

// --self-check: rank 0 flips one bit of one output element after every call with output, so a run
// must report wrong elements (proves the checker can fail).
bool corrupt = false;

struct tally {
  std::atomic<long long> calls{0}, elements{0}, wrong{0}, failures{0}, unsupported{0};
  std::atomic<int> printed{0};
};

void report(tally& t, const epoch_spec& e, std::size_t i, int rank, const std::string& what) {
  if (t.printed.fetch_add(1) >= 4) return;
  const call_spec& c = e.calls[i];
  std::fprintf(stderr,
               "soak FAILURE: epoch %#" PRIx64 " (%s, %d ranks, staging %zu) call %zu: %s %s %s algo=%s count=%zu%s "
               "off=%zu/%zu%s root=%d, rank %d: %s\n",
               e.seed, e.processes ? "processes" : "threads", e.nranks, e.staging, i, std::string(name(c.coll)).c_str(),
               std::string(name(c.type)).c_str(), std::string(name(c.op)).c_str(), std::string(name(c.algorithm)).c_str(),
               c.count, c.in_place ? " in-place" : "", c.off_in, c.off_out, c.registered ? " registered" : "", c.root,
               rank, what.c_str());
}

template <class T, class Op>
void run_call(communicator& comm, const epoch_spec& e, std::size_t i, Op op, tally& t) {
  const call_spec& c = e.calls[i];
  const int n = e.nranks, r = comm.rank();
  const bool blocked = c.coll == collective::reduce_scatter || c.coll == collective::all_gather;
  const std::size_t nb = blocked ? static_cast<std::size_t>(n) : 1;
  const std::size_t in_n = c.coll == collective::reduce_scatter ? c.count * nb : c.count;
  const std::size_t out_n = c.coll == collective::all_gather ? c.count * nb : c.count;
  // Input global index of local input element k (all_gather: rank r's block; others: k).
  region out, in;
  buffer<T> reg;
  T* inp = nullptr;
  T* outp = nullptr;
  if (c.in_place) {
    const std::size_t total = std::max(in_n, out_n);
    out.make(total * sizeof(T), c.off_out * sizeof(T));
    T* base = reinterpret_cast<T*>(out.data());
    if (c.coll == collective::reduce_scatter) { inp = base; outp = base + static_cast<std::size_t>(r) * c.count; }
    else if (c.coll == collective::all_gather) { outp = base; inp = base + static_cast<std::size_t>(r) * c.count; }
    else { inp = outp = base; }
    // The whole buffer starts as this rank's input where it is read, canary elsewhere.
    for (std::size_t k = 0; k < in_n; ++k) inp[k] = input_value<T>(c, n, r, k);
  } else {
    out.make(out_n * sizeof(T), c.off_out * sizeof(T));
    outp = reinterpret_cast<T*>(out.data());
    if (c.registered) {
      reg = comm.alloc<T>(in_n + c.off_in);
      inp = reg.data() + c.off_in;
    } else {
      in.make(in_n * sizeof(T), c.off_in * sizeof(T));
      inp = reinterpret_cast<T*>(in.data());
    }
    for (std::size_t k = 0; k < in_n; ++k) inp[k] = input_value<T>(c, n, r, k);
  }
  if (c.count == 0) { inp = nullptr; outp = nullptr; } // zero counts may pass null pointers
  const std::vector<unsigned char> out_before(out.raw); // to prove a non-root's reduce output is untouched
  const call_options co{c.algorithm};
  try {
    switch (c.coll) {
    case collective::all_reduce: comm.all_reduce(inp, outp, c.count, op, co); break;
    case collective::reduce_scatter: comm.reduce_scatter(inp, outp, c.count, op, co); break;
    case collective::all_gather: comm.all_gather(inp, outp, c.count, co); break;
    case collective::broadcast: comm.broadcast(inp, outp, c.count, c.root, co); break;
    case collective::reduce: comm.reduce(inp, outp, c.count, c.root, op, co); break;
    default: break;
    }
  } catch (const unsupported_error& ex) { // raised before anything moved, on every rank alike
    if (r == 0) ++t.unsupported;
    return;
  }
  ++t.calls;
  if (c.count == 0) {
    if (out.raw != out_before) { ++t.wrong; report(t, e, i, r, "a zero-count call changed memory"); }
    return;
  }
  if (corrupt && r == 0 && out_n && (c.coll != collective::reduce || r == c.root))
    reinterpret_cast<unsigned char*>(outp)[(out_n / 2) * sizeof(T)] ^= 1;
  long long wrong = 0;
  std::size_t first_bad = SIZE_MAX;
  auto check = [&](std::size_t k, const T& want) {
    if (std::memcmp(&outp[k], &want, sizeof(T)) != 0) {
      ++wrong;
      if (first_bad == SIZE_MAX) first_bad = k;
    }
  };
  switch (c.coll) {
  case collective::all_reduce:
    for (std::size_t k = 0; k < c.count; ++k) check(k, expected_reduction<T, Op>(c, n, k));
    break;
  case collective::reduce_scatter:
    for (std::size_t k = 0; k < c.count; ++k) check(k, expected_reduction<T, Op>(c, n, static_cast<std::size_t>(r) * c.count + k));
    break;
  case collective::all_gather:
    for (int q = 0; q < n; ++q)
      for (std::size_t k = 0; k < c.count; ++k) check(static_cast<std::size_t>(q) * c.count + k, input_bits<T>(c, q, k));
    break;
  case collective::broadcast:
    for (std::size_t k = 0; k < c.count; ++k) check(k, input_bits<T>(c, c.root, k));
    break;
  case collective::reduce:
    if (r == c.root) {
      for (std::size_t k = 0; k < c.count; ++k) check(k, expected_reduction<T, Op>(c, n, k));
    } else if (out.raw != out_before) {
      for (std::size_t k = 0; k < out.raw.size(); ++k) wrong += out.raw[k] != out_before[k];
      first_bad = 0;
    }
    break;
  default: break;
  }
  const std::size_t damaged = out.guards_damaged() + (in.raw.empty() ? 0 : in.guards_damaged());
  std::size_t changed_input = 0;
  if (!c.in_place)
    for (std::size_t k = 0; k < in_n; ++k) {
      const T want = input_value<T>(c, n, r, k);
      changed_input += std::memcmp(&inp[k], &want, sizeof(T)) != 0;
    }
  t.elements += static_cast<long long>(out_n);
  if (wrong || damaged || changed_input) {
    t.wrong += wrong + static_cast<long long>(damaged + changed_input);
    report(t, e, i, r, std::to_string(wrong) + " wrong elements (first at " + std::to_string(first_bad) + "), " +
                           std::to_string(damaged) + " guard bytes damaged, " + std::to_string(changed_input) +
                           " input elements changed");
  }
}

void run_epoch_rank(communicator& comm, const epoch_spec& e, tally& t) {
  for (std::size_t i = 0; i < e.calls.size(); ++i) {
    const call_spec& c = e.calls[i];
    visit(c.type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint16_t> || std::is_same_v<T, std::int32_t> ||
                    std::is_same_v<T, std::uint64_t> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16> ||
                    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, fp8_e4m3>) {
        if (reduces(c.coll)) visit(c.op, [&](auto op) { run_call<T>(comm, e, i, op, t); });
        else run_call<T>(comm, e, i, sum<>{}, t);
      }
    });
  }
}

struct shared_tally { // processes report through an anonymous shared mapping
  std::atomic<long long> calls, elements, wrong, failures, unsupported;
};

struct totals {
  long long epochs = 0, calls = 0, elements = 0, wrong = 0, failures = 0, unsupported = 0;
  long long thread_epochs = 0, process_epochs = 0;
};

void run_epoch(const epoch_spec& e, totals& tot) {
  tally t;
  options opts;
  opts.timeout = std::chrono::seconds(60); // a hang becomes a timeout error, counted as a failure
  opts.staging_bytes = e.staging;
  if (!e.processes) {
    opts.zero_copy_min_bytes = (e.seed & 1) ? std::size_t{1} << 12 : std::size_t{256} << 10;
    try {
      run_threads(e.nranks, [&](communicator& c) { run_epoch_rank(c, e, t); }, opts);
    } catch (const std::exception& ex) {
      ++t.failures;
      std::fprintf(stderr, "soak FAILURE: epoch %#" PRIx64 " (threads, %d ranks): %s\n", e.seed, e.nranks, ex.what());
    }
    ++tot.thread_epochs;
  } else {
    void* mem = ::mmap(nullptr, sizeof(shared_tally), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) { std::perror("mmap"); std::exit(2); }
    auto* st = new (mem) shared_tally{};
    const auto status = braid::testing::fork_ranks(e.nranks, [&](int rank, const unique_id& id) {
      communicator c = communicator::join(id, rank, e.nranks, opts);
      run_epoch_rank(c, e, t);
      st->calls += t.calls; st->elements += t.elements; st->wrong += t.wrong; st->unsupported += t.unsupported;
      return 0;
    }, std::chrono::seconds(300));
    for (int r = 0; r < e.nranks; ++r)
      if (status[static_cast<std::size_t>(r)] != 0) {
        ++t.failures;
        std::fprintf(stderr, "soak FAILURE: epoch %#" PRIx64 " (processes, %d ranks): rank %d exited with status %d\n",
                     e.seed, e.nranks, r, status[static_cast<std::size_t>(r)]);
      }
    t.calls = st->calls.load(); t.elements = st->elements.load(); t.wrong = st->wrong.load(); t.unsupported = st->unsupported.load();
    ::munmap(mem, sizeof(shared_tally));
    ++tot.process_epochs;
  }
  ++tot.epochs;
  tot.calls += t.calls; tot.elements += t.elements; tot.wrong += t.wrong; tot.failures += t.failures;
  tot.unsupported += t.unsupported;
  if (t.wrong || t.failures)
    std::fprintf(stderr, "soak: replay with: braid-soak --epoch %#" PRIx64 " --epoch-mode %s --epoch-ranks %d\n", e.seed,
                 e.processes ? "processes" : "threads", e.nranks);
}

} // namespace

int main(int argc, char** argv) {
  double seconds = 60;
  std::uint64_t seed = 0;
  bool have_seed = false;
  int mode = 2, max_ranks = 8, epoch_ranks = 0;
  std::uint64_t one_epoch = 0;
  bool replay = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) { std::fprintf(stderr, "braid-soak: %s needs a value\n", argv[i]); std::exit(2); }
      return argv[++i];
    };
    auto parse_mode = [](std::string_view m) { return m == "threads" ? 0 : m == "processes" ? 1 : 2; };
    if (a == "--seconds") seconds = std::strtod(value(), nullptr);
    else if (a == "--seed") { seed = std::strtoull(value(), nullptr, 0); have_seed = true; }
    else if (a == "--mode") mode = parse_mode(value());
    else if (a == "--max-ranks") max_ranks = std::clamp(std::atoi(value()), 1, 8);
    else if (a == "--epoch") { one_epoch = std::strtoull(value(), nullptr, 0); replay = true; }
    else if (a == "--epoch-mode") mode = parse_mode(value());
    else if (a == "--epoch-ranks") epoch_ranks = std::atoi(value());
    else if (a == "--self-check") corrupt = true;
    else { std::fprintf(stderr, "usage: braid-soak [--seconds S] [--seed X] [--mode threads|processes|both] [--max-ranks N]\n"
                                "                  [--epoch SEED --epoch-mode M --epoch-ranks N] [--self-check]\n"); return 2; }
  }
  if (!have_seed)
    seed = mix(static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               static_cast<std::uint64_t>(::getpid()));
  totals tot;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  if (replay) {
    std::printf("braid-soak: replaying epoch %#" PRIx64 "\n", one_epoch);
    std::fflush(stdout);
    run_epoch(draw_epoch(one_epoch, mode == 2 ? 0 : mode, max_ranks, epoch_ranks), tot);
  } else {
    std::printf("braid-soak: seed %#" PRIx64 " (reproduce with --seed %#" PRIx64 "), %.0f s, mode %s, up to %d ranks\n", seed,
                seed, seconds, mode == 0 ? "threads" : mode == 1 ? "processes" : "both", max_ranks);
    std::fflush(stdout);
    double next_report = 60;
    for (std::uint64_t k = 0; elapsed() < seconds; ++k) {
      run_epoch(draw_epoch(mix(seed + k), mode, max_ranks, 0), tot);
      if (elapsed() >= next_report) {
        std::printf("braid-soak: %.0f s: %lld epochs, %lld calls, %lld elements checked, %lld wrong, %lld failures\n", elapsed(),
                    tot.epochs, tot.calls, tot.elements, tot.wrong, tot.failures);
        std::fflush(stdout);
        next_report += 60;
      }
    }
  }
  std::printf("braid-soak: done after %.1f s: %lld epochs (%lld threads, %lld processes), %lld calls, %lld elements checked, "
              "%lld wrong elements, %lld failures, %lld calls skipped as unsupported; seed %#" PRIx64 "\n",
              elapsed(), tot.epochs, tot.thread_epochs, tot.process_epochs, tot.calls, tot.elements, tot.wrong, tot.failures,
              tot.unsupported, seed);
  return tot.wrong == 0 && tot.failures == 0 ? 0 : 1;
}
