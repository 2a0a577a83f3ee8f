/* region.c - registering memory with the routed transports, publishing its
 * remote keys and importing peers' keys on first use. */
#include "region.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "error.h"
#include "log.h"

char *mep__region_store_key(const mep_comm_t *comm, const char *what,
                            int rank) {
  size_t len = strlen(comm->ns) + strlen(what) + 48;
  char *k = malloc(len);
  if (k)
    snprintf(k, len, "%s/%s/%d.%lld", comm->ns, what, rank,
             (long long)comm->incarnation[rank]);
  return k;
}

static char *region_key(const mep_comm_t *comm, uint32_t id, int rank) {
  char what[24];
  snprintf(what, sizeof what, "region/%u", id);
  return mep__region_store_key(comm, what, rank);
}

static int track(mep_comm_t *comm, mep_region_t *r) {
  mep_region_t **regions = realloc(
      comm->regions, (comm->nregions + 1) * sizeof *comm->regions);
  if (!regions) return mep__err(MEP_ERR_NOMEM, "out of memory");
  comm->regions = regions;
  regions[comm->nregions++] = r;
  return MEP_OK;
}

static void untrack(mep_comm_t *comm, mep_region_t *r) {
  for (size_t i = 0; i < comm->nregions; i++) {
    if (comm->regions[i] != r) continue;
    comm->regions[i] = comm->regions[--comm->nregions];
    return;
  }
}

/* The published blob: length, kind, then per used transport its name and
 * remote key. */
static int register_all(mep_region_t *r, mep__wbuf_t *blob) {
  mep_comm_t *comm = r->comm;
  mep__wbuf_u64(blob, r->len);
  mep__wbuf_u32(blob, (uint32_t)r->kind);
  uint32_t used = 0;
  for (int i = 0; i < comm->ntps; i++) used += comm->tps[i].used;
  mep__wbuf_u32(blob, used);
  for (int i = 0; i < comm->ntps; i++) {
    mep__tp_t *tp = &comm->tps[i];
    if (!tp->used) continue;
    if (!(tp->props.mem_kinds & (1u << r->kind)))
      return mep__err(MEP_ERR_UNSUPPORTED,
                      "region: transport %s cannot carry %s memory", tp->name,
                      r->kind == MEP_MEM_CUDA ? "CUDA" : "host");
    uint8_t rkey[MEP_TP_MAX_RKEY];
    size_t rlen = sizeof rkey;
    mep__err_clear();
    int rc = tp->vt->reg(tp->ctx, r->ptr, r->len, r->kind, &r->mrs[i], rkey,
                         &rlen);
    if (rc == MEP_OK && rlen > sizeof rkey)
      rc = mep__err(MEP_ERR_PROTOCOL, "remote key of %zu bytes", rlen);
    if (rc)
      return mep__err_wrap(rc, "region of %zu bytes: register with %s",
                           r->len, tp->name);
    mep__wbuf_str(blob, tp->name);
    mep__wbuf_bytes(blob, rkey, rlen);
  }
  return blob->oom ? mep__err(MEP_ERR_NOMEM, "out of memory") : MEP_OK;
}

/* A region of [ptr, ptr + len) with room for every transport's
 * registration, none made yet; NULL when out of memory. */
static mep_region_t *region_new(mep_comm_t *comm, void *ptr, size_t len,
                                mep_memkind_t kind) {
  mep_region_t *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->comm = comm;
  r->ptr = ptr;
  r->len = len;
  r->kind = kind;
  pthread_mutex_init(&r->lock, NULL);
  r->mrs = calloc((size_t)comm->ntps + 1, sizeof *r->mrs);
  if (!r->mrs) {
    mep_region_deregister(r);
    return NULL;
  }
  return r;
}

int mep_region_register(mep_comm_t *comm, void *ptr, size_t len,
                        mep_memkind_t kind, mep_region_t **out) {
  if (!comm || !out || (!ptr && len))
    return mep__err(MEP_ERR_INVALID, "mep_region_register: NULL argument");
  if (kind != MEP_MEM_HOST && kind != MEP_MEM_CUDA)
    return mep__err(MEP_ERR_INVALID, "mep_region_register: memory kind %d",
                    (int)kind);
  if (kind == MEP_MEM_CUDA)
    return mep__err(MEP_ERR_UNSUPPORTED, "mep_region_register: CUDA memory "
                    "is not supported by this build of libmep yet");
  mep_region_t *r = region_new(comm, ptr, len, kind);
  if (!r) return mep__err(MEP_ERR_NOMEM, "out of memory");
  r->remote = calloc((size_t)comm->max_size, sizeof *r->remote);
  pthread_mutex_lock(&comm->lock);
  r->id = comm->next_region++;
  int rc = r->remote ? track(comm, r)
                     : mep__err(MEP_ERR_NOMEM, "out of memory");
  pthread_mutex_unlock(&comm->lock);
  mep__wbuf_t blob = {0};
  if (rc == MEP_OK) rc = register_all(r, &blob);
  if (rc == MEP_OK && !comm->state_published) {
    /* the subsystems' state: published with the rest of it */
    r->pub = blob.data;
    r->pub_len = blob.len;
    blob = (mep__wbuf_t){0};
  } else if (rc == MEP_OK) {
    char *k = region_key(comm, r->id, comm->rank);
    rc = k ? comm->store->set(comm->store->ctx, k, blob.data, blob.len)
           : mep__err(MEP_ERR_NOMEM, "out of memory");
    free(k);
  }
  mep__wbuf_free(&blob);
  if (rc) {
    mep__errsave_t why;
    mep__err_save(&why);
    mep_region_deregister(r);
    return mep__err_restore(&why, rc);
  }
  *out = r;
  return MEP_OK;
}

