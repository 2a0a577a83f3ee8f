// tensors.hpp - what the shim checks and converts about tensors: devices,
// dtypes, reduce ops, and contiguous staging for tensors that are not.
#pragma once

#include <ATen/ATen.h>
#include <mep/mep.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

namespace mep_c10d {

// Where an operation's tensors live. Every operation asks this first and
// refuses what it has no path for (require_host); in the CUDA build the
// operations with a CUDA path branch off to ops_cuda.cpp at that point.
enum class MemPath { Host, Cuda };
MemPath mem_path(const char *op, const std::vector<at::Tensor> &tensors);
void require_host(const char *op, MemPath path);

// How the core sees a tensor's elements.
struct Elems {
  mep_dtype_t dtype;
  size_t count;  // in units of dtype
};

// For reductions: the dtype itself (complex as pairs of reals for sum and
// avg). TypeError for a dtype the core cannot reduce.
Elems reduce_elems(const char *op, const at::Tensor &t,
                   const c10d::ReduceOp &rop);
mep_op_t reduce_op(const char *op, const c10d::ReduceOp &rop,
                   at::ScalarType st);
// For data movement: the dtype when the core knows it (its mismatch check
// covers it), else raw bytes, so every dtype moves.
Elems move_elems(const at::Tensor &t);
size_t elems_of(const at::Tensor &t, mep_dtype_t dtype);

// The tensor itself when it is contiguous, else a contiguous copy (the
// caller copies results back).
at::Tensor contiguous_or_copy(const at::Tensor &t);
// A non-null pointer the core may be given for zero elements.
void *data_of(const at::Tensor &t);

// Checks every tensor of a list has the dtype and element count of `like`.
void check_same(const char *op, const char *what,
                const std::vector<at::Tensor> &list, const at::Tensor &like);
void check_count(const char *op, const char *what, size_t got, size_t want);
std::string describe(const at::Tensor &t);
// "float32", "int64", ... as torch spells them in Python.
std::string dtype_name(at::ScalarType st);

}  // namespace mep_c10d
