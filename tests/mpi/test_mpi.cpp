// tests/mpi/test_mpi.cpp — braid::mpi under mpirun: every hierarchical collective against a reference
// computed here, independently, in double precision (integers: exact 64-bit arithmetic).
//
//   mpirun -np N test_mpi [--hosts H] [--uniform 0|1] [--expect-error] [--quick]
//
// tests/mpi/launch.sh sets BRAID_HOST_ID per rank so that one machine plays several hosts; --hosts and
// --uniform say which layout the launch was meant to produce, and the test fails if it got another
// (so a run that silently fell back to one host cannot pass as an inter-host test). --expect-error:
// construction must raise braid::invalid_argument on every rank (a bad BRAID_HOST_ID layout).
// --quick: float, int32 and bfloat16 only (every operator and collective), for the layouts that
// repeat paths another layout already covers with every type.
//
// Inputs are small integers (|x| <= 2, products of at most a few factors of 2) so that every partial
// result of any order is exact in every tested type: reductions must equal the reference bit for bit.
// One more case sums random floats, where the order matters: there every rank must hold the same bits
// and each element must lie within count-of-ranks * 2^-23 * sum|x| of the exact sum.
// Exit status 0 when every rank saw every check pass, 1 otherwise.
//
// Built a second time as test_mpi_cuda (BRAID_TEST_MPI_CUDA, on braid's emulated CUDA device): every
// check then runs on braid::mpi::cuda_communicator through device_comm below, which copies each call's
// arguments to device memory and the output back; a few more checks (cuda_checks) compare its bits
// with braid::mpi::communicator's on the same random floats and count the all_reduce pipeline's chunks;
// check_rounds counts its MPI calls as the host build's.
#include <braid/mpi.hpp>
#ifdef BRAID_TEST_MPI_CUDA
#include <braid/mpi/cuda.cuh>
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>
#include <type_traits>

#include <unistd.h>

namespace {

long failures = 0;
std::string first_failure;
int world_rank = 0, world_size = 1;

void fail(const std::string& what) {
  if (!failures) first_failure = what;
  ++failures;
}

// Rank q's input at index i for operator k (small integers; see the file comment).
int value(braid::op_kind k, int q, std::uint64_t i) {
  if (k == braid::op_kind::prod) {
    const int m = static_cast<int>((i + static_cast<std::uint64_t>(q)) % 5);
    return m == 0 ? 2 : (m == 1 ? -1 : 1);
  }
  return static_cast<int>((i * 7 + static_cast<std::uint64_t>(q) * 3) % 5) - 2;
}

template <class T> T make(int v) {
  if constexpr (std::is_integral_v<T> || std::is_floating_point_v<T>) return static_cast<T>(v);
  else return T(static_cast<float>(v));
}

template <class T> double as_double(const T& x) {
  if constexpr (std::is_integral_v<T> || std::is_floating_point_v<T>) return static_cast<double>(x);
  else return static_cast<double>(static_cast<float>(x));
}

// The reference for element i of a reduction over all ranks, as T.
template <class T, class Op> T reference(braid::op_kind k, std::uint64_t i) {
  using A = braid::accumulator_t<T, Op>;
  const int n = world_size;
  double acc = value(k, 0, i);
  for (int q = 1; q < n; ++q) {
    const double x = value(k, q, i);
    switch (k) {
    case braid::op_kind::prod: acc *= x; break;
    case braid::op_kind::min: acc = std::min(acc, x); break;
    case braid::op_kind::max: acc = std::max(acc, x); break;
    default: acc += x; break;
    }
  }
  if (k == braid::op_kind::avg) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<long long>(acc) / n); // truncates
    else return static_cast<T>(static_cast<A>(static_cast<A>(acc) / static_cast<A>(n)));
  }
  return make<T>(static_cast<int>(acc));
}

