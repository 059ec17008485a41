// braid/comm/validate.hpp — the argument checks every front end makes before a collective touches
// memory, written once for the host communicator, the CUDA ones and braid::mpi; they build the call's
// record (schedule/call.hpp).
//
// A call is checked on the calling rank only, before anything is read or written: the byte count
// must not overflow, the root must be a rank, the requested algorithm must implement the collective,
// the buffers the rank uses must be non-null and aligned to alignof(T), and input and output may
// overlap only in the collective's in-place form. Every failure raises invalid_argument (unsupported
// for an algorithm that does not implement the collective) with the given context.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../core/error.hpp"
#include "../schedule/call.hpp"
#include "../schedule/common.hpp"

namespace braid::detail {

[[noreturn]] inline void raise_unsupported_algorithm(algo a, collective c, const error_context& ctx) {
  raise(errc::unsupported, "algorithm " + std::string(name(a)) + " does not implement " + std::string(name(c)), ctx);
}

template <class T> void check_buffer(const void* ptr, const char* which, const error_context& ctx) {
  if (!ptr) raise(errc::invalid_argument, std::string(which) + " is null", ctx);
  if (reinterpret_cast<std::uintptr_t>(ptr) % alignof(T))
    raise(errc::invalid_argument, std::string(which) + " is not aligned to alignof(T) = " + std::to_string(alignof(T)), ctx);
}

inline bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

// The record of a valid call of `c` (schedule/call.hpp): what it is, with algorithm `requested` and
// number 0 (the front end names both once it has chosen them), and what this rank reads and writes.
// Raises before anything is touched when the arguments are invalid.
template <collective c, class T, class Op>
call_record validate_call(const T* in, T* out, std::size_t count, int root, int nranks, int rank, algo requested,
                          const error_context& ctx) {
  const std::size_t blocks = schedule::blocked(c) ? static_cast<std::size_t>(nranks) : 1;
  if (count > static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(T) / blocks)
    raise(errc::invalid_argument, "count " + std::to_string(count) + " * sizeof(T) overflows", ctx);
  if (rooted(c) && (root < 0 || root >= nranks))
    raise(errc::invalid_argument, "root " + std::to_string(root) + " out of range [0, " + std::to_string(nranks) + ")", ctx);
  if (requested != algo::automatic && !supports(requested, c)) raise_unsupported_algorithm(requested, c, ctx);
  call_record k = record_of<T, Op>(c, requested, count, root, 0);
  k.in = in;
  k.out = out;
  k.reads_in = c != collective::broadcast || rank == root;
  k.writes_out = c != collective::reduce || rank == root;
  k.in_n = c == collective::reduce_scatter ? count * blocks : count;
  k.out_n = c == collective::all_gather ? count * blocks : count;
  if (count) {
    if (k.reads_in) check_buffer<T>(in, "input buffer", ctx);
    if (k.writes_out) check_buffer<T>(out, "output buffer", ctx);
  }
  if (count && k.reads_in && k.writes_out && overlaps(in, k.in_n * sizeof(T), out, k.out_n * sizeof(T))) {
    const std::size_t mine = static_cast<std::size_t>(rank) * count;
    const T* allowed = c == collective::reduce_scatter ? in + mine : (c == collective::all_gather ? out + mine : in);
    const T* given = c == collective::all_gather ? in : out;
    if (given != allowed)
      raise(errc::invalid_argument,
            "input and output overlap but are not the in-place form (" +
                std::string(c == collective::reduce_scatter ? "out == in + rank * count"
                            : c == collective::all_gather   ? "in == out + rank * count"
                                                            : "in == out") + ")",
            ctx);
    k.in_place = true;
  }
  return k;
}

} // namespace braid::detail
