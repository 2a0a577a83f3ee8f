/* desc.h - the parts of a device descriptor (transport.h, ABI 1.3; the
 * local part, ABI 1.6) as the descriptors check asks a plugin for them:
 * every call made with poisoned room, every part checked against its
 * header and props, and both ranks' answers compared. */
#ifndef PC_DESC_H
#define PC_DESC_H

#include <stddef.h>
#include <stdint.h>

#include "sess.h"

/* Where a part comes from: device_descriptor(ctx, peer) for the peer
 * part, device_region(ep, rmr) for the region part of an import,
 * device_local(ctx, mr) for the local part of an own registration. */
typedef struct pc_part_src {
  pc_sess_t *s;
  int peer;          /* the peer part's rank */
  mep_tp_rmr_t *rmr; /* the region part's import; NULL for the others */
  mep_tp_mr_t *mr;   /* the local part's registration; NULL for the
                      * others */
} pc_part_src_t;

typedef struct pc_part {
  int rc;          /* what the plugin returned */
  char err[512];   /* pc_err(rc) when rc != 0 */
  size_t len;      /* the part's size when rc == 0 */
  unsigned char bytes[MEP_DEV_DESC_MAX];
  mep_dev_desc_t hdr;
} pc_part_t;

/* "device_descriptor", "device_region" or "device_local". */
const char *pc_part_fn(const pc_part_src_t *src);

/* Asks for the part with MEP_DEV_DESC_MAX bytes of room. Fails the check
 * when the plugin writes past that room, or returns 0 with a part that is
 * too long, shorter than its header, of another kind than props.dev_kind,
 * of version 0, or whose header size is not *len. Other return codes are
 * left to the caller (in out->rc). */
void pc_part_get(const pc_part_src_t *src, pc_part_t *out);

/* The part `p` (returned 0) asked for again with too little room (one
 * byte less, and none): an error, and not a byte written past the room. */
void pc_part_too_small(const pc_part_src_t *src, const pc_part_t *p);

/* Both ranks compare the answers they got (the code, the header, and for
 * MEP_DEV_PTR the fields that must match); fails naming both. */
void pc_part_agree(pc_sess_t *s, const pc_part_src_t *src,
                   const pc_part_t *p);

/* The fields of MEP_DEV_PTR parts: the peer part's device and flags; the
 * region part's base (not 0) and len (the peer's region length). */
void pc_part_ptr_peer(const pc_part_t *p);
void pc_part_ptr_region(const pc_part_t *p, uint64_t region_len);

/* The fields of MEP_DEV_MLX5 parts: the peer part's queue (QP number,
 * power-of-two send queue and CQ, objects at nonzero addresses) and a
 * region or local part's len (the region's length). */
void pc_part_mlx5_peer(const pc_part_t *p);
void pc_part_mlx5_region(const pc_part_src_t *src, const pc_part_t *p,
                         uint64_t region_len);

#endif
