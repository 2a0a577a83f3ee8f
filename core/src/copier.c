/* copier.c - the copy thread (copier.h). */
#include "copier.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

unsigned mep__copier_delay_us;

struct mep__copier {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int busy, stop; /* under mu */
  uint8_t *dst;
  const uint8_t *src;
  size_t n, lo, hi;
  size_t reached; /* of [lo, hi), under mu */
};

/* The first range goes in pieces, each announced, so that a waiter in
 * mep__copier_reach goes on long before the range is done. */
#define PIECE ((size_t)256 << 10)

static void copy_first(mep__copier_t *c) {
  for (size_t off = c->lo; off < c->hi;) {
    size_t len = c->hi - off < PIECE ? c->hi - off : PIECE;
    memcpy(c->dst + off, c->src + off, len);
    off += len;
    pthread_mutex_lock(&c->mu);
    c->reached = off - c->lo;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
  }
}

static void *run(void *arg) {
  mep__copier_t *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->busy && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
    if (!c->busy) break;
    pthread_mutex_unlock(&c->mu);
    unsigned us = __atomic_load_n(&mep__copier_delay_us, __ATOMIC_RELAXED);
    if (us) nanosleep(&(struct timespec){0, (long)us * 1000}, NULL);
    copy_first(c);
    if (c->lo) memcpy(c->dst, c->src, c->lo);
    if (c->hi < c->n) memcpy(c->dst + c->hi, c->src + c->hi, c->n - c->hi);
    pthread_mutex_lock(&c->mu);
    c->busy = 0;
    pthread_cond_broadcast(&c->cv);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

int mep__copier_new(mep__copier_t **out) {
  mep__copier_t *c = calloc(1, sizeof *c);
  if (!c) return mep__err(MEP_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  /* signals go to the application's threads, not this one */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&c->thread, NULL, run, c);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return mep__err_errno(MEP_ERR_SYSTEM, rc, "starting the copy thread");
  }
  pthread_setname_np(c->thread, "mep-copy");
  *out = c;
  return MEP_OK;
}

void mep__copier_free(mep__copier_t *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thread, NULL);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void mep__copier_start(mep__copier_t *c, uint8_t *dst, const uint8_t *src,
                       size_t n, size_t first_lo, size_t first_hi) {
  pthread_mutex_lock(&c->mu);
  c->dst = dst;
  c->src = src;
  c->n = n;
  c->lo = first_lo;
  c->hi = first_hi;
  c->reached = 0;
  c->busy = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

void mep__copier_reach(mep__copier_t *c, size_t bytes) {
  pthread_mutex_lock(&c->mu);
  while (c->busy && c->reached < bytes) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

void mep__copier_wait(mep__copier_t *c) {
  pthread_mutex_lock(&c->mu);
  while (c->busy) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

int mep__cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set)) return 1;
  return CPU_COUNT(&set);
}
