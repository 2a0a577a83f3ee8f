/* region_state.c - the subsystems' regions (collective staging,
 * point-to-point rings, control channel) published as one store value per
 * rank, its bundle, and read back once per peer: creation imports every
 * peer's instance of each of them, and one read per region and peer made
 * the store server the bottleneck of creation at a few hundred ranks
 * (docs/scaling.md, "Creation"). */
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "error.h"
#include "region.h"

struct mep__bundle {
  void *val;
  size_t len;
};

static const mep_region_t *find_state(const mep_comm_t *comm, uint32_t id) {
  for (size_t i = 0; i < comm->nregions; i++) {
    const mep_region_t *r = comm->regions[i];
    if (!r->shell && r->pub && r->id == id) return r;
  }
  return NULL;
}

/* The bundle: the number of regions, then region 0's blob, region 1's...
 * (each a u32 length and its bytes). */
int mep__region_publish_state(mep_comm_t *comm) {
  mep__wbuf_t b = {0};
  int rc = MEP_OK;
  pthread_mutex_lock(&comm->lock);
  uint32_t n = comm->next_region;
  mep__wbuf_u32(&b, n);
  for (uint32_t id = 0; id < n && rc == MEP_OK; id++) {
    const mep_region_t *r = find_state(comm, id);
    if (r)
      mep__wbuf_bytes(&b, r->pub, r->pub_len);
    else
      rc = mep__err(MEP_ERR_INVALID, "publishing the state: region %u was "
                    "deregistered or published alone", id);
  }
  pthread_mutex_unlock(&comm->lock);
  char *k = rc ? NULL : mep__region_store_key(comm, "state", comm->rank);
  if (rc == MEP_OK && (b.oom || !k))
    rc = mep__err(MEP_ERR_NOMEM, "out of memory");
  if (rc == MEP_OK) {
    rc = comm->store->set(comm->store->ctx, k, b.data, b.len);
    if (rc) mep__err_wrap(rc, "publishing the state (store key '%s')", k);
  }
  free(k);
  mep__wbuf_free(&b);
  if (rc) return rc;
  pthread_mutex_lock(&comm->lock);
  for (size_t i = 0; i < comm->nregions; i++) {
    mep_region_t *r = comm->regions[i];
    free(r->pub);
    r->pub = NULL;
  }
  comm->state_regions = n;
  comm->state_published = 1;
  pthread_mutex_unlock(&comm->lock);
  return MEP_OK;
}

/* Region `id`'s blob out of a bundle, copied. */
static int extract(const void *val, size_t len, uint32_t id, int peer,
                   void **out, size_t *out_len) {
  mep__rbuf_t b = {.data = val, .len = len};
  uint32_t n = mep__rbuf_u32(&b);
  if (!b.bad && id >= n)
    return mep__err(MEP_ERR_MISMATCH, "rank %d published %u regions of "
                    "state, not region %u: a different build of mep?",
                    peer, n, id);
  const void *p = NULL;
  size_t plen = 0;
  for (uint32_t i = 0; i <= id && !b.bad; i++) p = mep__rbuf_bytes(&b, &plen);
  if (b.bad || !p)
    return mep__err(MEP_ERR_PROTOCOL, "rank %d's published state is "
                    "malformed", peer);
  *out = malloc(plen ? plen : 1);
  if (!*out) return mep__err(MEP_ERR_NOMEM, "out of memory");
  memcpy(*out, p, plen);
  *out_len = plen;
  return MEP_OK;
}

/* The cached bundle of `peer`, extracted under the lock; 1 if there was
 * none (then *rc is untouched). */
static int from_cache(mep_comm_t *comm, uint32_t id, int peer, void **val,
                      size_t *len, int *rc) {
  int miss = 1;
  pthread_mutex_lock(&comm->bundle_mu);
  struct mep__bundle *c = comm->bundles ? &comm->bundles[peer] : NULL;
  if (c && c->val) {
    *rc = extract(c->val, c->len, id, peer, val, len);
    miss = 0;
  }
  pthread_mutex_unlock(&comm->bundle_mu);
  return miss;
}

int mep__region_state_blob(mep_comm_t *comm, uint32_t id, int peer,
                           void **val, size_t *len) {
  int rc = MEP_OK;
  if (!from_cache(comm, id, peer, val, len, &rc)) return rc;
  /* not under the lock: the read may wait for the peer */
  char *k = mep__region_store_key(comm, "state", peer);
  if (!k) return mep__err(MEP_ERR_NOMEM, "out of memory");
  void *bv = NULL;
  size_t bl = 0;
  rc = comm->store->get(comm->store->ctx, k, &bv, &bl, comm->timeout_ms);
  if (rc)
    mep__err_wrap(rc, "region %u: waiting %d ms for rank %d to publish its "
                  "state (store key '%s')", id, comm->timeout_ms, peer, k);
  free(k);
  if (rc) return rc;
  rc = extract(bv, bl, id, peer, val, len);
  pthread_mutex_lock(&comm->bundle_mu);
  struct mep__bundle *c = comm->bundles ? &comm->bundles[peer] : NULL;
  if (rc == MEP_OK && c && !c->val) {
    c->val = bv;
    c->len = bl;
    bv = NULL;
  }
  pthread_mutex_unlock(&comm->bundle_mu);
  free(bv);
  return rc;
}

void mep__region_bundles_keep(mep_comm_t *comm) {
  pthread_mutex_lock(&comm->bundle_mu);
  /* out of memory: no cache, every import reads the store */
  if (!comm->bundles)
    comm->bundles = calloc((size_t)comm->max_size, sizeof *comm->bundles);
  pthread_mutex_unlock(&comm->bundle_mu);
}

void mep__region_bundles_drop(mep_comm_t *comm) {
  pthread_mutex_lock(&comm->bundle_mu);
  struct mep__bundle *c = comm->bundles;
  comm->bundles = NULL;
  pthread_mutex_unlock(&comm->bundle_mu);
  for (int p = 0; c && p < comm->max_size; p++) free(c[p].val);
  free(c);
}
