/* ft.h - fault tolerance: the active set and its epoch, failure detection
 * and the survivors' agreement (docs/fault-tolerance.md).
 *
 * Every rank sends each peer, over a small control region, a snapshot of
 * its state whenever that state changes: epoch, active set, the highest
 * collective it committed, a probe nonce to echo and the echo of the
 * peer's, and during an agreement its view of who is alive. Receiving only
 * the latest snapshot of a peer is always enough, so a slow reader never
 * needs a queue.
 *
 * An agreement starts when a rank suspects an active peer (its transport
 * reported it, or it missed a probe). The lowest unsuspected rank
 * coordinates: it queries the others, waits for each one's view (probing
 * the silent), keeps the largest set of ranks in rank order that all see
 * each other, claims the next epoch in the store (so two coordinators can
 * never both win) and announces it; every rank that adopts a new epoch
 * announces it too. All of it runs on the engine (engine_lock held).
 *
 * Called by the collectives (coll.c), point-to-point (p2p.c), recovery
 * and the CUDA kernel path; calls put/signal (rma.c), the engine's hook
 * registration (req.c) and ft_claim.c. */
#ifndef MEP_SRC_FT_H
#define MEP_SRC_FT_H

#include <stdint.h>

#include "comm.h"

/* At creation, after the collective staging (regions in the same order on
 * every rank), with every rank of the group active at epoch 0 (`act` NULL)
 * or, for a joining process, the set and epoch it was welcomed with. */
int mep__ft_init(mep_comm_t *comm);
/* Imports the active peers' control regions now, so that detecting and
 * agreeing never need the store (which may be gone by then). */
int mep__ft_connect(mep_comm_t *comm);
void mep__ft_fini(mep_comm_t *comm);

/* The engine's pass, which mep__ft_init registers with the request
 * engine to run after the request lists (req.h): receives snapshots,
 * detects failures, runs agreements, sends what changed. Returns > 0 when
 * it did something. */
int mep__ft_progress(mep_comm_t *comm);
/* Whether the engine must keep polling (probes or an agreement run). */
int mep__ft_busy(mep_comm_t *comm);

/* Engine, for the collectives: the epoch and its active set (n bytes,
 * valid until the next epoch), whether an agreement runs (nothing may
 * commit meanwhile), the highest collective the last agreement found
 * committed somewhere, and whether this rank was dropped. */
uint64_t mep__ft_epoch(const mep_comm_t *comm);
const uint8_t *mep__ft_act(const mep_comm_t *comm);
int mep__ft_agreeing(const mep_comm_t *comm);
/* During an agreement a collective may still finish until this rank has
 * told the agreement what it finished. */
int mep__ft_may_commit(const mep_comm_t *comm);
uint64_t mep__ft_decided(const mep_comm_t *comm);
int mep__ft_excluded(const mep_comm_t *comm);
/* A wait passed its deadline: probe every active peer for a while. */
void mep__ft_probe(mep_comm_t *comm);
uint64_t mep__ft_probe_ms(const mep_comm_t *comm);

/* Collective number `op` committed over the ranks `act` of its attempt:
 * records it and writes the ranks dropped since the previous commit into
 * dropped[] (at most n) and their count into *ndropped. */
void mep__ft_commit(mep_comm_t *comm, uint64_t op, const uint8_t *act,
                    int *dropped, int *ndropped);

/* Recovery (recover.c), engine lock held: forget everything about the
 * pair with `peer` (before it is connected again), then make the given set
 * the active one at `epoch`. */
void mep__ft_reset_peer(mep_comm_t *comm, int peer);
void mep__ft_set_members(mep_comm_t *comm, uint64_t epoch, const uint8_t *act,
                         uint64_t committed);

#endif
