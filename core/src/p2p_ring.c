/* p2p_ring.c - the rings of slots: geometry, header checks, draining a
 * peer's ring and filling ours in its memory. */
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "p2p.h"
#include "region.h"

int mep__p2p_geometry(uint64_t buffer_bytes, uint64_t chunk_bytes,
                      int npeers, mep__p2p_geom_t *g) {
  if (!g || buffer_bytes == 0 || chunk_bytes == 0 || npeers < 1)
    return MEP_ERR_INVALID;
  uint64_t share = buffer_bytes / (uint64_t)npeers;
  uint64_t slot = chunk_bytes < share / 2 ? chunk_bytes : share / 2;
  slot &= ~(uint64_t)63;
  if (slot < MEP__P2P_MIN_SLOT) slot = MEP__P2P_MIN_SLOT;
  uint64_t nslots = share / slot;
  g->rounded_up = nslots < 2;
  if (nslots < 2) nslots = 2;
  g->slot = (size_t)slot;
  g->nslots = (size_t)nslots;
  g->ring = (size_t)(slot * nslots);
  return MEP_OK;
}

#define WHY(...) (snprintf(why, why_len, __VA_ARGS__), MEP_ERR_PROTOCOL)

int mep__p2p_hdr_check(const mep__p2p_hdr_t *h, const mep__p2p_expect_t *e,
                       char *why, size_t why_len) {
  if (h->magic != MEP__P2P_MAGIC)
    return WHY("bad magic 0x%08x", h->magic);
  if (h->flags != 0) return WHY("unknown flags 0x%x", h->flags);
  if (h->src != (uint32_t)e->src)
    return WHY("written by rank %u, not %d", h->src, e->src);
  if (h->slot_no != e->slot_no)
    return WHY("slot written at ring position %llu, expected %llu",
               (unsigned long long)h->slot_no,
               (unsigned long long)e->slot_no);
  if (h->len > e->payload)
    return WHY("fragment of %llu bytes in a slot of %zu payload bytes",
               (unsigned long long)h->len, e->payload);
  if (h->offset > h->total || h->len > h->total - h->offset)
    return WHY("fragment of %llu bytes at offset %llu of a %llu-byte "
               "message", (unsigned long long)h->len,
               (unsigned long long)h->offset, (unsigned long long)h->total);
  if (e->in_msg) {
    if (h->seq != e->seq || h->tag != e->tag || h->total != e->total)
      return WHY("fragment of message %llu (tag %d, %llu bytes) while "
                 "message %llu (tag %d, %llu bytes) is unfinished",
                 (unsigned long long)h->seq, (int)h->tag,
                 (unsigned long long)h->total, (unsigned long long)e->seq,
                 (int)e->tag, (unsigned long long)e->total);
    if (h->offset != e->got)
      return WHY("fragment at offset %llu, expected %llu",
                 (unsigned long long)h->offset, (unsigned long long)e->got);
  } else {
    if (h->seq != e->next_seq)
      return WHY("message %llu, expected %llu", (unsigned long long)h->seq,
                 (unsigned long long)e->next_seq);
    if (h->tag < 0) return WHY("negative tag %d", (int)h->tag);
    if (h->offset != 0)
      return WHY("message %llu starts at offset %llu",
                 (unsigned long long)h->seq, (unsigned long long)h->offset);
  }
  /* Senders fill slots: only the last fragment may be short, and only an
   * empty message has an empty fragment, so every slot makes progress. */
  uint64_t left = h->total - h->offset;
  uint64_t want = left < e->payload ? left : e->payload;
  if (h->len != want)
    return WHY("fragment of %llu bytes where %llu were due",
               (unsigned long long)h->len, (unsigned long long)want);
  return MEP_OK;
}

/* Position of rank q among the peers of rank r (q != r). */
static size_t peer_index(int q, int r) { return (size_t)(q < r ? q : q - 1); }

