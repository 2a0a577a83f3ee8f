/*
 * handshake_wire.c - the bootstrap's messages as bytes (handshake.h):
 * encoders, and validators that answer "good" or a sentence saying what
 * is wrong. Pure functions of their arguments, so they are unit-tested
 * and fuzzed without sockets.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "handshake.h"

int mep__rdma_why(char *why, size_t n, int code, const char *fmt, ...) {
  if (why && n) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
  }
  return code;
}
#define bad mep__rdma_why

static int all_zero(const uint8_t *p, size_t n) {
  uint8_t acc = 0;
  for (size_t i = 0; i < n; i++) acc |= p[i];
  return acc == 0;
}

/* ------------------------------------------------------------ address */

void mep__rdma_boot_addr_encode(uint8_t out[MEP_RDMA_BOOT_ADDR_LEN],
                                const mep__rdma_boot_addr_t *a) {
  memset(out, 0, MEP_RDMA_BOOT_ADDR_LEN);
  memcpy(out, a->ip, 4);
  mep__rdma_put16(out + 4, a->port);
  mep__rdma_put64(out + 8, a->incarnation);
}

int mep__rdma_boot_addr_decode(const uint8_t in[MEP_RDMA_BOOT_ADDR_LEN],
                               mep__rdma_boot_addr_t *a, char *why,
                               size_t why_len) {
  memcpy(a->ip, in, 4);
  a->port = mep__rdma_get16(in + 4);
  a->incarnation = mep__rdma_get64(in + 8);
  if (mep__rdma_get16(in + 6))
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "the bootstrap address has nonzero padding");
  if (a->port == 0)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "the bootstrap address has port 0");
  if (a->incarnation == 0)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "the bootstrap address has incarnation 0");
  return 0;
}

/* ------------------------------------------------------------- qpinfo */

void mep__rdma_qpinfo_encode(uint8_t out[MEP_RDMA_QPINFO_LEN],
                             const mep__rdma_qpinfo_t *q) {
  memset(out, 0, MEP_RDMA_QPINFO_LEN);
  memcpy(out, q->gid, 16);
  mep__rdma_put16(out + 16, q->lid);
  out[18] = q->port;
  out[19] = q->link_layer;
  out[20] = q->mtu;
  out[21] = q->nqp;
  mep__rdma_put64(out + 24, q->scratch_addr);
  mep__rdma_put32(out + 32, q->scratch_rkey);
  for (int i = 0; i < MEP_RDMA_MAX_QPS && i < q->nqp; i++) {
    mep__rdma_put32(out + 40 + 8 * i, q->qpn[i]);
    mep__rdma_put32(out + 44 + 8 * i, q->psn[i]);
  }
}

int mep__rdma_qpinfo_decode(const uint8_t *in, size_t len,
                            mep__rdma_qpinfo_t *q, char *why, size_t why_len) {
  if (len < MEP_RDMA_QPINFO_LEN)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "queue pair info of %zu bytes, want %d", len,
               MEP_RDMA_QPINFO_LEN);
  memset(q, 0, sizeof *q);
  memcpy(q->gid, in, 16);
  q->lid = mep__rdma_get16(in + 16);
  q->port = in[18];
  q->link_layer = in[19];
  q->mtu = in[20];
  q->nqp = in[21];
  q->scratch_addr = mep__rdma_get64(in + 24);
  q->scratch_rkey = mep__rdma_get32(in + 32);
  if (!all_zero(in + 22, 2) || !all_zero(in + 36, 4))
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "queue pair info has nonzero padding");
  if (q->link_layer != 1 && q->link_layer != 2)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "queue pair info names link layer %u (want 1 or 2)",
               q->link_layer);
  if (q->mtu < 1 || q->mtu > 5)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "queue pair info names MTU code %u (want 1..5)", q->mtu);
  if (q->port == 0)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "queue pair info names port 0");
  if (q->nqp < 1 || q->nqp > MEP_RDMA_MAX_QPS)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "queue pair info has %u queue pairs (want 1..%d)", q->nqp,
               MEP_RDMA_MAX_QPS);
  for (int i = 0; i < MEP_RDMA_MAX_QPS; i++) {
    uint32_t qpn = mep__rdma_get32(in + 40 + 8 * i);
    uint32_t psn = mep__rdma_get32(in + 44 + 8 * i);
    if (i >= q->nqp) {
      if (qpn || psn)
        return bad(why, why_len, MEP_ERR_PROTOCOL,
                   "queue pair info has an entry %d beyond its %u queue "
                   "pairs", i, q->nqp);
      continue;
    }
    if (qpn == 0 || qpn > 0xffffffu || psn > 0xffffffu)
      return bad(why, why_len, MEP_ERR_PROTOCOL,
                 "queue pair %d has number %#x and PSN %#x (want 24 bits, "
                 "the number not 0)", i, qpn, psn);
    q->qpn[i] = qpn;
    q->psn[i] = psn;
  }
  return 0;
}

