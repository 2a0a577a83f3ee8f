// work_cuda.cpp - see work_cuda.hpp.
#include "work_cuda.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace mep_c10d {

namespace {

// Free events per device. Re-recording an event whose earlier record is
// still pending is fine: a stream that waited on it already took the
// record it waits for, and nothing queries it once its work is gone.
// Never destroyed: the process's exit, not a static destructor running
// after the CUDA runtime's, frees what it holds.
class EventPool {
 public:
  static EventPool &get() {
    static EventPool *pool = new EventPool();
    return *pool;
  }

  // A free event of `device`, or nullptr (the caller makes one).
  cudaEvent_t take(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = free_.find(device);
    if (it == free_.end() || it->second.empty()) return nullptr;
    cudaEvent_t ev = it->second.back();
    it->second.pop_back();
    return ev;
  }

  // False when full: the caller destroys it.
  bool give(c10::DeviceIndex device, cudaEvent_t ev) {
    std::lock_guard<std::mutex> g(mu_);
    auto &v = free_[device];
    if (v.size() >= kMaxPerDevice) return false;
    v.push_back(ev);
    return true;
  }

 private:
  // More than the works usually in flight on one device at a time.
  static constexpr size_t kMaxPerDevice = 256;
  std::mutex mu_;
  std::unordered_map<c10::DeviceIndex, std::vector<cudaEvent_t>> free_;
};

}  // namespace

CudaEvent::CudaEvent(c10::DeviceIndex device)
    : device_(device), ev_(EventPool::get().take(device)) {
  if (ev_) return;
  c10::cuda::CUDAGuard g(device_);
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  if (EventPool::get().give(device_, ev_)) return;
  c10::cuda::CUDAGuard g(device_);
  cudaEventDestroy(ev_);  // a destructor reports nothing
}

void CudaEvent::record(const c10::cuda::CUDAStream &stream) {
  c10::cuda::CUDAGuard g(device_);
  C10_CUDA_CHECK(cudaEventRecord(ev_, stream.stream()));
}

void CudaEvent::block(const c10::cuda::CUDAStream &stream) {
  c10::cuda::CUDAGuard g(stream.device_index());
  C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), ev_, 0));
}

bool CudaEvent::query() {
  c10::cuda::CUDAGuard g(device_);
  cudaError_t rc = cudaEventQuery(ev_);
  if (rc == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: leave no trace of it
    return false;
  }
  C10_CUDA_CHECK(rc);
  return true;
}

CudaWork::CudaWork(std::shared_ptr<Comm> comm, int rank, c10d::OpType type,
                   const char *title, std::string what, uint64_t seq,
                   std::vector<at::Tensor> inputs,
                   std::vector<at::Tensor> outputs,
                   c10::cuda::CUDAStream stream)
    : MepWork(std::move(comm), rank, type, title, std::move(what), seq,
              std::move(inputs), std::move(outputs)),
      stream_(stream) {}

void CudaWork::record_done() {
  done_ = std::make_unique<CudaEvent>(stream_.device_index());
  done_->record(stream_);
}

bool CudaWork::isCompleted() {
  if (!poll()) return false;
  return !done_ || done_->query();
}

void CudaWork::synchronize() {
  if (!done_) return;
  // The operation's own stream is ordered after it already: the wait
  // would be a driver call that orders nothing more.
  auto cur = c10::cuda::getCurrentCUDAStream(stream_.device_index());
  if (cur != stream_) done_->block(cur);
}

bool CudaWork::wait(std::chrono::milliseconds) {
  synchronize();
  // The outcome only when already known: the GPU work goes on without
  // the host, and a later wait (or the next operation) reports a failure.
  if (poll()) {
    std::exception_ptr exc = exception();
    if (exc) std::rethrow_exception(exc);
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> CudaWork::new_future() {
  std::vector<c10::Device> devs{stream_.device()};
  for (const auto &t : outputs())
    if (t.defined() && t.is_cuda() &&
        std::find(devs.begin(), devs.end(), t.device()) == devs.end())
      devs.push_back(t.device());
  return c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), devs);
}

void CudaWork::settle_future(
    const c10::intrusive_ptr<c10::ivalue::Future> &fut,
    const std::exception_ptr &exc) {
  // The future records its own events on the current streams: on the
  // work's stream they follow the operation, wherever this thread runs.
  c10::cuda::CUDAStreamGuard g(stream_);
  MepWork::settle_future(fut, exc);
}

}  // namespace mep_c10d
