/*
 * post.c - write() and signal(): work requests queued on an endpoint's
 * queue pairs, posted as the send queues allow, completed in order.
 *
 * Writes. A write of at most max_inline bytes goes inline on queue pair 0
 * (copied at post, its token completes right then). A write of at most
 * VERBS_LAZY_BYTES waits for the signal that usually follows (never past
 * the next signal, poll() or close()), so that both go to the device in
 * one doorbell: one system call with a software device. A longer one goes
 * on
 * queue pair 0 in requests of at most the port's largest message and half
 * of inflight_bytes, posted while the queue pair has less than
 * inflight_bytes at the device; one of
 * at least stripe_bytes is split into one part per queue pair, and its
 * token completes when every part has.
 *
 * Signals, and why one lands after every earlier write of its endpoint.
 * A signal is an RDMA WRITE of 8 bytes (SET, with an immediate whose
 * receive completion wakes a peer sleeping on its event fd) or an atomic
 * FETCH_AND_ADD (ADD), always on queue pair 0. On one RC queue pair the responder
 * executes requests in the order they were posted, and places a write's
 * data before it executes the next request (in PCIe order on a NIC,
 * posted writes are not reordered; rxe copies them in order): so a
 * signal is seen only after every earlier write on the same queue pair.
 * That is not true across queue pairs, which are independent streams.
 * So a signal that follows writes still in flight on another queue pair
 * waits in the plugin behind a fence: it is posted only once each of
 * those queue pairs completed everything queued on it before the signal.
 * A completion of an RDMA WRITE means the responder acknowledged it, and
 * it acknowledges only data it has placed, so the signal, posted after,
 * is executed after that data is visible. Every stripe's last request
 * asks for a completion, which is what the fence waits for. Later
 * requests on queue pair 0 queue behind the waiting signal (signals must
 * not overtake each other: SET of sequence numbers relies on that); those
 * on other queue pairs go on.
 * A SET is an 8-byte RDMA WRITE to an 8-byte-aligned word: one packet,
 * placed by one DMA write on a NIC. rxe copies it with memcpy, which a
 * reader on another CPU might see byte by byte; bytes land from the
 * lowest up, so a torn read is the new value's low bytes under the old
 * value's high ones, which is below the new value whenever it differs
 * from it: a rank waiting for a word to reach a sequence number never
 * sees it early.
 *
 * A signal to a region whose owner applies signals itself (its key says
 * so: host memory no GPU maps, with fuse_signals on; inband.c) is no
 * request of its own: it rides in the immediate of the write just queued
 * on queue pair 0 when that write is not posted yet (the lazy wait above
 * is what makes that the usual case), else in a WRITE of no bytes, or in
 * a SEND; the same fences hold it (and the write it rides on) back.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "verbs.h"

int mep__verbs_ring_grow(verbs_qp_t *p, uint64_t n) {
  uint64_t used = p->tail - p->head, cap = p->mask + 1;
  if (used + n <= cap) return 0;
  while (cap < used + n) cap *= 2;
  verbs_wr_t *r = calloc(cap, sizeof *r);
  if (!r) return -1;
  for (uint64_t s = p->head; s < p->tail; s++)
    r[s & (cap - 1)] = p->ring[s & p->mask];
  free(p->ring);
  p->ring = r;
  p->mask = cap - 1;
  return 0;
}

/* A write's token (or its stripe's share of it) completed. */
static void finish(verbs_ep_t *ep, verbs_wr_t *e, int status) {
  if (!e->op) {
    mep__verbs_cq_push(ep->ctx, e->value, status, ep->rank);
    return;
  }
  if (status && !e->op->status) e->op->status = status;
  if (--e->op->left == 0) {
    mep__verbs_cq_push(ep->ctx, e->op->token, e->op->status, ep->rank);
    free(e->op);
  }
}

