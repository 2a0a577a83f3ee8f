// store_adapter.cpp - see store_adapter.hpp.
//
// The core calls the store from several threads (creation, the fault
// tolerance thread claiming epochs, recovery). A waiting get is done by
// polling check(): c10d stores serialise the calls of one client, so a
// blocking wait() would hold up every other call of this communicator,
// and a changed store timeout would leak into the user's own calls.
// A call the core may cancel (the fault-tolerance claim's:
// mep_store_cancelled) runs on a thread of its own, so that
// mep_comm_destroy need not wait out torch's store timeout when the
// store's host vanished.
#include "store_adapter.hpp"

#include <chrono>
#include <condition_variable>
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
                         const std::string &what) {
  std::lock_guard<std::mutex> g(err_mu_);
  last_error_ = std::string("store ") + op + " '" + key + "': " + what;
  // Only the first line: c10 errors append a C++ backtrace.
  auto nl = last_error_.find('\n');
  if (nl != std::string::npos) last_error_.resize(nl);
  return MEP_ERR_SYSTEM;
}

namespace {

// A call on a thread of its own, and what it came to. Shared: the thread
// may outlive the caller that gave up on it (and this adapter).
template <class R>
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  R value{};
  std::string error;  // what the store threw, if it did
};

}  // namespace

// *out = fn(), where fn (a torch store call, holding what it uses by
// value, never this adapter) may throw.
template <class R, class F>
int StoreAdapter::call(const char *op, const char *key, F fn, R *out) {
  if (mep_store_cancelled() < 0) {
    try {
      *out = fn();
      return MEP_OK;
    } catch (const std::exception &e) {
      return failed(op, key, e.what());
    }
  }
  auto p = std::make_shared<Pending<R>>();
  try {
    std::thread([p, fn]() mutable {
      R v{};
      std::string error;
      try {
        v = fn();
      } catch (const std::exception &e) {
        error = e.what();
        if (error.empty()) error = "failed";
      }
      std::lock_guard<std::mutex> g(p->mu);
      p->value = std::move(v);
      p->error = std::move(error);
      p->done = true;
      p->cv.notify_all();
    }).detach();
  } catch (const std::exception &e) {
    return failed(op, key, e.what());
  }
  std::unique_lock<std::mutex> g(p->mu);
  while (!p->cv.wait_for(g, std::chrono::milliseconds(50),
                         [&] { return p->done; })) {
    if (mep_store_cancelled() == 1) {
      failed(op, key, "cancelled: the communicator is being destroyed");
      return MEP_ERR_CLOSED;
    }
  }
  if (!p->error.empty()) return failed(op, key, p->error);
  *out = std::move(p->value);
  return MEP_OK;
}

int StoreAdapter::set(void *ctx, const char *key, const void *val,
                      size_t len) {
  auto *self = static_cast<StoreAdapter *>(ctx);
  const auto *p = static_cast<const uint8_t *>(val);
  std::vector<uint8_t> v(p, p + len);
  bool ok;
  return self->call(
      "set", key,
      [st = self->store_, k = std::string(key), v = std::move(v)] {
        st->set(k, v);
        return true;
      },
      &ok);
}

int StoreAdapter::get(void *ctx, const char *key, void **val, size_t *len,
                      int timeout_ms) {
  auto *self = static_cast<StoreAdapter *>(ctx);
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    int there = 0;
    int rc = check(ctx, key, &there);
    if (rc) return rc;
    if (there) break;
    if (timeout_ms >= 0 &&
        Clock::now() - start >= std::chrono::milliseconds(timeout_ms))
      return MEP_ERR_TIMEOUT;
    if (mep_store_cancelled() == 1) {
      self->failed("get", key, "cancelled: the communicator is being "
                   "destroyed");
      return MEP_ERR_CLOSED;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
  std::vector<uint8_t> v;
  int rc = self->call(
      "get", key, [st = self->store_, k = std::string(key)] {
        return st->get(k);
      },
      &v);
  if (rc) return rc;
  void *copy = std::malloc(v.empty() ? 1 : v.size());
  if (!copy) return MEP_ERR_NOMEM;
  if (!v.empty()) std::memcpy(copy, v.data(), v.size());
  *val = copy;
  *len = v.size();
  return MEP_OK;
}

int StoreAdapter::add(void *ctx, const char *key, int64_t delta,
                      int64_t *result) {
  auto *self = static_cast<StoreAdapter *>(ctx);
  int64_t v = 0;
  int rc = self->call(
      "add", key, [st = self->store_, k = std::string(key), delta] {
        return st->add(k, delta);
      },
      &v);
  if (rc == MEP_OK && result) *result = v;
  return rc;
}

int StoreAdapter::check(void *ctx, const char *key, int *exists) {
  auto *self = static_cast<StoreAdapter *>(ctx);
  bool there = false;
  int rc = self->call(
      "check", key, [st = self->store_, k = std::string(key)] {
        return st->check({k});
      },
      &there);
  if (rc == MEP_OK) *exists = there ? 1 : 0;
  return rc;
}

}  // namespace mep_c10d
