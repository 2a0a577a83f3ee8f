/* hw.c - backend = device: queue pairs on an mlx5 NIC.
 *
 * libibverbs and libmlx5 make each RC queue pair and its CQ as they make
 * any (ibv_create_cq, ibv_create_qp; the verbs plugin's device opening
 * and RC steps, rdma_dev.h); mlx5dv_init_obj then names what the
 * producers write: the send queue's building blocks, the doorbell record,
 * the doorbell register (a UAR page's BlueFlame register), the CQ's
 * entries and its doorbell record. Those fill the same layout the model
 * fills (m5_qp_t), so host posting, descriptors and kernels are one code
 * for both. Nothing posts through ibv_post_send or polls through
 * ibv_poll_cq on these queue pairs: libmlx5's own producer state is never
 * used, so it never disagrees with the counters. The queues stay where
 * libmlx5 put them (host memory); kernels reach them once mapped (gpu.c),
 * the UAR page as I/O memory.
 *
 * Built against mlx5dv.h; no ConnectX NIC was available to this project,
 * so this path has not run (docs/ibgda.md says so). */
#include <errno.h>
#include <infiniband/mlx5dv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ibgda.h"

/* libmlx5's entry points: probe.c opened it before any context came here */
static const ibgda_dv_t *dv(void) {
  const char *why;
  return mep__ibgda_dv(&why);
}

static int accept_mlx5(struct ibv_device *d, char *why, size_t n) {
  if (dv()->is_mlx5(d)) return 1;
  snprintf(why, n, "%s is not an mlx5 device", ibv_get_device_name(d));
  return 0;
}

int mep__ibgda_hw_open(ibgda_ctx_t *ctx) {
  const char *why;
  if (!mep__ibgda_dv(&why))
    return IBGDA_ERR(ctx, MEP_ERR_UNAVAILABLE, "ibgda: rdma-core's mlx5 "
                     "library cannot be used: %s", why);
  mep__rdma_want_t w = {
      .env = ctx->env,
      .plugin = "ibgda",
      .needs = "an mlx5 NIC (ConnectX) is needed; backend = model runs "
               "the software model",
      .device = ctx->cfg.device,
      .port = ctx->cfg.port,
      .gid_index = ctx->cfg.gid_index,
      .accept = accept_mlx5,
  };
  int rc = mep__rdma_dev_open(&ctx->dev, &w);
  if (rc) return rc;
  ctx->hw = 1;
  ctx->sink_mr = ibv_reg_mr(ctx->dev.pd, ctx->sink, 8,
                            IBV_ACCESS_LOCAL_WRITE);
  if (!ctx->sink_mr)
    return IBGDA_ERR(ctx, MEP_ERR_SYSTEM, "ibgda: %s: registering 8 bytes "
                     "failed: %s", ctx->dev.name, strerror(errno));
  ctx->sink_key = ctx->sink_mr->lkey;
  return 0;
}

void mep__ibgda_hw_close(ibgda_ctx_t *ctx) {
  if (!ctx->hw) return;
  if (ctx->sink_mr) ibv_dereg_mr(ctx->sink_mr);
  ctx->sink_mr = NULL;
  mep__rdma_dev_close(&ctx->dev);
  ctx->hw = 0;
}

void mep__ibgda_hw_qp_destroy(ibgda_hwqp_t *q) {
  if (!q) return;
  if (q->qp) ibv_destroy_qp(q->qp);
  if (q->cq) ibv_destroy_cq(q->cq);
  free(q);
}