void mep__verbs_complete(verbs_ep_t *ep, int q, uint64_t s) {
  verbs_qp_t *p = &ep->qps[q];
  if (s < p->head || s >= p->posted) {
    VERBS_LOG(ep->ctx, MEP_LOG_WARN, "verbs: rank %d: a completion for "
              "request %" PRIu64 " of queue pair %d to rank %d, which is "
              "not in flight (%" PRIu64 "..%" PRIu64 "); ignored",
              ep->ctx->rank, s, q, ep->rank, p->head, p->posted);
    return;
  }
  for (uint64_t u = p->head; u <= s; u++) {
    verbs_wr_t *e = &p->ring[u & p->mask];
    if (e->kind == VW_WRITE) p->inflight -= e->len;
    if (e->kind == VW_WRITE && e->last) finish(ep, e, 0);
  }
  p->head = s + 1;
}

/* ------------------------------------------------------------ posting */

/* Where a signal on queue pair 0 must stop: the first fence not yet
 * passed, else the end of the queue. */
static uint64_t fence_limit(verbs_ep_t *ep) {
  while (ep->fn) {
    const verbs_fence_t *f = &ep->fences[ep->fhead];
    for (int q = 1; q < ep->nqp; q++)
      if (ep->qps[q].head < f->need[q]) return f->at;
    ep->fhead = (ep->fhead + 1) % ep->fcap;
    ep->fn--;
  }
  return ep->qps[0].tail;
}

static void fill(verbs_ep_t *ep, int q, uint64_t s, struct ibv_send_wr *wr,
                 struct ibv_sge *sge) {
  verbs_ctx_t *ctx = ep->ctx;
  verbs_qp_t *p = &ep->qps[q];
  verbs_wr_t *e = &p->ring[s & p->mask];
  uint64_t depth = (uint64_t)ctx->cfg.sq_depth;
  memset(wr, 0, sizeof *wr);
  wr->wr_id = s;
  wr->sg_list = sge;
  wr->num_sge = 1;
  wr->opcode = IBV_WR_RDMA_WRITE;
  wr->wr.rdma.remote_addr = e->raddr;
  wr->wr.rdma.rkey = e->rkey;
  *sge = (struct ibv_sge){.addr = e->laddr, .length = e->len,
                          .lkey = e->lkey};
  /* A full send queue, or a queue pair at its in-flight bytes, always
   * has a request in flight that completes. */
  if ((e->kind == VW_WRITE && e->last) || e->kind == VW_MARK ||
      s - p->last_sig >= (uint64_t)ctx->cfg.signal_every ||
      s + 1 == p->head + depth || p->unsig + e->len >= ctx->cfg.inflight / 2) {
    wr->send_flags |= IBV_SEND_SIGNALED;
    p->last_sig = s;
    p->unsig = 0;
  } else if (e->kind == VW_WRITE) {
    p->unsig += e->len;
  }
  if (e->kind == VW_WRITE) p->inflight += e->len;
  if (e->with_imm) {
    /* a signal for the peer's poll() rides on the write (inband.c) */
    wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr->imm_data = htonl(e->imm);
  }
  switch (e->kind) {
  case VW_INLINE: wr->send_flags |= IBV_SEND_INLINE; break;
  case VW_IMM:
    /* a WRITE of no bytes, for its immediate alone */
    wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr->imm_data = htonl(e->imm);
    wr->num_sge = 0;
    break;
  case VW_SIG:
    wr->opcode = IBV_WR_SEND;
    mep__verbs_inband_msg(ep, e, s, sge);
    if (ep->max_inline >= VERBS_SIGMSG_LEN) wr->send_flags |= IBV_SEND_INLINE;
    break;
  case VW_SET:
    /* the immediate consumes a receive of the peer, whose completion wakes
     * a peer that sleeps on its event fd; its value means nothing */
    wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr->imm_data = 0;
    /* fall through */
  case VW_MARK:
    sge->length = 8;
    if (ep->max_inline >= 8) {
      sge->addr = (uint64_t)(uintptr_t)&e->value;
      wr->send_flags |= IBV_SEND_INLINE;
    } else {
      uint64_t *slot = &ep->set_slots[(size_t)q * depth + s % depth];
      *slot = e->value;
      sge->addr = (uint64_t)(uintptr_t)slot;
      sge->lkey = ep->set_mr->lkey;
    }
    break;
  case VW_ADD:
    wr->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr->wr.atomic.remote_addr = e->raddr;
    wr->wr.atomic.compare_add = e->value;
    wr->wr.atomic.rkey = e->rkey;
    *sge = (struct ibv_sge){.addr = (uint64_t)(uintptr_t)ctx->scratch,
                            .length = 8, .lkey = ctx->scratch_mr->lkey};
    break;
  }
}

