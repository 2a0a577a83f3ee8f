/*
 * plugin.c - the verbs transport's context (init, fini, props, address,
 * reachable) and its exported vtable.
 *
 * RDMA over libibverbs (rdma-core), CPU-initiated: RDMA WRITE for puts,
 * WRITE or FETCH_AND_ADD for signals, RC queue pairs set up through a
 * small authenticated TCP bootstrap (handshake.h). GPU kernels reach its
 * peers through the core's proxy (props.dev_kind is MEP_DEV_NONE).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "entry.h"
#include "verbs.h"

#define VERBS_DEFAULT_TIMEOUT_MS 30000

static int watch(verbs_ctx_t *ctx, int fd, verbs_src_t *src, int kind) {
  src->kind = kind;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = src};
  return epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev);
}

/* The epoll set the core may sleep on, and the scratch words. */
static int open_fds(verbs_ctx_t *ctx) {
  ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
  ctx->cqfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ctx->epfd < 0 || ctx->cqfd < 0 ||
      watch(ctx, ctx->dev.chan->fd, &ctx->chan_src, VERBS_SRC_CHAN) ||
      watch(ctx, ctx->dev.ib->async_fd, &ctx->async_src, VERBS_SRC_ASYNC) ||
      watch(ctx, ctx->cqfd, &ctx->cq_src, VERBS_SRC_CQ))
    return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: creating the epoll set or "
                     "eventfd failed");
  ctx->scratch = aligned_alloc(64, 64);
  if (ctx->scratch) memset(ctx->scratch, 0, 64);
  ctx->scratch_mr = ctx->scratch
                        ? ibv_reg_mr(ctx->dev.pd, ctx->scratch, 64,
                                     IBV_ACCESS_LOCAL_WRITE |
                                         IBV_ACCESS_REMOTE_WRITE)
                        : NULL;
  if (!ctx->scratch_mr)
    return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: registering 64 bytes of "
                     "scratch memory with %s failed", ctx->dev.name);
  return 0;
}

/* Limits the device imposes on the configuration. */
static void fit_device(verbs_ctx_t *ctx) {
  if (ctx->dev.max_qp_wr > 0 && ctx->cfg.sq_depth > ctx->dev.max_qp_wr) {
    VERBS_LOG(ctx, MEP_LOG_WARN, "verbs: [verbs] send_queue = %d is more "
              "than %s allows; using %d", ctx->cfg.sq_depth, ctx->dev.name,
              ctx->dev.max_qp_wr);
    ctx->cfg.sq_depth = ctx->dev.max_qp_wr;
    if (ctx->cfg.signal_every * 2 >= ctx->cfg.sq_depth)
      ctx->cfg.signal_every = ctx->cfg.sq_depth / 4 ? ctx->cfg.sq_depth / 4
                                                    : 1;
  }
}

static int open_boot(verbs_ctx_t *ctx) {
  mep__rdma_boot_t *b = &ctx->boot;
  b->env = ctx->env;
  b->name = "verbs";
  b->timeout_ms = ctx->timeout_ms;
  b->inc = ctx->inc;
  mep__rdma_boot_opts_t o = {
      .ifname = ctx->cfg.boot_ifname,
      .prefer = ctx->dev.has_ip ? &ctx->dev.ip : NULL,
      .port_lo = ctx->cfg.port_lo, .port_hi = ctx->cfg.port_hi};
  int rc = mep__rdma_boot_open(b, &o);
  if (rc) return rc;
  mep__verbs_addr_t a = {
      .link_layer = ctx->dev.link_layer, .port = ctx->dev.port,
      .mtu = ctx->dev.mtu, .prefix = ctx->dev.prefix, .lid = ctx->dev.lid,
      .fabric = mep__verbs_fabric_hash(ctx->cfg.fabric)};
  memcpy(a.gid, ctx->dev.gid, 16);
  mep__rdma_boot_self(b, &a.boot);
  mep__verbs_addr_encode(ctx->addr, &a);
  ctx->addr_len = MEP_VERBS_ADDR_LEN;
  return 0;
}

/* In a forked child (fork_watch.h): the bootstrap listener, the
 * connections pending on it and each endpoint's liveness socket, whose
 * end tells the peers this process died. The device's own files stay:
 * the peers' detection does not depend on them. */
