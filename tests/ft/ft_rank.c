/* ft_rank.c - a rank's life: create (or join), then per cycle the faulty
 * steps, the steps after them, the recovery of the lost ranks and the
 * full-group steps; then a store barrier and destroy. */
#include "ft_rank.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ft_util.h"

static void load_env(ft_rank_t *R) {
  memset(R, 0, sizeof *R);
  R->scen = ft_scen_find(ft_env_str("FT_SCEN"));
  CHECK(R->scen != NULL, "unknown FT_SCEN '%s'", getenv("FT_SCEN"));
  R->n0 = (int)ft_env_num("FT_N", 0);
  R->rank = (int)ft_env_num("FT_RANK", -1);
  R->seed = strtoull(ft_env_str("FT_SEED"), NULL, 0);
  R->start_cycle = (int)ft_env_num("FT_CYCLE", 0);
  R->join = (int)ft_env_num("FT_JOIN", 0);
  R->inc = (int)ft_env_num("FT_INC", 0);
  R->ctl_fd = (int)ft_env_num("FT_CTL_FD", -1);
  R->max_size = ft_scen_max_size(R->scen, R->n0);
  CHECK(R->n0 >= 2 && R->rank >= 0 && R->rank < R->max_size &&
            R->ctl_fd >= 0, "bad FT_N/FT_RANK/FT_CTL_FD");
  R->timeout_ms = (int)ft_env_num("MEP_CORE_TIMEOUT_MS", 30000);
  R->probe_ms = (int)ft_env_num("MEP_CORE_PROBE_MS", 1000);
  R->alive = ft_xcalloc((size_t)R->max_size, 1);
  R->scratch = ft_xcalloc((size_t)R->max_size, 1);
  R->seen = ft_xcalloc((size_t)R->max_size, 1);
  R->dropped = ft_xcalloc((size_t)R->max_size, sizeof *R->dropped);
  R->cycle = R->start_cycle;
  char path[4096];
  snprintf(path, sizeof path, "%s/r%d.%d", ft_env_str("FT_DIR"), R->rank,
           R->inc);
  R->report = fopen(path, "w");
  CHECK(R->report != NULL, "rank %d: cannot write %s", R->rank, path);
  /* Line by line: a victim's lines must be on disk before it dies. */
  setvbuf(R->report, NULL, _IOLBF, 0);
}

static void create_comm(ft_rank_t *R) {
  int port = (int)ft_env_num("FT_STORE_PORT", 0);
  const char *host = ft_env_str("FT_STORE_HOST");
  /* The store's deadline bounds what a cut-off rank waits for it. */
  int rc = mep_store_tcp_connect(host, port, ft_store_ms(R), &R->store);
  CHECK(rc == MEP_OK, "rank %d: store %s:%d: %s", R->rank, host, port,
        mep_last_error());
  ft_plan_t p;
  ft_plan_make(R->scen, R->n0, R->seed, R->start_cycle, &p);
  int size = R->join ? p.size_after : R->n0;
  ft_plan_free(&p);
  mep_comm_opts_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.name = "ft";
  o.max_size = R->max_size;
  o.join = R->join;
  long long t0 = ft_now_ms();
  rc = mep_comm_create(R->store, R->rank, size, &o, &R->comm);
  CHECK(rc == MEP_OK, "rank %d: mep_comm_create (%s): %s: %s", R->rank,
        R->join ? "joining" : "initial", mep_strerror(rc), mep_last_error());
  if (R->join) {
    fprintf(R->report, "J %d %lld\n", R->cycle, ft_now_ms() - t0);
    ft_event(R, "joined", NULL);
  }
  R->size = mep_comm_size(R->comm);
  CHECK(R->size == size && mep_comm_rank(R->comm) == R->rank &&
            mep_comm_max_size(R->comm) == R->max_size,
        "rank %d: the new communicator has rank %d, size %d, max_size %d; "
        "want %d, %d, %d", R->rank, mep_comm_rank(R->comm), R->size,
        mep_comm_max_size(R->comm), R->rank, size, R->max_size);
  for (int r = 0; r < size; r++) R->alive[r] = R->seen[r] = 1;
  R->epoch = mep_comm_epoch(R->comm);
  CHECK(R->join || R->epoch == 0, "rank %d: epoch %" PRIu64 " at creation",
        R->rank, R->epoch);
  ft_check_active(R, 1, R->join ? "joining" : "creation");
}

