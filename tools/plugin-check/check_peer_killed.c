/* check_peer_killed.c - rank 0 streams large writes to rank 1 and
 * SIGKILLs it mid-stream: within 2 s rank 0's poll() must report a
 * completion with MEP_ERR_PEER_FAILED naming peer 1 and every write in
 * flight must be reported; later writes must not succeed; close and fini
 * still work. A plugin without host memory is never a peer's route, so
 * the core does not rely on it to learn of a death (nvlink cannot: CUDA
 * IPC tells nothing); from it only the rest is required. */
#include <signal.h>
#include <unistd.h>

#include "checks.h"
#include "link.h"
#include "pattern.h"
#include "sess.h"

#define PC_KILL_REPORT_MS 2000
#define PC_STREAM_DEPTH 4
#define PC_CTL_LEN 4096

/* Rank 1: keeps the transport progressing until it is killed. */
static _Noreturn void victim(pc_sess_t *s) {
  pc_region_t dst, ctl;
  pc_region_reg(s, &dst, pc_big_size(s->w));
  pc_region_reg(s, &ctl, PC_CTL_LEN);
  pc_region_send(&dst);
  pc_region_send(&ctl);
  pc_link_send_u64(PC_TAG_PID, (uint64_t)getpid());
  s->allow_failures = 1;
  int64_t deadline = pc_now_ms() + 2 * (int64_t)s->w->opts->timeout_ms;
  for (;;) {
    int n = pc_progress(s);
    if (pc_now_ms() > deadline)
      pc_fail("rank 0 did not kill this process within %d ms",
              2 * s->w->opts->timeout_ms);
    pc_relax(s, n);
  }
}

static int saw_peer_failed(const pc_sess_t *s) {
  for (size_t i = 0; i < s->n_fails; i++)
    if (s->fails[i].status == MEP_ERR_PEER_FAILED) return 1;
  return 0;
}

static const char *report_state(const pc_sess_t *s) {
  if (saw_peer_failed(s)) return "MEP_ERR_PEER_FAILED was reported";
  if (pc_sess_never_route(s))
    return "no failure was reported (not required of a plugin without host "
           "memory)";
  return "no completion with MEP_ERR_PEER_FAILED naming peer 1";
}

/* Streams until writes complete, so that the kill lands mid-stream. */
static void stream(pc_sess_t *s, pc_region_t *src, pc_remote_t *rdst,
                   pc_remote_t *rctl) {
  int64_t last = pc_now_ms();
  uint64_t done = 0;
  while (s->n_completed < 2) {
    while (s->n_inflight < PC_STREAM_DEPTH) {
      pc_write(s, src, 0, rdst, 0, src->len);
      pc_signal(s, rctl, 0, 1, MEP_SIGNAL_ADD);
    }
    int n = pc_progress(s);
    if (s->n_completed != done) {
      done = s->n_completed;
      last = pc_now_ms();
    }
    if (pc_now_ms() - last > s->w->opts->timeout_ms)
      pc_fail("timed out after %d ms: no write of %zu bytes to rank 1 "
              "completed",
              s->w->opts->timeout_ms, src->len);
    pc_relax(s, n);
  }
  while (s->n_inflight < PC_STREAM_DEPTH) {
    pc_write(s, src, 0, rdst, 0, src->len);
    pc_signal(s, rctl, 0, 1, MEP_SIGNAL_ADD);
  }
}

/* After the failure: a new write is refused, or completes with an error.
 * When no failure was reported (allowed where the core does not rely on
 * the plugin for it), the write only has to be reported in time. */
static void write_after_failure(pc_sess_t *s, pc_region_t *src,
                                pc_remote_t *rdst, pc_remote_t *rctl) {
  uint64_t ok_before = s->n_completed;
  int rc = pc_try_write(s, src, 0, rdst, 0, 8, s->next_token++);
  if (rc == 0) {
    pc_wait_all(s, "a write issued after the peer was reported failed");
    if (s->n_completed != ok_before && saw_peer_failed(s))
      pc_fail("a write to rank 1 issued after its failure was reported "
              "completed with status 0");
  } else {
    pc_info("rank 0: a write after the failure returned %s", pc_err(rc));
  }
  rc = pc_try_signal(s, rctl, 0, 1, MEP_SIGNAL_ADD);
  pc_info("rank 0: a signal after the failure returned %s",
          mep_strerror(rc));
}

void pc_check_peer_killed(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_open(&s, w);
  if (w->rank == 1) victim(&s);

  pc_region_t src;
  pc_remote_t rdst, rctl;
  pc_region_reg(&s, &src, pc_big_size(w));
  pc_region_fill(&src, 0, src.len, pc_seed_for(w->seed, 0x4b, 0, 0), 0);
  pc_region_import(&s, &rdst);
  pc_region_import(&s, &rctl);
  pid_t victim_pid = (pid_t)pc_link_recv_u64(PC_TAG_PID, "rank 1's pid");
  stream(&s, &src, &rdst, &rctl);

  size_t in_flight = s.n_inflight;
  s.allow_failures = 1;
  if (kill(victim_pid, SIGKILL) != 0)
    pc_fail("cannot SIGKILL rank 1 (pid %d)", (int)victim_pid);
  int must_report = !pc_sess_never_route(&s);
  int64_t t0 = pc_now_ns();
  while ((must_report && !saw_peer_failed(&s)) || s.n_inflight > 0) {
    int n = pc_progress(&s);
    int64_t ms = (pc_now_ns() - t0) / 1000000;
    if (ms > PC_KILL_REPORT_MS)
      pc_fail("%d ms after rank 1 was SIGKILLed with %zu writes of %zu bytes "
              "in flight: %s; %zu of them still unreported",
              PC_KILL_REPORT_MS, in_flight, src.len, report_state(&s),
              s.n_inflight);
    pc_relax(&s, n);
  }
  if (saw_peer_failed(&s))
    pc_info("rank 0: the failure of rank 1 was reported after %.1f ms (%zu "
            "writes were in flight, %zu failure completions)",
            (double)(pc_now_ns() - t0) / 1e6, in_flight, s.n_fails);
  else
    pc_info("rank 0: no failure of rank 1 reported (allowed: a plugin "
            "without host memory is never a peer's route); the %zu writes "
            "in flight were reported within %.1f ms",
            in_flight, (double)(pc_now_ns() - t0) / 1e6);
  write_after_failure(&s, &src, &rdst, &rctl);

  pc_remote_release(&s, &rdst);
  pc_remote_release(&s, &rctl);
  pc_region_dereg(&s, &src);
  pc_sess_close_alone(&s, 1);
}
