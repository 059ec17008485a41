// braid_torch/csrc/types.hpp — how a torch tensor and a torch reduction reach braid.
//
// Reductions: every dtype torch and braid share, with torch's ReduceOp mapped onto a braid operator.
//   float32/64, float16, bfloat16, float8 (e4m3fn, e5m2): SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM.
//     float16, bfloat16 and float8 accumulate in float (braid's default accumulator), on every rank
//     in the same order, so every rank gets the same bits.
//   int8-64, uint8-64: SUM, AVG (truncating toward zero), PRODUCT, MIN, MAX, BAND, BOR, BXOR;
//     sums and products wrap modulo 2^bits.
//   bool (as uint8 0/1): SUM and MAX are logical or, PRODUCT and MIN logical and, BAND, BOR, BXOR.
//   complex64/128 (as pairs of float/double): SUM, AVG, PREMUL_SUM with a real factor.
// Anything else raises before any data moves. Collectives that only move data accept every dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <braid/comm/communicator.hpp>

#include "plan.hpp"

namespace braid_torch {

// Plans the reduction of tensor t with op, or raises c10::Error (RuntimeError) saying what is not
// supported and why. `collective` names the caller in the message.
reduce_plan plan_reduction(const at::Tensor& t, const c10d::ReduceOp& op, const char* collective);

// The typed reductions, dispatched on plan.type and plan.op (reduce_*.cpp instantiate them).
void typed_all_reduce(braid::communicator& c, const reduce_plan& p, const void* in, void* out);
void typed_reduce(braid::communicator& c, const reduce_plan& p, const void* in, void* out, int root);
void typed_reduce_scatter(braid::communicator& c, const reduce_plan& p, const void* in, void* out); // p.count per rank
// out[i] = in[i] * p.factor, computed in the accumulator type (PREMUL_SUM's scaling, p.count elements).
void typed_scale(const reduce_plan& p, const void* in, void* out);
// Reduces `parts` blocks of p.count elements each, in block order 0..parts-1, into out (the step
// between hosts). With p.op == avg the blocks are sums and the result is divided by `divisor`.
void typed_combine(const reduce_plan& p, const void* blocks, std::size_t parts, void* out, int divisor);

// Raises RuntimeError unless t is a CPU tensor (point-to-point operations serve CPU tensors only).
void require_cpu(const at::Tensor& t, const char* collective);

} // namespace braid_torch
