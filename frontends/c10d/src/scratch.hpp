// scratch.hpp - staging memory that is reused from one operation to the
// next. A fresh large buffer per call costs a page fault per 4 KiB, which
// on a 64 MiB all-reduce is more than the transfer; so staging comes from
// a few buffers kept between calls, each lent to one work until it ends.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <mutex>
#include <vector>

#include "work.hpp"

namespace mep_c10d {

class ScratchPool : public std::enable_shared_from_this<ScratchPool> {
 public:
  // A contiguous 1-D tensor of `numel` elements of `st`, lent to w until
  // it completes (or is destroyed); its contents are undefined.
  at::Tensor take(MepWork &w, int64_t numel, at::ScalarType st);

 private:
  void give_back(at::Tensor buf);

  static constexpr size_t kKeep = 4;  // idle buffers kept at most
  static constexpr int64_t kMaxIdleBytes = int64_t{1} << 30;
  std::mutex mu_;
  std::vector<at::Tensor> idle_;  // uint8 buffers
};

}  // namespace mep_c10d
