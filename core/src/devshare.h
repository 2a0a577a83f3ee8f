/* devshare.h - a device allocation that GPU kernels of this rank's peers
 * reach through their device routes (devroute.h): the device window's
 * device part and the CUDA kernel path's workspace.
 *
 * Two steps, each collective over the ranks that share: open() registers
 * the allocation (device memory, or the window's host part for kinds
 * that reach peers through it) with every transport some peer's route
 * uses and
 * publishes the remote keys in the store; once every rank did (the caller
 * ends the step with a barrier or a host all-reduce), import() takes one
 * peer's key, imports it and asks the transport for the region part of
 * its device descriptor. Nothing here depends on a transport's name or on
 * CUDA: the transports do the registering and mapping. */
#ifndef MEP_SRC_DEVSHARE_H
#define MEP_SRC_DEVSHARE_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "devroute.h"

typedef struct mep__devshare mep__devshare_t;

/* What kernels need of one peer's part: the peer part of its route's
 * descriptor and the region part of the imported allocation. */
typedef struct mep__devpeer {
  mep__devroute_t route; /* as it was when the share was opened */
  int shared;            /* the peer shares this allocation */
  mep_tp_rmr_t *rmr;
  uint8_t region[MEP_DEV_DESC_MAX];
  size_t region_len;
  /* this rank's own allocation as the route's transport names it in
   * requests kernels post (device_local; empty for kinds without) */
  uint8_t local[MEP_DEV_DESC_MAX];
  size_t local_len;
} mep__devpeer_t;

/* Registers `len` bytes of memory of `kind` at `ptr` with the transports
 * of `routes` (size entries, NULL for a peer not shared with) and
 * publishes the keys under "<what>/<serial>": `serial` is the same on
 * every rank for one allocation and differs between allocations. */
int mep__devshare_open(mep_comm_t *comm, const char *what, uint64_t serial,
                       void *ptr, size_t len, mep_memkind_t kind,
                       const mep__devroute_t *const *routes,
                       mep__devshare_t **out);

/* Imports `peer`'s allocation (waiting for its key up to the
 * communicator's timeout) and fills *out, valid until close. */
int mep__devshare_import(mep__devshare_t *s, int peer,
                         const mep__devpeer_t **out);

/* The address kernels on this GPU use for the first byte of a MEP_DEV_PTR
 * peer's allocation. */
void *mep__devpeer_ptr(const mep__devpeer_t *p);

/* Unimports the peers' parts and deregisters this rank's. NULL: no-op. */
void mep__devshare_close(mep__devshare_t *s);

#endif
