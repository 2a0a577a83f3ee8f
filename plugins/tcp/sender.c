/*
 * sender.c - the sender threads: large writes leave on threads of the
 * plugin's own, not on the thread that queued them.
 *
 * Why: on the core's single progress thread, sendmsg() of a large write
 * is a copy into the kernel (and on loopback the whole receive path of
 * the peer's stack as well), during which that thread neither receives
 * nor reduces. A sender thread plays the part a NIC's DMA engine plays
 * for verbs: the progress thread queues and moves on. [tcp] send_thread
 * = auto starts them where a process has 4 CPUs or more and 2 peers or
 * more, or 2 sockets per peer or more. With fewer CPUs a second busy
 * thread only takes turns with the first; with one peer and one socket,
 * the kernel's socket buffers already let one thread send and receive at
 * once, and on 2 ranks the hand-over cost about as much as it saved
 * (docs/perf.md, "The tcp sender thread").
 *
 * How many. One thread sends one stream at the speed of one CPU's copy;
 * a peer's writes striped over k sockets ([tcp] sockets_per_peer) leave
 * k times as fast only when k threads send them. [tcp] send_threads = 0
 * (auto) starts one thread per socket of a peer, at most one per 4 CPUs;
 * socket i of rank r goes to thread (r * k + i) mod threads, so a peer's
 * sockets are spread over the threads, and so are the peers.
 *
 * Who sends a socket's queue. A queue is sent by the thread that queued
 * its first message (send.c) unless it holds TCP_TX_HANDOFF bytes or
 * more, or the kernel took only part of it: then it is handed over to
 * the socket's sender thread (tx_state LISTED, on that thread's list) and
 * from then on only that thread sends it (SENDING), until it is empty,
 * its socket broke or its peer died; then it is given back (NONE). Other
 * threads only append to a queue they do not own. tx_state is written
 * under ctx->tx_mu, and its change between NONE and not NONE also under
 * the peer's mu, so either lock tells whether the queue is owned there.
 *
 * sendmsg() runs without the peer's lock, so that writes queued meanwhile
 * do not wait for the copy. What keeps it safe: while a socket is
 * SENDING, its queued items are not freed by anyone else (a failing peer
 * leaves the queue of such a socket to its thread, which drops it when
 * it finds the peer dead) and its fd is not closed (mep__tcp_reap skips
 * it; release() waits in mep__tcp_tx_quiesce).
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tcp.h"

enum { STEP_DONE, STEP_SENT, STEP_FULL };

/* tx_mu held (and peer->mu for a change to or from NONE); atomic because
 * mep__tcp_tx_owned reads it under peer->mu alone. */
static void set_state(tcp_sock_t *s, int state) {
  __atomic_store_n(&s->tx_state, state, __ATOMIC_RELAXED);
}

/* The thread that sends s's queue (the header comment says why). */
static tcp_sender_t *sender_of(const tcp_sock_t *s) {
  const tcp_ctx_t *ctx = s->peer->ctx;
  size_t k = (size_t)s->peer->rank * (size_t)ctx->cfg.nsock + s->index;
  return &ctx->tx[k % (size_t)ctx->ntx];
}

/* peer->mu and tx_mu held. */
static void unlist(tcp_sock_t *s) {
  tcp_sender_t *t = sender_of(s);
  tcp_sock_t **pp = &t->head, *prev = NULL;
  for (; *pp; prev = *pp, pp = &(*pp)->tx_next)
    if (*pp == s) {
      *pp = s->tx_next;
      if (t->tail == s) t->tail = prev;
      break;
    }
  s->tx_next = NULL;
  set_state(s, TCP_TX_NONE);
}

/* peer->mu held: the queue is no longer this thread's to send. */
static void give_back(tcp_ctx_t *ctx, tcp_sock_t *s) {
  pthread_mutex_lock(&ctx->tx_mu);
  set_state(s, TCP_TX_NONE);
  pthread_cond_broadcast(&ctx->tx_idle);
  pthread_mutex_unlock(&ctx->tx_mu);
}

/* One sendmsg of s's queue. *fd: the socket, for a wait for room. */
static int step(tcp_ctx_t *ctx, tcp_sock_t *s, int *fd) {
  tcp_peer_t *p = s->peer;
  struct iovec iov[TCP_MAX_IOV];
  pthread_mutex_lock(&p->mu);
  if (p->dead) mep__tcp_drop_sock(s, mep__tcp_lost_status(p->dead_status), 1);
  if (p->dead || s->tx_err || !s->head) {
    /* a broken socket's queue waits for the peer's fate (send.c) */
    give_back(ctx, s);
    pthread_mutex_unlock(&p->mu);
    return STEP_DONE;
  }
  struct msghdr m = {.msg_iov = iov,
                     .msg_iovlen = (size_t)mep__tcp_gather(s, iov)};
  *fd = s->fd;
  pthread_mutex_unlock(&p->mu);
  ssize_t n = sendmsg(*fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  int err = n < 0 ? errno : 0;
  pthread_mutex_lock(&p->mu);
  if (n > 0)
    mep__tcp_advance(s, (uint64_t)n);
  else if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR && !p->dead)
    mep__tcp_broke(s, err);
  int done = !s->head && !p->dead;
  /* a socket that broke or a peer that died is handled by the next step */
  int again = n > 0 || err == EINTR || s->tx_err || p->dead;
  if (done) give_back(ctx, s);
  pthread_mutex_unlock(&p->mu);
  return done ? STEP_DONE : again ? STEP_SENT : STEP_FULL;
}

