/*
 * handshake.h - connection set-up for RDMA transports: a small TCP
 * bootstrap that lets two processes exchange what their RC queue pairs
 * need, authenticated with the job secret. Shared, not copied: the verbs
 * plugin builds these files, and so does the ibgda plugin (mlx5, GPU
 * initiated), whose queue pairs are brought up the same way. Nothing here
 * knows libibverbs: a queue pair is described by plain integers, and the
 * caller brings its queue pairs to RTR and RTS in a callback.
 *
 * Why a TCP bootstrap and not rdma_cm. The address blob the core
 * publishes is per context and made before any peer is known, so the
 * per-pair queue pair numbers cannot be in it: something must carry them
 * when two ranks connect. rdma_cm would do that over the fabric itself,
 * but it needs an IP address on the RDMA port (IPoIB on InfiniBand), its
 * own event channel and thread model, and it hides the modify-QP steps
 * that ibgda must do itself on mlx5 queue pairs it created. A TCP socket
 * (as NCCL does) works on every fabric, lets us authenticate with the job
 * secret before anything is created for a stranger, and stays open after
 * set-up as a liveness channel: the end of the stream when a peer process
 * dies is a fast, reliable failure signal that RDMA alone does not give
 * (a dead peer's queue pairs are only noticed through retries, and only
 * while traffic flows).
 *
 * Roles are fixed by rank: the lower rank dials, the higher rank accepts.
 * The acceptor answers a hello only inside its own connect() for that
 * rank; a hello that comes earlier waits in the listen backlog or in the
 * stash (accepted, authenticated, not answered), and the dialler keeps
 * waiting, up to its deadline. When every rank connects to its peers in
 * increasing rank order this cannot deadlock: order the pairs (i, j),
 * i < j, lexicographically; each rank meets its pairs in that order, so
 * for the smallest pair not yet connected both ranks have finished every
 * smaller pair and stand at it, one dialling and one accepting.
 *
 * The exchange, on one socket:
 *   dialler  -> HELLO  (ranks, both incarnations, the secret, its qpinfo)
 *   acceptor -> ACCEPT (its qpinfo; its queue pairs are already at RTS)
 *               or NAK (not this process now: the dialler may retry)
 *   dialler  -> READY  (its queue pairs are at RTS too)
 * so when connect() returns on either side, both sides' queue pairs can
 * receive. The socket then stays open: a BYE on it is an orderly close,
 * its end without a BYE a failure.
 *
 * Wire format: fixed-width little-endian fields at fixed offsets. Every
 * message starts with a 16-byte header:
 *   u32 magic "MEPB", u16 version, u16 type, u32 from rank, u32 to rank
 * followed by a body whose length the type fixes:
 *   HELLO  u64 dialler's incarnation, u64 acceptor's incarnation (from its
 *          address blob), u32 secret length, u32 zero, the secret, then a
 *          qpinfo (MEP_RDMA_QPINFO_LEN)
 *   ACCEPT a qpinfo
 *   NAK    u32 reason (MEP_RDMA_NAK_*), u32 zero
 *   READY, BYE: nothing
 * qpinfo (168 B): u8 gid[16], u16 lid, u8 port, u8 link layer (1 IB,
 *   2 Ethernet), u8 mtu (1..5: 256..4096 as enum ibv_mtu), u8 queue pairs
 *   (1..MEP_RDMA_MAX_QPS), u16 zero, u64 scratch address, u32 scratch
 *   rkey, u32 zero, then MEP_RDMA_MAX_QPS pairs of (u32 qp number, u32
 *   first PSN), unused ones zero. The scratch word is an 8-byte region the
 *   peer may write to (a marker whose completion proves every earlier
 *   write on that queue pair completed).
 * The bootstrap part of an address blob (16 B): u8 ipv4[4] (network
 *   order), u16 port, u16 zero, u64 incarnation (random per context,
 *   never 0: it tells a replacement of a rank from the process it
 *   replaces).
 */
#ifndef MEP_RDMA_HANDSHAKE_H
#define MEP_RDMA_HANDSHAKE_H

#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "mep/transport.h"

