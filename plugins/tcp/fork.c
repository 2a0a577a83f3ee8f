/*
 * fork.c - a child made by fork() lets go of the context's sockets
 * (plugins/common/fork_watch.h says why): the listener, the connections in
 * their handshake, the sockets connect() is dialling and every peer's
 * sockets. They are made, adopted and closed under poll_mu or mu, which
 * the fork handlers hold.
 */
#include "tcp.h"

static void let_go_all(void *arg, int dead) {
  const tcp_ctx_t *ctx = arg;
  mep__fork_let_go(ctx->lfd, dead);
  for (const tcp_hs_t *hs = ctx->hs; hs; hs = hs->next)
    mep__fork_let_go(hs->fd, dead);
  for (const tcp_dialing_t *d = ctx->dialing; d; d = d->next)
    mep__fork_let_go(d->fd, dead);
  for (int r = 0; r < ctx->size; r++) {
    const tcp_peer_t *p = ctx->peers[r];
    for (int i = 0; p && i < ctx->cfg.nsock; i++)
      mep__fork_let_go(p->socks[i].fd, dead);
  }
}

int mep__tcp_fork_watch(tcp_ctx_t *ctx) {
  ctx->fork = (mep__fork_watch_t){.locks = {&ctx->poll_mu, &ctx->mu},
                                  .let_go_all = let_go_all,
                                  .arg = ctx};
  if (mep__fork_watch(&ctx->fork))
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: installing the fork handlers "
                   "failed (out of memory)");
  return 0;
}

void mep__tcp_fork_unwatch(tcp_ctx_t *ctx) { mep__fork_unwatch(&ctx->fork); }
