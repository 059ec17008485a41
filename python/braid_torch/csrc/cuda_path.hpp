// braid_torch/csrc/cuda_path.hpp — the collectives of CUDA tensors: braid::cuda::process_communicator
// over the ranks of one host, one per (group, device). Compiled by nvcc (cuda_path.cu) and kept free of
// torch's headers, so that torch and braid's kernels never share a translation unit.
//
// Every call blocks its thread until the result is in `out` (the caller runs it on the group's
// progress thread, on a stream of the backend's that waits for the caller's stream first).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include <braid/comm/communicator.hpp>

#include "plan.hpp"

namespace braid_torch::gpu {

class group;

// Joins the host's ranks on `device` (collective: every rank of `host` calls it at its first CUDA
// collective). `timeout` bounds every wait, for the host and for the device.
std::shared_ptr<group> join(braid::communicator host, int device, std::chrono::milliseconds timeout);

// Whether a reduction of this plan runs on the device: float32/64, float16, bfloat16, int32, int64,
// uint8 (bool) with SUM, AVG, PRODUCT, MIN, MAX, no PREMUL_SUM. Complex plans are float32/64 pairs.
bool serves(const reduce_plan& p);

void all_reduce(group& g, const reduce_plan& p, const void* in, void* out, void* stream);
void reduce(group& g, const reduce_plan& p, const void* in, void* out, int root, void* stream);
void reduce_scatter(group& g, const reduce_plan& p, const void* in, void* out, void* stream); // p.count per rank
void broadcast(group& g, void* data, std::size_t bytes, int root, void* stream);
void all_gather(group& g, const void* in, void* out, std::size_t bytes, void* stream); // bytes per rank
// Makes the group refuse further calls and its peers fail their current one (abort()).
void abort(group& g) noexcept;

} // namespace braid_torch::gpu
