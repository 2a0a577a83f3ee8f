// cuda_call.hpp - what one operation on CUDA tensors needs around the core
// call (CUDA build): the device (the tensors'), a guard for it, its current
// stream, whether that stream is capturing a graph, and contiguous tensors
// on that device for the core, with the copies back after the call.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <utility>
#include <vector>

#include "work_cuda.hpp"

namespace mep_c10d {

class CudaCall {
 public:
  // `tensors`: the operation's, all CUDA; the first defined one picks the
  // device (the others are staged onto it).
  CudaCall(const char *op, const std::vector<at::Tensor> &tensors);

  c10::cuda::CUDAStream stream() const { return stream_; }
  void *raw_stream() const { return stream_.stream(); }
  bool capturing() const { return capturing_; }

  // A contiguous tensor on the device with t's values (t itself if it is one).
  at::Tensor in(const at::Tensor &t);
  // The same, whose values go back into t after the call.
  at::Tensor inout(const at::Tensor &t);
  // A contiguous tensor on the device for results, copied into t after.
  at::Tensor out(const at::Tensor &t);
  // Fresh contiguous 1-D staging on the device.
  at::Tensor temp(int64_t numel, at::ScalarType st);
  // After the call: copies src into dst (dst's shape), on the stream.
  void copy_after(const at::Tensor &dst, const at::Tensor &src);

  // Enqueues the copies back, keeps every tensor's memory from reuse
  // until the stream passed this point, and records the work's event.
  void finish(CudaWork &w);

 private:
  at::Tensor stage(const at::Tensor &t, bool copy_in);
  void use(const at::Tensor &t) { used_.push_back(t); }

  c10::Device device_;
  c10::cuda::CUDAGuard guard_;
  c10::cuda::CUDAStream stream_;
  bool capturing_;
  std::vector<std::pair<at::Tensor, at::Tensor>> after_;  // dst, src
  std::vector<at::Tensor> used_;
};

// The device address of t's data for the core (null for no elements: the
// caller skips the core for empty operations).
void *cuda_ptr(const at::Tensor &t);

}  // namespace mep_c10d
