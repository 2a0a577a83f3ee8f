// work.cpp - see work.hpp.
#include "work.hpp"

#include <algorithm>
#include <climits>

#include "errors.hpp"
#include "watcher.hpp"

namespace mep_c10d {

using Clock = std::chrono::steady_clock;

MepWork::MepWork(std::shared_ptr<Comm> comm, int rank, c10d::OpType type,
                 const char *title, std::string what, uint64_t seq,
                 std::vector<at::Tensor> inputs,
                 std::vector<at::Tensor> outputs)
    : Work(rank, type, title, std::optional<std::vector<at::Tensor>>(
                                  std::move(inputs))),
      comm_(std::move(comm)),
      what_(std::move(what)),
      seq_(seq),
      outputs_(std::move(outputs)) {}

MepWork::~MepWork() {
  // The backend keeps a work until its requests finish, so none is running
  // here; a running one would be detached by the core.
  for (mep_req_t *r : reqs_) mep_req_free(r);
}

bool MepWork::requests_done() const {
  for (mep_req_t *r : reqs_) {
    int done = 0;
    mep_req_test(r, &done);
    if (!done) return false;
  }
  return true;
}

void MepWork::wait_slice(int ms) {
  for (mep_req_t *r : reqs_) {
    int done = 0;
    mep_req_test(r, &done);
    if (!done) {
      comm_->wait_request(r, ms);
      return;
    }
  }
}

bool MepWork::poll() {
  {
    std::lock_guard<std::mutex> g(done_mu_);
    if (finished_) return true;
  }
  if (!requests_done()) return false;
  complete();
  return true;
}

bool MepWork::isCompleted() { return poll(); }

void MepWork::complete() {
  std::unique_lock<std::mutex> lk(done_mu_);
  if (finished_) return;
  std::exception_ptr exc;
  std::vector<int> dropped;
  for (mep_req_t *r : reqs_) {
    // A finished request never touches the communicator: safe after close.
    int rc = mep_req_wait(r, 0);
    if (rc < 0 && !exc)
      exc = mep_error(rc, what_, mep_last_error(), comm_->core_timeout_ms());
    if (rc == MEP_OK_DEGRADED) {
      int n = mep_req_dropped(r, nullptr, 0);
      std::vector<int> d(static_cast<size_t>(std::max(n, 0)));
      mep_req_dropped(r, d.data(), n);
      dropped.insert(dropped.end(), d.begin(), d.end());
    }
  }
  std::sort(dropped.begin(), dropped.end());
  dropped.erase(std::unique(dropped.begin(), dropped.end()), dropped.end());
  if (!exc) {
    at::NoGradGuard no_grad;  // copies back into the user's tensors
    try {
      for (auto &f : on_success_) f(dropped);
    } catch (...) {
      exc = std::current_exception();
    }
  }
  on_success_.clear();
  keep_.clear();
  alive_.clear();
  if (!dropped.empty()) comm_->record_dropped(dropped);
  dropped_ = dropped;
  comm_->refresh_active();
  finished_ = true;
  auto fut = future_;
  lk.unlock();
  finish(exc);
  if (fut) settle_future(fut, exc);
}

void MepWork::wait_requests(std::chrono::milliseconds timeout) {
  const long total = timeout.count() > 0
                         ? static_cast<long>(std::min<int64_t>(
                               timeout.count(), INT_MAX))
                     : wait_timeout_.count() >= 0
                         ? static_cast<long>(std::min<int64_t>(
                               wait_timeout_.count(), INT_MAX))
                         : comm_->wait_timeout_ms();
  const auto deadline = Clock::now() + std::chrono::milliseconds(total);
  while (!requests_done()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - Clock::now())
                    .count();
    if (left <= 0)
      std::rethrow_exception(mep_error(
          MEP_ERR_TIMEOUT, what_,
          "it is still running and goes on in the background (wait again, "
          "or destroy the process group)",
          static_cast<int>(total)));
    wait_slice(static_cast<int>(std::min<long>(left, 100)));
  }
}

bool MepWork::wait(std::chrono::milliseconds timeout) {
  wait_requests(timeout);
  complete();
  std::exception_ptr exc = exception();
  if (exc) std::rethrow_exception(exc);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> MepWork::new_future() {
  return c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()));
}

void MepWork::settle_future(const c10::intrusive_ptr<c10::ivalue::Future> &fut,
                            const std::exception_ptr &exc) {
  if (exc)
    fut->setError(exc);
  else
    fut->markCompleted(c10::IValue(outputs_));
}

c10::intrusive_ptr<c10::ivalue::Future> MepWork::getFuture() {
  std::unique_lock<std::mutex> lk(done_mu_);
  if (future_) return future_;
  future_ = new_future();
  auto fut = future_;
  bool finished = finished_;
  lk.unlock();
  if (finished) {
    settle_future(fut, exception());
  } else if (!comm_->watcher().add(
                 c10::intrusive_ptr<MepWork>::reclaim_copy(this))) {
    poll();  // closed: every request is finished
  }
  return fut;
}

int MepWork::sourceRank() const {
  if (!recv_) return Work::sourceRank();  // torch's refusal
  if (!requests_done() || reqs_.empty())
    throw_value(what_ + ": the source rank is known once the receive "
                "finished (wait for it first)");
  int src = mep_req_source(reqs_[0]);
  if (src < 0)
    throw_value(what_ + ": the receive failed, so it has no source rank");
  return src;
}

std::vector<int> MepWork::dropped() {
  std::lock_guard<std::mutex> g(done_mu_);
  return dropped_;
}

}  // namespace mep_c10d
