/* ft_step.c - one collective of a rank, with every check a single rank can
 * make on it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ft_rank.h"
#include "ft_util.h"

uint64_t ft_gid(int cycle, int phase, int idx) {
  return (uint64_t)cycle * 4096 + (uint64_t)phase * 1024 + (uint64_t)idx;
}

void ft_event(const ft_rank_t *R, const char *kind, const char *extra) {
  char line[512];
  int len = snprintf(line, sizeof line, "%s %d %d %d %lld %s\n", kind,
                     (int)getpid(), R->rank, R->cycle, ft_now_ms(),
                     extra && *extra ? extra : "-");
  CHECK(len > 0 && len < (int)sizeof line, "event line too long");
  /* One write below PIPE_BUF: lines of several ranks never interleave. */
  CHECK(write(R->ctl_fd, line, (size_t)len) == len,
        "rank %d: writing event '%s' to the driver failed", R->rank, kind);
}

int ft_wait_ms(const ft_rank_t *R) {
  return 2 * R->timeout_ms + R->probe_ms + 5000;
}

int ft_store_ms(const ft_rank_t *R) { return R->timeout_ms + 2000; }

/* FT_INPLACE=1: all-reduces run in place (the input copied into the
 * output buffer first), so a retry over the survivors must start from
 * inputs the failed attempt may have overwritten. */
static int in_place(void) {
  const char *e = getenv("FT_INPLACE");
  return e && !strcmp(e, "1");
}

int ft_coll_start(mep_comm_t *comm, const ft_step_t *s, ft_bufs_t *b,
                  mep_req_t **req) {
  switch (s->coll) {
  case FT_ALLREDUCE:
    if (in_place()) {
      memcpy(b->recv, b->send, b->send_len);
      return mep_allreduce(comm, b->recv, b->recv, s->count, s->dt, s->op,
                           req);
    }
    return mep_allreduce(comm, b->send, b->recv, s->count, s->dt, s->op, req);
  case FT_ALLGATHER:
    return mep_allgather(comm, b->send, b->recv, s->count, s->dt, req);
  case FT_ALLTOALL:
    return mep_alltoall(comm, b->send, b->recv, s->count, s->dt, req);
  case FT_BARRIER:
    return mep_barrier(comm, req);
  }
  return MEP_ERR_INVALID;
}

/* Starts and finishes the step; *nd and R->dropped get its dropped set. */
static int start_and_finish(ft_rank_t *R, const ft_step_t *s, ft_bufs_t *b,
                            int use_req, int *nd, const char *name) {
  mep_req_t *req = NULL;
  int rc = ft_coll_start(R->comm, s, b, use_req ? &req : NULL);
  if (use_req && rc == MEP_OK) {
    rc = mep_req_wait(req, ft_wait_ms(R));
    CHECK(mep_req_status(req) != MEP_RUNNING,
          "rank %d: %s still running after %d ms: a hang", R->rank, name,
          ft_wait_ms(R));
    CHECK(mep_req_status(req) == rc,
          "rank %d: %s: mep_req_wait returned %d, mep_req_status %d",
          R->rank, name, rc, mep_req_status(req));
  }
  CHECK(rc == MEP_OK || rc == MEP_OK_DEGRADED,
        "rank %d: cycle %d: %s (%s) failed: %s: %s", R->rank, R->cycle, name,
        use_req ? "request" : "blocking", mep_strerror(rc), mep_last_error());
  *nd = use_req ? mep_req_dropped(req, R->dropped, R->max_size)
                : mep_comm_dropped(R->comm, R->dropped, R->max_size);
  mep_req_free(req);
  return rc;
}

/* The dropped set must be ranks this rank still counted as active. */
static void check_dropped(ft_rank_t *R, int rc, int nd, const char *name) {
  CHECK(nd >= 0 && nd <= R->max_size, "rank %d: %s: dropped count %d",
        R->rank, name, nd);
  CHECK((rc == MEP_OK) == (nd == 0),
        "rank %d: %s: status %s with %d dropped ranks", R->rank, name,
        mep_strerror(rc), nd);
  for (int i = 0; i < nd; i++) {
    int d = R->dropped[i];
    CHECK(d >= 0 && d < R->size && d != R->rank && R->alive[d] &&
              (i == 0 || d > R->dropped[i - 1]),
          "rank %d: %s: dropped rank %d (item %d of %d) is not an active "
          "peer, or the list is not increasing", R->rank, name, d, i, nd);
  }
}

/* A rank may leave the live set in the background, before a collective
 * reports it as dropped: the live set is the tracked one less victims of
 * this cycle (exactly the tracked one where `exact`). */
static void check_member(const ft_rank_t *R, int r, int live, int exact,
                         const char *what, const char *name) {
  int victim = R->plan && ft_plan_is_lost(R->plan, r);
  CHECK(live == R->alive[r] || (!exact && !live && victim),
        "rank %d: after %s rank %d is %s in %s, but %s", R->rank, name, r,
        live ? "active" : "inactive", what,
        live ? "a collective dropped it before"
             : victim ? "no collective reported it dropped yet"
                      : "it is no victim");
}