static size_t tail_word(const mep_comm_t *comm, int dst) {
  return ((size_t)comm->max_size + (size_t)dst) * sizeof(uint64_t);
}

static size_t head_word(int src) { return (size_t)src * sizeof(uint64_t); }

/* ------------------------------------------------------------ receiving */

static void expect_of(const mep_comm_t *comm, int peer,
                      mep__p2p_expect_t *e) {
  const struct mep__p2p *p2p = comm->p2p;
  const mep__p2p_pair_t *pr = &p2p->pairs[peer];
  *e = (mep__p2p_expect_t){.src = peer,
                           .slot_no = pr->consumed,
                           .payload = p2p->payload,
                           .in_msg = pr->in.active,
                           .tag = pr->in.tag,
                           .seq = pr->in.seq,
                           .total = pr->in.total,
                           .got = pr->in.got,
                           .next_seq = pr->rx_seq};
}

/* Credits go back in batches: a ring that a sender filled is drained
 * whole (unmatched messages are copied out), so the batch is always
 * reached and the sender never waits for a credit that is held back. */
static void return_credits(mep_comm_t *comm, int peer) {
  struct mep__p2p *p2p = comm->p2p;
  mep__p2p_pair_t *pr = &p2p->pairs[peer];
  if (pr->consumed - pr->reported < p2p->credit_batch) return;
  int rc = mep_signal(comm, peer, p2p->rg, tail_word(comm, comm->rank),
                      pr->consumed, MEP_SIGNAL_SET);
  if (rc) {
    mep__p2p_pair_fail(comm, peer, rc, "returning ring credits: %s",
                       mep_last_error());
    return;
  }
  pr->reported = pr->consumed;
}

int mep__p2p_rx_drain(mep_comm_t *comm, int peer) {
  struct mep__p2p *p2p = comm->p2p;
  mep__p2p_pair_t *pr = &p2p->pairs[peer];
  uint64_t head = __atomic_load_n(&p2p->sig[peer], __ATOMIC_ACQUIRE);
  if (head < pr->consumed || head - pr->consumed > p2p->g.nslots) {
    mep__p2p_pair_fail(comm, peer, MEP_ERR_PROTOCOL,
                       "rank %d published ring head %llu while %llu slots "
                       "of its %zu-slot ring were consumed", peer,
                       (unsigned long long)head,
                       (unsigned long long)pr->consumed, p2p->g.nslots);
    return 0;
  }
  const uint8_t *ring =
      p2p->rings + peer_index(peer, comm->rank) * p2p->g.ring;
  int moved = 0;
  while (pr->consumed < head && !pr->err) {
    const uint8_t *slot = ring + (pr->consumed % p2p->g.nslots) * p2p->g.slot;
    mep__p2p_hdr_t h;
    memcpy(&h, slot, sizeof h); /* one copy: the check and use agree */
    mep__p2p_expect_t e;
    expect_of(comm, peer, &e);
    char why[256];
    if (mep__p2p_hdr_check(&h, &e, why, sizeof why)) {
      mep__p2p_pair_fail(comm, peer, MEP_ERR_PROTOCOL,
                         "bad slot %llu in the ring of rank %d: %s",
                         (unsigned long long)pr->consumed, peer, why);
      return moved;
    }
    mep__p2p_deliver(comm, peer, &h, slot + MEP__P2P_HDR_BYTES);
    pr->consumed++;
    moved++;
  }
  if (!pr->err && !atomic_load(&comm->peers[peer].failed))
    return_credits(comm, peer);
  return moved;
}

/* -------------------------------------------------------------- sending */

/* Puts consecutive slots [first, first + n) with one write: only the last
 * may be partly filled (callers end a run after a short slot). */
