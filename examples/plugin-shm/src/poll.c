/* poll.c - progress: drain receive rings, refill send rings, notice peers
 * that died or left, and hand out completions. */
#include "shm.h"

#include <stdlib.h>

/* Fails the ep if the peer is gone, after applying what it sent before:
 * a peer's last writes and signals are valid even if it exited right
 * after them. */
static void check_peer(shm_ep_t *ep, int check_process) {
  static const char closed[] = "closed the connection";
  const char *why = NULL;
  /* The flags are set by a peer that closed its endpoint, or that found
   * us faulty and stopped reading. */
  if (atomic_load_explicit(&ep->tx.hdr->rx_closed, memory_order_acquire) ||
      atomic_load_explicit(&ep->rx.hdr->tx_closed, memory_order_acquire))
    why = closed;
  else if (check_process &&
           !shm_proc_alive(ep->pid, ep->start_time, ep->pidfd))
    why = "exited";
  if (!why) return;
  if (shm_recv_progress(ep) != 0) return;
  size_t pending = 0;
  for (const shm_op_t *op = ep->sendq.head; op; op = op->next)
    pending += op->kind == SHM_OP_WRITE;
  /* A peer that closed with nothing of ours in flight is the normal end
   * of a job; it is still reported, so nothing waits on it. */
  int quiet = why == closed && pending == 0;
  shm_log(ep->ctx, quiet ? MEP_LOG_INFO : MEP_LOG_WARN,
          "shm: rank %d (pid %d) %s; %zu pending writes to it failed",
          ep->peer, (int)ep->pid, why, pending);
  shm_ep_fail(ep, MEP_ERR_PEER_FAILED);
}

static void progress(shm_ctx_t *ctx) {
  int64_t now = shm_now_ns();
  int check_process = now >= ctx->next_liveness_ns;
  if (check_process) ctx->next_liveness_ns = now + SHM_LIVENESS_NS;
  for (int peer = 0; peer < ctx->size; peer++) {
    shm_ep_t *ep = ctx->peers[peer];
    if (!ep || ep->state != SHM_EP_OPEN) continue;
    shm_recv_progress(ep);
    shm_send_progress(ep);
    if (ep->state == SHM_EP_OPEN) check_peer(ep, check_process);
  }
}

int shm_poll(mep_tp_ctx_t *p, mep_tp_completion_t *out, int max) {
  shm_ctx_t *ctx = shm_ctx_of(p);
  if (!ctx || max < 0 || (max > 0 && !out)) return MEP_ERR_INVALID;
  pthread_mutex_lock(&ctx->lock);
  progress(ctx);
  int n = 0;
  for (shm_op_t *op; n < max && (op = shm_queue_pop(&ctx->done)); n++) {
    out[n] = (mep_tp_completion_t){.token = op->token, .status = op->status,
                                   .peer = op->peer};
    free(op);
  }
  pthread_mutex_unlock(&ctx->lock);
  return n;
}