void ft_check_active(ft_rank_t *R, int exact, const char *name) {
  uint64_t ep = 0;
  int na = mep_comm_active(R->comm, R->scratch, R->max_size, &ep);
  const volatile int32_t *arr = mep_comm_active_array(R->comm);
  CHECK(arr != NULL, "rank %d: mep_comm_active_array is NULL", R->rank);
  int count = 0, changed = 0;
  for (int r = 0; r < R->max_size; r++) {
    check_member(R, r, R->scratch[r], exact, "mep_comm_active", name);
    check_member(R, r, arr[r] != 0, exact, "the active array", name);
    count += R->scratch[r];
    changed |= R->scratch[r] != R->seen[r];
    R->seen[r] = R->scratch[r];
  }
  CHECK(na == count, "rank %d: after %s mep_comm_active returned %d (%s) "
        "for %d active ranks", R->rank, name, na,
        na < 0 ? mep_strerror(na) : "ranks", count);
  CHECK(mep_comm_epoch(R->comm) >= ep, "rank %d: mep_comm_epoch %" PRIu64
        " is behind mep_comm_active's %" PRIu64, R->rank,
        mep_comm_epoch(R->comm), ep);
  /* The epoch moves exactly when the set changes. */
  if (changed)
    CHECK(ep > R->epoch, "rank %d: the active set changed by %s but the "
          "epoch stayed %" PRIu64, R->rank, name, ep);
  else
    CHECK(ep == R->epoch, "rank %d: the active set is the same after %s, "
          "but the epoch went from %" PRIu64 " to %" PRIu64, R->rank, name,
          R->epoch, ep);
  R->epoch = ep;
}

static void report_step(ft_rank_t *R, uint64_t gid, int rc, int nd,
                        uint64_t hash, long long t0, long long t1) {
  char list[256] = "-";
  size_t used = 0;
  for (int i = 0; i < nd && used + 16 < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%d",
                             i ? "," : "", R->dropped[i]);
  fprintf(R->report, "S %" PRIu64 " %d %d %s %016" PRIx64 " %lld %lld %" PRIu64
          "\n", gid, rc, nd, list, hash, t1 - t0, t1, R->epoch);
  if (rc == MEP_OK_DEGRADED) ft_event(R, "degraded", list);
}

/* Tells the driver once per cycle that every victim left this rank's
 * active set (it continues a stopped victim only then). */
static void note_lost(ft_rank_t *R) {
  if (R->lost_sent || !R->plan || R->plan->nlost == 0) return;
  for (int i = 0; i < R->plan->nlost; i++)
    if (R->alive[R->plan->lost[i]]) return;
  R->lost_sent = 1;
  ft_event(R, "lost", NULL);
}

int ft_coll_run(ft_rank_t *R, const ft_step_t *s, uint64_t gid, int use_req,
                int must_ok, ft_bufs_t *b) {
  char name[128], sname[96];
  ft_step_name(s, sname, sizeof sname);
  snprintf(name, sizeof name, "step %" PRIu64 " (%s)", gid, sname);
  int nd = 0;
  long long t0 = ft_now_ms();
  int rc = start_and_finish(R, s, b, use_req, &nd, name);
  long long t1 = ft_now_ms();
  check_dropped(R, rc, nd, name);
  CHECK(!must_ok || rc == MEP_OK, "rank %d: %s returned %s dropping rank "
        "%d, where every rank is alive", R->rank, name, mep_strerror(rc),
        R->dropped[0]);
  for (int i = 0; i < nd; i++) R->alive[R->dropped[i]] = 0;
  ft_check_active(R, must_ok, name);
  /* Once ranks are gone, later collectives run over the survivors with
   * no new timeouts. */
  if (rc == MEP_OK && ft_step_small(s))
    CHECK(t1 - t0 < R->timeout_ms / 2, "rank %d: %s took %lld ms, half the "
          "timeout is %d ms", R->rank, name, t1 - t0, R->timeout_ms / 2);
  /* All-to-all results differ per rank by design: each checks its own
   * against the reference, and only the others are compared across ranks. */
  report_step(R, gid, rc, nd, s->coll == FT_ALLTOALL ? 0 : ft_hash(b), t0,
              t1);
  note_lost(R);
  return rc;
}

int ft_run_step(ft_rank_t *R, const ft_step_t *s, uint64_t gid, int use_req,
                int must_ok) {
  ft_bufs_t b;
  ft_bufs_make(s, R->seed, gid, R->rank, R->size, &b);
  int rc = ft_coll_run(R, s, gid, use_req, must_ok, &b);
  char why[512];
  CHECK(ft_ref_check(s, R->seed, gid, R->rank, R->size, R->alive, &b, why,
                     sizeof why) == 0,
        "rank %d: cycle %d: step %" PRIu64 " (%s): %s", R->rank, R->cycle,
        gid, mep_strerror(rc), why);
  ft_bufs_free(&b);
  return rc;
}
