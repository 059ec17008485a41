// tests/comm/sweep.hpp — the reference sweep shared by the thread and process runs: every collective ×
// algorithm × type × operator × count (0, 1, 7, 1003 at unaligned offsets, and 1000003 for one type per
// element size unless BRAID_SWEEP=full), out-of-place and
// in-place, staged and registered (read in place by peers) inputs, checked against a plain loop in double precision (integers: exact modular arithmetic).
//
// Inputs are small integers chosen so that every partial result any algorithm forms is exactly
// representable in every type (fp8 e5m2 included), so the comparison is exact for every operator:
// sum/prod/min/max equal the reference bit for bit, and avg equals the exact sum divided once in the
// operator's accumulator type (the documented semantics).
#pragma once

#include <braid/braid.hpp>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace braid::testing {

struct sweep_stats {
  long cases = 0;
  long elements = 0;
  long failures = 0;
  std::string first;
  void fail(const std::string& what) {
    if (!failures) first = what;
    ++failures;
  }
};

template <class T> constexpr bool is_unsigned_elem = std::is_integral_v<T> && std::is_unsigned_v<T>;

template <class T> int value_int(op_kind k, int r, std::uint64_t g) {
  if (k == op_kind::prod) {
    const int m = static_cast<int>((g + static_cast<std::uint64_t>(r)) % 3);
    return m == 0 ? 2 : (m == 1 || is_unsigned_elem<T> ? 1 : -1);
  }
  if constexpr (std::is_same_v<T, fp8_e5m2>) return static_cast<int>((g + 3 * static_cast<std::uint64_t>(r)) % 3) - 1;
  const int v = static_cast<int>((g + 3 * static_cast<std::uint64_t>(r)) % 5) - 2;
  return is_unsigned_elem<T> ? v + 2 : v;
}

template <class T> T make(int v) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(v);
  else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(v);
  else return T(static_cast<float>(v));
}

// Expected output element for a reduction over all ranks of input element g.
template <class T, class Op> T expected_reduction(op_kind k, int n, std::uint64_t g) {
  using A = accumulator_t<T, Op>;
  if constexpr (std::is_integral_v<T>) {
    T acc = make<T>(value_int<T>(k, 0, g));
    for (int r = 1; r < n; ++r) {
      const T x = make<T>(value_int<T>(k, r, g));
      switch (k) {
      case op_kind::prod: acc = detail::wrap_mul(acc, x); break;
      case op_kind::min: acc = x < acc ? x : acc; break;
      case op_kind::max: acc = acc < x ? x : acc; break;
      default: acc = detail::wrap_add(acc, x); break;
      }
    }
    if (k == op_kind::avg) acc = static_cast<T>(acc / static_cast<T>(n));
    return acc;
  } else {
    double acc = value_int<T>(k, 0, g);
    for (int r = 1; r < n; ++r) {
      const double x = value_int<T>(k, r, g);
      switch (k) {
      case op_kind::prod: acc *= x; break;
      case op_kind::min: acc = x < acc ? x : acc; break;
      case op_kind::max: acc = acc < x ? x : acc; break;
      default: acc += x; break;
      }
    }
    if (k == op_kind::avg) return static_cast<T>(static_cast<A>(static_cast<A>(acc) / static_cast<A>(n)));
    return make<T>(static_cast<int>(acc));
  }
}

inline constexpr collective sweep_collectives[] = {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                                                   collective::broadcast, collective::reduce};

// Sentinel elements after each output span: a write past the output shows there.
inline constexpr std::size_t sweep_guard = 16;

// Elements of the output span a case checks: the output, except in-place reduce_scatter, which works
// in the (larger) input buffer.
inline std::size_t span_elems(collective c, int n, std::size_t count, bool in_place) {
  const auto un = static_cast<std::size_t>(n);
  if (c == collective::all_gather || (in_place && c == collective::reduce_scatter)) return count * un;
  return count;
}

