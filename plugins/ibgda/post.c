/* post.c - host write() and signal() as mlx5 WQEs on the peer's queue
 * pair (the builders of mep/device/mlx5.h, as kernels use them), the
 * doorbell, and the completions (CQEs) that free the send queue and
 * complete tokens; poll(). */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ibgda.h"

enum { PI = 0, READY = 1, CI = 2, CQ_CI = 3, CQ_LOCK = 4 };
/* One data segment's byte count is 31 bits; longer writes are split. */
#define WQE_MAX_BYTES (1ull << 30)
/* poll() reads each peer's socket every this many calls. */
#define LINK_CHECK_POLLS 64

/* ep->mu held: completes every WQE from ci up to the one at index `idx`
 * (or, with !inclusive, up to the one before it), status 0; returns 0,
 * or -1 when idx names no WQE in flight (a CQE the plugin cannot
 * place). */
static int complete_to(ibgda_ep_t *ep, uint16_t idx, int inclusive) {
  uint32_t mask = ep->qp->sq_bbs - 1;
  uint64_t ci = ep->ctr[CI], pi = ep->ctr[PI];
  uint64_t at = ci;
  /* find it first: a stray CQE must not complete anything */
  while (at < pi && (uint16_t)at != idx) at += ep->recs[at & mask].nbb;
  if (at >= pi) return -1;
  while (ci < at || (inclusive && ci == at)) {
    ibgda_rec_t *r = &ep->recs[ci & mask];
    if (r->has_token) mep__ibgda_cq_push(ep->ctx, r->token, 0, ep->rank);
    r->has_token = 0;
    ci += r->nbb;
  }
  __atomic_store_n(&ep->ctr[CI], ci, __ATOMIC_RELEASE);
  return 0;
}

/* What an error CQE's syndrome says about the peer (as the verbs plugin
 * reads the same errors from ibv_wc). */
static int synd_status(uint8_t synd) {
  switch (synd) {
  case MEP_MLX5_SYND_REMOTE_ACCESS_ERR:
  case MEP_MLX5_SYND_LOCAL_PROT_ERR:
  case MEP_MLX5_SYND_LOCAL_ACCESS_ERR: return MEP_ERR_BOUNDS;
  case MEP_MLX5_SYND_REMOTE_INVAL_REQ_ERR:
  case MEP_MLX5_SYND_REMOTE_OP_ERR:
  case MEP_MLX5_SYND_LOCAL_QP_OP_ERR:
  case MEP_MLX5_SYND_LOCAL_LENGTH_ERR: return MEP_ERR_PROTOCOL;
  default: return MEP_ERR_PEER_FAILED;
  }
}

void mep__ibgda_ep_fail(ibgda_ep_t *ep, int status, int report) {
  if (ep->dead) return;
  ep->dead = 1;
  uint32_t mask = ep->qp->sq_bbs - 1;
  for (uint64_t ci = ep->ctr[CI]; ci < ep->ctr[PI];) {
    ibgda_rec_t *r = &ep->recs[ci & mask];
    if (r->has_token)
      mep__ibgda_cq_push(ep->ctx, r->token,
                         status == MEP_ERR_CLOSED ? MEP_ERR_CLOSED
                                                  : MEP_ERR_PEER_FAILED,
                         ep->rank);
    r->has_token = 0;
    ci += r->nbb;
  }
  ep->ctr[CI] = ep->ctr[PI];
  /* the peer learns at once from the end of the socket */
  if (ep->link_fd >= 0) shutdown(ep->link_fd, SHUT_RDWR);
  if (report)
    mep__ibgda_cq_push(ep->ctx, MEP_TP_TOKEN_NONE, status, ep->rank);
}

