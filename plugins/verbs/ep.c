/* ep.c - an endpoint's life: its completion queue, queue pairs and rings
 * made for connect(), its failure, and its release by close() or fini. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "verbs.h"

/* A ring large enough that a full send queue leaves room to queue. */
static int ring_alloc(verbs_ep_t *ep, int q) {
  uint64_t cap = 64;
  while (cap < 2 * (uint64_t)ep->ctx->cfg.sq_depth) cap *= 2;
  ep->qps[q].ring = calloc(cap, sizeof *ep->qps[q].ring);
  ep->qps[q].mask = cap - 1;
  return ep->qps[q].ring ? 0 : -1;
}

/* Without inline data a SET's 8 bytes need registered memory that stays
 * as it is until the request completed: one word per send slot. */
static int set_slots(verbs_ep_t *ep) {
  verbs_ctx_t *ctx = ep->ctx;
  size_t n = (size_t)ep->nqp_made * (size_t)ctx->cfg.sq_depth;
  ep->set_slots = calloc(n, sizeof *ep->set_slots);
  ep->set_mr = ep->set_slots ? ibv_reg_mr(ctx->dev.pd, ep->set_slots,
                                          n * sizeof *ep->set_slots,
                                          IBV_ACCESS_LOCAL_WRITE)
                             : NULL;
  return ep->set_mr ? 0 : -1;
}

static int make(verbs_ep_t *ep) {
  verbs_ctx_t *ctx = ep->ctx;
  /* every send slot of every queue pair, and queue pair 0's receives */
  int cqe = (ctx->cfg.nqp + 1) * (ctx->cfg.sq_depth + 2) + 16;
  ep->cq = ibv_create_cq(ctx->dev.ib, cqe, ep, ctx->dev.chan, 0);
  if (!ep->cq)
    return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: rank %d: creating a "
                     "completion queue of %d entries for rank %d on %s "
                     "failed: %s", ctx->rank, cqe, ep->rank, ctx->dev.name,
                     strerror(errno));
  for (int q = 0; q < ctx->cfg.nqp; q++) {
    int rc = mep__verbs_qp_create(ep, q);
    if (rc) return rc;
    ep->nqp_made = q + 1;
    if (ring_alloc(ep, q))
      return VERBS_ERR(ctx, MEP_ERR_NOMEM, "verbs: connect: out of memory");
  }
  if (mep__verbs_inband_alloc(ep))
    return VERBS_ERR(ctx, MEP_ERR_NOMEM, "verbs: rank %d: the receive "
                     "buffers for rank %d's signals: %s", ctx->rank, ep->rank,
                     strerror(errno));
  if (mep__verbs_post_recvs(ep))
    return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: rank %d: posting receives "
                     "for rank %d's signals failed: %s", ctx->rank, ep->rank,
                     strerror(errno));
  if (ep->max_inline < 8 && set_slots(ep))
    return VERBS_ERR(ctx, MEP_ERR_NOMEM, "verbs: rank %d: registering the "
                     "signal words for rank %d failed: %s", ctx->rank,
                     ep->rank, strerror(errno));
  return 0;
}

int mep__verbs_ep_new(verbs_ctx_t *ctx, int rank, uint64_t inc,
                      verbs_ep_t **out) {
  verbs_ep_t *ep = calloc(1, sizeof *ep);
  if (!ep) return VERBS_ERR(ctx, MEP_ERR_NOMEM, "verbs: connect: out of "
                            "memory");
  ep->src.kind = VERBS_SRC_LINK;
  ep->ctx = ctx;
  ep->rank = rank;
  ep->inc = inc;
  ep->link_fd = -1;
  pthread_mutex_init(&ep->mu, NULL);
  int rc = make(ep);
  if (rc) {
    mep__verbs_ep_free(ep);
    return rc;
  }
  *out = ep;
  return 0;
}

void mep__verbs_ep_info(const verbs_ep_t *ep, mep__rdma_qpinfo_t *mine) {
  const verbs_ctx_t *ctx = ep->ctx;
  const verbs_dev_t *d = &ctx->dev;
  memset(mine, 0, sizeof *mine);
  memcpy(mine->gid, d->gid, 16);
  mine->lid = d->lid;
  mine->port = d->port;
  mine->link_layer = d->link_layer;
  mine->mtu = ctx->cfg.mtu && ctx->cfg.mtu < d->mtu ? (uint8_t)ctx->cfg.mtu
                                                     : d->mtu;
  mine->nqp = (uint8_t)ep->nqp_made;
  mine->scratch_addr = (uint64_t)(uintptr_t)(ctx->scratch + 1);
  mine->scratch_rkey = ctx->scratch_mr->rkey;
  for (int q = 0; q < ep->nqp_made; q++) {
    mine->qpn[q] = ep->qps[q].qp->qp_num;
    mine->psn[q] = ep->qps[q].psn;
  }
}

