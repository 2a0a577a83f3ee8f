/*
 * connect.c - connect() and close().
 *
 * connect() makes an endpoint (completion queue, queue pairs at INIT),
 * runs the bootstrap exchange (handshake.h: the lower rank dials, both
 * bring their queue pairs to RTS before either returns), then publishes
 * the endpoint: its socket joins the epoll set, its completion queue is
 * armed, and poll() serves it.
 *
 * close() ends a connection in order when it can: it waits (at most
 * VERBS_BYE_MS) until every request it posted completed, then says
 * goodbye on the socket, so the peer reports MEP_ERR_CLOSED rather than a
 * failure. A dead, frozen or cut-off peer only makes those waits end at
 * their deadlines. Either way it then releases everything the connection
 * holds, and what was still pending completes with MEP_ERR_CLOSED.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#include "verbs.h"

static int up_cb(void *arg, const mep__rdma_qpinfo_t *theirs) {
  return mep__verbs_qp_up(arg, theirs);
}

/* poll_mu and ctx->mu held: whether connect() to `rank` at incarnation
 * `inc` may go on (0), finds that connection up already (1, *out set), or
 * must not (an error). Frees the tombstone of the rank's last endpoint:
 * the core never uses a closed endpoint again. */
static int claim(verbs_ctx_t *ctx, int rank, uint64_t inc, verbs_ep_t **out) {
  verbs_ep_t *p = ctx->peers[rank];
  if (ctx->connecting[rank])
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: rank %d: connect to rank "
                     "%d: another connect to that rank is in progress",
                     ctx->rank, rank);
  if (p && !p->dead && p->inc == inc) return *out = p, 1;
  if (p)
    return VERBS_ERR(ctx, p->dead ? MEP_ERR_PEER_FAILED : MEP_ERR_INVALID,
                     "verbs: rank %d: connect to rank %d: the endpoint of its "
                     "earlier connection %s; close it first", ctx->rank, rank,
                     p->dead ? "failed and is not closed yet"
                             : "(another process) is still open");
  mep__verbs_tomb_free(ctx, rank);
  ctx->connecting[rank] = 1;
  return 0;
}

/* Makes the endpoint poll()'s: its socket watched, its completion queue
 * armed, in the peers table and the live list. Under poll_mu, so that
 * poll() never sees an event of an endpoint that is then given up. */
static int publish(verbs_ctx_t *ctx, verbs_ep_t *ep) {
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = ep};
  pthread_mutex_lock(&ctx->poll_mu);
  pthread_mutex_lock(&ctx->mu);
  ctx->connecting[ep->rank] = 0;
  int rc = 0;
  if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ep->link_fd, &ev))
    rc = VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: rank %d: connect to rank "
                   "%d: watching its socket failed: %s", ctx->rank, ep->rank,
                   strerror(errno));
  pthread_mutex_lock(&ep->mu);
  if (!rc && (ep->dead || ibv_req_notify_cq(ep->cq, 0)))
    rc = VERBS_ERR(ctx, MEP_ERR_PEER_FAILED, "verbs: rank %d: connect to "
                   "rank %d: %s", ctx->rank, ep->rank,
                   ep->dead ? "a queue pair went to the error state during "
                              "set-up"
                            : "arming its completion queue failed");
  ep->connected = ep->cq_armed = !rc;
  pthread_mutex_unlock(&ep->mu);
  if (rc) {
    epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ep->link_fd, NULL);
  } else {
    ctx->peers[ep->rank] = ep;
    ep->live_next = ctx->live;
    if (ctx->live) ctx->live->live_prev = ep;
    ctx->live = ep;
  }
  pthread_mutex_unlock(&ctx->mu);
  pthread_mutex_unlock(&ctx->poll_mu);
  return rc;
}

static void unclaim(verbs_ctx_t *ctx, int rank) {
  pthread_mutex_lock(&ctx->mu);
  ctx->connecting[rank] = 0;
  pthread_mutex_unlock(&ctx->mu);
}