/* ------------------------------------------------------------ headers */

void mep__rdma_hdr_encode(uint8_t out[MEP_RDMA_HDR_LEN], uint16_t type,
                          uint32_t from, uint32_t to) {
  mep__rdma_put32(out, MEP_RDMA_HS_MAGIC);
  mep__rdma_put16(out + 4, MEP_RDMA_HS_VERSION);
  mep__rdma_put16(out + 6, type);
  mep__rdma_put32(out + 8, from);
  mep__rdma_put32(out + 12, to);
}

long mep__rdma_body_len(uint16_t type, uint32_t secret_len) {
  switch (type) {
  case MEP_RDMA_MSG_HELLO:
    return MEP_RDMA_HELLO_FIXED + (long)secret_len + MEP_RDMA_QPINFO_LEN;
  case MEP_RDMA_MSG_ACCEPT: return MEP_RDMA_QPINFO_LEN;
  case MEP_RDMA_MSG_NAK: return MEP_RDMA_NAK_LEN;
  case MEP_RDMA_MSG_READY:
  case MEP_RDMA_MSG_BYE: return 0;
  }
  return -1;
}

int mep__rdma_hdr_decode(const uint8_t *in, size_t len, mep__rdma_hdr_t *h,
                         char *why, size_t why_len) {
  if (len < MEP_RDMA_HDR_LEN)
    return bad(why, why_len, MEP_ERR_PROTOCOL, "a header of %zu bytes", len);
  if (mep__rdma_get32(in) != MEP_RDMA_HS_MAGIC)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "bad magic %#x (not a mep RDMA bootstrap message)",
               mep__rdma_get32(in));
  uint16_t v = mep__rdma_get16(in + 4);
  if (v != MEP_RDMA_HS_VERSION)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "bootstrap version %u, this side speaks %d", v,
               MEP_RDMA_HS_VERSION);
  h->type = mep__rdma_get16(in + 6);
  h->from = mep__rdma_get32(in + 8);
  h->to = mep__rdma_get32(in + 12);
  if (mep__rdma_body_len(h->type, 0) < 0)
    return bad(why, why_len, MEP_ERR_PROTOCOL, "unknown message type %u",
               h->type);
  return 0;
}

/* -------------------------------------------------------------- hello */

size_t mep__rdma_hello_encode(uint8_t *out, size_t cap,
                              const mep__rdma_hello_t *h) {
  if (h->secret_len > MEP_RDMA_MAX_SECRET) return 0;
  size_t total = MEP_RDMA_HDR_LEN +
                 (size_t)mep__rdma_body_len(MEP_RDMA_MSG_HELLO,
                                            h->secret_len);
  if (cap < total) return 0;
  mep__rdma_hdr_encode(out, MEP_RDMA_MSG_HELLO, h->from, h->to);
  uint8_t *b = out + MEP_RDMA_HDR_LEN;
  mep__rdma_put64(b, h->from_inc);
  mep__rdma_put64(b + 8, h->to_inc);
  mep__rdma_put32(b + 16, h->secret_len);
  mep__rdma_put32(b + 20, 0);
  if (h->secret_len) memcpy(b + 24, h->secret, h->secret_len);
  mep__rdma_qpinfo_encode(b + 24 + h->secret_len, &h->qp);
  return total;
}