#ifdef BRAID_TEST_MPI_CUDA
// braid::mpi::cuda_communicator behind braid::mpi::communicator's host-pointer calls. Each call copies
// the input and the output's current contents to device memory (one allocation where they overlap, as
// in-place calls do), runs on the device, synchronises, raises what a kernel recorded, and copies the
// output back. 64 guard bytes after the device copy must come back unchanged (no write past the end).
class device_comm {
public:
  explicit device_comm(MPI_Comm w, const braid::mpi::cuda_options& o = {}) : c_(w, -1, o) {
    BRAID_CUDA_CHECK(cudaSetDevice(c_.device()));
    BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  device_comm(const device_comm&) = delete;
  device_comm& operator=(const device_comm&) = delete;
  ~device_comm() { cudaStreamDestroy(s_); }
  braid::mpi::cuda_communicator& get() { return c_; }
  cudaStream_t stream() const { return s_; }
  int size() const { return c_.size(); }
  int rank() const { return c_.rank(); }
  int hosts() const { return c_.hosts(); }
  int host() const { return c_.host(); }
  int local_size() const { return c_.local_size(); }
  int local_rank() const { return c_.local_rank(); }
  bool uniform() const { return c_.uniform(); }
  const braid::mpi::host_layout& layout() const { return c_.layout(); }

  template <class T, class Op = braid::sum<>> void all_reduce(const T* in, T* out, std::size_t count, Op op = {}) {
    run(in, count, out, count, [&](const T* i, T* o) { c_.all_reduce(i, o, count, op, s_); });
  }
  template <class T, class Op = braid::sum<>> void reduce(const T* in, T* out, std::size_t count, int root, Op op = {}) {
    run(in, count, out, count, [&](const T* i, T* o) { c_.reduce(i, o, count, root, op, s_); });
  }
  template <class T, class Op = braid::sum<>> void reduce_scatter(const T* in, T* out, std::size_t rc, Op op = {}) {
    run(in, rc * static_cast<std::size_t>(size()), out, rc, [&](const T* i, T* o) { c_.reduce_scatter(i, o, rc, op, s_); });
  }
  template <class T> void all_gather(const T* in, T* out, std::size_t sc) {
    run(in, sc, out, sc * static_cast<std::size_t>(size()), [&](const T* i, T* o) { c_.all_gather(i, o, sc, s_); });
  }
  template <class T> void broadcast(const T* in, T* out, std::size_t count, int root) {
    run(in, count, out, count, [&](const T* i, T* o) { c_.broadcast(i, o, count, root, s_); });
  }
  template <class T, class Op = braid::sum<>> void reduce_scatter(std::span<const T> in, std::span<T> out, Op op = {}) {
    run(in.data(), in.size(), out.data(), out.size(),
        [&](const T* i, T* o) { c_.reduce_scatter(std::span<const T>(i, in.size()), std::span<T>(o, out.size()), op, s_); });
  }
  template <class T> void all_gather(std::span<const T> in, std::span<T> out) {
    run(in.data(), in.size(), out.data(), out.size(),
        [&](const T* i, T* o) { c_.all_gather(std::span<const T>(i, in.size()), std::span<T>(o, out.size()), s_); });
  }
  void barrier() { c_.barrier(s_); }

private:
  template <class T, class F> void run(const T* in, std::size_t nin, T* out, std::size_t nout, F&& f) {
    const auto a = reinterpret_cast<std::uintptr_t>(in), b = reinterpret_cast<std::uintptr_t>(out);
    const std::size_t ib = nin * sizeof(T), ob = nout * sizeof(T);
    const bool joint = in && out && a < b + ob && b < a + ib; // overlapping ranges: one device copy
    const std::uintptr_t lo = joint ? std::min(a, b) : 0, hi = joint ? std::max(a + ib, b + ob) : 0;
    const std::size_t bytes = joint ? hi - lo : ib + ob;
    std::byte* d = nullptr;
    BRAID_CUDA_CHECK(cudaMalloc(&d, bytes + guard));
    std::byte* din = !in ? nullptr : joint ? d + (a - lo) : d;
    std::byte* dout = !out ? nullptr : joint ? d + (b - lo) : d + ib;
    // On the call's stream: it does not wait for the legacy default stream (cudaStreamNonBlocking),
    // so a plain cudaMemcpy could still be landing when the call's first kernel reads.
    if (in) BRAID_CUDA_CHECK(cudaMemcpyAsync(din, in, ib, cudaMemcpyHostToDevice, s_));
    if (out) BRAID_CUDA_CHECK(cudaMemcpyAsync(dout, out, ob, cudaMemcpyHostToDevice, s_));
    BRAID_CUDA_CHECK(cudaMemsetAsync(d + bytes, 0x5a, guard, s_));
    struct freer {
      std::byte* p;
      ~freer() { cudaFree(p); }
    } fr{d};
    try {
      f(reinterpret_cast<const T*>(din), reinterpret_cast<T*>(dout));
      BRAID_CUDA_CHECK(cudaStreamSynchronize(s_));
      c_.check();
    } catch (...) {
      // A failed call (a mismatch) must not have written past its buffers either.
      (void)cudaStreamSynchronize(s_);
      (void)cudaGetLastError();
      check_guard(d + bytes);
      throw;
    }
    if (out) BRAID_CUDA_CHECK(cudaMemcpyAsync(out, dout, ob, cudaMemcpyDeviceToHost, s_));
    check_guard(d + bytes);
  }
  static constexpr std::size_t guard = 64;
  void check_guard(const std::byte* g) {
    unsigned char tail[guard];
    BRAID_CUDA_CHECK(cudaMemcpyAsync(tail, g, guard, cudaMemcpyDeviceToHost, s_));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(s_));
    for (unsigned char x : tail)
      if (x != 0x5a) {
        fail(std::string("a call wrote past the end of its device buffers on rank ") + std::to_string(world_rank));
        break;
      }
  }

  braid::mpi::cuda_communicator c_;
  cudaStream_t s_ = nullptr;
};
using comm_type = device_comm;
#else
using comm_type = braid::mpi::communicator;
#endif

