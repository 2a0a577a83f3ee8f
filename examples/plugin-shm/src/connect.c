/* connect.c - endpoints: connecting to a peer, failing, closing.
 *
 * Each side creates the ring it receives on, then maps the ring the peer
 * created for it, waiting (up to the timeout) for the peer to get there.
 * The sender unlinks the name once it mapped the ring: both sides then
 * hold it, and no one else needs the name. */
#include "shm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void sleep_ns(long ns) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
  nanosleep(&ts, NULL);
}

/* Maps the ring the peer creates for us, waiting for it to appear. */
static int map_peer_ring(shm_ep_t *ep, const shm_addr_t *a) {
  shm_ctx_t *ctx = ep->ctx;
  char name[SHM_NAME_MAX], err[256];
  shm_ring_name(ctx->key, ctx->rank, ep->peer, a->nonce, ctx->self.nonce,
                name);
  int64_t deadline = shm_now_ns() + (int64_t)ctx->timeout_ms * 1000000;
  long nap = 100 * 1000;
  for (;;) {
    int rc = shm_ring_open(&ep->tx, name, ctx->rank, ep->peer, a->nonce,
                           ctx->self.nonce, err, sizeof(err));
    if (rc == 1) break;
    if (rc < 0)
      return shm_error(ctx, rc, "shm: connect to rank %d: its ring %s: %s",
                       ep->peer, name, err);
    if (!shm_proc_alive(ep->pid, ep->start_time, ep->pidfd)) {
      shm_unlink(name); /* in case it died right after creating it */
      return shm_error(ctx, MEP_ERR_PEER_FAILED,
                       "shm: connect to rank %d: process %d exited before "
                       "creating its ring",
                       ep->peer, (int)ep->pid);
    }
    if (shm_now_ns() > deadline)
      return shm_error(ctx, MEP_ERR_TIMEOUT,
                       "shm: connect to rank %d (pid %d): its ring %s did not "
                       "appear within %d ms; did it call connect?",
                       ep->peer, (int)ep->pid, name, ctx->timeout_ms);
    sleep_ns(nap);
    if (nap < 10 * 1000 * 1000) nap *= 2;
  }
  shm_unlink(name);
  return 0;
}

static int open_ep(shm_ep_t *ep, const shm_addr_t *a) {
  shm_ctx_t *ctx = ep->ctx;
  int rc = shm_proc_watch(a->pid, a->start_time, &ep->pidfd);
  if (rc < 0)
    return shm_error(ctx, rc,
                     "shm: connect to rank %d: process %d is not running or "
                     "not visible from this pid namespace",
                     ep->peer, (int)a->pid);
  char name[SHM_NAME_MAX], err[256];
  shm_ring_name(ctx->key, ep->peer, ctx->rank, ctx->self.nonce, a->nonce,
                name);
  rc = shm_ring_create(&ep->rx, name, ctx->ring_bytes, ep->peer, ctx->rank,
                       ctx->self.nonce, a->nonce, err, sizeof(err));
  if (rc < 0)
    return shm_error(ctx, rc,
                     "shm: connect to rank %d: creating the receive ring: %s",
                     ep->peer, err);
  return map_peer_ring(ep, a);
}

/* Checks the peer and its blob before anything is created. */
static int check_peer(shm_ctx_t *ctx, int peer, const void *blob, size_t len,
                      shm_addr_t *a) {
  char err[256];
  if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
    return shm_error(ctx, MEP_ERR_INVALID,
                     "shm: connect to rank %d from rank %d of %d ranks", peer,
                     ctx->rank, ctx->size);
  if (shm_addr_decode(blob, len, a, err, sizeof(err)) != 0)
    return shm_error(ctx, MEP_ERR_PROTOCOL, "shm: address of rank %d: %s",
                     peer, err);
  if (a->rank != peer)
    return shm_error(ctx, MEP_ERR_PROTOCOL,
                     "shm: the address given for rank %d is rank %d's", peer,
                     a->rank);
  if (strcmp(a->host_id, ctx->self.host_id) != 0)
    return shm_error(ctx, MEP_ERR_UNREACHABLE,
                     "shm: rank %d is on another host (%s)", peer, a->host_id);
  return 0;
}

static int already_connected(shm_ctx_t *ctx, int peer) {
  shm_ep_t *old = ctx->peers[peer];
  return old && old->state == SHM_EP_OPEN;
}

