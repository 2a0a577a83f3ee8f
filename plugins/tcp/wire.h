/*
 * wire.h - the tcp transport's wire format and its pure validators.
 *
 * Every field is fixed-width little-endian at a fixed offset; nothing is a
 * C struct laid over bytes, so the format does not depend on the compiler.
 * The validators take bytes and a description of what is expected and
 * answer "ok" or a sentence saying what is wrong; they touch no socket and
 * no memory but their arguments, so they can be unit-tested and fuzzed.
 *
 * Blobs exchanged through the store:
 *   address (24 B): u32 magic "MEPA", u16 version, u16 family (2 = IPv4),
 *                   u8 ipv4[4] (network order), u16 port, u16 zero,
 *                   u64 incarnation (random per context, never 0)
 *   rkey    (24 B): u32 magic "MEPR", u16 version, u16 zero, u32 owner rank,
 *                   u32 region id (never 0), u64 region length
 * Connection set-up, dialler (the lower rank) to acceptor:
 *   hello (40 B + secret): u32 magic "MEPH", u16 version, u16 sockets per
 *                   peer, u32 from rank, u32 to rank, u32 socket index,
 *                   u32 secret length, u64 the dialler's incarnation, u64
 *                   the acceptor's incarnation (from its address blob),
 *                   then the secret
 *   ack   (16 B):   u32 magic "MEPK", u16 version, u16 sockets per peer,
 *                   u32 acceptor's rank, u32 socket index
 *   refusal (16 B): u32 magic "MEPN", u16 version, u16 reason
 *                   (MEP_TCP_NAK_*), u32 acceptor's rank, u32 socket index;
 *                   sent, instead of the ack, to a dialler whose hello is
 *                   good but who is not wanted as that rank now; it may
 *                   try again until its deadline. A hello that is not good
 *                   (secret, ranks, format) gets no answer: the acceptor
 *                   closes the connection.
 * The incarnation tells processes of one rank apart: a replacement of a
 * rank that failed has the same rank and secret but a new incarnation, and
 * a connection is adopted only from the incarnation whose address blob the
 * acceptor's connect() was given (recovery, ABI 1.1).
 * Messages on an established socket, each a 32-byte header:
 *   u8 type, u8 op, u16 count, u32 region id, u64 offset,
 *   u64 length (WRITE) or value (SIGNAL), u64 sequence number
 * A WRITE header is followed by `length` payload bytes. A SIGNAL header is
 * followed by `count` (= sockets per peer) u64: for each socket of the
 * connection, how many messages the sender had queued on it before this
 * signal. The sequence number counts the messages of one socket from 0.
 * A BYE (type 3) has every field but type and sequence number zero and
 * nothing after it: it is the last message of its socket, and no signal
 * counts it. The sender's close() sends one on each socket when every
 * earlier message was handed to its kernel, so a receiver that got the BYE
 * of every socket has everything its peer ever sent, and the end of a
 * stream after its BYE is an orderly close, not a failure.
 */
#ifndef MEP_TCP_WIRE_H
#define MEP_TCP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define MEP_TCP_VERSION 2
#define MEP_TCP_MAGIC_ADDR 0x4150454du  /* "MEPA" as little-endian bytes */
#define MEP_TCP_MAGIC_RKEY 0x5250454du  /* "MEPR" */
#define MEP_TCP_MAGIC_HELLO 0x4850454du /* "MEPH" */
#define MEP_TCP_MAGIC_ACK 0x4b50454du   /* "MEPK" */
#define MEP_TCP_MAGIC_NAK 0x4e50454du   /* "MEPN" */

#define MEP_TCP_MAX_SOCKS 16
#define MEP_TCP_MAX_SECRET 256

#define MEP_TCP_ADDR_LEN 24
#define MEP_TCP_RKEY_LEN 24
#define MEP_TCP_HELLO_LEN 40 /* without the secret */
#define MEP_TCP_ACK_LEN 16   /* an ack or a refusal */
#define MEP_TCP_HDR_LEN 32
#define MEP_TCP_MAX_TRAILER (8 * MEP_TCP_MAX_SOCKS)

enum { MEP_TCP_MSG_WRITE = 1, MEP_TCP_MSG_SIGNAL = 2, MEP_TCP_MSG_BYE = 3 };
enum { MEP_TCP_OP_SET = 0, MEP_TCP_OP_ADD = 1 };
/* Why an acceptor refuses a good hello for now. */
enum {
  MEP_TCP_NAK_UNEXPECTED = 1, /* it closed its endpoint of that rank and
                                 has not called connect() for it again */
  MEP_TCP_NAK_BUSY = 2,       /* it still holds a connection of another
                                 process as that rank */
  MEP_TCP_NAK_OTHER = 3,      /* its connect() waits for another process
                                 (incarnation) as that rank */
};

/* ------------------------------------------------- little-endian fields */

static inline void mep__tcp_put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void mep__tcp_put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void mep__tcp_put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t mep__tcp_get16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t mep__tcp_get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline uint64_t mep__tcp_get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* ------------------------------------------------------------- blobs */

typedef struct mep__tcp_addr {
  uint8_t ip[4]; /* network order */
  uint16_t port;
  uint64_t incarnation;
} mep__tcp_addr_t;

void mep__tcp_addr_encode(uint8_t out[MEP_TCP_ADDR_LEN],
                          const mep__tcp_addr_t *a);
