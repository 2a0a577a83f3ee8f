/* progress.c - the communicator's progress thread: polls every used
 * transport, counts completions and records failures, and runs the
 * request engine through the hooks it registered (comm->progress_hooks:
 * the engine sits above this file, which never calls it by name).
 *
 * Adaptive by default: it spins while completions keep coming or someone
 * waits, yields and naps when that dries up, and with nobody waiting it
 * sleeps on the transports' event fds (and its own wake-up eventfd), so
 * idle ranks cost no CPU and busy ranks on few cores share them. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "config.h"
#include "error.h"
#include "log.h"
#include "region.h"

enum { MODE_ADAPTIVE, MODE_SPIN, MODE_BLOCKING };

struct mep__progress {
  pthread_t thread;
  int wake_fd;             /* eventfd: stop, or a waiter arrived */
  _Atomic int stop;
  _Atomic int waiters;
  _Atomic int sleeping;
  _Atomic int kicked;      /* work was submitted since the last sleep */
  /* One thread at a time polls the transports and advances requests: the
   * progress thread, or a thread waiting for its own request (which saves
   * two thread hand-offs per message). */
  pthread_mutex_t poll_mu;
  _Atomic int drivers;     /* waiting threads polling for themselves */
  int mode;
  struct pollfd *fds;      /* wake_fd, then transports' event fds */
  int nfds;
  int unpollable;          /* a used transport without an event fd */
};

static void handle(mep_comm_t *comm, const mep_tp_completion_t *c,
                   const char *tp_name) {
  if (c->token != MEP_TP_TOKEN_NONE) atomic_fetch_add(&comm->completed, 1);
  if (c->token != MEP_TP_TOKEN_NONE && (c->token & MEP__TOKEN_ZC) &&
      comm->zc_done && c->peer >= 0 && c->peer < comm->max_size)
    atomic_fetch_add(&comm->zc_done[c->peer], 1);
  if (c->status >= 0) return;
  int expected = 0;
  if (c->token != MEP_TP_TOKEN_NONE &&
      atomic_compare_exchange_strong(&comm->first_error, &expected,
                                     c->status))
    atomic_store(&comm->first_error_peer, c->peer);
  char why[128];
  snprintf(why, sizeof why, "reported by %s", tp_name);
  mep__comm_fail_peer(comm, c->peer, c->status, why);
}

/* One pass over the used transports; returns the completions seen. */
static int poll_once(mep_comm_t *comm) {
  mep_tp_completion_t comps[64];
  int total = 0;
  for (int i = 0; i < comm->ntps; i++) {
    mep__tp_t *tp = &comm->tps[i];
    if (!tp->used || !tp->ctx) continue;
    int n = tp->vt->poll(tp->ctx, comps, 64);
    if (n < 0) {
      mep__error("transport %s: poll failed: %s", tp->name, mep_strerror(n));
      continue;
    }
    for (int k = 0; k < n; k++) handle(comm, &comps[k], tp->name);
    total += n;
  }
  return total;
}

/* The request engine's pass, and whether it has requests pending. */
static int engine_advance(mep_comm_t *comm) {
  const mep__progress_hooks_t *h = &comm->progress_hooks;
  return h->advance ? h->advance(comm) : 0;
}

static int engine_busy(mep_comm_t *comm) {
  const mep__progress_hooks_t *h = &comm->progress_hooks;
  return h->busy ? h->busy(comm) : 0;
}

