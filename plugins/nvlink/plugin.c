/*
 * plugin.c - the nvlink transport's entry points and its exported vtable.
 *
 * One context per communicator: the GPU current at init, one non-blocking
 * stream for every copy and signal, an event per write in flight. See
 * nvlink.h for the model, the locks, and what happens when a peer dies
 * (CUDA IPC tells nothing; the core's probes find it).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "entry.h"
#include "nvlink.h"

const mep_tp_cfg_key_t mep__nvl_keys[MEP_NVL_NKEYS] = {
    {"enable", MEP_TP_CFG_BOOL, 0, 0, "1", NULL,
     "0 turns the nvlink transport (CUDA IPC between GPUs of one host) "
     "off."},
    {"enable_peer_access", MEP_TP_CFG_BOOL, 0, 0, "1", NULL,
     "1 enables CUDA peer access between the GPUs of connected ranks "
     "(needed for kernels to load from a peer GPU's memory)."},
};

/* [nvlink] enable = 0 turns the transport off (MEP_ERR_UNAVAILABLE). */
static int cfg_read(const mep_tp_env_t *env, nvl_ctx_t *ctx) {
  int64_t on, access;
  int rc = mep__tp_env_typed(env, MEP_NVL_NAME);
  if (!rc) rc = env->cfg_int(env, "enable", &on);
  if (!rc) rc = env->cfg_int(env, "enable_peer_access", &access);
  if (rc) return rc;
  if (!on) {
    env->set_error("nvlink: turned off ([nvlink] enable = %s)",
                   env->cfg_str(env, "enable"));
    return MEP_ERR_UNAVAILABLE;
  }
  ctx->peer_access = (int)access;
  return 0;
}

static void ep_free(nvl_ep_t *ep) { free(ep); }

static int nvl_close(mep_tp_ep_t *epp) {
  nvl_ep_t *ep = epp;
  if (!ep) return MEP_ERR_INVALID;
  nvl_ctx_t *ctx = ep->ctx;
  pthread_mutex_lock(&ctx->mu);
  if (ep->closed) {
    pthread_mutex_unlock(&ctx->mu);
    return 0;
  }
  ep->closed = 1;
  mep__nvl_ops_orphan(ctx, ep);
  nvl_rmr_t *left = ep->rmrs;
  ep->rmrs = NULL;
  pthread_mutex_unlock(&ctx->mu);
  /* the core unimports first; whatever it left is released here */
  if (left) {
    int saved;
    if (!mep__nvl_enter(ctx, &saved)) {
      mep__nvl_rmrs_release(ctx, left);
      mep__nvl_leave(ctx, saved);
    }
  }
  return 0;
}

static int nvl_fini(mep_tp_ctx_t *ctxp) {
  nvl_ctx_t *ctx = ctxp;
  if (!ctx) return 0;
  for (int r = 0; ctx->eps && r < ctx->size; r++)
    if (ctx->eps[r]) {
      nvl_close(ctx->eps[r]);
      ep_free(ctx->eps[r]);
    }
  free(ctx->eps);
  int saved = -1, in = ctx->stream && !mep__nvl_enter(ctx, &saved);
  if (in) mep__nvl_drain(ctx, "fini");
  mep__nvl_mrs_free(ctx);
  mep__nvl_ops_free(ctx);
  if (ctx->stream) (void)cudaStreamDestroy(ctx->stream);
  if (in) mep__nvl_leave(ctx, saved);
  pthread_mutex_destroy(&ctx->mu);
  free(ctx);
  return 0;
}

/* The part of init that needs the GPU; ctx->dev is current. */
static int ctx_open(nvl_ctx_t *ctx) {
  char why[160];
  if (mep__nvl_identity(ctx->dev, &ctx->self, why, sizeof why))
    return NVL_ERR(ctx, MEP_ERR_UNAVAILABLE, "nvlink: rank %d: GPU %d: %s",
                   ctx->rank, ctx->dev, why);
  cudaError_t e = cudaStreamCreateWithFlags(&ctx->stream,
                                            cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    ctx->stream = NULL;
    return NVL_ERR(ctx, MEP_ERR_UNAVAILABLE, "nvlink: rank %d: "
                   "cudaStreamCreateWithFlags on GPU %d: %s", ctx->rank,
                   ctx->dev, cudaGetErrorString(e));
  }
  return 0;
}