/* Whether what waits on queue pair q is only a few small writes, which
 * may wait for the signal that usually follows them. */
static int only_lazy(const verbs_qp_t *p) {
  if (p->tail - p->posted > VERBS_LAZY_MAX) return 0;
  uint64_t bytes = 0;
  for (uint64_t s = p->posted; s < p->tail; s++) {
    const verbs_wr_t *e = &p->ring[s & p->mask];
    if ((e->kind != VW_INLINE && e->kind != VW_WRITE) || e->op ||
        e->with_imm)
      return 0;
    bytes += e->len;
  }
  return bytes <= VERBS_LAZY_BYTES;
}

/* ep->mu held: posts what waits on queue pair q, as far as its send queue
 * and (queue pair 0) the first fence allow; lazy: a few inline writes
 * alone may wait. */
static void pump_qp(verbs_ep_t *ep, int q, int lazy) {
  verbs_qp_t *p = &ep->qps[q];
  uint64_t depth = (uint64_t)ep->ctx->cfg.sq_depth;
  if (lazy && only_lazy(p)) return;
  uint64_t limit = q == 0 ? fence_limit(ep) : p->tail;
  while (!ep->dead && p->posted < limit && p->posted - p->head < depth) {
    uint64_t end = limit;
    if (end > p->head + depth) end = p->head + depth;
    if (end > p->posted + VERBS_POST_BATCH) end = p->posted + VERBS_POST_BATCH;
    struct ibv_send_wr wr[VERBS_POST_BATCH], *badwr = NULL;
    struct ibv_sge sge[VERBS_POST_BATCH];
    int n = 0;
    for (uint64_t s = p->posted; s < end; s++, n++) {
      const verbs_wr_t *e = &p->ring[s & p->mask];
      if (e->kind == VW_WRITE && p->inflight &&
          p->inflight + e->len > ep->ctx->cfg.inflight) {
        end = s; /* the rest waits for completions */
        break;
      }
      fill(ep, q, s, &wr[n], &sge[n]);
      if (n) wr[n - 1].next = &wr[n];
    }
    if (n == 0) return;
    int err = ibv_post_send(p->qp, wr, &badwr);
    if (err) {
      VERBS_LOG(ep->ctx, MEP_LOG_ERROR, "verbs: rank %d: posting %d work "
                "requests on queue pair %d to rank %d failed: %s; the peer "
                "is reported failed", ep->ctx->rank, n, q, ep->rank,
                strerror(err));
      mep__verbs_ep_fail(ep, MEP_ERR_PEER_FAILED, 1);
      return;
    }
    for (uint64_t s = p->posted; s < end; s++)
      if (p->ring[s & p->mask].kind == VW_INLINE)
        mep__verbs_cq_push(ep->ctx, p->ring[s & p->mask].value, 0,
                           ep->rank);
    p->posted = end;
  }
}

void mep__verbs_pump(verbs_ep_t *ep) {
  for (int q = 0; q < ep->nqp && !ep->dead; q++) pump_qp(ep, q, 0);
}

/* Each receive has a buffer for a signal message (a WRITE with immediate
 * consumes a receive too, and leaves its buffer alone). At most send_queue
 * receives are posted, and a receive queue completes in order, so the
 * buffer of receive k (k mod send_queue) is free again when k is posted. */
