// cuda_call.cpp - see cuda_call.hpp.
#include "cuda_call.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>

#include "errors.hpp"

namespace mep_c10d {

static c10::Device device_of(const char *op,
                             const std::vector<at::Tensor> &tensors) {
  for (const auto &t : tensors)
    if (t.defined()) return t.device();
  throw_value(std::string(op) + ": no tensor to take the CUDA device from");
}

static bool stream_capturing(const c10::cuda::CUDAStream &s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(s.stream(), &st));
  return st != cudaStreamCaptureStatusNone;
}

CudaCall::CudaCall(const char *op, const std::vector<at::Tensor> &tensors)
    : device_(device_of(op, tensors)),
      guard_(device_),
      stream_(c10::cuda::getCurrentCUDAStream(device_.index())),
      capturing_(stream_capturing(stream_)) {}

at::Tensor CudaCall::stage(const at::Tensor &t, bool copy_in) {
  if (t.is_contiguous() && t.device() == device_) {
    use(t);
    return t;
  }
  // A tensor with gaps, or on another GPU: the core gets a dense copy on
  // the operation's device (torch orders the copy after t's own stream).
  at::Tensor c = at::empty(t.sizes(), t.options().device(device_)
                                          .memory_format(at::MemoryFormat::Contiguous));
  if (copy_in) c.copy_(t);
  use(c);
  return c;
}

at::Tensor CudaCall::in(const at::Tensor &t) { return stage(t, true); }

at::Tensor CudaCall::inout(const at::Tensor &t) {
  at::Tensor c = stage(t, true);
  if (!c.is_same(t)) after_.emplace_back(t, c);
  return c;
}

at::Tensor CudaCall::out(const at::Tensor &t) {
  at::Tensor c = stage(t, false);
  if (!c.is_same(t)) after_.emplace_back(t, c);
  return c;
}

at::Tensor CudaCall::temp(int64_t numel, at::ScalarType st) {
  at::Tensor c = at::empty({numel}, at::TensorOptions(st).device(device_));
  use(c);
  return c;
}

void CudaCall::copy_after(const at::Tensor &dst, const at::Tensor &src) {
  after_.emplace_back(dst, src);
}

void CudaCall::finish(CudaWork &w) {
  at::NoGradGuard no_grad;
  for (auto &p : after_) {
    at::Tensor dst = p.first;
    dst.copy_(p.second.view(dst.sizes()));
    use(dst);
  }
  after_.clear();
  if (capturing_) return;  // the graph's memory pool owns what it used
  // The caching allocator must not hand these blocks to another stream
  // before this one passed the operation.
  for (const auto &t : used_)
    if (t.defined() && t.device() == device_ &&
        t.storage().data_ptr().get())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(),
                                                    stream_);
  used_.clear();
  w.record_done();
}

void *cuda_ptr(const at::Tensor &t) {
  return t.numel() ? t.data_ptr() : nullptr;
}

}  // namespace mep_c10d
