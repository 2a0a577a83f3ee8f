/* req.c - request lifecycle and the engine's request lists. Called by
 * the subsystems that make requests (coll.c, p2p.c, cuda_kpath.c); calls
 * the progress thread's waiting (progress.c) and, through the hooks
 * registered with it, the subsystems' own passes. */
#include "req.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

mep_req_t *mep__req_new(mep_comm_t *comm, int kind, mep__advance_fn advance,
                        void *impl, void (*cleanup)(mep_req_t *)) {
  mep_req_t *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->comm = comm;
  r->kind = kind;
  r->source = -1;
  r->advance = advance;
  r->impl = impl;
  r->cleanup = cleanup;
  return r;
}

void mep__req_set(mep_req_t *r, int status, const char *fmt, ...) {
  r->status = status;
  r->msg[0] = '\0';
  if (!fmt) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
}

static void destroy(mep_req_t *r) {
  if (r->cleanup) r->cleanup(r);
  free(r->dropped);
  free(r);
}

/* DONE, or freed at once when the owner already let go of it. */
static void settle(mep_req_t *r) {
  mep_comm_t *comm = r->comm;
  if (r->hooks.on_settle) r->hooks.on_settle(r, r->hooks.arg);
  int expected = MEP__REQ_RUNNING;
  if (!atomic_compare_exchange_strong(&r->state, &expected, MEP__REQ_DONE)) {
    destroy(r);
    return;
  }
  /* Pairs with the sleeper's increment-then-check in wait_done. */
  if (atomic_load(&comm->sleepers)) {
    pthread_mutex_lock(&comm->wait_mu);
    pthread_cond_broadcast(&comm->wait_cv);
    pthread_mutex_unlock(&comm->wait_mu);
  }
}

/* Drives progress for a while, then sleeps on the communicator's
 * condition until the request is done or the deadline (ms,
 * CLOCK_MONOTONIC) passes. Returns 1 when done. */
static int wait_done(mep_req_t *r, uint64_t deadline) {
  mep_comm_t *comm = r->comm;
  mep__waiter_t w;
  mep__wait_begin(&w, comm);
  while (atomic_load(&r->state) != MEP__REQ_DONE && mep__wait_step(&w)) {
  }
  mep__wait_end(&w);
  if (atomic_load(&r->state) == MEP__REQ_DONE) return 1;
  pthread_mutex_lock(&comm->wait_mu);
  atomic_fetch_add(&comm->sleepers, 1);
  while (atomic_load(&r->state) != MEP__REQ_DONE &&
         !mep__passed(deadline)) {
    struct timespec ts = {(time_t)(deadline / 1000),
                          (long)(deadline % 1000) * 1000000};
    pthread_cond_timedwait(&comm->wait_cv, &comm->wait_mu, &ts);
  }
  atomic_fetch_sub(&comm->sleepers, 1);
  pthread_mutex_unlock(&comm->wait_mu);
  return atomic_load(&r->state) == MEP__REQ_DONE;
}

void mep_req_free(mep_req_t *r) {
  if (!r) return;
  int expected = MEP__REQ_RUNNING;
  if (!atomic_compare_exchange_strong(&r->state, &expected,
                                      MEP__REQ_DETACHED))
    destroy(r);
}

int mep_req_test(mep_req_t *r, int *done) {
  if (!r || !done) return mep__err(MEP_ERR_INVALID, "mep_req_test: NULL");
  *done = atomic_load(&r->state) == MEP__REQ_DONE;
  return MEP_OK;
}

int mep_req_status(const mep_req_t *r) {
  if (!r) return MEP_ERR_INVALID;
  return atomic_load(&((mep_req_t *)r)->state) == MEP__REQ_DONE
             ? r->status
             : MEP_RUNNING;
}

size_t mep_req_bytes(const mep_req_t *r) {
  return r && atomic_load(&((mep_req_t *)r)->state) == MEP__REQ_DONE
             ? r->bytes
             : 0;
}

int mep_req_source(const mep_req_t *r) {
  return r && atomic_load(&((mep_req_t *)r)->state) == MEP__REQ_DONE
             ? r->source
             : -1;
}

int mep_req_wait(mep_req_t *r, int timeout_ms) {
  if (!r) return mep__err(MEP_ERR_INVALID, "mep_req_wait: NULL request");
  /* A finished request never touches its communicator, which may be gone
   * (destroy fails what is running with MEP_ERR_CLOSED). */
  if (atomic_load(&r->state) != MEP__REQ_DONE) {
    int t = mep__timeout_or_default(r->comm, timeout_ms);
    if (!wait_done(r, mep__deadline_in((uint64_t)t)))
      return mep__err(MEP_ERR_TIMEOUT, "request still running after %d ms",
                      t);
  }
  /* MEP_OK_DEGRADED's message names the ranks dropped (mep.h) */
  if (r->status != MEP_OK) return mep__err(r->status, "%s", r->msg);
  return r->status;
}

/* ---------------------------------------------------------- the engine */