int mep__verbs_post_recvs(verbs_ep_t *ep) {
  int depth = ep->ctx->cfg.sq_depth, want = depth - ep->recvs;
  if (want < depth / 4 && ep->recvs) return 0;
  struct ibv_recv_wr wr[VERBS_POST_BATCH], *bad;
  struct ibv_sge sge[VERBS_POST_BATCH];
  while (want > 0) {
    int n = want < VERBS_POST_BATCH ? want : VERBS_POST_BATCH;
    for (int i = 0; i < n; i++) {
      uint64_t slot = (ep->recv_seq + (uint64_t)i) % (uint64_t)depth;
      sge[i] = (struct ibv_sge){
          .addr = (uint64_t)(uintptr_t)(ep->rx_bufs + slot * VERBS_SIGMSG_LEN),
          .length = VERBS_SIGMSG_LEN, .lkey = ep->rx_mr->lkey};
      wr[i] = (struct ibv_recv_wr){.wr_id = VERBS_RECV_BIT | slot,
                                   .sg_list = &sge[i], .num_sge = 1,
                                   .next = i + 1 < n ? &wr[i + 1] : NULL};
    }
    int err = ibv_post_recv(ep->qps[0].qp, wr, &bad);
    if (err) {
      errno = err;
      return -1;
    }
    ep->recv_seq += (uint64_t)n;
    ep->recvs += n;
    want -= n;
  }
  return 0;
}

int mep__verbs_idle(const verbs_ep_t *ep) {
  for (int q = 0; q < ep->nqp; q++)
    if (ep->qps[q].head != ep->qps[q].tail) return 0;
  return 1;
}

void mep__verbs_mark(verbs_ep_t *ep) {
  for (int q = 0; q < ep->nqp; q++) {
    verbs_qp_t *p = &ep->qps[q];
    if (p->head == p->tail) continue;
    const verbs_wr_t *last = &p->ring[(p->tail - 1) & p->mask];
    if ((last->kind == VW_WRITE && last->last) || last->kind == VW_MARK ||
        mep__verbs_ring_room(p, 1))
      continue;
    verbs_wr_t *e = mep__verbs_append(p);
    e->kind = VW_MARK;
    e->raddr = ep->peer_scratch;
    e->rkey = ep->peer_scratch_rkey;
    e->laddr = (uint64_t)(uintptr_t)(ep->ctx->scratch + 2);
    e->lkey = ep->ctx->scratch_mr->lkey;
  }
}

/* ------------------------------------------------------------ queueing */

/* A work request moves at most the port's largest message and half of
 * the in-flight bytes, so that a queue pair always has two in flight. */
static uint64_t max_wr_bytes(const verbs_ctx_t *ctx) {
  uint64_t m = ctx->dev.max_msg, half = ctx->cfg.inflight / 2;
  return m && m < half ? m : half;
}

