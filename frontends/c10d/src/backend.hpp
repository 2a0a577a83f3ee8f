// backend.hpp - the c10d backend "mep": torch's collectives and
// point-to-point over one mep communicator, plus the fault-tolerance calls
// the Python helpers reach (active ranks, peer state, recovery, growth).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm.hpp"
#include "scratch.hpp"
#include "work.hpp"

#if MEP_C10D_CUDA
#include "cuda_call.hpp"
#endif

namespace mep_c10d {

// Tags from here up carry the backend's own point-to-point messages (the
// monitored barrier's), so users' send and recv refuse them.
constexpr int kInternalTagBase = 1 << 30;

class MepBackend : public c10d::Backend {
 public:
  MepBackend(const c10::intrusive_ptr<c10d::Store> &store,
             const CommConfig &cfg, std::chrono::milliseconds timeout);
  ~MepBackend() override;

  const std::string getBackendName() const override { return "mep"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  void shutdown() override;
  void abort() override { shutdown(); }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor> &tensors,
      const c10d::BroadcastOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor> &tensors,
      const c10d::AllreduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor> &tensors,
      const c10d::AllreduceCoalescedOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor> &tensors,
      const c10d::ReduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>> &outputs,
      std::vector<at::Tensor> &inputs,
      const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor &output, at::Tensor &input,
      const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>> &outputs,
      std::vector<at::Tensor> &inputs,
      const c10d::GatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor> &outputs,
      std::vector<std::vector<at::Tensor>> &inputs,
      const c10d::ScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor> &outputs,
      std::vector<std::vector<at::Tensor>> &inputs,
      const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor &output, at::Tensor &input,
      const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor &output, at::Tensor &input,
      std::vector<int64_t> &output_splits,
      std::vector<int64_t> &input_splits,
      const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>> &outputs,
      std::vector<at::Tensor> &inputs,
      const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors,
                                      int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors,
                                      int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor> &tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions &opts) override;
  // gloo's protocol and messages (ops_monitored.cpp): rank 0 names the
  // ranks that did not arrive within the timeout, or that the core knows
  // failed; the others learn from rank 0 that it failed.
  void monitoredBarrier(const c10d::BarrierOptions &opts,
                        bool wait_all_ranks) override;

  // Fault tolerance, for the Python helpers (see docs/c10d.md).
  at::Tensor active_ranks();
  std::vector<int> peer_state(const std::vector<int64_t> &ranks);
  void recover_ranks(const std::vector<int64_t> &ranks);
  void extend_group_size_to(int size);
  std::vector<int> dropped_ranks() { return comm_->last_dropped(); }
  int slots();
  int max_size() const { return comm_->max_size(); }
  uint64_t epoch();
  // mep_cuda_path's answer ("kernel", "staged"), "" without CUDA.
  // Collective: the first call sets the kernel path up.
  std::string cuda_path();

 private:
  using Submit = std::function<int(mep_comm_t *, mep_req_t **)>;
  using Body = std::function<void(MepWork &)>;