int mep__req_start(mep_req_t *r, mep_req_t **out) {
  mep_comm_t *comm = r->comm;
  pthread_mutex_lock(&comm->engine_lock);
  int closed = comm->engine_closed;
  if (!closed) {
    mep_req_t **tail = r->kind == MEP__REQ_COLL ? &comm->coll_head
                                                : &comm->p2p_head;
    while (*tail) tail = &(*tail)->next;
    *tail = r;
    atomic_fetch_add(&comm->engine_pending, 1);
  }
  pthread_mutex_unlock(&comm->engine_lock);
  if (closed) {
    destroy(r);
    return mep__err(MEP_ERR_CLOSED, "communicator is being destroyed");
  }
  mep__progress_kick(comm);
  if (out) {
    *out = r;
    return MEP_OK;
  }
  /* The request has a deadline of its own, on silence (a collective that
   * keeps moving may take longer than timeout_ms) and ends with its own
   * message; this wait only guards against a request that never ends. */
  int t = comm->timeout_ms, rc;
  uint64_t cap = mep__deadline_in(64 * (uint64_t)t);
  do
    rc = mep_req_wait(r, t);
  while (rc == MEP_ERR_TIMEOUT && atomic_load(&r->state) != MEP__REQ_DONE &&
         !mep__passed(cap));
  if (rc == MEP_ERR_TIMEOUT && atomic_load(&r->state) != MEP__REQ_DONE) {
    mep__errsave_t why;
    mep__err_save(&why);
    mep_req_free(r); /* finishes in the background */
    return mep__err_restore(&why, rc);
  }
  mep_req_free(r);
  return rc;
}

/* Advances one list; `head_only` for the collective FIFO. */
static int advance_list(mep_comm_t *comm, mep_req_t **list, int head_only) {
  int moved = 0;
  for (mep_req_t **pp = list; *pp;) {
    mep_req_t *r = *pp;
    if (r->hooks.gate && !r->hooks.gate(r->hooks.arg)) {
      if (head_only) break;
      pp = &r->next;
      continue;
    }
    r->hooks.gate = NULL; /* open for good */
    int rc = r->advance(r);
    if (rc != MEP__ADV_DONE) {
      moved += rc == MEP__ADV_MOVED;
      if (head_only) break;
      pp = &r->next;
      continue;
    }
    *pp = r->next;
    atomic_fetch_sub(&comm->engine_pending, 1);
    settle(r);
    moved++;
    if (head_only) continue; /* the next collective may start now */
  }
  return moved;
}

/* The hooks of one phase: the work they did. */
static int run_hooks(mep_comm_t *comm, int phase) {
  int moved = 0;
  for (int i = 0; i < comm->nengine_hooks; i++)
    if (comm->engine_hooks[i].phase == phase)
      moved += comm->engine_hooks[i].advance(comm);
  return moved;
}

/* One pass, in the order req.h gives for the hooks' phases. */
static int engine_advance(mep_comm_t *comm) {
  pthread_mutex_lock(&comm->engine_lock);
  int moved = run_hooks(comm, MEP__ENGINE_BEFORE);
  if (atomic_load(&comm->engine_pending))
    moved += advance_list(comm, &comm->p2p_head, 0) +
             advance_list(comm, &comm->coll_head, 1);
  moved += run_hooks(comm, MEP__ENGINE_AFTER);
  pthread_mutex_unlock(&comm->engine_lock);
  return moved;
}

static int engine_busy(mep_comm_t *comm) {
  if (atomic_load(&comm->engine_pending) > 0) return 1;
  for (int i = 0; i < comm->nengine_hooks; i++)
    if (comm->engine_hooks[i].busy && comm->engine_hooks[i].busy(comm))
      return 1;
  return 0;
}

void mep__engine_init(mep_comm_t *comm) {
  comm->progress_hooks.advance = engine_advance;
  comm->progress_hooks.busy = engine_busy;
}

int mep__engine_add_hook(mep_comm_t *comm, int phase,
                         int (*advance)(mep_comm_t *),
                         int (*busy)(mep_comm_t *)) {
  if (comm->nengine_hooks == MEP__ENGINE_MAX_HOOKS)
    return mep__err(MEP_ERR_INVALID, "the engine takes %d hooks at most",
                    MEP__ENGINE_MAX_HOOKS);
  comm->engine_hooks[comm->nengine_hooks++] =
      (mep__engine_hook_t){.phase = phase, .advance = advance, .busy = busy};
  return MEP_OK;
}

void mep__engine_close(mep_comm_t *comm) {
  pthread_mutex_lock(&comm->engine_lock);
  comm->engine_closed = 1;
  mep_req_t *lists[2] = {comm->coll_head, comm->p2p_head};
  comm->coll_head = comm->p2p_head = NULL;
  pthread_mutex_unlock(&comm->engine_lock);
  for (int i = 0; i < 2; i++) {
    for (mep_req_t *r = lists[i], *next; r; r = next) {
      next = r->next;
      mep__req_set(r, MEP_ERR_CLOSED, "the communicator was destroyed while "
                                      "this request was running");
      atomic_fetch_sub(&comm->engine_pending, 1);
      settle(r);
    }
  }
}
