/*
 * ops.c - writes, signals and their completions.
 *
 * Everything goes on the context's one stream, under ctx->mu, so the
 * pending queue is in stream order: a write completes when the event
 * recorded after its copy has, and the head of the queue is always the
 * first to complete. A sticky CUDA error on the stream fails every pending
 * write and every later one with MEP_ERR_SYSTEM naming the error.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "nvlink.h"

/* ctx->mu held. Room for one more pending write; -1 when out of memory. */
static int ops_reserve(nvl_ctx_t *ctx) {
  if (ctx->ops_n < ctx->ops_cap) return 0;
  size_t cap = ctx->ops_cap ? ctx->ops_cap * 2 : 64;
  nvl_op_t *q = malloc(cap * sizeof *q);
  if (!q) return -1;
  for (size_t i = 0; i < ctx->ops_n; i++)
    q[i] = ctx->ops[(ctx->ops_head + i) % ctx->ops_cap];
  free(ctx->ops);
  ctx->ops = q;
  ctx->ops_cap = cap;
  ctx->ops_head = 0;
  return 0;
}

/* ctx->mu held. Queues a known completion; it is lost (and logged) only
 * when memory runs out. */
static void done_push(nvl_ctx_t *ctx, uint64_t token, int status, int peer) {
  if (ctx->done_n == ctx->done_cap) {
    size_t cap = ctx->done_cap ? ctx->done_cap * 2 : 64;
    mep_tp_completion_t *q = malloc(cap * sizeof *q);
    if (!q) {
      NVL_LOG(ctx, MEP_LOG_ERROR, "nvlink: out of memory queueing the "
              "completion of token %" PRIu64 " (rank %d, status %d); it is "
              "lost", token, peer, status);
      return;
    }
    for (size_t i = 0; i < ctx->done_n; i++)
      q[i] = ctx->done[(ctx->done_head + i) % ctx->done_cap];
    free(ctx->done);
    ctx->done = q;
    ctx->done_cap = cap;
    ctx->done_head = 0;
  }
  ctx->done[(ctx->done_head + ctx->done_n++) % ctx->done_cap] =
      (mep_tp_completion_t){.token = token, .status = status, .peer = peer};
}

static int done_pop(nvl_ctx_t *ctx, mep_tp_completion_t *out, int max) {
  int n = 0;
  while (n < max && ctx->done_n) {
    out[n++] = ctx->done[ctx->done_head];
    ctx->done_head = (ctx->done_head + 1) % ctx->done_cap;
    ctx->done_n--;
  }
  return n;
}

/* ctx->mu held. An idle event, or NULL with the error in *e. */
static cudaEvent_t ev_get(nvl_ctx_t *ctx, cudaError_t *e) {
  if (ctx->pool_n) return ctx->pool[--ctx->pool_n];
  cudaEvent_t ev = NULL;
  *e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  return *e == cudaSuccess ? ev : NULL;
}

/* ctx->mu held. */
static void ev_put(nvl_ctx_t *ctx, cudaEvent_t ev) {
  if (ctx->pool_n == ctx->pool_cap) {
    size_t cap = ctx->pool_cap ? ctx->pool_cap * 2 : 64;
    cudaEvent_t *p = realloc(ctx->pool, cap * sizeof *p);
    if (!p) {
      (void)cudaEventDestroy(ev);
      return;
    }
    ctx->pool = p;
    ctx->pool_cap = cap;
  }
  ctx->pool[ctx->pool_n++] = ev;
}

/* ctx->mu held. The stream failed with `e`: every pending write fails. */
static void fail_all(nvl_ctx_t *ctx, cudaError_t e) {
  if (!ctx->broken) {
    ctx->broken = e;
    NVL_LOG(ctx, MEP_LOG_ERROR, "nvlink: rank %d: the copy stream on GPU %d "
            "failed: %s; %zu pending writes fail", ctx->rank, ctx->dev,
            cudaGetErrorString(e), ctx->ops_n);
  }
  while (ctx->ops_n) {
    nvl_op_t *op = &ctx->ops[ctx->ops_head];
    if (op->ep) done_push(ctx, op->token, MEP_ERR_SYSTEM, op->peer);
    ev_put(ctx, op->ev);
    ctx->ops_head = (ctx->ops_head + 1) % ctx->ops_cap;
    ctx->ops_n--;
  }
}

