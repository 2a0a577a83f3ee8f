/* cuda_share.c - the nvlink steps shared by the CUDA kernel path and the
 * device window (cuda_share.h). */
#include "cuda_share.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "route.h"

int mep__cu_nvlink_index(const mep_comm_t *comm) {
  for (int i = 0; i < comm->ntps; i++) {
    const mep__tp_t *tp = &comm->tps[i];
    if (strcmp(tp->name, "nvlink") == 0 && tp->ctx &&
        tp->vt->struct_size >= offsetof(mep_transport_t, map) +
                                   sizeof tp->vt->map &&
        tp->vt->map)
      return i;
  }
  return -1;
}

/* The peer's nvlink entry, when its nvlink started. */
static const mep__card_tp_t *nvlink_of(const mep__card_t *card) {
  const mep__card_tp_t *t = mep__card_find(card, "nvlink");
  return t && t->available ? t : NULL;
}

int mep__cu_nvlink_reaches(mep_comm_t *comm, int t, int peer, char *why,
                           size_t why_len) {
  mep__tp_t *tp = &comm->tps[t];
  mep__card_t card;
  memset(&card, 0, sizeof card);
  int ok = mep__comm_fetch_card(comm, peer, &card) == MEP_OK;
  const mep__card_tp_t *ptp = ok ? nvlink_of(&card) : NULL;
  snprintf(why, why_len, "its nvlink transport did not start");
  ok = ptp && tp->vt->reachable(tp->ctx, peer, ptp->addr, ptp->addr_len, why,
                                why_len) == 1;
  mep__card_free(&card);
  return ok;
}

static void key_name(const mep_comm_t *comm, const char *what,
                     uint64_t serial, int rank, char *k, size_t len) {
  snprintf(k, len, "%s/%s/%llu/%d.%lld", comm->ns, what,
           (unsigned long long)serial, rank,
           (long long)comm->incarnation[rank]);
}

int mep__cu_publish_key(mep_comm_t *comm, const char *what, uint64_t serial,
                        const void *rkey, size_t len) {
  char k[512];
  key_name(comm, what, serial, comm->rank, k, sizeof k);
  return comm->store->set(comm->store->ctx, k, rkey, len);
}

int mep__cu_import_peer(mep_comm_t *comm, int t, const char *what,
                        uint64_t serial, int peer, mep_tp_ep_t **ep,
                        mep_tp_rmr_t **rmr, void **mapped) {
  mep__tp_t *tp = &comm->tps[t];
  mep__card_t card;
  memset(&card, 0, sizeof card);
  int rc = mep__comm_fetch_card(comm, peer, &card);
  const mep__card_tp_t *ptp = rc ? NULL : nvlink_of(&card);
  if (!rc && !ptp)
    rc = mep__err(MEP_ERR_UNREACHABLE, "rank %d has no nvlink address", peer);
  if (!rc) rc = tp->vt->connect(tp->ctx, peer, ptp->addr, ptp->addr_len, ep);
  mep__card_free(&card);
  char k[512];
  key_name(comm, what, serial, peer, k, sizeof k);
  void *val = NULL;
  size_t len = 0;
  if (!rc) rc = comm->store->get(comm->store->ctx, k, &val, &len,
                                 comm->timeout_ms);
  if (!rc) rc = tp->vt->import(*ep, val, len, rmr);
  free(val);
  if (!rc) rc = tp->vt->map(*ep, *rmr, mapped);
  return rc;
}
