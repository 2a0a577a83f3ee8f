/* devroute.h - the transport that serves GPU kernels for each peer.
 *
 * Chosen by what transports declare, never by their names: for a peer,
 * the first transport of the communicator's list (MEP_TRANSPORTS / [core]
 * transports order) that runs here and on the peer, declares a device
 * kind the caller's kernels know, reaches the peer (reachable, on the
 * exchanged cards) and, once connected, gives a device descriptor for it.
 * Kinds go first in the order of their values: a transport that maps the
 * peer's memory (MEP_DEV_PTR) wins over one whose requests kernels post
 * (MEP_DEV_MLX5), wherever the list puts them, as loads and stores over
 * NVLink beat a NIC's round trip.
 * [core] device_transport = NAME allows only that transport. Every step
 * answers alike on both sides (the ABI requires it of reachable and
 * device_descriptor), so both ranks of a pair reach the same choice.
 *
 * The choice, the connection and the descriptor's peer part are kept per
 * peer and kind until that rank's process is replaced (a new incarnation)
 * or the communicator goes, so callers asking for different kinds (the
 * device window, the CUDA kernel path) do not undo each other's. Callers
 * are collective (device windows, the CUDA kernel path): a
 * connection-based transport connects both sides in increasing rank
 * order, as communicator creation does. */
#ifndef MEP_SRC_DEVROUTE_H
#define MEP_SRC_DEVROUTE_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

/* Device kinds as a bit set: (1u << MEP_DEV_PTR) | ... */
#define MEP__DEV_KINDS(k) (1u << (k))

typedef struct mep__devroute {
  int tp;                 /* index in comm->tps */
  mep_tp_ep_t *ep;
  uint64_t gen;           /* tells this choice from later ones */
  mep_dev_kind_t kind;
  uint8_t desc[MEP_DEV_DESC_MAX]; /* the peer part */
  size_t desc_len;
} mep__devroute_t;

/* The device route to `peer` for kernels that know the kinds in `kinds`
 * (the first kind, in the order of values, that some transport serves):
 * 0 with *out set, MEP_ERR_UNREACHABLE when no transport serves kernels
 * for that peer (the reason of each transport in `why`), or another error
 * (the store, a connect that failed). *out stays valid until the
 * communicator is destroyed or the peer's process is replaced. */
int mep__devroute_get(mep_comm_t *comm, int peer, unsigned kinds,
                      const mep__devroute_t **out, char *why,
                      size_t why_len);

/* 1 while the route of generation `gen` to `peer` is in use: a route is
 * replaced, and its connection closed (which releases what was imported
 * through it), when the peer's process is. */
int mep__devroute_current(mep_comm_t *comm, int peer, uint64_t gen);

/* At destroy, before the transports close: closes the connections the
 * routes opened (not the communicator's own routes). */
void mep__devroute_fini(mep_comm_t *comm);

#endif