  c10::intrusive_ptr<MepWork> make_work(c10d::OpType type, const char *title,
                                        std::string what,
                                        std::vector<at::Tensor> inputs,
                                        std::vector<at::Tensor> outputs);
  // Runs body (which submits the requests) and hands the work out; a work
  // whose later submission failed is still tracked until the requests it
  // has finish, so their buffers stay alive.
  c10::intrusive_ptr<c10d::Work> issue(const c10::intrusive_ptr<MepWork> &w,
                                       const Body &body);
  // One request of the work; `sized`: the operation depends on the group
  // size, which must agree with the core's after growth. `want_req` false:
  // f gets no request pointer (CUDA graph capture) and none is tracked.
  void submit(MepWork &w, bool sized, const Submit &f, bool want_req = true);
  void track(const c10::intrusive_ptr<MepWork> &w);
  // Completes the tracked works whose requests finished.
  void sweep();
  // Waits for every tracked work (before recovery).
  void drain();
  void check_root(const char *op, int64_t root);
  void check_tag(const char *op, int tag);
  // recv, and recv from any source with src MEP_ANY_SOURCE.
  c10::intrusive_ptr<c10d::Work> recv_from(std::vector<at::Tensor> &tensors,
                                           int src, int tag);
  // One all-gather / reduce-scatter between flat tensors, as part of w.
  void gather_into(MepWork &w, const char *op, at::Tensor &out,
                   at::Tensor &in);
  void reduce_scatter_into(MepWork &w, const char *op, at::Tensor &out,
                           at::Tensor &in, const c10d::ReduceOp &rop);
  std::string what(const char *op, const at::Tensor &t) const;
  // Staging lent to w (see scratch.hpp).
  at::Tensor scratch(MepWork &w, int64_t numel, at::ScalarType st) {
    return scratch_->take(w, numel, st);
  }

#if MEP_C10D_CUDA
  // The operations on CUDA tensors (ops_cuda.cpp), each entered from its
  // host counterpart once mem_path said Cuda.
  c10::intrusive_ptr<CudaWork> make_cuda_work(
      const CudaCall &cc, c10d::OpType type, const char *title,
      std::string what, std::vector<at::Tensor> inputs,
      std::vector<at::Tensor> outputs);
  // submit() on the call's stream: without a request under graph capture.
  void submit_cuda(CudaWork &w, const CudaCall &cc, bool sized,
                   const Submit &f);
  c10::intrusive_ptr<c10d::Work> cuda_broadcast(
      std::vector<at::Tensor> &tensors, const c10d::BroadcastOptions &opts);
  c10::intrusive_ptr<c10d::Work> cuda_allreduce(
      std::vector<at::Tensor> &tensors, const c10d::ReduceOp &rop,
      const char *op, c10d::OpType type);
  c10::intrusive_ptr<c10d::Work> cuda_reduce(
      std::vector<at::Tensor> &tensors, const c10d::ReduceOptions &opts);
  // all_gather into the list outs, and gather (outs empty off the root).
  c10::intrusive_ptr<c10d::Work> cuda_allgather(
      const char *op, c10d::OpType type, const char *title,
      std::vector<at::Tensor> &outs, at::Tensor &in);
  c10::intrusive_ptr<c10d::Work> cuda_scatter(
      at::Tensor &out, std::vector<at::Tensor> &ins, int root);
  c10::intrusive_ptr<c10d::Work> cuda_gather_into(
      const char *op, c10d::OpType type, std::vector<at::Tensor> &outputs,
      std::vector<at::Tensor> &inputs);
  c10::intrusive_ptr<c10d::Work> cuda_reduce_scatter(
      at::Tensor &out, std::vector<at::Tensor> &ins,
      const c10d::ReduceOp &rop);
  c10::intrusive_ptr<c10d::Work> cuda_reduce_scatter_from(
      const char *op, c10d::OpType type, std::vector<at::Tensor> &outputs,
      std::vector<at::Tensor> &inputs, const c10d::ReduceOp &rop);
  c10::intrusive_ptr<c10d::Work> cuda_alltoall(
      at::Tensor &output, at::Tensor &input,
      const std::vector<int64_t> &out_splits,
      const std::vector<int64_t> &in_splits);
  c10::intrusive_ptr<c10d::Work> cuda_alltoall_list(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs);
  // The all-to-all of pieces of any size (ops_cuda.cpp says how).
  struct Pieces;
  // Returns how the ranks disagree on the sizes, or "".
  std::string cuda_alltoall_pieces(CudaWork &w, CudaCall &cc,
                                   const Pieces &pc);
#endif

  // The group's size, which grows with extend_group_size_to (older torch
  // keeps Backend::size_ const, so the shim has its own).
  int group_size_;
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<ScratchPool> scratch_ = std::make_shared<ScratchPool>();
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> seq_{0};
  std::mutex pending_mu_;
  std::vector<c10::intrusive_ptr<MepWork>> pending_;

  // The monitored barrier's messages (ops_monitored.cpp). One whose wait
  // ended while it still ran is kept, with its buffer, until it finishes.
  struct Msg {
    mep_req_t *req = nullptr;
    std::vector<int32_t> buf;  // what it sends, or room for what comes
    int rc = MEP_OK;           // a failed submission: its code and message
    std::string err;
    ~Msg() { mep_req_free(req); }  // only once finished (keep_stale)
  };
  std::unique_ptr<Msg> post_msg(bool is_send, int peer, int tag,
                                std::vector<int32_t> payload, size_t room);
  // Waits up to ms (0: only looks) on m; true once it finished.
  bool wait_msg(Msg &m, int64_t ms);
  void keep_stale(std::unique_ptr<Msg> m);
  void sweep_stale(bool all);
  // Rank 0 tells every other rank that the barrier failed, naming `failed`.
  void monitored_notify(int arrive_tag, const std::vector<int> &failed,
                        int64_t timeout_ms);
  std::atomic<uint64_t> monitored_seq_{0};
  std::mutex stale_mu_;
  std::vector<std::unique_ptr<Msg>> stale_;
};

}  // namespace mep_c10d