/* ctx->mu held: whether the ep may queue work; the error when not. */
static int usable(nvl_ctx_t *ctx, nvl_ep_t *ep, const char *what) {
  if (ep->closed)
    return NVL_ERR(ctx, MEP_ERR_CLOSED, "nvlink: %s to rank %d: the "
                   "endpoint is closed", what, ep->rank);
  if (ctx->broken)
    return NVL_ERR(ctx, MEP_ERR_SYSTEM, "nvlink: %s to rank %d: the copy "
                   "stream on GPU %d failed earlier: %s", what, ep->rank,
                   ctx->dev, cudaGetErrorString(ctx->broken));
  return 0;
}

static int in_bounds(uint64_t off, uint64_t len, uint64_t size) {
  return off <= size && len <= size - off;
}

/* ctx->mu held, ctx->dev current. */
static int enqueue_copy(nvl_ctx_t *ctx, nvl_ep_t *ep, uint8_t *dst,
                        const uint8_t *src, uint64_t len, uint64_t token) {
  if (ops_reserve(ctx))
    return NVL_ERR(ctx, MEP_ERR_NOMEM, "nvlink: write to rank %d: out of "
                   "memory", ep->rank);
  cudaError_t e = cudaSuccess;
  cudaEvent_t ev = ev_get(ctx, &e);
  if (!ev) {
    (void)cudaGetLastError();
    return NVL_ERR(ctx, MEP_ERR_SYSTEM, "nvlink: write to rank %d: "
                   "cudaEventCreate: %s", ep->rank, cudaGetErrorString(e));
  }
  const char *call = "cudaMemcpyAsync";
  if (len)
    e = cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, ctx->stream);
  if (e == cudaSuccess) {
    call = "cudaEventRecord";
    e = cudaEventRecord(ev, ctx->stream);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    ev_put(ctx, ev);
    return NVL_ERR(ctx, MEP_ERR_SYSTEM, "nvlink: write of %" PRIu64 " bytes "
                   "to rank %d: %s: %s", len, ep->rank, call,
                   cudaGetErrorString(e));
  }
  ctx->ops[(ctx->ops_head + ctx->ops_n++) % ctx->ops_cap] =
      (nvl_op_t){.ev = ev, .token = token, .peer = ep->rank, .ep = ep};
  return 0;
}

int mep__nvl_write(mep_tp_ep_t *epp, mep_tp_mr_t *mrp, uint64_t loff,
                   mep_tp_rmr_t *rmrp, uint64_t roff, uint64_t len,
                   uint64_t token) {
  nvl_ep_t *ep = epp;
  nvl_mr_t *mr = mrp;
  nvl_rmr_t *r = rmrp;
  if (!ep || !mr || !r) return MEP_ERR_INVALID;
  nvl_ctx_t *ctx = ep->ctx;
  if (mr->ctx != ctx || r->ep != ep)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: write to rank %d: the "
                   "registration or the imported region belongs elsewhere",
                   ep->rank);
  if (!in_bounds(loff, len, mr->len))
    return NVL_ERR(ctx, MEP_ERR_BOUNDS, "nvlink: write to rank %d: the "
                   "source [%" PRIu64 ", +%" PRIu64 ") lies outside its "
                   "registration of %" PRIu64 " bytes", ep->rank, loff, len,
                   mr->len);
  if (!in_bounds(roff, len, r->len))
    return NVL_ERR(ctx, MEP_ERR_BOUNDS, "nvlink: write to rank %d: the "
                   "target [%" PRIu64 ", +%" PRIu64 ") lies outside its "
                   "region of %" PRIu64 " bytes", ep->rank, roff, len,
                   r->len);
  int saved, rc = mep__nvl_enter(ctx, &saved);
  if (rc) return rc;
  pthread_mutex_lock(&ctx->mu);
  rc = usable(ctx, ep, "write");
  if (!rc) rc = enqueue_copy(ctx, ep, r->ptr + roff, mr->ptr + loff, len,
                             token);
  pthread_mutex_unlock(&ctx->mu);
  mep__nvl_leave(ctx, saved);
  return rc;
}

