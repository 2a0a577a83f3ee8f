/* ft_claim.c - a coordinator's decision claimed in the store.
 *
 * The claim makes the store the arbiter when two coordinators decide the
 * same epoch (a partition, or a frozen rank that wakes and finds itself
 * alone): the first claim of <name>/ft/<epoch> wins, the others adopt the
 * set it published. It runs on a thread of its own, so the engine keeps
 * answering probes meanwhile; a store that does not answer within two
 * probe periods is given up on, and then only a majority may decide.
 * ft.c starts claims and adopts what they settle on; this file calls
 * nothing of ft.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "ft_state.h"
#include "log.h"
#include "store.h"

/* Left alone because every other rank closed its connection in order:
 * they dropped this rank (it was frozen or cut off) or all left. Either
 * way it must not go on as a group of one. */
static int closed_on_me(const mep_comm_t *comm, const uint8_t *set) {
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank) continue;
    if (set[p]) return 0;
    if (comm->ft->act[p] &&
        atomic_load(&comm->peers[p].failed) != MEP_ERR_CLOSED)
      return 0;
  }
  return 1;
}

/* Without the store to arbitrate, only a majority of the active set may
 * go on: a rank cut off with the store out of reach must not carry on as
 * a group of its own while the others carry on too. */
static int majority(const mep_comm_t *comm, const uint8_t *set) {
  int keep = 0, had = 0;
  for (int p = 0; p < comm->size; p++) {
    keep += set[p] != 0;
    had += comm->ft->act[p] != 0;
  }
  return 2 * keep > had;
}

/* The claim thread: owns cl->set until it sets state 2. */
static void *claim_run(void *arg) {
  mep_comm_t *comm = arg;
  mep__ft_claim_t *cl = &comm->ft->cl;
  mep_store_t *st = comm->store;
  char k[512];
  int64_t n = 0;
  size_t len = 16 + (size_t)comm->max_size;
  mep__store_cancel_on(&cl->cancel);
  snprintf(k, sizeof k, "%s/ft/%llu", comm->ns, (unsigned long long)cl->epoch);
  int rc = st->add ? st->add(st->ctx, k, 1, &n) : MEP_ERR_UNSUPPORTED;
  strncat(k, "/set", sizeof k - strlen(k) - 1);
  uint8_t *blob = rc ? NULL : malloc(len);
  if (!rc && !blob) rc = MEP_ERR_NOMEM;
  if (!rc && n == 1) {
    memcpy(blob, &cl->decided, 8);
    memcpy(blob + 8, &cl->epoch, 8);
    memcpy(blob + 16, cl->set, (size_t)comm->max_size);
    rc = st->set(st->ctx, k, blob, len);
  } else if (!rc) {
    void *val = NULL;
    size_t vlen = 0;
    rc = st->get(st->ctx, k, &val, &vlen, comm->timeout_ms);
    if (rc == MEP_OK && vlen == len) {
      memcpy(&cl->decided, val, 8);
      memcpy(cl->set, (uint8_t *)val + 16, (size_t)comm->max_size);
      cl->lost = 1;
    } else {
      /* Someone claimed it and never said what: this rank cannot know
       * where it stands. */
      memset(cl->set, 0, (size_t)comm->max_size);
      cl->lost = 1;
    }
    free(val);
  }
  free(blob);
  cl->rc = rc;
  atomic_store(&cl->state, 2);
  return NULL;
}

void mep__ft_claim_join(mep__ft_t *ft) {
  if (atomic_load(&ft->cl.state) == 0) return;
  pthread_join(ft->cl.thread, NULL);
  atomic_store(&ft->cl.state, 0);
}

/* A claim outlives its use once the engine settled without it, and a
 * store that stopped answering would hold mep_comm_destroy until the
 * store's own timeout. */
void mep__ft_claim_cancel(mep__ft_t *ft) {
  atomic_store(&ft->cl.cancel, 1);
  mep__ft_claim_join(ft);
}

void mep__ft_claim_start(mep_comm_t *comm, uint64_t epoch, const uint8_t *set,
                         uint64_t decided) {
  mep__ft_claim_t *cl = &comm->ft->cl;
  if (atomic_load(&cl->state) == 1) return; /* an old claim still hangs */
  mep__ft_claim_join(comm->ft);
  memcpy(cl->set, set, (size_t)comm->max_size);
  memcpy(cl->mine, set, (size_t)comm->max_size);
  cl->epoch = epoch;
  cl->decided = cl->mine_decided = decided;
  cl->rc = 0;
  cl->lost = 0;
  cl->since = mep__now_ms();
  atomic_store(&cl->cancel, 0);
  atomic_store(&cl->state, 1);
  if (pthread_create(&cl->thread, NULL, claim_run, comm)) {
    atomic_store(&cl->state, 0);
    cl->rc = MEP_ERR_SYSTEM; /* settled at once: deciding alone */
  }
}

/* Engine: the claim finished, or the store took too long. */
int mep__ft_claim_settle(mep_comm_t *comm, uint64_t now,
                         mep__ft_decision_t *d) {
  mep__ft_t *ft = comm->ft;
  mep__ft_claim_t *cl = &ft->cl;
  if (!cl->epoch) return 0;
  int state = atomic_load(&cl->state);
  int done = state == 2 || (state == 0 && cl->rc);
  if (!done && now < cl->since + 2 * ft->probe_ms) return 0;
  const uint8_t *set = cl->set;
  uint64_t decided = cl->decided;
  if (done && state == 2) mep__ft_claim_join(ft);
  if (!done || cl->rc) {
    mep__warn("epoch %llu: the store cannot arbitrate (%s); deciding alone",
              (unsigned long long)cl->epoch,
              done ? mep_strerror(cl->rc) : "no answer in time");
    if (closed_on_me(comm, cl->mine) || !majority(comm, cl->mine))
      memset(cl->mine, 0, (size_t)comm->max_size);
    set = cl->mine;
    decided = cl->mine_decided;
  } else if (cl->lost) {
    mep__info("epoch %llu was decided by another rank first",
              (unsigned long long)cl->epoch);
  }
  d->epoch = cl->epoch;
  d->set = set;
  d->decided = decided;
  cl->epoch = 0;
  return 1;
}

