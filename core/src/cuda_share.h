/* cuda_share.h - what the CUDA kernel path (cuda_kpath.c) and the device
 * window (devwin.c) both do with the nvlink transport: find it, ask it
 * whether it reaches a peer, and share a device allocation: register it,
 * publish its remote key in the store, import and map a peer's. */
#ifndef MEP_SRC_CUDA_SHARE_H
#define MEP_SRC_CUDA_SHARE_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

/* The index of the nvlink transport in comm->tps when it is loaded,
 * started and can map peers' memory (ABI 1.2 map), else -1. */
int mep__cu_nvlink_index(const mep_comm_t *comm);

/* 1 when transport `t` (nvlink) reaches rank `peer` according to the
 * peer's published card, else 0 with the reason in why. The transport
 * answers the same on both sides. */
int mep__cu_nvlink_reaches(mep_comm_t *comm, int t, int peer, char *why,
                           size_t why_len);

/* Publishes this rank's remote key under "<ns>/<what>/<serial>/<rank>.
 * <incarnation>"; `serial` must be the same on every rank for the same
 * allocation and differ between allocations. */
int mep__cu_publish_key(mep_comm_t *comm, const char *what, uint64_t serial,
                        const void *rkey, size_t len);

/* Connects transport `t` to `peer`, waits for its key of (what, serial)
 * (the communicator's timeout), imports and maps it. *ep and *rmr are
 * set as soon as they exist, so a caller releases them on failure too. */
int mep__cu_import_peer(mep_comm_t *comm, int t, const char *what,
                        uint64_t serial, int peer, mep_tp_ep_t **ep,
                        mep_tp_rmr_t **rmr, void **mapped);

#endif
