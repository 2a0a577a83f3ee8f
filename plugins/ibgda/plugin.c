/*
 * plugin.c - the ibgda transport's vtable: init (backend choice), props,
 * address, reachable, fini. See ibgda.h for the design, model.h for the
 * software NIC, docs/ibgda.md for what is proven and what is not.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "entry.h"
#include "ibgda.h"

#define IBGDA_DEFAULT_TIMEOUT_MS 30000

/* In a forked child (fork_watch.h): the bootstrap listener, the
 * connections pending on it and each endpoint's liveness socket. */
static void let_go_all(void *arg, int dead) {
  ibgda_ctx_t *ctx = arg;
  mep__rdma_boot_let_go(&ctx->boot, dead);
  for (int r = 0; r < ctx->size; r++)
    if (ctx->peers[r]) mep__fork_let_go(ctx->peers[r]->link_fd, dead);
}

static int ibgda_fini(mep_tp_ctx_t *ctxp) {
  ibgda_ctx_t *ctx = ctxp;
  if (!ctx) return 0;
  mep__fork_unwatch(&ctx->fork);
  for (int r = 0; ctx->peers && r < ctx->size; r++) {
    ibgda_ep_t *ep = ctx->peers[r];
    if (!ep) continue;
    pthread_mutex_lock(&ep->mu);
    if (!ep->retired) mep__ibgda_ep_fail(ep, MEP_ERR_CLOSED, 0);
    pthread_mutex_unlock(&ep->mu);
    mep__ibgda_ep_free(ep);
  }
  mep__rdma_boot_close(&ctx->boot);
  mep__ibgda_gpu_close(ctx);
  if (ctx->model_open) {
    if (ctx->sink_key) mep__m5_dereg(&ctx->model, ctx->sink_key);
    mep__m5_close(&ctx->model);
  }
  mep__ibgda_hw_close(ctx);
  free(ctx->sink);
  free(ctx->peers);
  free(ctx->cq);
  pthread_mutex_destroy(&ctx->mu);
  pthread_mutex_destroy(&ctx->cq_mu);
  free(ctx);
  return 0;
}

/* The model's start: its thread, and the FETCH_AND_ADD sink's key. */
static int open_model(ibgda_ctx_t *ctx, ibgda_addr_t *a) {
  a->pid = (uint32_t)getpid();
  if (mep__ibgda_host_ids(a->boot_id, &a->pidns))
    return IBGDA_ERR(ctx, MEP_ERR_UNAVAILABLE, "ibgda: model: this host's "
                     "boot id or PID namespace is unreadable (/proc)");
  /* Peers write into this process with process_vm_writev; under Yama's
   * ptrace_scope 1 only a declared tracer may (no-op without Yama). */
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  int rc = mep__m5_open(&ctx->model, ctx->env, ctx->rank);
  if (rc) return rc;
  ctx->model_open = 1;
  a->keys = (uint64_t)(uintptr_t)ctx->model.keys;
  return mep__m5_reg(&ctx->model, ctx->sink, 8, &ctx->sink_key);
}

/* The backend, then the bootstrap listener and the address blob. */
static int open_backend(ibgda_ctx_t *ctx) {
  ibgda_addr_t a = {.backend = (uint8_t)(ctx->cfg.backend ==
                                                 IBGDA_BACKEND_MODEL
                                             ? IBGDA_BACKEND_MODEL
                                             : IBGDA_BACKEND_DEVICE)};
  ctx->sink = aligned_alloc(64, 64);
  if (!ctx->sink) return MEP_ERR_NOMEM;
  memset(ctx->sink, 0, 64);
  int rc = a.backend == IBGDA_BACKEND_MODEL ? open_model(ctx, &a)
                                            : mep__ibgda_hw_open(ctx);
  if (rc) return rc;
  mep__rdma_boot_t *b = &ctx->boot;
  b->env = ctx->env;
  b->name = "ibgda";
  b->timeout_ms = ctx->timeout_ms;
  b->inc = ctx->inc;
  mep__rdma_boot_opts_t o = {.ifname = ctx->cfg.boot_ifname,
                             .port_lo = ctx->cfg.port_lo,
                             .port_hi = ctx->cfg.port_hi};
  rc = mep__rdma_boot_open(b, &o);
  if (rc) return rc;
  mep__rdma_boot_self(b, &a.boot);
  mep__ibgda_addr_encode(ctx->addr, &a);
  ctx->addr_len = MEP_IBGDA_ADDR_LEN;
  return 0;
}