static int secret_equal(const uint8_t *a, const uint8_t *b, size_t n) {
  uint8_t diff = 0;
  for (size_t i = 0; i < n; i++) diff |= (uint8_t)(a[i] ^ b[i]);
  return diff == 0;
}

/* The fixed part of a hello: who, whom, which incarnations. */
static int hello_fixed(const uint8_t *buf, const mep__rdma_hello_expect_t *e,
                       mep__rdma_hello_t *out, char *why, size_t n) {
  mep__rdma_hdr_t h = {0};
  int rc = mep__rdma_hdr_decode(buf, MEP_RDMA_HDR_LEN, &h, why, n);
  if (rc) return rc;
  if (h.type != MEP_RDMA_MSG_HELLO)
    return bad(why, n, MEP_ERR_PROTOCOL, "message type %u where a hello "
               "belongs", h.type);
  const uint8_t *b = buf + MEP_RDMA_HDR_LEN;
  out->from = h.from;
  out->to = h.to;
  out->from_inc = mep__rdma_get64(b);
  out->to_inc = mep__rdma_get64(b + 8);
  out->secret_len = mep__rdma_get32(b + 16);
  if (mep__rdma_get32(b + 20))
    return bad(why, n, MEP_ERR_PROTOCOL, "the hello has nonzero padding");
  if (h.to != e->rank)
    return bad(why, n, MEP_ERR_PROTOCOL, "the hello is for rank %u, this is "
               "rank %u", h.to, e->rank);
  if (h.from >= e->size || h.from >= e->rank)
    return bad(why, n, MEP_ERR_PROTOCOL, "the hello comes from rank %u, "
               "which does not dial rank %u in a group of %u (the lower "
               "rank dials)", h.from, e->rank, e->size);
  if (out->from_inc == 0)
    return bad(why, n, MEP_ERR_PROTOCOL, "the hello has incarnation 0");
  if (out->secret_len > MEP_RDMA_MAX_SECRET)
    return bad(why, n, MEP_ERR_PROTOCOL, "the hello announces a secret of "
               "%u bytes (at most %d)", out->secret_len,
               MEP_RDMA_MAX_SECRET);
  return 0;
}

int mep__rdma_hello_check(const uint8_t *buf, size_t len,
                          const mep__rdma_hello_expect_t *exp,
                          mep__rdma_hello_t *out, char *why, size_t why_len) {
  size_t head = MEP_RDMA_HDR_LEN + MEP_RDMA_HELLO_FIXED;
  /* the header alone already tells a stranger */
  if (len >= MEP_RDMA_HDR_LEN && len < head) {
    mep__rdma_hdr_t h = {0};
    int rc = mep__rdma_hdr_decode(buf, len, &h, why, why_len);
    if (rc) return rc;
  }
  if (len < head) return (int)head;
  memset(out, 0, sizeof *out);
  int rc = hello_fixed(buf, exp, out, why, why_len);
  if (rc) return rc;
  size_t total = head + out->secret_len + MEP_RDMA_QPINFO_LEN;
  if (len < total) return (int)total;
  if (len > total)
    return bad(why, why_len, MEP_ERR_PROTOCOL, "%zu bytes after the hello",
               len - total);
  out->secret = buf + head;
  if (out->secret_len != exp->secret_len ||
      !secret_equal(out->secret, exp->secret, exp->secret_len))
    return bad(why, why_len, MEP_ERR_AUTH, "rank %u's hello carries the "
               "wrong job secret", out->from);
  rc = mep__rdma_qpinfo_decode(buf + head + out->secret_len,
                               MEP_RDMA_QPINFO_LEN, &out->qp, why, why_len);
  if (rc) return rc;
  if (out->to_inc != exp->incarnation)
    return bad(why, why_len, MEP_ERR_UNREACHABLE, "rank %u's hello is for "
               "incarnation %#llx of rank %u, this is %#llx (an old address)",
               out->from, (unsigned long long)out->to_inc, exp->rank,
               (unsigned long long)exp->incarnation);
  return 0;
}

