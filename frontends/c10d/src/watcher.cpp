// watcher.cpp - see watcher.hpp.
#include "watcher.hpp"

#include <algorithm>
#include <vector>

#include "work.hpp"

namespace mep_c10d {

Watcher::Watcher(Comm &) : st_(std::make_shared<State>()) {
  thread_ = std::thread(&Watcher::run, st_);
}

Watcher::~Watcher() {
  stop();
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();
  else if (thread_.joinable())
    thread_.join();
}

bool Watcher::add(const c10::intrusive_ptr<MepWork> &work) {
  std::lock_guard<std::mutex> g(st_->mu);
  if (st_->stop) return false;
  st_->queue.push_back(work);
  st_->cv.notify_one();
  return true;
}

void Watcher::stop() {
  std::lock_guard<std::mutex> g(st_->mu);
  st_->stop = true;
  st_->cv.notify_one();
}

void Watcher::run(std::shared_ptr<State> st) {
  for (;;) {
    std::vector<c10::intrusive_ptr<MepWork>> batch;
    {
      std::unique_lock<std::mutex> lk(st->mu);
      st->cv.wait(lk, [&] { return st->stop || !st->queue.empty(); });
      if (st->queue.empty()) return;
      batch.assign(st->queue.begin(), st->queue.end());
    }
    std::vector<MepWork *> done;
    for (auto &w : batch)
      if (w->poll()) done.push_back(w.get());
    if (!done.empty()) {
      std::lock_guard<std::mutex> g(st->mu);
      auto &q = st->queue;
      q.erase(std::remove_if(q.begin(), q.end(),
                             [&](const c10::intrusive_ptr<MepWork> &w) {
                               return std::find(done.begin(), done.end(),
                                                w.get()) != done.end();
                             }),
              q.end());
      continue;
    }
    // Collectives finish in order, so the oldest is the one to sleep on;
    // point-to-point works behind it are looked at every few ms.
    batch.front()->wait_slice(batch.size() > 1 ? 2 : 50);
  }
}

}  // namespace mep_c10d
