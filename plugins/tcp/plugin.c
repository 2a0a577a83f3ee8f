/*
 * plugin.c - the tcp transport's entry points and its exported vtable.
 *
 * One context per communicator: a listening socket on the configured
 * interface, k sockets per peer, an epoll set that poll() drives without
 * blocking and that the core may sleep on (props.event_fd). Threads of its
 * own where the machine has CPUs to spare: sender threads for large
 * writes (sender.c) and receiver threads for long payloads (receiver.c).
 * A child forked from the process lets go of the sockets (fork.c).
 */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "entry.h"
#include "tcp.h"

#define TCP_DEFAULT_TIMEOUT_MS 30000

static int ctx_open(tcp_ctx_t *ctx) {
  int rc = mep__tcp_listen(ctx);
  if (rc) return rc;
  ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
  ctx->cqfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &ctx->lsrc};
  struct epoll_event cev = {.events = EPOLLIN, .data.ptr = &ctx->cqsrc};
  if (ctx->epfd < 0 || ctx->cqfd < 0 ||
      epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->lfd, &lev) ||
      epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->cqfd, &cev))
    return TCP_ERR(ctx, MEP_ERR_SYSTEM,
                   "tcp: creating the epoll set or eventfd failed");
  return 0;
}

static int tcp_fini(mep_tp_ctx_t *ctxp) {
  tcp_ctx_t *ctx = ctxp;
  if (!ctx) return 0;
  mep__tcp_fork_unwatch(ctx);
  mep__tcp_pool_stop(&ctx->tx);
  mep__tcp_pool_stop(&ctx->rx);
  mep__tcp_hs_free_all(ctx);
  for (int r = 0; ctx->peers && r < ctx->size; r++)
    if (ctx->peers[r]) mep__tcp_peer_free(ctx->peers[r]);
  for (int r = 0; ctx->tombs && r < ctx->size; r++)
    if (ctx->tombs[r]) mep__tcp_peer_free(ctx->tombs[r]);
  free(ctx->peers);
  free(ctx->tombs);
  free(ctx->shut);
  mep__tcp_regions_free(ctx);
  if (ctx->lfd >= 0) close(ctx->lfd);
  if (ctx->epfd >= 0) close(ctx->epfd);
  if (ctx->cqfd >= 0) close(ctx->cqfd);
  free(ctx->cq);
  pthread_mutex_destroy(&ctx->poll_mu);
  pthread_mutex_destroy(&ctx->mu);
  pthread_rwlock_destroy(&ctx->rx_lock);
  pthread_mutex_destroy(&ctx->cq_mu);
  pthread_mutex_destroy(&ctx->lazy_mu);
  free(ctx);
  return 0;
}

static int tcp_init(const mep_tp_env_t *env, mep_tp_ctx_t **out) {
  if (!out || !mep__tp_env_ok(env)) return MEP_ERR_INVALID;
  if (env->rank < 0 || env->size <= 0 || env->rank >= env->size) {
    env->set_error("tcp: init: rank %d in a group of %d", env->rank,
                   env->size);
    return MEP_ERR_INVALID;
  }
  if (env->secret_len > MEP_TCP_MAX_SECRET ||
      (env->secret_len && !env->secret)) {
    env->set_error("tcp: init: a job secret of %zu bytes (at most %d, and "
                   "not NULL)", env->secret_len, MEP_TCP_MAX_SECRET);
    return MEP_ERR_INVALID;
  }
  tcp_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    env->set_error("tcp: init: out of memory");
    return MEP_ERR_NOMEM;
  }
  ctx->env = env;
  ctx->rank = env->rank;
  ctx->size = env->size;
  ctx->timeout_ms = env->timeout_ms > 0 ? env->timeout_ms
                                        : TCP_DEFAULT_TIMEOUT_MS;
  ctx->lfd = ctx->epfd = ctx->cqfd = -1;
  ctx->lsrc.kind = TCP_SRC_LISTEN;
  ctx->hssrc.kind = TCP_SRC_HANDSHAKE;
  ctx->cqsrc.kind = TCP_SRC_CQ;
  ctx->rxsrc.kind = TCP_SRC_RX;
  ctx->hs_next_deadline = INT64_MAX;
  ctx->inc = mep__tp_incarnation(ctx);
  pthread_mutex_init(&ctx->poll_mu, NULL);
  pthread_mutex_init(&ctx->mu, NULL);
  /* dereg must not wait behind an endless run of payload reads */
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  pthread_rwlockattr_setkind_np(&ra,
                                PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&ctx->rx_lock, &ra);
  pthread_rwlockattr_destroy(&ra);
  pthread_mutex_init(&ctx->cq_mu, NULL);
  pthread_mutex_init(&ctx->lazy_mu, NULL);
  int rc = mep__tcp_cfg_read(env, &ctx->cfg);
  size_t n = (size_t)env->size;
  if (!rc && (!(ctx->peers = calloc(n, sizeof *ctx->peers)) ||
              !(ctx->tombs = calloc(n, sizeof *ctx->tombs)) ||
              !(ctx->shut = calloc(n, sizeof *ctx->shut))))
    rc = TCP_ERR(ctx, MEP_ERR_NOMEM, "tcp: init: out of memory for %d peers",
                 env->size);
  if (!rc) rc = ctx_open(ctx);
  if (!rc) rc = mep__tcp_tx_start(ctx);
  if (!rc) rc = mep__tcp_rx_start(ctx);
  if (!rc) rc = mep__tcp_fork_watch(ctx);
  if (rc) {
    tcp_fini(ctx);
    return rc;
  }
  *out = ctx;
  return 0;
}