/* The list with the fault in it: the victim acts at its step, the others
 * run every step and may see it end degraded. */
static void phase_fault(ft_rank_t *R) {
  size_t n = 0;
  int large = 0;
  const ft_step_t *steps = ft_steps(R->scen->short_list, &n, &large);
  int victim = ft_plan_is_lost(R->plan, R->rank);
  for (size_t i = 0; i < n; i++) {
    uint64_t gid = ft_gid(R->cycle, FT_PH_FAULT, (int)i);
    if (victim && (int)i == R->plan->step)
      ft_victim_before(R, &steps[i], gid);
    ft_run_step(R, &steps[i], gid, (int)(i & 1), 0);
    if (victim && (int)i == R->plan->step) ft_victim_after(R);
  }
}

/* A frozen victim is continued once every survivor dropped it; the
 * survivors keep running collectives until it says its call failed, so
 * its attempt overlaps theirs. Whether to stop is agreed through an
 * all-reduce (max) of "the key is there", so every survivor runs the
 * same number of them. */
static void wait_resumed(ft_rank_t *R) {
  static const ft_step_t flag_step = {FT_ALLREDUCE, MEP_INT64, MEP_MAX, 1};
  char key[64];
  snprintf(key, sizeof key, "ftt/resumed/%d", R->cycle);
  long long deadline = ft_now_ms() + 3 * R->timeout_ms + 20000;
  for (int it = 0;; it++) {
    CHECK(it < 1000 && ft_now_ms() < deadline, "rank %d: the frozen victim "
          "did not report its failed call after %d collectives", R->rank, it);
    int exists = 0;
    CHECK_OK(R->store->check(R->store->ctx, key, &exists));
    int64_t flag = exists, res = -1;
    uint8_t recv[8 + FT_TAIL];
    memset(recv, 0, sizeof recv);
    ft_bufs_t b = {(uint8_t *)&flag, recv, 8, 8};
    ft_coll_run(R, &flag_step, ft_gid(R->cycle, FT_PH_FLAG, it), it & 1, 0,
                &b);
    memcpy(&res, recv, 8);
    CHECK(res == 0 || res == 1, "rank %d: max of flags is %" PRId64, R->rank,
          res);
    CHECK(res >= flag, "rank %d: max of flags %" PRId64 " < mine", R->rank,
          res);
    if (res) return;
    ft_sleep_ms(20);
  }
}

/* After the drop: exactly the victims left; point-to-point with each
 * fails at once with MEP_ERR_PEER_FAILED, blocking or not. */
static void check_lost(ft_rank_t *R) {
  for (int r = 0; r < R->plan->size_before; r++)
    CHECK(R->alive[r] == !ft_plan_is_lost(R->plan, r),
          "rank %d: cycle %d: rank %d is %s at the recovery point, but it %s",
          R->rank, R->cycle, r, R->alive[r] ? "active" : "dropped",
          ft_plan_is_lost(R->plan, r) ? "was a victim" : "was no victim");
  for (int i = 0; i < R->plan->nlost; i++) {
    int v = R->plan->lost[i];
    uint8_t buf[67];
    memset(buf, 0x5a, sizeof buf);
    long long t0 = ft_now_ms();
    int rs = mep_send(R->comm, buf, sizeof buf, v, 3, NULL);
    int rr = mep_recv(R->comm, buf, sizeof buf, v, 3, NULL);
    mep_req_t *q = NULL;
    int ra = mep_send(R->comm, buf, sizeof buf, v, 4, &q);
    if (ra == MEP_OK) ra = mep_req_wait(q, ft_wait_ms(R));
    mep_req_free(q);
    long long ms = ft_now_ms() - t0;
    CHECK(rs == MEP_ERR_PEER_FAILED && rr == MEP_ERR_PEER_FAILED &&
              ra == MEP_ERR_PEER_FAILED,
          "rank %d: with dropped rank %d: send %s, recv %s, async send %s; "
          "want MEP_ERR_PEER_FAILED", R->rank, v, mep_strerror(rs),
          mep_strerror(rr), mep_strerror(ra));
    CHECK(ms < R->timeout_ms / 2, "rank %d: point-to-point with dropped "
          "rank %d took %lld ms to fail", R->rank, v, ms);
    fprintf(R->report, "P %d %d %lld\n", R->cycle, v, ms);
  }
}

