/* comm.h - the communicator's internals, shared by every part of the core:
 * its creation steps (comm.c), the subsystems' state (comm_state.c), the
 * peer table (peer.c), progress, regions, put/signal and the engine.
 *
 * The layers (docs/architecture.md, "Layering") call downward only; where
 * a lower one must reach an upper one, the upper one registers callbacks
 * here: the request engine with the progress thread (progress_hooks), the
 * subsystems with the engine (engine_hooks), the collectives with the
 * failure detector (coll_done_from). */
#ifndef MEP_SRC_COMM_H
#define MEP_SRC_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "clock.h"
#include "mep/mep.h"
#include "mep/transport.h"
#include "route.h"

#define MEP_SECRET_LEN 32
#define MEP_SELF_ROUTE (-1)

/* One transport loaded for a communicator. */
typedef struct mep__tp {
  char *name;
  mep_plugin_t *plugin;
  const mep_transport_t *vt;
  mep_tp_ctx_t *ctx;
  mep_tp_env_t env;
  mep_tp_props_t props;
  int used; /* routes at least one peer */
} mep__tp_t;

typedef struct mep__peer {
  int tp;              /* index into comm->tps, or MEP_SELF_ROUTE */
  mep_tp_ep_t *ep;
  _Atomic int failed;  /* 0, or the MEP_ERR_* that failed it */
} mep__peer_t;

typedef struct mep__progress mep__progress_t;

/* The request engine (req.c), as the progress thread (progress.c) calls
 * it: a pass over the requests (> 0: work done, keep spinning), and
 * whether requests are pending (the thread must not sleep on fds). */
typedef struct mep__progress_hooks {
  int (*advance)(mep_comm_t *comm);
  int (*busy)(mep_comm_t *comm);
} mep__progress_hooks_t;

/* Work a subsystem (p2p.c, ft.c) does on every pass of the engine, with
 * the engine lock held: advance returns > 0 when it did something; busy
 * (may be NULL) says the engine must keep polling. The phase places it
 * around the request lists (req.h, mep__engine_add_hook). */
typedef struct mep__engine_hook {
  int phase;
  int (*advance)(mep_comm_t *comm);
  int (*busy)(mep_comm_t *comm);
} mep__engine_hook_t;
#define MEP__ENGINE_MAX_HOOKS 4

struct mep_comm {
  int rank, size;
  int max_size;             /* rank slots; arrays by rank have this many */
  int joining;              /* created to join a running group */
  int64_t *incarnation;     /* per rank: the process admitted last */
  mep_store_t *store;
  char *ns;                 /* store key prefix */
  mep_config_t *own_cfg;    /* loaded by us, freed with the comm */
  const mep_config_t *cfg;
  int timeout_ms;
  uint8_t secret[MEP_SECRET_LEN];

  mep__tp_t *tps;
  int ntps;
  mep__peer_t *peers;
  mep__card_t card;         /* what this rank published */

  pthread_mutex_t lock;     /* the region list and ids */
  uint32_t next_region;
  mep_region_t **regions;   /* still registered, for destroy */
  size_t nregions;
  /* The subsystems' regions (ids below state_regions) are published as
   * one store value per rank (region_state.c); while the state is
   * imported, bundles[] keeps each peer's, read once. */
  int state_published;
  uint32_t state_regions;
  pthread_mutex_t bundle_mu;
  struct mep__bundle *bundles;

  /* Puts issued and completed, for mep_flush; the first failure seen. */
  _Atomic uint64_t issued, completed;
  _Atomic int first_error;
  _Atomic int first_error_peer;
  /* Per peer: completed writes whose token has MEP__TOKEN_ZC (region.h),
   * counted by the progress thread for the collective engine (coll.c,
   * which allocates it). */
  _Atomic uint64_t *zc_done;

  mep__progress_t *progress;
  mep__progress_hooks_t progress_hooks; /* registered by req.c */

