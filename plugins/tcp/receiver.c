/*
 * receiver.c - the receiver threads: long payloads land in their regions
 * on threads of the plugin's own (a pool, pool.c), not on the poll thread.
 *
 * Why: recv() of a payload is a copy out of the kernel at the speed of
 * one CPU, and the poll thread reads every socket. With two streams per
 * peer, each sent by its own sender thread, the one reading thread was
 * the limit: four streams moved no more than two (docs/perf.md, "Two
 * streams per peer"). [tcp] recv_thread = auto starts them where the
 * sender threads start by default and every rank's threads fit in half
 * the CPUs (rx_start says why), one per socket of a peer.
 *
 * What they do. The poll thread parses every header, as before; when a
 * payload's rest of TCP_RX_HANDOFF bytes or more is still to come and its
 * socket's read-ahead buffer is empty, it hands the socket to its
 * receiver thread and stops watching it. The thread reads the rest of
 * that one payload straight into the region (under the read side of
 * rx_lock, so dereg still waits for it), then lists the socket as done
 * and wakes the poll thread (the pool's done eventfd, in the epoll set),
 * which counts the message, applies the signals that waited for it and
 * reads on. So messages still complete, and signals still apply, on the
 * poll thread alone and in order; only the bytes move elsewhere.
 */
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "tcp.h"

/* One read of the payload s waits for. */
static int step(tcp_sock_t *s, int *fd) {
  *fd = s->fd; /* not closed while the socket is this thread's (pool.c) */
  ssize_t n = mep__tcp_read_payload(s, *fd);
  if (n > 0) {
    s->rx_left -= (uint64_t)n;
    if (s->rx_left) return TCP_STEP_MOVED;
    s->rx_res = TCP_RX_OK;
  } else if (n == -1 && errno == EINTR) {
    return TCP_STEP_MOVED;
  } else if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return TCP_STEP_WAIT;
  } else {
    s->rx_res = n == -2 ? TCP_RX_GONE : n == 0 ? TCP_RX_EOF : errno;
  }
  mep__tcp_pool_give_back(&s->peer->ctx->rx, s);
  return TCP_STEP_DONE;
}

int mep__tcp_rx_start(tcp_ctx_t *ctx) {
  tcp_pool_t *pool = &ctx->rx;
  mep__tcp_pool_init(pool, ctx, TCP_RX, step);
  int n = mep__tcp_pool_size(ctx, ctx->cfg.recv_thread, 0);
  /* auto: only where every rank's sender and receiver threads fit in half
   * the CPUs, as if the whole group shared this host (the plugin cannot
   * tell): otherwise the spinning threads take turns with the progress
   * threads, and on 4 ranks of one 16-CPU host collectives took up to
   * 2.4 times as long (docs/perf.md, "Receiver threads") */
  if (ctx->cfg.recv_thread == TCP_THREADS_AUTO &&
      (int64_t)ctx->size * (ctx->tx.n + n) > mep__tcp_cpus() / 2)
    n = 0;
  if (!n) return 0;
  pool->donefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ctx->rxsrc};
  if (pool->donefd < 0 ||
      epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, pool->donefd, &ev))
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: setting up the receiver "
                   "threads: %s", strerror(errno));
  return mep__tcp_pool_start(pool, n);
}

int mep__tcp_rx_handoff(tcp_sock_t *s) {
  tcp_peer_t *p = s->peer;
  tcp_ctx_t *ctx = p->ctx;
  if (!ctx->rx.n || s->rx_state != TCP_RX_PAYLOAD || s->rb_len ||
      s->rx_left < TCP_RX_HANDOFF)
    return 0;
  pthread_mutex_lock(&p->mu);
  int ok = !p->dead && s->fd >= 0;
  if (ok) {
    mep__tcp_pool_handoff(&ctx->rx, s);
    mep__tcp_sock_watch(s);
  }
  pthread_mutex_unlock(&p->mu);
  return ok;
}

tcp_sock_t *mep__tcp_rx_take_back(tcp_ctx_t *ctx) {
  for (tcp_sock_t *s; (s = mep__tcp_pool_next_done(&ctx->rx));) {
    tcp_peer_t *p = s->peer;
    pthread_mutex_lock(&p->mu);
    mep__tcp_pool_detach(&ctx->rx, s);
    int dead = p->dead;
    if (!dead) mep__tcp_sock_watch(s);
    pthread_mutex_unlock(&p->mu);
    if (!dead) return s;
  }
  return NULL;
}