int mep__ibgda_hw_qp_create(ibgda_ctx_t *ctx, ibgda_hwqp_t **out) {
  mep__rdma_dev_t *d = &ctx->dev;
  uint32_t n = ctx->cfg.sq_bbs;
  ibgda_hwqp_t *q = NULL;
  if (posix_memalign((void **)&q, 64, sizeof *q)) return MEP_ERR_NOMEM;
  memset(q, 0, sizeof *q);
  const char *step = "ibv_create_cq";
  q->cq = ibv_create_cq(d->ib, (int)n, NULL, NULL, 0);
  if (q->cq) {
    /* the largest WQE the builders make is MEP_MLX5_MAX_WQE_BB building
     * blocks: libmlx5 sizes the ring from max_send_wr and the inline
     * size; whatever ring it gives is used whole (mlx5dv's wqe_cnt) */
    struct ibv_qp_init_attr ia = {
        .send_cq = q->cq,
        .recv_cq = q->cq,
        .cap = {.max_send_wr = n / MEP_MLX5_MAX_WQE_BB,
                .max_recv_wr = 0,
                .max_send_sge = 1,
                .max_recv_sge = 1,
                .max_inline_data = (uint32_t)ctx->cfg.max_inline},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
    };
    step = "ibv_create_qp";
    q->qp = ibv_create_qp(d->pd, &ia);
  }
  if (q->qp) {
    step = "INIT";
    if (!mep__rdma_rc_init(d, q->qp)) step = NULL;
  }
  char why[240] = "";
  if (!step) {
    struct mlx5dv_qp dq;
    struct mlx5dv_cq dc;
    memset(&dq, 0, sizeof dq);
    memset(&dc, 0, sizeof dc);
    struct mlx5dv_obj o = {.qp = {.in = q->qp, .out = &dq},
                           .cq = {.in = q->cq, .out = &dc}};
    if (dv()->init_obj(&o, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ))
      snprintf(why, sizeof why, "mlx5dv_init_obj failed: %s",
               strerror(errno));
    else
      mep__ibgda_hw_layout(&dq, &dc, q->qp->qp_num, &q->view, why,
                           sizeof why);
  }
  if (step || why[0]) {
    int e = errno;
    mep__ibgda_hw_qp_destroy(q);
    if (step)
      return IBGDA_ERR(ctx, MEP_ERR_SYSTEM, "ibgda: rank %d: %s on %s "
                       "failed: %s (send_queue %u)", ctx->rank, step,
                       d->name, strerror(e), n);
    return IBGDA_ERR(ctx, MEP_ERR_UNSUPPORTED, "ibgda: rank %d: %s: %s",
                     ctx->rank, d->name, why);
  }
  /* libmlx5 leaves every CQE invalid (MLX5_CQE_INVALID), owned by the
   * NIC, as the model starts its CQ */
  q->view.user = q->user;
  q->view.peer = -1;
  q->view.peer_pidfd = -1;
  q->psn = mep__rdma_psn();
  *out = q;
  return 0;
}

int mep__ibgda_hw_qp_up(ibgda_ctx_t *ctx, ibgda_hwqp_t *q, int peer,
                        const mep__rdma_qpinfo_t *t, int i) {
  const mep__rdma_dev_t *d = &ctx->dev;
  /* the verbs plugin's defaults: the port's MTU, ACK timeout 14 (67 ms),
   * 7 retries */
  mep__rdma_path_t p = {.timeout = 14, .retry = 7};
  enum ibv_mtu mtu;
  char why[96];
  int rc = mep__rdma_rc_path(d, &p, t, &mtu, why, sizeof why);
  if (rc)
    return IBGDA_ERR(ctx, rc, "ibgda: rank %d: rank %d's %s", ctx->rank,
                     peer, why);
  const char *step;
  if (mep__rdma_rc_up(d, &p, q->qp, q->psn, t, i, mtu, &step))
    return IBGDA_ERR(ctx, MEP_ERR_SYSTEM, "ibgda: rank %d: queue pair %#x "
                     "towards rank %d's %#x on %s port %u: %s failed: %s "
                     "(path MTU %s, GID index %d)", ctx->rank,
                     q->qp->qp_num, peer, t->qpn[i], d->name, d->port, step,
                     strerror(errno), mep__rdma_mtu_name(mtu), d->gid_index);
  return 0;
}

int mep__ibgda_hw_reg(ibgda_ctx_t *ctx, void *ptr, size_t len,
                      ibgda_mr_t *mr) {
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
               (ctx->dev.atomics ? IBV_ACCESS_REMOTE_ATOMIC : 0);
  /* a zero-length region is still a key (verbs takes a byte) */
  mr->ib = ibv_reg_mr(ctx->dev.pd, len ? ptr : (void *)ctx->sink,
                      len ? len : 1, access);
  if (!mr->ib)
    return IBGDA_ERR(ctx, MEP_ERR_SYSTEM, "ibgda: rank %d: registering %zu "
                     "bytes at %p on %s failed: %s", ctx->rank, len, ptr,
                     ctx->dev.name, strerror(errno));
  mr->key = mr->ib->rkey;
  mr->lkey = mr->ib->lkey;
  return 0;
}
