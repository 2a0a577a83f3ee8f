/* region.c - local registrations (memory regions of the protection
 * domain, their rkeys published in the blob) and imported peer regions.
 * The device checks every incoming write against the rkey and range of
 * a live registration, so a write into a deregistered or foreign range
 * is refused by the peer's device and fails the writer's request.
 *
 * A region of host memory that no GPU maps takes signals that this side's
 * poll() applies (inband.c): its key says so, and peers then send it
 * their signals in band. The list of registrations is under ctx->mr_mu,
 * which poll() takes to find the region a peer's signal names; dereg
 * counts in ctx->mr_gen, so that a region found before is looked up again.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "verbs.h"

static int access_flags(const verbs_ctx_t *ctx) {
  return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
         (ctx->dev.atomics ? IBV_ACCESS_REMOTE_ATOMIC : 0);
}

static int reg_host(verbs_ctx_t *ctx, void *ptr, size_t len,
                    struct ibv_mr **out) {
  *out = NULL;
  if (len == 0) return 0; /* nothing can be written to it: no MR */
  *out = ibv_reg_mr(ctx->dev.pd, ptr, len, access_flags(ctx));
  if (*out) return 0;
  int e = errno;
  return VERBS_ERR(ctx, e == ENOMEM ? MEP_ERR_NOMEM : MEP_ERR_SYSTEM,
                   "verbs: rank %d: registering %zu bytes of host memory at "
                   "%p with %s failed: %s%s", ctx->rank, len, ptr,
                   ctx->dev.name, strerror(e),
                   e == ENOMEM || e == EPERM
                       ? " (is the locked-memory limit, ulimit -l, too low?)"
                       : "");
}

static int reg_cuda(verbs_ctx_t *ctx, void *ptr, size_t len,
                    struct ibv_mr **out) {
  *out = NULL;
  if (ctx->gpu.mode == VERBS_GPU_NONE)
    return VERBS_ERR(ctx, MEP_ERR_UNSUPPORTED, "verbs: rank %d: cannot "
                     "register CUDA memory with %s: %s; the core carries GPU "
                     "data through host memory instead", ctx->rank,
                     ctx->dev.name, ctx->gpu.why);
  if (len == 0) return 0;
  *out = mep__verbs_gpu_reg(ctx, ptr, len, access_flags(ctx));
  return *out ? 0 : MEP_ERR_SYSTEM;
}

int mep__verbs_reg(mep_tp_ctx_t *ctxp, void *ptr, size_t len,
                   mep_memkind_t kind, mep_tp_mr_t **out, void *rkey,
                   size_t *rkey_len) {
  verbs_ctx_t *ctx = ctxp;
  if (!ctx || !out || !rkey || !rkey_len) return MEP_ERR_INVALID;
  if (kind != MEP_MEM_HOST && kind != MEP_MEM_CUDA)
    return VERBS_ERR(ctx, MEP_ERR_UNSUPPORTED, "verbs: register memory of "
                     "unknown kind %d", (int)kind);
  if (!ptr && len)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: register %zu bytes at "
                     "NULL", len);
  if (*rkey_len < MEP_VERBS_RKEY_LEN)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: register: the remote-key "
                     "buffer has %zu bytes, the key needs %d", *rkey_len,
                     MEP_VERBS_RKEY_LEN);
  verbs_mr_t *mr = calloc(1, sizeof *mr);
  if (!mr) return VERBS_ERR(ctx, MEP_ERR_NOMEM, "verbs: register: out of "
                            "memory");
  int rc = kind == MEP_MEM_HOST ? reg_host(ctx, ptr, len, &mr->mr)
                                : reg_cuda(ctx, ptr, len, &mr->mr);
  if (rc) {
    free(mr);
    return rc;
  }
  mr->ctx = ctx;
  mr->base = ptr;
  mr->len = len;
  mr->kind = kind;
  mr->inband = ctx->cfg.inband && kind == MEP_MEM_HOST && len >= 8 &&
               !mep__verbs_gpu_maps_host(ctx, ptr, len);
  pthread_mutex_lock(&ctx->mr_mu);
  mr->next = ctx->mrs;
  if (ctx->mrs) ctx->mrs->prev = mr;
  ctx->mrs = mr;
  pthread_mutex_unlock(&ctx->mr_mu);
  mep__verbs_rkey_t k = {.rank = (uint32_t)ctx->rank,
                         .rkey = mr->mr ? mr->mr->rkey : 0,
                         .kind = (uint32_t)kind,
                         .flags = mr->inband ? MEP_VERBS_RKEY_INBAND : 0,
                         .addr = (uint64_t)(uintptr_t)ptr, .len = len};
  mep__verbs_rkey_encode(rkey, &k);
  *rkey_len = MEP_VERBS_RKEY_LEN;
  *out = mr;
  return 0;
}

