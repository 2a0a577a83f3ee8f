/* devfake.c - a transport that declares MEP_DEV_PTR descriptors over host
 * memory, for testing on a CPU how the core picks and uses the transport
 * that serves GPU kernels (devroute.c, devshare.c). It carries no bytes:
 * it is never a route (CUDA memory only), and its descriptors are data the
 * test checks, not addresses a kernel could use.
 *
 * Built twice, as "devfake" and "devfake2" (DEVFAKE_NAME), to show the core
 * takes either by what it declares. Environment, per process:
 *   DEVFAKE_NODESC=r1,r2  device_descriptor says MEP_ERR_UNREACHABLE for
 *                         those peers (each side names the other)
 *   DEVFAKE_KIND=none     declares MEP_DEV_NONE instead of MEP_DEV_PTR
 *   DEVFAKE_MLX5=NAME     the fake of that name declares MEP_DEV_MLX5 (its
 *                         peer part's qpn is the peer's rank; it registers
 *                         host memory too, and gives local parts)
 * Its region part's base (raddr for MLX5) is the registering process's
 * own address of the region (carried in the remote key), so a test can
 * see that the key of the right allocation travelled; an MLX5 key is the
 * owner's rank + DEVFAKE_KEY. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mep/transport.h"

#ifndef DEVFAKE_NAME
#define DEVFAKE_NAME "devfake"
#endif
#define DEVFAKE_KEY 1000u

static int is_mlx5(void) {
  const char *m = getenv("DEVFAKE_MLX5");
  return m && !strcmp(m, DEVFAKE_NAME);
}

typedef struct ctx {
  const mep_tp_env_t *env;
  int rank, size;
  int open[64];
} ctx_t;

typedef struct ep {
  ctx_t *ctx;
  int peer;
} ep_t;

typedef struct rkey {
  uint64_t base, len;
  int32_t owner;
} rkey_t;

static int listed(const char *var, int rank) {
  const char *s = getenv(var);
  for (; s && *s; s++) {
    char *end;
    long r = strtol(s, &end, 10);
    if (end != s && r == rank) return 1;
    s = end;
    if (!*s) break;
  }
  return 0;
}

static int f_init(const mep_tp_env_t *env, mep_tp_ctx_t **out) {
  if (env->size > 64) return MEP_ERR_UNAVAILABLE;
  ctx_t *c = calloc(1, sizeof *c);
  if (!c) return MEP_ERR_NOMEM;
  c->env = env;
  c->rank = env->rank;
  c->size = env->size;
  *out = c;
  return 0;
}

static int f_props(mep_tp_ctx_t *ctx, mep_tp_props_t *p) {
  (void)ctx;
  const char *k = getenv("DEVFAKE_KIND");
  mep_tp_props_t full = {.struct_size = p->struct_size,
                         .mem_kinds = MEP_TP_MEM_CUDA,
                         .dev_kind = k && !strcmp(k, "none") ? MEP_DEV_NONE
                                     : is_mlx5()              ? MEP_DEV_MLX5
                                                              : MEP_DEV_PTR,
                         .event_fd = -1};
  memcpy(p, &full, p->struct_size < sizeof full ? p->struct_size
                                                : sizeof full);
  return 0;
}

static int f_address(mep_tp_ctx_t *ctx, void *buf, size_t *len) {
  ctx_t *c = ctx;
  if (*len < 4) return MEP_ERR_INVALID;
  int32_t r = c->rank;
  memcpy(buf, &r, 4);
  *len = 4;
  return 0;
}

static int f_reachable(mep_tp_ctx_t *ctx, int peer, const void *blob,
                       size_t len, char *why, size_t why_len) {
  (void)ctx;
  int32_t r = -1;
  if (len == 4) memcpy(&r, blob, 4);
  if (r != peer) {
    snprintf(why, why_len, "blob of rank %d, not %d", r, peer);
    return 0;
  }
  return 1;
}

static int f_connect(mep_tp_ctx_t *ctx, int peer, const void *blob,
                     size_t len, mep_tp_ep_t **out) {
  (void)blob;
  (void)len;
  ctx_t *c = ctx;
  ep_t *e = calloc(1, sizeof *e);
  if (!e) return MEP_ERR_NOMEM;
  e->ctx = c;
  e->peer = peer;
  c->open[peer]++;
  *out = e;
  return 0;
}

static int f_reg(mep_tp_ctx_t *ctx, void *ptr, size_t len, mep_memkind_t kind,
                 mep_tp_mr_t **mr, void *rkey, size_t *rkey_len) {
  ctx_t *c = ctx;
  if ((kind != MEP_MEM_CUDA && !is_mlx5()) || *rkey_len < sizeof(rkey_t))
    return MEP_ERR_UNSUPPORTED;
  rkey_t k = {(uint64_t)(uintptr_t)ptr, len, c->rank};
  memcpy(rkey, &k, sizeof k);
  *rkey_len = sizeof k;
  rkey_t *m = malloc(sizeof *m);
  if (m) *m = k;
  *mr = m;
  return m ? 0 : MEP_ERR_NOMEM;
}

static int f_dereg(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr) {
  (void)ctx;
  free(mr);
  return 0;
}

static int f_import(mep_tp_ep_t *ep, const void *rkey, size_t len,
                    mep_tp_rmr_t **out) {
  ep_t *e = ep;
  rkey_t *k = malloc(sizeof *k);
  if (!k) return MEP_ERR_NOMEM;
  if (len != sizeof *k) {
    free(k);
    return MEP_ERR_PROTOCOL;
  }
  memcpy(k, rkey, sizeof *k);
  if (k->owner != e->peer) {
    e->ctx->env->set_error(DEVFAKE_NAME ": key of rank %d imported from "
                           "rank %d", k->owner, e->peer);
    free(k);
    return MEP_ERR_PROTOCOL;
  }
  *out = k;
  return 0;
}

static int f_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr) {
  (void)ep;
  free(rmr);
  return 0;
}

static int f_write(mep_tp_ep_t *ep, mep_tp_mr_t *mr, uint64_t loff,
                   mep_tp_rmr_t *rmr, uint64_t roff, uint64_t len,
                   uint64_t token) {
  (void)ep, (void)mr, (void)loff, (void)rmr, (void)roff, (void)len;
  (void)token;
  return MEP_ERR_UNSUPPORTED;
}

static int f_signal(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, uint64_t roff,
                    uint64_t value, mep_signal_op_t op) {
  (void)ep, (void)rmr, (void)roff, (void)value, (void)op;
  return MEP_ERR_UNSUPPORTED;
}

static int f_poll(mep_tp_ctx_t *ctx, mep_tp_completion_t *out, int max) {
  (void)ctx, (void)out, (void)max;
  return 0;
}

static int put(const void *part, size_t n, void *desc, size_t *len) {
  if (*len < n) return MEP_ERR_INVALID;
  memcpy(desc, part, n);
  *len = n;
  return 0;
}

static int f_descriptor(mep_tp_ctx_t *ctx, int peer, void *desc,
                        size_t *len) {
  ctx_t *c = ctx;
  if (listed("DEVFAKE_NODESC", peer)) {
    c->env->set_error(DEVFAKE_NAME ": rank %d is listed in DEVFAKE_NODESC",
                      peer);
    return MEP_ERR_UNREACHABLE;
  }
  if (is_mlx5()) {
    mep_dev_mlx5_peer_t m = {.hdr = {MEP_DEV_MLX5, MEP_DEV_MLX5_VERSION,
                                     sizeof m},
                             .qpn = (uint32_t)peer};
    return put(&m, sizeof m, desc, len);
  }
  mep_dev_ptr_peer_t d = {{MEP_DEV_PTR, MEP_DEV_PTR_VERSION, sizeof d},
                          peer, MEP_DEV_PTR_PEER_ACCESS};
  return put(&d, sizeof d, desc, len);
}

/* A key as the region part of its kind lays it out. */
static int region_part(const rkey_t *k, void *desc, size_t *len) {
  if (is_mlx5()) {
    mep_dev_mlx5_region_t m = {
        .hdr = {MEP_DEV_MLX5, MEP_DEV_MLX5_VERSION, sizeof m},
        .raddr = k->base, .len = k->len,
        .rkey = DEVFAKE_KEY + (uint32_t)k->owner};
    return put(&m, sizeof m, desc, len);
  }
  mep_dev_ptr_region_t d = {{MEP_DEV_PTR, MEP_DEV_PTR_VERSION, sizeof d},
                            k->base, k->len};
  return put(&d, sizeof d, desc, len);
}