static int tcp_props(mep_tp_ctx_t *ctxp, mep_tp_props_t *props) {
  tcp_ctx_t *ctx = ctxp;
  if (!ctx || !props) return MEP_ERR_INVALID;
  mep_tp_props_t full = {
      .mem_kinds = MEP_TP_MEM_HOST,
      .dev_kind = MEP_DEV_NONE,
      .atomics = 0,
      .max_message = 0,
      /* loopback, as scripts/bench-tcp.sh measures it (docs/perf.md):
       * half of an 8-byte put + signal round trip, 64 MiB puts */
      .latency_us = 5.0,
      .bandwidth_gbps = 5.0,
      .event_fd = ctx->epfd,
      /* a region is a base and a length in a table: nothing is pinned */
      .reg_by_address = 1,
  };
  mep__tp_props_put(props, &full);
  return 0;
}

static int tcp_address(mep_tp_ctx_t *ctxp, void *buf, size_t *len) {
  tcp_ctx_t *ctx = ctxp;
  if (!ctx || !buf || !len) return MEP_ERR_INVALID;
  if (*len < MEP_TCP_ADDR_LEN)
    return TCP_ERR(ctx, MEP_ERR_INVALID,
                   "tcp: address: the buffer has %zu bytes, the address "
                   "needs %d", *len, MEP_TCP_ADDR_LEN);
  mep__tcp_addr_t a = {.port = ntohs(ctx->addr.sin_port),
                       .incarnation = ctx->inc};
  memcpy(a.ip, &ctx->addr.sin_addr, 4);
  mep__tcp_addr_encode(buf, &a);
  *len = MEP_TCP_ADDR_LEN;
  return 0;
}

static int tcp_reachable(mep_tp_ctx_t *ctxp, int peer, const void *blob,
                         size_t len, char *why, size_t why_len) {
  tcp_ctx_t *ctx = ctxp;
  if (!ctx) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size)
    return TCP_ERR(ctx, MEP_ERR_INVALID,
                   "tcp: reachable: rank %d in a group of %d", peer,
                   ctx->size);
  mep__tcp_addr_t a;
  return mep__tcp_addr_decode(blob, len, &a, why, why_len) ? 0 : 1;
}

/* The higher rank waits until the lower one's k sockets have arrived. */
static int await_dialler(tcp_ctx_t *ctx, tcp_peer_t *p, int64_t deadline) {
  for (;;) {
    pthread_mutex_lock(&p->mu);
    int up = p->nup, dead = p->dead, st = p->dead_status;
    pthread_mutex_unlock(&p->mu);
    if (dead)
      return TCP_ERR(ctx, st == MEP_ERR_CLOSED ? st : MEP_ERR_PEER_FAILED,
                     "tcp: rank %d failed while connecting to rank %d",
                     p->rank, ctx->rank);
    if (up == ctx->cfg.nsock) return 0;
    if (mep__tcp_wait(ctx, -1, 0, deadline) < 0)
      return TCP_ERR(ctx, MEP_ERR_TIMEOUT,
                     "tcp: rank %d waited %d ms for rank %d to connect (%d of "
                     "%d sockets arrived)",
                     ctx->rank, ctx->timeout_ms, p->rank, up,
                     ctx->cfg.nsock);
  }
}

