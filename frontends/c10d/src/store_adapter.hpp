// store_adapter.hpp - a mep_store_t over the c10d::Store torch hands the
// backend (TCPStore, FileStore, HashStore, each usually inside PrefixStores).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <mep/mep.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace mep_c10d {

class StoreAdapter {
 public:
  explicit StoreAdapter(const c10::intrusive_ptr<c10d::Store> &store);
  StoreAdapter(const StoreAdapter &) = delete;
  StoreAdapter &operator=(const StoreAdapter &) = delete;

  // The callbacks the core calls; valid as long as this object lives.
  mep_store_t *store() { return &vt_; }

  // What the store said the last time it failed ("" if never): the core's
  // own message only says which key it was after.
  std::string last_error();

 private:
  static int set(void *ctx, const char *key, const void *val, size_t len);
  static int get(void *ctx, const char *key, void **val, size_t *len,
                 int timeout_ms);
  static int add(void *ctx, const char *key, int64_t delta, int64_t *result);
  static int check(void *ctx, const char *key, int *exists);
  template <class R, class F>
  int call(const char *op, const char *key, F fn, R *out);
  int failed(const char *op, const char *key, const std::string &what);

  c10::intrusive_ptr<c10d::Store> store_;
  mep_store_t vt_{};
  std::mutex err_mu_;
  std::string last_error_;
};

}  // namespace mep_c10d