static int nvl_init(const mep_tp_env_t *env, mep_tp_ctx_t **out) {
  if (!out || !mep__tp_env_ok(env)) return MEP_ERR_INVALID;
  if (env->rank < 0 || env->size <= 0 || env->rank >= env->size) {
    env->set_error("nvlink: init: rank %d in a group of %d", env->rank,
                   env->size);
    return MEP_ERR_INVALID;
  }
  int n = 0, dev = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    env->set_error("nvlink: no CUDA device (cudaGetDeviceCount: %s)",
                   e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return MEP_ERR_UNAVAILABLE;
  }
  if ((e = cudaGetDevice(&dev)) != cudaSuccess) {
    env->set_error("nvlink: no usable CUDA device (cudaGetDevice: %s)",
                   cudaGetErrorString(e));
    return MEP_ERR_UNAVAILABLE;
  }
  nvl_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    env->set_error("nvlink: init: out of memory");
    return MEP_ERR_NOMEM;
  }
  ctx->env = env;
  ctx->rank = env->rank;
  ctx->size = env->size;
  ctx->dev = dev;
  ctx->timeout_ms = env->timeout_ms > 0 ? env->timeout_ms
                                        : NVL_DEFAULT_TIMEOUT_MS;
  pthread_mutex_init(&ctx->mu, NULL);
  const char *host = env->host_id ? env->host_id : "";
  ctx->self.host = mep__nvl_hash(host, strlen(host), 0xcbf29ce484222325ull);
  ctx->self.nonce = mep__tp_incarnation(ctx);
  ctx->self.pid = (uint32_t)getpid();
  int rc = cfg_read(env, ctx);
  if (!rc && !(ctx->eps = calloc((size_t)env->size, sizeof *ctx->eps)))
    rc = NVL_ERR(ctx, MEP_ERR_NOMEM, "nvlink: init: out of memory for %d "
                 "peers", env->size);
  if (!rc) rc = ctx_open(ctx);
  if (rc) {
    nvl_fini(ctx);
    return rc;
  }
  *out = ctx;
  return 0;
}

static int nvl_props(mep_tp_ctx_t *ctxp, mep_tp_props_t *props) {
  if (!ctxp || !props) return MEP_ERR_INVALID;
  mep_tp_props_t full = {
      .mem_kinds = MEP_TP_MEM_CUDA,
      .dev_kind = MEP_DEV_PTR,
      .atomics = 1,
      .max_message = 0,
      /* estimates, not measurements: a cudaMemcpyAsync + event round trip
       * costs a few microseconds; NVLink 4 copies run at a few hundred
       * GB/s per direction */
      .latency_us = 5.0,
      .bandwidth_gbps = 300.0,
      .event_fd = -1,
  };
  mep__tp_props_put(props, &full);
  return 0;
}

static int nvl_address(mep_tp_ctx_t *ctxp, void *buf, size_t *len) {
  nvl_ctx_t *ctx = ctxp;
  if (!ctx || !buf || !len) return MEP_ERR_INVALID;
  if (*len < NVL_ADDR_LEN)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: address: the buffer has "
                   "%zu bytes, the address needs %d", *len, NVL_ADDR_LEN);
  mep__nvl_addr_encode(buf, &ctx->self);
  *len = NVL_ADDR_LEN;
  return 0;
}

static void say(char *why, size_t why_len, const char *fmt, ...)
    MEP_PRINTF(3, 4);
static void say(char *why, size_t why_len, const char *fmt, ...) {
  if (!why || !why_len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, why_len, fmt, ap);
  va_end(ap);
}

/* Everything compared here is computed alike on both sides: the host and
 * GPU identities come from the blobs, and peer access between two GPUs is
 * asked only when both processes see the same set of GPUs. */
static int reach(nvl_ctx_t *ctx, int peer, const nvl_addr_t *a, char *why,
                 size_t why_len) {
  const nvl_addr_t *me = &ctx->self;
  if (a->host != me->host)
    return say(why, why_len, "other host"), 0;
  if (!memcmp(a->uuid, me->uuid, sizeof me->uuid)) return 1;
  if (a->visible != me->visible)
    return say(why, why_len, "rank %d and rank %d see different sets of GPUs "
               "(CUDA_VISIBLE_DEVICES differs), so neither can tell whether "
               "GPU %s and GPU %s reach each other", ctx->rank, peer,
               me->busid, a->busid), 0;
  int pd = -1, ab = 0, ba = 0;
  cudaError_t e = cudaDeviceGetByPCIBusId(&pd, a->busid);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return say(why, why_len, "GPU %s of rank %d is not visible to rank %d "
               "(cudaDeviceGetByPCIBusId: %s)", a->busid, peer, ctx->rank,
               cudaGetErrorString(e)), 0;
  }
  if (cudaDeviceCanAccessPeer(&ab, ctx->dev, pd) != cudaSuccess ||
      cudaDeviceCanAccessPeer(&ba, pd, ctx->dev) != cudaSuccess) {
    (void)cudaGetLastError();
    ab = ba = 0;
  }
  if (!ab)
    return say(why, why_len, "GPU %s cannot access GPU %s", me->busid,
               a->busid), 0;
  if (!ba)
    return say(why, why_len, "GPU %s cannot access GPU %s", a->busid,
               me->busid), 0;
  return 1;
}

static int nvl_reachable(mep_tp_ctx_t *ctxp, int peer, const void *blob,
                         size_t len, char *why, size_t why_len) {
  nvl_ctx_t *ctx = ctxp;
  if (!ctx) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: reachable: rank %d in a "
                   "group of %d", peer, ctx->size);
  nvl_addr_t a;
  char bad[160];
  if (mep__nvl_addr_decode(blob, len, &a, bad, sizeof bad))
    return say(why, why_len, "%s", bad), 0;
  int saved, rc = mep__nvl_enter(ctx, &saved);
  if (rc) return rc;
  rc = reach(ctx, peer, &a, why, why_len);
  mep__nvl_leave(ctx, saved);
  return rc;
}

