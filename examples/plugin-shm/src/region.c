/* region.c - local registrations (reg/dereg) and imported peer regions
 * (import/unimport).
 *
 * The remote key is {u32 magic, u32 base address mod 8, u64 region id,
 * u64 length}: what a sender needs to check bounds and signal alignment
 * locally before anything reaches the ring. */
#include "shm.h"

#include <stdlib.h>
#include <string.h>

#define RKEY_MAGIC 0x4b524d53u /* "SMRK" */
#define RKEY_BYTES 24

shm_mr_t *shm_region_lookup(shm_ctx_t *ctx, uint64_t id) {
  uint64_t idx = id & 0xffffffffu;
  uint32_t gen = (uint32_t)(id >> 32);
  if (idx >= ctx->nslots) return NULL;
  const shm_slot_t *s = &ctx->slots[idx];
  return s->mr && s->gen == gen ? s->mr : NULL;
}

/* A free slot index, growing the table if needed; UINT32_MAX when full. */
static uint32_t take_slot(shm_ctx_t *ctx) {
  if (ctx->free_slot != UINT32_MAX) {
    uint32_t idx = ctx->free_slot;
    ctx->free_slot = ctx->slots[idx].next_free;
    return idx;
  }
  if (ctx->nslots == ctx->slot_cap) {
    if (ctx->slot_cap >= UINT32_MAX / 2) return UINT32_MAX;
    uint32_t cap = ctx->slot_cap ? ctx->slot_cap * 2 : 16;
    shm_slot_t *s = realloc(ctx->slots, (size_t)cap * sizeof(*s));
    if (!s) return UINT32_MAX;
    memset(s + ctx->slot_cap, 0, (size_t)(cap - ctx->slot_cap) * sizeof(*s));
    ctx->slots = s;
    ctx->slot_cap = cap;
  }
  return ctx->nslots++;
}

static void put_rkey(const shm_mr_t *mr, void *rkey) {
  uint8_t *p = rkey;
  uint32_t magic = RKEY_MAGIC, misalign = (uint32_t)((uintptr_t)mr->ptr % 8);
  memcpy(p, &magic, 4);
  memcpy(p + 4, &misalign, 4);
  memcpy(p + 8, &mr->id, 8);
  memcpy(p + 16, &mr->len, 8);
}

int shm_reg(mep_tp_ctx_t *p, void *ptr, size_t len, mep_memkind_t kind,
            mep_tp_mr_t **out, void *rkey, size_t *rkey_len) {
  shm_ctx_t *ctx = shm_ctx_of(p);
  if (!ctx || !out || !rkey || !rkey_len) return MEP_ERR_INVALID;
  if (kind != MEP_MEM_HOST)
    return shm_error(ctx, MEP_ERR_UNSUPPORTED,
                     "shm: cannot register memory of kind %d; only host "
                     "memory is supported",
                     (int)kind);
  if (!ptr && len)
    return shm_error(ctx, MEP_ERR_INVALID,
                     "shm: register %zu bytes at a NULL address", len);
  if (*rkey_len < RKEY_BYTES)
    return shm_error(ctx, MEP_ERR_INVALID,
                     "shm: a remote key needs %d bytes, %zu given", RKEY_BYTES,
                     *rkey_len);
  shm_mr_t *mr = calloc(1, sizeof(*mr));
  if (!mr)
    return shm_error(ctx, MEP_ERR_NOMEM, "shm: out of memory registering %zu "
                     "bytes", len);
  pthread_mutex_lock(&ctx->lock);
  uint32_t idx = take_slot(ctx);
  if (idx == UINT32_MAX) {
    pthread_mutex_unlock(&ctx->lock);
    free(mr);
    return shm_error(ctx, MEP_ERR_NOMEM, "shm: no room for another region "
                     "(%u registered)", ctx->nslots);
  }
  shm_slot_t *s = &ctx->slots[idx];
  s->gen = s->gen + 1 ? s->gen + 1 : 1; /* id 0 never names a region */
  s->mr = mr;
  *mr = (shm_mr_t){.tag = SHM_TAG_MR, .ctx = ctx, .ptr = ptr, .len = len,
                   .id = (uint64_t)s->gen << 32 | idx};
  pthread_mutex_unlock(&ctx->lock);
  put_rkey(mr, rkey);
  *rkey_len = RKEY_BYTES;
  *out = mr;
  return 0;
}

