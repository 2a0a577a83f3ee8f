// ops_monitored.cpp - monitored_barrier, with gloo's protocol and gloo's
// messages (torch's tests and users' tooling match them):
//  - every rank but 0 sends rank 0 an empty message on the barrier's
//    "arrive" tag and waits for rank 0's answer on its "release" tag;
//  - rank 0 waits for the arrivals, in rank order, until the timeout: a
//    rank whose message did not come, or that the core knows failed (its
//    receive fails at once), did not pass. wait_all_ranks=False names the
//    first such rank, True all of them;
//  - rank 0 then releases every rank with an empty message, or, where one
//    failed, sends every other rank the list of the failed ones, so the
//    ranks that arrived fail at once instead of at their own deadline.
// Each call uses two tags of its own above kInternalTagBase, so a message
// of an earlier, failed barrier cannot match a later one; ranks call it in
// the same order, as for every collective.
#include <algorithm>
#include <chrono>
#include <climits>
#include <string>
#include <vector>

#include "backend.hpp"
#include "errors.hpp"

namespace mep_c10d {

namespace {

using Clock = std::chrono::steady_clock;

// How long rank 0 lets its failure notices go out before it raises.
constexpr int64_t kNoticeWaitMs = 2000;

std::string join(const std::vector<int> &v) {
  std::string s;
  for (size_t i = 0; i < v.size(); i++)
    s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

int64_t ms_left(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                               Clock::now())
      .count();
}

[[noreturn]] void fail(const std::string &msg) {
  C10_THROW_ERROR(DistBackendError, msg);
}

}  // namespace

std::unique_ptr<MepBackend::Msg> MepBackend::post_msg(
    bool is_send, int peer, int tag, std::vector<int32_t> payload,
    size_t room) {
  auto m = std::make_unique<Msg>();
  m->buf = std::move(payload);
  if (!is_send) m->buf.assign(room, 0);
  size_t bytes = is_send ? m->buf.size() * sizeof(int32_t) : 0;
  if (!is_send) bytes = room * sizeof(int32_t);
  Comm::Use u(*comm_);
  if (!u) throw_closed("monitored_barrier");
  void *p = m->buf.empty() ? nullptr : m->buf.data();
  m->rc = is_send ? mep_send(u.get(), p, bytes, peer, tag, &m->req)
                  : mep_recv(u.get(), p, bytes, peer, tag, &m->req);
  if (m->rc < 0) {
    m->err = mep_last_error();
    m->req = nullptr;
  }
  return m;
}

bool MepBackend::wait_msg(Msg &m, int64_t ms) {
  if (!m.req) return true;
  int done = 0;
  mep_req_test(m.req, &done);
  if (!done && ms > 0)
    comm_->wait_request(m.req, static_cast<int>(std::min<int64_t>(ms, INT_MAX)));
  mep_req_test(m.req, &done);
  if (done && m.rc == MEP_OK) {
    m.rc = mep_req_status(m.req);
    if (m.rc < 0) {
      mep_req_wait(m.req, 0);  // a finished request: sets its message
      m.err = mep_last_error();
    }
  }
  return done != 0;
}

void MepBackend::keep_stale(std::unique_ptr<Msg> m) {
  int done = 1;
  if (m && m->req) mep_req_test(m->req, &done);
  if (done) return;  // freed here
  std::lock_guard<std::mutex> g(stale_mu_);
  stale_.push_back(std::move(m));
}

void MepBackend::sweep_stale(bool all) {
  std::lock_guard<std::mutex> g(stale_mu_);
  stale_.erase(std::remove_if(stale_.begin(), stale_.end(),
                              [all](const std::unique_ptr<Msg> &m) {
                                int done = 0;
                                mep_req_test(m->req, &done);
                                return all || done;
                              }),
               stale_.end());
}

void MepBackend::monitored_notify(int arrive_tag,
                                  const std::vector<int> &failed,
                                  int64_t timeout_ms) {
  std::vector<int32_t> payload{static_cast<int32_t>(
      std::min<int64_t>(timeout_ms, INT32_MAX))};
  payload.insert(payload.end(), failed.begin(), failed.end());
  std::vector<std::unique_ptr<Msg>> sent;
  for (int r = 1; r < group_size_; r++)
    if (std::find(failed.begin(), failed.end(), r) == failed.end())
      sent.push_back(post_msg(true, r, arrive_tag + 1, payload, 0));
  // A send is done once it is in the peer's ring, which its progress
  // thread drains even while nobody receives: a moment, unless the peer is
  // frozen. Waiting that long lets the notice out before rank 0 raises
  // (and perhaps exits); past it the message goes on by itself.
  const auto until = Clock::now() + std::chrono::milliseconds(kNoticeWaitMs);
  for (auto &m : sent) {
    wait_msg(*m, std::max<int64_t>(ms_left(until), 0));
    keep_stale(std::move(m));
  }
}

void MepBackend::monitoredBarrier(const c10d::BarrierOptions &opts,
                                  bool wait_all) {
  sweep_stale(false);
  const int64_t timeout_ms =
      (opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout).count();
  const uint64_t n = monitored_seq_++;
  const int arrive =
      kInternalTagBase + static_cast<int>((2 * n) % (uint64_t{1} << 30));
  const int release = arrive + 1;

  if (rank_ != 0) {
    auto s = post_msg(true, 0, arrive, {}, 0);
    // Room for rank 0's answer: the timeout and every rank that failed.
    auto r = post_msg(false, 0, release, {}, 1 + comm_->max_size());
    int64_t wait = comm_->wait_timeout_ms();
    bool done = wait_msg(*s, wait) && wait_msg(*r, wait);
    std::string why;
    if (s->rc < 0)
      why = s->err;
    else if (!done)
      why = "mep: no answer from rank 0 within " + std::to_string(wait) +
            " ms";
    else if (r->rc < 0)
      why = r->err;
    else if (mep_req_bytes(r->req) >= 2 * sizeof(int32_t)) {
      size_t k = mep_req_bytes(r->req) / sizeof(int32_t);
      std::vector<int> failed(r->buf.begin() + 1, r->buf.begin() + k);
      why = "mep: rank 0 reports that " +
            std::string(failed.size() > 1 ? "ranks " : "rank ") +
            join(failed) + " failed to pass monitoredBarrier in " +
            std::to_string(r->buf[0]) + " ms";
    }
    keep_stale(std::move(s));
    keep_stale(std::move(r));
    if (!why.empty())
      fail("Rank " + std::to_string(rank_) +
           " successfully reached monitoredBarrier, but received errors "
           "while waiting for send/recv from rank 0. Please check rank 0 "
           "logs for faulty rank.\n Original exception: \n" + why);
    return;
  }

  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  std::vector<std::unique_ptr<Msg>> arrivals(group_size_);
  for (int r = 1; r < group_size_; r++)
    arrivals[r] = post_msg(false, r, arrive, {}, 0);
  std::vector<int> passed, failed;
  std::string reasons;
  for (int r = 1; r < group_size_; r++) {
    int64_t left = ms_left(deadline);
    if (!wait_all && left <= 0) {
      std::vector<int> rest;
      for (int q = r; q < group_size_; q++) rest.push_back(q);
      monitored_notify(arrive, rest, timeout_ms);
      for (auto &m : arrivals) keep_stale(std::move(m));
      fail("Rank 0 timed out in monitoredBarrier after " +
           std::to_string(timeout_ms) + " ms.\n" +
           (passed.empty() ? "No ranks successfully processed in "
                             "monitoredBarrier."
                           : "Successfully processed ranks: " + join(passed)));
    }
    Msg &m = *arrivals[r];
    bool done = wait_msg(m, std::max<int64_t>(left, 0));
    if (done && m.rc == MEP_OK) {
      passed.push_back(r);
      continue;
    }
    std::string why = done ? m.err
                           : "mep: Timed out waiting " +
                                 std::to_string(timeout_ms) +
                                 "ms for rank " + std::to_string(r) +
                                 " to reach monitoredBarrier";
    failed.push_back(r);
    reasons += "\n" + why;
    if (!wait_all) {
      monitored_notify(arrive, failed, timeout_ms);
      for (auto &a : arrivals) keep_stale(std::move(a));
      fail("[Rank 0]: Rank " + std::to_string(r) +
           " failed to pass monitoredBarrier in " +
           std::to_string(timeout_ms) + " ms\n Original exception: " +
           reasons);
    }
  }
  for (auto &m : arrivals) keep_stale(std::move(m));
  if (!failed.empty()) {
    monitored_notify(arrive, failed, timeout_ms);
    fail("[Rank 0]: Ranks " + join(failed) +
         " failed to pass monitoredBarrier in " + std::to_string(timeout_ms) +
         " ms\n Original exceptions: " + reasons);
  }
  // Everyone arrived: release them all. An empty send finishes once it is
  // in the peer's ring, so these waits are short; they get the group's
  // deadline rather than what is left of the barrier's.
  std::vector<std::unique_ptr<Msg>> releases(group_size_);
  for (int r = 1; r < group_size_; r++)
    releases[r] = post_msg(true, r, release, {}, 0);
  const int64_t wait = comm_->wait_timeout_ms();
  for (int r = 1; r < group_size_; r++) {
    Msg &m = *releases[r];
    bool done = wait_msg(m, wait);
    if (!done || m.rc < 0) {
      std::string why = done ? m.err
                             : "mep: Timed out waiting " +
                                   std::to_string(wait) +
                                   "ms to release rank " + std::to_string(r);
      for (auto &q : releases) keep_stale(std::move(q));
      fail("[Rank 0]: Rank " + std::to_string(r) +
           " failed to pass monitoredBarrier in " +
           std::to_string(timeout_ms) + " ms\n Original exception: \n" +
           why);
    }
  }
  for (auto &q : releases) keep_stale(std::move(q));
}

}  // namespace mep_c10d
