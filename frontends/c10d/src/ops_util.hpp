// ops_util.hpp - small pieces the operation files share.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

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