#define MEP_RDMA_HS_VERSION 1
#define MEP_RDMA_HS_MAGIC 0x4250454du /* "MEPB" as little-endian bytes */
#define MEP_RDMA_MAX_QPS 16
#define MEP_RDMA_MAX_SECRET 256
#define MEP_RDMA_HDR_LEN 16
#define MEP_RDMA_QPINFO_LEN 168
#define MEP_RDMA_HELLO_FIXED 24 /* HELLO body before the secret */
#define MEP_RDMA_NAK_LEN 8
#define MEP_RDMA_BOOT_ADDR_LEN 16
#define MEP_RDMA_MAX_MSG                                                      \
  (MEP_RDMA_HDR_LEN + MEP_RDMA_HELLO_FIXED + MEP_RDMA_MAX_SECRET +            \
   MEP_RDMA_QPINFO_LEN)

enum {
  MEP_RDMA_MSG_HELLO = 1,
  MEP_RDMA_MSG_ACCEPT = 2,
  MEP_RDMA_MSG_NAK = 3,
  MEP_RDMA_MSG_READY = 4,
  MEP_RDMA_MSG_BYE = 5,
};

/* Why an acceptor turns a good hello down. */
enum {
  MEP_RDMA_NAK_OTHER = 1, /* its connect() waits for another process as
                             that rank: try again (recovery) */
  MEP_RDMA_NAK_STALE = 2, /* the hello names an earlier process of the
                             acceptor's rank: the dialler's blob is old */
};

/* ------------------------------------------------------ little endian */

static inline void mep__rdma_put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void mep__rdma_put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void mep__rdma_put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t mep__rdma_get16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t mep__rdma_get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline uint64_t mep__rdma_get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* ------------------------------------------------ pure encode / decode
 * (handshake_wire.c: no sockets, no state; unit-tested and fuzzed) */

/* Writes the reason (printf) into why[0..n) when why is not NULL; returns
 * code: `return mep__rdma_why(why, n, MEP_ERR_PROTOCOL, "...", ...);`. */
int mep__rdma_why(char *why, size_t n, int code, const char *fmt, ...)
    MEP_PRINTF(4, 5);

/* What a peer needs to bring its queue pairs to RTR towards ours. */
typedef struct mep__rdma_qpinfo {
  uint8_t gid[16];
  uint16_t lid;
  uint8_t port;
  uint8_t link_layer; /* 1 InfiniBand, 2 Ethernet */
  uint8_t mtu;        /* 1..5 */
  uint8_t nqp;        /* 1..MEP_RDMA_MAX_QPS */
  uint64_t scratch_addr;
  uint32_t scratch_rkey;
  uint32_t qpn[MEP_RDMA_MAX_QPS]; /* 24 bits, not 0 */
  uint32_t psn[MEP_RDMA_MAX_QPS]; /* 24 bits */
} mep__rdma_qpinfo_t;

typedef struct mep__rdma_boot_addr {
  uint8_t ip[4]; /* network order */
  uint16_t port;
  uint64_t incarnation;
} mep__rdma_boot_addr_t;

typedef struct mep__rdma_hdr {
  uint16_t type;
  uint32_t from, to;
} mep__rdma_hdr_t;

typedef struct mep__rdma_hello {
  uint32_t from, to;
  uint64_t from_inc, to_inc;
  uint32_t secret_len;
  const uint8_t *secret; /* points into the decoded buffer */
  mep__rdma_qpinfo_t qp;
} mep__rdma_hello_t;

/* What an acceptor insists on in a hello. */
typedef struct mep__rdma_hello_expect {
  uint32_t rank;        /* its own */
  uint32_t size;        /* rank slots */
  uint64_t incarnation; /* its own */
  const uint8_t *secret;
  uint32_t secret_len;
} mep__rdma_hello_expect_t;

void mep__rdma_boot_addr_encode(uint8_t out[MEP_RDMA_BOOT_ADDR_LEN],
                                const mep__rdma_boot_addr_t *a);
/* 0, or MEP_ERR_PROTOCOL with the reason in why (port 0, incarnation 0,
 * nonzero padding). */
int mep__rdma_boot_addr_decode(const uint8_t in[MEP_RDMA_BOOT_ADDR_LEN],
                               mep__rdma_boot_addr_t *a, char *why,
                               size_t why_len);