static int put_run(mep_comm_t *comm, int peer, size_t first, size_t n,
                   size_t last_len) {
  struct mep__p2p *p2p = comm->p2p;
  if (!n) return MEP_OK;
  size_t soff = peer_index(peer, comm->rank) * p2p->g.ring +
                first * p2p->g.slot;
  size_t roff = peer_index(comm->rank, peer) * p2p->g.ring +
                first * p2p->g.slot;
  size_t len = (n - 1) * p2p->g.slot + MEP__P2P_HDR_BYTES + last_len;
  return mep_put(comm, peer, p2p->rs, soff, p2p->rr, roff, len);
}

/* Writes the next fragment of `op` into staging slot `idx`; returns its
 * payload length. */
static size_t write_slot(mep_comm_t *comm, mep__p2p_pair_t *pr,
                         mep__p2p_op_t *op, size_t idx) {
  struct mep__p2p *p2p = comm->p2p;
  uint8_t *slot = p2p->stage + peer_index(op->peer, comm->rank) * p2p->g.ring +
                  idx * p2p->g.slot;
  if (!op->started) {
    op->started = 1;
    op->seq = pr->tx_seq++;
  }
  uint64_t left = op->bytes - op->moved;
  size_t len = left < p2p->payload ? (size_t)left : p2p->payload;
  mep__p2p_hdr_t h = {.magic = MEP__P2P_MAGIC,
                      .tag = op->tag,
                      .src = (uint32_t)comm->rank,
                      .slot_no = pr->head,
                      .seq = op->seq,
                      .total = op->bytes,
                      .offset = op->moved,
                      .len = len};
  memcpy(slot, &h, sizeof h);
  if (len) memcpy(slot + MEP__P2P_HDR_BYTES, op->sbuf + op->moved, len);
  op->moved += len;
  pr->head++;
  return len;
}

int mep__p2p_tx_fill(mep_comm_t *comm, int peer) {
  struct mep__p2p *p2p = comm->p2p;
  mep__p2p_pair_t *pr = &p2p->pairs[peer];
  if (!pr->sendq.head) return 0;
  uint64_t tail =
      __atomic_load_n(&p2p->sig[comm->max_size + peer], __ATOMIC_ACQUIRE);
  if (tail < pr->tail || tail > pr->head) {
    mep__p2p_pair_fail(comm, peer, MEP_ERR_PROTOCOL,
                       "rank %d reported %llu slots of our ring consumed, "
                       "with %llu reported before and %llu written",
                       peer, (unsigned long long)tail,
                       (unsigned long long)pr->tail,
                       (unsigned long long)pr->head);
    return 0;
  }
  pr->tail = tail;
  uint64_t head0 = pr->head;
  size_t run_first = 0, run_n = 0, last_len = 0;
  int rc = MEP_OK;
  mep__p2p_op_t *op = pr->sendq.head;
  while (op && rc == MEP_OK && pr->head - pr->tail < p2p->g.nslots) {
    size_t idx = (size_t)(pr->head % p2p->g.nslots);
    /* A run continues only into the next slot and after a full one. */
    if (run_n && (idx != run_first + run_n || last_len != p2p->payload)) {
      rc = put_run(comm, peer, run_first, run_n, last_len);
      run_n = 0;
    }
    if (!run_n) run_first = idx;
    last_len = write_slot(comm, pr, op, idx);
    run_n++;
    if (op->moved == op->bytes) op = op->next;
  }
  if (rc == MEP_OK) rc = put_run(comm, peer, run_first, run_n, last_len);
  if (rc == MEP_OK && pr->head != head0)
    rc = mep_signal(comm, peer, p2p->rg, head_word(comm->rank), pr->head,
                    MEP_SIGNAL_SET);
  if (rc) {
    mep__p2p_pair_fail(comm, peer, rc, "sending: %s", mep_last_error());
    return 0;
  }
  /* Published: the sends whose last fragment went out are done (their
   * bytes live in staging until the peer consumed them). */
  while ((op = pr->sendq.head) && op->started && op->moved == op->bytes)
    mep__p2p_finish(comm, op, MEP_OK, NULL);
  return (int)(pr->head - head0);
}