/* poll_mu and ctx->mu held. The peer object connect() to `rank` at
 * incarnation `inc` works on (*out), or an error; 1 when that connection
 * is already up (*out is its ep). A stash of accepted sockets from another
 * incarnation, or one that failed, is dropped; the tombstone of an earlier
 * ep of the rank is freed (the core never uses a closed ep again). */
static int claim(tcp_ctx_t *ctx, int rank, uint64_t inc, const char *where,
                 tcp_peer_t **out) {
  tcp_peer_t *p = ctx->peers[rank];
  if (p) {
    pthread_mutex_lock(&p->mu);
    int busy = p->connecting, held = p->connected, dead = p->dead;
    uint64_t pinc = p->inc;
    pthread_mutex_unlock(&p->mu);
    if (busy)
      return TCP_ERR(ctx, MEP_ERR_INVALID,
                     "tcp: connect to rank %d at %s: another connect to "
                     "that rank is in progress", rank, where);
    if (held && !dead && pinc == inc) return *out = p, 1;
    if (held)
      return TCP_ERR(ctx, dead ? MEP_ERR_PEER_FAILED : MEP_ERR_INVALID,
                     "tcp: connect to rank %d at %s: the endpoint of its "
                     "earlier connection %s; close it first", rank, where,
                     dead ? "failed and is not closed yet"
                          : "(another process) is still open");
    if (dead || pinc != inc) {
      TCP_LOG(ctx, MEP_LOG_DEBUG, "tcp: rank %d drops the connections rank "
              "%d's incarnation %#llx made before connect(): %s", ctx->rank,
              rank, (unsigned long long)pinc,
              dead ? "they failed" : "connect() names another incarnation");
      mep__tcp_peer_fail(p, MEP_ERR_PEER_FAILED, 0);
      mep__tcp_peer_retire(p, 0);
      mep__tcp_cq_forget(ctx, rank); /* its failure is not the new one's */
      p = NULL;
    }
  }
  mep__tcp_tomb_free(ctx, rank);
  if (!p && !(p = mep__tcp_peer_new(ctx, rank)))
    return TCP_ERR(ctx, MEP_ERR_NOMEM, "tcp: connect: out of memory");
  pthread_mutex_lock(&p->mu);
  p->inc = inc;
  p->inc_known = 1;
  p->connecting = 1;
  pthread_mutex_unlock(&p->mu);
  ctx->shut[rank] = 0;
  *out = p;
  return 0;
}

/* A connect() that failed leaves nothing behind: the peer's sockets are
 * closed, no completion names it (connect's answer says it all), and the
 * rank is shut until the next connect() for it. */
static void unclaim(tcp_ctx_t *ctx, tcp_peer_t *p) {
  int rank = p->rank;
  mep__tcp_peer_fail(p, MEP_ERR_PEER_FAILED, 0);
  pthread_mutex_lock(&ctx->poll_mu);
  pthread_mutex_lock(&ctx->mu);
  ctx->shut[rank] = 1;
  mep__tcp_peer_retire(p, 0);
  pthread_mutex_unlock(&ctx->mu);
  mep__tcp_cq_forget(ctx, rank);
  pthread_mutex_unlock(&ctx->poll_mu);
}

/*
 * The lower rank dials, the higher rank accepts. This cannot deadlock:
 * whoever is inside connect() (dialling or waiting) keeps accepting and
 * acknowledging every incoming connection, for any peer, and poll() does
 * so afterwards; a connection that arrives before its connect() call is
 * stashed in its peer's slot. So a dialler's wait ends as soon as its
 * target is in connect() or poll(), whatever it is doing there, and an
 * acceptor r waits only for a lower rank to reach its dial to r. Rank 0
 * waits on nobody as an acceptor; by induction on the rank, every lower
 * rank eventually dials, and no wait depends on a cycle. Calling connect
 * in increasing peer order is not even required for this.
 * Recovery: connect() to a rank whose ep was closed connects to the
 * process the blob names, a replacement. Its dial may come before this
 * side dropped the old connection or called connect(): it is refused for
 * now and retried (accept.c, dial.c), so either side may be first.
 */