void mep__rdma_qpinfo_encode(uint8_t out[MEP_RDMA_QPINFO_LEN],
                             const mep__rdma_qpinfo_t *q);
/* 0, or MEP_ERR_PROTOCOL with the reason (a count, MTU, link layer, QP
 * number or PSN out of range, nonzero padding or unused entries). */
int mep__rdma_qpinfo_decode(const uint8_t *in, size_t len,
                            mep__rdma_qpinfo_t *q, char *why, size_t why_len);

/* Writes a header for `type` (from, to) to out. */
void mep__rdma_hdr_encode(uint8_t out[MEP_RDMA_HDR_LEN], uint16_t type,
                          uint32_t from, uint32_t to);
/* Checks a header: magic, version, a known type. 0 (h filled) or
 * MEP_ERR_PROTOCOL. */
int mep__rdma_hdr_decode(const uint8_t *in, size_t len, mep__rdma_hdr_t *h,
                         char *why, size_t why_len);
/* The body length a message of this type has (for HELLO, given its
 * secret length), or -1 for an unknown type. */
long mep__rdma_body_len(uint16_t type, uint32_t secret_len);

/* Writes a whole HELLO message; returns its length (0 if cap is short or
 * the secret too long). */
size_t mep__rdma_hello_encode(uint8_t *out, size_t cap,
                              const mep__rdma_hello_t *h);
/* Checks the HELLO message in buf[0..len). Returns 0 when it is complete
 * and good (out filled; out->secret points into buf), a positive count
 * when buf is a valid prefix and that many bytes in total are needed,
 * MEP_ERR_PROTOCOL for a malformed one, MEP_ERR_AUTH for a wrong secret,
 * and MEP_ERR_UNREACHABLE when it names an earlier incarnation of the
 * acceptor (stale), with the reason in why. The secret is compared in
 * constant time. */
int mep__rdma_hello_check(const uint8_t *buf, size_t len,
                          const mep__rdma_hello_expect_t *exp,
                          mep__rdma_hello_t *out, char *why, size_t why_len);

/* ACCEPT (header + qpinfo) and NAK (header + reason) messages. */
size_t mep__rdma_accept_encode(uint8_t *out, size_t cap, uint32_t from,
                               uint32_t to, const mep__rdma_qpinfo_t *q);
size_t mep__rdma_nak_encode(uint8_t *out, size_t cap, uint32_t from,
                            uint32_t to, uint32_t reason);
/* Checks the acceptor's answer (an ACCEPT or a NAK from `from` to `to`)
 * in buf[0..len): 0 with *nak 0 and q filled (ACCEPT) or *nak the reason
 * (NAK), a positive count when more bytes are needed, MEP_ERR_PROTOCOL
 * for anything else. */
int mep__rdma_answer_check(const uint8_t *buf, size_t len, uint32_t from,
                           uint32_t to, int *nak, mep__rdma_qpinfo_t *q,
                           char *why, size_t why_len);
/* What a NAK reason means, as the end of a sentence about the acceptor. */
const char *mep__rdma_nak_text(int reason);

/* ------------------------------------------------------ the bootstrap
 * (handshake.c: the listening socket, the dialler and the acceptor) */

/* Brings this side's queue pairs to RTR and RTS towards `theirs`:
 * 0, or a negative MEP_ERR_* with the error already set. */
typedef int (*mep__rdma_up_fn)(void *arg, const mep__rdma_qpinfo_t *theirs);

struct mep__rdma_pending;

typedef struct mep__rdma_boot {
  /* set by the owner before open; env gives rank, size, secret, log and
   * set_error */
  const mep_tp_env_t *env;
  const char *name; /* the plugin's, first word of every message */
  int timeout_ms;
  uint64_t inc; /* this context's incarnation (not 0) */
  /* the listener */
  int lfd;
  struct sockaddr_in addr;
  /* accepted connections, their hello incomplete or not answered yet */
  pthread_mutex_t mu;
  struct mep__rdma_pending *pend;
  int npend;
  /* connections being set up: where each one's socket is (the caller's
   * storage), from mep__rdma_boot_connect to mep__rdma_boot_adopted */
  struct mep__rdma_setup *setups;
  int live; /* between open and close */
} mep__rdma_boot_t;