/* Takes the listed sockets over. 0, or -1 when the thread must stop. */
static int take(tcp_sender_t *w) {
  tcp_ctx_t *ctx = w->ctx;
  pthread_mutex_lock(&ctx->tx_mu);
  while (w->head && !ctx->tx_stop) {
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
    w->head = s->tx_next;
    if (!w->head) w->tail = NULL;
    s->tx_next = NULL;
    set_state(s, TCP_TX_SENDING);
    w->s[w->n++] = s;
  }
  int stop = ctx->tx_stop;
  pthread_mutex_unlock(&ctx->tx_mu);
  return stop ? -1 : 0;
}

/* Nothing moved: watches for a queue handed over or a socket with room
 * for TCP_TX_SPIN_US (a chunk's next write usually comes that soon, and
 * waking a sleeping thread costs as long), then sleeps on the eventfd and
 * the sockets. A failed peer's sockets are shut down, which wakes the
 * wait too. */
static void wait_room(tcp_sender_t *w) {
  tcp_ctx_t *ctx = w->ctx;
  w->pf[0] = (struct pollfd){.fd = w->evfd, .events = POLLIN};
  for (int64_t end = mep__tcp_now_us() + TCP_TX_SPIN_US;
       mep__tcp_now_us() < end;) {
    if (__atomic_load_n(&w->head, __ATOMIC_RELAXED) ||
        (w->n && poll(w->pf + 1, w->n, 0) > 0))
      return;
    __builtin_ia32_pause();
  }
  pthread_mutex_lock(&ctx->tx_mu);
  int news = w->head != NULL || ctx->tx_stop;
  w->sleeping = !news;
  pthread_mutex_unlock(&ctx->tx_mu);
  if (news) return;
  poll(w->pf, w->n + 1, w->n ? 1000 : -1);
  pthread_mutex_lock(&ctx->tx_mu);
  w->sleeping = 0;
  pthread_mutex_unlock(&ctx->tx_mu);
  uint64_t v;
  if (w->pf[0].revents & POLLIN) (void)!read(w->evfd, &v, sizeof v);
}

static void *sender_main(void *arg) {
  tcp_sender_t *w = arg;
  tcp_ctx_t *ctx = w->ctx;
  while (!take(w)) {
    int moved = 0;
    for (size_t i = 0; i < w->n;) {
      int fd = -1, r = step(ctx, w->s[i], &fd);
      if (r == STEP_DONE) {
        w->s[i] = w->s[--w->n];
        moved = 1;
        continue;
      }
      moved |= r == STEP_SENT;
      w->pf[1 + i] = (struct pollfd){.fd = fd, .events = POLLOUT};
      i++;
    }
    if (!moved) wait_room(w);
  }
  /* fini: nothing else runs; what is still queued is dropped there */
  pthread_mutex_lock(&ctx->tx_mu);
  for (size_t i = 0; i < w->n; i++) set_state(w->s[i], TCP_TX_NONE);
  w->n = 0;
  pthread_mutex_unlock(&ctx->tx_mu);
  return NULL;
}

static int cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set)) return 1;
  return CPU_COUNT(&set);
}

/* How many threads [tcp] send_threads asks for; 0 is auto (the header
 * comment). */
static int nthreads(const tcp_cfg_t *cfg, int ncpu) {
  if (cfg->send_threads) return cfg->send_threads;
  int n = ncpu / 4 < cfg->nsock ? ncpu / 4 : cfg->nsock;
  return n > 1 ? n : 1;
}

static void sender_free(tcp_sender_t *t) {
  if (t->evfd >= 0) close(t->evfd);
  free(t->s);
  free(t->pf);
}

/* Starts ctx->tx[ctx->ntx], which is zeroed. */
static int sender_start(tcp_ctx_t *ctx) {
  tcp_sender_t *t = &ctx->tx[ctx->ntx];
  *t = (tcp_sender_t){.ctx = ctx, .evfd = -1};
  t->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  t->pf = malloc(sizeof *t->pf);
  if (t->evfd < 0 || !t->pf) {
    int err = errno;
    sender_free(t);
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: setting up sender thread %d: "
                   "%s", ctx->ntx, strerror(err));
  }
  /* the thread takes no signals: they go to the application's threads */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&t->thread, NULL, sender_main, t);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    sender_free(t);
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: starting sender thread %d: "
                   "%s ([tcp] send_thread = off sends without them)",
                   ctx->ntx, strerror(rc));
  }
  pthread_setname_np(t->thread, "mep-tcp-tx");
  ctx->ntx++;
  return 0;
}

