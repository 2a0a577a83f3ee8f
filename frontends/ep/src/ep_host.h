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

#endif /* MEP_EP_HOST_H */