int shm_connect(mep_tp_ctx_t *p, int peer, const void *blob, size_t len,
                mep_tp_ep_t **out) {
  shm_ctx_t *ctx = shm_ctx_of(p);
  if (!ctx || !out) return MEP_ERR_INVALID;
  *out = NULL;
  shm_addr_t a;
  int rc = check_peer(ctx, peer, blob, len, &a);
  if (rc < 0) return rc;
  pthread_mutex_lock(&ctx->lock);
  int dup = already_connected(ctx, peer);
  pthread_mutex_unlock(&ctx->lock);
  if (dup)
    return shm_error(ctx, MEP_ERR_INVALID, "shm: rank %d is already connected",
                     peer);
  shm_ep_t *ep = calloc(1, sizeof(*ep));
  shm_op_t *report = calloc(1, sizeof(*report));
  if (!ep || !report) {
    free(ep);
    free(report);
    return shm_error(ctx, MEP_ERR_NOMEM, "shm: out of memory connecting to "
                     "rank %d", peer);
  }
  ep->tag = SHM_TAG_EP;
  ep->ctx = ctx;
  ep->peer = peer;
  ep->pid = a.pid;
  ep->start_time = a.start_time;
  ep->pidfd = -1;
  ep->report = report;
  /* Waits without the lock: poll() and other peers go on meanwhile. */
  rc = open_ep(ep, &a);
  pthread_mutex_lock(&ctx->lock);
  if (rc == 0 && already_connected(ctx, peer))
    rc = shm_error(ctx, MEP_ERR_INVALID,
                   "shm: rank %d was connected twice at once", peer);
  if (rc < 0) {
    pthread_mutex_unlock(&ctx->lock);
    shm_ep_release(ep);
    shm_ep_free(ep);
    return rc;
  }
  ep->all_next = ctx->all_eps;
  ctx->all_eps = ep;
  ctx->peers[peer] = ep;
  pthread_mutex_unlock(&ctx->lock);
  shm_log(ctx, MEP_LOG_DEBUG, "shm: rank %d connected to rank %d (pid %d), "
          "receive ring %llu bytes", ctx->rank, peer, (int)a.pid,
          (unsigned long long)ep->rx.cap);
  *out = ep;
  return 0;
}

void shm_ep_fail(shm_ep_t *ep, int status) {
  if (ep->state != SHM_EP_OPEN) return;
  int closing = status == MEP_ERR_CLOSED;
  /* Tell the peer, so its pending writes to us fail instead of waiting. */
  if (ep->tx.hdr)
    atomic_store_explicit(&ep->tx.hdr->tx_closed, 1, memory_order_release);
  if (ep->rx.hdr)
    atomic_store_explicit(&ep->rx.hdr->rx_closed, 1, memory_order_release);
  for (shm_op_t *op; (op = shm_queue_pop(&ep->sendq));) {
    if (op->kind != SHM_OP_WRITE) {
      free(op);
      continue;
    }
    op->status = closing ? MEP_ERR_CLOSED : MEP_ERR_PEER_FAILED;
    shm_queue_push(&ep->ctx->done, op);
  }
  if (!closing && ep->report) {
    ep->report->kind = SHM_OP_REPORT;
    ep->report->token = MEP_TP_TOKEN_NONE;
    ep->report->status = status;
    ep->report->peer = ep->peer;
    shm_queue_push(&ep->ctx->done, ep->report);
    ep->report = NULL;
  }
  ep->state = closing ? SHM_EP_CLOSED : SHM_EP_FAILED;
  ep->fail_status = status;
}

void shm_ep_release(shm_ep_t *ep) {
  shm_ep_fail(ep, MEP_ERR_CLOSED);
  ep->state = SHM_EP_CLOSED;
  shm_ring_unlink(&ep->rx);
  shm_ring_unmap(&ep->rx);
  shm_ring_unmap(&ep->tx);
  if (ep->pidfd >= 0) close(ep->pidfd);
  ep->pidfd = -1;
}

void shm_ep_free(shm_ep_t *ep) {
  while (ep->rmrs) {
    shm_rmr_t *r = ep->rmrs;
    ep->rmrs = r->next;
    r->tag = 0;
    free(r);
  }
  free(ep->report);
  ep->tag = 0;
  free(ep);
}

int shm_close(mep_tp_ep_t *p) {
  shm_ep_t *ep = shm_ep_of(p);
  if (!ep) return p ? MEP_ERR_INVALID : 0;
  shm_ctx_t *ctx = ep->ctx;
  pthread_mutex_lock(&ctx->lock);
  if (ep->state != SHM_EP_CLOSED || ep->rx.hdr || ep->tx.hdr)
    shm_ep_release(ep);
  pthread_mutex_unlock(&ctx->lock);
  return 0;
}
