/* region.c - local registrations (the table incoming messages are checked
 * against) and imported peer regions. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tcp.h"

tcp_mr_t *mep__tcp_region_find(tcp_ctx_t *ctx, uint32_t id) {
  if (id == 0 || id > ctx->nregions) return NULL;
  return ctx->regions[id - 1];
}

int mep__tcp_region_len(void *arg, uint32_t id, uint64_t *len) {
  tcp_mr_t *mr = mep__tcp_region_find(arg, id);
  if (!mr) return 0;
  *len = mr->len;
  return 1;
}

/* rx_lock held. Ids are never reused, so a message meant for a region that
 * was deregistered can never land in a newer one. */
static int table_add(tcp_ctx_t *ctx, tcp_mr_t *mr) {
  if (ctx->nregions == UINT32_MAX) return -1;
  if (ctx->nregions == ctx->regions_cap) {
    uint32_t cap = ctx->regions_cap ? ctx->regions_cap * 2 : 16;
    if (cap < ctx->regions_cap) cap = UINT32_MAX;
    tcp_mr_t **t = realloc(ctx->regions, (size_t)cap * sizeof *t);
    if (!t) return -1;
    ctx->regions = t;
    ctx->regions_cap = cap;
  }
  ctx->regions[ctx->nregions++] = mr;
  mr->id = ctx->nregions;
  return 0;
}

int mep__tcp_reg(mep_tp_ctx_t *ctxp, void *ptr, size_t len, mep_memkind_t kind,
                 mep_tp_mr_t **out, void *rkey, size_t *rkey_len) {
  tcp_ctx_t *ctx = ctxp;
  if (!ctx || !out || !rkey || !rkey_len) return MEP_ERR_INVALID;
  if (kind != MEP_MEM_HOST)
    return TCP_ERR(ctx, MEP_ERR_UNSUPPORTED,
                   "tcp: cannot register %s memory (kind %d): tcp moves host "
                   "memory only",
                   kind == MEP_MEM_CUDA ? "CUDA" : "unknown", (int)kind);
  if (!ptr && len)
    return TCP_ERR(ctx, MEP_ERR_INVALID,
                   "tcp: register %zu bytes at NULL", len);
  if (*rkey_len < MEP_TCP_RKEY_LEN)
    return TCP_ERR(ctx, MEP_ERR_INVALID,
                   "tcp: register: the remote-key buffer has %zu bytes, the "
                   "key needs %d", *rkey_len, MEP_TCP_RKEY_LEN);
  tcp_mr_t *mr = calloc(1, sizeof *mr);
  if (!mr) return TCP_ERR(ctx, MEP_ERR_NOMEM, "tcp: register: out of memory");
  mr->ctx = ctx;
  mr->base = ptr;
  mr->len = len;
  pthread_rwlock_wrlock(&ctx->rx_lock);
  int rc = table_add(ctx, mr);
  pthread_rwlock_unlock(&ctx->rx_lock);
  if (rc) {
    free(mr);
    return TCP_ERR(ctx, MEP_ERR_NOMEM,
                   "tcp: register: out of memory or region ids");
  }
  mep__tcp_rkey_t k = {.rank = (uint32_t)ctx->rank, .region = mr->id,
                       .len = len};
  mep__tcp_rkey_encode(rkey, &k);
  *rkey_len = MEP_TCP_RKEY_LEN;
  *out = mr;
  return 0;
}

int mep__tcp_dereg(mep_tp_ctx_t *ctxp, mep_tp_mr_t *mrp) {
  tcp_ctx_t *ctx = ctxp;
  tcp_mr_t *mr = mrp;
  if (!ctx || !mr) return MEP_ERR_INVALID;
  /* Taking rx_lock waits for every recv() into a region to finish; after
   * that no byte lands in this one. */
  pthread_rwlock_wrlock(&ctx->rx_lock);
  int ok = mep__tcp_region_find(ctx, mr->id) == mr;
  if (ok) ctx->regions[mr->id - 1] = NULL;
  pthread_rwlock_unlock(&ctx->rx_lock);
  if (!ok)
    return TCP_ERR(ctx, MEP_ERR_INVALID,
                   "tcp: dereg: not a live registration of this context");
  free(mr);
  return 0;
}

void mep__tcp_regions_free(tcp_ctx_t *ctx) {
  for (uint32_t i = 0; i < ctx->nregions; i++) free(ctx->regions[i]);
  free(ctx->regions);
  ctx->regions = NULL;
  ctx->nregions = ctx->regions_cap = 0;
}

int mep__tcp_import(mep_tp_ep_t *ep, const void *rkey, size_t len,
                    mep_tp_rmr_t **out) {
  tcp_peer_t *p = ep;
  if (!p || !out) return MEP_ERR_INVALID;
  tcp_ctx_t *ctx = p->ctx;
  mep__tcp_rkey_t k;
  char why[128];
  if (mep__tcp_rkey_decode(rkey, len, &k, why, sizeof why))
    return TCP_ERR(ctx, MEP_ERR_PROTOCOL, "tcp: import from rank %d: %s",
                   p->rank, why);
  if (k.rank != (uint32_t)p->rank)
    return TCP_ERR(ctx, MEP_ERR_PROTOCOL,
                   "tcp: import from rank %d: the key belongs to rank %" PRIu32,
                   p->rank, k.rank);
  tcp_rmr_t *r = calloc(1, sizeof *r);
  if (!r) return TCP_ERR(ctx, MEP_ERR_NOMEM, "tcp: import: out of memory");
  r->peer = p;
  r->region = k.region;
  r->len = k.len;
  pthread_mutex_lock(&p->mu);
  r->next = p->rmrs;
  if (p->rmrs) p->rmrs->prev = r;
  p->rmrs = r;
  pthread_mutex_unlock(&p->mu);
  *out = r;
  return 0;
}

int mep__tcp_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmrp) {
  tcp_peer_t *p = ep;
  tcp_rmr_t *r = rmrp;
  if (!p || !r) return MEP_ERR_INVALID;
  if (r->peer != p)
    return TCP_ERR(p->ctx, MEP_ERR_INVALID,
                   "tcp: unimport: the region was imported from rank %d, not "
                   "rank %d", r->peer->rank, p->rank);
  pthread_mutex_lock(&p->mu);
  if (r->prev)
    r->prev->next = r->next;
  else
    p->rmrs = r->next;
  if (r->next) r->next->prev = r->prev;
  pthread_mutex_unlock(&p->mu);
  free(r);
  return 0;
}
