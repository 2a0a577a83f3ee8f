/*
 * poll.c - progress: the endpoints' completion queues, the completion
 * channel (re-armed once calls find nothing, so that an idle core can
 * sleep on the epoll fd), the device's async events (a queue pair gone to
 * error), and the endpoints' sockets, whose end is the fastest news of a
 * dead peer.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>

#include "verbs.h"

/* What a failed work completion says about the peer. */
static int wc_status(enum ibv_wc_status s) {
  switch (s) {
  case IBV_WC_REM_ACCESS_ERR:
  case IBV_WC_LOC_PROT_ERR:
  case IBV_WC_LOC_ACCESS_ERR: return MEP_ERR_BOUNDS;
  case IBV_WC_REM_INV_REQ_ERR:
  case IBV_WC_REM_OP_ERR: return MEP_ERR_PROTOCOL;
  default: return MEP_ERR_PEER_FAILED;
  }
}

static int qp_index(const verbs_ep_t *ep, uint32_t qp_num) {
  for (int q = 0; q < ep->nqp; q++)
    if (ep->qps[q].qp->qp_num == qp_num) return q;
  return -1;
}

/* A batch of fewer completions than asked for emptied the queue (as far
 * as a second call could tell): no second call, which a ping-pong would
 * pay for on every message (the provider takes a lock each time). */
#define VERBS_DRAIN_BATCH 32

int mep__verbs_drain(verbs_ep_t *ep) {
  verbs_ctx_t *ctx = ep->ctx;
  struct ibv_wc wc[VERBS_DRAIN_BATCH];
  int n = VERBS_DRAIN_BATCH, got = 0, recvs = 0;
  while (!ep->dead && n == VERBS_DRAIN_BATCH &&
         (n = ibv_poll_cq(ep->cq, VERBS_DRAIN_BATCH, wc)) > 0) {
    got += n;
    for (int i = 0; i < n && !ep->dead; i++) {
      int q = qp_index(ep, wc[i].qp_num);
      if (wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id & VERBS_RECV_BIT) {
        recvs++;
        ep->recvs--; /* a signal of the peer: applied here if in band */
        int st = mep__verbs_inband_recv(ep, &wc[i]);
        if (st) mep__verbs_ep_fail(ep, st, 1);
        continue;
      }
      if (wc[i].status == IBV_WC_SUCCESS && q >= 0) {
        mep__verbs_complete(ep, q, wc[i].wr_id);
        continue;
      }
      VERBS_LOG(ctx, MEP_LOG_ERROR, "verbs: rank %d: a work request on "
                "queue pair %d to rank %d failed: %s (vendor error %#x); "
                "the peer is reported failed", ctx->rank, q, ep->rank,
                ibv_wc_status_str(wc[i].status), wc[i].vendor_err);
      mep__verbs_ep_fail(ep, wc_status(wc[i].status), 1);
    }
  }
  if (n < 0 && !ep->dead) {
    VERBS_LOG(ctx, MEP_LOG_ERROR, "verbs: rank %d: polling the completion "
              "queue of rank %d failed; the peer is reported failed",
              ctx->rank, ep->rank);
    mep__verbs_ep_fail(ep, MEP_ERR_PEER_FAILED, 1);
  }
  /* only a receive taken here lowers the receives posted */
  if (recvs && !ep->dead && mep__verbs_post_recvs(ep)) {
    VERBS_LOG(ctx, MEP_LOG_ERROR, "verbs: rank %d: posting receives for "
              "rank %d's signals failed: %s; the peer is reported failed",
              ctx->rank, ep->rank, strerror(errno));
    mep__verbs_ep_fail(ep, MEP_ERR_PEER_FAILED, 1);
  }
  return ep->dead ? -1 : got;
}

/* ep->mu held: completions, then what may be posted now. The number of
 * completions taken. */