int mep__nvl_signal(mep_tp_ep_t *epp, mep_tp_rmr_t *rmrp, uint64_t roff,
                    uint64_t value, mep_signal_op_t op) {
  nvl_ep_t *ep = epp;
  nvl_rmr_t *r = rmrp;
  if (!ep || !r) return MEP_ERR_INVALID;
  nvl_ctx_t *ctx = ep->ctx;
  if (r->ep != ep)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: signal to rank %d: the "
                   "region was imported from rank %d", ep->rank, r->ep->rank);
  if (op != MEP_SIGNAL_SET && op != MEP_SIGNAL_ADD)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: signal to rank %d: unknown "
                   "operation %d", ep->rank, (int)op);
  if (roff % 8 || (uintptr_t)(r->ptr + roff) % 8)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: signal to rank %d: offset "
                   "%" PRIu64 " is not 8-byte aligned", ep->rank, roff);
  if (!in_bounds(roff, 8, r->len))
    return NVL_ERR(ctx, MEP_ERR_BOUNDS, "nvlink: signal to rank %d: the word "
                   "at %" PRIu64 " lies outside its region of %" PRIu64
                   " bytes", ep->rank, roff, r->len);
  int saved, rc = mep__nvl_enter(ctx, &saved);
  if (rc) return rc;
  pthread_mutex_lock(&ctx->mu);
  rc = usable(ctx, ep, "signal");
  if (!rc) {
    int e = mep__nvl_signal_launch((uint64_t *)(void *)(r->ptr + roff), value,
                                   op == MEP_SIGNAL_ADD, ctx->stream);
    if (e != cudaSuccess)
      rc = NVL_ERR(ctx, MEP_ERR_SYSTEM, "nvlink: signal to rank %d: the "
                   "kernel launch failed: %s", ep->rank,
                   cudaGetErrorString((cudaError_t)e));
  }
  pthread_mutex_unlock(&ctx->mu);
  mep__nvl_leave(ctx, saved);
  return rc;
}

int mep__nvl_poll(mep_tp_ctx_t *ctxp, mep_tp_completion_t *out, int max) {
  nvl_ctx_t *ctx = ctxp;
  if (!ctx || max < 0 || (max > 0 && !out)) return MEP_ERR_INVALID;
  int saved, rc = mep__nvl_enter(ctx, &saved);
  if (rc) return rc;
  pthread_mutex_lock(&ctx->mu);
  int n = done_pop(ctx, out, max);
  while (ctx->ops_n && n < max) {
    nvl_op_t *op = &ctx->ops[ctx->ops_head];
    cudaError_t e = cudaEventQuery(op->ev);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail_all(ctx, e);
      n += done_pop(ctx, out + n, max - n);
      break;
    }
    if (op->ep) out[n++] = (mep_tp_completion_t){.token = op->token,
                                                 .status = 0,
                                                 .peer = op->peer};
    ev_put(ctx, op->ev);
    ctx->ops_head = (ctx->ops_head + 1) % ctx->ops_cap;
    ctx->ops_n--;
  }
  pthread_mutex_unlock(&ctx->mu);
  mep__nvl_leave(ctx, saved);
  return n;
}

/* ctx->mu held. The ep closes: its pending writes are reported now, as
 * closed; their events are only recycled when they complete. */
void mep__nvl_ops_orphan(nvl_ctx_t *ctx, nvl_ep_t *ep) {
  for (size_t i = 0; i < ctx->ops_n; i++) {
    nvl_op_t *op = &ctx->ops[(ctx->ops_head + i) % ctx->ops_cap];
    if (op->ep != ep) continue;
    done_push(ctx, op->token, MEP_ERR_CLOSED, op->peer);
    op->ep = NULL;
  }
}

/* At fini, after the stream drained (or gave up). */
void mep__nvl_ops_free(nvl_ctx_t *ctx) {
  for (size_t i = 0; i < ctx->ops_n; i++)
    (void)cudaEventDestroy(ctx->ops[(ctx->ops_head + i) % ctx->ops_cap].ev);
  for (size_t i = 0; i < ctx->pool_n; i++) (void)cudaEventDestroy(ctx->pool[i]);
  free(ctx->ops);
  free(ctx->done);
  free(ctx->pool);
  ctx->ops = NULL;
  ctx->done = NULL;
  ctx->pool = NULL;
  ctx->ops_n = ctx->done_n = ctx->pool_n = 0;
}