static int f_region(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, void *desc,
                    size_t *len) {
  (void)ep;
  return region_part(rmr, desc, len);
}

static int f_local(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr, void *desc,
                   size_t *len) {
  (void)ctx;
  return region_part(mr, desc, len);
}

static int f_close(mep_tp_ep_t *ep) {
  ep_t *e = ep;
  e->ctx->open[e->peer]--;
  free(e);
  return 0;
}

static int f_fini(mep_tp_ctx_t *ctx) {
  ctx_t *c = ctx;
  /* every connection the core opened must be closed by now */
  for (int p = 0; p < c->size; p++)
    if (c->open[p]) {
      fprintf(stderr, DEVFAKE_NAME ": rank %d: %d connection(s) to rank %d "
              "left open at fini\n", c->rank, c->open[p], p);
      _exit(3);
    }
  free(c);
  return 0;
}

__attribute__((visibility("default"))) const mep_transport_t
    mep_transport_plugin_v1 = {
        .abi_major = MEP_TRANSPORT_ABI_MAJOR,
        .abi_minor = MEP_TRANSPORT_ABI_MINOR,
        .struct_size = sizeof(mep_transport_t),
        .name = DEVFAKE_NAME,
        .version = "test",
        .init = f_init,
        .props = f_props,
        .address = f_address,
        .reachable = f_reachable,
        .connect = f_connect,
        .reg = f_reg,
        .dereg = f_dereg,
        .import = f_import,
        .unimport = f_unimport,
        .write = f_write,
        .signal = f_signal,
        .poll = f_poll,
        .device_descriptor = f_descriptor,
        .close = f_close,
        .fini = f_fini,
        .device_region = f_region,
        .device_local = f_local,
};
