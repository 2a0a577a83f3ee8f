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
 * free again.
 *
 * The engine (coll.c) runs on the request engine (req.c) and the failure
 * detector (ft.c), builds its plans with plan.c and moves data with
 * put/signal (rma.c); the entry points (coll_api.c) sit above it. It
 * answers the failure detector through comm->coll_done_from. */
#ifndef MEP_SRC_COLL_H
#define MEP_SRC_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "plan.h"
#include "req.h"

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
void mep__coll_set_ops(mep_comm_t *comm, uint64_t ops);

/* Zero-copy sends so far (writes from callers' buffers, every peer) and
 * the registration cache: entries held, registrations made. For tests. */
void mep__coll_zc_stats(const mep_comm_t *comm, uint64_t *writes,
                        int *entries, unsigned long *made);
/* Chunks this rank put straight into receivers' buffers so far (landing,
 * coll.c). For tests. */
uint64_t mep__coll_landed(const mep_comm_t *comm);
/* For tests: where in-place inputs went aside, and its capacity. */
void mep__coll_aside(const mep_comm_t *comm, const uint8_t **p, size_t *cap);

/* Starts `spec` (ownership passes) as a collective request, with the
 * request hooks `hooks` (NULL: none; req.h). */
int mep__coll_start(mep_comm_t *comm, mep__coll_spec_t *spec,
                    const mep__req_hooks_t *hooks, mep_req_t **out);

/* ------------------------------------------- the entry points (coll_api.c)
 * Above the engine: they check the arguments, build the spec and start
 * it. */

/* A collective of one count, as its mep.h entry point takes it:
 * broadcast's buffer is `recv`; `op` counts for reductions only, `root`
 * for rooted collectives only. */
typedef struct mep__coll_call {
  int kind; /* broadcast, reduce, allreduce, allgather, reduce_scatter,
               alltoall, gather or scatter */
  const void *send;
  void *recv;
  size_t count;
  mep_dtype_t dtype;
  mep_op_t op;
  int root;
} mep__coll_call_t;

/* Starts `c` as its mep.h entry point does (the same checks and
 * messages), with the request hooks `hooks` (NULL: none): how the CUDA
 * staged path (cuda_stage.c) holds a host collective until its input is
 * copied in. */
int mep__coll_submit(mep_comm_t *comm, const mep__coll_call_t *c,
                     const mep__req_hooks_t *hooks, mep_req_t **req);

/* A barrier of `kind` whose `tag` every rank must pass equal; blocking. */
int mep__coll_barrier_tagged(mep_comm_t *comm, int kind, uint64_t tag);

#endif