/* ctx->mr_mu held. */
static void unlink_mr(verbs_ctx_t *ctx, verbs_mr_t *mr) {
  if (mr->prev) mr->prev->next = mr->next;
  else ctx->mrs = mr->next;
  if (mr->next) mr->next->prev = mr->prev;
  ctx->mr_gen++;
}

static void free_mr(verbs_mr_t *mr) {
  if (mr->mr) ibv_dereg_mr(mr->mr);
  free(mr);
}

int mep__verbs_dereg(mep_tp_ctx_t *ctxp, mep_tp_mr_t *mrp) {
  verbs_ctx_t *ctx = ctxp;
  verbs_mr_t *mr = mrp;
  if (!ctx || !mr) return MEP_ERR_INVALID;
  if (mr->ctx != ctx)
    return VERBS_ERR(ctx, MEP_ERR_INVALID, "verbs: dereg: not a registration "
                     "of this context");
  pthread_mutex_lock(&ctx->mr_mu);
  unlink_mr(ctx, mr);
  pthread_mutex_unlock(&ctx->mr_mu);
  free_mr(mr);
  return 0;
}

void mep__verbs_regions_free(verbs_ctx_t *ctx) {
  pthread_mutex_lock(&ctx->mr_mu);
  while (ctx->mrs) {
    verbs_mr_t *mr = ctx->mrs;
    unlink_mr(ctx, mr);
    free_mr(mr);
  }
  pthread_mutex_unlock(&ctx->mr_mu);
}

int mep__verbs_import(mep_tp_ep_t *epp, const void *rkey, size_t len,
                      mep_tp_rmr_t **out) {
  verbs_ep_t *ep = epp;
  if (!ep || !out) return MEP_ERR_INVALID;
  verbs_ctx_t *ctx = ep->ctx;
  mep__verbs_rkey_t k;
  char why[128];
  if (mep__verbs_rkey_decode(rkey, len, &k, why, sizeof why))
    return VERBS_ERR(ctx, MEP_ERR_PROTOCOL, "verbs: rank %d: import from "
                     "rank %d: %s", ctx->rank, ep->rank, why);
  if (k.rank != (uint32_t)ep->rank)
    return VERBS_ERR(ctx, MEP_ERR_PROTOCOL, "verbs: rank %d: import from "
                     "rank %d: the key belongs to rank %" PRIu32, ctx->rank,
                     ep->rank, k.rank);
  verbs_rmr_t *r = calloc(1, sizeof *r);
  if (!r) return VERBS_ERR(ctx, MEP_ERR_NOMEM, "verbs: import: out of memory");
  r->ep = ep;
  r->addr = k.addr;
  r->len = k.len;
  r->rkey = k.rkey;
  r->inband = (k.flags & MEP_VERBS_RKEY_INBAND) != 0;
  pthread_mutex_lock(&ep->mu);
  r->next = ep->rmrs;
  if (ep->rmrs) ep->rmrs->prev = r;
  ep->rmrs = r;
  pthread_mutex_unlock(&ep->mu);
  *out = r;
  return 0;
}

int mep__verbs_unimport(mep_tp_ep_t *epp, mep_tp_rmr_t *rmrp) {
  verbs_ep_t *ep = epp;
  verbs_rmr_t *r = rmrp;
  if (!ep || !r) return MEP_ERR_INVALID;
  if (r->ep != ep)
    return VERBS_ERR(ep->ctx, MEP_ERR_INVALID, "verbs: unimport: the region "
                     "was imported from rank %d, not rank %d", r->ep->rank,
                     ep->rank);
  pthread_mutex_lock(&ep->mu);
  if (r->prev) r->prev->next = r->next;
  else ep->rmrs = r->next;
  if (r->next) r->next->prev = r->prev;
  pthread_mutex_unlock(&ep->mu);
  free(r);
  return 0;
}
