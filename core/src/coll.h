/* coll.h - the collective engine: plans of exchange steps, executed chunk
 * by chunk through double-buffered staging on the progress thread.
 *
 * A step moves, for every ordered pair that takes part, one message of any
 * length (0 too). Each message travels in chunks of at most chunk_bytes;
 * chunk k of a pair uses staging slot k mod 2 on both sides, so copying
 * chunk k+1 in overlaps the transfer of chunk k. Every chunk carries a
 * header (collective sequence number, a digest of the operation, its step
 * and index, the message length) that the receiver checks: ranks that
 * disagree get MEP_ERR_MISMATCH instead of corrupt data. Signals are chunk
 * sequence numbers per pair that only grow; the receiver returns a credit
 * (the sequence number it consumed) so the sender knows when a slot is
 * free again. */
#ifndef MEP_SRC_COLL_H
#define MEP_SRC_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

/* At communicator creation, after connections, on every rank in the same
 * order: registers the staging regions. */
int mep__coll_init(mep_comm_t *comm);
/* At destroy, after the engine was closed. */
void mep__coll_fini(mep_comm_t *comm);

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
  void *owned[4];         /* buffers the plan frees (temporary copies) */
} mep__plan_t;

/* Allocates the per-rank arrays of a step (zeroed). */
int mep__step_alloc(mep__step_t *st, int size);

/* Starts executing `plan` (ownership passes) as a collective request. */
int mep__coll_start(mep_comm_t *comm, mep__plan_t *plan, mep_req_t **out);

/* [core] two_shot_bytes: the one-shot/two-shot switch. */
size_t mep__coll_two_shot(const mep_comm_t *comm);

/* Frees a plan's arrays and owned buffers. */
void mep__plan_free(mep__plan_t *plan);

#endif