// Input element i of rank r (inputs repeat with period 15 in the element index).
template <class T> T input_value(collective c, op_kind k, int r, std::size_t count, std::size_t i) {
  if (c == collective::all_gather) return make<T>(value_int<T>(op_kind::sum, r, static_cast<std::uint64_t>(r) * count + i));
  if (c == collective::broadcast) return make<T>(value_int<T>(op_kind::sum, r, i));
  return make<T>(value_int<T>(k, r, i));
}

struct mismatch {
  const char* what = nullptr; // null: the output is right
  std::size_t at = 0;         // element (wrong value) or byte (sentinel) index
  explicit operator bool() const { return what != nullptr; }
};

// Checks rank r's output after a case: `span` is the output span as the rank sees it (span_elems +
// sweep_guard elements, every byte 0xA5 before the call) and `result` where the result starts in it.
// The CPU sweep and the GPU test (on a host copy of device memory) both judge with this.
template <class T, class Op>
mismatch verify_output(collective c, op_kind k, int n, int r, int root, std::size_t count, bool in_place,
                       const void* span, const void* result) {
  const std::size_t out_n = c == collective::all_gather ? count * static_cast<std::size_t>(n) : count;
  const std::size_t span_n = span_elems(c, n, count, in_place);
  const auto* res = static_cast<const unsigned char*>(result);
  T cache[15];
  bool have[15] = {};
  const bool writes = c != collective::reduce || r == root;
  const std::size_t check_n = in_place && c == collective::reduce_scatter ? count : out_n;
  for (std::size_t i = 0; writes && i < check_n; ++i) {
    T want;
    switch (c) {
    case collective::all_gather: want = make<T>(value_int<T>(op_kind::sum, static_cast<int>(i / count), i)); break;
    case collective::broadcast: want = make<T>(value_int<T>(op_kind::sum, root, i)); break;
    default: {
      const std::uint64_t g = c == collective::reduce_scatter ? static_cast<std::uint64_t>(r) * count + i : i;
      const std::size_t key = static_cast<std::size_t>(g % 15);
      if (!have[key]) { cache[key] = expected_reduction<T, Op>(k, n, g); have[key] = true; }
      want = cache[key];
    }
    }
    if (std::memcmp(&want, res + i * sizeof(T), sizeof(T)) != 0) return {"wrong value", i};
  }
  const auto* tail = static_cast<const unsigned char*>(span) + span_n * sizeof(T);
  for (std::size_t b = 0; b < sweep_guard * sizeof(T); ++b)
    if (tail[b] != 0xA5) return {"wrote past the output", b};
  if (!writes && !in_place) {
    const auto* o = static_cast<const unsigned char*>(span);
    for (std::size_t b = 0; b < out_n * sizeof(T); ++b)
      if (o[b] != 0xA5) return {"non-root output written", b};
  }
  return {};
}

// Per-rank scratch reused across cases (large enough for the largest count).
// `reg` is allocated through the communicator: for processes, inputs in it are read in place by the
// peers (no staging copy); `in` is ordinary memory (staged).
struct sweep_buffers {
  std::vector<std::uint64_t> in, out; // 8-byte aligned storage
  buffer<std::uint64_t> reg;
  void reserve(communicator& comm, std::size_t bytes) {
    in.assign(bytes / 8 + 64, 0);
    out.assign(bytes / 8 + 64, 0);
    reg = comm.alloc<std::uint64_t>(bytes / 8 + 64);
  }
};

