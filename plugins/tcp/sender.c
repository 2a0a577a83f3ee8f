/*
 * sender.c - the sender threads: large writes leave on threads of the
 * plugin's own (a pool, pool.c), not on the thread that queued them.
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
 * (auto) starts one thread per socket of a peer, at most one per 4 CPUs.
 *
 * Who sends a socket's queue. A queue is sent by the thread that queued
 * its first message (send.c) unless it holds TCP_TX_HANDOFF bytes or
 * more, or the kernel took only part of it: then it is handed over to
 * the socket's sender thread and from then on only that thread sends it,
 * until it is empty, its socket broke or its peer died; then it is given
 * back. Other threads only append to a queue they do not own.
 *
 * sendmsg() runs without the peer's lock, so that writes queued meanwhile
 * do not wait for the copy. What keeps it safe: while a socket is BUSY
 * with its thread, its queued items are not freed by anyone else (a
 * failing peer leaves the queue of such a socket to its thread, which
 * drops it when it finds the peer dead) and its fd is not closed.
 */
#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "tcp.h"

/* One sendmsg of s's queue. *fd: the socket, for a wait for room. */
static int step(tcp_sock_t *s, int *fd) {
  tcp_peer_t *p = s->peer;
  tcp_pool_t *pool = &p->ctx->tx;
  struct iovec iov[TCP_MAX_IOV];
  pthread_mutex_lock(&p->mu);
  if (p->dead) mep__tcp_drop_sock(s, mep__tcp_lost_status(p->dead_status), 1);
  if (p->dead || s->tx_err || !s->head) {
    /* a broken socket's queue waits for the peer's fate (send.c) */
    mep__tcp_pool_give_back(pool, s);
    pthread_mutex_unlock(&p->mu);
    return TCP_STEP_DONE;
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
  if (done) mep__tcp_pool_give_back(pool, s);
  pthread_mutex_unlock(&p->mu);
  return done ? TCP_STEP_DONE : again ? TCP_STEP_MOVED : TCP_STEP_WAIT;
}

int mep__tcp_tx_start(tcp_ctx_t *ctx) {
  tcp_pool_t *pool = &ctx->tx;
  mep__tcp_pool_init(pool, ctx, TCP_TX, step);
  int n = mep__tcp_pool_size(ctx, ctx->cfg.send_thread, ctx->cfg.send_threads);
  return n ? mep__tcp_pool_start(pool, n) : 0;
}

int mep__tcp_tx_wants(const tcp_sock_t *s) {
  return s->peer->ctx->tx.n && s->head && !s->tx_err;
}