/* ep->mu held: the requests of one write, on queue pair 0 or striped. */
static int enqueue_write(verbs_ep_t *ep, const verbs_mr_t *mr, uint64_t loff,
                         const verbs_rmr_t *r, uint64_t roff, uint64_t len,
                         uint64_t token) {
  verbs_ctx_t *ctx = ep->ctx;
  uint64_t chunk = max_wr_bytes(ctx);
  int parts = ep->nqp > 1 && len >= ctx->cfg.stripe ? ep->nqp : 1;
  uint64_t part = len / (uint64_t)parts / 4096 * 4096;
  if (part == 0) parts = 1, part = len;
  for (int q = 0; q < parts; q++) {
    uint64_t plen = q + 1 < parts ? part : len - part * (uint64_t)(parts - 1);
    if (mep__verbs_ring_room(&ep->qps[q], (plen + chunk - 1) / chunk))
      return VERBS_ERR(ctx, MEP_ERR_NOMEM, "verbs: write to rank %d: out of "
                       "memory queueing it", ep->rank);
  }
  verbs_op_t *op = NULL;
  if (parts > 1 && !(op = malloc(sizeof *op)))
    return VERBS_ERR(ctx, MEP_ERR_NOMEM, "verbs: write to rank %d: out of "
                     "memory", ep->rank);
  if (op) *op = (verbs_op_t){.token = token, .left = parts};
  int inl = parts == 1 && len <= ep->max_inline;
  for (int q = 0; q < parts; q++) {
    uint64_t at = part * (uint64_t)q;
    uint64_t end = q + 1 < parts ? at + part : len;
    for (uint64_t off = at; off < end; off += chunk) {
      verbs_wr_t *e = mep__verbs_append(&ep->qps[q]);
      uint64_t n = end - off < chunk ? end - off : chunk;
      e->kind = inl ? VW_INLINE : VW_WRITE;
      e->last = off + n == end;
      e->lkey = mr->mr->lkey;
      e->laddr = (uint64_t)(uintptr_t)(mr->base + loff + off);
      e->rkey = r->rkey;
      e->raddr = r->addr + roff + off;
      e->len = (uint32_t)n;
      e->value = token;
      e->op = op;
    }
  }
  return 0;
}

static int dead_error(verbs_ep_t *ep, const char *what) {
  int st = ep->dead_status;
  return VERBS_ERR(ep->ctx, MEP_ERR_PEER_FAILED, "verbs: %s rank %d: its "
                   "connection %s", what, ep->rank,
                   st == MEP_ERR_CLOSED ? "was closed"
                   : st == MEP_ERR_BOUNDS
                       ? "failed: a write was refused by a device (outside "
                         "a registered region)"
                   : st == MEP_ERR_PROTOCOL ? "failed: garbage on its socket"
                                            : "failed: the peer is gone");
}

int mep__verbs_write(mep_tp_ep_t *epp, mep_tp_mr_t *mrp, uint64_t loff,
                     mep_tp_rmr_t *rmrp, uint64_t roff, uint64_t len,
                     uint64_t token) {
  verbs_ep_t *ep = epp;
  verbs_mr_t *mr = mrp;
  verbs_rmr_t *r = rmrp;
  if (!ep || !mr || !r) return MEP_ERR_INVALID;
  verbs_ctx_t *ctx = ep->ctx;
  if (r->ep != ep || mr->ctx != ctx)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: write to rank %d: the "
                     "%s belongs to another %s", ep->rank,
                     r->ep != ep ? "remote region" : "local registration",
                     r->ep != ep ? "endpoint" : "context");
  if (loff > mr->len || len > mr->len - loff || roff > r->len ||
      len > r->len - roff)
    return VERBS_ERR(ctx, MEP_ERR_BOUNDS, "verbs: write to rank %d: %" PRIu64
                     " bytes from offset %" PRIu64 " of a registration of %"
                     PRIu64 " to offset %" PRIu64 " of a region of %" PRIu64
                     ": out of bounds", ep->rank, len, loff, mr->len, roff,
                     r->len);
  pthread_mutex_lock(&ep->mu);
  int rc = 0;
  if (ep->dead)
    rc = dead_error(ep, "write to");
  else if (len == 0)
    mep__verbs_cq_push(ctx, token, 0, ep->rank);
  else if (!(rc = enqueue_write(ep, mr, loff, r, roff, len, token)))
    for (int q = 0; q < ep->nqp && !ep->dead; q++) pump_qp(ep, q, 1);
  pthread_mutex_unlock(&ep->mu);
  return rc;
}

/* ep->mu held: a fence for a signal at sequence `at` of queue pair 0
 * (the end of its queue, or the write just queued that the signal rides
 * on), when another queue pair has requests not yet completed. */
