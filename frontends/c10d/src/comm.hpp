// comm.hpp - one mep communicator as the backend and its works share it.
//
// A Work can outlive its backend (Python holds it), and the backend can be
// shut down while another thread still waits on a work; so the
// communicator lives in a shared object with a gate: every call into it
// happens inside a Use, and close() waits for the Uses in progress, then
// destroys it. After that every request is finished (the core fails the
// running ones with MEP_ERR_CLOSED) and can be read without the communicator.
#pragma once

#include <ATen/ATen.h>
#include <mep/mep.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store_adapter.hpp"

namespace mep_c10d {

class Watcher;

struct CommConfig {
  int rank = 0;
  int size = 1;
  int max_size = 0;         // <= size: no growth
  int timeout_ms = 0;       // the process group's timeout
  bool join = false;        // is_extension
  at::Tensor active_ranks;  // user's int32 tensor, or undefined
};

class Comm : public std::enable_shared_from_this<Comm> {
 public:
  // Creates the communicator (blocking: a rendezvous over the store).
  Comm(const c10::intrusive_ptr<c10d::Store> &store, const CommConfig &cfg);
  ~Comm();
  Comm(const Comm &) = delete;
  Comm &operator=(const Comm &) = delete;

  // Scoped permission to call into the communicator; false once closed.
  class Use {
   public:
    explicit Use(Comm &c) : c_(c), ok_(c.enter()) {}
    ~Use() {
      if (ok_) c_.leave();
    }
    Use(const Use &) = delete;
    Use &operator=(const Use &) = delete;
    explicit operator bool() const { return ok_; }
    mep_comm_t *get() const { return c_.comm_; }

   private:
    Comm &c_;
    bool ok_;
  };

  // Destroys the communicator once the Uses in progress end. Idempotent.
  void close();
  bool closed();

  int rank() const { return rank_; }
  int max_size() const { return max_size_; }
  // The core's deadline ([core] timeout_ms, else the group's timeout).
  int core_timeout_ms() const { return core_timeout_ms_; }
  // The deadline of a wait without its own timeout.
  int wait_timeout_ms() const { return wait_timeout_ms_; }
  void set_wait_timeout_ms(int ms) { wait_timeout_ms_ = ms; }

  // Waits up to ms for one request; returns at once when closed (then the
  // request is finished).
  void wait_request(mep_req_t *req, int ms);

  // The active set: copied into the tensor (the user's active_ranks or our
  // own) after each operation and on demand.
  void refresh_active();
  at::Tensor active_ranks() const { return active_; }

  // The ranks the latest degraded collective dropped.
  void record_dropped(const std::vector<int> &ranks);
  std::vector<int> last_dropped();

  // Completes the futures of works in the background (started on first use).
  Watcher &watcher();

  // What the store said when it failed, for messages.
  std::string store_error() { return store_->last_error(); }

 private:
  bool enter();
  void leave();

  std::unique_ptr<StoreAdapter> store_;
  mep_config_t *cfg_ = nullptr;
  mep_comm_t *comm_ = nullptr;
  int rank_;
  int max_size_;
  int core_timeout_ms_;
  int wait_timeout_ms_;
  at::Tensor active_;

  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  int users_ = 0;
  bool closing_ = false;
  bool closed_ = false;

  std::mutex dropped_mu_;
  std::vector<int> dropped_;

  std::mutex watcher_mu_;
  std::unique_ptr<Watcher> watcher_;
};

}  // namespace mep_c10d
