// braid/cuda/device/signal.cuh — device-side primitives of the CUDA transport: progress words, bounded waits,
// the abort record, and (braid/cuda/device/reduce_copy.cuh) the reduce-copy loop. Written in braid/cuda/device/kernel.cuh's vocabulary, so the
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

#include "../../core/error.hpp"
#include "../../core/ops.hpp"
#include "../../core/types.hpp"
#include "kernel.cuh"
#include "reduce_copy.cuh"

namespace braid::cuda::device {

using u64 = unsigned long long;

// Which call a failure happened in: the collective and the call's sequence number on the rank's
// communicator (braid::error_context::seq, 1-based), as the host numbered it; seq 0: none known.
struct call_id {
  int coll; // braid::collective
  u64 seq;
};

// The first error of a group, written once. Lives in host-mapped (zero-copy) memory shared by every
// rank of the group.
struct device_error {
  unsigned int code;  // 0 none, else braid::errc
  int rank;           // who gave up
  int peer;           // whom it waited for
  int step;           // the schedule step it waited at (>= 0), or where outside a step (fail_step)
  u64 waited_ns;
  call_id call;       // the call `rank` was making, if known (a kernel's launch arguments carry it)
};

// device_error::step of failures found outside a schedule step; raise_recorded words its message by it.
namespace fail_step {
inline constexpr int aborted = -1;            // communicator::abort(), process_communicator::abort()
inline constexpr int overlapping_launch = -3; // a kernel found another launch of its group on its GPU
inline constexpr int host_arrival = -4;       // the launcher's host wait for the GPU's other ranks timed out
inline constexpr int launch_refused = -5;     // a call of a rank could not go on (the launcher stopped the group)
inline constexpr int peer_died = -6;          // process_communicator's watcher saw a peer's process end
inline constexpr int published = -7;          // process_communicator::publish_failure (a layer over the group)
} // namespace fail_step

// The group's record has one slot per writer kind, so that no slot is ever claimed by two devices:
// slot 0 by the host (abort(), the launcher's refusals), slot 1 + k by the kernels of the group's k-th
// GPU. The record is host-mapped memory, and atomic read-modify-writes on host-mapped memory are atomic
// only among the threads of one device (or of the host) unless the platform has host-native atomics
// (hostNativeAtomicSupported; PCIe machines do not), so one claim word shared by every GPU and the host
// could be won twice, and the record mixed. `claim` says who writes a slot's `e`: 0 nobody yet, 1 being
// written, 2 written (stored with release after `e`, so whoever acquires 2 reads a whole record).
// `flag` makes every kernel of the group return at its next check; each writer raises it (a plain
// release store of 1: the same value from everyone, so no read-modify-write across devices is needed)
// after finishing its slot, or when it found its slot claimed already.
struct abort_slot {
  unsigned int claim;
  device_error e;
};
inline constexpr int max_abort_gpus = 64; // GPUs of one group (create_group refuses more)
struct device_abort {
  unsigned int flag;
  abort_slot slot[1 + max_abort_gpus];
};
inline constexpr unsigned abort_claim_writing = 1, abort_claim_written = 2;
// Where one writer records: the host (slot 0) or the kernels of one GPU (1 + its index in the group).
struct abort_ref {
  device_abort* ab;
  int slot;
};
inline constexpr int abort_host_slot = 0;

using sys_u64 = device::atomic_ref<u64, device::scope::system>;
using sys_u32 = device::atomic_ref<unsigned, device::scope::system>;

// Host side of the record: whether the flag is up, and the first complete slot (host first, then GPU
// order), if any (acquire).
inline bool abort_raised(device_abort* ab) { return sys_u32(ab->flag).load(device::memory_order::acquire) != 0; }
inline const device_error* abort_record(device_abort* ab) {
  for (auto& sl : ab->slot)
    if (sys_u32(sl.claim).load(device::memory_order::acquire) == abort_claim_written) return &sl.e;
  return nullptr;
}

BRAID_DEVICE u64 load_acquire(const u64* p) { return sys_u64(*const_cast<u64*>(p)).load(device::memory_order::acquire); }

// The mutation test's switch, in the ThreadSanitizer build of the emulated-device tests only
// (tests/cuda/CMakeLists.txt defines BRAID_TEST_PROGRESS_POST_HOOK there): test_gpu_emu_mutant_detected
// sets it to weaken the progress post below to relaxed, and passes only if ThreadSanitizer reports the
// race that opens. Set before any kernel is launched, never changed while one runs.
#ifdef BRAID_TEST_PROGRESS_POST_HOOK
inline bool test_progress_post_relaxed = false;
#endif
// Raises *p to v (never lowers it), with release at system scope.
BRAID_DEVICE void post_max_release(u64* p, u64 v) {
#ifdef BRAID_TEST_PROGRESS_POST_HOOK
  sys_u64(*p).fetch_max(v, test_progress_post_relaxed ? device::memory_order::relaxed : device::memory_order::release);
#else
  sys_u64(*p).fetch_max(v, device::memory_order::release);
#endif
}

// Records `e` in the writer's slot if nobody of that writer kind has, then raises the abort flag.
// Kernels call it when they give up, the host when abort() is called: one claim protocol for both.
BRAID_HD void record_failure(abort_ref at, const device_error& e) {
  abort_slot& sl = at.ab->slot[at.slot];
  unsigned expected = 0;
  if (sys_u32(sl.claim).compare_exchange_strong(expected, abort_claim_writing, device::memory_order::acquire)) {
    sl.e = e;
    sys_u32(sl.claim).store(abort_claim_written, device::memory_order::release);
  }
  sys_u32(at.ab->flag).store(1u, device::memory_order::release);
}

// Host side, for a failure that follows another (an error's clean-up, a peer seen dead): records `e`
// in the host slot only while the group holds no failure (the flag is down). The record is read host
// slot first, so a host record written after a kernel's would hide the first failure from every rank
// that reads it later.
inline void record_host_failure_if_first(device_abort* ab, const device_error& e) {
  if (!abort_raised(ab)) record_failure({ab, abort_host_slot}, e);
}

// Bounded spin by one thread: waits until *word >= target, or the group is aborted, or timeout_ns
// passes (then records a timeout, naming `rank`, `peer`, `step` and `call`, and raises the abort
// flag). Returns false if the kernel must stop. `call` is used only when the wait gives up.
// Polls are relaxed (no L1 invalidation per poll on a GPU); one acquire load once the word is there
// orders the reads that follow (the word only grows, so it still passes).
// The abort flag lives in host-mapped memory: a GPU reads it across PCIe, and while the read is out
// the waiting thread sees no post. The clock is read every 64 polls; the flag at most once every
// `abort_every_ns` of waiting (0: at each of those clock reads), so a wait that ends sooner never
// reads it. Reading it every 64 polls makes the many-step schedules 2-8x slower where a rank's
// 33 blocks wait (measured on an H100, bench/results): one of them is nearly always inside a read
// when the peer posts, and the step ends when its last block has seen the post.
inline constexpr u64 default_abort_every_ns = 100000; // 100 us: an abort is seen within about that
BRAID_DEVICE bool wait_ge(const u64* word, u64 target, abort_ref ab, u64 timeout_ns, int rank, int peer, int step,
                          u64 abort_every_ns = default_abort_every_ns, call_id call = {}) {
  auto poll = [&] { return sys_u64(*const_cast<u64*>(word)).load(device::memory_order::relaxed) >= target; };
  if (poll()) return load_acquire(word) >= target;
  const u64 start = device::clock_ns();
  u64 abort_due = start + abort_every_ns;
  for (unsigned i = 1;; ++i) {
    if (poll()) return load_acquire(word) >= target;
    if ((i & 63) == 0) {
      const u64 now = device::clock_ns();
      if (now >= abort_due) {
        if (sys_u32(ab.ab->flag).load(device::memory_order::relaxed)) return false;
        abort_due = now + abort_every_ns;
      }
      if (now - start > timeout_ns) {
        record_failure(ab, device_error{static_cast<unsigned>(errc::timeout), rank, peer, step, now - start, call});
        return false;
      }
    }
    device::sleep_ns(128);
  }
}

} // namespace braid::cuda::device
