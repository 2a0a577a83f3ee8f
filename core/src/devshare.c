/* devshare.c - a device allocation shared with the peers' GPU kernels
 * (devshare.h). */
#include "devshare.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "plugin.h"

/* This rank's registration with one transport. */
typedef struct reg {
  int tp;
  mep_tp_mr_t *mr;
} reg_t;

struct mep__devshare {
  mep_comm_t *comm;
  char what[32];
  uint64_t serial;
  reg_t *regs; /* one per distinct transport of the routes */
  int nregs;
  int n;                 /* ranks when it was opened */
  mep__devpeer_t *peers; /* [n] */
};

static void key_name(const mep__devshare_t *s, const char *tp, int rank,
                     char *k, size_t len) {
  const mep_comm_t *comm = s->comm;
  snprintf(k, len, "%s/%s/%llu/%s/%d.%lld", comm->ns, s->what,
           (unsigned long long)s->serial, tp, rank,
           (long long)comm->incarnation[rank]);
}

static reg_t *reg_of(mep__devshare_t *s, int tp) {
  for (int i = 0; i < s->nregs; i++)
    if (s->regs[i].tp == tp) return &s->regs[i];
  return NULL;
}

/* Registers with transport t and publishes the key. */
static int publish(mep__devshare_t *s, int t, void *ptr, size_t len,
                   mep_memkind_t kind) {
  mep_comm_t *comm = s->comm;
  mep__tp_t *tp = &comm->tps[t];
  reg_t *r = &s->regs[s->nregs];
  r->tp = t;
  uint8_t rkey[MEP_TP_MAX_RKEY];
  size_t rlen = sizeof rkey;
  mep__err_clear();
  int rc = tp->vt->reg(tp->ctx, ptr, len, kind, &r->mr, rkey, &rlen);
  if (rc)
    return mep__err_wrap(rc, "register %zu bytes of %s memory with %s", len,
                         kind == MEP_MEM_CUDA ? "device" : "host", tp->name);
  s->nregs++;
  if (rlen > sizeof rkey)
    return mep__err(MEP_ERR_PROTOCOL, "%s: a remote key of %zu bytes",
                    tp->name, rlen);
  char k[512];
  key_name(s, tp->name, comm->rank, k, sizeof k);
  return comm->store->set(comm->store->ctx, k, rkey, rlen);
}

int mep__devshare_open(mep_comm_t *comm, const char *what, uint64_t serial,
                       void *ptr, size_t len, mep_memkind_t kind,
                       const mep__devroute_t *const *routes,
                       mep__devshare_t **out) {
  *out = NULL;
  mep__devshare_t *s = calloc(1, sizeof *s);
  if (s) {
    s->regs = calloc((size_t)comm->ntps, sizeof *s->regs);
    s->peers = calloc((size_t)comm->size, sizeof *s->peers);
  }
  if (!s || !s->regs || !s->peers) {
    if (s) free(s->regs);
    free(s);
    return mep__err(MEP_ERR_NOMEM, "out of memory");
  }
  s->comm = comm;
  s->n = comm->size;
  snprintf(s->what, sizeof s->what, "%s", what);
  s->serial = serial;
  int rc = MEP_OK;
  for (int p = 0; rc == MEP_OK && p < comm->size; p++) {
    if (!routes[p]) continue;
    s->peers[p].route = *routes[p];
    s->peers[p].shared = 1;
    if (!reg_of(s, routes[p]->tp))
      rc = publish(s, routes[p]->tp, ptr, len, kind);
  }
  if (rc) {
    mep__devshare_close(s);
    return rc;
  }
  *out = s;
  return MEP_OK;
}

/* The region part of this rank's own registration with dp's transport,
 * for kinds whose kernels name it (device_local); none for the others. */
