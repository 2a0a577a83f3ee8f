/* peer.c - a peer's lifetime: creation, its sockets, failure, teardown. */
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp.h"

tcp_peer_t *mep__tcp_peer_new(tcp_ctx_t *ctx, int rank) {
  if (rank < 0 || rank >= ctx->size || rank == ctx->rank || ctx->peers[rank])
    return NULL;
  size_t k = (size_t)ctx->cfg.nsock;
  tcp_peer_t *p = calloc(1, sizeof *p + k * sizeof p->socks[0]);
  if (!p) return NULL;
  p->ctx = ctx;
  p->rank = rank;
  pthread_mutex_init(&p->mu, NULL);
  for (size_t i = 0; i < k; i++) {
    tcp_sock_t *s = &p->socks[i];
    s->src.kind = TCP_SRC_SOCK;
    s->peer = p;
    s->index = (uint32_t)i;
    s->fd = -1;
    s->rx_state = TCP_RX_HDR;
    s->rx_need = MEP_TCP_HDR_LEN;
  }
  ctx->peers[rank] = p;
  return p;
}

/* Adopts a connected, authenticated socket as socket `index` of p.
 * add: register with epoll (a dialled socket) or re-point the existing
 * registration (an accepted one, registered while in its handshake).
 * Takes p->mu. 0, or a negative code when p is dead or the slot taken. */
int mep__tcp_peer_install(tcp_peer_t *p, uint32_t index, int fd, int add) {
  tcp_ctx_t *ctx = p->ctx;
  pthread_mutex_lock(&p->mu);
  tcp_sock_t *s = &p->socks[index];
  int rc = 0;
  if (p->dead) {
    rc = p->dead_status;
  } else if (s->used) {
    rc = MEP_ERR_PROTOCOL;
  } else {
    mep__tcp_sockopts(ctx, fd);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->src};
    if (epoll_ctl(ctx->epfd, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev))
      rc = MEP_ERR_SYSTEM;
    else {
      s->fd = fd;
      s->used = 1;
      p->nup++;
    }
  }
  pthread_mutex_unlock(&p->mu);
  return rc;
}

int mep__tcp_sock_watch(tcp_sock_t *s) {
  tcp_ctx_t *ctx = s->peer->ctx;
  struct epoll_event ev = {
      .events = (mep__tcp_pool_owned(&ctx->rx, s) ? 0u : EPOLLIN) |
                (s->out_armed ? EPOLLOUT : 0u),
      .data.ptr = &s->src};
  return epoll_ctl(ctx->epfd, EPOLL_CTL_MOD, s->fd, &ev);
}

void mep__tcp_peer_fail_locked(tcp_peer_t *p, int status, int report) {
  if (p->dead) return;
  tcp_ctx_t *ctx = p->ctx;
  p->dead = 1;
  p->dead_status = status;
  for (int i = 0; i < ctx->cfg.nsock; i++) {
    int fd = p->socks[i].fd;
    if (fd < 0) continue;
    epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, fd, NULL);
    shutdown(fd, SHUT_RDWR);
    p->fds_open = 1;
  }
  if (p->fds_open) __atomic_store_n(&ctx->reap, 1, __ATOMIC_RELEASE);
  mep__tcp_drop_queues(p, mep__tcp_lost_status(status), 1);
  if (report) mep__tcp_cq_push(ctx, MEP_TP_TOKEN_NONE, status, p->rank);
}

void mep__tcp_peer_fail(tcp_peer_t *p, int status, int report) {
  pthread_mutex_lock(&p->mu);
  mep__tcp_peer_fail_locked(p, status, report);
  pthread_mutex_unlock(&p->mu);
}

/* Poll thread (poll_mu held): closes the fds that failing peers only
 * shut down. */
