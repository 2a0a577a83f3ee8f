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
/* Imports the active peers' staging (after connections). */
int mep__coll_connect(mep_comm_t *comm);
/* At destroy, after the engine was closed. */
void mep__coll_fini(mep_comm_t *comm);
/* Recovery: forgets the pair's sequence numbers and staged chunks, and
 * reads or sets the number of collectives started (equal on all ranks). */
void mep__coll_reset_peer(mep_comm_t *comm, int peer);
uint64_t mep__coll_ops(const mep_comm_t *comm);
/* Whether p told this rank it holds all data of the running collective:
 * then p closing its communicator is no failure of that collective. */
int mep__coll_done_from(const mep_comm_t *comm, int p);
void mep__coll_set_ops(mep_comm_t *comm, uint64_t ops);

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

/* The plan of `s` for this rank over the ranks with act[r] != 0.
 * MEP_ERR_PEER_FAILED when its root is not among them. */
int mep__plan_build(mep_comm_t *comm, const mep__coll_spec_t *s,
                    const uint8_t *act, mep__plan_t *p);

/* A barrier of `kind` whose `tag` every rank must pass equal; blocking. */
int mep__coll_barrier_tagged(mep_comm_t *comm, int kind, uint64_t tag);

/* Allocates the per-rank arrays of a step (zeroed). */
int mep__step_alloc(mep__step_t *st, int size);

/* Starts `spec` (ownership passes) as a collective request. */
int mep__coll_start(mep_comm_t *comm, mep__coll_spec_t *spec,
                    mep_req_t **out);

/* [core] two_shot_bytes: the one-shot/two-shot switch. */
size_t mep__coll_two_shot(const mep_comm_t *comm);

/* Frees a plan's arrays and owned buffers. */
void mep__plan_free(mep__plan_t *plan);

#endif