int shm_dereg(mep_tp_ctx_t *p, mep_tp_mr_t *pmr) {
  shm_ctx_t *ctx = shm_ctx_of(p);
  shm_mr_t *mr = pmr;
  if (!ctx) return MEP_ERR_INVALID;
  if (!mr || mr->tag != SHM_TAG_MR || mr->ctx != ctx)
    return shm_error(ctx, MEP_ERR_INVALID,
                     "shm: dereg of a region that is not registered here");
  pthread_mutex_lock(&ctx->lock);
  uint32_t idx = (uint32_t)(mr->id & 0xffffffffu);
  if (idx >= ctx->nslots || ctx->slots[idx].mr != mr) {
    pthread_mutex_unlock(&ctx->lock);
    return shm_error(ctx, MEP_ERR_INVALID,
                     "shm: dereg of a region that is not registered here");
  }
  ctx->slots[idx].mr = NULL;
  ctx->slots[idx].next_free = ctx->free_slot;
  ctx->free_slot = idx;
  pthread_mutex_unlock(&ctx->lock);
  mr->tag = 0;
  free(mr);
  return 0;
}

void shm_regions_free(shm_ctx_t *ctx) {
  for (uint32_t i = 0; i < ctx->nslots; i++) {
    if (ctx->slots[i].mr) ctx->slots[i].mr->tag = 0;
    free(ctx->slots[i].mr);
  }
  free(ctx->slots);
  ctx->slots = NULL;
  ctx->nslots = ctx->slot_cap = 0;
}

int shm_import(mep_tp_ep_t *p, const void *rkey, size_t len,
               mep_tp_rmr_t **out) {
  shm_ep_t *ep = shm_ep_of(p);
  if (!ep || !out) return MEP_ERR_INVALID;
  uint32_t magic = 0, misalign = 0;
  uint64_t id = 0, rlen = 0;
  if (rkey && len == RKEY_BYTES) {
    const uint8_t *k = rkey;
    memcpy(&magic, k, 4);
    memcpy(&misalign, k + 4, 4);
    memcpy(&id, k + 8, 8);
    memcpy(&rlen, k + 16, 8);
  }
  if (magic != RKEY_MAGIC || misalign >= 8 || id >> 32 == 0)
    return shm_error(ep->ctx, MEP_ERR_PROTOCOL,
                     "shm: the remote key of %zu bytes from rank %d is not an "
                     "shm key",
                     len, ep->peer);
  shm_rmr_t *r = calloc(1, sizeof(*r));
  if (!r)
    return shm_error(ep->ctx, MEP_ERR_NOMEM, "shm: out of memory importing a "
                     "region of rank %d", ep->peer);
  *r = (shm_rmr_t){.tag = SHM_TAG_RMR, .ep = ep, .id = id, .len = rlen,
                   .misalign = misalign};
  pthread_mutex_lock(&ep->ctx->lock);
  r->next = ep->rmrs;
  if (ep->rmrs) ep->rmrs->prev = r;
  ep->rmrs = r;
  pthread_mutex_unlock(&ep->ctx->lock);
  *out = r;
  return 0;
}

int shm_unimport(mep_tp_ep_t *p, mep_tp_rmr_t *prmr) {
  shm_ep_t *ep = shm_ep_of(p);
  shm_rmr_t *r = prmr;
  if (!ep) return MEP_ERR_INVALID;
  if (!r || r->tag != SHM_TAG_RMR || r->ep != ep)
    return shm_error(ep->ctx, MEP_ERR_INVALID,
                     "shm: unimport of a region not imported from rank %d",
                     ep->peer);
  pthread_mutex_lock(&ep->ctx->lock);
  if (r->prev)
    r->prev->next = r->next;
  else
    ep->rmrs = r->next;
  if (r->next) r->next->prev = r->prev;
  pthread_mutex_unlock(&ep->ctx->lock);
  r->tag = 0;
  free(r);
  return 0;
}
