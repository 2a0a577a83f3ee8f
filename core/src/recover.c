/* recover.c - growing the group back: a process joins as the rank it
 * replaces (or a new one), the active ranks see it (mep_comm_peer_state)
 * and admit it (mep_comm_recover_ranks).
 *
 * Store keys: a joining process draws its incarnation from the counter
 * <ns>/incarnation/<rank>, registers its regions (their keys carry it) and
 * then announces itself in <ns>/join/<rank>; every rank remembers the
 * incarnation it admitted last, so a higher one there means one waits. The lowest active
 * rank writes <ns>/welcome/<rank>/<incarnation>: the epoch, active set,
 * collective count and incarnations the joiner starts from.
 *
 * Called by mep_comm_create (comm_api.c) for a joiner; calls the creation
 * steps (comm.c), the subsystems' state (comm_state.c), their per-peer
 * resets, the progress thread and the collectives' entry points
 * (coll_api.c) for its barriers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "coll.h"
#include "error.h"
#include "ft.h"
#include "log.h"
#include "p2p.h"
#include "region.h"
#include "req.h"
#include "route.h"

static void key(const mep_comm_t *comm, char *k, size_t len, const char *what,
                int rank, int64_t inc) {
  if (inc >= 0)
    snprintf(k, len, "%s/%s/%d/%lld", comm->ns, what, rank, (long long)inc);
  else
    snprintf(k, len, "%s/%s/%d", comm->ns, what, rank);
}

/* The incarnation of the process waiting to join as `rank`, 0 if none
 * announced itself yet. */
static int join_count(mep_comm_t *comm, int rank, int64_t *n) {
  char k[512];
  int exists = 0;
  *n = 0;
  key(comm, k, sizeof k, "join", rank, -1);
  mep_store_t *st = comm->store;
  void *val = NULL;
  size_t len = 0;
  int rc = MEP_OK;
  if (st->check) {
    rc = st->check(st->ctx, k, &exists);
    if (rc == MEP_OK && exists)
      rc = st->get(st->ctx, k, &val, &len, comm->timeout_ms);
  } else { /* a store without check(): a get that does not wait */
    rc = st->get(st->ctx, k, &val, &len, 0);
    exists = rc == MEP_OK;
    if (rc == MEP_ERR_TIMEOUT || rc == MEP_ERR_NOT_FOUND) rc = MEP_OK;
  }
  if (rc == MEP_OK && exists && len == sizeof *n) memcpy(n, val, len);
  free(val);
  return rc ? mep__err_wrap(rc, "store key '%s'", k) : MEP_OK;
}

static uint64_t list_digest(const int *ranks, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) h = (h ^ (uint64_t)ranks[i]) * 1099511628211ull;
  return h;
}

/* ----------------------------------------------------------- welcome */

typedef struct welcome {
  uint64_t epoch, ops, committed, digest;
  uint32_t next_region; /* so later registrations pair up again */
  int32_t size, njoin;
  uint8_t *act;
  int64_t *inc;
  int32_t *joiners;
} welcome_t;

static void welcome_encode(const mep_comm_t *comm, const welcome_t *w,
                           mep__wbuf_t *b) {
  mep__wbuf_u64(b, w->epoch);
  mep__wbuf_u64(b, w->ops);
  mep__wbuf_u64(b, w->committed);
  mep__wbuf_u64(b, w->digest);
  mep__wbuf_u32(b, w->next_region);
  mep__wbuf_u32(b, (uint32_t)w->size);
  mep__wbuf_u32(b, (uint32_t)w->njoin);
  for (int p = 0; p < comm->max_size; p++) {
    mep__wbuf_u32(b, w->act[p]);
    mep__wbuf_u64(b, (uint64_t)w->inc[p]);
  }
  for (int i = 0; i < w->njoin; i++) mep__wbuf_u32(b, (uint32_t)w->joiners[i]);
}

