/*
 * pool.c - threads of the plugin's own that serve sockets handed to them:
 * the sender threads (sender.c) and the receiver threads (receiver.c).
 *
 * A pool's threads serve one direction of a socket each (its hand[dir]).
 * Socket i of rank r goes to thread (r * k + i) mod threads (k sockets
 * per peer), so a peer's sockets are spread over the threads, and so are
 * the peers.
 *
 * A socket's state with a pool: NONE (nobody's), LISTED (handed over, on
 * its thread's list), BUSY (the thread works on it, alone), and for a
 * pool whose sockets go back to the poll thread (the receiver threads)
 * DONE (on the pool's done list, the thread no longer touches it). The
 * state is written under the pool's mu, and its change to or from NONE
 * also under the peer's mu, so either lock tells whether the socket is
 * owned there. The thread's step runs without any lock of the pool: what
 * keeps a BUSY socket's fd and buffers alive is that nobody else frees
 * them (mep__tcp_reap skips them; release() waits in
 * mep__tcp_pool_quiesce).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "tcp.h"

/* pool->mu held (and peer->mu for a change to or from NONE); atomic
 * because mep__tcp_pool_owned reads it under peer->mu alone, and with
 * release and acquire because whoever reads a state that is no longer
 * BUSY (mep__tcp_reap) may close the fd the thread used before. */
static void set_state(tcp_pool_t *pool, tcp_sock_t *s, int state) {
  __atomic_store_n(&s->hand[pool->dir].state, state, __ATOMIC_RELEASE);
}

static int state_of(const tcp_pool_t *pool, const tcp_sock_t *s) {
  return __atomic_load_n(&s->hand[pool->dir].state, __ATOMIC_ACQUIRE);
}

static tcp_worker_t *worker_of(const tcp_pool_t *pool, const tcp_sock_t *s) {
  size_t k = (size_t)s->peer->rank * (size_t)pool->ctx->cfg.nsock + s->index;
  return &pool->w[k % (size_t)pool->n];
}

/* pool->mu held: takes s off the list *head (tail *tail) if it is there.
 * A list's head is stored atomically: a worker peeks at its own without
 * the lock while it spins (wait_ready). */
static void unlink_from(tcp_pool_t *pool, tcp_sock_t **head, tcp_sock_t **tail,
                        tcp_sock_t *s) {
  int d = pool->dir;
  tcp_sock_t **pp = head, *prev = NULL;
  for (; *pp; prev = *pp, pp = &(*pp)->hand[d].next)
    if (*pp == s) {
      __atomic_store_n(pp, s->hand[d].next, __ATOMIC_RELAXED);
      if (*tail == s) *tail = prev;
      break;
    }
  s->hand[d].next = NULL;
}

/* pool->mu held: appends s to the list *head (tail *tail). */
static void append_to(tcp_pool_t *pool, tcp_sock_t **head, tcp_sock_t **tail,
                      tcp_sock_t *s) {
  s->hand[pool->dir].next = NULL;
  if (*tail)
    (*tail)->hand[pool->dir].next = s;
  else
    __atomic_store_n(head, s, __ATOMIC_RELAXED);
  *tail = s;
}

void mep__tcp_pool_give_back(tcp_pool_t *pool, tcp_sock_t *s) {
  pthread_mutex_lock(&pool->mu);
  int listed = pool->donefd >= 0;
  if (listed) {
    set_state(pool, s, TCP_HAND_DONE);
    append_to(pool, &pool->done_head, &pool->done_tail, s);
  } else {
    set_state(pool, s, TCP_HAND_NONE);
  }
  pthread_cond_broadcast(&pool->idle);
  pthread_mutex_unlock(&pool->mu);
  uint64_t one = 1;
  if (listed) (void)!write(pool->donefd, &one, sizeof one);
}

tcp_sock_t *mep__tcp_pool_next_done(tcp_pool_t *pool) {
  pthread_mutex_lock(&pool->mu);
  tcp_sock_t *s = pool->done_head;
  if (s) unlink_from(pool, &pool->done_head, &pool->done_tail, s);
  pthread_mutex_unlock(&pool->mu);
  return s;
}

/* Takes the listed sockets over. 0, or -1 when the thread must stop. */
static int take(tcp_worker_t *w) {
  tcp_pool_t *pool = w->pool;
  pthread_mutex_lock(&pool->mu);
  while (w->head && !pool->stop) {
    if (w->n == w->cap) {
      size_t cap = w->cap ? 2 * w->cap : 16;
      tcp_sock_t **s = realloc(w->s, cap * sizeof *s);
      if (s) w->s = s;
      struct pollfd *pf = realloc(w->pf, (cap + 1) * sizeof *pf);
      if (pf) w->pf = pf;
      if (!s || !pf) break; /* out of memory: these wait, none is lost */
      w->cap = cap;
    }
    tcp_sock_t *s = w->head;
    unlink_from(pool, &w->head, &w->tail, s);
    set_state(pool, s, TCP_HAND_BUSY);
    w->s[w->n++] = s;
  }
  int stop = pool->stop;
  pthread_mutex_unlock(&pool->mu);
  return stop ? -1 : 0;
}

