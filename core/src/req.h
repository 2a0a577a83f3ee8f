/* req.h - asynchronous requests and the engine that advances them on the
 * progress thread.
 *
 * A request is advanced by its `advance` function, called only from the
 * communicator's progress thread (or a thread driving progress while it
 * waits), never blocking; it returns one of MEP__ADV_*. Collectives form
 * a FIFO of which only the head advances (they run one at a time, in call
 * order); point-to-point requests all advance.
 *
 * The engine sits below the subsystems that make requests: it calls none
 * of them by name. The progress thread reaches it through the hooks it
 * registers (mep__engine_init), and the subsystems that need a pass of
 * their own (the point-to-point rings, the failure detector) register
 * theirs with it (mep__engine_add_hook). */
#ifndef MEP_SRC_REQ_H
#define MEP_SRC_REQ_H

#include <stdatomic.h>
#include <stddef.h>

#include "comm.h"

enum { MEP__REQ_COLL = 0, MEP__REQ_P2P = 1 };
enum { MEP__REQ_RUNNING = 0, MEP__REQ_DONE = 1, MEP__REQ_DETACHED = 2 };

/* What an advance function returns. */
enum {
  MEP__ADV_WAIT = 0,  /* it only waited: nothing moved */
  MEP__ADV_DONE = 1,  /* it finished, its outcome set with mep__req_set */
  MEP__ADV_MOVED = 2, /* it moved forward, not finished: the progress
                         thread keeps spinning */
};

/* Returns MEP__ADV_*. */
typedef int (*mep__advance_fn)(mep_req_t *req);

/* Optional, for work that waits on something outside the engine (a GPU
 * copy): at the head of the FIFO the request does not start while
 * gate(arg) returns 0; on_settle runs once it finished, before waiters
 * wake. Both on the progress thread, engine lock held. How the CUDA
 * staging path gates a host collective on its copy in and lets the stream
 * go on when it finished (coll.h, mep__coll_submit). */
typedef struct mep__req_hooks {
  int (*gate)(void *arg);
  void (*on_settle)(mep_req_t *req, void *arg);
  void *arg;
} mep__req_hooks_t;

struct mep_req {
  mep_comm_t *comm;
  _Atomic int state;       /* MEP__REQ_* */
  int status;              /* final status, valid once DONE */
  char msg[512];           /* its message when status < 0 */
  size_t bytes;            /* mep_recv: bytes received */
  int source;              /* mep_recv: the sender of what it received */
  int *dropped;            /* collectives: ranks lost (MEP_OK_DEGRADED) */
  int ndropped;
  int kind;                /* MEP__REQ_COLL or MEP__REQ_P2P */
  mep__advance_fn advance;
  void (*cleanup)(mep_req_t *req); /* frees impl; may be NULL */
  void *impl;
  mep_req_t *next;         /* in the engine's list */
  mep__req_hooks_t hooks;  /* all NULL unless set before the start */
};

/* A new running request (not yet submitted). NULL when out of memory. */
mep_req_t *mep__req_new(mep_comm_t *comm, int kind, mep__advance_fn advance,
                        void *impl, void (*cleanup)(mep_req_t *));

/* Records the outcome (call before advance returns MEP__ADV_DONE). */
void mep__req_set(mep_req_t *req, int status, const char *fmt, ...)
    MEP_PRINTF(3, 4);

/* Hands the request to the progress thread. Then either gives it to the
 * caller (out != NULL) or waits for it with the communicator's timeout,
 * frees it and returns its status. On submission failure the request is
 * freed and the error returned. */
int mep__req_start(mep_req_t *req, mep_req_t **out);

/* At creation, before the progress thread starts: registers the engine
 * with it (comm->progress_hooks). */
void mep__engine_init(mep_comm_t *comm);

/* Where a subsystem's pass runs in an engine pass. The order matters:
 *   MEP__ENGINE_BEFORE  the point-to-point rings drain (p2p.c), even while
 *                       this rank posts nothing, so a sender of more than
 *                       a ring's worth is not stuck until the next recv;
 *   (the point-to-point requests, then the head of the collective FIFO)
 *   MEP__ENGINE_AFTER   the failure detector (ft.c), after the
 *                       collectives, so that one that can finish does so
 *                       before this rank tells an agreement what it
 *                       finished.
 * Hooks of one phase run in the order they were added. */
enum { MEP__ENGINE_BEFORE = 0, MEP__ENGINE_AFTER = 1 };

/* Adds a pass to every engine pass (see mep__engine_hook_t in comm.h);
 * at set-up, before the progress thread starts. MEP_ERR_INVALID when the
 * communicator has MEP__ENGINE_MAX_HOOKS already. */
int mep__engine_add_hook(mep_comm_t *comm, int phase,
                         int (*advance)(mep_comm_t *),
                         int (*busy)(mep_comm_t *));
/* At destroy, after the progress thread stopped: fails what is pending
 * with MEP_ERR_CLOSED. */
void mep__engine_close(mep_comm_t *comm);

#endif
