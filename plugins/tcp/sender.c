/*
 * sender.c - the sender thread: large writes leave on a thread of the
 * plugin's own, not on the thread that queued them.
 *
 * Why: on the core's single progress thread, sendmsg() of a large write
 * is a copy into the kernel (and on loopback the whole receive path of
 * the peer's stack as well), during which that thread neither receives
 * nor reduces. A sender thread plays the part a NIC's DMA engine plays
 * for verbs: the progress thread queues and moves on. [tcp] send_thread
 * = auto starts it where a process has 2 peers or more and 4 CPUs or
 * more. With fewer CPUs a second busy thread only takes turns with the
 * first; with one peer, the kernel's socket buffers already let one
 * thread send and receive at once, and on 2 ranks the hand-over cost
 * about as much as it saved (docs/perf.md, "The tcp sender thread").
 *
 * Who sends a socket's queue. A queue is sent by the thread that queued
 * its first message (send.c) unless it holds TCP_TX_HANDOFF bytes or
 * more, or the kernel took only part of it: then it is handed over here
 * (tx_state LISTED, on ctx->tx_head) and from then on only this thread
 * sends it (SENDING), until it is empty, its socket broke or its peer
 * died; then it is given back (NONE). Other threads only append to a
 * queue they do not own. tx_state is written under ctx->tx_mu, and its
 * change between NONE and not NONE also under the peer's mu, so either
 * lock tells whether the queue is owned here.
 *
 * sendmsg() runs without the peer's lock, so that writes queued meanwhile
 * do not wait for the copy. What keeps it safe: while a socket is
 * SENDING, its queued items are not freed by anyone else (a failing peer
 * leaves the queue of such a socket to this thread, which drops it when
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

/* peer->mu and tx_mu held. */
static void unlist(tcp_ctx_t *ctx, tcp_sock_t *s) {
  tcp_sock_t **pp = &ctx->tx_head, *prev = NULL;
  for (; *pp; prev = *pp, pp = &(*pp)->tx_next)
    if (*pp == s) {
      *pp = s->tx_next;
      if (ctx->tx_tail == s) ctx->tx_tail = prev;
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
static int take(tcp_ctx_t *ctx, tcp_tx_work_t *w) {
  pthread_mutex_lock(&ctx->tx_mu);
  while (ctx->tx_head && !ctx->tx_stop) {
    if (w->n == w->cap) {
      size_t cap = w->cap ? 2 * w->cap : 16;
      tcp_sock_t **s = realloc(w->s, cap * sizeof *s);
      if (s) w->s = s;
      struct pollfd *pf = realloc(w->pf, (cap + 1) * sizeof *pf);
      if (pf) w->pf = pf;
      if (!s || !pf) break; /* out of memory: these wait, none is lost */
      w->cap = cap;
    }
    tcp_sock_t *s = ctx->tx_head;
    ctx->tx_head = s->tx_next;
    if (!ctx->tx_head) ctx->tx_tail = NULL;
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
static void wait_room(tcp_ctx_t *ctx, tcp_tx_work_t *w) {
  w->pf[0] = (struct pollfd){.fd = ctx->tx_evfd, .events = POLLIN};
  for (int64_t end = mep__tcp_now_us() + TCP_TX_SPIN_US;
       mep__tcp_now_us() < end;) {
    if (__atomic_load_n(&ctx->tx_head, __ATOMIC_RELAXED) ||
        (w->n && poll(w->pf + 1, w->n, 0) > 0))
      return;
    __builtin_ia32_pause();
  }
  pthread_mutex_lock(&ctx->tx_mu);
  int news = ctx->tx_head != NULL || ctx->tx_stop;
  ctx->tx_sleeping = !news;
  pthread_mutex_unlock(&ctx->tx_mu);
  if (news) return;
  poll(w->pf, w->n + 1, w->n ? 1000 : -1);
  pthread_mutex_lock(&ctx->tx_mu);
  ctx->tx_sleeping = 0;
  pthread_mutex_unlock(&ctx->tx_mu);
  uint64_t v;
  if (w->pf[0].revents & POLLIN) (void)!read(ctx->tx_evfd, &v, sizeof v);
}

static void *sender_main(void *arg) {
  tcp_ctx_t *ctx = arg;
  tcp_tx_work_t *w = &ctx->tx_work;
  while (!take(ctx, w)) {
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
    if (!moved) wait_room(ctx, w);
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

int mep__tcp_tx_start(tcp_ctx_t *ctx) {
  pthread_mutex_init(&ctx->tx_mu, NULL);
  pthread_cond_init(&ctx->tx_idle, NULL);
  ctx->tx_evfd = -1;
  ctx->tx_on = ctx->cfg.send_thread == TCP_SEND_THREAD_ON ||
               (ctx->cfg.send_thread == TCP_SEND_THREAD_AUTO &&
                ctx->size >= 3 && cpus() >= 4);
  if (!ctx->tx_on) return 0;
  ctx->tx_evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ctx->tx_work.pf = malloc(sizeof *ctx->tx_work.pf);
  if (ctx->tx_evfd < 0 || !ctx->tx_work.pf) {
    ctx->tx_on = 0;
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: setting up the sender thread: "
                   "%s", strerror(errno));
  }
  /* the thread takes no signals: they go to the application's threads */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&ctx->tx_thread, NULL, sender_main, ctx);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    ctx->tx_on = 0;
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: starting the sender thread: "
                   "%s ([tcp] send_thread = off sends without it)",
                   strerror(rc));
  }
  pthread_setname_np(ctx->tx_thread, "mep-tcp-tx");
  TCP_LOG(ctx, MEP_LOG_DEBUG, "tcp: large writes leave on a sender thread "
          "([tcp] send_thread = %s)",
          ctx->cfg.send_thread == TCP_SEND_THREAD_ON ? "on" : "auto");
  return 0;
}

void mep__tcp_tx_stop(tcp_ctx_t *ctx) {
  if (ctx->tx_on) {
    pthread_mutex_lock(&ctx->tx_mu);
    ctx->tx_stop = 1;
    pthread_mutex_unlock(&ctx->tx_mu);
    uint64_t one = 1;
    (void)!write(ctx->tx_evfd, &one, sizeof one);
    pthread_join(ctx->tx_thread, NULL);
    ctx->tx_on = 0;
  }
  if (ctx->tx_evfd >= 0) close(ctx->tx_evfd);
  ctx->tx_evfd = -1;
  free(ctx->tx_work.s);
  free(ctx->tx_work.pf);
  ctx->tx_work = (tcp_tx_work_t){0};
  pthread_cond_destroy(&ctx->tx_idle);
  pthread_mutex_destroy(&ctx->tx_mu);
}

int mep__tcp_tx_owned(const tcp_sock_t *s) {
  return __atomic_load_n(&s->tx_state, __ATOMIC_RELAXED) != TCP_TX_NONE;
}

int mep__tcp_tx_wants(const tcp_sock_t *s) {
  return s->peer->ctx->tx_on && s->head && !s->tx_err;
}

void mep__tcp_tx_handoff(tcp_sock_t *s) {
  tcp_ctx_t *ctx = s->peer->ctx;
  pthread_mutex_lock(&ctx->tx_mu);
  if (s->tx_state == TCP_TX_NONE) {
    set_state(s, TCP_TX_LISTED);
    if (ctx->tx_tail)
      ctx->tx_tail->tx_next = s;
    else
      ctx->tx_head = s;
    ctx->tx_tail = s;
  }
  int wake = ctx->tx_sleeping;
  ctx->tx_sleeping = 0;
  pthread_mutex_unlock(&ctx->tx_mu);
  uint64_t one = 1;
  if (wake) (void)!write(ctx->tx_evfd, &one, sizeof one);
}

int mep__tcp_tx_detach(tcp_sock_t *s) {
  tcp_ctx_t *ctx = s->peer->ctx;
  if (!mep__tcp_tx_owned(s)) return 0;
  pthread_mutex_lock(&ctx->tx_mu);
  int sending = s->tx_state == TCP_TX_SENDING;
  if (s->tx_state == TCP_TX_LISTED) unlist(ctx, s);
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
  if (!ctx->tx_on) return;
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
