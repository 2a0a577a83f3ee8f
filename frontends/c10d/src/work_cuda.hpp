// work_cuda.hpp - a work whose operation runs on a CUDA stream (CUDA build).
//
// The core enqueues the collective on the caller's stream and returns; a
// CUDA event recorded after it (and after the copies back into the user's
// tensors) marks where the result is ready. Waiting orders the waiter's
// stream after that event and never blocks the host on the GPU; the mep
// request (when there is one: not under graph capture) tells the outcome,
// which wait() raises once it is known.
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <memory>

#include "work.hpp"

namespace mep_c10d {

// A cudaEvent_t without timing, taken from a per-device pool and given
// back to it when destroyed (creating and destroying one are two driver
// calls per operation otherwise).
class CudaEvent {
 public:
  explicit CudaEvent(c10::DeviceIndex device);
  ~CudaEvent();
  CudaEvent(const CudaEvent &) = delete;
  CudaEvent &operator=(const CudaEvent &) = delete;
  void record(const c10::cuda::CUDAStream &stream);
  // Makes `stream` wait for the recorded work (no host wait).
  void block(const c10::cuda::CUDAStream &stream);
  bool query();

 private:
  c10::DeviceIndex device_;
  cudaEvent_t ev_ = nullptr;
};

class CudaWork : public MepWork {
 public:
  CudaWork(std::shared_ptr<Comm> comm, int rank, c10d::OpType type,
           const char *title, std::string what, uint64_t seq,
           std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
           c10::cuda::CUDAStream stream);

  // The operation and its copies are enqueued: marks their end.
  void record_done();

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;

 protected:
  c10::intrusive_ptr<c10::ivalue::Future> new_future() override;
  void settle_future(const c10::intrusive_ptr<c10::ivalue::Future> &fut,
                     const std::exception_ptr &exc) override;

 private:
  c10::cuda::CUDAStream stream_;
  std::unique_ptr<CudaEvent> done_;  // null under graph capture
};

}  // namespace mep_c10d
