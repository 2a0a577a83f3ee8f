/* region.c - registrations (keys of the model's table, or the NIC's
 * memory regions), imported peer regions, and the MEP_DEV_MLX5 descriptor
 * parts kernels take. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ibgda.h"

int mep__ibgda_reg(mep_tp_ctx_t *ctxp, void *ptr, size_t len,
                   mep_memkind_t kind, mep_tp_mr_t **out, void *rkey,
                   size_t *rkey_len) {
  ibgda_ctx_t *ctx = ctxp;
  if (!ctx || !out || !rkey || !rkey_len || (!ptr && len))
    return MEP_ERR_INVALID;
  if (kind != MEP_MEM_HOST)
    return IBGDA_ERR(ctx, MEP_ERR_UNSUPPORTED, "ibgda: rank %d: this "
                     "version registers host memory only (the window's "
                     "host part; docs/ibgda.md)", ctx->rank);
  if (*rkey_len < MEP_IBGDA_RKEY_LEN)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: remote key needs %d "
                     "bytes, %zu given", MEP_IBGDA_RKEY_LEN, *rkey_len);
  ibgda_mr_t *mr = calloc(1, sizeof *mr);
  if (!mr) return MEP_ERR_NOMEM;
  mr->ctx = ctx;
  mr->base = ptr;
  mr->len = len;
  int rc = ctx->hw ? mep__ibgda_hw_reg(ctx, ptr, len, mr)
                   : mep__m5_reg(&ctx->model, ptr, len, &mr->key);
  if (!ctx->hw) mr->lkey = mr->key;
  if (rc) {
    free(mr);
    return rc;
  }
  ibgda_rkey_t k = {(uint32_t)ctx->rank, mr->key,
                    (uint64_t)(uintptr_t)ptr, len};
  mep__ibgda_rkey_encode(rkey, &k);
  *rkey_len = MEP_IBGDA_RKEY_LEN;
  *out = mr;
  return 0;
}

int mep__ibgda_dereg(mep_tp_ctx_t *ctxp, mep_tp_mr_t *mrp) {
  ibgda_ctx_t *ctx = ctxp;
  ibgda_mr_t *mr = mrp;
  if (!ctx || !mr) return MEP_ERR_INVALID;
  if (mr->ib)
    ibv_dereg_mr(mr->ib);
  else
    mep__m5_dereg(&ctx->model, mr->key);
  free(mr);
  return 0;
}

int mep__ibgda_import(mep_tp_ep_t *epp, const void *blob, size_t len,
                      mep_tp_rmr_t **out) {
  ibgda_ep_t *ep = epp;
  if (!ep || !out) return MEP_ERR_INVALID;
  ibgda_ctx_t *ctx = ep->ctx;
  ibgda_rkey_t k;
  char why[160];
  if (mep__ibgda_rkey_decode(blob, len, &k, why, sizeof why))
    return IBGDA_ERR(ctx, MEP_ERR_PROTOCOL, "ibgda: rank %d: import from "
                     "rank %d: %s", ctx->rank, ep->rank, why);
  if ((int)k.rank != ep->rank)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: rank %d: a remote key of "
                     "rank %u imported through the connection to rank %d",
                     ctx->rank, k.rank, ep->rank);
  ibgda_rmr_t *r = calloc(1, sizeof *r);
  if (!r) return MEP_ERR_NOMEM;
  r->ep = ep;
  r->addr = k.addr;
  r->len = k.len;
  r->rkey = k.rkey;
  *out = r;
  return 0;
}

int mep__ibgda_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr) {
  (void)ep;
  free(rmr);
  return 0;
}

static int put(const void *part, size_t n, void *desc, size_t *len) {
  if (*len < n) return MEP_ERR_INVALID;
  memcpy(desc, part, n);
  *len = n;
  return 0;
}

/* What of a queue pair kernels write: the model's one block; on a NIC the
 * send queue, the two doorbell records, the CQ (host memory libmlx5
 * allocated) and the doorbell register (the UAR's I/O page). */
static int qp_ranges(const ibgda_ctx_t *ctx, const m5_qp_t *q,
                     ibgda_range_t *r) {
  if (!ctx->hw) {
    r[0] = (ibgda_range_t){q->mem, q->mem_len, 0};
    return 1;
  }
  r[0] = (ibgda_range_t){q->sq, (size_t)q->sq_bbs * MEP_MLX5_SEND_WQE_BB, 0};
  r[1] = (ibgda_range_t){q->dbrec, 8, 0};
  r[2] = (ibgda_range_t){q->cq, (size_t)q->cq_n * MEP_MLX5_CQE_SIZE, 0};
  r[3] = (ibgda_range_t){q->cq_dbrec, 8, 0};
  r[4] = (ibgda_range_t){q->db, 8, 1};
  return 5;
}