/* ------------------------------------------------------------ answers */

size_t mep__rdma_accept_encode(uint8_t *out, size_t cap, uint32_t from,
                               uint32_t to, const mep__rdma_qpinfo_t *q) {
  if (cap < MEP_RDMA_HDR_LEN + MEP_RDMA_QPINFO_LEN) return 0;
  mep__rdma_hdr_encode(out, MEP_RDMA_MSG_ACCEPT, from, to);
  mep__rdma_qpinfo_encode(out + MEP_RDMA_HDR_LEN, q);
  return MEP_RDMA_HDR_LEN + MEP_RDMA_QPINFO_LEN;
}

size_t mep__rdma_nak_encode(uint8_t *out, size_t cap, uint32_t from,
                            uint32_t to, uint32_t reason) {
  if (cap < MEP_RDMA_HDR_LEN + MEP_RDMA_NAK_LEN) return 0;
  mep__rdma_hdr_encode(out, MEP_RDMA_MSG_NAK, from, to);
  mep__rdma_put32(out + MEP_RDMA_HDR_LEN, reason);
  mep__rdma_put32(out + MEP_RDMA_HDR_LEN + 4, 0);
  return MEP_RDMA_HDR_LEN + MEP_RDMA_NAK_LEN;
}

int mep__rdma_answer_check(const uint8_t *buf, size_t len, uint32_t from,
                           uint32_t to, int *nak, mep__rdma_qpinfo_t *q,
                           char *why, size_t why_len) {
  if (len < MEP_RDMA_HDR_LEN) return MEP_RDMA_HDR_LEN;
  mep__rdma_hdr_t h = {0};
  int rc = mep__rdma_hdr_decode(buf, len, &h, why, why_len);
  if (rc) return rc;
  if (h.type != MEP_RDMA_MSG_ACCEPT && h.type != MEP_RDMA_MSG_NAK)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "message type %u where an accept or a refusal belongs",
               h.type);
  if (h.from != from || h.to != to)
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "an answer from rank %u to rank %u, expected %u to %u",
               h.from, h.to, from, to);
  size_t total = MEP_RDMA_HDR_LEN + (size_t)mep__rdma_body_len(h.type, 0);
  if (len < total) return (int)total;
  if (len > total)
    return bad(why, why_len, MEP_ERR_PROTOCOL, "%zu bytes after the answer",
               len - total);
  const uint8_t *b = buf + MEP_RDMA_HDR_LEN;
  if (h.type == MEP_RDMA_MSG_ACCEPT) {
    *nak = 0;
    return mep__rdma_qpinfo_decode(b, MEP_RDMA_QPINFO_LEN, q, why, why_len);
  }
  uint32_t reason = mep__rdma_get32(b);
  if (mep__rdma_get32(b + 4) ||
      (reason != MEP_RDMA_NAK_OTHER && reason != MEP_RDMA_NAK_STALE))
    return bad(why, why_len, MEP_ERR_PROTOCOL,
               "a refusal with reason %u and padding %#x", reason,
               mep__rdma_get32(b + 4));
  *nak = (int)reason;
  return 0;
}

const char *mep__rdma_nak_text(int reason) {
  switch (reason) {
  case MEP_RDMA_NAK_OTHER:
    return "waits for another process (incarnation) as this rank";
  case MEP_RDMA_NAK_STALE:
    return "is a newer process than the address this rank dialled (the "
           "address blob is stale)";
  }
  return "refused for an unknown reason";
}