/* ep->mu held: every write still pending completes with `status`. */
static void fail_pending(verbs_ep_t *ep, int status) {
  verbs_ctx_t *ctx = ep->ctx;
  for (int q = 0; q < ep->nqp_made; q++) {
    verbs_qp_t *p = &ep->qps[q];
    for (uint64_t s = p->head; s < p->tail; s++) {
      verbs_wr_t *e = &p->ring[s & p->mask];
      /* an inline write's token completed when it was posted */
      int pending = (e->kind == VW_WRITE && e->last) ||
                    (e->kind == VW_INLINE && s >= p->posted);
      if (!pending) continue;
      if (!e->op) {
        mep__verbs_cq_push(ctx, e->value, status, ep->rank);
      } else if (--e->op->left == 0) {
        mep__verbs_cq_push(ctx, e->op->token, status, ep->rank);
        free(e->op);
      }
    }
    p->head = p->posted = p->tail;
    p->inflight = p->unsig = 0;
  }
  ep->fn = ep->fhead = 0;
}

void mep__verbs_ep_fail(verbs_ep_t *ep, int status, int report) {
  if (ep->dead) return;
  verbs_ctx_t *ctx = ep->ctx;
  ep->dead = 1;
  ep->dead_status = status;
  mep__verbs_qp_error(ep);
  fail_pending(ep, status == MEP_ERR_CLOSED ? MEP_ERR_CLOSED
                                            : MEP_ERR_PEER_FAILED);
  /* The peer learns at once from the end of the socket; the fd itself
   * is closed when the endpoint is released. */
  if (ep->link_fd >= 0) {
    epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, ep->link_fd, NULL);
    shutdown(ep->link_fd, SHUT_RDWR);
  }
  if (report && ep->connected)
    mep__verbs_cq_push(ctx, MEP_TP_TOKEN_NONE, status, ep->rank);
}

/* What an endpoint holds but its struct and the regions imported
 * through it. Nobody else uses it any more. */
static void release(verbs_ep_t *ep) {
  for (int q = 0; q < MEP_RDMA_MAX_QPS; q++) {
    if (ep->qps[q].qp) ibv_destroy_qp(ep->qps[q].qp);
    ep->qps[q].qp = NULL;
    free(ep->qps[q].ring);
    ep->qps[q].ring = NULL;
  }
  if (ep->cq) ibv_destroy_cq(ep->cq);
  ep->cq = NULL;
  mep__verbs_inband_free(ep);
  if (ep->set_mr) ibv_dereg_mr(ep->set_mr);
  ep->set_mr = NULL;
  free(ep->set_slots);
  ep->set_slots = NULL;
  free(ep->fences);
  ep->fences = NULL;
  ep->fcap = ep->fn = ep->fhead = 0;
  if (ep->link_fd >= 0) {
    epoll_ctl(ep->ctx->epfd, EPOLL_CTL_DEL, ep->link_fd, NULL);
    close(ep->link_fd);
  }
  ep->link_fd = -1;
  ep->retired = 1;
}

static void destroy(verbs_ep_t *ep) {
  while (ep->rmrs) {
    verbs_rmr_t *r = ep->rmrs;
    ep->rmrs = r->next;
    free(r);
  }
  pthread_mutex_destroy(&ep->mu);
  free(ep);
}

void mep__verbs_ep_free(verbs_ep_t *ep) {
  if (!ep) return;
  release(ep);
  destroy(ep);
}

void mep__verbs_tomb_free(verbs_ctx_t *ctx, int rank) {
  verbs_ep_t *t = ctx->tombs[rank];
  ctx->tombs[rank] = NULL;
  if (t) destroy(t);
}

void mep__verbs_ep_retire(verbs_ep_t *ep, int tomb) {
  verbs_ctx_t *ctx = ep->ctx;
  if (ctx->peers[ep->rank] == ep) {
    ctx->peers[ep->rank] = NULL;
    if (ep->live_prev) ep->live_prev->live_next = ep->live_next;
    else ctx->live = ep->live_next;
    if (ep->live_next) ep->live_next->live_prev = ep->live_prev;
    ep->live_prev = ep->live_next = NULL;
  }
  pthread_mutex_lock(&ep->mu);
  release(ep);
  pthread_mutex_unlock(&ep->mu);
  if (!tomb) {
    destroy(ep);
    return;
  }
  if (ctx->tombs[ep->rank] != ep) {
    mep__verbs_tomb_free(ctx, ep->rank);
    ctx->tombs[ep->rank] = ep;
  }
}
