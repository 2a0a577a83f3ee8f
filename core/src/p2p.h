/* p2p.h - point-to-point send/recv through rings of slots (the slot
 * allocator).
 *
 * Each ordered pair (src -> dst) owns a ring in dst's memory. The sender
 * copies a message's fragments into the slots of its send staging, which
 * mirrors the ring slot for slot, puts them, and publishes its new head
 * (slots written) with a SET signal on the head word of src in dst's
 * signal region. The receiver consumes slots in order and returns credits
 * by a SET of its consumed count into the tail word of dst in src's signal
 * region. A staging slot is reused only after the receiver consumed its
 * ring twin, which it can only do once the bytes landed, so staging needs
 * no completion tracking of its own.
 *
 * Geometry: [core] buffer_bytes is split among the size-1 peers; a slot is
 * min(chunk_bytes, share / 2) rounded down to 64 bytes, at least 4096
 * bytes, and a ring has at least 2 slots, so a share below 8 KiB is
 * rounded up. Send staging takes as much memory again as the rings.
 *
 * Any source (mep_recv with MEP_ANY_SOURCE): such a recv waits on one
 * queue of the communicator instead of a pair's. Every recv gets a post
 * number when it is queued and every message a number when its first
 * fragment is seen (an unexpected one keeps it), so a message goes to the
 * earliest posted recv that matches it, from its pair's queue or the
 * any-source queue, and an any-source recv takes the earliest arrived
 * unexpected message of its tag over all pairs. Order per (peer, tag) is
 * kept: a pair's messages begin in order.
 *
 * Threads: mep_send/mep_recv only build a request; everything else runs
 * on the progress thread with comm->engine_lock held, so the per-pair
 * state needs no locks of its own. */
#ifndef MEP_SRC_P2P_H
#define MEP_SRC_P2P_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

/* At communicator creation, after connections, on every rank in the same
 * order (it registers regions, collectively): allocates and registers the
 * rings. */
int mep__p2p_init(mep_comm_t *comm);
/* At destroy, after the progress thread stopped and pending requests were
 * failed; deregisters and frees. */
void mep__p2p_fini(mep_comm_t *comm);
/* Imports the rings of the ranks in `act` (after connections). */
int mep__p2p_connect(mep_comm_t *comm, const uint8_t *act);
/* Recovery: a new process replaces `peer`; forget the pair's state. */
void mep__p2p_reset_peer(mep_comm_t *comm, int peer);

/* Drains every ring (unmatched messages go to unexpected buffers, so a
 * sender is never stuck behind a tag nobody receives yet), sends what fits
 * and returns credits. Progress thread only, with comm->engine_lock held.
 * Returns how many slots moved. The requests call it themselves; the
 * engine may also call it while no point-to-point request is pending, so
 * rings keep draining while the user posts nothing. */
int mep__p2p_progress(mep_comm_t *comm);

/* ------------------------------------------------ wire format and geometry
 * Exposed for the unit tests. */

#define MEP__P2P_HDR_BYTES 64
#define MEP__P2P_MAGIC 0x4d503250u /* "P2PM" */
#define MEP__P2P_MIN_SLOT 4096

/* The header at the start of every slot; both ends share an architecture
 * (as for every region). */
typedef struct mep__p2p_hdr {
  uint32_t magic;
  int32_t tag;
  uint32_t src;     /* the sending rank */
  uint32_t flags;   /* 0; room to grow */
  uint64_t slot_no; /* the ring position it was written at (head count) */
  uint64_t seq;     /* message number on this pair, from 0 */
  uint64_t total;   /* message length */
  uint64_t offset;  /* of this fragment in the message */
  uint64_t len;     /* fragment length */
  uint64_t reserved;
} mep__p2p_hdr_t;
_Static_assert(sizeof(mep__p2p_hdr_t) == MEP__P2P_HDR_BYTES,
               "slot header must fill its 64 bytes exactly");

typedef struct mep__p2p_geom {
  size_t slot;    /* bytes per slot, header included; multiple of 64 */
  size_t nslots;  /* slots per ring, >= 2 */
  size_t ring;    /* slot * nslots */
  int rounded_up; /* the share was too small for 2 slots of 4 KiB */
} mep__p2p_geom_t;

/* The ring of each of `npeers` (>= 1) peers for buffer_bytes split among
 * them and slots of at most chunk_bytes. MEP_ERR_INVALID for zero sizes or
 * no peers. */
int mep__p2p_geometry(uint64_t buffer_bytes, uint64_t chunk_bytes,
                      int npeers, mep__p2p_geom_t *g);

/* What the receiver expects of the next slot of one pair. */
typedef struct mep__p2p_expect {
  int src;
  uint64_t slot_no;
  size_t payload; /* slot bytes after the header */
  int in_msg;     /* a message is partly received: its fields follow */
  int32_t tag;
  uint64_t seq, total, got;
  uint64_t next_seq; /* the message number a new message must carry */
} mep__p2p_expect_t;

/* Checks a slot header against the pair's state: magic, sender, ring
 * position, message number, lengths within the slot and the message, and
 * fragments in order and full (only a message's last fragment is short).
 * MEP_ERR_PROTOCOL with the reason in why, or 0. */
int mep__p2p_hdr_check(const mep__p2p_hdr_t *h, const mep__p2p_expect_t *e,
                       char *why, size_t why_len);

