/* qp.c - an endpoint's RC queue pairs: creation at INIT, the steps to RTR
 * and RTS once the peer's numbers are known, and the error state. */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "verbs.h"

static uint32_t random_psn(void) {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
    v = (uint32_t)(uintptr_t)&v * 2654435761u;
  return v & 0xffffffu;
}

static struct ibv_qp *create(verbs_ep_t *ep, uint32_t inline_bytes,
                             struct ibv_qp_init_attr *ia) {
  verbs_ctx_t *ctx = ep->ctx;
  memset(ia, 0, sizeof *ia);
  ia->qp_context = ep;
  ia->send_cq = ep->cq;
  ia->recv_cq = ep->cq;
  ia->cap.max_send_wr = (uint32_t)ctx->cfg.sq_depth;
  /* queue pair 0 receives the peer's signals (a WRITE with immediate
   * consumes a receive); the others receive nothing */
  ia->cap.max_recv_wr = (uint32_t)ctx->cfg.sq_depth;
  ia->cap.max_send_sge = 1;
  ia->cap.max_recv_sge = 1;
  ia->cap.max_inline_data = inline_bytes;
  ia->qp_type = IBV_QPT_RC;
  return ibv_create_qp(ctx->dev.pd, ia);
}

int mep__verbs_qp_create(verbs_ep_t *ep, int i) {
  verbs_ctx_t *ctx = ep->ctx;
  struct ibv_qp_init_attr ia;
  /* a device that allows less inline data refuses the queue pair: ask for
   * half as much until it takes it */
  uint32_t inl = (uint32_t)ctx->cfg.max_inline;
  struct ibv_qp *qp = create(ep, inl, &ia);
  while (!qp && inl) qp = create(ep, inl /= 2, &ia);
  if (!qp)
    return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: rank %d: creating queue "
                     "pair %d for rank %d on %s failed: %s (send_queue %d)",
                     ctx->rank, i, ep->rank, ctx->dev.name, strerror(errno),
                     ctx->cfg.sq_depth);
  ep->qps[i].qp = qp;
  ep->qps[i].psn = random_psn();
  if (i == 0 || ia.cap.max_inline_data < ep->max_inline)
    ep->max_inline = ia.cap.max_inline_data;
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_INIT,
      .pkey_index = 0,
      .port_num = ctx->dev.port,
      .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                         (ctx->dev.atomics ? IBV_ACCESS_REMOTE_ATOMIC : 0),
  };
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                IBV_QP_ACCESS_FLAGS))
    return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: rank %d: queue pair %d for "
                     "rank %d on %s: INIT failed: %s", ctx->rank, i, ep->rank,
                     ctx->dev.name, strerror(errno));
  return 0;
}

static int rtr(verbs_ep_t *ep, int q, const mep__rdma_qpinfo_t *t,
               enum ibv_mtu mtu) {
  verbs_ctx_t *ctx = ep->ctx;
  const verbs_dev_t *d = &ctx->dev;
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_RTR,
      .path_mtu = mtu,
      .dest_qp_num = t->qpn[q],
      .rq_psn = t->psn[q],
      .max_dest_rd_atomic = (uint8_t)d->max_dest_rd_atomic,
      .min_rnr_timer = 12,
      .ah_attr = {.dlid = t->lid, .sl = (uint8_t)ctx->cfg.sl,
                  .port_num = d->port},
  };
  /* RoCE always routes by GID; InfiniBand only across subnets. */
  if (d->link_layer == 2 || memcmp(t->gid, d->gid, 8) != 0) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, t->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = (uint8_t)ctx->cfg.tclass;
  }
  return ibv_modify_qp(ep->qps[q].qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                           IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int rts(verbs_ep_t *ep, int q) {
  verbs_ctx_t *ctx = ep->ctx;
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_RTS,
      .timeout = (uint8_t)ctx->cfg.timeout,
      .retry_cnt = (uint8_t)ctx->cfg.retry,
      .rnr_retry = 7,
      .sq_psn = ep->qps[q].psn,
      .max_rd_atomic = (uint8_t)ctx->dev.max_rd_atomic,
  };
  return ibv_modify_qp(ep->qps[q].qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
}

/* The path MTU: the configured one or the port's, and never more than
 * the peer's (both sides take the smaller). */
static enum ibv_mtu path_mtu(const verbs_ctx_t *ctx, uint8_t theirs) {
  int mine = ctx->cfg.mtu && ctx->cfg.mtu < ctx->dev.mtu ? ctx->cfg.mtu
                                                          : ctx->dev.mtu;
  return (enum ibv_mtu)(mine < theirs ? mine : theirs);
}

int mep__verbs_qp_up(verbs_ep_t *ep, const mep__rdma_qpinfo_t *t) {
  verbs_ctx_t *ctx = ep->ctx;
  if (t->link_layer != ctx->dev.link_layer)
    return VERBS_ERR(ctx, MEP_ERR_UNREACHABLE, "verbs: rank %d: rank %d's "
                     "device is on another link layer (%s, this one %s)",
                     ctx->rank, ep->rank,
                     t->link_layer == 1 ? "InfiniBand" : "Ethernet",
                     ctx->dev.link_layer == 1 ? "InfiniBand" : "Ethernet");
  int nqp = t->nqp < ep->nqp_made ? t->nqp : ep->nqp_made;
  enum ibv_mtu mtu = path_mtu(ctx, t->mtu);
  for (int q = 0; q < nqp; q++) {
    const char *step = rtr(ep, q, t, mtu) ? "RTR" : rts(ep, q) ? "RTS" : NULL;
    if (step)
      return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: rank %d: queue pair %d "
                       "(%#x) towards rank %d's %#x on %s port %u: %s "
                       "failed: %s (path MTU %s, GID index %d)", ctx->rank,
                       q, ep->qps[q].qp->qp_num, ep->rank, t->qpn[q],
                       ctx->dev.name, ctx->dev.port, step, strerror(errno),
                       mep__verbs_mtu_name(mtu), ctx->dev.gid_index);
  }
  ep->nqp = nqp;
  ep->peer_scratch = t->scratch_addr;
  ep->peer_scratch_rkey = t->scratch_rkey;
  VERBS_LOG(ctx, MEP_LOG_DEBUG, "verbs: rank %d: %d queue pair%s to rank %d "
            "at RTS (path MTU %s)", ctx->rank, nqp, nqp > 1 ? "s" : "",
            ep->rank, mep__verbs_mtu_name(mtu));
  return 0;
}

void mep__verbs_qp_error(verbs_ep_t *ep) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
  for (int q = 0; q < ep->nqp_made; q++)
    if (ep->qps[q].qp) ibv_modify_qp(ep->qps[q].qp, &a, IBV_QP_STATE);
}
