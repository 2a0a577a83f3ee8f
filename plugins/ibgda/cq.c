/* cq.c - the plugin's own completion queue: what poll() returns, filled
 * from the queue pairs' CQEs and from failures. A growing ring. */
#include <stdlib.h>

#include "ibgda.h"

void mep__ibgda_cq_push(ibgda_ctx_t *ctx, uint64_t token, int status,
                        int peer) {
  pthread_mutex_lock(&ctx->cq_mu);
  if (ctx->cq_n == ctx->cq_cap) {
    size_t cap = ctx->cq_cap ? 2 * ctx->cq_cap : 256;
    mep_tp_completion_t *q = malloc(cap * sizeof *q);
    if (!q) {
      /* cannot happen quietly: the token would be lost */
      IBGDA_LOG(ctx, MEP_LOG_ERROR, "ibgda: rank %d: out of memory for a "
                "completion; a token is lost", ctx->rank);
      pthread_mutex_unlock(&ctx->cq_mu);
      return;
    }
    for (size_t i = 0; i < ctx->cq_n; i++)
      q[i] = ctx->cq[(ctx->cq_head + i) % ctx->cq_cap];
    free(ctx->cq);
    ctx->cq = q;
    ctx->cq_cap = cap;
    ctx->cq_head = 0;
  }
  ctx->cq[(ctx->cq_head + ctx->cq_n++) % ctx->cq_cap] =
      (mep_tp_completion_t){token, status, peer};
  pthread_mutex_unlock(&ctx->cq_mu);
}

int mep__ibgda_cq_pop(ibgda_ctx_t *ctx, mep_tp_completion_t *out, int max) {
  pthread_mutex_lock(&ctx->cq_mu);
  int n = 0;
  while (n < max && ctx->cq_n) {
    out[n++] = ctx->cq[ctx->cq_head];
    ctx->cq_head = (ctx->cq_head + 1) % ctx->cq_cap;
    ctx->cq_n--;
  }
  pthread_mutex_unlock(&ctx->cq_mu);
  return n;
}