/* Nothing moved: watches for a socket handed over or one that is ready
 * for TCP_POOL_SPIN_US (a chunk's next message usually comes that soon,
 * and waking a sleeping thread costs as long), then sleeps on the eventfd
 * and the sockets. A failed peer's sockets are shut down, which wakes the
 * wait too. */
static void wait_ready(tcp_worker_t *w) {
  tcp_pool_t *pool = w->pool;
  w->pf[0] = (struct pollfd){.fd = w->evfd, .events = POLLIN};
  for (int64_t end = mep__tcp_now_us() + TCP_POOL_SPIN_US;
       mep__tcp_now_us() < end;) {
    if (__atomic_load_n(&w->head, __ATOMIC_RELAXED) ||
        (w->n && poll(w->pf + 1, w->n, 0) > 0))
      return;
    __builtin_ia32_pause();
  }
  pthread_mutex_lock(&pool->mu);
  int news = w->head != NULL || pool->stop;
  w->sleeping = !news;
  pthread_mutex_unlock(&pool->mu);
  if (news) return;
  poll(w->pf, w->n + 1, w->n ? 1000 : -1);
  pthread_mutex_lock(&pool->mu);
  w->sleeping = 0;
  pthread_mutex_unlock(&pool->mu);
  uint64_t v;
  if (w->pf[0].revents & POLLIN) (void)!read(w->evfd, &v, sizeof v);
}

static void *worker_main(void *arg) {
  tcp_worker_t *w = arg;
  tcp_pool_t *pool = w->pool;
  while (!take(w)) {
    int moved = 0;
    for (size_t i = 0; i < w->n;) {
      int fd = -1, r = pool->step(w->s[i], &fd);
      if (r == TCP_STEP_DONE) {
        w->s[i] = w->s[--w->n];
        moved = 1;
        continue;
      }
      moved |= r == TCP_STEP_MOVED;
      w->pf[1 + i] = (struct pollfd){.fd = fd, .events = pool->events};
      i++;
    }
    if (!moved) wait_ready(w);
  }
  /* fini: nothing else runs; what is still queued is dropped there */
  pthread_mutex_lock(&pool->mu);
  for (size_t i = 0; i < w->n; i++) set_state(pool, w->s[i], TCP_HAND_NONE);
  w->n = 0;
  pthread_mutex_unlock(&pool->mu);
  return NULL;
}

static void worker_free(tcp_worker_t *w) {
  if (w->evfd >= 0) close(w->evfd);
  free(w->s);
  free(w->pf);
}

/* Starts pool->w[pool->n], which is zeroed. */
static int worker_start(tcp_pool_t *pool) {
  tcp_ctx_t *ctx = pool->ctx;
  tcp_worker_t *w = &pool->w[pool->n];
  *w = (tcp_worker_t){.pool = pool, .evfd = -1};
  w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  w->pf = malloc(sizeof *w->pf);
  if (w->evfd < 0 || !w->pf) {
    int err = errno;
    worker_free(w);
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: setting up %s thread %d: %s",
                   pool->what, pool->n, strerror(err));
  }
  /* the thread takes no signals: they go to the application's threads */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&w->thread, NULL, worker_main, w);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    worker_free(w);
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: starting %s thread %d: %s "
                   "([tcp] %s_thread = off works without them)", pool->what,
                   pool->n, strerror(rc),
                   pool->dir == TCP_TX ? "send" : "recv");
  }
  pthread_setname_np(w->thread, pool->name);
  pool->n++;
  return 0;
}

void mep__tcp_pool_init(tcp_pool_t *pool, tcp_ctx_t *ctx, int dir,
                        int (*step)(tcp_sock_t *s, int *fd)) {
  pool->ctx = ctx;
  pool->dir = dir;
  pool->step = step;
  pool->events = dir == TCP_TX ? POLLOUT : POLLIN;
  pool->name = dir == TCP_TX ? "mep-tcp-tx" : "mep-tcp-rx";
  pool->what = dir == TCP_TX ? "sender" : "receiver";
  pool->donefd = -1;
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->idle, NULL);
  pool->started = 1;
}