static int welcome_decode(const mep_comm_t *comm, const void *val, size_t len,
                          welcome_t *w) {
  mep__rbuf_t b = {.data = val, .len = len};
  w->epoch = mep__rbuf_u64(&b);
  w->ops = mep__rbuf_u64(&b);
  w->committed = mep__rbuf_u64(&b);
  w->digest = mep__rbuf_u64(&b);
  w->next_region = mep__rbuf_u32(&b);
  w->size = (int32_t)mep__rbuf_u32(&b);
  w->njoin = (int32_t)mep__rbuf_u32(&b);
  if (b.bad || w->size < 1 || w->size > comm->max_size || w->njoin < 1 ||
      w->njoin > comm->max_size)
    return mep__err(MEP_ERR_PROTOCOL, "malformed welcome");
  for (int p = 0; p < comm->max_size; p++) {
    w->act[p] = mep__rbuf_u32(&b) != 0;
    w->inc[p] = (int64_t)mep__rbuf_u64(&b);
  }
  w->joiners = malloc((size_t)w->njoin * sizeof *w->joiners);
  if (!w->joiners) return mep__err(MEP_ERR_NOMEM, "out of memory");
  for (int i = 0; i < w->njoin; i++)
    w->joiners[i] = (int32_t)mep__rbuf_u32(&b);
  return b.bad ? mep__err(MEP_ERR_PROTOCOL, "malformed welcome") : MEP_OK;
}

/* --------------------------------------------------------- connecting */

/* Connects to `p` (a joiner, or for a joiner an active rank) and makes
 * its pair state fresh; the engine keeps away from p until it is active. */
static int connect_fresh(mep_comm_t *comm, int p) {
  /* Fresh state first: once connected, p may write at once. */
  pthread_mutex_lock(&comm->engine_lock);
  mep__ft_reset_peer(comm, p);
  mep__coll_reset_peer(comm, p);
  mep__p2p_reset_peer(comm, p);
  pthread_mutex_unlock(&comm->engine_lock);
  mep__card_t card;
  memset(&card, 0, sizeof card);
  int rc = mep__comm_fetch_card(comm, p, &card);
  mep_tp_ep_t *ep = NULL;
  if (rc == MEP_OK) rc = mep__comm_connect_peer(comm, p, &card, &ep);
  mep__card_free(&card);
  if (rc) return rc;
  pthread_mutex_lock(&comm->engine_lock);
  comm->peers[p].ep = ep;
  atomic_store(&comm->peers[p].failed, 0);
  pthread_mutex_unlock(&comm->engine_lock);
  return MEP_OK;
}

/* ------------------------------------------------------------ joining */

int mep__comm_join(mep_comm_t *comm) {
  int me = comm->rank, n = comm->max_size;
  /* A number of its own first: its regions' store keys carry it, so no
   * survivor can import what an earlier process of this rank published. */
  char k[512];
  int64_t inc = 0;
  key(comm, k, sizeof k, "incarnation", me, -1);
  int rc = comm->store->add(comm->store->ctx, k, 1, &inc);
  if (rc) return mep__err_wrap(rc, "joining (store key '%s')", k);
  comm->incarnation[me] = inc;
  rc = mep__comm_secret_and_card(comm);
  /* Its peers are not known yet: regions are registered with every
   * transport that runs here, whichever the routes turn out to be. */
  for (int i = 0; i < comm->ntps; i++)
    if (comm->tps[i].ctx) comm->tps[i].used = 1;
  if (rc == MEP_OK) rc = mep__comm_setup_state(comm);
  if (rc) return rc;
  /* Until welcomed, this rank knows of nobody. */
  uint8_t *none = calloc((size_t)n, 1);
  if (!none) return mep__err(MEP_ERR_NOMEM, "out of memory");
  none[me] = 1;
  mep__ft_set_members(comm, 0, none, 0);
  free(none);
  key(comm, k, sizeof k, "join", me, -1);
  rc = comm->store->set(comm->store->ctx, k, &inc, sizeof inc);
  if (rc) return mep__err_wrap(rc, "announcing the join (store key '%s')", k);
  mep__info("joining as rank %d (process %lld of that rank); waiting to be "
            "admitted", me, (long long)inc);
  key(comm, k, sizeof k, "welcome", me, inc);
  void *val = NULL;
  size_t len = 0;
  rc = comm->store->get(comm->store->ctx, k, &val, &len, comm->timeout_ms);
  if (rc)
    return mep__err_wrap(rc, "rank %d: not admitted within %d ms (no rank "
                         "called mep_comm_recover_ranks for it; store key "
                         "'%s')", me, comm->timeout_ms, k);
  welcome_t w = {.act = calloc((size_t)n, 1), .inc = comm->incarnation};
  rc = w.act ? welcome_decode(comm, val, len, &w)
             : mep__err(MEP_ERR_NOMEM, "out of memory");
  free(val);
  /* Active ranks in increasing order, like at creation: no deadlock. */
  for (int p = 0; rc == MEP_OK && p < w.size; p++)
    if (p != me && w.act[p]) rc = connect_fresh(comm, p);
  if (rc == MEP_OK) {
    comm->size = w.size;
    pthread_mutex_lock(&comm->lock);
    if (w.next_region > comm->next_region) comm->next_region = w.next_region;
    pthread_mutex_unlock(&comm->lock);
    mep__ft_set_members(comm, w.epoch, w.act, w.committed);
    mep__coll_set_ops(comm, w.ops);
    rc = mep__comm_import_state(comm);
  }
  if (rc == MEP_OK) rc = mep__progress_start(comm);
  if (rc == MEP_OK)
    rc = mep__coll_barrier_tagged(comm, MEP__COLL_RECOVER, w.digest);
  if (rc > 0) rc = MEP_OK; /* admitted, though some rank was lost since */
  free(w.act);
  free(w.joiners);
  return rc;
}

