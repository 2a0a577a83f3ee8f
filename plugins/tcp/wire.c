/* wire.c - encoders and pure validators of the tcp wire format (wire.h). */
#include "wire.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mep/mep.h"

static int fail(int code, char *why, size_t why_len, const char *fmt, ...)
    MEP_PRINTF(4, 5);

static int fail(int code, char *why, size_t why_len, const char *fmt, ...) {
  if (why && why_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* ------------------------------------------------------------- blobs */

void mep__tcp_addr_encode(uint8_t out[MEP_TCP_ADDR_LEN],
                          const mep__tcp_addr_t *a) {
  memset(out, 0, MEP_TCP_ADDR_LEN);
  mep__tcp_put32(out, MEP_TCP_MAGIC_ADDR);
  mep__tcp_put16(out + 4, MEP_TCP_VERSION);
  mep__tcp_put16(out + 6, 2);
  memcpy(out + 8, a->ip, 4);
  mep__tcp_put16(out + 12, a->port);
  mep__tcp_put64(out + 16, a->incarnation);
}

int mep__tcp_addr_decode(const void *blob, size_t len, mep__tcp_addr_t *a,
                         char *why, size_t why_len) {
  const uint8_t *p = blob;
  if (!p || len != MEP_TCP_ADDR_LEN)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "address blob has %zu bytes, expected %d", p ? len : 0,
                MEP_TCP_ADDR_LEN);
  if (mep__tcp_get32(p) != MEP_TCP_MAGIC_ADDR)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "address blob is not a tcp address (bad magic)");
  if (mep__tcp_get16(p + 4) != MEP_TCP_VERSION)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "address blob has protocol version %u, this plugin speaks %d",
                mep__tcp_get16(p + 4), MEP_TCP_VERSION);
  if (mep__tcp_get16(p + 6) != 2 || mep__tcp_get16(p + 14) != 0)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "address blob is not an IPv4 address");
  memcpy(a->ip, p + 8, 4);
  a->port = mep__tcp_get16(p + 12);
  a->incarnation = mep__tcp_get64(p + 16);
  if (a->port == 0)
    return fail(MEP_ERR_PROTOCOL, why, why_len, "address blob has port 0");
  if (a->incarnation == 0)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "address blob has incarnation 0");
  return 0;
}

void mep__tcp_rkey_encode(uint8_t out[MEP_TCP_RKEY_LEN],
                          const mep__tcp_rkey_t *k) {
  memset(out, 0, MEP_TCP_RKEY_LEN);
  mep__tcp_put32(out, MEP_TCP_MAGIC_RKEY);
  mep__tcp_put16(out + 4, MEP_TCP_VERSION);
  mep__tcp_put32(out + 8, k->rank);
  mep__tcp_put32(out + 12, k->region);
  mep__tcp_put64(out + 16, k->len);
}

int mep__tcp_rkey_decode(const void *blob, size_t len, mep__tcp_rkey_t *k,
                         char *why, size_t why_len) {
  const uint8_t *p = blob;
  if (!p || len != MEP_TCP_RKEY_LEN)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "remote key has %zu bytes, expected %d", p ? len : 0,
                MEP_TCP_RKEY_LEN);
  if (mep__tcp_get32(p) != MEP_TCP_MAGIC_RKEY ||
      mep__tcp_get16(p + 6) != 0)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "remote key is not a tcp key (bad magic)");
  if (mep__tcp_get16(p + 4) != MEP_TCP_VERSION)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "remote key has protocol version %u, this plugin speaks %d",
                mep__tcp_get16(p + 4), MEP_TCP_VERSION);
  k->rank = mep__tcp_get32(p + 8);
  k->region = mep__tcp_get32(p + 12);
  k->len = mep__tcp_get64(p + 16);
  if (k->region == 0)
    return fail(MEP_ERR_PROTOCOL, why, why_len, "remote key names region 0");
  return 0;
}

/* --------------------------------------------------------- handshake */

