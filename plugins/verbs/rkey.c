/*
 * rkey.c - the verbs remote-key blob: what a peer needs to write into a
 * registered region. Pure functions: unit-tested without a device.
 *
 * Blob (32 B, little-endian): u32 magic "MEPW", u16 version (2), u8
 * memory kind, u8 flags (MEP_VERBS_RKEY_INBAND: the owner's poll()
 * applies signals to the region, inband.c), u32 owner rank, u32 rkey, u64
 * address of the region's first byte in the owner's address space (as
 * the device sees it), u64 length. Version 1 had a u16 kind and no flags;
 * it is still read (a key without flags).
 */
#include <string.h>

#include "verbs.h"

#define VERBS_RKEY_MAGIC 0x5750454du /* "MEPW" */
#define VERBS_RKEY_VERSION 2

void mep__verbs_rkey_encode(uint8_t out[MEP_VERBS_RKEY_LEN],
                            const mep__verbs_rkey_t *k) {
  mep__rdma_put32(out, VERBS_RKEY_MAGIC);
  mep__rdma_put16(out + 4, VERBS_RKEY_VERSION);
  out[6] = (uint8_t)k->kind;
  out[7] = (uint8_t)k->flags;
  mep__rdma_put32(out + 8, k->rank);
  mep__rdma_put32(out + 12, k->rkey);
  mep__rdma_put64(out + 16, k->addr);
  mep__rdma_put64(out + 24, k->len);
}

int mep__verbs_rkey_decode(const void *blob, size_t len, mep__verbs_rkey_t *k,
                           char *why, size_t why_len) {
  const uint8_t *in = blob;
  const char *what = NULL;
  if (!blob || len != MEP_VERBS_RKEY_LEN)
    what = "its length is not 32 bytes";
  else if (mep__rdma_get32(in) != VERBS_RKEY_MAGIC)
    what = "it is not a verbs key (magic)";
  else if (mep__rdma_get16(in + 4) != 1 &&
           mep__rdma_get16(in + 4) != VERBS_RKEY_VERSION)
    what = "its version is not 1 or 2";
  if (what)
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL, "bad remote key "
                         "(%zu bytes): %s", len, what);
  int v1 = mep__rdma_get16(in + 4) == 1;
  k->kind = v1 ? mep__rdma_get16(in + 6) : in[6];
  k->flags = v1 ? 0 : in[7];
  k->rank = mep__rdma_get32(in + 8);
  k->rkey = mep__rdma_get32(in + 12);
  k->addr = mep__rdma_get64(in + 16);
  k->len = mep__rdma_get64(in + 24);
  if (k->kind != MEP_MEM_HOST && k->kind != MEP_MEM_CUDA)
    what = "an unknown memory kind";
  else if (k->flags & ~MEP_VERBS_RKEY_INBAND)
    what = "unknown flags";
  else if (k->len && k->addr > UINT64_MAX - k->len)
    what = "a region that wraps around the address space";
  return what ? mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL,
                              "bad remote key: %s", what)
              : 0;
}