/* ctx->dev current. Peer access lets our kernels and copies reach the
 * peer's GPU through mapped pointers; "already enabled" is fine. */
static int enable_peer(nvl_ctx_t *ctx, int peer, int pd) {
  cudaError_t e = cudaDeviceEnablePeerAccess(pd, 0);
  if (e == cudaSuccess) return 0;
  (void)cudaGetLastError();
  if (e == cudaErrorPeerAccessAlreadyEnabled) return 0;
  return NVL_ERR(ctx, MEP_ERR_SYSTEM, "nvlink: connect to rank %d: "
                 "cudaDeviceEnablePeerAccess from GPU %d to GPU %d: %s",
                 peer, ctx->dev, pd, cudaGetErrorString(e));
}

/* ctx->mu held. The ep connect() returns: an open one for the same process,
 * or a new one (the closed ep of an earlier process of the rank is gone). */
static int claim(nvl_ctx_t *ctx, int peer, const nvl_addr_t *a,
                 nvl_ep_t **out) {
  nvl_ep_t *old = ctx->eps[peer];
  if (old && !old->closed) {
    if (old->nonce == a->nonce) return *out = old, 1;
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: connect to rank %d: the "
                   "endpoint of its earlier process is still open; close it "
                   "first", peer);
  }
  nvl_ep_t *ep = calloc(1, sizeof *ep);
  if (!ep)
    return NVL_ERR(ctx, MEP_ERR_NOMEM, "nvlink: connect: out of memory");
  ep_free(old);
  ep->ctx = ctx;
  ep->rank = peer;
  ep->nonce = a->nonce;
  ep->peer_dev = -1;
  ep->closed = 1; /* until connect() finishes */
  ctx->eps[peer] = ep;
  *out = ep;
  return 0;
}

/* No wire protocol: the keys travel through the core's store, so connect
 * only records the peer and opens the way to its GPU. */
static int nvl_connect(mep_tp_ctx_t *ctxp, int peer, const void *blob,
                       size_t len, mep_tp_ep_t **epp) {
  nvl_ctx_t *ctx = ctxp;
  if (!ctx || !epp) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: connect from rank %d to "
                   "rank %d in a group of %d", ctx->rank, peer, ctx->size);
  nvl_addr_t a;
  char why[256];
  if (mep__nvl_addr_decode(blob, len, &a, why, sizeof why))
    return NVL_ERR(ctx, MEP_ERR_PROTOCOL, "nvlink: connect to rank %d: %s",
                   peer, why);
  int saved, rc = mep__nvl_enter(ctx, &saved);
  if (rc) return rc;
  if (reach(ctx, peer, &a, why, sizeof why) != 1) {
    mep__nvl_leave(ctx, saved);
    return NVL_ERR(ctx, MEP_ERR_UNREACHABLE, "nvlink: connect to rank %d: "
                   "%s", peer, why);
  }
  int pd = -1;
  if (memcmp(a.uuid, ctx->self.uuid, sizeof a.uuid) &&
      cudaDeviceGetByPCIBusId(&pd, a.busid) != cudaSuccess) {
    (void)cudaGetLastError();
    pd = -1;
  }
  nvl_ep_t *ep = NULL;
  pthread_mutex_lock(&ctx->mu);
  rc = claim(ctx, peer, &a, &ep);
  pthread_mutex_unlock(&ctx->mu);
  if (rc > 0) {
    mep__nvl_leave(ctx, saved);
    return *epp = ep, 0;
  }
  if (!rc && pd >= 0 && ctx->peer_access) rc = enable_peer(ctx, peer, pd);
  mep__nvl_leave(ctx, saved);
  if (rc) return rc; /* a claimed ep stays closed: a later connect reuses */
  pthread_mutex_lock(&ctx->mu);
  ep->peer_dev = pd;
  ep->closed = 0;
  pthread_mutex_unlock(&ctx->mu);
  *epp = ep;
  return 0;
}

__attribute__((visibility("default"))) const mep_transport_t
    mep_transport_plugin_v1 = {
        .abi_major = MEP_TRANSPORT_ABI_MAJOR,
        .abi_minor = MEP_TRANSPORT_ABI_MINOR,
        .struct_size = sizeof(mep_transport_t),
        .name = MEP_NVL_NAME,
        .version = "1.0",
        .init = nvl_init,
        .props = nvl_props,
        .address = nvl_address,
        .reachable = nvl_reachable,
        .connect = nvl_connect,
        .reg = mep__nvl_reg,
        .dereg = mep__nvl_dereg,
        .import = mep__nvl_import,
        .unimport = mep__nvl_unimport,
        .write = mep__nvl_write,
        .signal = mep__nvl_signal,
        .poll = mep__nvl_poll,
        .device_descriptor = mep__nvl_device_descriptor,
        .close = nvl_close,
        .fini = nvl_fini,
        .map = mep__nvl_map,
        .config_keys = mep__nvl_keys,
        .config_nkeys = MEP_NVL_NKEYS,
        .device_region = mep__nvl_device_region,
};