typedef struct mep__rdma_boot_opts {
  const char *ifname; /* "" or NULL: `prefer`, else the first interface up
                         that is not loopback, else 127.0.0.1 */
  const struct in_addr *prefer; /* or NULL */
  int port_lo, port_hi;         /* 0, 0: an ephemeral port */
} mep__rdma_boot_opts_t;

/* Listens (b->env, name, timeout_ms, inc set; the rest zeroed). 0 or MEP_ERR_CONFIG (no such
 * interface) / MEP_ERR_SYSTEM, with the error set. */
int mep__rdma_boot_open(mep__rdma_boot_t *b, const mep__rdma_boot_opts_t *o);
/* Closes the listener and every pending connection. Idempotent. */
void mep__rdma_boot_close(mep__rdma_boot_t *b);
/* In a child made by fork() (fork_watch.h), b->mu held: the listener and
 * the pending connections let go (mep__fork_let_go). */
void mep__rdma_boot_let_go(mep__rdma_boot_t *b, int dead);
/* Where this context listens, for its address blob. */
void mep__rdma_boot_self(const mep__rdma_boot_t *b, mep__rdma_boot_addr_t *a);

/* Connects to rank `peer` listening at `to` (from its address blob): the
 * lower rank dials, the higher accepts. `mine` is this side's qpinfo
 * (queue pairs created, at INIT); `up` brings them to RTS once the peer's
 * is known. Returns 0 with *fd the connected socket (non-blocking, the
 * liveness channel: the caller owns it; it calls mep__rdma_boot_adopted
 * once the socket is in its tables), or MEP_ERR_TIMEOUT at the
 * deadline, MEP_ERR_AUTH when the peer refused this process, MEP_ERR_
 * PEER_FAILED when it went away, MEP_ERR_PROTOCOL for garbage, or what
 * `up` returned; the error is set and names both ranks and the address. */
int mep__rdma_boot_connect(mep__rdma_boot_t *b, int peer,
                           const mep__rdma_boot_addr_t *to,
                           const mep__rdma_qpinfo_t *mine, mep__rdma_up_fn up,
                           void *arg, int64_t deadline, int *fd);
/* The caller has put *fd where its fork walker finds it (its table of
 * live endpoints), or is about to close it: the set-up that
 * mep__rdma_boot_connect began for this fd ends, and a forked child no
 * longer lets go of *fd through the boot. Until then, *fd is made, closed
 * and written under b->mu, and mep__rdma_boot_let_go covers it. Call it
 * once after each successful connect; a failed one has ended already. */
void mep__rdma_boot_adopted(mep__rdma_boot_t *b, int *fd);

/* ------------------------------------------------ the liveness channel */

int64_t mep__rdma_now_ms(void);
void mep__rdma_fmt_addr(const uint8_t ip[4], uint16_t port, char *buf,
                        size_t len);

/* What arrived on a connected socket. */
enum {
  MEP_RDMA_LINK_QUIET = 0, /* nothing (yet) */
  MEP_RDMA_LINK_BYE = 1,   /* the peer's orderly goodbye */
  MEP_RDMA_LINK_EOF = 2,   /* the end of the stream without a goodbye */
  MEP_RDMA_LINK_BAD = 3,   /* garbage, or a read error */
};

typedef struct mep__rdma_link_rx {
  uint8_t buf[MEP_RDMA_HDR_LEN];
  size_t have;
  int bye; /* a BYE arrived: the end that follows is orderly */
} mep__rdma_link_rx_t;

/* Reads what the socket holds without blocking: one of MEP_RDMA_LINK_*.
 * After a BYE, the end of the stream reads as BYE again. */
int mep__rdma_link_read(int fd, mep__rdma_link_rx_t *rx, uint32_t from,
                        uint32_t to);
/* Sends a BYE (from, to), then waits until the peer's kernel acknowledged
 * it (so that closing the socket cannot reset it away), at most wait_ms.
 * 0, or -1 when it could not be sent or acknowledged in time. */
int mep__rdma_link_bye(int fd, uint32_t from, uint32_t to, int wait_ms);

#endif
