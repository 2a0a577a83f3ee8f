/* cq.c - the completion queue poll() drains, and the eventfd that makes
 * the epoll fd readable while it is not empty. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tcp.h"

static int grow(tcp_ctx_t *ctx) {
  size_t cap = ctx->cq_cap ? ctx->cq_cap * 2 : 256;
  mep_tp_completion_t *q = malloc(cap * sizeof *q);
  if (!q) return -1;
  for (size_t i = 0; i < ctx->cq_n; i++)
    q[i] = ctx->cq[(ctx->cq_head + i) % ctx->cq_cap];
  free(ctx->cq);
  ctx->cq = q;
  ctx->cq_cap = cap;
  ctx->cq_head = 0;
  return 0;
}

void mep__tcp_cq_push(tcp_ctx_t *ctx, uint64_t token, int status, int peer) {
  pthread_mutex_lock(&ctx->cq_mu);
  if (ctx->cq_n == ctx->cq_cap && grow(ctx)) {
    pthread_mutex_unlock(&ctx->cq_mu);
    TCP_LOG(ctx, MEP_LOG_ERROR,
            "tcp: out of memory queueing the completion of token %llu "
            "(peer %d, status %d); it is lost",
            (unsigned long long)token, peer, status);
    return;
  }
  ctx->cq[(ctx->cq_head + ctx->cq_n++) % ctx->cq_cap] =
      (mep_tp_completion_t){.token = token, .status = status, .peer = peer};
  if (!ctx->cq_armed) {
    uint64_t one = 1;
    if (write(ctx->cqfd, &one, sizeof one) == (ssize_t)sizeof one)
      ctx->cq_armed = 1;
  }
  pthread_mutex_unlock(&ctx->cq_mu);
}

int mep__tcp_cq_pop(tcp_ctx_t *ctx, mep_tp_completion_t *out, int max) {
  pthread_mutex_lock(&ctx->cq_mu);
  int n = 0;
  while (n < max && ctx->cq_n) {
    out[n++] = ctx->cq[ctx->cq_head];
    ctx->cq_head = (ctx->cq_head + 1) % ctx->cq_cap;
    ctx->cq_n--;
  }
  if (!ctx->cq_n && ctx->cq_armed) {
    uint64_t v;
    if (read(ctx->cqfd, &v, sizeof v) == (ssize_t)sizeof v) ctx->cq_armed = 0;
  }
  pthread_mutex_unlock(&ctx->cq_mu);
  return n;
}

void mep__tcp_cq_forget(tcp_ctx_t *ctx, int rank) {
  pthread_mutex_lock(&ctx->cq_mu);
  size_t kept = 0;
  for (size_t i = 0; i < ctx->cq_n; i++) {
    mep_tp_completion_t c = ctx->cq[(ctx->cq_head + i) % ctx->cq_cap];
    if (c.token == MEP_TP_TOKEN_NONE && c.peer == rank) continue;
    ctx->cq[(ctx->cq_head + kept++) % ctx->cq_cap] = c;
  }
  ctx->cq_n = kept;
  if (!ctx->cq_n && ctx->cq_armed) {
    uint64_t v;
    if (read(ctx->cqfd, &v, sizeof v) == (ssize_t)sizeof v) ctx->cq_armed = 0;
  }
  pthread_mutex_unlock(&ctx->cq_mu);
}