/* --------------------------------------------------------- peer state */

int mep_comm_peer_state(mep_comm_t *comm, mep_peer_state_t *state, int len) {
  if (!comm || !state)
    return mep__err(MEP_ERR_INVALID, "mep_comm_peer_state: NULL argument");
  if (len < comm->max_size)
    return mep__err(MEP_ERR_INVALID, "mep_comm_peer_state: %d entries, the "
                    "communicator has %d rank slots", len, comm->max_size);
  if (!comm->store->add)
    return mep__err(MEP_ERR_UNSUPPORTED, "mep_comm_peer_state: the store "
                    "has no add()");
  int n = comm->max_size;
  uint8_t *act = calloc((size_t)n, 1);
  int32_t *seen = calloc((size_t)n, sizeof *seen);
  int rc = act && seen ? MEP_OK : mep__err(MEP_ERR_NOMEM, "out of memory");
  if (rc == MEP_OK) mep_comm_active(comm, act, n, NULL);
  for (int p = 0; rc == MEP_OK && p < n; p++) {
    int64_t count = 0;
    if (act[p]) continue;
    rc = join_count(comm, p, &count);
    seen[p] = count > comm->incarnation[p];
  }
  /* Joining only where every active rank sees the process. */
  if (rc == MEP_OK)
    rc = mep_allreduce(comm, seen, seen, (size_t)n, MEP_INT32, MEP_MIN, NULL);
  if (rc >= 0) {
    mep_comm_active(comm, act, n, NULL);
    for (int p = 0; p < n; p++)
      state[p] = act[p]        ? MEP_PEER_ACTIVE
                 : seen[p]     ? MEP_PEER_JOINING
                 : p < comm->size ? MEP_PEER_DROPPED
                                  : MEP_PEER_EMPTY;
    rc = MEP_OK;
  }
  free(act);
  free(seen);
  return rc;
}

/* ------------------------------------------------------------ recovery */

static int check_list(mep_comm_t *comm, const int *ranks, int n,
                      const uint8_t *act, int64_t *inc) {
  for (int i = 0; i < n; i++) {
    int r = ranks[i];
    if (r < 0 || r >= comm->max_size)
      return mep__err(MEP_ERR_INVALID, "mep_comm_recover_ranks: rank %d is "
                      "not in [0, %d) (max_size)", r, comm->max_size);
    if (act[r])
      return mep__err(MEP_ERR_INVALID, "mep_comm_recover_ranks: rank %d is "
                      "active", r);
    for (int j = 0; j < i; j++)
      if (ranks[j] == r)
        return mep__err(MEP_ERR_INVALID, "mep_comm_recover_ranks: rank %d "
                        "twice", r);
    int rc = join_count(comm, r, &inc[i]);
    if (rc) return rc;
    if (inc[i] <= comm->incarnation[r])
      return mep__err(MEP_ERR_INVALID, "mep_comm_recover_ranks: no process "
                      "waits to join as rank %d", r);
  }
  return MEP_OK;
}

