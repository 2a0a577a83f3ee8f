/* qp.c - an endpoint's RC queue pairs: creation at INIT, the steps to RTR
 * and RTS once the peer's numbers are known, and the error state. */
#include <errno.h>
#include <string.h>

#include "verbs.h"

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
  ep->qps[i].psn = mep__rdma_psn();
  if (i == 0 || ia.cap.max_inline_data < ep->max_inline)
    ep->max_inline = ia.cap.max_inline_data;
  if (mep__rdma_rc_init(&ctx->dev, qp))
    return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: rank %d: queue pair %d for "
                     "rank %d on %s: INIT failed: %s", ctx->rank, i, ep->rank,
                     ctx->dev.name, strerror(errno));
  return 0;
}

static mep__rdma_path_t path_of(const verbs_cfg_t *c) {
  return (mep__rdma_path_t){.mtu = c->mtu, .sl = c->sl, .tclass = c->tclass,
                            .timeout = c->timeout, .retry = c->retry};
}

int mep__verbs_qp_up(verbs_ep_t *ep, const mep__rdma_qpinfo_t *t) {
  verbs_ctx_t *ctx = ep->ctx;
  mep__rdma_path_t path = path_of(&ctx->cfg);
  enum ibv_mtu mtu;
  char why[96];
  int rc = mep__rdma_rc_path(&ctx->dev, &path, t, &mtu, why, sizeof why);
  if (rc)
    return VERBS_ERR(ctx, rc, "verbs: rank %d: rank %d's %s", ctx->rank,
                     ep->rank, why);
  int nqp = t->nqp < ep->nqp_made ? t->nqp : ep->nqp_made;
  for (int q = 0; q < nqp; q++) {
    const char *step;
    if (mep__rdma_rc_up(&ctx->dev, &path, ep->qps[q].qp, ep->qps[q].psn, t,
                        q, mtu, &step))
      return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: rank %d: queue pair %d "
                       "(%#x) towards rank %d's %#x on %s port %u: %s "
                       "failed: %s (path MTU %s, GID index %d)", ctx->rank,
                       q, ep->qps[q].qp->qp_num, ep->rank, t->qpn[q],
                       ctx->dev.name, ctx->dev.port, step, strerror(errno),
                       mep__rdma_mtu_name(mtu), ctx->dev.gid_index);
  }
  ep->nqp = nqp;
  ep->peer_scratch = t->scratch_addr;
  ep->peer_scratch_rkey = t->scratch_rkey;
  VERBS_LOG(ctx, MEP_LOG_DEBUG, "verbs: rank %d: %d queue pair%s to rank %d "
            "at RTS (path MTU %s)", ctx->rank, nqp, nqp > 1 ? "s" : "",
            ep->rank, mep__rdma_mtu_name(mtu));
  return 0;
}

void mep__verbs_qp_error(verbs_ep_t *ep) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
  for (int q = 0; q < ep->nqp_made; q++)
    if (ep->qps[q].qp) ibv_modify_qp(ep->qps[q].qp, &a, IBV_QP_STATE);
}
