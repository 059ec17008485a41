// braid/cuda/device.cuh — device-side primitives of the CUDA transport: progress words, bounded waits,
// the abort record, and (braid/cuda/reduce_copy.cuh) the reduce-copy loop. Written in braid/cuda/kernel.cuh's vocabulary, so the
// same text runs on a GPU (nvcc) and on the emulated device (a host compiler, BRAID_CUDA_EMULATOR).
//
// Memory ordering: a rank's blocks write data, each block then meets at a block barrier and its
// thread 0 arrives on the step's counter with an acq_rel read-modify-write (device scope); the last
// block to arrive raises the rank's progress word with release at system scope. A reader polls the
// word relaxed, then loads it once with acquire at system scope, then meets its block at a barrier
// before any thread reads the data. Peers on other GPUs reach the words and data through peer
// mappings (NVLink/PCIe).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/types.hpp"
#include "kernel.cuh"
#include "reduce_copy.cuh"

namespace braid::cuda_detail {

using u64 = unsigned long long;

// The first error of a group, written once. Lives in host-mapped (zero-copy) memory shared by every
// rank of the group.
struct device_error {
  unsigned int code;  // 0 none, else braid::errc
  int rank;           // who gave up
  int peer;           // whom it waited for
  int step;
  u64 waited_ns;
};

// `claim` says who writes `first`: 0 nobody yet, 1 being written, 2 written (stored with release
// after `first`, so whoever acquires 2 reads a whole record). `flag` makes every kernel of the group
// return at its next check; it is raised only by whoever claimed the record, after finishing it,
// or by anyone who found it claimed already.
struct device_abort {
  unsigned int flag;
  unsigned int claim;
  device_error first;
};
inline constexpr unsigned abort_claim_writing = 1, abort_claim_written = 2;

using sys_u64 = gpu::atomic_ref<u64, gpu::scope::system>;
using sys_u32 = gpu::atomic_ref<unsigned, gpu::scope::system>;

// Host side of the record: whether the flag is up, and whether the record is complete (acquire).
inline bool abort_raised(device_abort* ab) { return sys_u32(ab->flag).load(gpu::memory_order::acquire) != 0; }
inline bool abort_record_written(device_abort* ab) {
  return sys_u32(ab->claim).load(gpu::memory_order::acquire) == abort_claim_written;
}

BRAID_DEVICE u64 load_acquire(const u64* p) { return sys_u64(*const_cast<u64*>(p)).load(gpu::memory_order::acquire); }

// The order of the progress post: release. Only the mutation test (tests/cuda/CMakeLists.txt,
// test_gpu_emu_mutant under ThreadSanitizer) defines this, to relaxed, and expects to be caught.
#ifndef BRAID_TEST_PROGRESS_POST_ORDER
#define BRAID_TEST_PROGRESS_POST_ORDER release
#endif
// Raises *p to v (never lowers it), with release at system scope.
BRAID_DEVICE void post_max_release(u64* p, u64 v) {
  sys_u64(*p).fetch_max(v, gpu::memory_order::BRAID_TEST_PROGRESS_POST_ORDER);
}

// Records `e` as the group's first error if nobody has, then raises the abort flag. Kernels call it
// when they give up, the host when abort() is called: one claim protocol for both.
BRAID_HD void record_failure(device_abort* ab, const device_error& e) {
  unsigned expected = 0;
  if (sys_u32(ab->claim).compare_exchange_strong(expected, abort_claim_writing, gpu::memory_order::acquire)) {
    ab->first = e;
    sys_u32(ab->claim).store(abort_claim_written, gpu::memory_order::release);
  }
  sys_u32(ab->flag).exchange(1u, gpu::memory_order::release);
}

// Bounded spin by one thread: waits until *word >= target, or the group is aborted, or timeout_ns
// passes (then records a timeout and raises the abort flag). Returns false if the kernel must stop.
// Polls are relaxed (no L1 invalidation per poll on a GPU); one acquire load once the word is there
// orders the reads that follow (the word only grows, so it still passes).
BRAID_DEVICE bool wait_ge(const u64* word, u64 target, device_abort* ab, u64 timeout_ns, int rank, int peer, int step) {
  auto poll = [&] { return sys_u64(*const_cast<u64*>(word)).load(gpu::memory_order::relaxed) >= target; };
  if (poll()) return load_acquire(word) >= target;
  const u64 start = gpu::clock_ns();
  for (unsigned i = 1;; ++i) {
    if (poll()) return load_acquire(word) >= target;
    if ((i & 63) == 0) {
      if (sys_u32(ab->flag).load(gpu::memory_order::relaxed)) return false;
      const u64 now = gpu::clock_ns();
      if (now - start > timeout_ns) {
        record_failure(ab, device_error{static_cast<unsigned>(errc::timeout), rank, peer, step, now - start});
        return false;
      }
    }
    gpu::sleep_ns(128);
  }
}

} // namespace braid::cuda_detail