static void drain_wake(mep__progress_t *pg) {
  uint64_t v;
  if (read(pg->wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
    mep__debug("progress: wake fd read: %s", strerror(errno));
}

/* Sleeps until a transport has work, a waiter arrives or the timeout. */
static void sleep_on_fds(mep__progress_t *pg, int timeout_ms) {
  atomic_store(&pg->sleeping, 1);
  if (!atomic_load(&pg->stop) && !atomic_load(&pg->kicked))
    poll(pg->fds, (nfds_t)pg->nfds, timeout_ms);
  atomic_store(&pg->sleeping, 0);
  atomic_store(&pg->kicked, 0);
  if (pg->fds[0].revents) drain_wake(pg);
}

static void nap(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

static void wake(mep__progress_t *pg);

/* One round of polling from a waiting thread, unless another thread is at
 * it: the work done. */
static int drive(mep_comm_t *comm) {
  mep__progress_t *pg = comm->progress;
  if (!pg || pthread_mutex_trylock(&pg->poll_mu) != 0) return 0;
  int work = poll_once(comm) + engine_advance(comm);
  pthread_mutex_unlock(&pg->poll_mu);
  return work;
}

/* How long a waiting thread polls for itself before it backs off. */
#define DRIVE_MS 2

void mep__wait_begin(mep__waiter_t *w, mep_comm_t *comm) {
  memset(w, 0, sizeof *w);
  w->comm = comm;
  w->driving = comm->progress != NULL;
  w->drive_until = mep__deadline_in(DRIVE_MS);
  if (w->driving) atomic_fetch_add(&comm->progress->drivers, 1);
  mep__progress_waiter_enter(comm);
}

static void stop_driving(mep__waiter_t *w) {
  mep__progress_t *pg = w->comm->progress;
  w->driving = 0;
  if (atomic_fetch_sub(&pg->drivers, 1) == 1 && atomic_load(&pg->sleeping))
    wake(pg);
}

int mep__wait_step(mep__waiter_t *w) {
  if (!w->driving) {
    mep__backoff(&w->backoff);
    return 0;
  }
  if (drive(w->comm) == 0 && ++w->rounds % 16 == 0) {
    if (mep__passed(w->drive_until)) {
      stop_driving(w);
      return 0;
    }
    sched_yield();
  }
  return 1;
}

void mep__wait_end(mep__waiter_t *w) {
  if (w->driving) stop_driving(w);
  mep__progress_waiter_leave(w->comm);
}

static int poll_round(mep_comm_t *comm) {
  mep__progress_t *pg = comm->progress;
  pthread_mutex_lock(&pg->poll_mu);
  int work = poll_once(comm) + engine_advance(comm);
  pthread_mutex_unlock(&pg->poll_mu);
  return work;
}

static void *run(void *arg) {
  mep_comm_t *comm = arg;
  /* Naps of a few microseconds, not the default 50 us of timer slack. */
  prctl(PR_SET_TIMERSLACK, 1000UL);
  mep__progress_t *pg = comm->progress;
  unsigned idle = 0;
  while (!atomic_load(&pg->stop)) {
    if (atomic_load(&pg->drivers) > 0 && pg->mode != MODE_SPIN) {
      /* A waiting thread polls for itself: stay out of its way until the
       * last one leaves (it wakes us). */
      atomic_store(&pg->sleeping, 1);
      if (atomic_load(&pg->drivers) > 0 && !atomic_load(&pg->stop))
        poll(pg->fds, 1, 100);
      atomic_store(&pg->sleeping, 0);
      if (pg->fds[0].revents) drain_wake(pg);
      continue;
    }
    int work = poll_round(comm);
    if (work > 0 || pg->mode == MODE_SPIN) {
      idle = 0;
      continue;
    }
    idle++;
    int waiting = atomic_load(&pg->waiters) > 0 || engine_busy(comm);
    if (pg->mode == MODE_BLOCKING && !waiting) {
      sleep_on_fds(pg, pg->unpollable ? 1 : 100);
    } else if (idle < 256) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else if (idle < 512) {
      sched_yield();
    } else if (waiting && pg->unpollable) {
      nap(20); /* a transport must be polled to make progress */
    } else {
      /* Whatever is awaited arrives as an event on a transport's fd, and
       * local work (a put, a new request, a waiter) kicks the wake fd. */
      sleep_on_fds(pg, waiting ? 1 : 100);
    }
  }
  return NULL;
}

static int parse_mode(const mep_comm_t *comm, int *mode) {
  const char *m = mep_config_get(comm->cfg, "core", "progress");
  if (!m || strcmp(m, "adaptive") == 0) *mode = MODE_ADAPTIVE;
  else if (strcmp(m, "spin") == 0) *mode = MODE_SPIN;
  else if (strcmp(m, "blocking") == 0) *mode = MODE_BLOCKING;
  else
    return mep__err(MEP_ERR_CONFIG, "core.progress = '%s' (from %s) is not "
                    "one of adaptive, spin, blocking", m,
                    mep__config_origin(comm->cfg, "core", "progress"));
  return MEP_OK;
}

static void free_progress(mep__progress_t *pg) {
  pthread_mutex_destroy(&pg->poll_mu);
  if (pg->wake_fd >= 0) close(pg->wake_fd);
  free(pg->fds);
  free(pg);
}

int mep__progress_start(mep_comm_t *comm) {
  mep__progress_t *pg = calloc(1, sizeof *pg);
  if (!pg) return mep__err(MEP_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&pg->poll_mu, NULL);
  pg->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  pg->fds = calloc((size_t)comm->ntps + 1, sizeof *pg->fds);
  int rc = parse_mode(comm, &pg->mode);
  if (rc == MEP_OK && (pg->wake_fd < 0 || !pg->fds))
    rc = mep__err_errno(MEP_ERR_SYSTEM, errno, "progress: eventfd");
  if (rc) {
    free_progress(pg);
    return rc;
  }
  pg->fds[pg->nfds++] = (struct pollfd){.fd = pg->wake_fd, .events = POLLIN};
  for (int i = 0; i < comm->ntps; i++) {
    if (!comm->tps[i].used) continue;
    int fd = comm->tps[i].props.event_fd;
    if (fd >= 0)
      pg->fds[pg->nfds++] = (struct pollfd){.fd = fd, .events = POLLIN};
    else
      pg->unpollable = 1;
  }
  comm->progress = pg;
  rc = pthread_create(&pg->thread, NULL, run, comm);
  if (rc) {
    comm->progress = NULL;
    free_progress(pg);
    return mep__err_errno(MEP_ERR_SYSTEM, rc, "progress: pthread_create");
  }
  return MEP_OK;
}

static void wake(mep__progress_t *pg) {
  uint64_t one = 1;
  if (write(pg->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
    mep__debug("progress: wake fd write: %s", strerror(errno));
}

void mep__progress_stop(mep_comm_t *comm) {
  mep__progress_t *pg = comm->progress;
  if (!pg) return;
  atomic_store(&pg->stop, 1);
  wake(pg);
  pthread_join(pg->thread, NULL);
  free_progress(pg);
  comm->progress = NULL;
}

void mep__progress_waiter_enter(mep_comm_t *comm) {
  mep__progress_t *pg = comm->progress;
  if (!pg) return;
  atomic_fetch_add(&pg->waiters, 1);
  if (atomic_load(&pg->sleeping)) wake(pg);
}

void mep__progress_kick(mep_comm_t *comm) {
  mep__progress_t *pg = comm->progress;
  if (!pg) return;
  atomic_store(&pg->kicked, 1);
  if (atomic_load(&pg->sleeping)) wake(pg);
}

void mep__progress_waiter_leave(mep_comm_t *comm) {
  if (comm->progress) atomic_fetch_sub(&comm->progress->waiters, 1);
}
