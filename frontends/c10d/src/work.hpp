// work.hpp - a c10d::Work over the mep requests of one operation.
//
// A work owns its requests, the staging tensors the core reads and writes,
// and the copies back into the user's tensors that follow success. It is
// completed once, by whichever comes first: wait(), isCompleted(), the
// backend's sweep, or the watcher (when a future was asked for).
#pragma once

#include <ATen/ATen.h>
#include <mep/mep.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm.hpp"

namespace mep_c10d {

class MepWork : public c10d::Work {
 public:
  MepWork(std::shared_ptr<Comm> comm, int rank, c10d::OpType type,
          const char *title, std::string what, uint64_t seq,
          std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs);
  ~MepWork() override;

  // Building, before the work is handed out.
  void add_request(mep_req_t *req) { reqs_.push_back(req); }
  void keep(const at::Tensor &t) { keep_.push_back(t); }
  void keep_alive(std::shared_ptr<void> p) { alive_.push_back(std::move(p)); }
  // Runs on success, in order, with the ranks the operation dropped (their
  // blocks of the result are to be left alone); an exception it throws
  // fails the work.
  using Then = std::function<void(const std::vector<int> &dropped)>;
  void on_success(Then f) { on_success_.push_back(std::move(f)); }
  const std::string &what() const { return what_; }
  mep_req_t *request(size_t i) const { return reqs_[i]; }
  // A receive: sourceRank() names the sender of what it received.
  void mark_recv() { recv_ = true; }
  // The deadline of wait() without a timeout, in place of the group's
  // (a barrier's own timeout); negative: the group's.
  void set_wait_timeout(std::chrono::milliseconds t) { wait_timeout_ = t; }

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return seq_; }
  // For a finished receive: the group rank whose message it received (the
  // one named, or for recv from any source the sender); torch's
  // Work._source_rank() and dist.recv() without src return it.
  int sourceRank() const override;

  // True once finished; completes the work when its requests are done.
  bool poll();
  // Sleeps up to ms on the first unfinished request.
  void wait_slice(int ms);
  // Whether every request finished (the work may not be completed yet).
  bool requests_done() const;
  // Ranks the operation dropped (MEP_OK_DEGRADED), once finished.
  std::vector<int> dropped();
  // Blocks until every request finished (timeout 0: the communicator's
  // wait deadline); throws MEP_ERR_TIMEOUT past it. Completes nothing.
  void wait_requests(std::chrono::milliseconds timeout);

 protected:
  // The future getFuture hands out, and how it is settled: a CUDA work's
  // future carries its device and becomes ready on the work's stream.
  virtual c10::intrusive_ptr<c10::ivalue::Future> new_future();
  virtual void settle_future(
      const c10::intrusive_ptr<c10::ivalue::Future> &fut,
      const std::exception_ptr &exc);
  const std::vector<at::Tensor> &outputs() const { return outputs_; }

 private:
  void complete();

  std::shared_ptr<Comm> comm_;
  std::string what_;
  uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  std::vector<mep_req_t *> reqs_;
  std::vector<at::Tensor> keep_;
  std::vector<std::shared_ptr<void>> alive_;
  std::vector<Then> on_success_;
  bool recv_ = false;
  std::chrono::milliseconds wait_timeout_{-1};

  std::mutex done_mu_;
  bool finished_ = false;
  std::vector<int> dropped_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace mep_c10d