static int ibgda_init(const mep_tp_env_t *env, mep_tp_ctx_t **out) {
  if (!out || !mep__tp_env_ok(env)) return MEP_ERR_INVALID;
  if (env->rank < 0 || env->size <= 0 || env->rank >= env->size) {
    env->set_error("ibgda: init: rank %d in a group of %d", env->rank,
                   env->size);
    return MEP_ERR_INVALID;
  }
  if (env->secret_len > MEP_RDMA_MAX_SECRET ||
      (env->secret_len && !env->secret)) {
    env->set_error("ibgda: init: a job secret of %zu bytes (at most %d, "
                   "and not NULL)", env->secret_len, MEP_RDMA_MAX_SECRET);
    return MEP_ERR_INVALID;
  }
  ibgda_cfg_t cfg;
  int rc = mep__ibgda_cfg_read(env, &cfg);
  if (rc) return rc;
  /* auto is device: the model is for tests and never chosen silently */
  if (cfg.backend != IBGDA_BACKEND_MODEL) {
    rc = mep__ibgda_probe_device(env, &cfg);
    if (rc) return rc;
  }
  ibgda_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    env->set_error("ibgda: init: out of memory");
    return MEP_ERR_NOMEM;
  }
  ctx->env = env;
  ctx->cfg = cfg;
  ctx->rank = env->rank;
  ctx->size = env->size;
  ctx->timeout_ms = env->timeout_ms > 0 ? env->timeout_ms
                                        : IBGDA_DEFAULT_TIMEOUT_MS;
  ctx->inc = mep__tp_incarnation(ctx);
  pthread_mutex_init(&ctx->mu, NULL);
  pthread_mutex_init(&ctx->cq_mu, NULL);
  ctx->peers = calloc((size_t)env->size, sizeof *ctx->peers);
  rc = ctx->peers ? open_backend(ctx) : MEP_ERR_NOMEM;
  if (!rc) {
    ctx->fork = (mep__fork_watch_t){.locks = {&ctx->mu, &ctx->boot.mu},
                                    .let_go_all = let_go_all,
                                    .arg = ctx};
    if (mep__fork_watch(&ctx->fork))
      rc = IBGDA_ERR(ctx, MEP_ERR_SYSTEM, "ibgda: installing the fork "
                     "handlers failed (out of memory)");
  }
  if (rc) {
    if (rc == MEP_ERR_NOMEM)
      env->set_error("ibgda: init: out of memory for %d peers", env->size);
    ibgda_fini(ctx);
    return rc;
  }
  if (ctx->hw)
    IBGDA_LOG(ctx, MEP_LOG_INFO, "ibgda: rank %d: backend = device: %s "
              "port %u (this path was built against mlx5dv.h and has not "
              "run on a ConnectX: docs/ibgda.md)", ctx->rank, ctx->dev.name,
              ctx->dev.port);
  else
    IBGDA_LOG(ctx, MEP_LOG_INFO, "ibgda: rank %d: backend = model: the "
              "software model of an mlx5 NIC serves the queues (no "
              "ConnectX in use)", ctx->rank);
  *out = ctx;
  return 0;
}

