// watcher.hpp - a thread that finishes the works whose futures were asked
// for, so a future completes without anybody calling wait().
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace mep_c10d {

class Comm;
class MepWork;

class Watcher {
 public:
  explicit Watcher(Comm &comm);
  // Joins the thread, or lets it end by itself when the last reference to
  // the communicator went away on that very thread.
  ~Watcher();
  Watcher(const Watcher &) = delete;
  Watcher &operator=(const Watcher &) = delete;

  // Queues a running work; false once stopped (the caller completes it).
  bool add(const c10::intrusive_ptr<MepWork> &work);
  // Ends the thread once what it holds is finished (after the communicator
  // closed, every request is).
  void stop();

 private:
  // The thread's state outlives this object if the thread does.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<c10::intrusive_ptr<MepWork>> queue;
    bool stop = false;
  };
  static void run(std::shared_ptr<State> st);

  std::shared_ptr<State> st_;
  std::thread thread_;
};

}  // namespace mep_c10d