static int local_part(mep__devshare_t *s, mep__devpeer_t *dp) {
  mep__tp_t *tp = &s->comm->tps[dp->route.tp];
  dp->local_len = 0;
  if (!MEP_TP_HAS(tp->vt, mep_transport_t, device_local) ||
      !tp->vt->device_local)
    return MEP_OK;
  const reg_t *r = reg_of(s, dp->route.tp);
  size_t n = sizeof dp->local;
  mep__err_clear();
  int rc = tp->vt->device_local(tp->ctx, r->mr, dp->local, &n);
  const mep_dev_desc_t *h = (const mep_dev_desc_t *)dp->local;
  if (!rc && (n < sizeof *h || n > sizeof dp->local || h->size != n ||
              h->kind != dp->route.kind))
    rc = mep__err(MEP_ERR_PROTOCOL, "%s: local region descriptor of %zu "
                  "bytes, header says kind %u and %u bytes (the route's kind "
                  "is %d)", tp->name, n, h->kind, h->size,
                  (int)dp->route.kind);
  if (!rc) dp->local_len = n;
  return rc;
}

int mep__devshare_import(mep__devshare_t *s, int peer,
                         const mep__devpeer_t **out) {
  mep_comm_t *comm = s->comm;
  if (peer < 0 || peer >= s->n)
    return mep__err(MEP_ERR_INVALID, "rank %d is not in [0, %d)", peer, s->n);
  mep__devpeer_t *dp = &s->peers[peer];
  if (!dp->shared)
    return mep__err(MEP_ERR_INVALID, "rank %d does not share %s", peer,
                    s->what);
  mep__tp_t *tp = &comm->tps[dp->route.tp];
  char k[512];
  key_name(s, tp->name, peer, k, sizeof k);
  void *val = NULL;
  size_t len = 0;
  int rc = comm->store->get(comm->store->ctx, k, &val, &len,
                            comm->timeout_ms);
  if (rc)
    rc = mep__err_wrap(rc, "waiting %d ms for rank %d's key of %s",
                       comm->timeout_ms, peer, s->what);
  mep__err_clear();
  if (!rc) rc = tp->vt->import(dp->route.ep, val, len, &dp->rmr);
  free(val);
  dp->region_len = sizeof dp->region;
  if (!rc)
    rc = tp->vt->device_region(dp->route.ep, dp->rmr, dp->region,
                               &dp->region_len);
  const mep_dev_desc_t *h = (const mep_dev_desc_t *)dp->region;
  if (!rc && (dp->region_len < sizeof *h || dp->region_len > sizeof dp->region
              || h->size != dp->region_len || h->kind != dp->route.kind))
    rc = mep__err(MEP_ERR_PROTOCOL, "%s: region descriptor of %zu bytes, "
                  "header says kind %u and %u bytes (the route's kind is %d)",
                  tp->name, dp->region_len, h->kind, h->size,
                  (int)dp->route.kind);
  if (!rc) rc = local_part(s, dp);
  if (rc) return mep__err_wrap(rc, "rank %d's %s over %s", peer, s->what,
                               tp->name);
  *out = dp;
  return MEP_OK;
}

void *mep__devpeer_ptr(const mep__devpeer_t *p) {
  const mep_dev_ptr_region_t *r = (const mep_dev_ptr_region_t *)p->region;
  return (void *)(uintptr_t)r->base;
}

void mep__devshare_close(mep__devshare_t *s) {
  if (!s) return;
  mep_comm_t *comm = s->comm;
  for (int p = 0; p < s->n; p++) {
    mep__devpeer_t *dp = &s->peers[p];
    /* a replaced route's connection was closed, with its imports */
    if (dp->rmr && mep__devroute_current(comm, p, dp->route.gen))
      comm->tps[dp->route.tp].vt->unimport(dp->route.ep, dp->rmr);
  }
  for (int i = 0; i < s->nregs; i++)
    comm->tps[s->regs[i].tp].vt->dereg(comm->tps[s->regs[i].tp].ctx,
                                       s->regs[i].mr);
  free(s->regs);
  free(s->peers);
  free(s);
}