static int ibgda_props(mep_tp_ctx_t *ctxp, mep_tp_props_t *props) {
  ibgda_ctx_t *ctx = ctxp;
  if (!ctx || !props) return MEP_ERR_INVALID;
  /* over the model its own cost (docs/ibgda.md), not a NIC's; on a NIC
   * its port's rate */
  mep_tp_props_t full = {
      .mem_kinds = MEP_TP_MEM_HOST,
      .dev_kind = MEP_DEV_MLX5,
      /* the model's FETCH_AND_ADD is not atomic (model.h) */
      .atomics = ctx->hw && ctx->dev.atomics,
      .max_message = 0,
      .latency_us = ctx->hw ? 2.0 : 20.0,
      .bandwidth_gbps = ctx->hw ? ctx->dev.gbps : 2.0,
      .event_fd = -1,
  };
  mep__tp_props_put(props, &full);
  return 0;
}

static int ibgda_address(mep_tp_ctx_t *ctxp, void *buf, size_t *len) {
  ibgda_ctx_t *ctx = ctxp;
  if (!ctx || !buf || !len) return MEP_ERR_INVALID;
  if (*len < ctx->addr_len)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: address: the buffer has "
                     "%zu bytes, the address needs %zu", *len, ctx->addr_len);
  memcpy(buf, ctx->addr, ctx->addr_len);
  *len = ctx->addr_len;
  return 0;
}

/* Both sides on the same backend; the model reaches processes of this
 * kernel and PID namespace only. The same answer from both sides, as both
 * compare the same fields. */
static int ibgda_reachable(mep_tp_ctx_t *ctxp, int peer, const void *blob,
                           size_t len, char *why, size_t why_len) {
  ibgda_ctx_t *ctx = ctxp;
  if (!ctx) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: reachable: rank %d in a "
                     "group of %d", peer, ctx->size);
  ibgda_addr_t me, them;
  if (mep__ibgda_addr_decode(blob, len, &them, why, why_len)) return 0;
  mep__ibgda_addr_decode(ctx->addr, ctx->addr_len, &me, NULL, 0);
  if (me.backend != them.backend) {
    mep__rdma_why(why, why_len, 0, "rank %d's ibgda runs the %s backend, "
                  "this rank's the %s", peer,
                  them.backend == IBGDA_BACKEND_MODEL ? "model" : "device",
                  me.backend == IBGDA_BACKEND_MODEL ? "model" : "device");
    return 0;
  }
  if (me.backend == IBGDA_BACKEND_DEVICE) return 1;
  if (memcmp(me.boot_id, them.boot_id, 16) || me.pidns != them.pidns) {
    mep__rdma_why(why, why_len, 0, "other host: the software model of the "
                  "NIC reaches processes of its own host only");
    return 0;
  }
  return 1;
}

__attribute__((visibility("default"))) const mep_transport_t
    mep_transport_plugin_v1 = {
        .abi_major = MEP_TRANSPORT_ABI_MAJOR,
        .abi_minor = MEP_TRANSPORT_ABI_MINOR,
        .struct_size = sizeof(mep_transport_t),
        .name = "ibgda",
        .version = "0.2 (mlx5 queues verified against a software model of "
                   "the NIC and mlx5dv.h; not run on a ConnectX NIC)",
        .init = ibgda_init,
        .props = ibgda_props,
        .address = ibgda_address,
        .reachable = ibgda_reachable,
        .connect = mep__ibgda_connect,
        .reg = mep__ibgda_reg,
        .dereg = mep__ibgda_dereg,
        .import = mep__ibgda_import,
        .unimport = mep__ibgda_unimport,
        .write = mep__ibgda_write,
        .signal = mep__ibgda_signal,
        .poll = mep__ibgda_poll,
        .device_descriptor = mep__ibgda_device_descriptor,
        .close = mep__ibgda_close,
        .fini = ibgda_fini,
        .config_keys = mep__ibgda_keys,
        .config_nkeys = MEP_IBGDA_NKEYS,
        .device_region = mep__ibgda_device_region,
        .device_local = mep__ibgda_device_local,
};
