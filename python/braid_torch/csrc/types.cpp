#include "types.hpp"

#include <c10/util/Exception.h>

namespace braid_torch {

const char* name(reduction r) {
  switch (r) {
  case reduction::sum: return "SUM";
  case reduction::avg: return "AVG";
  case reduction::prod: return "PRODUCT";
  case reduction::min: return "MIN";
  case reduction::max: return "MAX";
  case reduction::band: return "BAND";
  case reduction::bor: return "BOR";
  case reduction::bxor: return "BXOR";
  }
  return "?";
}

void require_cpu(const at::Tensor& t, const char* collective) {
  TORCH_CHECK(t.device().is_cpu(), "braid: ", collective, ": a tensor on ", t.device().str(),
              " was passed; braid serves CUDA tensors in the collectives (all_reduce, broadcast, reduce, all_gather, "
              "reduce_scatter, gather, scatter and their coalesced and tensor forms), not in send/recv or all_to_all: "
              "use CPU tensors there, or the backend string \"cpu:braid,cuda:nccl\"");
  TORCH_CHECK(t.layout() == at::kStrided, "braid: ", collective, ": sparse tensors are not supported");
}

namespace {

const char* op_name(c10d::ReduceOp::RedOpType t) {
  switch (t) {
  case c10d::ReduceOp::SUM: return "SUM";
  case c10d::ReduceOp::AVG: return "AVG";
  case c10d::ReduceOp::PRODUCT: return "PRODUCT";
  case c10d::ReduceOp::MIN: return "MIN";
  case c10d::ReduceOp::MAX: return "MAX";
  case c10d::ReduceOp::BAND: return "BAND";
  case c10d::ReduceOp::BOR: return "BOR";
  case c10d::ReduceOp::BXOR: return "BXOR";
  case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
  default: return "UNUSED";
  }
}

bool to_braid(at::ScalarType s, braid::dtype& out, int& lanes) {
  lanes = 1;
  switch (s) {
  case at::kFloat: out = braid::dtype::float32; return true;
  case at::kDouble: out = braid::dtype::float64; return true;
  case at::kHalf: out = braid::dtype::float16; return true;
  case at::kBFloat16: out = braid::dtype::bfloat16; return true;
  case at::kFloat8_e4m3fn: out = braid::dtype::fp8_e4m3; return true;
  case at::kFloat8_e5m2: out = braid::dtype::fp8_e5m2; return true;
  case at::kChar: out = braid::dtype::int8; return true;
  case at::kByte: out = braid::dtype::uint8; return true;
  case at::kBool: out = braid::dtype::uint8; return true;
  case at::kShort: out = braid::dtype::int16; return true;
  case at::kInt: out = braid::dtype::int32; return true;
  case at::kLong: out = braid::dtype::int64; return true;
  case at::kUInt16: out = braid::dtype::uint16; return true;
  case at::kUInt32: out = braid::dtype::uint32; return true;
  case at::kUInt64: out = braid::dtype::uint64; return true;
  case at::kComplexFloat: out = braid::dtype::float32; lanes = 2; return true;
  case at::kComplexDouble: out = braid::dtype::float64; lanes = 2; return true;
  default: return false;
  }
}

} // namespace

reduce_plan plan_reduction(const at::Tensor& t, const c10d::ReduceOp& op, const char* collective) {
  TORCH_CHECK(t.layout() == at::kStrided, "braid: ", collective, ": sparse tensors are not supported");
  const at::ScalarType s = t.scalar_type();
  reduce_plan p;
  int lanes = 1;
  TORCH_CHECK(to_braid(s, p.type, lanes), "braid: ", collective, ": dtype ", s,
              " has no reduction in braid (supported: float32/64, float16, bfloat16, float8_e4m3fn, float8_e5m2, "
              "int8-64, uint8-64, bool, complex64/128)");
  p.count = static_cast<std::size_t>(t.numel()) * static_cast<std::size_t>(lanes);
  const bool is_bool = s == at::kBool, is_complex = lanes == 2;
  const bool is_int = at::isIntegralType(s, /*includeBool=*/false);
  const auto kind = op.op_;
  auto refuse = [&](const char* why) {
    TORCH_CHECK(false, "braid: ", collective, ": ReduceOp.", op_name(kind), " is not supported for dtype ", s, ": ", why);
  };
  switch (kind) {
  case c10d::ReduceOp::SUM: p.op = is_bool ? reduction::max : reduction::sum; break;
  case c10d::ReduceOp::AVG:
    if (is_bool) refuse("the average of booleans is not a boolean");
    p.op = reduction::avg;
    break;
  case c10d::ReduceOp::PRODUCT:
    if (is_complex) refuse("a complex product is not an element-wise product of its real pairs");
    p.op = is_bool ? reduction::min : reduction::prod;
    break;
  case c10d::ReduceOp::MIN:
  case c10d::ReduceOp::MAX:
    if (is_complex) refuse("complex numbers have no order");
    p.op = kind == c10d::ReduceOp::MIN ? reduction::min : reduction::max;
    break;
  case c10d::ReduceOp::BAND:
  case c10d::ReduceOp::BOR:
  case c10d::ReduceOp::BXOR:
    if (!is_int && !is_bool) refuse("bitwise operators apply to integer and bool tensors only");
    p.op = kind == c10d::ReduceOp::BAND ? reduction::band : kind == c10d::ReduceOp::BOR ? reduction::bor : reduction::bxor;
    break;
  case c10d::ReduceOp::PREMUL_SUM: {
    if (is_int || is_bool) refuse("PREMUL_SUM scales by a real factor: floating-point and complex tensors only");
    auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
    TORCH_CHECK(sup != nullptr, "braid: ", collective, ": ReduceOp.PREMUL_SUM carries no factor");
    if (sup->tensor_factor.defined()) {
      TORCH_CHECK(sup->tensor_factor.numel() == 1, "braid: ", collective, ": PREMUL_SUM's factor tensor must have one element");
      TORCH_CHECK(!sup->tensor_factor.is_complex(), "braid: ", collective, ": PREMUL_SUM's factor must be real");
      p.factor = sup->tensor_factor.to(at::kCPU).item<double>();
    } else {
      p.factor = sup->double_factor;
    }
    p.premul = true;
    p.op = reduction::sum;
    break;
  }
  default: refuse("this operator is not one braid knows");
  }
  return p;
}

} // namespace braid_torch