static int progress(verbs_ep_t *ep) {
  int got = ep->dead ? 0 : mep__verbs_drain(ep);
  if (got >= 0 && !ep->dead && mep__verbs_waiting(ep)) mep__verbs_pump(ep);
  return got > 0 ? got : 0;
}

/* ep->mu held: arms the completion queue if an event disarmed it, then
 * drains it, so that a completion that came before the arming is not
 * left waiting without an event. */
static int arm(verbs_ep_t *ep) {
  if (!ep->dead && !ep->cq_armed)
    ep->cq_armed = ibv_req_notify_cq(ep->cq, 0) == 0;
  return progress(ep);
}

/* ------------------------------------------------------------ events */

static void on_chan(verbs_ctx_t *ctx) {
  struct ibv_cq *cq;
  void *arg;
  while (ibv_get_cq_event(ctx->dev.chan, &cq, &arg) == 0) {
    ((verbs_ep_t *)arg)->cq_armed = 0;
    ibv_ack_cq_events(cq, 1);
  }
}

static void fail_from_event(verbs_ep_t *ep, int status, const char *what) {
  verbs_ctx_t *ctx = ep->ctx;
  pthread_mutex_lock(&ep->mu);
  if (!ep->dead && ep->connected)
    VERBS_LOG(ctx, MEP_LOG_ERROR, "verbs: rank %d: %s on the connection to "
              "rank %d; the peer is reported failed", ctx->rank, what,
              ep->rank);
  mep__verbs_ep_fail(ep, status, 1);
  pthread_mutex_unlock(&ep->mu);
}

/* poll_mu held. An event names a queue pair or completion queue whose
 * context is its endpoint; ibv_destroy_qp/cq wait until the events read
 * are acknowledged, so the endpoint is there until the ack. */
static void on_async(verbs_ctx_t *ctx) {
  struct ibv_async_event ev;
  while (ibv_get_async_event(ctx->dev.ib, &ev) == 0) {
    enum ibv_event_type t = ev.event_type;
    const char *what = ibv_event_type_str(t);
    if (t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR ||
        t == IBV_EVENT_QP_ACCESS_ERR)
      fail_from_event(ev.element.qp->qp_context,
                      t == IBV_EVENT_QP_ACCESS_ERR ? MEP_ERR_BOUNDS
                                                   : MEP_ERR_PEER_FAILED,
                      what);
    else if (t == IBV_EVENT_CQ_ERR)
      fail_from_event(ev.element.cq->cq_context, MEP_ERR_PEER_FAILED, what);
    else if (t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_PORT_ERR)
      VERBS_LOG(ctx, MEP_LOG_ERROR, "verbs: rank %d: %s on %s port %u",
                ctx->rank, what, ctx->dev.name, ctx->dev.port);
    else
      VERBS_LOG(ctx, MEP_LOG_DEBUG, "verbs: rank %d: async event %s",
                ctx->rank, what);
    if (t == IBV_EVENT_DEVICE_FATAL)
      for (verbs_ep_t *ep = ctx->live; ep; ep = ep->live_next)
        fail_from_event(ep, MEP_ERR_PEER_FAILED, what);
    ibv_ack_async_event(&ev);
  }
}

/* poll thread: what the peer's socket says. Its end after a goodbye is an
 * orderly close; without one, the peer process is gone. */
