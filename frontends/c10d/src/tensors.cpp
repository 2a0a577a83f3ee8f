// tensors.cpp - see tensors.hpp.
#include "tensors.hpp"

#include "errors.hpp"

namespace mep_c10d {

MemPath mem_path(const char *op, const std::vector<at::Tensor> &tensors) {
  bool cuda = false, host = false;
  for (const auto &t : tensors) {
    if (!t.defined()) continue;
    if (t.is_sparse()) throw_type(std::string(op) + ": sparse tensors are not supported");
    if (t.is_cuda())
      cuda = true;
    else if (t.device().is_cpu())
      host = true;
    else
      throw_type(std::string(op) + ": tensors on " + t.device().str() +
                 " are not supported (cpu; cuda with the CUDA build)");
  }
  if (cuda && host)
    throw_value(std::string(op) +
                ": CPU and CUDA tensors mixed in one operation");
  return cuda ? MemPath::Cuda : MemPath::Host;
}

void require_host(const char *op, MemPath path) {
#if MEP_C10D_CUDA
  // Only point-to-point has no CUDA path in this build.
  if (path == MemPath::Cuda)
    throw_type(std::string(op) +
               ": not supported on CUDA tensors yet (point-to-point: send, "
               "recv, isend, irecv, batch_isend_irecv; every collective is); "
               "move the tensors with .cpu(), or use "
               "backend=\"cpu:mep,cuda:nccl\"");
#endif
  if (path == MemPath::Cuda)
    throw_type(std::string(op) +
               ": CUDA tensors come with the CUDA build of the mep backend; "
               "this build handles CPU tensors (move them with .cpu(), or "
               "use backend=\"cpu:mep,cuda:nccl\")");
}

static bool core_dtype(at::ScalarType st, mep_dtype_t *out) {
  switch (st) {
    case at::kHalf: *out = MEP_FLOAT16; return true;
    case at::kBFloat16: *out = MEP_BFLOAT16; return true;
    case at::kFloat: *out = MEP_FLOAT32; return true;
    case at::kDouble: *out = MEP_FLOAT64; return true;
    case at::kChar: *out = MEP_INT8; return true;
    case at::kByte: *out = MEP_UINT8; return true;
    case at::kInt: *out = MEP_INT32; return true;
    case at::kLong: *out = MEP_INT64; return true;
    case at::kBool: *out = MEP_BOOL; return true;
    default: return false;
  }
}

size_t elems_of(const at::Tensor &t, mep_dtype_t dtype) {
  return static_cast<size_t>(t.numel()) * t.element_size() /
         mep_dtype_size(dtype);
}

Elems move_elems(const at::Tensor &t) {
  mep_dtype_t dt;
  if (!core_dtype(t.scalar_type(), &dt)) dt = MEP_UINT8;
  return {dt, elems_of(t, dt)};
}

static std::string op_name(const c10d::ReduceOp &rop) {
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "op " + std::to_string(static_cast<int>(rop.op_));
  }
}

mep_op_t reduce_op(const char *op, const c10d::ReduceOp &rop,
                   at::ScalarType st) {
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: return MEP_SUM;
    case c10d::ReduceOp::PRODUCT: return MEP_PROD;
    case c10d::ReduceOp::MIN: return MEP_MIN;
    case c10d::ReduceOp::MAX: return MEP_MAX;
    case c10d::ReduceOp::AVG:
      if (st == at::kBool)
        throw_type(std::string(op) + ": ReduceOp.AVG on bool tensors");
      return MEP_AVG;
    default:
      throw_value(std::string(op) + ": ReduceOp." + op_name(rop) +
                  " is not supported (SUM, AVG, PRODUCT, MIN, MAX are)");
  }
}

Elems reduce_elems(const char *op, const at::Tensor &t,
                   const c10d::ReduceOp &rop) {
  mep_dtype_t dt;
  if (core_dtype(t.scalar_type(), &dt)) return {dt, elems_of(t, dt)};
  bool pairs = rop.op_ == c10d::ReduceOp::SUM || rop.op_ == c10d::ReduceOp::AVG;
  if (t.scalar_type() == at::kComplexFloat && pairs)
    return {MEP_FLOAT32, elems_of(t, MEP_FLOAT32)};
  if (t.scalar_type() == at::kComplexDouble && pairs)
    return {MEP_FLOAT64, elems_of(t, MEP_FLOAT64)};
  throw_type(std::string(op) + ": cannot reduce " +
             dtype_name(t.scalar_type()) +
             " tensors (float16, bfloat16, float32, float64, int8, uint8, "
             "int32, int64, bool; complex for SUM and AVG)");
}

at::Tensor contiguous_or_copy(const at::Tensor &t) {
  return t.is_contiguous() ? t : t.contiguous();
}

void *data_of(const at::Tensor &t) {
  static char empty;
  void *p = t.numel() ? t.data_ptr() : nullptr;
  return p ? p : &empty;
}

std::string dtype_name(at::ScalarType st) {
  switch (st) {
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: return c10::toString(st);
  }
}

std::string describe(const at::Tensor &t) {
  return std::to_string(t.numel()) + " " + dtype_name(t.scalar_type()) +
         " elements";
}

void check_same(const char *op, const char *what,
                const std::vector<at::Tensor> &list, const at::Tensor &like) {
  for (size_t i = 0; i < list.size(); i++) {
    const auto &t = list[i];
    if (t.scalar_type() != like.scalar_type() || t.numel() != like.numel())
      throw_value(std::string(op) + ": " + what + "[" + std::to_string(i) +
                  "] has " + describe(t) + ", expected " + describe(like));
  }
}

void check_count(const char *op, const char *what, size_t got, size_t want) {
  if (got != want)
    throw_value(std::string(op) + ": " + what + " has " + std::to_string(got) +
                " entries, expected " + std::to_string(want));
}

}  // namespace mep_c10d