  /* Requests (req.c): collectives run in order, one at a time. */
  pthread_mutex_t engine_lock;
  mep__engine_hook_t engine_hooks[MEP__ENGINE_MAX_HOOKS]; /* p2p.c, ft.c */
  int nengine_hooks;
  mep_req_t *coll_head, *p2p_head;
  _Atomic int engine_pending;
  int engine_closed;
  /* Threads blocked in mep_req_wait sleep here; a finishing request
   * wakes them when there are any. */
  pthread_mutex_t wait_mu;
  pthread_cond_t wait_cv;
  _Atomic int sleepers;
  struct mep__coll *coll; /* collective staging (coll.c) */
  struct mep__p2p *p2p;   /* point-to-point rings (p2p.c) */
  struct mep__ft *ft;     /* active set, control channel (ft.c) */
  struct mep__cuda *cuda; /* CUDA collectives (cuda_*.c), NULL until used */
  struct mep__devroutes *devroutes; /* GPU kernels' routes (devroute.c) */
  /* Registered by the collective engine (coll.c) for the failure detector
   * (ft.c): whether p told this rank it holds all data of the running
   * collective, so that p closing its communicator is no failure of it. */
  int (*coll_done_from)(const mep_comm_t *comm, int p);
};

/* Marks `peer` failed with `code` (first failure wins) and logs it once
 * (peer.c). */
void mep__comm_fail_peer(mep_comm_t *comm, int peer, int code,
                         const char *why);

/* The creation steps (comm.c), shared by creation (comm_api.c) and
 * recovery (recover.c): the job secret, the transports and this rank's
 * card; a peer's card; the route to a peer and its connection. */
struct mep__card;
int mep__comm_secret_and_card(mep_comm_t *comm);
int mep__comm_fetch_card(mep_comm_t *comm, int peer, struct mep__card *card);
int mep__comm_connect_peer(mep_comm_t *comm, int p,
                           const struct mep__card *card, mep_tp_ep_t **ep);
/* All of them for a new group: secret, card, every peer's card, routes
 * (closing the transports no route uses) and connections. */
int mep__comm_connect(mep_comm_t *comm);
/* At destroy, after the endpoints closed: the transports and the card. */
void mep__comm_unload(mep_comm_t *comm);

/* The subsystems' state (comm_state.c): the collectives', point-to-point's
 * and the control channel's regions, registered in the same order on
 * every rank, then the active peers' imported. */
int mep__comm_setup_state(mep_comm_t *comm);
int mep__comm_import_state(mep_comm_t *comm);

/* Joining a running group (recover.c). */
int mep__comm_join(mep_comm_t *comm);

/* A timeout argument: negative means the communicator's. */
static inline int mep__timeout_or_default(const mep_comm_t *comm,
                                          int timeout_ms) {
  return timeout_ms < 0 ? comm->timeout_ms : timeout_ms;
}

/* The progress engine (progress.c): one thread per communicator that
 * polls every used transport and accounts completions. Waiters announce
 * themselves so the thread stays awake while someone waits. */
int mep__progress_start(mep_comm_t *comm);
void mep__progress_stop(mep_comm_t *comm);
void mep__progress_waiter_enter(mep_comm_t *comm);
void mep__progress_waiter_leave(mep_comm_t *comm);
/* Wakes the thread if it sleeps (work was submitted). */
void mep__progress_kick(mep_comm_t *comm);

/* A thread waiting for something first makes progress itself for a short
 * while (small messages then finish without any thread hand-off), keeping
 * the progress thread out of the way; then it backs off and lets the
 * progress thread work:
 *   mep__waiter_t w; mep__wait_begin(&w, comm);
 *   while (!condition) mep__wait_step(&w);   (with a deadline check)
 *   mep__wait_end(&w);
 * mep__wait_step returns 1 while the waiter still drives progress. */
typedef struct mep__waiter {
  mep_comm_t *comm;
  uint64_t drive_until; /* ms */
  int driving;
  unsigned rounds;
  mep__backoff_t backoff;
} mep__waiter_t;
void mep__wait_begin(mep__waiter_t *w, mep_comm_t *comm);
int mep__wait_step(mep__waiter_t *w);
void mep__wait_end(mep__waiter_t *w);

#endif
