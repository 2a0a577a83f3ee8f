/* send.c - write and signal: local checks, then the ep's send queue, which
 * moves into the peer's ring as fast as the peer empties it. Everything
 * on one ep goes through the one FIFO ring, so a signal lands after every
 * earlier write on that ep. */
#include "shm.h"

#include <stdlib.h>

#define SHM_MIN_CHUNK 4096u

/* Free bytes in the ep's send ring, or a negative status if the peer has
 * moved its tail somewhere impossible (which fails the ep). */
static int64_t ring_room(shm_ep_t *ep) {
  shm_ring_t *r = &ep->tx;
  uint64_t tail = atomic_load_explicit(&r->hdr->tail, memory_order_acquire);
  uint64_t used = r->pos - tail;
  if (tail > r->pos || used > r->cap) {
    shm_log(ep->ctx, MEP_LOG_ERROR,
            "shm: rank %d moved the tail of its receive ring to %llu while "
            "%llu bytes were written to it; marking it failed",
            ep->peer, (unsigned long long)tail, (unsigned long long)r->pos);
    shm_ep_fail(ep, MEP_ERR_PROTOCOL);
    return MEP_ERR_PROTOCOL;
  }
  return (int64_t)(r->cap - used);
}

static void put_msg(shm_ep_t *ep, const struct shm_msg *m,
                    const void *payload, uint64_t len) {
  shm_ring_t *r = &ep->tx;
  shm_ring_write(r, r->pos, m, sizeof(*m));
  if (len) shm_ring_write(r, r->pos + sizeof(*m), payload, len);
  r->pos += sizeof(*m) + shm_pad8(len);
  atomic_store_explicit(&r->hdr->head, r->pos, memory_order_release);
}

/* Largest payload of one message: a quarter of the ring, so the receiver
 * drains one chunk while the sender fills the next. */
static uint64_t max_chunk(uint64_t cap) { return (cap / 4) & ~(uint64_t)7; }

/* Puts as much of a write as fits; 1 when all of it is in the ring. */
static int put_write(shm_ep_t *ep, shm_op_t *op, int64_t *room) {
  uint64_t most = max_chunk(ep->tx.cap);
  uint64_t min = SHM_MIN_CHUNK < most ? SHM_MIN_CHUNK : most;
  while (op->left > 0 && *room > (int64_t)sizeof(struct shm_msg)) {
    uint64_t fits = ((uint64_t)*room - sizeof(struct shm_msg)) & ~(uint64_t)7;
    uint64_t want = op->left < most ? op->left : most;
    uint64_t chunk = want < fits ? want : fits;
    /* Wait for room rather than dribble out tiny pieces. */
    if (chunk < want && chunk < min) break;
    struct shm_msg m = {.type = SHM_MSG_WRITE, .magic = SHM_MSG_MAGIC,
                        .region = op->region, .offset = op->roff,
                        .arg = chunk};
    put_msg(ep, &m, op->src, chunk);
    op->src += chunk;
    op->roff += chunk;
    op->left -= chunk;
    *room -= (int64_t)(sizeof(m) + shm_pad8(chunk));
  }
  return op->left == 0;
}

static void put_signal(shm_ep_t *ep, const shm_op_t *op) {
  struct shm_msg m = {.type = SHM_MSG_SIGNAL, .op = (uint16_t)op->sig_op,
                      .magic = SHM_MSG_MAGIC, .region = op->region,
                      .offset = op->roff, .arg = op->value};
  put_msg(ep, &m, NULL, 0);
}

int shm_send_progress(shm_ep_t *ep) {
  if (ep->state != SHM_EP_OPEN || !ep->sendq.head) return 0;
  int64_t room = ring_room(ep);
  if (room < 0) return (int)room;
  for (shm_op_t *op; (op = ep->sendq.head);) {
    if (op->kind == SHM_OP_SIGNAL) {
      if (room < (int64_t)sizeof(struct shm_msg)) break;
      put_signal(ep, op);
      room -= (int64_t)sizeof(struct shm_msg);
      free(shm_queue_pop(&ep->sendq));
      continue;
    }
    if (!put_write(ep, op, &room)) break;
    shm_queue_pop(&ep->sendq);
    op->status = 0;
    shm_queue_push(&ep->ctx->done, op);
  }
  return 0;
}

/* The state check every operation on an ep starts with. */
static int ep_usable(shm_ep_t *ep, const char *what) {
  if (ep->state == SHM_EP_OPEN) return 0;
  if (ep->state == SHM_EP_CLOSED)
    return shm_error(ep->ctx, MEP_ERR_CLOSED,
                     "shm: %s to rank %d on a closed endpoint", what,
                     ep->peer);
  return shm_error(ep->ctx, MEP_ERR_PEER_FAILED,
                   "shm: %s to rank %d: the peer failed earlier (%s)", what,
                   ep->peer,
                   ep->fail_status == MEP_ERR_PEER_FAILED
                       ? "its process exited or closed the connection"
                       : "it sent a malformed message");
}

static int check_handles(shm_ep_t *ep, const shm_mr_t *mr,
                         const shm_rmr_t *rmr) {
  if (!ep || (mr && (mr->tag != SHM_TAG_MR || mr->ctx != ep->ctx)) || !rmr ||
      rmr->tag != SHM_TAG_RMR || rmr->ep != ep)
    return ep ? shm_error(ep->ctx, MEP_ERR_INVALID,
                          "shm: a region handle given for rank %d is not one "
                          "of this context's or was released",
                          ep->peer)
              : MEP_ERR_INVALID;
  return 0;
}