static int idle(mep_comm_t *comm) {
  pthread_mutex_lock(&comm->engine_lock);
  int busy = comm->coll_head != NULL;
  pthread_mutex_unlock(&comm->engine_lock);
  return busy ? mep__err(MEP_ERR_INVALID, "mep_comm_recover_ranks: "
                         "collectives are still running") : MEP_OK;
}

static int write_welcome(mep_comm_t *comm, const welcome_t *w, int rank,
                         int64_t inc) {
  mep__wbuf_t b = {0};
  welcome_encode(comm, w, &b);
  char k[512];
  key(comm, k, sizeof k, "welcome", rank, inc);
  int rc = b.oom ? mep__err(MEP_ERR_NOMEM, "out of memory")
                 : comm->store->set(comm->store->ctx, k, b.data, b.len);
  mep__wbuf_free(&b);
  return rc;
}

static int cmp_int(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

int mep_comm_recover_ranks(mep_comm_t *comm, const int *ranks, int n) {
  if (!comm || (!ranks && n) || n < 0)
    return mep__err(MEP_ERR_INVALID, "mep_comm_recover_ranks: NULL argument");
  if (!comm->store->add)
    return mep__err(MEP_ERR_UNSUPPORTED, "mep_comm_recover_ranks: the store "
                    "has no add()");
  if (n == 0) return MEP_OK;
  int max = comm->max_size;
  int *list = malloc((size_t)n * sizeof *list);
  int64_t *inc = calloc((size_t)n, sizeof *inc);
  welcome_t w = {.act = calloc((size_t)max, 1)};
  int rc = list && inc && w.act ? idle(comm)
                                : mep__err(MEP_ERR_NOMEM, "out of memory");
  if (rc == MEP_OK) {
    memcpy(list, ranks, (size_t)n * sizeof *list);
    qsort(list, (size_t)n, sizeof *list, cmp_int);
    mep_comm_active(comm, w.act, max, NULL);
    rc = check_list(comm, list, n, w.act, inc);
  }
  /* Every active rank passes the same list, or all learn they differ. */
  uint64_t digest = list_digest(list, n);
  if (rc == MEP_OK)
    rc = mep__coll_barrier_tagged(comm, MEP__COLL_PEER_STATE, digest);
  if (rc > 0) rc = MEP_OK; /* a rank was lost meanwhile: go on without it */
  if (rc == MEP_OK) {
    mep_comm_active(comm, w.act, max, &w.epoch);
    int lowest = 0;
    while (!w.act[lowest]) lowest++;
    w.epoch++;
    w.ops = mep__coll_ops(comm);
    w.committed = w.ops;
    w.digest = digest;
    pthread_mutex_lock(&comm->lock);
    w.next_region = comm->next_region;
    pthread_mutex_unlock(&comm->lock);
    w.size = comm->size;
    w.njoin = n;
    w.joiners = list;
    for (int i = 0; i < n; i++) {
      w.act[list[i]] = 1;
      comm->incarnation[list[i]] = inc[i];
      if (list[i] + 1 > w.size) w.size = list[i] + 1;
    }
    w.inc = comm->incarnation;
    for (int i = 0; rc == MEP_OK && i < n && lowest == comm->rank; i++)
      rc = write_welcome(comm, &w, list[i], inc[i]);
  }
  for (int i = 0; rc == MEP_OK && i < n; i++) rc = connect_fresh(comm, list[i]);
  if (rc == MEP_OK) {
    pthread_mutex_lock(&comm->engine_lock);
    comm->size = w.size;
    mep__ft_set_members(comm, w.epoch, w.act, w.committed);
    pthread_mutex_unlock(&comm->engine_lock);
    mep__info("admitted %d rank(s) at epoch %llu", n,
              (unsigned long long)w.epoch);
    rc = mep__comm_import_state(comm);
  }
  if (rc == MEP_OK) {
    rc = mep__coll_barrier_tagged(comm, MEP__COLL_RECOVER, digest);
    if (rc > 0) rc = MEP_OK;
  }
  free(list);
  free(inc);
  free(w.act);
  return rc ? mep__err_wrap(rc, "mep_comm_recover_ranks") : MEP_OK;
}