int mep_region_deregister(mep_region_t *r) {
  if (!r) return MEP_OK;
  mep_comm_t *comm = r->comm;
  pthread_mutex_lock(&comm->lock);
  untrack(comm, r);
  pthread_mutex_unlock(&comm->lock);
  for (int p = 0; r->remote && p < comm->max_size; p++) {
    mep__peer_t *peer = &comm->peers[p];
    if (r->remote[p].rmr && peer->ep)
      comm->tps[peer->tp].vt->unimport(peer->ep, r->remote[p].rmr);
  }
  for (int i = 0; r->mrs && i < comm->ntps; i++)
    if (r->mrs[i]) comm->tps[i].vt->dereg(comm->tps[i].ctx, r->mrs[i]);
  pthread_mutex_destroy(&r->lock);
  free(r->mrs);
  free(r->remote);
  free(r->keys);
  free(r->key_lens);
  free(r->pub);
  free(r);
  return MEP_OK;
}

/* Room for n keys; MEP_OK or MEP_ERR_NOMEM. */
static int keys_new(mep_region_t *r, size_t n) {
  r->keys = malloc(n * MEP_TP_MAX_RKEY);
  r->key_lens = calloc(n, sizeof *r->key_lens);
  return r->keys && r->key_lens ? MEP_OK
                                 : mep__err(MEP_ERR_NOMEM, "out of memory");
}

int mep__region_local(mep_comm_t *comm, const void *ptr, size_t len,
                      mep_region_t **out) {
  mep_region_t *r = region_new(comm, (void *)ptr, len, MEP_MEM_HOST);
  if (!r) return mep__err(MEP_ERR_NOMEM, "out of memory");
  if (keys_new(r, (size_t)comm->ntps)) {
    mep_region_deregister(r);
    return MEP_ERR_NOMEM;
  }
  for (int i = 0; i < comm->ntps; i++) {
    mep__tp_t *tp = &comm->tps[i];
    if (!tp->used || !(tp->props.mem_kinds & (1u << MEP_MEM_HOST))) continue;
    size_t rlen = MEP_TP_MAX_RKEY;
    if (tp->vt->reg(tp->ctx, r->ptr, len, MEP_MEM_HOST, &r->mrs[i],
                    r->keys + (size_t)i * MEP_TP_MAX_RKEY, &rlen) != MEP_OK)
      r->mrs[i] = NULL; /* its peers keep the staged path */
    else
      r->key_lens[i] = (uint32_t)rlen;
  }
  *out = r;
  return MEP_OK;
}

void *mep_region_ptr(const mep_region_t *r) { return r ? r->ptr : NULL; }
size_t mep_region_len(const mep_region_t *r) { return r ? r->len : 0; }

/* Finds the remote key for `tp_name` in a peer's published blob. */
static int parse_blob(const void *val, size_t len, const char *tp_name,
                      uint64_t *rlen, const void **rkey, size_t *rkey_len) {
  mep__rbuf_t b = {.data = val, .len = len};
  *rlen = mep__rbuf_u64(&b);
  mep__rbuf_u32(&b); /* kind */
  uint32_t n = mep__rbuf_u32(&b);
  for (uint32_t i = 0; i < n && !b.bad; i++) {
    size_t nlen;
    const char *name = mep__rbuf_bytes(&b, &nlen);
    const void *k = mep__rbuf_bytes(&b, rkey_len);
    if (name && nlen == strlen(tp_name) && memcmp(name, tp_name, nlen) == 0) {
      *rkey = k;
      return b.bad ? MEP_ERR_PROTOCOL : MEP_OK;
    }
  }
  return b.bad ? MEP_ERR_PROTOCOL : MEP_ERR_NOT_FOUND;
}

/* The blob `peer` published for a region registered after the state. */
static int published_blob(mep_region_t *r, int peer, void **val,
                          size_t *len) {
  mep_comm_t *comm = r->comm;
  char *k = region_key(comm, r->id, peer);
  int rc = k ? comm->store->get(comm->store->ctx, k, val, len,
                                comm->timeout_ms)
             : mep__err(MEP_ERR_NOMEM, "out of memory");
  if (rc)
    mep__err_wrap(rc, "region %u: waiting %d ms for rank %d to register "
                      "it (store key '%s')", r->id, comm->timeout_ms, peer, k);
  free(k);
  return rc;
}

