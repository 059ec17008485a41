// braid/schedule/call.hpp — one collective call, as every front end describes it and every backend
// receives it: the call record. A front end builds it once (comm/validate.hpp checks the arguments and
// fills what this rank reads and writes), names its algorithm and number, and hands it to its backend
// unchanged: the host executor (host/executor.hpp), the CUDA launch (cuda/enqueue/args.cuh turns it
// into the kernel's part of the launch), the process host path and braid::mpi. What ranks compare to
// catch mismatched calls is the record's description, packed into four words here and unpacked only
// here, and the 64-bit call word chained over a rank's calls.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "../core/ops.hpp"
#include "../core/types.hpp"
#include "common.hpp"

namespace braid::detail {

constexpr bool rooted(collective c) { return c == collective::broadcast || c == collective::reduce; }

// One call on one rank.
struct call_record {
  // What the call is: the same on every rank of a well-formed call (a barrier's type, operator and
  // algorithm mean nothing).
  collective coll = collective::barrier;
  dtype type = dtype::custom;
  op_kind op = op_kind::custom;
  algo algorithm = algo::automatic; // the one the backend runs, once chosen
  std::uint32_t elem_size = 0;      // sizeof(T), low 32 bits
  std::uint64_t count = 0;          // elements per block
  int root = 0;                     // the root of a rooted collective; 0 otherwise
  std::uint64_t number = 0;         // the call's number on this rank's communicator, from 1
  // What this rank does with it.
  const void* in = nullptr;
  void* out = nullptr;
  bool reads_in = false;   // not a non-root of broadcast
  bool writes_out = false; // not a non-root of reduce
  bool in_place = false;   // input and output are the collective's in-place form
  std::uint64_t in_n = 0;  // elements of `in` (count * nranks for reduce_scatter)
  std::uint64_t out_n = 0; // elements of `out` (count * nranks for all_gather)
  // How peers reach `in` where they read it in place (a pointer for thread ranks, a registration's
  // descriptor for process ranks, the device address on the GPU); 0: it is staged.
  std::uint64_t in_desc = 0;

  std::uint64_t in_bytes() const { return in_n * elem_size; }
};

// A call's description: {collective | dtype << 8 | operator << 16 | algorithm << 24 | sizeof(T) << 32,
// count, root + 1 (0: not a rooted collective), call number}. Ranks compare it whole (debug mode, the
// process host path, braid::mpi's call check) or through the call word.
using call_description = std::array<std::uint64_t, 4>;

inline constexpr std::uint64_t untyped = 0xffffff; // a barrier's type, operator and algorithm bytes

constexpr call_description describe(const call_record& k) {
  if (k.coll == collective::barrier)
    return {static_cast<std::uint64_t>(collective::barrier) | untyped << 8, 0, 0, k.number};
  return {static_cast<std::uint64_t>(k.coll) | static_cast<std::uint64_t>(k.type) << 8 | static_cast<std::uint64_t>(k.op) << 16 |
              static_cast<std::uint64_t>(k.algorithm) << 24 | std::uint64_t{k.elem_size & 0xffffffu} << 32,
          k.count, rooted(k.coll) ? static_cast<std::uint64_t>(k.root) + 1 : 0, k.number};
}

// The record a description was packed from: what the call is (no buffers, no shape).
constexpr call_record unpack(const call_description& d) {
  call_record k;
  k.coll = static_cast<collective>(d[0] & 0xff);
  k.type = static_cast<dtype>((d[0] >> 8) & 0xff);
  k.op = static_cast<op_kind>((d[0] >> 16) & 0xff);
  k.algorithm = static_cast<algo>((d[0] >> 24) & 0xff);
  k.elem_size = static_cast<std::uint32_t>(d[0] >> 32);
  k.count = d[1];
  k.root = d[2] ? static_cast<int>(d[2] - 1) : 0;
  k.number = d[3];
  return k;
}

// The record of call `c` of T under Op (what it is; the front end's validate_call adds the buffers).
template <class T, class Op>
constexpr call_record record_of(collective c, algo a, std::uint64_t count, int root, std::uint64_t number) {
  call_record k;
  k.coll = c;
  k.type = dtype_of_v<T>;
  k.op = op_kind_v<Op>;
  k.algorithm = a;
  k.elem_size = static_cast<std::uint32_t>(sizeof(T));
  k.count = count;
  k.root = rooted(c) ? root : 0;
  k.number = number;
  return k;
}

// A barrier's record.
constexpr call_record barrier_record(std::uint64_t number) {
  call_record k;
  k.number = number;
  return k;
}

// A call in words, for mismatch messages: "all_reduce of 1000 float (4-byte elements), operator sum,
// root 2"; a barrier's: "barrier". Its number is not part of it.
inline std::string call_text(const call_record& k) {
  std::string s(name(k.coll));
  if (k.coll == collective::barrier) return s;
  s += " of " + std::to_string(k.count) + " " + std::string(name(k.type)) + " (" + std::to_string(k.elem_size) +
       "-byte elements), operator " + std::string(name(k.op));
  if (rooted(k.coll)) s += ", root " + std::to_string(k.root);
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
