// store_adapter.cpp - see store_adapter.hpp.
//
// The core calls the store from several threads (creation, the fault
// tolerance thread claiming epochs, recovery). A waiting get is done by
// polling check(): c10d stores serialise the calls of one client, so a
// blocking wait() would hold up every other call of this communicator,
// and a changed store timeout would leak into the user's own calls.
#include "store_adapter.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace mep_c10d {

using Clock = std::chrono::steady_clock;

StoreAdapter::StoreAdapter(const c10::intrusive_ptr<c10d::Store> &store) {
  // A clone talks to the same keys over a connection of its own (TCPStore),
  // so the user's blocking calls on the original never stall the core's.
  try {
    store_ = store->clone();
  } catch (const std::exception &) {
    store_ = store;
  }
  if (!store_) store_ = store;
  vt_.ctx = this;
  vt_.set = &StoreAdapter::set;
  vt_.get = &StoreAdapter::get;
  vt_.add = &StoreAdapter::add;
  vt_.check = &StoreAdapter::check;
  vt_.destroy = nullptr;  // owned by the Comm, not by the core
}

std::string StoreAdapter::last_error() {
  std::lock_guard<std::mutex> g(err_mu_);
  return last_error_;
}

int StoreAdapter::failed(const char *op, const char *key,
                         const std::exception &e) {
  std::lock_guard<std::mutex> g(err_mu_);
  last_error_ = std::string("store ") + op + " '" + key + "': " + e.what();
  // Only the first line: c10 errors append a C++ backtrace.
  auto nl = last_error_.find('\n');
  if (nl != std::string::npos) last_error_.resize(nl);
  return MEP_ERR_SYSTEM;
}

int StoreAdapter::set(void *ctx, const char *key, const void *val,
                      size_t len) {
  auto *self = static_cast<StoreAdapter *>(ctx);
  try {
    const auto *p = static_cast<const uint8_t *>(val);
    self->store_->set(key, std::vector<uint8_t>(p, p + len));
    return MEP_OK;
  } catch (const std::exception &e) {
    return self->failed("set", key, e);
  }
}

int StoreAdapter::get(void *ctx, const char *key, void **val, size_t *len,
                      int timeout_ms) {
  auto *self = static_cast<StoreAdapter *>(ctx);
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(50);
  try {
    for (;;) {
      if (self->store_->check({key})) {
        std::vector<uint8_t> v = self->store_->get(key);
        void *copy = std::malloc(v.empty() ? 1 : v.size());
        if (!copy) return MEP_ERR_NOMEM;
        if (!v.empty()) std::memcpy(copy, v.data(), v.size());
        *val = copy;
        *len = v.size();
        return MEP_OK;
      }
      if (timeout_ms >= 0 &&
          Clock::now() - start >= std::chrono::milliseconds(timeout_ms))
        return MEP_ERR_TIMEOUT;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(5000));
    }
  } catch (const std::exception &e) {
    return self->failed("get", key, e);
  }
}

int StoreAdapter::add(void *ctx, const char *key, int64_t delta,
                      int64_t *result) {
  auto *self = static_cast<StoreAdapter *>(ctx);
  try {
    int64_t v = self->store_->add(key, delta);
    if (result) *result = v;
    return MEP_OK;
  } catch (const std::exception &e) {
    return self->failed("add", key, e);
  }
}

int StoreAdapter::check(void *ctx, const char *key, int *exists) {
  auto *self = static_cast<StoreAdapter *>(ctx);
  try {
    *exists = self->store_->check({key}) ? 1 : 0;
    return MEP_OK;
  } catch (const std::exception &e) {
    return self->failed("check", key, e);
  }
}

}  // namespace mep_c10d
