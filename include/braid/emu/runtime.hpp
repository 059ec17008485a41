// braid/emu/runtime.hpp — the emulated CUDA runtime: the runtime calls braid makes, with CUDA's names,
// CUDA's semantics where braid relies on them, and CUDA's error codes where CUDA refuses. Host code
// compiled by g++ with BRAID_CUDA_EMULATOR includes this instead of <cuda_runtime.h> (through
// braid/cuda/runtime.cuh); kernels are launched with braid::emu::launch (through braid::cuda::device::launch).
//
// The machine (docs/architecture.md, "The emulated device"): BRAID_EMU_DEVICES devices (default
// 2), each with BRAID_EMU_SMS streaming multiprocessors (default 16) of 2048 threads and 32 blocks,
// blocks of up to 1024 threads, 16 GiB of memory each (counted, not reserved), peer access possible
// between any two devices, compute capability 9.0, unified addressing.
//
// What is emulated as CUDA specifies it: streams as in-order queues and the legacy default stream's
// implicit synchronisation; which copies return before they are done (a cudaMemcpy from pageable host
// memory to the device returns once the source is staged, device-to-device copies and cudaMemset
// return at once); host functions on streams (cudaLaunchHostFunc); events; stream capture into graphs
// (kernels, copies, fills and host functions), instantiation and replay; CUDA IPC between real
// processes, refused in the exporting process; CUDA_LAUNCH_BLOCKING=1.
// Bad input (a range outside any allocation, a stale handle, a parameter the emulator does not
// implement) returns CUDA's error code and says what was wrong on stderr (BRAID_EMU_QUIET=1 silences
// it). Not modelled: registers and shared memory in occupancy, kernel faults as errors (a bad access
// in a kernel crashes the process), peer-access checks on loads inside kernels, any timing.
#pragma once

// In four rooms, each including the one before: the machine and device queries, memory, streams
// (events, capture, graphs), IPC and the rest.
#include "runtime/core.hpp"
#include "runtime/memory.hpp"
#include "runtime/streams.hpp"
#include "runtime/ipc.hpp"
