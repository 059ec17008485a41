// tests/headers/type_calls.hpp — api.md's promises about element types, instantiated: every
// collective of a communicator for the 14 named types (sum), a user struct with its own operator
// (argmax, marked BRAID_HD so the CUDA kernels can call it), and a copy-only struct with no
// operators (broadcast and all_gather only). Compiled, never run: type_calls.cpp (host communicator,
// and braid::mpi where <mpi.h> is found: tests/mpi), type_calls_emu.cpp (both CUDA communicators on
// the emulated device, and braid::mpi::cuda_communicator where MPI is found). All with the host
// compiler, under braid_strict_warnings: the same set under nvcc took over 12 minutes on
// the 2-core CI machine (14 types x every algorithm's kernel), so nvcc instantiates the named types
// in braid_cuda_launch (sum; float with every operator) and tests/headers/cuda_calls.cu (which also
// reduces an argmax struct with its own operator on both CUDA communicators).
#pragma once

#include <braid/braid.hpp>

#include <cstdint>

namespace braid_type_check {

struct val_idx { // a user type reduced by a user operator
  float value;
  int index;
};
struct argmax {
  BRAID_HD val_idx operator()(const val_idx& a, const val_idx& b) const {
    return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
  }
};
struct rgb { // copy-only: no operator at all, 3 bytes
  unsigned char r, g, b;
};

// Reductions of T with Op through comm's pointer forms; `extra...` is the CUDA stream (or nothing).
template <class T, class Op, class C, class... S> void reductions(C& c, T* p, Op op, S... s) {
  c.all_reduce(p, p, 1, op, s...);
  c.reduce(p, p, 1, 0, op, s...);
  c.reduce_scatter(p, p, 1, op, s...);
}
template <class T, class C, class... S> void copies(C& c, T* p, S... s) {
  c.broadcast(p, p, 1, 0, s...);
  c.all_gather(p, p, 1, s...);
}
template <class T, class C, class... S> void every_collective(C& c, T* p, S... s) {
  reductions(c, p, braid::sum<>{}, s...);
  copies(c, p, s...);
}

// Every promise, for a communicator whose calls take the trailing arguments `s...`.
template <class C, class... S> void all_types(C& c, void* mem, S... s) {
  every_collective(c, static_cast<std::int8_t*>(mem), s...);
  every_collective(c, static_cast<std::uint8_t*>(mem), s...);
  every_collective(c, static_cast<std::int16_t*>(mem), s...);
  every_collective(c, static_cast<std::uint16_t*>(mem), s...);
  every_collective(c, static_cast<std::int32_t*>(mem), s...);
  every_collective(c, static_cast<std::uint32_t*>(mem), s...);
  every_collective(c, static_cast<std::int64_t*>(mem), s...);
  every_collective(c, static_cast<std::uint64_t*>(mem), s...);
  every_collective(c, static_cast<braid::half*>(mem), s...);
  every_collective(c, static_cast<braid::bfloat16*>(mem), s...);
  every_collective(c, static_cast<float*>(mem), s...);
  every_collective(c, static_cast<double*>(mem), s...);
  every_collective(c, static_cast<braid::fp8_e4m3*>(mem), s...);
  every_collective(c, static_cast<braid::fp8_e5m2*>(mem), s...);
  reductions(c, static_cast<val_idx*>(mem), argmax{}, s...);
  copies(c, static_cast<val_idx*>(mem), s...);
  copies(c, static_cast<rgb*>(mem), s...);
}

} // namespace braid_type_check