size_t mep__tcp_hello_encode(uint8_t *out, size_t cap,
                             const mep__tcp_hello_t *h) {
  size_t n = MEP_TCP_HELLO_LEN + (size_t)h->secret_len;
  if (cap < n) return 0;
  mep__tcp_put32(out, MEP_TCP_MAGIC_HELLO);
  mep__tcp_put16(out + 4, MEP_TCP_VERSION);
  mep__tcp_put16(out + 6, (uint16_t)h->nsock);
  mep__tcp_put32(out + 8, h->from);
  mep__tcp_put32(out + 12, h->to);
  mep__tcp_put32(out + 16, h->index);
  mep__tcp_put32(out + 20, h->secret_len);
  mep__tcp_put64(out + 24, h->from_inc);
  mep__tcp_put64(out + 32, h->to_inc);
  if (h->secret_len) memcpy(out + MEP_TCP_HELLO_LEN, h->secret, h->secret_len);
  return n;
}

/* Time independent of where the first difference is. */
static int secret_equal(const uint8_t *a, const uint8_t *b, size_t n) {
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < n; i++) diff |= (uint8_t)(a[i] ^ b[i]);
  return diff == 0;
}

int mep__tcp_hello_check(const uint8_t *buf, size_t len,
                         const mep__tcp_hello_expect_t *exp,
                         mep__tcp_hello_t *out, char *why, size_t why_len) {
  /* Reject a wrong magic as soon as its bytes are in, so a stray client
   * (an HTTP probe...) is dropped without waiting for 24 bytes. */
  uint8_t magic[4];
  mep__tcp_put32(magic, MEP_TCP_MAGIC_HELLO);
  for (size_t i = 0; i < len && i < 4; i++)
    if (buf[i] != magic[i])
      return fail(MEP_ERR_PROTOCOL, why, why_len,
                  "not a mep tcp hello (bad magic)");
  if (len < MEP_TCP_HELLO_LEN) return MEP_TCP_HELLO_LEN;

  uint32_t version = mep__tcp_get16(buf + 4);
  mep__tcp_hello_t h = {
      .nsock = mep__tcp_get16(buf + 6),
      .from = mep__tcp_get32(buf + 8),
      .to = mep__tcp_get32(buf + 12),
      .index = mep__tcp_get32(buf + 16),
      .secret_len = mep__tcp_get32(buf + 20),
      .from_inc = mep__tcp_get64(buf + 24),
      .to_inc = mep__tcp_get64(buf + 32),
  };
  if (version != MEP_TCP_VERSION)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "protocol version %" PRIu32 ", this side speaks %d", version,
                MEP_TCP_VERSION);
  if (h.to != exp->rank)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "hello addressed to rank %" PRIu32 ", this is rank %" PRIu32,
                h.to, exp->rank);
  if (h.from >= exp->size)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "hello from rank %" PRIu32 " in a group of %" PRIu32, h.from,
                exp->size);
  if (h.from >= exp->rank)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "rank %" PRIu32 " dialled rank %" PRIu32
                " but only lower ranks dial",
                h.from, exp->rank);
  if (h.nsock != exp->nsock)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "rank %" PRIu32 " uses sockets_per_peer=%" PRIu32
                ", this side %" PRIu32,
                h.from, h.nsock, exp->nsock);
  if (h.index >= h.nsock)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "socket index %" PRIu32 " of %" PRIu32, h.index, h.nsock);
  if (h.from_inc == 0)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "rank %" PRIu32 " claims incarnation 0", h.from);
  if (h.to_inc != exp->incarnation)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "hello for incarnation %#" PRIx64 " of rank %" PRIu32
                ", this is incarnation %#" PRIx64
                " (the dialler has a stale address blob)",
                h.to_inc, exp->rank, exp->incarnation);
  if (h.secret_len != exp->secret_len)
    return fail(MEP_ERR_AUTH, why, why_len,
                "wrong secret (%" PRIu32 " bytes, expected %" PRIu32 ")",
                h.secret_len, exp->secret_len);
  size_t need = MEP_TCP_HELLO_LEN + (size_t)h.secret_len;
  if (len < need) return (int)need;
  if (len > need)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "hello of %zu bytes, expected %zu", len, need);
  if (!secret_equal(buf + MEP_TCP_HELLO_LEN, exp->secret, h.secret_len))
    return fail(MEP_ERR_AUTH, why, why_len, "wrong secret");
  h.secret = buf + MEP_TCP_HELLO_LEN;
  if (out) *out = h;
  return 0;
}