template <class T> bool same_bits(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

template <class T> std::string label(const char* what, braid::op_kind k, std::size_t count, bool in_place) {
  return std::string(what) + " " + std::string(braid::name(braid::dtype_of_v<T>)) + " " + std::string(braid::name(k)) +
         " count " + std::to_string(count) + (in_place ? " in-place" : "") + " on rank " + std::to_string(world_rank);
}

template <class T, class Op> void check_reductions(comm_type& c, braid::op_kind k, std::size_t count) {
  const int n = world_size, r = world_rank;
  const std::size_t N = static_cast<std::size_t>(n);
  const T poison = make<T>(99);
  for (bool in_place : {false, true}) {
    // all_reduce
    {
      std::vector<T> in(count + 1), out(count + 1, poison);
      for (std::size_t i = 0; i < count; ++i) in[i] = make<T>(value(k, r, i));
      T* dst = in_place ? in.data() : out.data();
      c.all_reduce(in.data(), dst, count, Op{});
      long bad = 0;
      for (std::size_t i = 0; i < count; ++i) bad += !same_bits(dst[i], reference<T, Op>(k, i));
      if (!same_bits(dst[count], in_place ? T{} : poison)) ++bad; // nothing written past the end
      if (bad) fail(label<T>("all_reduce", k, count, in_place) + ": " + std::to_string(bad) + " wrong");
    }
    // reduce_scatter: block b of the input holds indices b*count .. b*count+count-1
    {
      std::vector<T> in(N * count + 1), out(count + 1, poison);
      for (std::size_t i = 0; i < N * count; ++i) in[i] = make<T>(value(k, r, i));
      T* dst = in_place ? in.data() + static_cast<std::size_t>(r) * count : out.data();
      c.reduce_scatter(in.data(), dst, count, Op{});
      long bad = 0;
      for (std::size_t i = 0; i < count; ++i)
        bad += !same_bits(dst[i], reference<T, Op>(k, static_cast<std::uint64_t>(r) * count + i));
      if (!in_place && !same_bits(out[count], poison)) ++bad;
      if (bad) fail(label<T>("reduce_scatter", k, count, in_place) + ": " + std::to_string(bad) + " wrong");
    }
    // reduce to the last rank
    if (!in_place) {
      const int root = n - 1;
      std::vector<T> in(count + 1), out(count + 1, poison);
      for (std::size_t i = 0; i < count; ++i) in[i] = make<T>(value(k, r, i));
      c.reduce(in.data(), out.data(), count, root, Op{});
      long bad = 0;
      for (std::size_t i = 0; i < count; ++i) bad += r == root ? !same_bits(out[i], reference<T, Op>(k, i)) : !same_bits(out[i], poison);
      if (bad) fail(label<T>("reduce", k, count, false) + ": " + std::to_string(bad) + " wrong");
    }
  }
}

template <class T> void check_copies(comm_type& c, std::size_t count) {
  const int n = world_size, r = world_rank;
  const std::size_t N = static_cast<std::size_t>(n);
  auto bits = [](int q, std::size_t i) { // arbitrary bit patterns, NaNs included: copies move bytes
    T t;
    std::uint64_t h = (static_cast<std::uint64_t>(q) + 1) * 0x9E3779B97F4A7C15ULL ^ (i + 1) * 0xD1B54A32D192ED03ULL;
    h ^= h >> 29;
    std::memcpy(&t, &h, sizeof(T));
    return t;
  };
  for (bool in_place : {false, true}) {
    std::vector<T> out(N * count + 1, make<T>(99)), in(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = bits(r, i);
    const T* src = in.data();
    if (in_place) {
      std::memcpy(static_cast<void*>(out.data() + static_cast<std::size_t>(r) * count), in.data(), count * sizeof(T));
      src = out.data() + static_cast<std::size_t>(r) * count;
    }
    c.all_gather(src, out.data(), count);
    long bad = 0;
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < count; ++i) bad += !same_bits(out[static_cast<std::size_t>(q) * count + i], bits(q, i));
    if (bad) fail(label<T>("all_gather", braid::op_kind::custom, count, in_place) + ": " + std::to_string(bad) + " wrong");
    for (int root = 0; root < n; ++root) {
      std::vector<T> b(count + 1, make<T>(99)), src2(count);
      for (std::size_t i = 0; i < count; ++i) src2[i] = bits(root + 100, i);
      if (in_place && r == root) b.assign(src2.begin(), src2.end()), b.push_back(make<T>(99));
      c.broadcast(in_place ? b.data() : src2.data(), b.data(), count, root);
      long wrong = 0;
      for (std::size_t i = 0; i < count; ++i) wrong += !same_bits(b[i], bits(root + 100, i));
      if (wrong) fail(label<T>("broadcast", braid::op_kind::custom, count, in_place) + " root " + std::to_string(root) + ": " + std::to_string(wrong) + " wrong");
    }
  }
}

template <class T> void check_type(comm_type& c, const std::vector<std::size_t>& counts) {
  for (std::size_t count : counts) {
#ifdef BRAID_TEST_MPI_CUDA
    // The device build: every operator on float, sum and the copies on the other types (each
    // operator x type is a kernel instantiation; this keeps the emulated build short).
    if constexpr (!std::is_same_v<T, float>) {
      check_reductions<T, braid::sum<>>(c, braid::op_kind::sum, count);
      check_copies<T>(c, count);
      continue;
    }
#endif
    check_reductions<T, braid::sum<>>(c, braid::op_kind::sum, count);
    check_reductions<T, braid::prod<>>(c, braid::op_kind::prod, count);
    check_reductions<T, braid::min<>>(c, braid::op_kind::min, count);
    check_reductions<T, braid::max<>>(c, braid::op_kind::max, count);
    check_reductions<T, braid::avg<>>(c, braid::op_kind::avg, count);
    check_copies<T>(c, count);
  }
}

// Random floats: the order matters, so the result must be the same bits on every rank and close to
// the exact sum.
void check_rounding(comm_type& c, std::size_t count) {
  std::vector<float> in(count), out(count), rs(count / static_cast<std::size_t>(world_size));
  auto x = [](int q, std::size_t i) {
    std::mt19937 g(static_cast<unsigned>(q * 1000003 + static_cast<int>(i % 100000)));
    return std::uniform_real_distribution<float>(-1.0f, 1.0f)(g);
  };
  for (std::size_t i = 0; i < count; ++i) in[i] = x(world_rank, i);
  c.all_reduce(in.data(), out.data(), count, braid::sum<>{});
  long bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double exact = 0, mag = 0;
    for (int q = 0; q < world_size; ++q) exact += x(q, i), mag += std::fabs(x(q, i));
    if (std::fabs(out[i] - exact) > world_size * std::ldexp(mag, -23)) ++bad;
  }
  if (bad) fail("all_reduce random float: " + std::to_string(bad) + " outside the rounding bound on rank " + std::to_string(world_rank));
  // identical bits everywhere: compare with rank 0's result
  std::vector<float> zero(out);
  MPI_Bcast(zero.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (std::memcmp(zero.data(), out.data(), count * sizeof(float)) != 0) fail("all_reduce random float: bits differ from rank 0 on rank " + std::to_string(world_rank));
  // reduce_scatter (span form): with hosts of at most 2 ranks the order is fully documented (one
  // commutative addition inside a host, then host order), so its block must equal the matching part
  // of all_reduce's result bit for bit.
  const std::size_t b = rs.size();
  c.reduce_scatter(std::span<const float>(in.data(), b * static_cast<std::size_t>(world_size)), std::span<float>(rs));
  if (c.uniform() && c.hosts() > 1 && c.local_size() <= 2 && std::memcmp(rs.data(), out.data() + static_cast<std::size_t>(world_rank) * b, b * sizeof(float)) != 0)
    fail("reduce_scatter random float: block differs from all_reduce's on rank " + std::to_string(world_rank));
}

// A user struct and functor (max with index): MPI moves bytes, braid's loop reduces.
struct value_index {
  float v;
  int i;
};
struct argmax {
  value_index operator()(const value_index& a, const value_index& b) const { return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a; }
};
void check_custom(comm_type& c) {
  const std::size_t count = 1001;
  std::vector<value_index> in(count), out(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = {static_cast<float>((i + static_cast<std::size_t>(world_rank)) % 3), world_rank};
  c.all_reduce(in.data(), out.data(), count, argmax{});
  long bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    value_index want{-1, 0};
    for (int q = 0; q < world_size; ++q) {
      const value_index v{static_cast<float>((i + static_cast<std::size_t>(q)) % 3), q};
      if (v.v > want.v) want = v;
    }
    bad += out[i].v != want.v || out[i].i != want.i;
  }
  if (bad) fail("all_reduce argmax struct: " + std::to_string(bad) + " wrong on rank " + std::to_string(world_rank));
  // bf16 data summed in float (rank 0 gives 256, the others 1): the documented order is each host's
  // partial rounded to bf16, then the partials summed in float in host order and rounded once. Checked
  // where that order is fully known: several hosts of at most two ranks (one rounding inside a host).
  const auto& L = c.layout();
  bool known = L.hosts > 1;
  for (int s : L.host_size) known = known && s <= 2;
  if (known) {
    auto x = [](int q) { return q == 0 ? 256.0f : 1.0f; };
    std::vector<braid::bfloat16> b(17, braid::bfloat16(x(world_rank))), s(17);
    c.all_reduce(b.data(), s.data(), b.size(), braid::sum<float>{});
    float total = 0;
    for (const auto& m : L.members) {
      float part = 0;
      for (int q : m) part += x(q);
      total += static_cast<float>(braid::bfloat16(part));
    }
    const float want = static_cast<float>(braid::bfloat16(total));
    for (const auto& v : s)
      if (static_cast<float>(v) != want)
        fail("bf16 sum<float>: got " + std::to_string(static_cast<float>(v)) + ", want " + std::to_string(want));
  }
}

void check_errors(comm_type& c) {
  std::vector<float> x(8);
  bool raised = false;
  try {
    c.broadcast(x.data(), x.data(), x.size(), world_size); // root out of range on every rank
  } catch (const braid::invalid_argument&) {
    raised = true;
  }
  if (!raised) fail("broadcast with root == size did not raise invalid_argument");
  raised = false;
  try {
    c.all_reduce(static_cast<const float*>(nullptr), x.data(), x.size());
  } catch (const braid::invalid_argument&) {
    raised = true;
  }
  if (!raised) fail("all_reduce with a null input did not raise invalid_argument");
  raised = false;
  try {
    std::vector<int> a(3), b(3); // out must hold size() * 3
    c.all_gather(std::span<const int>(a), std::span<int>(b));
  } catch (const braid::invalid_argument&) {
    raised = world_size > 1;
  }
  if (!raised && world_size > 1) fail("all_gather span with a short output did not raise invalid_argument");
  // bad arguments leave the communicator usable
  std::vector<int> one{world_rank}, all(static_cast<std::size_t>(world_size));
  c.all_gather(std::span<const int>(one), std::span<int>(all));
  for (int q = 0; q < world_size; ++q)
    if (all[static_cast<std::size_t>(q)] != q) fail("all_gather after argument errors: wrong");
  c.barrier();
}

// An empty communicator of type C (default-constructed, or moved from) refuses every call with
// usage_error naming its class; `live` (moved out and back in) keeps its layout and its call count.
template <class C> void check_empty(C& live, const char* kind) {
  const auto refuses = [&](const C& e, const std::string& where) {
    try {
      (void)e.rank();
      fail(where + ": rank() of an empty " + kind + " did not raise");
    } catch (const braid::usage_error& x) {
      if (!std::strstr(x.what(), (std::string("braid::mpi::") + kind + " is empty").c_str()))
        fail(where + ": the message does not name the empty " + std::string(kind) + ": " + x.what());
    }
  };
  C fresh;
  if (fresh.valid()) fail(std::string("a default-constructed ") + kind + " is valid");
  refuses(fresh, "default-constructed");
  const std::uint64_t calls = live.calls();
  C moved(std::move(live));
  refuses(live, "moved from");
  if (!moved.valid() || moved.calls() != calls || moved.rank() != world_rank || moved.size() != world_size)
    fail(std::string("a moved ") + kind + " lost its state");
  live = std::move(moved);
  refuses(moved, "moved out by assignment");
  if (!live.valid() || live.calls() != calls) fail(std::string("a ") + kind + " moved back lost its state");
}

// --mismatch KIND: the hosts make different calls (each host consistent inside itself, so only the
// inter-host stage can see it) and every rank must raise braid::mismatch_error, write nothing past
// its buffers, and then refuse further calls (usage_error). Kinds (odd hosts differ from even ones):
//   count       all_reduce of 1000 floats against 1500 (both above the check's inline bytes)
//   count-small all_reduce of 8 floats against 1500 (one side's data rides in the check, the other's not)
//   collective  all_reduce against all_gather of 100 floats
//   root        broadcast from rank 0 against rank 1 (hosts of another local rank than 0's: hosts differ)
//   root-local  broadcast from rank 0 against the last rank (another host, another local rank)
//   count-large all_reduce of 100000 floats against 150000 (data messages beside the check's blocks,
//               large enough for MPI's rendezvous protocol: each side must drain the other's)
//   collective-large  all_reduce against all_gather of 30000 floats
//   bcast-count broadcast from rank 0 of 40000 floats against 60000 (the root's host sends its data in
//               the check's round; the others expect another size)
//   root-large  broadcast of 40000 floats from rank 0 against rank 1
//   all         each of these, a fresh communicator for each
// Each kind first runs a matching all_reduce on the same communicator (the check passes, the sum is
// right). A watchdog (SIGALRM, --mismatch-watchdog seconds, default 90) ends a rank that hangs.
// The device build (test_mpi_cuda) runs the same on braid::mpi::cuda_communicator through device_comm:
// there a rank whose part of the call only enqueues work (a host's other ranks on the leader path) may
// raise from the check after synchronising its stream (device_comm does it after each call), and
// "written past a buffer" is device_comm's guard after the device copy.
void check_mismatch(const std::string& kind) {
  comm_type c(MPI_COMM_WORLD);
  const std::string where = "mismatch " + kind + " on rank " + std::to_string(world_rank);
  {
    std::vector<float> x(64, 1.0f);
    c.all_reduce(x.data(), x.data(), x.size());
    for (float v : x)
      if (v != static_cast<float>(world_size)) {
        fail(where + ": the matching all_reduce before it is wrong");
        break;
      }
  }
  // Every rank has ended the matching call (the device build: synchronised and check()ed it) before
  // any starts the mismatched one: on the device path the host group's error record is read whenever
  // check() runs, so a mismatch published by a leader before a slower peer's check() of the previous
  // call would be raised by that check() (documented in docs/guarantees.md).
  MPI_Barrier(MPI_COMM_WORLD);
  const bool odd = c.host() % 2 == 1;
  const float poison = 99.0f;
  constexpr std::size_t tail = 16; // elements after each buffer that must stay poison
  std::size_t in_n = 0, out_n = 0;
  std::function<void(const float*, float*)> call;
  if (kind == "count" || kind == "count-small" || kind == "count-large") {
    const std::size_t n = kind == "count-large" ? (odd ? 150000 : 100000) : odd ? 1500 : (kind == "count" ? 1000 : 8);
    in_n = out_n = n;
    call = [&c, n](const float* i, float* o) { c.all_reduce(i, o, n); };
  } else if (kind == "collective" || kind == "collective-large") {
    const std::size_t n = kind == "collective" ? 100 : 30000;
    in_n = n;
    out_n = odd ? n * static_cast<std::size_t>(world_size) : n;
    if (odd) call = [&c, n](const float* i, float* o) { c.all_gather(i, o, n); };
    else call = [&c, n](const float* i, float* o) { c.all_reduce(i, o, n); };
  } else if (kind == "root" || kind == "root-local" || kind == "root-large" || kind == "bcast-count") {
    const int root = !odd || kind == "bcast-count" ? 0 : (kind == "root-local" ? world_size - 1 : 1);
    const std::size_t n = kind == "bcast-count" ? (odd ? 60000 : 40000) : kind == "root-large" ? 40000 : 100;
    in_n = out_n = n;
    call = [&c, root, n](const float* i, float* o) { c.broadcast(i, o, n, root); };
  } else {
    fail("unknown --mismatch kind " + kind);
    return;
  }
  std::vector<float> in(in_n + tail, poison), out(out_n + tail, poison);
  for (std::size_t i = 0; i < in_n; ++i) in[i] = static_cast<float>(world_rank);
  std::string got = "returned normally";
  try {
    call(in.data(), out.data());
  } catch (const braid::mismatch_error& e) {
    got.clear();
    if (world_rank == 0) std::printf("%s: rank 0 raised mismatch_error: %s\n", kind.c_str(), e.what());
  } catch (const braid::error& e) {
    got = std::string("raised ") + braid::to_string(e.code()) + ": " + e.what();
  }
  if (!got.empty()) {
    fail(where + ": " + got + " (want mismatch_error)");
    std::fprintf(stderr, "%s: %s\n", where.c_str(), got.c_str()); // now: a later hang prints nothing more
    std::fflush(stderr);
  }
  for (std::size_t i = 0; i < tail; ++i)
    if (in[in_n + i] != poison || out[out_n + i] != poison) {
      fail(where + ": written past the end of a buffer");
      break;
    }
  bool refused = false;
  try {
    c.barrier();
  } catch (const braid::usage_error&) {
    refused = true;
  } catch (const braid::error&) {
  }
  if (!refused) fail(where + ": the next call was not refused with usage_error");
  MPI_Barrier(MPI_COMM_WORLD);
}

// --- rounds per call: the MPI calls braid::mpi makes, counted through MPI's profiling interface ---
// (this executable's MPI_* definitions replace Open MPI's weak ones and forward to PMPI_*). Blocks
// of the call check count whether sent by MPI_Isend or MPI_Sendrecv (two hosts).
struct mpi_counts {
  long blocks = 0, data = 0, collectives = 0; // the check's blocks and data messages sent; MPI collectives
};
bool counting = false;
mpi_counts counted;
} // namespace