static void phase_after(ft_rank_t *R) {
  if (R->plan->kind == FT_STOP) wait_resumed(R);
  size_t n = 0;
  const ft_step_t *steps = ft_steps_after(&n);
  for (size_t i = 0; i < n; i++)
    ft_run_step(R, &steps[i], ft_gid(R->cycle, FT_PH_AFTER, (int)i),
                (int)(i & 1), 0);
  check_lost(R);
}

/* Every caller of mep_comm_peer_state gets the same states: active ranks
 * ACTIVE, victims DROPPED until their replacement shows up (JOINING),
 * slots beyond the group EMPTY unless a process asks for them. Returns how
 * many of the ranks to admit are JOINING. */
static int check_states(ft_rank_t *R, const mep_peer_state_t *st) {
  int joining = 0;
  for (int r = 0; r < R->max_size; r++) {
    int add = 0;
    for (int i = 0; i < R->plan->nadd; i++) add |= R->plan->add[i] == r;
    int beyond = r >= R->size;
    int ok = R->alive[r]  ? st[r] == MEP_PEER_ACTIVE
             : add        ? st[r] == MEP_PEER_JOINING ||
                         st[r] == (beyond ? MEP_PEER_EMPTY : MEP_PEER_DROPPED)
             : beyond     ? st[r] == MEP_PEER_EMPTY
                          : st[r] == MEP_PEER_DROPPED;
    CHECK(ok, "rank %d: cycle %d: mep_comm_peer_state says rank %d is in "
          "state %d (%s, %s)", R->rank, R->cycle, r, (int)st[r],
          R->alive[r] ? "active" : "inactive", add ? "to admit" : "left");
    joining += add && st[r] == MEP_PEER_JOINING;
  }
  return joining;
}

static void count_resources(ft_rank_t *R) {
  int fds, store_fds;
  ft_count_fds((int)ft_env_num("FT_STORE_PORT", 0), &fds, &store_fds);
  int threads = ft_count_dir("/proc/self/task");
  CHECK(fds > 0 && threads > 0, "cannot read /proc/self");
  fprintf(R->report, "F %d %d %d %d\n", R->cycle, fds, threads, store_fds);
  /* The store's pool keeps one connection per thread that used it at the
   * same time as another: the application's, the progress thread's, and
   * the thread that claims an epoch. */
  CHECK(store_fds <= threads + 1, "rank %d: %d connections to the store "
        "with %d threads", R->rank, store_fds, threads);
  if (++R->recoveries == 1) {
    R->fds_first = fds;
    R->threads_first = threads;
  } else if (R->cycle == R->scen->cycles - 1) {
    CHECK(fds == R->fds_first && threads == R->threads_first,
          "rank %d: %d fds and %d threads after its first recovery, %d and "
          "%d after %d (connections to the store not counted)", R->rank,
          R->fds_first, R->threads_first, fds, threads, R->recoveries);
    printf("rank %d: %d fds and %d threads after recovery 1 and %d\n",
           R->rank, fds, threads, R->recoveries);
  }
}

/* The survivors wait until every rank to admit is JOINING, then admit
 * them; the group is whole again with a larger epoch. */
