// ops_util.hpp - small pieces the operation files share.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "errors.hpp"
#include "tensors.hpp"
#include "work.hpp"

namespace mep_c10d {

// Work types of the coalesced tensor collectives, which older torch lacks
// (meson defines MEP_C10D_HAVE_TENSOR_COALESCED where it has them).
#if MEP_C10D_HAVE_TENSOR_COALESCED
constexpr c10d::OpType kAllgatherIntoTensorCoalesced =
    c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED;
constexpr c10d::OpType kReduceScatterTensorCoalesced =
    c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
constexpr c10d::OpType kAllgatherIntoTensorCoalesced = c10d::OpType::COALESCED;
constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::COALESCED;
#endif

// After success, copies the staging buffer back into the user's tensor
// (nothing when the core worked on the user's tensor itself).
inline void copy_back(MepWork &w, const at::Tensor &dst,
                      const at::Tensor &src) {
  if (src.is_same(dst)) return;
  w.on_success([dst, src](const std::vector<int> &) mutable {
    dst.copy_(src.view(dst.sizes()));
  });
}

// After success, copies block r of `flat` (`n` elements each) into
// outs[r], except the blocks of ranks the operation dropped.
inline void scatter_back(MepWork &w, const std::vector<at::Tensor> &outs,
                         const at::Tensor &flat, int64_t n) {
  w.on_success([outs, flat, n](const std::vector<int> &dropped) {
    for (size_t r = 0; r < outs.size(); r++) {
      bool lost = false;
      for (int d : dropped) lost |= d == static_cast<int>(r);
      if (lost) continue;
      at::Tensor dst = outs[r];
      dst.copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n)
                    .view(dst.sizes()));
    }
  });
}

// Elements of one row of dim 0 (the whole tensor for a 0-dim one).
inline int64_t row_numel(const at::Tensor &t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); d++) n *= t.size(d);
  return n;
}

// all_to_all_single's rows of dim 0 per rank on one side ("input",
// "output"): the split sizes given, checked, or an even share.
inline std::vector<int64_t> split_rows(const char *op, const char *side,
                                       const at::Tensor &t,
                                       const std::vector<int64_t> &splits,
                                       int size) {
  int64_t rows = t.dim() ? t.size(0) : 1;
  std::vector<int64_t> s = splits;
  if (s.empty()) {
    if (rows % size)
      throw_value(std::string(op) + ": the " + side + " tensor has " +
                  std::to_string(rows) + " rows, not divisible by " +
                  std::to_string(size) + " ranks; pass split sizes");
    s.assign(static_cast<size_t>(size), rows / size);
  }
  check_count(op, side, s.size(), static_cast<size_t>(size));
  int64_t sum = 0;
  for (int64_t v : s) {
    if (v < 0)
      throw_value(std::string(op) + ": negative " + side + " split size " +
                  std::to_string(v));
    sum += v;
  }
  if (sum != rows)
    throw_value(std::string(op) + ": the " + side + " split sizes add up to " +
                std::to_string(sum) + " rows, the tensor has " +
                std::to_string(rows));
  return s;
}

// all_to_all_single without split sizes: equal blocks, so both tensors
// hold the same number of elements, divisible by the group's size.
inline void check_equal_blocks(const char *op, const at::Tensor &input,
                               const at::Tensor &output, int size) {
  if (input.numel() != output.numel() || input.numel() % size)
    throw_value(std::string(op) + ": the input has " + describe(input) +
                " and the output " + describe(output) +
                "; without split sizes both need the same number, "
                "divisible by " + std::to_string(size));
}

inline int64_t total_numel(const std::vector<at::Tensor> &list) {
  int64_t total = 0;
  for (const auto &t : list) total += t.numel();
  return total;
}

// The list's tensors one after the other in `flat` (total_numel elements).
inline at::Tensor flatten_into(const at::Tensor &flat,
                               const std::vector<at::Tensor> &list) {
  int64_t off = 0;
  for (const auto &t : list) {
    flat.narrow(0, off, t.numel()).copy_(t.reshape({-1}));
    off += t.numel();
  }
  return flat;
}

inline std::vector<at::Tensor> concat(std::vector<at::Tensor> a,
                                      const std::vector<at::Tensor> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace mep_c10d