void mep__tcp_ack_encode(uint8_t out[MEP_TCP_ACK_LEN], uint32_t nsock,
                         uint32_t rank, uint32_t index) {
  mep__tcp_put32(out, MEP_TCP_MAGIC_ACK);
  mep__tcp_put16(out + 4, MEP_TCP_VERSION);
  mep__tcp_put16(out + 6, (uint16_t)nsock);
  mep__tcp_put32(out + 8, rank);
  mep__tcp_put32(out + 12, index);
}

void mep__tcp_nak_encode(uint8_t out[MEP_TCP_ACK_LEN], uint32_t reason,
                         uint32_t rank, uint32_t index) {
  mep__tcp_put32(out, MEP_TCP_MAGIC_NAK);
  mep__tcp_put16(out + 4, MEP_TCP_VERSION);
  mep__tcp_put16(out + 6, (uint16_t)reason);
  mep__tcp_put32(out + 8, rank);
  mep__tcp_put32(out + 12, index);
}

const char *mep__tcp_nak_text(int reason) {
  switch (reason) {
  case MEP_TCP_NAK_UNEXPECTED:
    return "closed its endpoint of that rank and has not called connect() "
           "for it since";
  case MEP_TCP_NAK_BUSY:
    return "still holds a connection of another process as that rank (it "
           "has not dropped and closed it yet)";
  case MEP_TCP_NAK_OTHER:
    return "waits in connect() for another process as that rank (the "
           "address blob it was given names another incarnation)";
  default:
    return "refused for an unknown reason";
  }
}

int mep__tcp_ack_check(const uint8_t *buf, size_t len, uint32_t nsock,
                       uint32_t rank, uint32_t index, int *refused,
                       char *why, size_t why_len) {
  if (len != MEP_TCP_ACK_LEN)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "ack of %zu bytes, expected %d", len, MEP_TCP_ACK_LEN);
  uint32_t magic = mep__tcp_get32(buf);
  if ((magic != MEP_TCP_MAGIC_ACK && magic != MEP_TCP_MAGIC_NAK) ||
      mep__tcp_get16(buf + 4) != MEP_TCP_VERSION)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "not a mep tcp ack (bad magic or version)");
  uint32_t field = mep__tcp_get16(buf + 6);
  if (mep__tcp_get32(buf + 8) != rank || mep__tcp_get32(buf + 12) != index)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "%s from rank %" PRIu32 " for socket %" PRIu32
                ", expected rank %" PRIu32 " socket %" PRIu32,
                magic == MEP_TCP_MAGIC_ACK ? "ack" : "refusal",
                mep__tcp_get32(buf + 8), mep__tcp_get32(buf + 12), rank,
                index);
  if (magic == MEP_TCP_MAGIC_NAK) {
    if (field < MEP_TCP_NAK_UNEXPECTED || field > MEP_TCP_NAK_OTHER)
      return fail(MEP_ERR_PROTOCOL, why, why_len,
                  "refusal with unknown reason %" PRIu32, field);
    if (refused) *refused = (int)field;
    return 0;
  }
  if (field != nsock)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "ack for %" PRIu32 " sockets per peer, expected %" PRIu32,
                field, nsock);
  if (refused) *refused = 0;
  return 0;
}

/* ---------------------------------------------------------- messages */

void mep__tcp_msg_encode(uint8_t out[MEP_TCP_HDR_LEN],
                         const mep__tcp_msg_t *m) {
  out[0] = m->type;
  out[1] = m->op;
  mep__tcp_put16(out + 2, m->count);
  mep__tcp_put32(out + 4, m->region);
  mep__tcp_put64(out + 8, m->offset);
  mep__tcp_put64(out + 16, m->len_or_value);
  mep__tcp_put64(out + 24, m->seq);
}

static void msg_decode(const uint8_t *p, mep__tcp_msg_t *m) {
  m->type = p[0];
  m->op = p[1];
  m->count = mep__tcp_get16(p + 2);
  m->region = mep__tcp_get32(p + 4);
  m->offset = mep__tcp_get64(p + 8);
  m->len_or_value = mep__tcp_get64(p + 16);
  m->seq = mep__tcp_get64(p + 24);
}

