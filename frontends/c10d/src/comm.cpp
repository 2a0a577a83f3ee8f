// comm.cpp - see comm.hpp.
#include "comm.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "errors.hpp"
#include "tensors.hpp"
#include "watcher.hpp"

namespace mep_c10d {

static void check_active_tensor(const at::Tensor &t, int size) {
  if (!t.defined()) return;
  if (t.scalar_type() != at::kInt || !t.device().is_cpu() ||
      !t.is_contiguous() || t.numel() < size)
    throw_value("BackendOptions.active_ranks must be a contiguous int32 CPU "
                "tensor with at least the group size (" +
                std::to_string(size) + ") entries, got " +
                dtype_name(t.scalar_type()) + " on " +
                t.device().str() + " with " + std::to_string(t.numel()) +
                " entries");
}

// [core] timeout_ms from MEP_CONFIG or MEP_CORE_TIMEOUT_MS, or -1 if unset.
static long configured_timeout(const mep_config_t *cfg) {
  const char *v = mep_config_get(cfg, "core", "timeout_ms");
  if (!v) return -1;
  char *end = nullptr;
  long t = std::strtol(v, &end, 10);
  return end && *end == '\0' && t > 0 ? t : -1;
}

Comm::Comm(const c10::intrusive_ptr<c10d::Store> &store,
           const CommConfig &cfg)
    : rank_(cfg.rank), max_size_(std::max(cfg.max_size, cfg.size)) {
  check_active_tensor(cfg.active_ranks, cfg.size);
  active_ = cfg.active_ranks.defined()
                ? cfg.active_ranks
                : at::zeros({max_size_}, at::TensorOptions(at::kInt));
  store_ = std::make_unique<StoreAdapter>(store);
  int rc = mep_config_load(nullptr, &cfg_);
  if (rc < 0) throw_mep(rc, "loading the configuration");
  // The process group's timeout is the core's deadline unless the
  // configuration sets one: a frozen peer is suspected after it.
  long conf_t = configured_timeout(cfg_);
  mep_comm_opts_t o{};
  o.struct_size = sizeof o;
  o.config = cfg_;
  o.name = "mep";
  o.timeout_ms = conf_t > 0 ? 0 : std::max(cfg.timeout_ms, 1);
  o.max_size = max_size_;
  o.join = cfg.join ? 1 : 0;
  long core_t = conf_t > 0 ? conf_t : o.timeout_ms;
  core_timeout_ms_ = static_cast<int>(std::min<long>(core_t, INT_MAX));
  // A wait without a timeout of its own outlasts the core's deadline, so
  // the core's message (what it waited for) is the one users see.
  wait_timeout_ms_ = static_cast<int>(
      std::min<long>(std::max<long>(core_t, cfg.timeout_ms) + 5000, INT_MAX));
  rc = mep_comm_create(store_->store(), cfg.rank, cfg.size, &o, &comm_);
  if (rc < 0) {
    std::string msg = mep_last_error();
    std::string serr = store_->last_error();
    if (!serr.empty()) msg += "; the store said: " + serr;
    mep_config_free(cfg_);
    cfg_ = nullptr;
    std::string what = std::string(cfg.join ? "joining" : "creating") +
                       " the communicator of rank " +
                       std::to_string(cfg.rank) + " in a group of " +
                       std::to_string(cfg.size);
    std::rethrow_exception(mep_error(rc, what, msg, core_timeout_ms_));
  }
  refresh_active();
}

Comm::~Comm() {
  close();
  std::unique_ptr<Watcher> w;
  {
    std::lock_guard<std::mutex> g(watcher_mu_);
    w = std::move(watcher_);
  }
  w.reset();
}

bool Comm::enter() {
  std::unique_lock<std::mutex> lk(gate_mu_);
  gate_cv_.wait(lk, [&] { return !closing_ || closed_; });
  if (closed_) return false;
  ++users_;
  return true;
}

void Comm::leave() {
  std::lock_guard<std::mutex> g(gate_mu_);
  if (--users_ == 0) gate_cv_.notify_all();
}

bool Comm::closed() {
  std::lock_guard<std::mutex> g(gate_mu_);
  return closing_ || closed_;
}

void Comm::close() {
  {
    std::unique_lock<std::mutex> lk(gate_mu_);
    if (closing_ || closed_) {
      gate_cv_.wait(lk, [&] { return closed_; });
      return;
    }
    closing_ = true;
    gate_cv_.wait(lk, [&] { return users_ == 0; });
  }
  mep_comm_destroy(comm_);
  comm_ = nullptr;
  mep_config_free(cfg_);
  cfg_ = nullptr;
  {
    std::lock_guard<std::mutex> g(gate_mu_);
    closed_ = true;
    gate_cv_.notify_all();
  }
  // Every request is finished now; the watcher completes what it holds.
  std::lock_guard<std::mutex> g(watcher_mu_);
  if (watcher_) watcher_->stop();
}

void Comm::wait_request(mep_req_t *req, int ms) {
  Use u(*this);
  if (u) mep_req_wait(req, ms);
}

void Comm::refresh_active() {
  std::vector<uint8_t> act(static_cast<size_t>(max_size_));
  {
    Use u(*this);
    if (!u) return;
    if (mep_comm_active(u.get(), act.data(), max_size_, nullptr) < 0) return;
  }
  int32_t *dst = active_.data_ptr<int32_t>();
  int64_t n = std::min<int64_t>(active_.numel(), max_size_);
  for (int64_t i = 0; i < n; i++) dst[i] = act[static_cast<size_t>(i)];
}

void Comm::record_dropped(const std::vector<int> &ranks) {
  std::lock_guard<std::mutex> g(dropped_mu_);
  dropped_ = ranks;
}

std::vector<int> Comm::last_dropped() {
  std::lock_guard<std::mutex> g(dropped_mu_);
  return dropped_;
}

Watcher &Comm::watcher() {
  std::lock_guard<std::mutex> g(watcher_mu_);
  if (!watcher_) watcher_ = std::make_unique<Watcher>(*this);
  return *watcher_;
}

}  // namespace mep_c10d
