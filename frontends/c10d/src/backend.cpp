// backend.cpp - the backend's life cycle, its request tracking and the
// fault-tolerance calls; the operations are in ops_*.cpp.
#include "backend.hpp"

#include <algorithm>
#include <climits>

#include "errors.hpp"
#include "tensors.hpp"

namespace mep_c10d {

MepBackend::MepBackend(const c10::intrusive_ptr<c10d::Store> &store,
                       const CommConfig &cfg,
                       std::chrono::milliseconds timeout)
    : Backend(cfg.rank, cfg.size),
      group_size_(cfg.size),
      comm_(std::make_shared<Comm>(store, cfg)),
      timeout_(timeout) {
  init();
}

MepBackend::~MepBackend() { shutdown(); }

c10::intrusive_ptr<c10d::Backend::Options> MepBackend::getBackendOptions() {
  return c10::make_intrusive<Options>("mep", timeout_);
}

void MepBackend::setTimeout(std::chrono::milliseconds timeout) {
  // The core's deadline is fixed at creation; this bounds waits without a
  // timeout of their own.
  timeout_ = timeout;
  comm_->set_wait_timeout_ms(static_cast<int>(
      std::min<int64_t>(timeout.count() + 5000, INT_MAX)));
}

void MepBackend::shutdown() {
  comm_->close();
  // Every request finished when the communicator closed.
  sweep();
  sweep_stale(true);
}

std::string MepBackend::what(const char *op, const at::Tensor &t) const {
  return std::string(op) + " of " + describe(t) + " (rank " +
         std::to_string(rank_) + " of " + std::to_string(group_size_) + ")";
}

c10::intrusive_ptr<MepWork> MepBackend::make_work(
    c10d::OpType type, const char *title, std::string what,
    std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<MepWork>(comm_, rank_, type, title,
                                      std::move(what), ++seq_,
                                      std::move(inputs), std::move(outputs));
}

void MepBackend::submit(MepWork &w, bool sized, const Submit &f,
                        bool want_req) {
  Comm::Use u(*comm_);
  if (!u) throw_closed(w.what());
  if (sized && mep_comm_size(u.get()) != group_size_)
    throw_value(w.what() + ": the group has " +
                std::to_string(mep_comm_size(u.get())) +
                " rank slots since it grew; call "
                "mep.extend_group_size_to(pg, " +
                std::to_string(mep_comm_size(u.get())) + ") first");
  mep_req_t *req = nullptr;
  int rc = f(u.get(), want_req ? &req : nullptr);
  if (rc < 0) throw_mep(rc, w.what());
  if (req) w.add_request(req);
}

c10::intrusive_ptr<c10d::Work> MepBackend::issue(
    const c10::intrusive_ptr<MepWork> &w, const Body &body) {
  sweep();
  // Staging copies are not part of any autograd graph (and the user's
  // tensors may be leaves that require grad).
  at::NoGradGuard no_grad;
  try {
    body(*w);
  } catch (...) {
    track(w);
    throw;
  }
  track(w);
  return w;
}

void MepBackend::track(const c10::intrusive_ptr<MepWork> &w) {
  std::lock_guard<std::mutex> g(pending_mu_);
  pending_.push_back(w);
}

void MepBackend::sweep() {
  std::vector<c10::intrusive_ptr<MepWork>> done;
  {
    std::lock_guard<std::mutex> g(pending_mu_);
    auto mid = std::stable_partition(
        pending_.begin(), pending_.end(),
        [](const c10::intrusive_ptr<MepWork> &w) {
          return !w->requests_done();
        });
    done.assign(std::make_move_iterator(mid),
                std::make_move_iterator(pending_.end()));
    pending_.erase(mid, pending_.end());
  }
  // Outside the lock: completing runs copies and future callbacks, which
  // may issue operations of their own.
  for (auto &w : done) w->poll();
}

void MepBackend::drain() {
  std::vector<c10::intrusive_ptr<MepWork>> all;
  {
    std::lock_guard<std::mutex> g(pending_mu_);
    all = pending_;
  }
  for (auto &w : all) {
    try {
      // Not wait(): a CUDA work's wait does not block the host.
      w->wait_requests(std::chrono::milliseconds(0));
      w->poll();
    } catch (const std::exception &) {
      // Its owner sees the error when it waits; recovery goes on.
    }
  }
  sweep();
}

void MepBackend::check_root(const char *op, int64_t root) {
  if (root < 0 || root >= group_size_)
    throw_value(std::string(op) + ": root rank " + std::to_string(root) +
                " is not in [0, " + std::to_string(group_size_) + ")");
}

// ----------------------------------------------------- fault tolerance

at::Tensor MepBackend::active_ranks() {
  comm_->refresh_active();
  at::Tensor t = comm_->active_ranks();
  return t.narrow(0, 0, std::min<int64_t>(t.numel(), group_size_));
}

std::vector<int> MepBackend::peer_state(const std::vector<int64_t> &ranks) {
  const int max = comm_->max_size();
  for (int64_t r : ranks)
    if (r < 0 || r >= max)
      throw_value("get_peer_state: rank " + std::to_string(r) +
                  " is not in [0, " + std::to_string(max) +
                  ") (the group's max_size)");
  std::vector<mep_peer_state_t> st(static_cast<size_t>(max));
  {
    Comm::Use u(*comm_);
    if (!u) throw_closed("get_peer_state");
    int rc = mep_comm_peer_state(u.get(), st.data(), max);
    if (rc < 0) throw_mep(rc, "get_peer_state");
  }
  std::vector<int> out;
  for (int64_t r : ranks) out.push_back(static_cast<int>(st[r]));
  return out;
}

void MepBackend::recover_ranks(const std::vector<int64_t> &ranks) {
  std::vector<int> rs;
  for (int64_t r : ranks) {
    if (r < 0 || r >= comm_->max_size())
      throw_value("recover_ranks: rank " + std::to_string(r) +
                  " is not in [0, " + std::to_string(comm_->max_size()) +
                  ") (the group's max_size)");
    rs.push_back(static_cast<int>(r));
  }
  // The core admits ranks only while no collective runs.
  drain();
  {
    Comm::Use u(*comm_);
    if (!u) throw_closed("recover_ranks");
    int rc = mep_comm_recover_ranks(u.get(), rs.data(),
                                    static_cast<int>(rs.size()));
    if (rc < 0) {
      std::string msg = mep_last_error();
      std::string serr = comm_->store_error();
      if (!serr.empty()) msg += "; the store said: " + serr;
      std::rethrow_exception(mep_error(rc, "recover_ranks", msg));
    }
  }
  comm_->refresh_active();
}

void MepBackend::extend_group_size_to(int size) {
  Comm::Use u(*comm_);
  if (!u) throw_closed("extend_group_size_to");
  int slots = mep_comm_size(u.get());
  if (size < group_size_)
    throw_value("extend_group_size_to(" + std::to_string(size) +
                "): the group has " + std::to_string(group_size_) +
                " ranks and cannot shrink");
  if (size > slots)
    throw_value("extend_group_size_to(" + std::to_string(size) +
                "): only " + std::to_string(slots) +
                " rank slots were admitted (recover_ranks admits the new "
                "ranks first; max_size is " +
                std::to_string(comm_->max_size()) + ")");
  group_size_ = size;
#if MEP_C10D_SIZE_MUTABLE
  size_ = size; /* getSize() follows where torch lets it */
#endif
}

int MepBackend::slots() {
  Comm::Use u(*comm_);
  return u ? mep_comm_size(u.get()) : group_size_;
}

uint64_t MepBackend::epoch() {
  Comm::Use u(*comm_);
  return u ? mep_comm_epoch(u.get()) : 0;
}

std::string MepBackend::cuda_path() {
#if MEP_C10D_CUDA
  Comm::Use u(*comm_);
  if (!u) throw_closed("cuda_path");
  const char *p = mep_cuda_path(u.get());
  return p ? p : "";
#else
  return "";
#endif
}

}  // namespace mep_c10d