static int check_write(const mep__tcp_msg_t *m, uint64_t rlen, char *why,
                       size_t why_len) {
  if (m->op != 0 || m->count != 0)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "write header with op %u and count %u (must be 0)", m->op,
                m->count);
  if (m->offset > rlen || m->len_or_value > rlen - m->offset)
    return fail(MEP_ERR_BOUNDS, why, why_len,
                "wrote %" PRIu64 " bytes at offset %" PRIu64
                " of region %" PRIu32 " (%" PRIu64 " bytes): out of bounds",
                m->len_or_value, m->offset, m->region, rlen);
  return 0;
}

static int check_signal(const mep__tcp_msg_t *m, uint64_t rlen,
                        uint32_t nsock, char *why, size_t why_len) {
  if (m->op != MEP_TCP_OP_SET && m->op != MEP_TCP_OP_ADD)
    return fail(MEP_ERR_PROTOCOL, why, why_len, "signal with unknown op %u",
                m->op);
  if (m->count != nsock)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "signal carries %u socket counts, expected %" PRIu32,
                m->count, nsock);
  if (m->offset % 8 != 0)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "signal at offset %" PRIu64 " of region %" PRIu32
                ": not 8-byte aligned",
                m->offset, m->region);
  if (m->offset > rlen || 8 > rlen - m->offset)
    return fail(MEP_ERR_BOUNDS, why, why_len,
                "signalled the word at offset %" PRIu64 " of region %" PRIu32
                " (%" PRIu64 " bytes): out of bounds",
                m->offset, m->region, rlen);
  return 0;
}

static int check_bye(const mep__tcp_msg_t *m, char *why, size_t why_len) {
  if (m->op || m->count || m->region || m->offset || m->len_or_value)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "goodbye with op %u, count %u, region %" PRIu32
                ", offset %" PRIu64 " and value %" PRIu64 " (must all be 0)",
                m->op, m->count, m->region, m->offset, m->len_or_value);
  return 0;
}

int mep__tcp_msg_check(const uint8_t *hdr, size_t len,
                       const mep__tcp_msg_expect_t *exp, mep__tcp_msg_t *out,
                       char *why, size_t why_len) {
  if (len < MEP_TCP_HDR_LEN)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "truncated header (%zu of %d bytes)", len, MEP_TCP_HDR_LEN);
  mep__tcp_msg_t m;
  msg_decode(hdr, &m);
  if (m.type != MEP_TCP_MSG_WRITE && m.type != MEP_TCP_MSG_SIGNAL &&
      m.type != MEP_TCP_MSG_BYE)
    return fail(MEP_ERR_PROTOCOL, why, why_len, "unknown message type %u",
                m.type);
  if (m.seq != exp->seq)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "message with sequence number %" PRIu64 ", expected %" PRIu64,
                m.seq, exp->seq);
  if (m.type == MEP_TCP_MSG_BYE) {
    int rc = check_bye(&m, why, why_len);
    if (rc == 0 && out) *out = m;
    return rc;
  }
  uint64_t rlen = 0;
  if (!exp->region_len(exp->arg, m.region, &rlen))
    return fail(MEP_ERR_BOUNDS, why, why_len,
                "%s to region %" PRIu32 ", which is not registered",
                m.type == MEP_TCP_MSG_WRITE ? "wrote" : "signalled",
                m.region);
  int rc = m.type == MEP_TCP_MSG_WRITE
               ? check_write(&m, rlen, why, why_len)
               : check_signal(&m, rlen, exp->nsock, why, why_len);
  if (rc == 0 && out) *out = m;
  return rc;
}

int mep__tcp_counts_check(const uint8_t *trailer, size_t len,
                          const mep__tcp_msg_t *m, uint32_t index,
                          uint64_t *counts, char *why, size_t why_len) {
  if (len != (size_t)m->count * 8)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "signal trailer of %zu bytes, expected %u", len,
                m->count * 8u);
  if (index >= m->count)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "signal on socket %" PRIu32 " of %u", index, m->count);
  for (uint32_t i = 0; i < m->count; i++)
    counts[i] = mep__tcp_get64(trailer + 8 * i);
  if (counts[index] != m->seq)
    return fail(MEP_ERR_PROTOCOL, why, why_len,
                "signal number %" PRIu64 " on socket %" PRIu32
                " claims %" PRIu64 " earlier messages there",
                m->seq, index, counts[index]);
  return 0;
}