int mep__verbs_fence_at(verbs_ep_t *ep, uint64_t at) {
  verbs_fence_t f = {.at = at};
  int need = 0;
  for (int q = 1; q < ep->nqp; q++) {
    f.need[q] = ep->qps[q].tail;
    need |= ep->qps[q].head < ep->qps[q].tail;
  }
  if (!need) return 0;
  if (ep->fn == ep->fcap) {
    size_t cap = ep->fcap ? 2 * ep->fcap : 16;
    verbs_fence_t *n = malloc(cap * sizeof *n);
    if (!n) return -1;
    for (size_t i = 0; i < ep->fn; i++)
      n[i] = ep->fences[(ep->fhead + i) % ep->fcap];
    free(ep->fences);
    ep->fences = n;
    ep->fcap = cap;
    ep->fhead = 0;
  }
  ep->fences[(ep->fhead + ep->fn++) % ep->fcap] = f;
  return 0;
}

static int fence(verbs_ep_t *ep) {
  return mep__verbs_fence_at(ep, ep->qps[0].tail);
}

static int check_signal(verbs_ep_t *ep, const verbs_rmr_t *r, uint64_t roff,
                        mep_signal_op_t op) {
  verbs_ctx_t *ctx = ep->ctx;
  if (r->ep != ep)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: signal to rank %d: the "
                     "region was imported through another endpoint",
                     ep->rank);
  if (op != MEP_SIGNAL_SET && op != MEP_SIGNAL_ADD)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: signal to rank %d: "
                     "unknown operation %d", ep->rank, (int)op);
  if (roff % 8)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: signal to rank %d: "
                     "offset %" PRIu64 " is not a multiple of 8", ep->rank,
                     roff);
  if (r->len < 8 || roff > r->len - 8)
    return VERBS_ERR(ctx, MEP_ERR_BOUNDS, "verbs: signal to rank %d: the "
                     "word at offset %" PRIu64 " is outside its region of %"
                     PRIu64 " bytes", ep->rank, roff, r->len);
  if (op == MEP_SIGNAL_ADD && !ctx->dev.atomics)
    return VERBS_ERR(ctx, MEP_ERR_UNSUPPORTED, "verbs: signal ADD to rank "
                     "%d: %s has no atomic operations", ep->rank,
                     ctx->dev.name);
  if (op == MEP_SIGNAL_ADD && (r->addr + roff) % 8)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: signal ADD to rank %d: "
                     "the word at offset %" PRIu64 " is at address %#" PRIx64
                     " in the peer, not 8-byte aligned (an atomic needs it)",
                     ep->rank, roff, r->addr + roff);
  return 0;
}

/* ep->mu held, room made, fenced: the signal as the NIC applies it. */
static void one_sided(verbs_ep_t *ep, const verbs_rmr_t *r, uint64_t roff,
                      uint64_t value, mep_signal_op_t op) {
  verbs_wr_t *e = mep__verbs_append(&ep->qps[0]);
  e->kind = op == MEP_SIGNAL_SET ? VW_SET : VW_ADD;
  e->raddr = r->addr + roff;
  e->rkey = r->rkey;
  e->value = value;
}

int mep__verbs_signal(mep_tp_ep_t *epp, mep_tp_rmr_t *rmrp, uint64_t roff,
                      uint64_t value, mep_signal_op_t op) {
  verbs_ep_t *ep = epp;
  verbs_rmr_t *r = rmrp;
  if (!ep || !r) return MEP_ERR_INVALID;
  int rc = check_signal(ep, r, roff, op);
  if (rc) return rc;
  pthread_mutex_lock(&ep->mu);
  if (ep->dead)
    rc = dead_error(ep, "signal to");
  else if (r->inband && (r->addr + roff) % 8 == 0)
    rc = mep__verbs_inband_signal(ep, r, r->addr + roff, value, op);
  else if (mep__verbs_ring_room(&ep->qps[0], 1) || fence(ep))
    rc = VERBS_ERR(ep->ctx, MEP_ERR_NOMEM, "verbs: signal to rank %d: out "
                   "of memory queueing it", ep->rank);
  else
    one_sided(ep, r, roff, value, op);
  if (!rc) mep__verbs_pump(ep);
  pthread_mutex_unlock(&ep->mu);
  return rc;
}
