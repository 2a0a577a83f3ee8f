/*
 * bye.c - close(): the orderly end of a peer's connection.
 *
 * When nothing is left to send to the peer (every socket's queue empty:
 * each earlier write and signal was handed to the kernel), close() sends a
 * BYE on each socket before shutting them down, so the peer tells this
 * close from a crash and reports MEP_ERR_CLOSED, not MEP_ERR_PEER_FAILED
 * (recv.c). With anything still queued no BYE is sent: that data is lost,
 * and the peer must see a failure. Nothing may drive the sockets while
 * close() runs (at the end, the core's progress thread has stopped; when
 * a rank is dropped, poll() waits on the peer's lock): the BYEs are sent
 * right here, and close() waits until the peer's kernel acknowledged them,
 * at most TCP_BYE_MS in all. That wait matters: a socket closed with
 * unread data (what the peer still sent us) is reset, and a reset throws
 * away what our kernel had not transmitted yet, the BYE included; what the
 * peer's kernel acknowledged stays readable there.
 * Then close() releases the connection (fds, queues, buffers), whether the
 * peer is alive, dead, frozen or cut off: the writes still queued complete
 * with MEP_ERR_CLOSED first, and a report of the peer's failure that poll()
 * has not handed out yet is dropped, so nothing about this connection can
 * be taken for news of the rank's replacement.
 */
#include <errno.h>
#include <inttypes.h>
#include <linux/sockios.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include "tcp.h"

/* peer->mu held: the bytes still queued for p, or UINT64_MAX when a BYE
 * cannot go at all (dead, not fully connected, a socket broke, or the
 * peer is closing itself and reads nothing more). */
static uint64_t left_to_send(const tcp_peer_t *p) {
  if (p->dead || p->closing || p->nup < p->ctx->cfg.nsock) return UINT64_MAX;
  uint64_t queued = 0;
  for (int i = 0; i < p->ctx->cfg.nsock; i++) {
    const tcp_sock_t *s = &p->socks[i];
    if (s->tx_err || s->fd < 0) return UINT64_MAX;
    queued += s->queued;
  }
  return queued;
}

/* peer->mu held. Sends socket s's BYE by the deadline: 0, or -1 with errno
 * (ETIMEDOUT: the kernel had no room in time, the peer reads nothing). */
static int send_bye(tcp_sock_t *s, int64_t deadline) {
  uint8_t hdr[MEP_TCP_HDR_LEN];
  mep__tcp_msg_t m = {.type = MEP_TCP_MSG_BYE, .seq = s->tx_seq};
  mep__tcp_msg_encode(hdr, &m);
  size_t done = 0;
  while (done < sizeof hdr) {
    ssize_t n = send(s->fd, hdr + done, sizeof hdr - done,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    int64_t left = deadline - mep__tcp_now_ms();
    if (left <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    struct pollfd pf = {.fd = s->fd, .events = POLLOUT};
    poll(&pf, 1, (int)left);
  }
  return 0;
}

/* peer->mu held. Waits until the peer's kernel acknowledged everything
 * sent on s, or s was reset or closed by the peer (it reads nothing more:
 * there is no point in waiting). 0, or -1 at the deadline. */
static int wait_acked(tcp_sock_t *s, int64_t deadline) {
  for (;;) {
    int unacked = 0;
    if (ioctl(s->fd, SIOCOUTQ, &unacked) || unacked == 0) return 0;
    struct pollfd pf = {.fd = s->fd, .events = 0};
    if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLERR | POLLHUP))) return 0;
    if (mep__tcp_now_ms() >= deadline) return -1;
    struct timespec ts = {0, 200 * 1000}; /* an ACK has no poll event */
    nanosleep(&ts, NULL);
  }
}

/* peer->mu held: sends the BYEs and waits for them to be acknowledged. */
static void say_bye(tcp_peer_t *p) {
  tcp_ctx_t *ctx = p->ctx;
  int64_t deadline = mep__tcp_now_ms() + TCP_BYE_MS;
  const char *why = NULL;
  int k = ctx->cfg.nsock, bad = -1;
  for (int i = 0; i < k && bad < 0; i++)
    if (send_bye(&p->socks[i], deadline))
      bad = i, why = errno == ETIMEDOUT ? "no room to send it"
                                        : strerror(errno);
  for (int i = 0; i < k && bad < 0; i++)
    if (wait_acked(&p->socks[i], deadline)) bad = i, why = "not acknowledged";
  if (bad >= 0)
    TCP_LOG(ctx, MEP_LOG_INFO,
            "tcp: rank %d could not say goodbye to rank %d on socket %d "
            "within %d ms: %s; it may take the close for a failure",
            ctx->rank, p->rank, bad, TCP_BYE_MS, why);
}

int mep__tcp_close(mep_tp_ep_t *ep) {
  tcp_peer_t *p = ep;
  if (!p) return 0;
  tcp_ctx_t *ctx = p->ctx;
  pthread_mutex_lock(&p->mu);
  /* deferred small writes were accepted: they go before the goodbye */
  mep__tcp_flush_lazy_peer(p);
  uint64_t queued = left_to_send(p);
  if (queued == 0) {
    say_bye(p);
  } else if (queued != UINT64_MAX) {
    TCP_LOG(ctx, MEP_LOG_INFO,
            "tcp: rank %d closes its endpoint of rank %d with %" PRIu64
            " bytes not yet sent; they are dropped, and rank %d will take "
            "the close for a failure", ctx->rank, p->rank, queued, p->rank);
  }
  mep__tcp_peer_fail_locked(p, MEP_ERR_CLOSED, 0);
  pthread_mutex_unlock(&p->mu);
  /* Waits for a poll() in progress to end, so that nothing it still reads
   * is freed; the rank stays shut until connect() is called for it. */
  pthread_mutex_lock(&ctx->poll_mu);
  pthread_mutex_lock(&ctx->mu);
  int first = ctx->peers[p->rank] == p;
  if (first) {
    ctx->shut[p->rank] = 1;
    mep__tcp_peer_retire(p, 1);
  }
  pthread_mutex_unlock(&ctx->mu);
  if (first) mep__tcp_cq_forget(ctx, p->rank);
  pthread_mutex_unlock(&ctx->poll_mu);
  return 0;
}