int mep__tcp_tx_start(tcp_ctx_t *ctx) {
  pthread_mutex_init(&ctx->tx_mu, NULL);
  pthread_cond_init(&ctx->tx_idle, NULL);
  int ncpu = cpus();
  int on = ctx->cfg.send_thread == TCP_SEND_THREAD_ON ||
           (ctx->cfg.send_thread == TCP_SEND_THREAD_AUTO && ncpu >= 4 &&
            (ctx->size >= 3 || ctx->cfg.nsock >= 2));
  if (!on) return 0;
  int want = nthreads(&ctx->cfg, ncpu);
  if (!(ctx->tx = calloc((size_t)want, sizeof *ctx->tx)))
    return TCP_ERR(ctx, MEP_ERR_NOMEM, "tcp: out of memory for %d sender "
                   "threads", want);
  for (int i = 0; i < want; i++) {
    int rc = sender_start(ctx);
    if (rc) return rc; /* fini stops those started */
  }
  TCP_LOG(ctx, MEP_LOG_DEBUG, "tcp: large writes leave on %d sender "
          "thread%s ([tcp] send_thread = %s, send_threads = %d)", ctx->ntx,
          ctx->ntx == 1 ? "" : "s",
          ctx->cfg.send_thread == TCP_SEND_THREAD_ON ? "on" : "auto",
          ctx->cfg.send_threads);
  return 0;
}

void mep__tcp_tx_stop(tcp_ctx_t *ctx) {
  pthread_mutex_lock(&ctx->tx_mu);
  ctx->tx_stop = 1;
  pthread_mutex_unlock(&ctx->tx_mu);
  for (int i = 0; i < ctx->ntx; i++) {
    uint64_t one = 1;
    (void)!write(ctx->tx[i].evfd, &one, sizeof one);
    pthread_join(ctx->tx[i].thread, NULL);
    sender_free(&ctx->tx[i]);
  }
  free(ctx->tx);
  ctx->tx = NULL;
  ctx->ntx = 0;
  pthread_cond_destroy(&ctx->tx_idle);
  pthread_mutex_destroy(&ctx->tx_mu);
}

int mep__tcp_tx_owned(const tcp_sock_t *s) {
  return __atomic_load_n(&s->tx_state, __ATOMIC_RELAXED) != TCP_TX_NONE;
}

int mep__tcp_tx_wants(const tcp_sock_t *s) {
  return s->peer->ctx->ntx && s->head && !s->tx_err;
}

void mep__tcp_tx_handoff(tcp_sock_t *s) {
  tcp_ctx_t *ctx = s->peer->ctx;
  tcp_sender_t *t = sender_of(s);
  pthread_mutex_lock(&ctx->tx_mu);
  if (s->tx_state == TCP_TX_NONE) {
    set_state(s, TCP_TX_LISTED);
    if (t->tail)
      t->tail->tx_next = s;
    else
      t->head = s;
    t->tail = s;
  }
  int wake = t->sleeping;
  t->sleeping = 0;
  pthread_mutex_unlock(&ctx->tx_mu);
  uint64_t one = 1;
  if (wake) (void)!write(t->evfd, &one, sizeof one);
}

int mep__tcp_tx_detach(tcp_sock_t *s) {
  tcp_ctx_t *ctx = s->peer->ctx;
  if (!mep__tcp_tx_owned(s)) return 0;
  pthread_mutex_lock(&ctx->tx_mu);
  int sending = s->tx_state == TCP_TX_SENDING;
  if (s->tx_state == TCP_TX_LISTED) unlist(s);
  pthread_mutex_unlock(&ctx->tx_mu);
  return sending;
}

int mep__tcp_tx_busy(tcp_peer_t *p) {
  for (int i = 0; i < p->ctx->cfg.nsock; i++)
    if (mep__tcp_tx_owned(&p->socks[i])) return 1;
  return 0;
}

void mep__tcp_tx_quiesce(tcp_peer_t *p) {
  tcp_ctx_t *ctx = p->ctx;
  if (!ctx->ntx) return;
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < ctx->cfg.nsock; i++) mep__tcp_tx_detach(&p->socks[i]);
  pthread_mutex_unlock(&p->mu);
  pthread_mutex_lock(&ctx->tx_mu);
  for (int i = 0; i < ctx->cfg.nsock;)
    if (p->socks[i].tx_state == TCP_TX_SENDING)
      pthread_cond_wait(&ctx->tx_idle, &ctx->tx_mu);
    else
      i++;
  pthread_mutex_unlock(&ctx->tx_mu);
}