int mep__tcp_pool_start(tcp_pool_t *pool, int n) {
  tcp_ctx_t *ctx = pool->ctx;
  if (!(pool->w = calloc((size_t)n, sizeof *pool->w)))
    return TCP_ERR(ctx, MEP_ERR_NOMEM, "tcp: out of memory for %d %s "
                   "threads", n, pool->what);
  for (int i = 0; i < n; i++) {
    int rc = worker_start(pool);
    if (rc) return rc; /* fini stops those started */
  }
  const tcp_cfg_t *cfg = &ctx->cfg;
  int choice = pool->dir == TCP_TX ? cfg->send_thread : cfg->recv_thread;
  TCP_LOG(ctx, MEP_LOG_DEBUG, "tcp: %d %s thread%s ([tcp] %s_thread = %s)",
          n, pool->what, n == 1 ? "" : "s",
          pool->dir == TCP_TX ? "send" : "recv",
          choice == TCP_THREADS_ON ? "on" : "auto");
  return 0;
}

void mep__tcp_pool_stop(tcp_pool_t *pool) {
  if (!pool->started) return;
  pthread_mutex_lock(&pool->mu);
  pool->stop = 1;
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < pool->n; i++) {
    uint64_t one = 1;
    (void)!write(pool->w[i].evfd, &one, sizeof one);
    pthread_join(pool->w[i].thread, NULL);
    worker_free(&pool->w[i]);
  }
  free(pool->w);
  pool->w = NULL;
  pool->n = 0;
  if (pool->donefd >= 0) close(pool->donefd);
  pool->donefd = -1;
  pthread_cond_destroy(&pool->idle);
  pthread_mutex_destroy(&pool->mu);
  pool->started = 0;
}

int mep__tcp_pool_owned(const tcp_pool_t *pool, const tcp_sock_t *s) {
  return state_of(pool, s) != TCP_HAND_NONE;
}

void mep__tcp_pool_handoff(tcp_pool_t *pool, tcp_sock_t *s) {
  tcp_worker_t *w = worker_of(pool, s);
  pthread_mutex_lock(&pool->mu);
  if (s->hand[pool->dir].state == TCP_HAND_NONE) {
    set_state(pool, s, TCP_HAND_LISTED);
    append_to(pool, &w->head, &w->tail, s);
  }
  int wake = w->sleeping;
  w->sleeping = 0;
  pthread_mutex_unlock(&pool->mu);
  uint64_t one = 1;
  if (wake) (void)!write(w->evfd, &one, sizeof one);
}

int mep__tcp_pool_detach(tcp_pool_t *pool, tcp_sock_t *s) {
  if (!mep__tcp_pool_owned(pool, s)) return 0;
  pthread_mutex_lock(&pool->mu);
  int st = s->hand[pool->dir].state;
  if (st == TCP_HAND_LISTED) {
    tcp_worker_t *w = worker_of(pool, s);
    unlink_from(pool, &w->head, &w->tail, s);
  } else if (st == TCP_HAND_DONE) {
    unlink_from(pool, &pool->done_head, &pool->done_tail, s);
  }
  if (st != TCP_HAND_BUSY) set_state(pool, s, TCP_HAND_NONE);
  pthread_mutex_unlock(&pool->mu);
  return st == TCP_HAND_BUSY;
}

int mep__tcp_pool_busy(const tcp_pool_t *pool, const tcp_peer_t *p) {
  for (int i = 0; i < p->ctx->cfg.nsock; i++) {
    int st = state_of(pool, &p->socks[i]);
    if (st == TCP_HAND_LISTED || st == TCP_HAND_BUSY) return 1;
  }
  return 0;
}

/* p->mu not held: hands back whatever of p's sockets is listed or done. */
static void detach_all(tcp_pool_t *pool, tcp_peer_t *p) {
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < p->ctx->cfg.nsock; i++)
    mep__tcp_pool_detach(pool, &p->socks[i]);
  pthread_mutex_unlock(&p->mu);
}

void mep__tcp_pool_quiesce(tcp_pool_t *pool, tcp_peer_t *p) {
  if (!pool->n) return;
  detach_all(pool, p);
  pthread_mutex_lock(&pool->mu);
  for (int i = 0; i < p->ctx->cfg.nsock;)
    if (p->socks[i].hand[pool->dir].state == TCP_HAND_BUSY)
      pthread_cond_wait(&pool->idle, &pool->mu);
    else
      i++;
  pthread_mutex_unlock(&pool->mu);
  /* a receiver thread that finished meanwhile listed its socket as done */
  detach_all(pool, p);
}

int mep__tcp_pool_size(const tcp_ctx_t *ctx, int choice, int count) {
  int ncpu = mep__tcp_cpus();
  int on = choice == TCP_THREADS_ON ||
           (choice == TCP_THREADS_AUTO && ncpu >= 4 &&
            (ctx->size >= 3 || ctx->cfg.nsock >= 2));
  if (!on) return 0;
  if (count) return count;
  int k = ncpu / 4 < ctx->cfg.nsock ? ncpu / 4 : ctx->cfg.nsock;
  return k > 1 ? k : 1;
}