static void let_go_all(void *arg, int dead) {
  verbs_ctx_t *ctx = arg;
  mep__rdma_boot_let_go(&ctx->boot, dead);
  for (int r = 0; r < ctx->size; r++)
    if (ctx->peers[r]) mep__fork_let_go(ctx->peers[r]->link_fd, dead);
}

static int watch_fork(verbs_ctx_t *ctx) {
  ctx->fork = (mep__fork_watch_t){
      .locks = {&ctx->poll_mu, &ctx->mu, &ctx->boot.mu},
      .let_go_all = let_go_all,
      .arg = ctx};
  if (mep__fork_watch(&ctx->fork))
    return VERBS_ERR(ctx, MEP_ERR_SYSTEM, "verbs: installing the fork "
                     "handlers failed (out of memory)");
  return 0;
}

static int verbs_fini(mep_tp_ctx_t *ctxp) {
  verbs_ctx_t *ctx = ctxp;
  if (!ctx) return 0;
  mep__fork_unwatch(&ctx->fork);
  for (int r = 0; ctx->peers && r < ctx->size; r++)
    if (ctx->peers[r]) mep__verbs_ep_retire(ctx->peers[r], 0);
  for (int r = 0; ctx->tombs && r < ctx->size; r++)
    mep__verbs_tomb_free(ctx, r);
  mep__rdma_boot_close(&ctx->boot);
  mep__verbs_regions_free(ctx);
  if (ctx->scratch_mr) ibv_dereg_mr(ctx->scratch_mr);
  free(ctx->scratch);
  mep__verbs_gpu_close(&ctx->gpu);
  mep__rdma_dev_close(&ctx->dev);
  if (ctx->epfd >= 0) close(ctx->epfd);
  if (ctx->cqfd >= 0) close(ctx->cqfd);
  free(ctx->peers);
  free(ctx->tombs);
  free(ctx->connecting);
  free(ctx->cq);
  pthread_mutex_destroy(&ctx->poll_mu);
  pthread_mutex_destroy(&ctx->mu);
  pthread_mutex_destroy(&ctx->cq_mu);
  pthread_mutex_destroy(&ctx->mr_mu);
  free(ctx);
  return 0;
}

static int verbs_init(const mep_tp_env_t *env, mep_tp_ctx_t **out) {
  if (!out || !mep__tp_env_ok(env)) return MEP_ERR_INVALID;
  if (env->rank < 0 || env->size <= 0 || env->rank >= env->size) {
    env->set_error("verbs: init: rank %d in a group of %d", env->rank,
                   env->size);
    return MEP_ERR_INVALID;
  }
  if (env->secret_len > MEP_RDMA_MAX_SECRET ||
      (env->secret_len && !env->secret)) {
    env->set_error("verbs: init: a job secret of %zu bytes (at most %d, "
                   "and not NULL)", env->secret_len, MEP_RDMA_MAX_SECRET);
    return MEP_ERR_INVALID;
  }
  verbs_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    env->set_error("verbs: init: out of memory");
    return MEP_ERR_NOMEM;
  }
  ctx->env = env;
  ctx->rank = env->rank;
  ctx->size = env->size;
  ctx->timeout_ms = env->timeout_ms > 0 ? env->timeout_ms
                                        : VERBS_DEFAULT_TIMEOUT_MS;
  ctx->epfd = ctx->cqfd = -1;
  ctx->inc = mep__tp_incarnation(ctx);
  pthread_mutex_init(&ctx->poll_mu, NULL);
  pthread_mutex_init(&ctx->mu, NULL);
  pthread_mutex_init(&ctx->cq_mu, NULL);
  pthread_mutex_init(&ctx->mr_mu, NULL);
  size_t n = (size_t)env->size;
  int rc = mep__verbs_cfg_read(env, &ctx->cfg);
  if (!rc) {
    mep__rdma_want_t w = {
        .env = env, .plugin = "verbs", .device = ctx->cfg.device,
        .port = ctx->cfg.port, .gid_index = ctx->cfg.gid_index,
        .channel = 1,
        .needs = "an RDMA NIC with its driver, or Soft-RoCE (rdma link add "
                 "rxe0 type rxe netdev ETH), is needed"};
    rc = mep__rdma_dev_open(&ctx->dev, &w);
  }
  if (!rc && (!(ctx->peers = calloc(n, sizeof *ctx->peers)) ||
              !(ctx->tombs = calloc(n, sizeof *ctx->tombs)) ||
              !(ctx->connecting = calloc(n, 1))))
    rc = VERBS_ERR(ctx, MEP_ERR_NOMEM, "verbs: init: out of memory for %d "
                   "peers", env->size);
  if (!rc) fit_device(ctx);
  if (!rc) rc = open_fds(ctx);
  if (!rc) rc = open_boot(ctx);
  if (!rc) mep__verbs_gpu_probe(ctx);
  if (!rc) rc = watch_fork(ctx);
  if (rc) {
    verbs_fini(ctx);
    return rc;
  }
  VERBS_LOG(ctx, MEP_LOG_DEBUG, "verbs: rank %d: %s port %u, GID index %d, "
            "MTU %s, %s", ctx->rank, ctx->dev.name, ctx->dev.port,
            ctx->dev.gid_index, mep__rdma_mtu_name(ctx->dev.mtu),
            ctx->dev.atomics ? "atomics" : "no atomics");
  *out = ctx;
  return 0;
}

