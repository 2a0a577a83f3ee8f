/* comm_api.c - the communicator's public entry points: creating one (its
 * configuration, then the creation steps of comm.c and the subsystems'
 * state, or joining a running group through recover.c), destroying it,
 * and its accessors. The top of the core: nothing calls into it. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "comm.h"
#include "config.h"
#include "cudapath.h"
#include "devroute.h"
#include "error.h"
#include "ft.h"
#include "log.h"
#include "p2p.h"
#include "req.h"

/* Whether the caller's opts struct has `field` (older callers pass a
 * smaller struct). */
#define HAS(opts, field)                                                  \
  ((opts) && (opts)->struct_size >= offsetof(mep_comm_opts_t, field) +    \
                                        sizeof((opts)->field))

static int configure(mep_comm_t *comm, const mep_comm_opts_t *opts) {
  const mep_config_t *cfg = HAS(opts, config) ? opts->config : NULL;
  int rc = MEP_OK;
  if (!cfg) {
    rc = mep_config_load(NULL, &comm->own_cfg);
    cfg = comm->own_cfg;
  }
  if (rc) return rc;
  comm->cfg = cfg;
  mep_log_level_t lvl;
  const char *lvl_name = mep_config_get(cfg, "core", "log_level");
  if (lvl_name && mep_log_parse_level(lvl_name, &lvl) == MEP_OK)
    mep__log_default_level(lvl);
  else if (lvl_name)
    return mep__err(MEP_ERR_CONFIG, "core.log_level = '%s' (from %s) is not "
                    "one of error, warn, info, debug, trace", lvl_name,
                    mep__config_origin(cfg, "core", "log_level"));
  int64_t t;
  rc = mep__config_int(cfg, "core", "timeout_ms", 30000, 1, INT32_MAX, &t);
  if (rc) return rc;
  comm->timeout_ms = (int)t;
  if (HAS(opts, timeout_ms) && opts->timeout_ms > 0)
    comm->timeout_ms = opts->timeout_ms;
  const char *name = HAS(opts, name) && opts->name ? opts->name : "mep";
  comm->ns = strdup(name);
  return comm->ns ? MEP_OK : mep__err(MEP_ERR_NOMEM, "out of memory");
}

/* A new group: connections, the subsystems' state, then the progress
 * thread. */
static int build(mep_comm_t *comm) {
  int rc = mep__comm_connect(comm);
  if (rc == MEP_OK) rc = mep__comm_setup_state(comm);
  if (rc == MEP_OK) rc = mep__comm_import_state(comm);
  if (rc == MEP_OK) rc = mep__progress_start(comm);
  return rc;
}

int mep_comm_create(mep_store_t *store, int rank, int size,
                    const mep_comm_opts_t *opts, mep_comm_t **out) {
  if (!store || !out || !store->set || !store->get)
    return mep__err(MEP_ERR_INVALID, "mep_comm_create: NULL store or out");
  int max = HAS(opts, max_size) && opts->max_size > size ? opts->max_size
                                                         : size;
  int join = HAS(opts, join) && opts->join;
  if (size < 1 || rank < 0 || rank >= size)
    return mep__err(MEP_ERR_INVALID, "mep_comm_create: rank %d is not in "
                                     "[0, %d)", rank, size);
  if (join && !store->add)
    return mep__err(MEP_ERR_INVALID, "mep_comm_create: joining needs a "
                    "store with add()");
  mep_comm_t *comm = calloc(1, sizeof *comm);
  if (!comm) return mep__err(MEP_ERR_NOMEM, "out of memory");
  comm->rank = rank;
  comm->size = size;
  comm->max_size = max;
  comm->joining = join;
  comm->store = store;
  pthread_mutex_init(&comm->lock, NULL);
  pthread_mutex_init(&comm->engine_lock, NULL);
  pthread_mutex_init(&comm->wait_mu, NULL);
  pthread_mutex_init(&comm->bundle_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&comm->wait_cv, &ca);
  pthread_condattr_destroy(&ca);
  mep__engine_init(comm);
  mep__log_set_rank(rank);
  comm->peers = calloc((size_t)max, sizeof *comm->peers);
  comm->incarnation = calloc((size_t)max, sizeof *comm->incarnation);
  int rc = comm->peers && comm->incarnation
               ? configure(comm, opts)
               : mep__err(MEP_ERR_NOMEM, "out of memory");
  if (rc == MEP_OK) rc = join ? mep__comm_join(comm) : build(comm);
  if (rc) {
    mep__errsave_t why;
    mep__err_save(&why);
    mep_comm_destroy(comm);
    return mep__err_restore(&why, rc);
  }
  *out = comm;
  return MEP_OK;
}

int mep_comm_destroy(mep_comm_t *comm) {
  if (!comm) return MEP_OK;
  mep__progress_stop(comm);
  mep__engine_close(comm);
  mep__cuda_fini(comm);
  mep__devroute_fini(comm);
  /* Endpoints close before regions go: a peer's late credit or signal must
   * not arrive for a region that no longer exists (the transport would take
   * it for an attack). */
  for (int p = 0; comm->peers && p < comm->max_size; p++) {
    mep__peer_t *peer = &comm->peers[p];
    if (peer->ep) comm->tps[peer->tp].vt->close(peer->ep);
  }
  mep__ft_fini(comm);
  mep__p2p_fini(comm);
  mep__coll_fini(comm);
  while (comm->nregions) mep_region_deregister(comm->regions[0]);
  free(comm->regions);
  mep__comm_unload(comm);
  mep_config_free(comm->own_cfg);
  pthread_mutex_destroy(&comm->lock);
  pthread_mutex_destroy(&comm->engine_lock);
  pthread_mutex_destroy(&comm->wait_mu);
  pthread_mutex_destroy(&comm->bundle_mu);
  pthread_cond_destroy(&comm->wait_cv);
  free(comm->tps);
  free(comm->peers);
  free(comm->incarnation);
  free(comm->ns);
  free(comm);
  return MEP_OK;
}

int mep_comm_rank(const mep_comm_t *comm) { return comm ? comm->rank : -1; }
int mep_comm_size(const mep_comm_t *comm) { return comm ? comm->size : -1; }

const char *mep_comm_route(const mep_comm_t *comm, int peer) {
  if (!comm || peer < 0 || peer >= comm->size) return NULL;
  if (peer == comm->rank) return "self";
  int t = comm->peers[peer].tp;
  return comm->peers[peer].ep ? comm->tps[t].name : NULL;
}
