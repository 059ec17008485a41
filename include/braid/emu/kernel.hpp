// braid/emu/kernel.hpp — what a kernel running on the emulated device can ask (the emulated side of
// braid/cuda/device/kernel.cuh's vocabulary): its thread and block coordinates, the block barrier, a yield
// point for waits, and a clock. Each call is answered for the emulated CUDA thread running on the
// calling OS thread; called outside a kernel, it stops the process with a message naming the call.
#pragma once

#include <chrono>
#include <cstdint>

#include "exec.hpp"

namespace braid::emu {

inline unsigned thread_index() { return detail::current_thread("threadIdx").tid; }
inline unsigned block_index() { return detail::current_thread("blockIdx").run->bid; }
inline unsigned block_size() { return detail::current_thread("blockDim").run->job->block; }
inline unsigned grid_size() { return detail::current_thread("gridDim").run->job->grid; }

// __syncthreads(): returns when every thread of the block that has not exited has reached it.
inline void sync_block() {
  detail::cuda_thread& t = detail::current_thread("__syncthreads");
  t.w->barrier(t);
}

// A point where a waiting thread lets the others of its block (and, when none can progress, other
// work on the machine) run: __nanosleep's emulation. The duration is not honoured.
inline void yield_thread() {
  detail::cuda_thread& t = detail::current_thread("__nanosleep");
  t.w->yield(t);
}

// Called by every atomic load of the vocabulary: every 64th poll yields, so a thread spinning on a
// word without sleeping cannot starve the other threads of its block.
inline void poll() {
  detail::cuda_thread* t = detail::tls_thread.load(std::memory_order_relaxed);
  if (t && (++t->polls & 63u) == 0) t->w->yield(*t);
}

// Nanoseconds of a steady clock (the emulated %globaltimer): CPU time, never a GPU timing.
inline std::uint64_t clock_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

} // namespace braid::emu