static int verbs_props(mep_tp_ctx_t *ctxp, mep_tp_props_t *props) {
  verbs_ctx_t *ctx = ctxp;
  if (!ctx || !props) return MEP_ERR_INVALID;
  /* software devices (rxe, siw) as measured in docs/perf.md; a NIC by
   * its link rate */
  mep_tp_props_t full = {
      .mem_kinds = MEP_TP_MEM_HOST |
                   (ctx->gpu.mode != VERBS_GPU_NONE ? MEP_TP_MEM_CUDA : 0),
      .dev_kind = MEP_DEV_NONE,
      .atomics = ctx->dev.atomics,
      .max_message = 0,
      .latency_us = ctx->dev.software ? 10.0 : 2.0,
      .bandwidth_gbps = ctx->dev.software ? 1.0 : ctx->dev.gbps,
      .event_fd = ctx->epfd,
  };
  mep__tp_props_put(props, &full);
  return 0;
}

static int verbs_address(mep_tp_ctx_t *ctxp, void *buf, size_t *len) {
  verbs_ctx_t *ctx = ctxp;
  if (!ctx || !buf || !len) return MEP_ERR_INVALID;
  if (*len < ctx->addr_len)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: address: the buffer has "
                     "%zu bytes, the address needs %zu", *len, ctx->addr_len);
  memcpy(buf, ctx->addr, ctx->addr_len);
  *len = ctx->addr_len;
  return 0;
}

static int verbs_reachable(mep_tp_ctx_t *ctxp, int peer, const void *blob,
                           size_t len, char *why, size_t why_len) {
  verbs_ctx_t *ctx = ctxp;
  if (!ctx) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: reachable: rank %d in a "
                     "group of %d", peer, ctx->size);
  mep__verbs_addr_t me, them;
  if (mep__verbs_addr_decode(blob, len, &them, why, why_len)) return 0;
  mep__verbs_addr_decode(ctx->addr, ctx->addr_len, &me, NULL, 0);
  return mep__verbs_reach(&me, &them, why, why_len);
}

__attribute__((visibility("default"))) const mep_transport_t
    mep_transport_plugin_v1 = {
        .abi_major = MEP_TRANSPORT_ABI_MAJOR,
        .abi_minor = MEP_TRANSPORT_ABI_MINOR,
        .struct_size = sizeof(mep_transport_t),
        .name = "verbs",
        .version = "1.0",
        .init = verbs_init,
        .props = verbs_props,
        .address = verbs_address,
        .reachable = verbs_reachable,
        .connect = mep__verbs_connect,
        .reg = mep__verbs_reg,
        .dereg = mep__verbs_dereg,
        .import = mep__verbs_import,
        .unimport = mep__verbs_unimport,
        .write = mep__verbs_write,
        .signal = mep__verbs_signal,
        .poll = mep__verbs_poll,
        .device_descriptor = NULL,
        .close = mep__verbs_close,
        .fini = verbs_fini,
        .config_keys = mep__verbs_keys,
        .config_nkeys = MEP_VERBS_NKEYS,
};