static void recover(ft_rank_t *R) {
  ft_check_active(R, 1, "the steps after the fault");
  uint64_t epoch0 = R->epoch;
  ft_event(R, "ready", NULL);
  mep_peer_state_t *st = ft_xcalloc((size_t)R->max_size, sizeof *st);
  long long t0 = ft_now_ms(), deadline = t0 + 30000;
  int polls = 0;
  for (;; polls++) {
    int rc = mep_comm_peer_state(R->comm, st, R->max_size);
    CHECK(rc == MEP_OK, "rank %d: mep_comm_peer_state: %s: %s", R->rank,
          mep_strerror(rc), mep_last_error());
    if (check_states(R, st) == R->plan->nadd) break;
    CHECK(ft_now_ms() < deadline, "rank %d: cycle %d: the ranks to admit "
          "are not all JOINING after 30 s", R->rank, R->cycle);
    ft_sleep_ms(10);
  }
  free(st);
  long long t1 = ft_now_ms();
  int rc = mep_comm_recover_ranks(R->comm, R->plan->add, R->plan->nadd);
  CHECK(rc == MEP_OK, "rank %d: mep_comm_recover_ranks: %s: %s", R->rank,
        mep_strerror(rc), mep_last_error());
  long long t2 = ft_now_ms();
  for (int i = 0; i < R->plan->nadd; i++) R->alive[R->plan->add[i]] = 1;
  R->size = mep_comm_size(R->comm);
  CHECK(R->size == R->plan->size_after, "rank %d: size %d after the "
        "recovery, want %d", R->rank, R->size, R->plan->size_after);
  ft_check_active(R, 1, "the recovery");
  CHECK(R->epoch > epoch0, "rank %d: epoch %" PRIu64 " after the recovery, "
        "%" PRIu64 " before", R->rank, R->epoch, epoch0);
  fprintf(R->report, "R %d %lld %lld %" PRIu64 " %d\n", R->cycle, t1 - t0,
          t2 - t1, R->epoch, polls);
  count_resources(R);
}

static void phase_full(ft_rank_t *R) {
  size_t n = 0;
  int large = 0;
  const ft_step_t *steps = ft_steps(R->scen->short_list, &n, &large);
  for (size_t i = 0; i < n; i++)
    ft_run_step(R, &steps[i], ft_gid(R->cycle, FT_PH_FULL, (int)i),
                (int)((i + 1) & 1), 1);
}

/* Every process alive at the end meets in the store before destroying, so
 * no rank leaves while another still finishes the last collective. */
static void finish(ft_rank_t *R) {
  int64_t v = 0;
  CHECK_OK(R->store->add(R->store->ctx, "ftt/end", 1, &v));
  long long deadline = ft_now_ms() + 30000;
  while (v < R->size) {
    CHECK(ft_now_ms() < deadline, "rank %d: %lld of %d ranks at the end "
          "after 30 s", R->rank, (long long)v, R->size);
    ft_sleep_ms(2);
    CHECK_OK(R->store->add(R->store->ctx, "ftt/end", 0, &v));
  }
  long long t0 = ft_now_ms();
  CHECK_OK(mep_comm_destroy(R->comm));
  fprintf(R->report, "D %lld\n", ft_now_ms() - t0);
  ft_event(R, "done", NULL);
  mep_store_destroy(R->store);
  fclose(R->report);
  free(R->alive), free(R->scratch), free(R->seen), free(R->dropped);
}

int ft_rank_main(void) {
  ft_rank_t R;
  load_env(&R);
  create_comm(&R);
  for (int c = R.start_cycle; c < R.scen->cycles; c++) {
    ft_plan_t plan;
    ft_plan_make(R.scen, R.n0, R.seed, c, &plan);
    R.cycle = c;
    R.plan = &plan;
    R.lost_sent = 0;
    if (!(R.join && c == R.start_cycle)) {
      phase_fault(&R);
      phase_after(&R);
      recover(&R);
    }
    phase_full(&R);
    R.plan = NULL;
    ft_plan_free(&plan);
  }
  finish(&R);
  return 0;
}
