/* ft_api.c - the public queries of the active set (mep.h, "fault
 * tolerance"): they read what the engine published, under its mutex. */
#include <string.h>

#include "error.h"
#include "ft_state.h"
#include "req.h"

uint64_t mep_comm_epoch(const mep_comm_t *comm) {
  if (!comm || !comm->ft) return 0;
  mep__ft_t *ft = comm->ft;
  pthread_mutex_lock(&ft->mu);
  uint64_t e = ft->pub_epoch;
  pthread_mutex_unlock(&ft->mu);
  return e;
}

int mep_comm_max_size(const mep_comm_t *comm) {
  return comm ? comm->max_size : -1;
}

int mep_comm_timeout_ms(const mep_comm_t *comm) {
  return comm ? comm->timeout_ms : -1;
}

int mep_comm_active(const mep_comm_t *comm, uint8_t *active, int len,
                    uint64_t *epoch) {
  if (!comm || !comm->ft || !active)
    return mep__err(MEP_ERR_INVALID, "mep_comm_active: NULL argument");
  if (len < comm->max_size)
    return mep__err(MEP_ERR_INVALID, "mep_comm_active: %d entries, the "
                    "communicator has %d rank slots", len, comm->max_size);
  mep__ft_t *ft = comm->ft;
  int n = 0;
  pthread_mutex_lock(&ft->mu);
  for (int p = 0; p < comm->max_size; p++) {
    active[p] = ft->arr[p] != 0;
    n += active[p];
  }
  if (epoch) *epoch = ft->pub_epoch;
  pthread_mutex_unlock(&ft->mu);
  return n;
}

const volatile int32_t *mep_comm_active_array(const mep_comm_t *comm) {
  return comm && comm->ft ? comm->ft->arr : NULL;
}

static int copy_ranks(const int *src, int n, int *ranks, int max) {
  if (ranks && max > 0)
    memcpy(ranks, src, (size_t)(n < max ? n : max) * sizeof *ranks);
  return n;
}

int mep_comm_dropped(const mep_comm_t *comm, int *ranks, int max) {
  if (!comm || !comm->ft)
    return mep__err(MEP_ERR_INVALID, "mep_comm_dropped: NULL communicator");
  mep__ft_t *ft = comm->ft;
  pthread_mutex_lock(&ft->mu);
  int n = copy_ranks(ft->dropped, ft->ndropped, ranks, max);
  pthread_mutex_unlock(&ft->mu);
  return n;
}

int mep_req_dropped(const mep_req_t *req, int *ranks, int max) {
  if (!req) return mep__err(MEP_ERR_INVALID, "mep_req_dropped: NULL");
  if (atomic_load(&((mep_req_t *)req)->state) != MEP__REQ_DONE) return 0;
  return copy_ranks(req->dropped, req->ndropped, ranks, max);
}