int mep__ibgda_reap(ibgda_ep_t *ep) {
  if (ep->dead) return -1;
  m5_qp_t *q = ep->qp;
  int n = 0;
  for (;;) {
    uint32_t cq_ci = (uint32_t)ep->ctr[CQ_CI];
    mep_mlx5_cqe_t *c = &q->cq[cq_ci & (q->cq_n - 1)];
    if (!mep_mlx5_cqe_ready(c, cq_ci, q->cq_n)) break;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint8_t op = mep_mlx5_cqe_opcode(c);
    uint16_t idx = mep_mlx5_cqe_wqe_counter(c);
    uint8_t synd = mep_mlx5_cqe_syndrome(c);
    ep->ctr[CQ_CI] = cq_ci + 1;
    __atomic_store_n(&q->cq_dbrec[0], mep_mlx5_cq_dbrec_value(cq_ci + 1),
                     __ATOMIC_RELEASE);
    n++;
    ibgda_ctx_t *ctx = ep->ctx;
    if (op == MEP_MLX5_CQE_REQ) {
      if (complete_to(ep, idx, 1)) {
        IBGDA_LOG(ctx, MEP_LOG_ERROR, "ibgda: rank %d: a CQE for WQE %u, "
                  "which is not in flight to rank %d", ctx->rank, idx,
                  ep->rank);
        mep__ibgda_ep_fail(ep, MEP_ERR_PROTOCOL, 1);
        return -1;
      }
      continue;
    }
    /* An error CQE: the queue pair is in the error state, as on mlx5.
     * The WQEs before it completed; it and every later one did not: their
     * tokens fail as the peer's (ep_fail), and the report says why. */
    char msg[320] = "";
    if (ctx->model_open) mep__m5_last_error(&ctx->model, msg, sizeof msg);
    else snprintf(msg, sizeof msg, "the NIC's syndrome");
    int status = synd_status(synd);
    IBGDA_LOG(ctx, MEP_LOG_ERROR, "ibgda: rank %d: WQE %u to rank %d "
              "failed with syndrome 0x%02x (%s); the peer is reported "
              "failed", ctx->rank, idx, ep->rank, synd, msg);
    complete_to(ep, idx, 0);
    __atomic_store_n(&ep->ctr[CQ_LOCK], 2, __ATOMIC_RELEASE);
    mep__ibgda_ep_fail(ep, status, 1);
    return -1;
  }
  return n;
}

/* ep->mu held: waits (bounded) until nbb building blocks are free. */
static int room(ibgda_ep_t *ep, uint32_t nbb) {
  ibgda_ctx_t *ctx = ep->ctx;
  int64_t deadline = 0;
  while (!mep_mlx5_sq_fits(ep->ctr[PI], ep->ctr[CI], nbb, ep->qp->sq_bbs)) {
    if (mep__ibgda_reap(ep) < 0) break;
    if (mep_mlx5_sq_fits(ep->ctr[PI], ep->ctr[CI], nbb, ep->qp->sq_bbs))
      break;
    int64_t now = mep__rdma_now_ms();
    if (!deadline) deadline = now + ctx->timeout_ms;
    if (now > deadline)
      return IBGDA_ERR(ctx, MEP_ERR_TIMEOUT, "ibgda: rank %d: the send "
                       "queue to rank %d stayed full for %d ms", ctx->rank,
                       ep->rank, ctx->timeout_ms);
    sched_yield();
  }
  if (ep->dead)
    return IBGDA_ERR(ctx, MEP_ERR_PEER_FAILED, "ibgda: rank %d: the "
                     "connection to rank %d failed", ctx->rank, ep->rank);
  return 0;
}

/* Whether the WQE about to go at pi must ask for a CQE even without a
 * token: half the send queue went by without one. */
static uint8_t ce_due(const ibgda_ep_t *ep, uint32_t nbb) {
  return ep->ctr[PI] + nbb - ep->last_sig >= ep->qp->sq_bbs / 2
             ? MEP_MLX5_CTRL_CQ_UPDATE
             : 0;
}

/* ep->mu held, the WQE at pi written (nbb BBs): records it, then the
 * doorbell record, then the doorbell register, in that order. */
static void ring(ibgda_ep_t *ep, uint64_t pi, uint32_t nbb, uint8_t flags,
                 int has_token, uint64_t token) {
  m5_qp_t *q = ep->qp;
  ep->recs[pi & (q->sq_bbs - 1)] =
      (ibgda_rec_t){token, (uint16_t)nbb, (uint8_t)has_token};
  if (flags & MEP_MLX5_CTRL_CQ_UPDATE) ep->last_sig = pi + nbb;
  __atomic_store_n(&ep->ctr[PI], pi + nbb, __ATOMIC_RELEASE);
  __atomic_store_n(&ep->ctr[READY], pi + nbb, __ATOMIC_RELEASE);
  const mep_mlx5_ctrl_seg_t *c = mep_mlx5_seg(q->sq, q->sq_bbs - 1,
                                              (uint32_t)pi, 0);
  __atomic_store_n(&q->dbrec[MEP_MLX5_SND_DBR],
                   mep_mlx5_dbrec_value((uint32_t)(pi + nbb)),
                   __ATOMIC_RELEASE);
  /* On a NIC the register is a UAR page mapped write-combining, which
   * x86's store order does not cover: a full fence before it (the
   * record first) and after it (flushed now), as libmlx5's
   * mmio_wc_start and mmio_flush_writes are. */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(q->db, mep_mlx5_db_value(c), __ATOMIC_RELEASE);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static int check_ep(ibgda_ep_t *ep) {
  ibgda_ctx_t *ctx = ep->ctx;
  if (ep->retired)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: rank %d: the connection "
                     "to rank %d is closed", ctx->rank, ep->rank);
  if (ep->dead)
    return IBGDA_ERR(ctx, MEP_ERR_PEER_FAILED, "ibgda: rank %d: the "
                     "connection to rank %d failed", ctx->rank, ep->rank);
  return 0;
}