/* 0, or MEP_ERR_PROTOCOL with the reason in why (also for port 0 or
 * incarnation 0). */
int mep__tcp_addr_decode(const void *blob, size_t len, mep__tcp_addr_t *a,
                         char *why, size_t why_len);

typedef struct mep__tcp_rkey {
  uint32_t rank;
  uint32_t region;
  uint64_t len;
} mep__tcp_rkey_t;

void mep__tcp_rkey_encode(uint8_t out[MEP_TCP_RKEY_LEN],
                          const mep__tcp_rkey_t *k);
int mep__tcp_rkey_decode(const void *blob, size_t len, mep__tcp_rkey_t *k,
                         char *why, size_t why_len);

/* --------------------------------------------------------- handshake */

typedef struct mep__tcp_hello {
  uint32_t nsock, from, to, index, secret_len;
  uint64_t from_inc, to_inc; /* the dialler's and the acceptor's */
  const uint8_t *secret;
} mep__tcp_hello_t;

/* What an acceptor insists on. */
typedef struct mep__tcp_hello_expect {
  uint32_t rank;  /* the acceptor's own rank */
  uint32_t size;  /* rank slots of the group */
  uint32_t nsock; /* its sockets_per_peer */
  uint64_t incarnation; /* its own */
  const uint8_t *secret;
  uint32_t secret_len;
} mep__tcp_hello_expect_t;

/* Writes a hello (MEP_TCP_HELLO_LEN + h->secret_len bytes) to out. */
size_t mep__tcp_hello_encode(uint8_t *out, size_t cap,
                             const mep__tcp_hello_t *h);

/* Checks the hello in buf[0..len). Returns 0 when it is complete and good
 * (out filled), a positive count when it is a valid prefix and that many
 * bytes in total are needed, MEP_ERR_PROTOCOL for a malformed one and
 * MEP_ERR_AUTH for a wrong secret, with the reason in why. The secret is
 * compared in constant time. */
int mep__tcp_hello_check(const uint8_t *buf, size_t len,
                         const mep__tcp_hello_expect_t *exp,
                         mep__tcp_hello_t *out, char *why, size_t why_len);

void mep__tcp_ack_encode(uint8_t out[MEP_TCP_ACK_LEN], uint32_t nsock,
                         uint32_t rank, uint32_t index);
void mep__tcp_nak_encode(uint8_t out[MEP_TCP_ACK_LEN], uint32_t reason,
                         uint32_t rank, uint32_t index);
/* 0 if buf holds an ack or a refusal from `rank` for socket `index` (an
 * ack also for `nsock` sockets): *refused is 0 for the ack, else the
 * refusal's MEP_TCP_NAK_* reason. Anything else is MEP_ERR_PROTOCOL with
 * the reason in why. */
int mep__tcp_ack_check(const uint8_t *buf, size_t len, uint32_t nsock,
                       uint32_t rank, uint32_t index, int *refused,
                       char *why, size_t why_len);
/* What a refusal's reason means, as the end of a sentence about the
 * acceptor ("it ...", "that rank" being the dialler's); static storage. */
const char *mep__tcp_nak_text(int reason);

/* ---------------------------------------------------------- messages */

typedef struct mep__tcp_msg {
  uint8_t type, op;
  uint16_t count;
  uint32_t region;
  uint64_t offset;
  uint64_t len_or_value;
  uint64_t seq;
} mep__tcp_msg_t;

/* The receiver's registered regions as the validator sees them: returns 1
 * and the length when `id` is registered (and not deregistered), else 0. */
typedef int (*mep__tcp_region_len_fn)(void *arg, uint32_t id, uint64_t *len);

typedef struct mep__tcp_msg_expect {
  uint64_t seq;   /* the next sequence number on this socket */
  uint32_t nsock; /* sockets per peer: the count a SIGNAL must carry */
  mep__tcp_region_len_fn region_len;
  void *arg;
} mep__tcp_msg_expect_t;

void mep__tcp_msg_encode(uint8_t out[MEP_TCP_HDR_LEN],
                         const mep__tcp_msg_t *m);

/* Validates a 32-byte header before anything touches memory: known type,
 * zero fields that must be zero, the expected sequence number, a known
 * region, offset+length inside it (overflow-safe), an 8-byte-aligned signal
 * word inside it; a BYE names no region and must be zero but for its type
 * and sequence number. Returns 0 (out filled), MEP_ERR_BOUNDS for an access
 * outside a region (or to an unknown one) or MEP_ERR_PROTOCOL for anything
 * else malformed, with the reason in why. `len` below MEP_TCP_HDR_LEN is
 * MEP_ERR_PROTOCOL (truncated). */
int mep__tcp_msg_check(const uint8_t *hdr, size_t len,
                       const mep__tcp_msg_expect_t *exp, mep__tcp_msg_t *out,
                       char *why, size_t why_len);

/* Validates a SIGNAL's trailer of m->count u64 that arrived on socket
 * `index`: the count for its own socket must equal the signal's sequence
 * number (every earlier message on a socket arrives before it). Fills
 * counts[0..m->count). 0 or MEP_ERR_PROTOCOL. */
int mep__tcp_counts_check(const uint8_t *trailer, size_t len,
                          const mep__tcp_msg_t *m, uint32_t index,
                          uint64_t *counts, char *why, size_t why_len);

#endif
