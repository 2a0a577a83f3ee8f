/* desc_reach.h - a MEP_DEV_PTR region part's base, dereferenced by GPU
 * kernels (desc_reach.c). Needs CUDA memory (the session's regions). */
#ifndef PC_DESC_REACH_H
#define PC_DESC_REACH_H

#include <stdint.h>

#include "sess.h"

typedef struct pc_reach {
  pc_sess_t *s;
  const pc_region_t *mine; /* the own region, holding stream my_seed */
  uint64_t my_seed;
  uint64_t base;      /* the region part of the peer's region */
  uint64_t peer_len;  /* of the peer's region */
  uint64_t peer_seed; /* the stream the peer's region holds */
} pc_reach_t;

/* Both ranks: a kernel loads the peer's region through base and finds
 * stream peer_seed; then each stores an odd range of its own stream
 * through base, and finds the peer's store in its own region, the rest
 * unchanged. Fails the check naming the first wrong byte. */
void pc_desc_reach(const pc_reach_t *r);

#endif