static int import_remote(mep_region_t *r, int peer, mep__remote_t *rem) {
  mep_comm_t *comm = r->comm;
  mep__tp_t *tp = &comm->tps[comm->peers[peer].tp];
  void *val = NULL;
  size_t len = 0;
  int rc = r->id < comm->state_regions
               ? mep__region_state_blob(comm, r->id, peer, &val, &len)
               : published_blob(r, peer, &val, &len);
  const void *rkey = NULL;
  size_t rkey_len = 0;
  if (rc == MEP_OK) {
    rc = parse_blob(val, len, tp->name, &rem->len, &rkey, &rkey_len);
    if (rc)
      mep__err(rc, "region %u of rank %d: %s", r->id, peer,
               rc == MEP_ERR_NOT_FOUND ? "no key for its route's transport"
                                       : "malformed key blob");
  }
  if (rc == MEP_OK) {
    mep__err_clear();
    rc = tp->vt->import(comm->peers[peer].ep, rkey, rkey_len, &rem->rmr);
    if (rc) mep__err_wrap(rc, "region %u of rank %d: import", r->id, peer);
  }
  free(val);
  return rc;
}

int mep__region_import_active(mep_region_t *r, const uint8_t *act) {
  mep_comm_t *comm = r->comm;
  for (int p = 0; p < comm->size; p++) {
    mep__remote_t *rem;
    if (p == comm->rank || !act[p]) continue;
    int rc = mep__region_remote(r, p, &rem);
    if (rc) return rc;
  }
  return MEP_OK;
}

void mep__region_forget(mep_region_t *r, int peer) {
  mep_comm_t *comm = r->comm;
  pthread_mutex_lock(&r->lock);
  mep__remote_t *rem = &r->remote[peer];
  if (rem->rmr && comm->peers[peer].ep)
    comm->tps[comm->peers[peer].tp].vt->unimport(comm->peers[peer].ep,
                                                 rem->rmr);
  rem->rmr = NULL;
  rem->len = 0;
  pthread_mutex_unlock(&r->lock);
}

int mep__region_remote(mep_region_t *r, int peer, mep__remote_t **out) {
  mep__remote_t *rem = &r->remote[peer];
  pthread_mutex_lock(&r->lock);
  int rc = rem->rmr  ? MEP_OK
           : r->shell ? mep__err(MEP_ERR_PEER_FAILED, "rank %d: the import "
                                 "of its region was released (it left the "
                                 "group)", peer)
                      : import_remote(r, peer, rem);
  pthread_mutex_unlock(&r->lock);
  *out = rem;
  return rc;
}

size_t mep__region_key(const mep_region_t *r, int tp, const void **key) {
  if (!r->keys || tp < 0 || tp >= r->comm->ntps || !r->mrs[tp]) return 0;
  *key = r->keys + (size_t)tp * MEP_TP_MAX_RKEY;
  return r->key_lens[tp];
}

int mep__region_shell(mep_comm_t *comm, mep_region_t **out) {
  mep_region_t *r = region_new(comm, NULL, 0, MEP_MEM_HOST);
  if (!r) return mep__err(MEP_ERR_NOMEM, "out of memory");
  r->shell = 1;
  r->remote = calloc((size_t)comm->max_size, sizeof *r->remote);
  int rc = r->remote ? keys_new(r, (size_t)comm->max_size)
                     : mep__err(MEP_ERR_NOMEM, "out of memory");
  if (rc == MEP_OK) {
    pthread_mutex_lock(&comm->lock);
    rc = track(comm, r);
    pthread_mutex_unlock(&comm->lock);
  }
  if (rc) {
    mep_region_deregister(r);
    return rc;
  }
  *out = r;
  return MEP_OK;
}

int mep__region_adopt(mep_region_t *shell, int peer, const void *key,
                      size_t len, uint64_t rlen) {
  mep_comm_t *comm = shell->comm;
  mep__peer_t *pe = &comm->peers[peer];
  if (!len || len > MEP_TP_MAX_RKEY || !pe->ep)
    return mep__err(MEP_ERR_INVALID, "a key of %zu bytes from rank %d", len,
                    peer);
  uint8_t *have = shell->keys + (size_t)peer * MEP_TP_MAX_RKEY;
  mep__remote_t *rem = &shell->remote[peer];
  pthread_mutex_lock(&shell->lock);
  int rc = MEP_OK;
  if (!rem->rmr || shell->key_lens[peer] != len || memcmp(have, key, len)) {
    const mep_transport_t *vt = comm->tps[pe->tp].vt;
    if (rem->rmr) vt->unimport(pe->ep, rem->rmr);
    rem->rmr = NULL;
    shell->key_lens[peer] = 0;
    rc = vt->import(pe->ep, key, len, &rem->rmr);
    if (rc == MEP_OK) {
      memcpy(have, key, len);
      shell->key_lens[peer] = (uint32_t)len;
    } else {
      rem->rmr = NULL;
    }
  }
  if (rc == MEP_OK) rem->len = rlen;
  pthread_mutex_unlock(&shell->lock);
  return rc;
}