extern "C" {
int MPI_Isend(const void* b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c, MPI_Request* r) {
  if (counting) {
    if (tag == braid::mpi::detail::call_check::block_tag) ++counted.blocks;
    else if (tag == braid::mpi::detail::call_check::data_tag) ++counted.data;
  }
  return PMPI_Isend(b, n, t, dest, tag, c, r);
}
int MPI_Sendrecv(const void* sb, int sn, MPI_Datatype st, int dest, int stag, void* rb, int rn, MPI_Datatype rt, int src, int rtag, MPI_Comm c, MPI_Status* status) {
  if (counting && stag == braid::mpi::detail::call_check::block_tag) ++counted.blocks;
  return PMPI_Sendrecv(sb, sn, st, dest, stag, rb, rn, rt, src, rtag, c, status);
}
int MPI_Alltoall(const void* sb, int sn, MPI_Datatype st, void* rb, int rn, MPI_Datatype rt, MPI_Comm c) {
  counted.collectives += counting;
  return PMPI_Alltoall(sb, sn, st, rb, rn, rt, c);
}
int MPI_Alltoallv(const void* sb, const int sn[], const int so[], MPI_Datatype st, void* rb, const int rn[], const int ro[], MPI_Datatype rt, MPI_Comm c) {
  counted.collectives += counting;
  return PMPI_Alltoallv(sb, sn, so, st, rb, rn, ro, rt, c);
}
int MPI_Allgather(const void* sb, int sn, MPI_Datatype st, void* rb, int rn, MPI_Datatype rt, MPI_Comm c) {
  counted.collectives += counting;
  return PMPI_Allgather(sb, sn, st, rb, rn, rt, c);
}
int MPI_Allgatherv(const void* sb, int sn, MPI_Datatype st, void* rb, const int rn[], const int ro[], MPI_Datatype rt, MPI_Comm c) {
  counted.collectives += counting;
  return PMPI_Allgatherv(sb, sn, st, rb, rn, ro, rt, c);
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  counted.collectives += counting;
  return PMPI_Bcast(b, n, t, root, c);
}
int MPI_Allreduce(const void* sb, void* rb, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  counted.collectives += counting;
  return PMPI_Allreduce(sb, rb, n, t, op, c);
}
int MPI_Barrier(MPI_Comm c) {
  counted.collectives += counting;
  return PMPI_Barrier(c);
}
}