void mep__tcp_reap(tcp_ctx_t *ctx) {
  if (!__atomic_exchange_n(&ctx->reap, 0, __ATOMIC_ACQ_REL)) return;
  pthread_mutex_lock(&ctx->mu);
  for (int r = 0; r < ctx->size; r++) {
    tcp_peer_t *p = ctx->peers[r];
    if (!p) continue;
    pthread_mutex_lock(&p->mu);
    if (p->dead && p->fds_open &&
        (mep__tcp_pool_busy(&ctx->tx, p) || mep__tcp_pool_busy(&ctx->rx, p))) {
      /* a sender or receiver thread may be about to use an fd: next time */
      __atomic_store_n(&ctx->reap, 1, __ATOMIC_RELEASE);
    } else if (p->dead && p->fds_open) {
      for (int i = 0; i < ctx->cfg.nsock; i++) {
        if (p->socks[i].fd >= 0) close(p->socks[i].fd);
        p->socks[i].fd = -1;
      }
      p->fds_open = 0;
    }
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_unlock(&ctx->mu);
}

/* lazy_mu held: takes p off the list of peers with deferred writes. */
static void lazy_unlink(tcp_ctx_t *ctx, tcp_peer_t *p) {
  for (tcp_peer_t **pp = &ctx->lazy_head; *pp; pp = &(*pp)->lazy_next)
    if (*pp == p) {
      __atomic_store_n(pp, p->lazy_next, __ATOMIC_RELEASE);
      break;
    }
  p->lazy_next = NULL;
  p->lazy_listed = 0;
}

/* poll_mu held (or fini): what a dead peer still holds but its struct and
 * the regions imported through it. */
static void release(tcp_peer_t *p) {
  tcp_ctx_t *ctx = p->ctx;
  mep__tcp_pool_quiesce(&ctx->tx, p);
  mep__tcp_pool_quiesce(&ctx->rx, p);
  pthread_mutex_lock(&p->mu);
  for (int i = 0; i < ctx->cfg.nsock; i++) {
    tcp_sock_t *s = &p->socks[i];
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    free(s->rb);
    s->rb = NULL;
    s->rb_off = s->rb_len = 0;
  }
  p->fds_open = 0;
  mep__tcp_drop_queues(p, MEP_ERR_CLOSED, 0);
  free(p->psig);
  p->psig = NULL;
  p->psig_head = p->psig_n = p->psig_cap = 0;
  if (p->lazy_listed) {
    pthread_mutex_lock(&ctx->lazy_mu);
    lazy_unlink(ctx, p);
    pthread_mutex_unlock(&ctx->lazy_mu);
  }
  pthread_mutex_unlock(&p->mu);
}

void mep__tcp_tomb_free(tcp_ctx_t *ctx, int rank) {
  tcp_peer_t *t = ctx->tombs[rank];
  ctx->tombs[rank] = NULL;
  if (t) mep__tcp_peer_free(t);
}

void mep__tcp_peer_retire(tcp_peer_t *p, int tomb) {
  tcp_ctx_t *ctx = p->ctx;
  if (ctx->peers[p->rank] == p) ctx->peers[p->rank] = NULL;
  release(p);
  if (!tomb) {
    mep__tcp_peer_free(p);
    return;
  }
  if (ctx->tombs[p->rank] != p) {
    mep__tcp_tomb_free(ctx, p->rank);
    ctx->tombs[p->rank] = p;
  }
}

/* fini, or a retired peer under poll_mu: nobody else uses p. */
void mep__tcp_peer_free(tcp_peer_t *p) {
  tcp_ctx_t *ctx = p->ctx;
  for (int i = 0; i < ctx->cfg.nsock; i++) {
    if (p->socks[i].fd >= 0) close(p->socks[i].fd);
  }
  mep__tcp_drop_queues(p, MEP_ERR_CLOSED, 0);
  while (p->rmrs) {
    tcp_rmr_t *r = p->rmrs;
    p->rmrs = r->next;
    free(r);
  }
  free(p->psig);
  for (int i = 0; i < ctx->cfg.nsock; i++) free(p->socks[i].rb);
  pthread_mutex_destroy(&p->mu);
  free(p);
}
