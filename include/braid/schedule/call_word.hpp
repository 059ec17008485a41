// braid/schedule/call_word.hpp — what ranks compare to catch mismatched calls: a call's description
// as four words (the debug fingerprint's layout), packed and unpacked here only, and the 64-bit call
// word chained over a rank's calls.
// Shared by the host transport (transport/host/context.hpp) and the CUDA kernels (cuda/executor.cuh,
// whose words the CUDA communicators compute on the host).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "../core/ops.hpp"
#include "../core/types.hpp"
#include "common.hpp"

namespace braid::detail {

// {collective | dtype << 8 | operator << 16 | algorithm << 24 | sizeof(T) << 32, count, root + 1 (0:
// not a rooted collective), call number}.
using call_description = std::array<std::uint64_t, 4>;

template <class T, class Op>
constexpr call_description describe_call(collective c, algo a, std::uint64_t count, int root, std::uint64_t number) {
  const bool rooted = c == collective::broadcast || c == collective::reduce;
  return {static_cast<std::uint64_t>(c) | static_cast<std::uint64_t>(dtype_of_v<T>) << 8 | static_cast<std::uint64_t>(op_kind_v<Op>) << 16 |
              static_cast<std::uint64_t>(a) << 24 | std::uint64_t{sizeof(T) & 0xffffffu} << 32,
          count, rooted ? static_cast<std::uint64_t>(root) + 1 : 0, number};
}

// The description of a barrier: no element type, operator or algorithm (0xffffff in their bytes), no
// count and no root.
constexpr call_description describe_barrier(std::uint64_t number) {
  return {static_cast<std::uint64_t>(collective::barrier) | std::uint64_t{0xffffff} << 8, 0, 0, number};
}

// A description's fields, as describe_call or describe_barrier packed them.
struct call_fields {
  collective coll;
  bool typed;               // false for a barrier's: type, op, algorithm and elem_size mean nothing
  dtype type;
  op_kind op;
  algo algorithm;
  std::uint32_t elem_size;  // sizeof(T), low 32 bits
  std::uint64_t count;
  int root;                 // -1: not a rooted collective
  std::uint64_t number;
};
constexpr call_fields unpack_call(const call_description& d) {
  return {static_cast<collective>(d[0] & 0xff),
          (d[0] & 0xffffff00u) != 0xffffff00u,
          static_cast<dtype>((d[0] >> 8) & 0xff),
          static_cast<op_kind>((d[0] >> 16) & 0xff),
          static_cast<algo>((d[0] >> 24) & 0xff),
          static_cast<std::uint32_t>(d[0] >> 32),
          d[1],
          d[2] ? static_cast<int>(d[2] - 1) : -1,
          d[3]};
}

// A description in words, for mismatch messages: "all_reduce of 1000 float (4-byte elements),
// operator sum, root 2"; a barrier's: "barrier". Its number is not part of it.
inline std::string call_text(const call_description& d) {
  const call_fields f = unpack_call(d);
  std::string s(name(f.coll));
  if (!f.typed) return s;
  s += " of " + std::to_string(f.count) + " " + std::string(name(f.type)) + " (" + std::to_string(f.elem_size) +
       "-byte elements), operator " + std::string(name(f.op));
  if (f.root >= 0) s += ", root " + std::to_string(f.root);
  return s;
}

// splitmix64's finaliser: a bijection.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The word of a call: the previous call's word, the description and `salt` (the host transport: the
// call's first round; CUDA: 0), each times its own odd 64-bit constant, summed, then one mix. The
// products are independent (one multiply's latency, not a chain of five), since the word is stored
// before the post that starts the call's first round. Two ranks get equal words only if this call and
// every earlier one agree (up to a 64-bit collision).
constexpr std::uint64_t chain_call_word(std::uint64_t prev, const call_description& d, std::uint64_t salt) {
  const std::uint64_t h = (prev * 0x9e3779b97f4a7c15ULL + d[0] * 0xc2b2ae3d27d4eb4fULL) +
                          (d[1] * 0x165667b19e3779f9ULL + d[2] * 0xd6e8feb86659fd93ULL) +
                          (d[3] * 0xff51afd7ed558ccdULL + salt * 0xc4ceb9fe1a85ec53ULL);
  return mix64(h);
}

} // namespace braid::detail