int mep__verbs_connect(mep_tp_ctx_t *ctxp, int peer, const void *blob,
                       size_t len, mep_tp_ep_t **out) {
  verbs_ctx_t *ctx = ctxp;
  if (!ctx || !out) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: connect from rank %d to "
                     "rank %d in a group of %d", ctx->rank, peer, ctx->size);
  mep__verbs_addr_t a;
  char why[160];
  if (mep__verbs_addr_decode(blob, len, &a, why, sizeof why))
    return VERBS_ERR(ctx, MEP_ERR_PROTOCOL, "verbs: rank %d: connect to rank "
                     "%d: %s", ctx->rank, peer, why);
  verbs_ep_t *ep = NULL;
  pthread_mutex_lock(&ctx->poll_mu);
  pthread_mutex_lock(&ctx->mu);
  int rc = claim(ctx, peer, a.boot.incarnation, &ep);
  pthread_mutex_unlock(&ctx->mu);
  pthread_mutex_unlock(&ctx->poll_mu);
  if (rc < 0) return rc;
  if (rc > 0) return *out = ep, 0;
  int64_t deadline = mep__rdma_now_ms() + ctx->timeout_ms;
  rc = mep__verbs_ep_new(ctx, peer, a.boot.incarnation, &ep);
  mep__rdma_qpinfo_t mine;
  if (!rc) {
    mep__verbs_ep_info(ep, &mine);
    rc = mep__rdma_boot_connect(&ctx->boot, peer, &a.boot, &mine, up_cb, ep,
                                deadline, &ep->link_fd);
  }
  if (!rc) {
    rc = publish(ctx, ep); /* in ctx->peers, the fork walker's, if it worked */
    mep__rdma_boot_adopted(&ctx->boot, &ep->link_fd);
  }
  if (rc) {
    mep__verbs_ep_free(ep);
    unclaim(ctx, peer);
    return rc;
  }
  VERBS_LOG(ctx, MEP_LOG_DEBUG, "verbs: rank %d connected to rank %d over "
            "%s port %u", ctx->rank, peer, ctx->dev.name, ctx->dev.port);
  *out = ep;
  return 0;
}

/* ep->mu held: waits, at most VERBS_BYE_MS, until every request queued
 * or posted completed. 1 when they did. */
static int settle(verbs_ep_t *ep) {
  mep__verbs_mark(ep);
  int64_t deadline = mep__rdma_now_ms() + VERBS_BYE_MS;
  for (;;) {
    mep__verbs_pump(ep);
    if (mep__verbs_drain(ep) < 0) return 0;
    if (mep__verbs_idle(ep)) return 1;
    if (mep__rdma_now_ms() >= deadline) return 0;
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
  }
}

int mep__verbs_close(mep_tp_ep_t *epp) {
  verbs_ep_t *ep = epp;
  if (!ep) return 0;
  verbs_ctx_t *ctx = ep->ctx;
  pthread_mutex_lock(&ep->mu);
  if (ep->retired) {
    pthread_mutex_unlock(&ep->mu);
    return 0;
  }
  if (!ep->dead) {
    int calm = settle(ep);
    if (calm && mep__rdma_link_bye(ep->link_fd, (uint32_t)ctx->rank,
                                   (uint32_t)ep->rank, VERBS_BYE_MS) == 0)
      VERBS_LOG(ctx, MEP_LOG_DEBUG, "verbs: rank %d said goodbye to rank %d",
                ctx->rank, ep->rank);
    else if (!ep->dead)
      VERBS_LOG(ctx, MEP_LOG_INFO, "verbs: rank %d closes its connection to "
                "rank %d %s; rank %d may take the close for a failure",
                ctx->rank, ep->rank,
                calm ? "without a goodbye (the socket took none)"
                     : "with requests still in flight",
                ep->rank);
  }
  mep__verbs_ep_fail(ep, MEP_ERR_CLOSED, 0);
  pthread_mutex_unlock(&ep->mu);
  /* poll() may be at this endpoint: wait for it, then release. */
  pthread_mutex_lock(&ctx->poll_mu);
  pthread_mutex_lock(&ctx->mu);
  if (ctx->peers[ep->rank] == ep) mep__verbs_ep_retire(ep, 1);
  pthread_mutex_unlock(&ctx->mu);
  mep__verbs_cq_forget(ctx, ep->rank);
  pthread_mutex_unlock(&ctx->poll_mu);
  return 0;
}