static void on_link(verbs_ep_t *ep) {
  verbs_ctx_t *ctx = ep->ctx;
  pthread_mutex_lock(&ep->mu);
  int st = ep->link_fd < 0 || ep->dead
               ? MEP_RDMA_LINK_QUIET
               : mep__rdma_link_read(ep->link_fd, &ep->link_rx,
                                     (uint32_t)ep->rank, (uint32_t)ctx->rank);
  if (st == MEP_RDMA_LINK_BYE) {
    /* It had nothing left in flight when it said so: all it wrote has
     * landed. Our writes to it can no longer complete. */
    VERBS_LOG(ctx, MEP_LOG_DEBUG, "verbs: rank %d: rank %d closed its "
              "connection", ctx->rank, ep->rank);
    mep__verbs_ep_fail(ep, MEP_ERR_CLOSED, 1);
  } else if (st != MEP_RDMA_LINK_QUIET) {
    VERBS_LOG(ctx, MEP_LOG_WARN, "verbs: rank %d: %s from rank %d's "
              "connection socket; the peer is reported failed", ctx->rank,
              st == MEP_RDMA_LINK_EOF ? "end of stream without a goodbye"
                                      : "garbage or a read error",
              ep->rank);
    mep__verbs_ep_fail(ep, st == MEP_RDMA_LINK_EOF ? MEP_ERR_PEER_FAILED
                                                   : MEP_ERR_PROTOCOL,
                       1);
  }
  pthread_mutex_unlock(&ep->mu);
}

static void check_fds(verbs_ctx_t *ctx) {
  struct epoll_event evs[32];
  int n = epoll_wait(ctx->epfd, evs, 32, 0);
  for (int i = 0; i < n; i++) {
    verbs_src_t *src = evs[i].data.ptr;
    switch (src->kind) {
    case VERBS_SRC_CHAN: on_chan(ctx); break;
    case VERBS_SRC_ASYNC: on_async(ctx); break;
    case VERBS_SRC_LINK: on_link((verbs_ep_t *)(void *)src); break;
    default: break; /* the completion eventfd: cq_pop drains it */
    }
  }
}

/* poll_mu held: every live endpoint through progress(), or arm() when
 * `armed` (called directly, so that both inline: no call through a
 * pointer on every poll); the completions taken. The live list changes
 * only under poll_mu too (publish, retire), so the walk takes no
 * ctx->mu: a lock pair less on every call. */
static int each_ep(verbs_ctx_t *ctx, int armed) {
  int got = 0;
  for (verbs_ep_t *ep = ctx->live; ep; ep = ep->live_next) {
    pthread_mutex_lock(&ep->mu);
    got += armed ? arm(ep) : progress(ep);
    pthread_mutex_unlock(&ep->mu);
  }
  return got;
}

/*
 * What costs a system call is done only when it matters. The fds are
 * looked at every VERBS_FD_CHECK_POLLS calls. Events are needed only by a
 * core about to sleep on the epoll fd, and it sleeps only after many calls
 * that found nothing: so the eventfd of the plugin's queue is cleared after
 * VERBS_IDLE_POLLS such calls in a row, and from then on every call
 * re-arms a completion queue whose event was taken, not after every event
 * (in a ping-pong that would be two more system calls per message). A call
 * "finds nothing" when it hands the core no completion: receive
 * completions (a peer's signals, which this plugin applies itself, inband.c)
 * do not count, as the core does not see them either; so a core that goes
 * to sleep while signals keep coming finds the queues armed.
 */
int mep__verbs_poll(mep_tp_ctx_t *ctxp, mep_tp_completion_t *out, int max) {
  verbs_ctx_t *ctx = ctxp;
  if (!ctx || max < 0 || (max > 0 && !out)) return MEP_ERR_INVALID;
  pthread_mutex_lock(&ctx->poll_mu);
  if (++ctx->npoll % VERBS_FD_CHECK_POLLS == 0) check_fds(ctx);
  if (ctx->idle == VERBS_IDLE_POLLS) mep__verbs_cq_settle(ctx);
  each_ep(ctx, ctx->idle >= VERBS_IDLE_POLLS);
  int n = max > 0 && mep__verbs_cq_ready(ctx) ? mep__verbs_cq_pop(ctx, out, max)
                                              : 0;
  if (n)
    ctx->idle = 0;
  else if (ctx->idle <= VERBS_IDLE_POLLS)
    ctx->idle++;
  pthread_mutex_unlock(&ctx->poll_mu);
  return n;
}
