// braid_torch/csrc/plan.hpp — a reduction as braid runs it, free of torch's headers (nvcc's
// translation unit, cuda_path.cu, reads it too).
#pragma once

#include <cstddef>
#include <cstdint>

#include <braid/core/types.hpp>

namespace braid_torch {

// The operators braid runs for torch's ReduceOp (PREMUL_SUM is sum over pre-scaled inputs).
enum class reduction : std::uint8_t { sum, avg, prod, min, max, band, bor, bxor };

const char* name(reduction r);

// A reduction as braid runs it: the element type and count braid sees, the operator, and the factor
// PREMUL_SUM scales each rank's input by before summing (1 and false otherwise).
struct reduce_plan {
  braid::dtype type = braid::dtype::float32;
  std::size_t count = 0; // elements of `type` (twice the tensor's numel for complex)
  reduction op = reduction::sum;
  bool premul = false;
  double factor = 1.0;
};

} // namespace braid_torch