/* The kernels' queue pair as kernels take it. Its queues are host memory
 * (and, on a NIC, a UAR page), which kernels reach once mapped for the
 * GPU, with their counters in its memory: at the first call made with a
 * CUDA context current (gpu.c). Elsewhere MEP_ERR_UNREACHABLE with the
 * reason, and a later call may attach it. */
int mep__ibgda_device_descriptor(mep_tp_ctx_t *ctxp, int peer, void *desc,
                                 size_t *len) {
  ibgda_ctx_t *ctx = ctxp;
  if (!ctx || !desc || !len) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: device descriptor: rank "
                     "%d in a group of %d", peer, ctx->size);
  pthread_mutex_lock(&ctx->mu);
  ibgda_ep_t *ep = ctx->peers[peer];
  int open = ep && !ep->retired && ep->kqp;
  if (open) pthread_mutex_lock(&ep->mu);
  pthread_mutex_unlock(&ctx->mu);
  if (!open)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: device descriptor: rank "
                     "%d is not connected", peer);
  m5_qp_t *q = ep->kqp;
  char why[200] = "";
  ibgda_range_t r[IBGDA_MAX_RANGES];
  int mapped = mep__ibgda_gpu_attach(ctx, r, qp_ranges(ctx, q, r), &ep->kgpu,
                                     why, sizeof why) == 0;
  /* where kernels reach each object, and the counters in GPU memory; the
   * sink is named to the NIC, by its host address */
#define DEV(p) mep__ibgda_gpu_addr(&ep->kgpu, (p))
#define CTR(i) (ep->kgpu.ctr + 8u * (i))
  mep_dev_mlx5_peer_t part = {
      .hdr = {MEP_DEV_MLX5, MEP_DEV_MLX5_VERSION, sizeof part},
      .qpn = q->qpn,
      .sq_bbs = q->sq_bbs,
      .sq = DEV(q->sq),
      .dbrec = DEV(q->dbrec),
      .db = DEV(q->db),
      .pi = CTR(0),
      .ready = CTR(1),
      .ci = CTR(2),
      .cq = DEV(q->cq),
      .cq_n = q->cq_n,
      .sink_lkey = ctx->sink_key,
      .cq_dbrec = DEV(q->cq_dbrec),
      .cq_ci = CTR(3),
      .cq_lock = CTR(4),
      .sink = (uint64_t)(uintptr_t)ctx->sink,
      .flags = ctx->hw ? 0 : MEP_DEV_MLX5_MODEL,
  };
#undef DEV
#undef CTR
  pthread_mutex_unlock(&ep->mu);
  if (!mapped)
    return IBGDA_ERR(ctx, MEP_ERR_UNREACHABLE, "ibgda: kernels cannot reach "
                     "the queue pair to rank %d: its queues are not mapped "
                     "for a GPU (%s)", peer, why);
  if (put(&part, sizeof part, desc, len))
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: device descriptor: %zu "
                     "bytes of room, %zu needed", *len, sizeof part);
  return 0;
}

/* A registration as the region part lays it out: memory by its host
 * address (as the NIC names it), the rkey (a peer's) or the lkey (this
 * rank's, device_local). */
static int region_part(ibgda_ctx_t *ctx, uint64_t addr, uint64_t n,
                       uint32_t key, void *desc, size_t *len) {
  mep_dev_mlx5_region_t part = {
      .hdr = {MEP_DEV_MLX5, MEP_DEV_MLX5_VERSION, sizeof part},
      .raddr = addr,
      .len = n,
      .rkey = key,
  };
  if (put(&part, sizeof part, desc, len))
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: device region: %zu "
                     "bytes of room, %zu needed", *len, sizeof part);
  return 0;
}

int mep__ibgda_device_region(mep_tp_ep_t *epp, mep_tp_rmr_t *rmrp, void *desc,
                             size_t *len) {
  ibgda_ep_t *ep = epp;
  ibgda_rmr_t *r = rmrp;
  if (!ep || !r || !desc || !len) return MEP_ERR_INVALID;
  return region_part(ep->ctx, r->addr, r->len, r->rkey, desc, len);
}

int mep__ibgda_device_local(mep_tp_ctx_t *ctxp, mep_tp_mr_t *mrp, void *desc,
                            size_t *len) {
  ibgda_ctx_t *ctx = ctxp;
  ibgda_mr_t *mr = mrp;
  if (!ctx || !mr || !desc || !len) return MEP_ERR_INVALID;
  return region_part(ctx, (uint64_t)(uintptr_t)mr->base, mr->len, mr->lkey,
                     desc, len);
}