template <class T, class Op>
void check_case(communicator& comm, collective c, algo a, op_kind k, std::size_t count, std::size_t offset, bool in_place,
                sweep_buffers& buf, sweep_stats& st, bool registered = false) {
  const int n = comm.size(), r = comm.rank();
  const int root = n - 1;
  const std::size_t in_n = c == collective::reduce_scatter ? count * static_cast<std::size_t>(n) : count;
  const std::size_t out_n = c == collective::all_gather ? count * static_cast<std::size_t>(n) : count;
  T* out = reinterpret_cast<T*>(buf.out.data()) + offset;
  T* in = in_place ? out : reinterpret_cast<T*>(registered ? buf.reg.data() : buf.in.data()) + offset;
  if (in_place) {
    if (c == collective::all_gather) in = out + static_cast<std::size_t>(r) * count;
  }
  // Sentinel in the output span (beyond it too, to catch overruns), then the input.
  const std::size_t span_n = span_elems(c, n, count, in_place);
  std::memset(out, 0xA5, (span_n + sweep_guard) * sizeof(T));
  for (std::size_t i = 0; i < in_n; ++i) in[i] = input_value<T>(c, k, r, count, i);
  T* result = out;
  if (in_place && c == collective::reduce_scatter) result = in + static_cast<std::size_t>(r) * count;
  call_options co{a};
  switch (c) {
  case collective::all_reduce: comm.all_reduce(in, out, count, Op{}, co); break;
  case collective::reduce_scatter: comm.reduce_scatter(in, result, count, Op{}, co); break;
  case collective::all_gather: comm.all_gather(in, out, count, co); break;
  case collective::broadcast: comm.broadcast(in, out, count, root, co); break;
  case collective::reduce: comm.reduce(in, out, count, root, Op{}, co); break;
  default: break;
  }
  ++st.cases;
  if (const mismatch m = verify_output<T, Op>(c, k, n, r, root, count, in_place, out, result)) {
    std::ostringstream s;
    s << name(c) << "/" << name(a) << " " << name(dtype_of_v<T>) << " " << name(k) << " n=" << n << " rank=" << r
      << " count=" << count << " offset=" << offset << (in_place ? " in-place" : "") << (registered ? " registered" : "")
      << ": " << m.what << " at " << m.at;
    st.fail(s.str());
    return;
  }
  st.elements += static_cast<long>(in_place && c == collective::reduce_scatter ? count : out_n);
}

// Whether type T takes the large (multi-round) count in the standard sweep. The executors' memory
// paths depend on the element size only (chunk unit, elements per round), so one type per size class
// — int8, bfloat16 (low-precision conversion too), float, double — runs it; every type still runs
// every other shape, which covers its reduction. `full` (BRAID_SWEEP=full) runs it for every type.
template <class T> constexpr bool large_for_type(bool full) {
  return full || std::is_same_v<T, std::int8_t> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float> ||
         std::is_same_v<T, double>;
}

// Runs the whole sweep on one rank; every rank of the communicator runs the same sequence.
// `large` is the big count (1000003 in CI); `full` gives it to every type, not one per element size.
inline void run_sweep(communicator& comm, std::size_t large, sweep_stats& st, bool full = false) {
  sweep_buffers buf;
  buf.reserve(comm, (large * static_cast<std::size_t>(comm.size()) + 64) * 8 + 4096);
  for (dtype t : all_dtypes) {
    visit(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (collective c : sweep_collectives) {
        const bool reduces = c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
        for (algo a : all_algos) {
          if (!supports(a, c)) continue;
          for (op_kind k : {op_kind::sum, op_kind::prod, op_kind::min, op_kind::max, op_kind::avg}) {
            if (!reduces && k != op_kind::sum) continue;
            visit(k, [&](auto op) {
              using Op = decltype(op);
              struct shape { std::size_t count, offset; bool in_place, registered; };
              const shape shapes[] = {{0, 0, false, false}, {1, 0, false, false},   {7, 0, false, false},
                                      {7, 0, true, false},  {1003, 1, false, false}, {1003, 3, true, false},
                                      {1003, 5, false, true}, {large, 0, false, true}};
              for (const shape& s : shapes) {
                if (s.count == large && s.count > 1003 && !large_for_type<T>(full)) continue;
                check_case<T, Op>(comm, c, a, k, s.count, s.offset, s.in_place, buf, st, s.registered);
              }
            });
          }
        }
      }
    });
  }
  // The large in-place and unregistered cases for every collective and algorithm (one type: these
  // paths do not depend on it).
  for (collective c : sweep_collectives)
    for (algo a : all_algos)
      if (supports(a, c)) {
        check_case<float, sum<>>(comm, c, a, op_kind::sum, large, 0, true, buf, st);
        check_case<float, sum<>>(comm, c, a, op_kind::sum, large, 0, false, buf, st);
      }
}

} // namespace braid::testing