/* ------------------------------------------ internal state (p2p_*.c) */

typedef struct mep__p2p_op mep__p2p_op_t;
enum { MEP__P2P_NOWHERE, MEP__P2P_SENDQ, MEP__P2P_POSTED, MEP__P2P_BOUND };

/* One mep_send or mep_recv; the request's impl. */
struct mep__p2p_op {
  mep_req_t *req;
  int is_send, peer, tag; /* recv: peer may be MEP_ANY_SOURCE */
  int from;            /* recv: the rank whose message it took, or -1 */
  uint64_t post_no;    /* recv: when it was queued (matching order) */
  const uint8_t *sbuf; /* send */
  uint8_t *rbuf;       /* recv */
  size_t bytes;        /* send: message length; recv: buffer size */
  uint64_t deadline_ms;
  int admitted, done;
  int probed;          /* its deadline passed once: peers were probed */
  int where;           /* MEP__P2P_*: which queue holds it */
  int started;         /* send: its first fragment is written */
  uint64_t moved;      /* bytes written to the ring / received */
  uint64_t total;      /* recv: length of the message it took */
  uint64_t seq;        /* send: its message number on the pair */
  mep__p2p_op_t *next;
};

typedef struct mep__p2p_queue {
  mep__p2p_op_t *head, *tail;
} mep__p2p_queue_t;

/* A message that arrived before a recv for it (complete or arriving). */
typedef struct mep__p2p_umsg {
  int32_t tag;
  uint64_t arrival; /* when its first fragment was seen, for any source */
  uint64_t total, got;
  int complete;
  uint8_t *data;
  struct mep__p2p_umsg *next;
} mep__p2p_umsg_t;

/* The message being received from a peer: its fragments go to a recv
 * (op), to an unexpected buffer (um), or nowhere (a failed recv). */
typedef struct mep__p2p_inmsg {
  int active;
  int32_t tag;
  uint64_t seq, total, got;
  mep__p2p_op_t *op;
  mep__p2p_umsg_t *um;
} mep__p2p_inmsg_t;

typedef struct mep__p2p_pair {
  /* to the peer */
  mep__p2p_queue_t sendq;
  uint64_t head;    /* slots written and published */
  uint64_t tail;    /* slots the peer reported consumed */
  uint64_t tx_seq;  /* messages begun */
  int tx_err;       /* a send broke off mid-message: later sends fail */
  /* from the peer */
  mep__p2p_queue_t posted;
  mep__p2p_umsg_t *unexp, *unexp_tail;
  uint64_t consumed, reported;
  uint64_t rx_seq;  /* messages begun */
  mep__p2p_inmsg_t in;
  /* the pair failed (peer failed, bad header): every request fails */
  int err;
  char errmsg[384];
} mep__p2p_pair_t;

struct mep__p2p {
  mep__p2p_geom_t g;
  size_t payload;        /* g.slot - header */
  uint64_t credit_batch; /* consumed slots per credit signal */
  uint8_t *rings;        /* [src peer index] rings, written by peers */
  uint8_t *stage;        /* [dst peer index] mirrors of their rings */
  uint64_t *sig;         /* head[src rank], then tail[dst rank] */
  size_t sig_bytes;
  mep_region_t *rr, *rs, *rg;
  mep__p2p_pair_t *pairs; /* per rank; the own one for self messages */
  mep__p2p_queue_t anyq;  /* posted recvs from any source */
  uint64_t posts;         /* recvs queued so far (post numbers) */
  uint64_t arrivals;      /* messages begun so far (arrival numbers) */
};

/* p2p_match.c: queues, matching and completion. */
void mep__p2p_q_push(mep__p2p_queue_t *q, mep__p2p_op_t *op, int where);
void mep__p2p_q_remove(mep__p2p_queue_t *q, mep__p2p_op_t *op);
/* Finishes an op (status, message) and takes it out of every queue. */
void mep__p2p_finish(mep_comm_t *comm, mep__p2p_op_t *op, int status,
                     const char *fmt, ...) MEP_PRINTF(4, 5);
/* "mep_send of 8 bytes to rank 1 tag 3", for messages. */
void mep__p2p_describe(const mep__p2p_op_t *op, char *buf, size_t len);
/* Fails the pair and every request on it; the first reason wins. */
void mep__p2p_pair_fail(mep_comm_t *comm, int peer, int code,
                        const char *fmt, ...) MEP_PRINTF(4, 5);
/* A fragment from the ring of `peer`, already checked. */
void mep__p2p_deliver(mep_comm_t *comm, int peer, const mep__p2p_hdr_t *h,
                      const uint8_t *payload);
void mep__p2p_admit_recv(mep_comm_t *comm, mep__p2p_op_t *op);
void mep__p2p_admit_self_send(mep_comm_t *comm, mep__p2p_op_t *op);
/* Fails the any-source recvs once no other rank can send any more
 * (every other rank of the group failed). */
void mep__p2p_any_check(mep_comm_t *comm);
/* Frees the pair's unexpected messages (at fini). */
void mep__p2p_free_unexpected(mep__p2p_pair_t *pr);

/* p2p_ring.c: the rings. */
int mep__p2p_rx_drain(mep_comm_t *comm, int peer);
int mep__p2p_tx_fill(mep_comm_t *comm, int peer);

#endif