static int check_write_bounds(shm_ep_t *ep, const shm_mr_t *mr, uint64_t loff,
                              const shm_rmr_t *rmr, uint64_t roff,
                              uint64_t len) {
  if (loff > mr->len || len > mr->len - loff)
    return shm_error(ep->ctx, MEP_ERR_BOUNDS,
                     "shm: write of %llu bytes from offset %llu of a local "
                     "region of %llu bytes: out of bounds",
                     (unsigned long long)len, (unsigned long long)loff,
                     (unsigned long long)mr->len);
  if (roff > rmr->len || len > rmr->len - roff)
    return shm_error(ep->ctx, MEP_ERR_BOUNDS,
                     "shm: write of %llu bytes to offset %llu of rank %d's "
                     "region of %llu bytes: out of bounds",
                     (unsigned long long)len, (unsigned long long)roff,
                     ep->peer, (unsigned long long)rmr->len);
  return 0;
}

int shm_write(mep_tp_ep_t *p, mep_tp_mr_t *pmr, uint64_t loff,
              mep_tp_rmr_t *prmr, uint64_t roff, uint64_t len,
              uint64_t token) {
  shm_ep_t *ep = shm_ep_of(p);
  shm_mr_t *mr = pmr;
  shm_rmr_t *rmr = prmr;
  int rc = check_handles(ep, mr, rmr);
  if (rc < 0) return rc;
  if (!mr)
    return shm_error(ep->ctx, MEP_ERR_INVALID,
                     "shm: write to rank %d without a local region", ep->peer);
  shm_ctx_t *ctx = ep->ctx;
  pthread_mutex_lock(&ctx->lock);
  rc = ep_usable(ep, "write");
  if (rc == 0) rc = check_write_bounds(ep, mr, loff, rmr, roff, len);
  shm_op_t *op = rc == 0 ? calloc(1, sizeof(*op)) : NULL;
  if (rc == 0 && !op)
    rc = shm_error(ctx, MEP_ERR_NOMEM, "shm: out of memory queueing a write "
                   "to rank %d", ep->peer);
  if (rc < 0) {
    pthread_mutex_unlock(&ctx->lock);
    return rc;
  }
  *op = (shm_op_t){.kind = SHM_OP_WRITE, .src = mr->ptr + loff,
                   .region = rmr->id, .roff = roff, .left = len,
                   .token = token, .peer = ep->peer};
  if (len == 0) {
    shm_queue_push(&ctx->done, op);
  } else {
    shm_queue_push(&ep->sendq, op);
    shm_send_progress(ep);
  }
  pthread_mutex_unlock(&ctx->lock);
  return 0;
}

static int check_signal(shm_ep_t *ep, const shm_rmr_t *rmr, uint64_t roff,
                        mep_signal_op_t op) {
  if (op != MEP_SIGNAL_SET && op != MEP_SIGNAL_ADD)
    return shm_error(ep->ctx, MEP_ERR_INVALID,
                     "shm: signal to rank %d with unknown operation %d",
                     ep->peer, (int)op);
  if (roff > rmr->len || rmr->len - roff < 8)
    return shm_error(ep->ctx, MEP_ERR_BOUNDS,
                     "shm: signal to offset %llu of rank %d's region of %llu "
                     "bytes: out of bounds",
                     (unsigned long long)roff, ep->peer,
                     (unsigned long long)rmr->len);
  if ((rmr->misalign + roff) % 8 != 0)
    return shm_error(ep->ctx, MEP_ERR_INVALID,
                     "shm: signal to offset %llu of rank %d's region: the "
                     "word is not 8-byte aligned",
                     (unsigned long long)roff, ep->peer);
  return 0;
}

int shm_signal(mep_tp_ep_t *p, mep_tp_rmr_t *prmr, uint64_t roff,
               uint64_t value, mep_signal_op_t sig) {
  shm_ep_t *ep = shm_ep_of(p);
  shm_rmr_t *rmr = prmr;
  int rc = check_handles(ep, NULL, rmr);
  if (rc < 0) return rc;
  shm_ctx_t *ctx = ep->ctx;
  pthread_mutex_lock(&ctx->lock);
  rc = ep_usable(ep, "signal");
  if (rc == 0) rc = check_signal(ep, rmr, roff, sig);
  shm_op_t direct = {.kind = SHM_OP_SIGNAL, .region = rmr->id, .roff = roff,
                     .value = value, .sig_op = (uint32_t)sig};
  /* The common case, an idle ring, needs no queue entry. */
  if (rc == 0 && !ep->sendq.head &&
      ring_room(ep) >= (int64_t)sizeof(struct shm_msg)) {
    put_signal(ep, &direct);
    pthread_mutex_unlock(&ctx->lock);
    return 0;
  }
  if (rc == 0 && ep->state != SHM_EP_OPEN) rc = ep_usable(ep, "signal");
  shm_op_t *op = rc == 0 ? calloc(1, sizeof(*op)) : NULL;
  if (rc == 0 && !op)
    rc = shm_error(ctx, MEP_ERR_NOMEM, "shm: out of memory queueing a signal "
                   "to rank %d", ep->peer);
  if (rc == 0) {
    *op = direct;
    op->peer = ep->peer;
    shm_queue_push(&ep->sendq, op);
    shm_send_progress(ep);
  }
  pthread_mutex_unlock(&ctx->lock);
  return rc;
}
