/*
 * addr.c - the verbs address blob and the rule that says whether two ranks
 * reach each other over RDMA. Pure functions: unit-tested without a device.
 *
 * Blob (56 B, little-endian): u32 magic "MEPV", u16 version, u8 link layer
 * (1 InfiniBand, 2 Ethernet), u8 port, u8 gid[16], u16 lid, u8 active MTU
 * (1..5), u8 IPv4 prefix length of the GID's subnet (0: unknown or not
 * IPv4), u32 zero, u64 fabric (a hash of [verbs] fabric, 0 when unset),
 * then the bootstrap address (handshake.h, 16 B).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "verbs.h"

#define VERBS_ADDR_MAGIC 0x5650454du /* "MEPV" */
#define VERBS_ADDR_VERSION 1

void mep__verbs_addr_encode(uint8_t out[MEP_VERBS_ADDR_LEN],
                            const mep__verbs_addr_t *a) {
  memset(out, 0, MEP_VERBS_ADDR_LEN);
  mep__rdma_put32(out, VERBS_ADDR_MAGIC);
  mep__rdma_put16(out + 4, VERBS_ADDR_VERSION);
  out[6] = a->link_layer;
  out[7] = a->port;
  memcpy(out + 8, a->gid, 16);
  mep__rdma_put16(out + 24, a->lid);
  out[26] = a->mtu;
  out[27] = a->prefix;
  mep__rdma_put64(out + 32, a->fabric);
  mep__rdma_boot_addr_encode(out + 40, &a->boot);
}

#define bad(why, n, ...) mep__rdma_why(why, n, MEP_ERR_PROTOCOL, __VA_ARGS__)
#define no(why, n, ...) mep__rdma_why(why, n, 0, __VA_ARGS__)

int mep__verbs_addr_decode(const void *blob, size_t len, mep__verbs_addr_t *a,
                           char *why, size_t why_len) {
  const uint8_t *in = blob;
  if (!blob || len != MEP_VERBS_ADDR_LEN)
    return bad(why, why_len, "a verbs address of %zu bytes, want %d", len,
               MEP_VERBS_ADDR_LEN);
  if (mep__rdma_get32(in) != VERBS_ADDR_MAGIC)
    return bad(why, why_len, "not a verbs address (magic %#x)",
               mep__rdma_get32(in));
  if (mep__rdma_get16(in + 4) != VERBS_ADDR_VERSION)
    return bad(why, why_len, "verbs address version %u, this side speaks %d",
               mep__rdma_get16(in + 4), VERBS_ADDR_VERSION);
  memset(a, 0, sizeof *a);
  a->link_layer = in[6];
  a->port = in[7];
  memcpy(a->gid, in + 8, 16);
  a->lid = mep__rdma_get16(in + 24);
  a->mtu = in[26];
  a->prefix = in[27];
  a->fabric = mep__rdma_get64(in + 32);
  if (mep__rdma_get32(in + 28))
    return bad(why, why_len, "the verbs address has nonzero padding");
  if ((a->link_layer != 1 && a->link_layer != 2) || a->port == 0 ||
      a->mtu < 1 || a->mtu > 5 || a->prefix > 32)
    return bad(why, why_len, "the verbs address names link layer %u, port "
               "%u, MTU code %u, prefix /%u", a->link_layer, a->port, a->mtu,
               a->prefix);
  return mep__rdma_boot_addr_decode(in + 40, &a->boot, why, why_len);
}

/* FNV-1a: a stable hash of the fabric's name, never 0 for a name. */
uint64_t mep__verbs_fabric_hash(const char *name) {
  if (!name || !name[0]) return 0;
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *c = (const void *)name; *c; c++) {
    h ^= *c;
    h *= 0x100000001b3ull;
  }
  return h ? h : 1;
}

static int is_v4(const uint8_t g[16]) {
  static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g, pre, 12) == 0;
}

static uint32_t v4_of(const uint8_t g[16]) {
  return (uint32_t)g[12] << 24 | (uint32_t)g[13] << 16 |
         (uint32_t)g[14] << 8 | g[15];
}

/* RoCE with IPv4 GIDs: one subnet, measured with the shorter of the two
 * prefixes (so both sides agree); a prefix of 0 is unknown and matches. */
static int same_v4_subnet(const mep__verbs_addr_t *a,
                          const mep__verbs_addr_t *b, char *why, size_t n) {
  int bits = a->prefix < b->prefix ? a->prefix : b->prefix;
  uint32_t mask = bits ? ~0u << (32 - bits) : 0;
  if ((v4_of(a->gid) & mask) == (v4_of(b->gid) & mask)) return 1;
  char x[INET_ADDRSTRLEN], y[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, a->gid + 12, x, sizeof x);
  inet_ntop(AF_INET, b->gid + 12, y, sizeof y);
  return no(why, n, "another RoCE subnet (%s/%d and %s/%d; set [verbs] "
            "fabric to join routed subnets)", x, a->prefix, y, b->prefix);
}

int mep__verbs_reach(const mep__verbs_addr_t *a, const mep__verbs_addr_t *b,
                     char *why, size_t why_len) {
  if (a->fabric || b->fabric)
    return a->fabric == b->fabric
               ? 1
               : no(why, why_len, "another fabric ([verbs] fabric differs "
                    "or is set on one side only)");
  if (a->link_layer != b->link_layer)
    return no(why, why_len, "another link layer (InfiniBand and Ethernet)");
  if (a->link_layer == 2 && is_v4(a->gid) && is_v4(b->gid))
    return same_v4_subnet(a, b, why, why_len);
  if (memcmp(a->gid, b->gid, 8) != 0)
    return no(why, why_len, "another %s subnet (the GIDs' prefixes differ)",
              a->link_layer == 1 ? "InfiniBand" : "RoCE");
  return 1;
}
