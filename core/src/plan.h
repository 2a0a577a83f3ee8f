/* plan.h - collectives as data: a validated call (the spec) and the plan
 * the engine executes for it, one or two steps of messages between pairs.
 * plan.c builds plans from specs and owns their memory; the collective
 * engine (coll.c) is its only caller, and calls it again over the
 * survivors when ranks are lost. */
#ifndef MEP_SRC_PLAN_H
#define MEP_SRC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

enum {
  MEP__COLL_BROADCAST,
  MEP__COLL_REDUCE,
  MEP__COLL_ALLREDUCE,
  MEP__COLL_ALLGATHER,
  MEP__COLL_REDUCE_SCATTER,
  MEP__COLL_ALLTOALL,
  MEP__COLL_ALLTOALLV,
  MEP__COLL_GATHER,
  MEP__COLL_SCATTER,
  MEP__COLL_BARRIER,
  MEP__COLL_PEER_STATE, /* membership barriers (recover.c) */
  MEP__COLL_RECOVER,
};

/* What a rank does in one step. Arrays have one entry per rank. */
typedef struct mep__step {
  int reduce; /* 0: messages are copied; 1: reduced in rank order */
  uint8_t *send_to;       /* 1 if a message goes to rank p */
  const uint8_t **sptr;   /* its bytes */
  size_t *sbytes;
  uint8_t *recv_from;     /* 1 if a message comes from rank p (to copy:
                             every rank but the one reducing) */
  uint8_t **rptr;         /* where it lands */
  size_t *rbytes;         /* its expected length */
  /* reduce: every rank's contribution of rlen bytes is combined in rank
   * order into rout; rself is this rank's. Only when rlen > 0 or
   * reduce_here. */
  int reduce_here;
  const uint8_t *rself;
  uint8_t *rout;
  size_t rlen;
} mep__step_t;

/* A collective: its identity (for the digest and messages) and steps. */
typedef struct mep__plan {
  int kind;
  mep_dtype_t dtype;
  mep_op_t op;
  size_t count;
  int root;
  const char *algo;       /* "one-shot", "two-shot", "direct" */
  int nsteps;
  mep__step_t steps[2];
} mep__plan_t;

/* A collective as the user called it, validated: the engine builds its
 * plan from this when it starts, and again over the survivors when ranks
 * are lost. */
typedef struct mep__coll_spec {
  int kind;
  mep_dtype_t dtype;
  mep_op_t op;
  size_t count;
  int root;        /* -1: none */
  const void *send;
  void *recv;      /* broadcast: the buffer */
  size_t *v;       /* alltoallv: send counts, displs, recv counts, displs */
  size_t copy_bytes; /* in place: bytes of send copied aside at the start */
} mep__coll_spec_t;
void mep__coll_spec_free(mep__coll_spec_t *s);

/* The plan of `s` for this rank over the ranks with act[r] != 0, one-shot
 * up to `two_shot` bytes ([core] two_shot_bytes) and two-shot above.
 * MEP_ERR_PEER_FAILED when its root is not among them. */
int mep__plan_build(mep_comm_t *comm, const mep__coll_spec_t *s,
                    const uint8_t *act, size_t two_shot, mep__plan_t *p);

/* Allocates the per-rank arrays of a step (zeroed). */
int mep__step_alloc(mep__step_t *st, int size);

/* Frees a plan's arrays and owned buffers. */
void mep__plan_free(mep__plan_t *plan);

#endif
