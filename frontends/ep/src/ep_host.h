/* ep_host.h - the CPU path's state and helpers shared by its files
 * (ep_host.c: create/destroy; ep_host_dispatch.c; ep_host_combine.c). */
#ifndef MEP_EP_HOST_H
#define MEP_EP_HOST_H

#include <stdint.h>

#include "ep_impl.h"

struct mep__ep_host {
  void *mem;             /* lay.total bytes, page-aligned, zeroed, then
                          * this rank's index stage */
  mep_region_t *region;  /* mem, registered on every rank */
  uint64_t index_stage;  /* offset in mem: [ranks][local][tokens] int32,
                          * the index entries a dispatch sends */
  /* Calls counted apart per kind and phase, from 1: a SEND-only call and
   * the RECV-only call that ends it use the same seq. */
  uint64_t disp_sent, disp_recvd, comb_sent, comb_recvd;
  uint32_t *counts;      /* [experts]: tokens sent to each, this call */
};

/* Waits until every put so far has left the stages. A peer's failure is
 * not this call's: it shows in the active ranks. */
int mep__ep_host_flush(mep_ep_buffer_t *b, const mep__ep_call_t *c,
                       const char *fn);

/* A put or signal to dst failed with rc: a peer that died or left is
 * cleared in active (returns 0); anything else is the call's error. */
int mep__ep_host_peer_error(const mep__ep_call_t *c, int dst, int rc);

#endif /* MEP_EP_HOST_H */