int mep__ibgda_write(mep_tp_ep_t *epp, mep_tp_mr_t *mrp, uint64_t loff,
                     mep_tp_rmr_t *rmrp, uint64_t roff, uint64_t len,
                     uint64_t token) {
  ibgda_ep_t *ep = epp;
  ibgda_mr_t *mr = mrp;
  ibgda_rmr_t *r = rmrp;
  if (!ep || !mr || !r) return MEP_ERR_INVALID;
  ibgda_ctx_t *ctx = ep->ctx;
  if (loff > mr->len || len > mr->len - loff)
    return IBGDA_ERR(ctx, MEP_ERR_BOUNDS, "ibgda: rank %d: write of %llu "
                     "bytes at local offset %llu of a %llu-byte region",
                     ctx->rank, (unsigned long long)len,
                     (unsigned long long)loff, (unsigned long long)mr->len);
  if (roff > r->len || len > r->len - roff)
    return IBGDA_ERR(ctx, MEP_ERR_BOUNDS, "ibgda: rank %d: write of %llu "
                     "bytes at offset %llu of rank %d's %llu-byte region",
                     ctx->rank, (unsigned long long)len,
                     (unsigned long long)roff, ep->rank,
                     (unsigned long long)r->len);
  pthread_mutex_lock(&ep->mu);
  int rc = check_ep(ep);
  if (!rc && len == 0) {
    /* nothing to move: complete at once, in order behind nothing */
    mep__ibgda_cq_push(ctx, token, 0, ep->rank);
    pthread_mutex_unlock(&ep->mu);
    return 0;
  }
  m5_qp_t *q = ep->qp;
  uint32_t mask = q->sq_bbs - 1;
  int inl = len <= (uint64_t)ctx->cfg.max_inline;
  for (uint64_t done = 0; !rc && done < len;) {
    uint64_t n = len - done < WQE_MAX_BYTES ? len - done : WQE_MAX_BYTES;
    int last = done + n == len;
    uint32_t nbb = inl ? mep_mlx5_bbs(mep_mlx5_ds_inline((uint32_t)n))
                       : mep_mlx5_bbs(mep_mlx5_ds_write());
    rc = room(ep, nbb);
    if (rc) break;
    uint64_t pi = ep->ctr[PI];
    /* an inline write's source is free once posted: its token completes
     * now, and its WQE needs no CQE of its own */
    uint8_t fl = (last && !inl) ? MEP_MLX5_CTRL_CQ_UPDATE : ce_due(ep, nbb);
    uint64_t raddr = r->addr + roff + done;
    if (inl)
      mep_mlx5_wqe_write_inline(q->sq, mask, (uint32_t)pi, q->qpn, fl,
                                mr->base + loff + done, (uint32_t)n, raddr,
                                r->rkey);
    else
      mep_mlx5_wqe_write(q->sq, mask, (uint32_t)pi, q->qpn, fl,
                         (uint64_t)(uintptr_t)(mr->base + loff + done),
                         mr->lkey, raddr, r->rkey, (uint32_t)n, 0, 0);
    ring(ep, pi, nbb, fl, last && !inl, token);
    if (last && inl) mep__ibgda_cq_push(ctx, token, 0, ep->rank);
    done += n;
  }
  pthread_mutex_unlock(&ep->mu);
  return rc;
}