namespace {
// Every call's inter-host step is one round per chunk: each rank of the inter-host stage sends H - 1
// blocks (the call check), a data message beside a block where the data does not ride in it (above
// its 208 bytes, or always where MPI works on device memory), and no MPI collective, except two-shot
// all_reduce's MPI_Allgatherv (slices above 1 KiB; up to it the slice goes whole to every host in the
// one round) and MPI_Bcast for a broadcast too large to send from the root's host to every other
// (3 hosts, 800 KB here) or on hosts of unequal size. Only cuda_communicator's all_reduce makes
// several chunks (its pipeline, chunk_floats of the slice; the host communicator's is the whole
// slice): a round per chunk, nothing more. A version whose call check is a round of its own before
// the data (an MPI_Allgather, or header-only blocks on the device path) fails here. Results are
// checked too (the 800 KB broadcast is the only call here whose path no other check takes).
struct expected {
  long blocks = 0, data = 0, collectives = 0;
};
void check_rounds(comm_type& c, std::size_t chunk_floats, bool device_memory) {
  const long H = c.hosts(), N = c.size();
  const bool u = c.uniform();
  const bool part = H > 1 && (u || c.local_rank() == 0);
  const int root_local = 0; // rank 0's local rank (rank 0 is local rank 0 of host 0 in every layout)
  // Data messages for `bytes` to one other member: none where they ride in the block.
  auto beside = [&](std::size_t bytes) -> long {
    return bytes && (device_memory || bytes > braid::mpi::detail::call_check::inline_bytes) ? 1 : 0;
  };
  // One exchange sending `bytes` to every other member.
  auto round = [&](std::size_t bytes) { return expected{H - 1, (H - 1) * beside(bytes), 0}; };
  auto all_reduce_step = [&](std::size_t count) {
    expected e;
    const std::size_t n = u ? static_cast<std::size_t>(c.local_size()) : 1, s = (count + n - 1) / n, w0 = u ? std::min(s, chunk_floats) : s;
    for (std::size_t o = 0; o < s; o += w0) {
      const std::size_t w = std::min(w0, s - o);
      e.blocks += H - 1;
      if (w * sizeof(float) <= 1024) {
        e.data += (H - 1) * beside(w * sizeof(float));
        continue;
      }
      const auto p = braid::mpi::detail::split_pieces(w, static_cast<int>(H));
      for (long j = 0; j < H; ++j)
        if (j != c.host()) e.data += beside(static_cast<std::size_t>(p.cnt[static_cast<std::size_t>(j)]) * sizeof(float));
      e.collectives += 1;
    }
    return e;
  };
  auto expect = [&](const char* what, auto&& f, expected want) {
    MPI_Barrier(MPI_COMM_WORLD);
    counted = {};
    counting = true;
    f();
    counting = false;
    if (!part) want = {};
    if (counted.blocks != want.blocks || counted.data != want.data || counted.collectives != want.collectives)
      fail(std::string("rounds: ") + what + " on rank " + std::to_string(world_rank) + ": " + std::to_string(counted.blocks) + " blocks, " +
           std::to_string(counted.data) + " data messages, " + std::to_string(counted.collectives) + " MPI collectives (want " +
           std::to_string(want.blocks) + ", " + std::to_string(want.data) + ", " + std::to_string(want.collectives) + ")");
  };
  std::vector<float> x(200000, 1.0f), y(200000 * static_cast<std::size_t>(N));
  for (std::size_t count : {8, 200, 20000}) {
    const std::string what = "all_reduce of " + std::to_string(count) + " floats";
    expect(what.c_str(), [&] { c.all_reduce(x.data(), y.data(), count); }, all_reduce_step(count));
  }
  if (!device_memory && chunk_floats >= 20000) { // the host communicator's counts, written out
    expect("all_reduce of 8 floats (in the blocks)", [&] { c.all_reduce(x.data(), y.data(), 8); }, {H - 1, 0, 0});
    expect("all_reduce of 200 floats (one round)", [&] { c.all_reduce(x.data(), y.data(), 200); }, {H - 1, H - 1, 0});
    expect("all_reduce of 20000 floats (two-shot)", [&] { c.all_reduce(x.data(), y.data(), 20000); }, {H - 1, H - 1, 1});
  }
  for (std::size_t i = 0; i < 20000; ++i)
    if (y[i] != static_cast<float>(N)) {
      fail("rounds: all_reduce of 20000 floats: wrong sum on rank " + std::to_string(world_rank));
      break;
    }
  // reduce_scatter and all_gather: rc floats to each host (uneven hosts: a host's blocks, one or two
  // ranks' worth; on the same side of the block's 208 bytes at 8 and at 5000 floats).
  expect("reduce_scatter of 8 floats each", [&] { c.reduce_scatter(x.data(), y.data(), 8); }, round(8 * sizeof(float)));
  expect("reduce_scatter of 5000 floats each", [&] { c.reduce_scatter(x.data(), y.data(), 5000); }, round(5000 * sizeof(float)));
  expect("all_gather of 8 floats each", [&] { c.all_gather(x.data(), y.data(), 8); }, round(8 * sizeof(float)));
  expect("all_gather of 5000 floats each", [&] { c.all_gather(x.data(), y.data(), 5000); }, round(5000 * sizeof(float)));
  const bool sender = u && c.host() == 0 && c.local_rank() == root_local;
  const expected quiet{H - 1, 0, u ? 0 : 1}; // the check alone (plus the leaders' MPI_Bcast)
  auto bcast = [&](std::size_t bytes, bool rides) {
    expected e = quiet;
    if (sender && rides) e.data = (H - 1) * beside(bytes);
    if (u && c.local_rank() == root_local && !rides) e.collectives = 1;
    return e;
  };
  expect("broadcast of 8 floats", [&] { c.broadcast(x.data(), y.data(), 8, 0); }, bcast(8 * sizeof(float), true));
  expect("broadcast of 5000 floats", [&] { c.broadcast(x.data(), y.data(), 5000, 0); }, bcast(5000 * sizeof(float), true));
  for (std::size_t i = 0; i < 200000; ++i) x[i] = static_cast<float>(i % 1000) + (world_rank == 0 ? 0.5f : 0.0f);
  expect("broadcast of 200000 floats", [&] { c.broadcast(x.data(), y.data(), 200000, 0); }, bcast(200000 * sizeof(float), H == 2));
  for (std::size_t i = 0; i < 200000; ++i)
    if (y[i] != static_cast<float>(i % 1000) + 0.5f) {
      fail("rounds: broadcast of 200000 floats: wrong value on rank " + std::to_string(world_rank));
      break;
    }
  expect("barrier", [&] { c.barrier(); }, expected{H - 1, 0, 0});
  if (world_rank == 0) std::printf("rounds per call: as documented (%ld hosts)\n", H);
}

extern "C" void on_watchdog(int) {
  const char m[] = "test_mpi: watchdog: a rank is still inside a call (hang)\n";
  [[maybe_unused]] const auto n = write(2, m, sizeof(m) - 1);
  _exit(3);
}

#ifdef BRAID_TEST_MPI_CUDA
// What only the device build checks: the bits equal braid::mpi::communicator's on the same random
// floats (the documented order is the same; `count` here is --large + 1, so that it and the reference
// checks' --large cover both the padded and the unpadded all_reduce), the host communicator's path,
// the all_reduce pipeline's chunk count, lookahead and staged bytes, and calls on two streams.
void cuda_checks(device_comm& c, std::size_t count, std::size_t chunk_bytes, const std::string& want_path) {
  braid::mpi::communicator h(MPI_COMM_WORLD);
  const std::string d = c.get().describe();
  if (world_rank == 0) std::printf("cuda_communicator: %s\n", d.c_str());
  const bool device_path = c.get().local().path() == braid::cuda::process_path::device;
  // (A host of one rank has no peer to wait for: its communicator takes the host path.)
  if (!want_path.empty() && c.local_size() > 1 && device_path != (want_path == "device"))
    fail("rank " + std::to_string(world_rank) + ": inside the host " + (device_path ? "the device path" : "the host path") + ", expected " + want_path);
  auto x = [](int q, std::size_t i) {
    std::mt19937 g(static_cast<unsigned>(q * 7919 + static_cast<int>(i % 65536)));
    return std::uniform_real_distribution<float>(-1.0f, 1.0f)(g);
  };
  const std::size_t N = static_cast<std::size_t>(world_size), rc = count / N;
  std::vector<float> in(count), a(count), b(count), ra(rc), rb(rc);
  for (std::size_t i = 0; i < count; ++i) in[i] = x(world_rank, i);
  const auto before = c.get().stats();
  c.all_reduce(in.data(), a.data(), count, braid::sum<>{});
  const auto after = c.get().stats();
  h.all_reduce(in.data(), b.data(), count, braid::sum<>{});
  if (std::memcmp(a.data(), b.data(), count * sizeof(float)) != 0) fail("random float all_reduce: bits differ from braid::mpi::communicator's on rank " + std::to_string(world_rank));
  c.all_reduce(in.data(), a.data(), count, braid::avg<>{});
  h.all_reduce(in.data(), b.data(), count, braid::avg<>{});
  if (std::memcmp(a.data(), b.data(), count * sizeof(float)) != 0) fail("random float avg all_reduce: bits differ from braid::mpi::communicator's on rank " + std::to_string(world_rank));
  c.reduce_scatter(in.data(), ra.data(), rc, braid::sum<>{});
  h.reduce_scatter(in.data(), rb.data(), rc, braid::sum<>{});
  if (std::memcmp(ra.data(), rb.data(), rc * sizeof(float)) != 0) fail("random float reduce_scatter: bits differ from braid::mpi::communicator's on rank " + std::to_string(world_rank));
  // The pipeline: slice s = ceil(count / local_size), chunks of chunk_bytes / 4 floats.
  if (c.hosts() > 1 && c.uniform()) {
    const std::size_t n = static_cast<std::size_t>(c.local_size()), sl = (count + n - 1) / n;
    const std::size_t ce = std::max<std::size_t>(1, std::min(sl, chunk_bytes / sizeof(float))), K = (sl + ce - 1) / ce;
    const std::size_t staged = c.get().mpi_on_device() ? 0 : 2 * sl * sizeof(float);
    const std::uint64_t chunks = after.chunks - before.chunks, ahead = after.ahead - before.ahead, busy = after.gpu_busy - before.gpu_busy,
                        bytes = after.staged_bytes - before.staged_bytes;
    // Rounds per call, lookahead and bytes copied decide the pipeline's speed; whether the GPU was
    // still busy with the next chunk while MPI ran (gpu_busy) is timing, reported and not asserted.
    if (chunks != K || ahead != K - 1 || bytes != staged)
      fail("all_reduce pipeline on rank " + std::to_string(world_rank) + ": " + std::to_string(chunks) + " chunks (want " + std::to_string(K) + "), " +
           std::to_string(ahead) + " with a later chunk enqueued (want " + std::to_string(K - 1) + "), " + std::to_string(bytes) + " bytes staged (want " +
           std::to_string(staged) + ")");
    if (world_rank == 0)
      std::printf("all_reduce of %zu floats: %llu chunks through the inter-host step, %llu with the next chunk enqueued, %llu of those with its GPU work "
                  "still running when MPI began, %llu bytes staged\n",
                  count, static_cast<unsigned long long>(chunks), static_cast<unsigned long long>(ahead), static_cast<unsigned long long>(busy),
                  static_cast<unsigned long long>(bytes));
  }
  // Back to back on two streams, no synchronisation in between, the second call larger (scratch and
  // pinned memory grow while the first call's copies may still run): every call must wait for the
  // previous one's copies, whatever its stream.
  {
    braid::mpi::cuda_communicator& g = c.get();
    cudaStream_t s2 = nullptr;
    BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    const std::size_t n1 = count / 3 + 1, n2 = 4 * count + 5;
    std::vector<float> x1(n1), x2(n2), y1(n1), y2(n2), w1(n1), w2(n2);
    for (std::size_t i = 0; i < n1; ++i) x1[i] = x(world_rank, i);
    for (std::size_t i = 0; i < n2; ++i) x2[i] = x(world_rank + 50, i);
    float *d1 = nullptr, *d2 = nullptr;
    BRAID_CUDA_CHECK(cudaMalloc(&d1, n1 * sizeof(float)));
    BRAID_CUDA_CHECK(cudaMalloc(&d2, n2 * sizeof(float)));
    BRAID_CUDA_CHECK(cudaMemcpyAsync(d1, x1.data(), n1 * sizeof(float), cudaMemcpyHostToDevice, c.stream()));
    BRAID_CUDA_CHECK(cudaMemcpyAsync(d2, x2.data(), n2 * sizeof(float), cudaMemcpyHostToDevice, s2));
    g.all_reduce(d1, d1, n1, braid::sum<>{}, c.stream());
    g.all_reduce(d2, d2, n2, braid::sum<>{}, s2);
    g.all_reduce(d1, d1, n1, braid::max<>{}, c.stream());
    BRAID_CUDA_CHECK(cudaMemcpyAsync(y1.data(), d1, n1 * sizeof(float), cudaMemcpyDeviceToHost, c.stream()));
    BRAID_CUDA_CHECK(cudaMemcpyAsync(y2.data(), d2, n2 * sizeof(float), cudaMemcpyDeviceToHost, s2));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    BRAID_CUDA_CHECK(cudaStreamSynchronize(s2));
    g.check();
    h.all_reduce(x1.data(), w1.data(), n1, braid::sum<>{});
    h.all_reduce(w1.data(), w1.data(), n1, braid::max<>{});
    h.all_reduce(x2.data(), w2.data(), n2, braid::sum<>{});
    if (std::memcmp(y1.data(), w1.data(), n1 * sizeof(float)) != 0 || std::memcmp(y2.data(), w2.data(), n2 * sizeof(float)) != 0)
      fail("back-to-back calls on two streams: results differ from braid::mpi::communicator's on rank " + std::to_string(world_rank));
    BRAID_CUDA_CHECK(cudaFree(d1));
    BRAID_CUDA_CHECK(cudaFree(d2));
    BRAID_CUDA_CHECK(cudaStreamDestroy(s2));
  }
}
#endif

} // namespace

