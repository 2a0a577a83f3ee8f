/* cq.c - the plugin's own completion queue, which poll() hands out: write
 * tokens and failure reports, with an eventfd in the epoll set that is
 * readable while the queue holds something (so a core sleeping on
 * props.event_fd wakes for completions queued outside poll, by close()
 * or by an inline write). The eventfd is set by the first completion
 * queued and cleared only when poll() has been idle a while and finds
 * the queue empty: not two system calls per completion (a core that
 * sleeps on it may wake once for nothing). Its length changes under
 * cq_mu by atomic stores, so that poll() can find it empty without the
 * lock (mep__verbs_cq_ready): a lock pair less per call. */
#include <stdlib.h>
#include <unistd.h>

#include "verbs.h"

/* cq_mu held: room for one more entry. */
static int reserve(verbs_ctx_t *ctx) {
  if (ctx->cq_n < ctx->cq_cap) return 0;
  size_t cap = ctx->cq_cap ? 2 * ctx->cq_cap : 256;
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

/* cq_mu held: the eventfd is readable when entries wait. */
static void arm(verbs_ctx_t *ctx) {
  uint64_t v = 1;
  if (ctx->cq_n && !ctx->cq_armed)
    ctx->cq_armed = write(ctx->cqfd, &v, sizeof v) == (ssize_t)sizeof v;
}

void mep__verbs_cq_settle(verbs_ctx_t *ctx) {
  pthread_mutex_lock(&ctx->cq_mu);
  uint64_t v;
  if (!ctx->cq_n && ctx->cq_armed)
    ctx->cq_armed = read(ctx->cqfd, &v, sizeof v) != (ssize_t)sizeof v;
  pthread_mutex_unlock(&ctx->cq_mu);
}

void mep__verbs_cq_push(verbs_ctx_t *ctx, uint64_t token, int status,
                        int peer) {
  pthread_mutex_lock(&ctx->cq_mu);
  if (reserve(ctx)) {
    pthread_mutex_unlock(&ctx->cq_mu);
    VERBS_LOG(ctx, MEP_LOG_ERROR, "verbs: out of memory queueing the "
              "completion of token %llu (peer %d, status %d); it is lost",
              (unsigned long long)token, peer, status);
    return;
  }
  ctx->cq[(ctx->cq_head + ctx->cq_n) % ctx->cq_cap] =
      (mep_tp_completion_t){.token = token, .status = status, .peer = peer};
  __atomic_store_n(&ctx->cq_n, ctx->cq_n + 1, __ATOMIC_RELAXED);
  arm(ctx);
  pthread_mutex_unlock(&ctx->cq_mu);
}

int mep__verbs_cq_pop(verbs_ctx_t *ctx, mep_tp_completion_t *out, int max) {
  pthread_mutex_lock(&ctx->cq_mu);
  int n = 0;
  for (; n < max && ctx->cq_n; n++) {
    out[n] = ctx->cq[ctx->cq_head];
    ctx->cq_head = (ctx->cq_head + 1) % ctx->cq_cap;
    __atomic_store_n(&ctx->cq_n, ctx->cq_n - 1, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&ctx->cq_mu);
  return n;
}

/* A closed endpoint's failure report must not be taken for news of the
 * rank's next connection: it goes. */
void mep__verbs_cq_forget(verbs_ctx_t *ctx, int rank) {
  pthread_mutex_lock(&ctx->cq_mu);
  size_t kept = 0;
  for (size_t i = 0; i < ctx->cq_n; i++) {
    mep_tp_completion_t c = ctx->cq[(ctx->cq_head + i) % ctx->cq_cap];
    if (c.token == MEP_TP_TOKEN_NONE && c.peer == rank) continue;
    ctx->cq[(ctx->cq_head + kept++) % ctx->cq_cap] = c;
  }
  __atomic_store_n(&ctx->cq_n, kept, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&ctx->cq_mu);
}