static int tcp_connect(mep_tp_ctx_t *ctxp, int peer, const void *blob,
                       size_t len, mep_tp_ep_t **ep) {
  tcp_ctx_t *ctx = ctxp;
  if (!ctx || !ep) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
    return TCP_ERR(ctx, MEP_ERR_INVALID,
                   "tcp: connect from rank %d to rank %d in a group of %d",
                   ctx->rank, peer, ctx->size);
  mep__tcp_addr_t a;
  char why[128];
  if (mep__tcp_addr_decode(blob, len, &a, why, sizeof why))
    return TCP_ERR(ctx, MEP_ERR_PROTOCOL, "tcp: connect to rank %d: %s",
                   peer, why);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(a.port)};
  memcpy(&to.sin_addr, a.ip, 4);
  char where[64];
  mep__tcp_fmt_addr(&to, where, sizeof where);
  tcp_peer_t *p = NULL;
  pthread_mutex_lock(&ctx->poll_mu);
  pthread_mutex_lock(&ctx->mu);
  int rc = claim(ctx, peer, a.incarnation, where, &p);
  pthread_mutex_unlock(&ctx->mu);
  pthread_mutex_unlock(&ctx->poll_mu);
  if (rc < 0) return rc;
  if (rc > 0) return *ep = p, 0;
  int64_t deadline = mep__tcp_now_ms() + ctx->timeout_ms;
  rc = ctx->rank < peer ? mep__tcp_dial(ctx, p, &a, deadline)
                        : await_dialler(ctx, p, deadline);
  if (rc) {
    unclaim(ctx, p);
    return rc;
  }
  pthread_mutex_lock(&p->mu);
  p->connected = 1;
  p->connecting = 0;
  pthread_mutex_unlock(&p->mu);
  *ep = p;
  return 0;
}

static void dispatch(tcp_ctx_t *ctx, const struct epoll_event *ev) {
  tcp_src_t *src = ev->data.ptr;
  switch (src->kind) {
  case TCP_SRC_LISTEN:
  case TCP_SRC_HANDSHAKE:
    mep__tcp_accept_pump(ctx);
    break;
  case TCP_SRC_SOCK: {
    tcp_sock_t *s = (tcp_sock_t *)(void *)src;
    if (ev->events & EPOLLOUT) mep__tcp_on_writable(s);
    if (ev->events & (EPOLLIN | EPOLLERR | EPOLLHUP)) mep__tcp_on_readable(s);
    break;
  }
  case TCP_SRC_RX:
    mep__tcp_on_rx_done(ctx);
    break;
  default: /* the completion eventfd: drained by cq_pop */
    break;
  }
}

static int tcp_poll(mep_tp_ctx_t *ctxp, mep_tp_completion_t *out, int max) {
  tcp_ctx_t *ctx = ctxp;
  if (!ctx || max < 0 || (max > 0 && !out)) return MEP_ERR_INVALID;
  pthread_mutex_lock(&ctx->poll_mu);
  mep__tcp_reap(ctx);
  mep__tcp_flush_lazy(ctx);
  struct epoll_event evs[64];
  int n = epoll_wait(ctx->epfd, evs, 64, 0);
  for (int i = 0; i < n; i++) dispatch(ctx, &evs[i]);
  /* a connection that never finishes its hello is dropped at its
   * deadline even when nothing else happens on it */
  if (__atomic_load_n(&ctx->nhs, __ATOMIC_RELAXED) &&
      mep__tcp_now_ms() >=
          __atomic_load_n(&ctx->hs_next_deadline, __ATOMIC_RELAXED))
    mep__tcp_accept_pump(ctx);
  mep__tcp_reap(ctx);
  pthread_mutex_unlock(&ctx->poll_mu);
  return max > 0 ? mep__tcp_cq_pop(ctx, out, max) : 0;
}

__attribute__((visibility("default"))) const mep_transport_t
    mep_transport_plugin_v1 = {
        .abi_major = MEP_TRANSPORT_ABI_MAJOR,
        .abi_minor = MEP_TRANSPORT_ABI_MINOR,
        .struct_size = sizeof(mep_transport_t),
        .name = "tcp",
        .version = "1.1",
        .init = tcp_init,
        .props = tcp_props,
        .address = tcp_address,
        .reachable = tcp_reachable,
        .connect = tcp_connect,
        .reg = mep__tcp_reg,
        .dereg = mep__tcp_dereg,
        .import = mep__tcp_import,
        .unimport = mep__tcp_unimport,
        .write = mep__tcp_write,
        .signal = mep__tcp_signal,
        .poll = tcp_poll,
        .device_descriptor = NULL,
        .close = mep__tcp_close,
        .fini = tcp_fini,
        .config_keys = mep__tcp_keys,
        .config_nkeys = MEP_TCP_NKEYS,
};