// mpi/partition.hpp: the counts and displacements both communicators hand MPI.
void check_partition() {
  using braid::mpi::detail::piece_counts;
  const piece_counts a = braid::mpi::detail::split_pieces(10, 3); // 4, 3, 3
  if (a.cnt != std::vector<int>{4, 3, 3} || a.off != std::vector<int>{0, 4, 7}) fail("split_pieces(10, 3)");
  const piece_counts b = braid::mpi::detail::split_pieces(2, 4); // fewer elements than members
  if (b.cnt != std::vector<int>{1, 1, 0, 0} || b.off != std::vector<int>{0, 1, 2, 2}) fail("split_pieces(2, 4)");
  const piece_counts c = braid::mpi::detail::equal_pieces(3, 5);
  if (c.cnt != std::vector<int>{5, 5, 5} || c.off != std::vector<int>{0, 5, 10}) fail("equal_pieces(3, 5)");
  braid::mpi::host_layout L;
  L.hosts = 3;
  L.host_size = {2, 1, 3};
  const piece_counts d = braid::mpi::detail::host_blocks(L, 7); // 14, 7, 21
  if (d.cnt != std::vector<int>{14, 7, 21} || d.off != std::vector<int>{0, 14, 21} || d.of(2) != 21 || d.at(2) != 21)
    fail("host_blocks({2, 1, 3}, 7)");
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  int want_hosts = -1, want_uniform = -1;
  bool expect_error = false, quick = false;
  std::size_t large = 100003, chunk_bytes = std::size_t{4} << 20;
  std::string want_path, mismatch, local_algo;
  unsigned watchdog = 90;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--hosts" && i + 1 < argc) want_hosts = std::atoi(argv[++i]);
    else if (a == "--uniform" && i + 1 < argc) want_uniform = std::atoi(argv[++i]);
    else if (a == "--expect-error") expect_error = true;
    else if (a == "--quick") quick = true;
    else if (a == "--large" && i + 1 < argc) large = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--chunk-bytes" && i + 1 < argc) chunk_bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--local-path" && i + 1 < argc) want_path = argv[++i];
    else if (a == "--mismatch" && i + 1 < argc) mismatch = argv[++i];
    else if (a == "--local-algo" && i + 1 < argc) local_algo = argv[++i];
    else if (a == "--mismatch-watchdog" && i + 1 < argc) watchdog = static_cast<unsigned>(std::atoi(argv[++i]));
    else {
      if (world_rank == 0) std::fprintf(stderr, "usage: test_mpi [--hosts H] [--uniform 0|1] [--expect-error] [--quick] [--large N] [--chunk-bytes B] [--local-path device|host] [--local-algo ALGO (with BRAID_ALGO=ALGO)] [--mismatch count|count-small|collective|root|root-local|count-large|collective-large|bcast-count|root-large|all]\n");
      MPI_Finalize();
      return 2;
    }
  }
  try {
    check_partition();
    if (expect_error) {
      bool raised = false;
      try {
        comm_type c(MPI_COMM_WORLD);
      } catch (const braid::error& e) {
        raised = e.code() == braid::errc::invalid_argument || e.code() == braid::errc::peer_failed;
        if (world_rank == 0) std::printf("rank 0 raised as expected: %s\n", e.what());
      }
      if (!raised) fail("construction did not raise on rank " + std::to_string(world_rank));
    } else if (!mismatch.empty()) {
      std::signal(SIGALRM, on_watchdog);
      alarm(watchdog);
      if (mismatch == "all")
        for (const char* k : {"count", "count-small", "collective", "root", "root-local", "count-large", "collective-large", "bcast-count", "root-large"})
          check_mismatch(k);
      else
        check_mismatch(mismatch);
      alarm(0);
    } else {
#ifdef BRAID_TEST_MPI_CUDA
      braid::mpi::cuda_options co;
      co.chunk_bytes = chunk_bytes;
      device_comm c(MPI_COMM_WORLD, co);
#else
      (void)chunk_bytes;
      braid::mpi::communicator c(MPI_COMM_WORLD);
#endif
      if (world_rank == 0)
        std::printf("layout: %d ranks, %d hosts, %s\n", c.size(), c.hosts(), c.uniform() ? "uniform" : "uneven");
      if (want_hosts >= 0 && c.hosts() != want_hosts) fail("expected " + std::to_string(want_hosts) + " hosts, got " + std::to_string(c.hosts()));
      if (want_uniform >= 0 && c.uniform() != (want_uniform != 0)) fail("host layout uniformity differs from what the launch asked for");
      if (c.size() != world_size || c.rank() != world_rank) fail("rank/size differ from MPI_COMM_WORLD's");
#ifndef BRAID_TEST_MPI_CUDA
      // --local-algo A (with BRAID_ALGO=A in the environment): every collective that has schedule A runs
      // it inside each host, so the checks below replay that schedule under braid::mpi.
      if (!local_algo.empty()) {
        braid::algo a{};
        if (!braid::parse_algo(local_algo, a)) fail("--local-algo: unknown algorithm " + local_algo);
        int served = 0;
        for (int k = 0; k < 5; ++k) {
          const auto coll = static_cast<braid::collective>(k);
          if (!braid::supports(a, coll)) continue;
          ++served;
          for (std::uint64_t bytes : {std::uint64_t{4}, std::uint64_t{4} << 20})
            if (c.local().algorithm_for(coll, bytes) != a)
              fail("inside the host, " + std::string(braid::name(coll)) + " of " + std::to_string(bytes) + " bytes runs " +
                   std::string(braid::name(c.local().algorithm_for(coll, bytes))) + ", not " + local_algo + " (is BRAID_ALGO set?)");
        }
        if (served == 0) fail("--local-algo " + local_algo + ": no collective has that schedule");
        if (world_rank == 0) std::printf("inside each host: %s for the %d collectives that have it\n", local_algo.c_str(), served);
      }
#endif
      const std::vector<std::size_t> small{0, 1, 7, 1003};
      check_type<float>(c, small);
      check_type<std::int32_t>(c, small);
      check_type<braid::bfloat16>(c, small);
      check_reductions<float, braid::sum<>>(c, braid::op_kind::sum, large); // large, odd
#ifdef BRAID_TEST_MPI_CUDA
      check_rounds(c, chunk_bytes / sizeof(float), c.get().mpi_on_device());
#else
      check_rounds(c, SIZE_MAX, false);
#endif
#ifdef BRAID_TEST_MPI_CUDA
      if (!quick) fail("test_mpi_cuda runs --quick only (the other types are not compiled into it, to keep its build short)");
#else
      if (!quick) {
        check_type<double>(c, small);
        check_type<std::int8_t>(c, {1, 1003});
        check_type<braid::half>(c, {7});
        check_type<braid::fp8_e4m3>(c, {1003});
        check_reductions<braid::bfloat16, braid::avg<>>(c, braid::op_kind::avg, large);
        check_reductions<std::int32_t, braid::max<>>(c, braid::op_kind::max, large);
        check_copies<double>(c, large);
      }
#endif
      check_rounding(c, large);
#ifdef BRAID_TEST_MPI_CUDA
      cuda_checks(c, large + 1, chunk_bytes, want_path);
#endif
      check_custom(c);
      check_errors(c);
#ifdef BRAID_TEST_MPI_CUDA
      {
        braid::mpi::cuda_communicator empty;
        if (empty.valid()) fail("a default-constructed cuda_communicator is valid");
        try {
          (void)empty.rank();
          fail("rank() of an empty cuda_communicator did not raise");
        } catch (const braid::usage_error& x) {
          if (!std::strstr(x.what(), "braid::mpi::cuda_communicator is empty")) fail(std::string("the message does not name the empty cuda_communicator: ") + x.what());
        }
      }
#else
      check_empty(c, "communicator");
      c.barrier(); // the communicator moved back in still works
#endif
    }
  } catch (const std::exception& e) {
    // The other ranks may be inside a collective this rank left: end the job now (an error, not a
    // hang until CTest's timeout).
    std::fprintf(stderr, "rank %d: exception: %s; calling MPI_Abort\n", world_rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  long total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (failures) std::fprintf(stderr, "rank %d: %ld failures; first: %s\n", world_rank, failures, first_failure.c_str());
  if (world_rank == 0) std::printf("%s: %ld failures over %d ranks\n", total ? "FAILED" : "passed", total, world_size);
  MPI_Finalize();
  return total ? 1 : 0;
}
