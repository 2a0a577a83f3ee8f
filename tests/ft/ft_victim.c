/* ft_victim.c - what a victim rank does to itself at its step: die,
 * freeze, or keep going while the driver cuts its link. Faults are
 * self-inflicted so they strike at a known point of the program. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ft_rank.h"
#include "ft_util.h"

static void die_now(ft_rank_t *R) {
  fflush(R->report);
  ft_event(R, "dying", NULL);
  raise(SIGKILL);
  CHECK(0, "rank %d: still alive after SIGKILL", R->rank);
}

/* Destroying a communicator whose peers are gone or unreachable is
 * bounded: a timeout, plus the store's deadline for a rank whose store is
 * cut off too (its engine may be asking the store to arbitrate), plus 2 s
 * for a loaded machine. */
static long long destroy_timed(ft_rank_t *R) {
  long long t0 = ft_now_ms();
  CHECK_OK(mep_comm_destroy(R->comm));
  R->comm = NULL;
  long long ms = ft_now_ms() - t0;
  long long bound = R->timeout_ms + ft_store_ms(R) + 2000;
  CHECK(ms < bound, "rank %d: mep_comm_destroy took %lld ms after the "
        "others dropped it (bound %lld ms)", R->rank, ms, bound);
  return ms;
}

static void finish_victim(ft_rank_t *R, int rc, long long ms) {
  long long dms = destroy_timed(R);
  fprintf(R->report, "V %d %d %lld %lld\n", R->cycle, rc, ms, dms);
  fclose(R->report);
  mep_store_destroy(R->store);
  free(R->alive), free(R->scratch), free(R->seen), free(R->dropped);
  ft_plan_free(R->plan);
  exit(0);
}

/* Frozen past the deadline, then continued once every survivor dropped
 * it: the next call must fail (excluded, or its peers failed), promptly,
 * and not disturb the survivors, which wait for the store key below. */
static void stop_victim(ft_rank_t *R, const ft_step_t *s, uint64_t gid) {
  fflush(R->report);
  ft_event(R, "stopping", NULL);
  raise(SIGSTOP);
  ft_bufs_t b;
  ft_bufs_make(s, R->seed, gid, R->rank, R->size, &b);
  long long t0 = ft_now_ms();
  int rc = ft_coll_start(R->comm, s, &b, NULL);
  long long ms = ft_now_ms() - t0;
  CHECK(rc == MEP_ERR_EXCLUDED || rc == MEP_ERR_PEER_FAILED,
        "rank %d: after SIGCONT its first collective returned %s (%s), want "
        "MEP_ERR_EXCLUDED or MEP_ERR_PEER_FAILED", R->rank, mep_strerror(rc),
        mep_last_error());
  CHECK(ms < R->timeout_ms + R->probe_ms + 3000, "rank %d: excluded only "
        "after %lld ms", R->rank, ms);
  printf("rank %d: continued after SIGSTOP, its collective failed in %lld "
         "ms with %s\n", R->rank, ms, mep_strerror(rc));
  char key[64];
  snprintf(key, sizeof key, "ftt/resumed/%d", R->cycle);
  CHECK_OK(R->store->set(R->store->ctx, key, "1", 1));
  ft_bufs_free(&b);
  finish_victim(R, rc, ms);
}

/* The driver takes the link down a few ms after "cut": whatever this rank
 * makes of it (an error, or a group of its own), it must not hang. */
static void cut_victim(ft_rank_t *R, const ft_step_t *s, uint64_t gid) {
  ft_bufs_t b;
  ft_bufs_make(s, R->seed, gid, R->rank, R->size, &b);
  mep_req_t *req = NULL;
  long long t0 = ft_now_ms();
  int rc = ft_coll_start(R->comm, s, &b, &req);
  CHECK(rc == MEP_OK, "rank %d: starting %" PRIu64 ": %s", R->rank, gid,
        mep_strerror(rc));
  ft_event(R, "cut", NULL);
  rc = mep_req_wait(req, ft_wait_ms(R));
  long long ms = ft_now_ms() - t0;
  CHECK(mep_req_status(req) != MEP_RUNNING, "rank %d: its collective still "
        "runs %lld ms after its link went down", R->rank, ms);
  printf("rank %d: link cut during its collective: %s after %lld ms (%s)\n",
         R->rank, mep_strerror(rc), ms, rc < 0 ? mep_last_error() : "");
  mep_req_free(req);
  ft_bufs_free(&b);
  finish_victim(R, rc, ms);
}

void ft_victim_before(ft_rank_t *R, const ft_step_t *s, uint64_t gid) {
  const ft_plan_t *p = R->plan;
  if (p->kind == FT_STOP) stop_victim(R, s, gid);
  if (p->kind == FT_CUT) cut_victim(R, s, gid);
  if (p->kind != FT_KILL || p->when == FT_AFTER) return;
  if (p->when == FT_BEFORE) die_now(R);
  /* During: the step runs for a few ms, then the process dies with its
   * writes half done. */
  ft_bufs_t b;
  ft_bufs_make(s, R->seed, gid, R->rank, R->size, &b);
  mep_req_t *req = NULL;
  CHECK_OK(ft_coll_start(R->comm, s, &b, &req));
  ft_sleep_ms(p->delay_ms);
  die_now(R);
}

void ft_victim_after(ft_rank_t *R) {
  if (R->plan->kind == FT_KILL && R->plan->when == FT_AFTER) die_now(R);
}
