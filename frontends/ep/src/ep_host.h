/* ep_host.h - the CPU path's state and helpers shared by its files
 * (ep_host.c: create/destroy; ep_host_dispatch.c; ep_host_combine.c). */
#ifndef MEP_EP_HOST_H
#define MEP_EP_HOST_H

#include <stdint.h>

#include "ep_impl.h"

struct mep__ep_host {
  void *mem;             /* lay.total bytes, page-aligned, zeroed */
  mep_region_t *region;  /* mem, registered on every rank */
  /* Calls counted apart per kind and phase, from 1: a SEND-only call and
   * the RECV-only call that ends it use the same seq. */
  uint64_t disp_sent, disp_recvd, comb_sent, comb_recvd;
  uint32_t *counts;      /* [experts]: tokens sent to each, this call */
};

/* Rank dst's L words (one per local expert), staged at the count stage
 * [dst][0..L-1]: all but the last as one put to offset `off` of its
 * region, then the last signalled at off + 8 (L - 1), so that the
 * receiver waits for that one alone (a signal follows every earlier put
 * to its rank). The stage is rewritten only after the flush that begins
 * the next send. Returns 0 or the transport's error. */
int mep__ep_host_send_words(mep_ep_buffer_t *b, int dst, uint64_t off);

/* The receive's side of mep__ep_host_send_words: for each active rank
 * src, waits for the last of its L words of call seq, at
 * off + 8 (src L + L - 1) (its words follow one another, and each rank's
 * follow the previous rank's), under one deadline of the call's timeout;
 * a rank that misses it is cleared in c->active. Returns 0, or the
 * wait's error other than a timeout, its message naming fn. */
int mep__ep_host_wait_words(mep_ep_buffer_t *b, const mep__ep_call_t *c,
                            uint64_t seq, uint64_t off, const char *fn);

#endif /* MEP_EP_HOST_H */