int mep__ibgda_signal(mep_tp_ep_t *epp, mep_tp_rmr_t *rmrp, uint64_t roff,
                      uint64_t value, mep_signal_op_t op) {
  ibgda_ep_t *ep = epp;
  ibgda_rmr_t *r = rmrp;
  if (!ep || !r) return MEP_ERR_INVALID;
  ibgda_ctx_t *ctx = ep->ctx;
  if (roff % 8)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: rank %d: signal at "
                     "offset %llu, not 8-byte aligned", ctx->rank,
                     (unsigned long long)roff);
  if (roff > r->len || r->len - roff < 8)
    return IBGDA_ERR(ctx, MEP_ERR_BOUNDS, "ibgda: rank %d: signal at offset "
                     "%llu of rank %d's %llu-byte region", ctx->rank,
                     (unsigned long long)roff, ep->rank,
                     (unsigned long long)r->len);
  if (op != MEP_SIGNAL_SET && op != MEP_SIGNAL_ADD)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: signal op %d", (int)op);
  pthread_mutex_lock(&ep->mu);
  int rc = check_ep(ep);
  m5_qp_t *q = ep->qp;
  uint32_t nbb = op == MEP_SIGNAL_SET
                     ? mep_mlx5_bbs(mep_mlx5_ds_inline(8))
                     : mep_mlx5_bbs(mep_mlx5_ds_atomic());
  if (!rc) rc = room(ep, nbb);
  if (!rc) {
    uint64_t pi = ep->ctr[PI];
    uint8_t fl = ce_due(ep, nbb);
    uint64_t raddr = r->addr + roff;
    /* a signal is ordered after earlier writes by the RC queue pair's
     * in-order execution; the FETCH_AND_ADD result goes to the sink */
    if (op == MEP_SIGNAL_SET)
      mep_mlx5_wqe_write_inline(q->sq, q->sq_bbs - 1, (uint32_t)pi, q->qpn,
                                fl, &value, 8, raddr, r->rkey);
    else
      mep_mlx5_wqe_fetch_add(q->sq, q->sq_bbs - 1, (uint32_t)pi, q->qpn, fl,
                             raddr, r->rkey, value,
                             (uint64_t)(uintptr_t)ctx->sink, ctx->sink_key);
    ring(ep, pi, nbb, fl, 0, 0);
  }
  pthread_mutex_unlock(&ep->mu);
  return rc;
}

int mep__ibgda_settle(ibgda_ep_t *ep, int wait_ms) {
  if (ep->dead) return 0;
  if (ep->ctr[CI] != ep->ctr[PI]) {
    /* the last WQEs may ask for no CQE: a NOP that does marks the end */
    if (room(ep, 1)) return 0;
    uint64_t pi = ep->ctr[PI];
    m5_qp_t *q = ep->qp;
    mep_mlx5_wqe_nop(q->sq, q->sq_bbs - 1, (uint32_t)pi, q->qpn,
                     MEP_MLX5_CTRL_CQ_UPDATE);
    ring(ep, pi, 1, MEP_MLX5_CTRL_CQ_UPDATE, 0, 0);
  }
  int64_t deadline = mep__rdma_now_ms() + wait_ms;
  while (ep->ctr[CI] != ep->ctr[PI]) {
    if (mep__ibgda_reap(ep) < 0) return 0;
    if (mep__rdma_now_ms() > deadline) return 0;
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
  }
  return 1;
}

int mep__ibgda_poll(mep_tp_ctx_t *ctxp, mep_tp_completion_t *out, int max) {
  ibgda_ctx_t *ctx = ctxp;
  if (!ctx || (max > 0 && !out)) return MEP_ERR_INVALID;
  pthread_mutex_lock(&ctx->mu);
  for (int p = 0; p < ctx->size; p++) {
    ibgda_ep_t *ep = ctx->peers[p];
    if (!ep) continue;
    pthread_mutex_lock(&ep->mu);
    if (!ep->dead && !ep->retired) {
      mep__ibgda_reap(ep);
      if (!ep->dead && ++ep->npoll % LINK_CHECK_POLLS == 0) {
        int s = mep__rdma_link_read(ep->link_fd, &ep->link_rx,
                                    (uint32_t)p, (uint32_t)ctx->rank);
        if (s == MEP_RDMA_LINK_BYE)
          mep__ibgda_ep_fail(ep, MEP_ERR_CLOSED, 1);
        else if (s != MEP_RDMA_LINK_QUIET)
          mep__ibgda_ep_fail(ep, MEP_ERR_PEER_FAILED, 1);
      }
    }
    pthread_mutex_unlock(&ep->mu);
  }
  pthread_mutex_unlock(&ctx->mu);
  return max > 0 ? mep__ibgda_cq_pop(ctx, out, max) : 0;
}
