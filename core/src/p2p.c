/* p2p.c - mep_send/mep_recv: requests, their admission and deadlines, the
 * rings' set-up and the progress pass over every pair, which it registers
 * with the request engine (req.h) to run before the request lists. Calls
 * down to p2p_ring.c and p2p_match.c, the engine and the failure
 * detector's probes (ft.c). */
#include "p2p.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "error.h"
#include "ft.h"
#include "log.h"
#include "region.h"
#include "req.h"

/* ---------------------------------------------------------------- set-up */

static void *zalloc64(size_t len) {
  size_t n = (len + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, n ? n : 64);
  if (p) memset(p, 0, n ? n : 64);
  return p;
}

static int geometry(mep_comm_t *comm, mep__p2p_geom_t *g) {
  int64_t buffer, chunk;
  int rc = mep__config_known_int(comm->cfg, "core", "buffer_bytes", &buffer);
  if (rc == MEP_OK)
    rc = mep__config_known_int(comm->cfg, "core", "chunk_bytes", &chunk);
  if (rc) return mep__err_wrap(rc, "point-to-point rings");
  int npeers = comm->max_size - 1;
  mep__p2p_geometry((uint64_t)buffer, (uint64_t)chunk, npeers, g);
  if ((size_t)npeers > SIZE_MAX / g->ring)
    return mep__err(MEP_ERR_NOMEM, "point-to-point rings: %d rings of %zu "
                    "bytes do not fit in memory", npeers, g->ring);
  if (g->rounded_up)
    mep__info("p2p: [core] buffer_bytes = %lld (from %s) leaves %lld bytes "
              "per peer for %d peers; each ring is rounded up to %zu bytes "
              "(2 slots of %zu)", (long long)buffer,
              mep__config_origin(comm->cfg, "core", "buffer_bytes"),
              (long long)(buffer / npeers), npeers, g->ring, g->slot);
  return MEP_OK;
}

/* Imports the peers' rings and signal words now, so no request ever
 * waits on the store; and checks that every rank sized its rings alike. */
static int import_peers(mep_comm_t *comm, const uint8_t *act) {
  struct mep__p2p *p2p = comm->p2p;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank || !act[p]) continue;
    mep__remote_t *ring, *sig;
    int rc = mep__region_remote(p2p->rr, p, &ring);
    if (rc == MEP_OK) rc = mep__region_remote(p2p->rg, p, &sig);
    if (rc) return rc;
    if (ring->len != p2p->rr->len || sig->len != p2p->rg->len)
      return mep__err(MEP_ERR_CONFIG, "rank %d has %llu bytes of "
                      "point-to-point rings, this rank %zu: [core] "
                      "buffer_bytes and chunk_bytes must be equal on every "
                      "rank", p, (unsigned long long)ring->len,
                      p2p->rr->len);
  }
  return MEP_OK;
}

static int setup_rings(mep_comm_t *comm) {
  struct mep__p2p *p2p = comm->p2p;
  int rc = geometry(comm, &p2p->g);
  if (rc) return rc;
  p2p->payload = p2p->g.slot - MEP__P2P_HDR_BYTES;
  p2p->credit_batch = p2p->g.nslots / 2 ? p2p->g.nslots / 2 : 1;
  size_t total = (size_t)(comm->max_size - 1) * p2p->g.ring;
  p2p->sig_bytes = 2 * (size_t)comm->max_size * sizeof *p2p->sig;
  p2p->rings = zalloc64(total);
  p2p->stage = zalloc64(total);
  p2p->sig = zalloc64(p2p->sig_bytes);
  if (!p2p->rings || !p2p->stage || !p2p->sig)
    return mep__err(MEP_ERR_NOMEM, "point-to-point rings: out of memory "
                    "for 2 x %zu bytes", total);
  /* Every rank registers these three in this order (collective). */
  rc = mep_region_register(comm, p2p->rings, total, MEP_MEM_HOST, &p2p->rr);
  if (rc == MEP_OK)
    rc = mep_region_register(comm, p2p->stage, total, MEP_MEM_HOST,
                             &p2p->rs);
  if (rc == MEP_OK)
    rc = mep_region_register(comm, p2p->sig, p2p->sig_bytes, MEP_MEM_HOST,
                             &p2p->rg);
  if (rc) return rc;
  mep__debug("p2p: %zu slots of %zu bytes per peer (%zu bytes), credits "
             "every %llu slots", p2p->g.nslots, p2p->g.slot, p2p->g.ring,
             (unsigned long long)p2p->credit_batch);
  return MEP_OK;
}

int mep__p2p_init(mep_comm_t *comm) {
  struct mep__p2p *p2p = calloc(1, sizeof *p2p);
  if (p2p) p2p->pairs = calloc((size_t)comm->max_size, sizeof *p2p->pairs);
  if (!p2p || !p2p->pairs) {
    free(p2p);
    return mep__err(MEP_ERR_NOMEM, "point-to-point state: out of memory");
  }
  comm->p2p = p2p;
  int rc = mep__engine_add_hook(comm, MEP__ENGINE_BEFORE, mep__p2p_progress,
                                NULL);
  if (rc == MEP_OK && comm->max_size > 1) rc = setup_rings(comm);
  return rc ? mep__err_wrap(rc, "rank %d", comm->rank) : MEP_OK;
}

int mep__p2p_connect(mep_comm_t *comm, const uint8_t *act) {
  if (!comm->p2p->rr) return MEP_OK;
  int rc = import_peers(comm, act);
  return rc ? mep__err_wrap(rc, "rank %d", comm->rank) : MEP_OK;
}

void mep__p2p_reset_peer(mep_comm_t *comm, int p) {
  struct mep__p2p *p2p = comm->p2p;
  if (!p2p->rr) return;
  mep__p2p_pair_t *pr = &p2p->pairs[p];
  mep__p2p_free_unexpected(pr);
  memset(pr, 0, sizeof *pr);
  size_t idx = (size_t)(p < comm->rank ? p : p - 1);
  memset(p2p->rings + idx * p2p->g.ring, 0, p2p->g.ring);
  __atomic_store_n(&p2p->sig[p], 0, __ATOMIC_RELEASE);
  __atomic_store_n(&p2p->sig[comm->max_size + p], 0, __ATOMIC_RELEASE);
}

void mep__p2p_fini(mep_comm_t *comm) {
  struct mep__p2p *p2p = comm->p2p;
  if (!p2p) return;
  /* Requests still queued were failed and freed by the engine; only the
   * messages are ours. */
  for (int p = 0; p < comm->max_size; p++)
    mep__p2p_free_unexpected(&p2p->pairs[p]);
  mep_region_deregister(p2p->rg);
  mep_region_deregister(p2p->rs);
  mep_region_deregister(p2p->rr);
  free(p2p->rings);
  free(p2p->stage);
  free(p2p->sig);
  free(p2p->pairs);
  free(p2p);
  comm->p2p = NULL;
}

/* -------------------------------------------------------------- progress */

int mep__p2p_progress(mep_comm_t *comm) {
  struct mep__p2p *p2p = comm->p2p;
  if (!p2p || !p2p->rr) return 0;
  int moved = 0;
  for (int p = 0; p < comm->size; p++) {
    mep__p2p_pair_t *pr = &p2p->pairs[p];
    if (p == comm->rank || pr->err) continue;
    /* Read before draining: whatever it published before failing is
     * still delivered. */
    int failed = atomic_load(&comm->peers[p].failed);
    moved += mep__p2p_rx_drain(comm, p);
    if (!pr->err && failed == MEP_ERR_CLOSED)
      mep__p2p_pair_fail(comm, p, MEP_ERR_PEER_FAILED,
                         "rank %d closed its communicator", p);
    else if (!pr->err && failed)
      mep__p2p_pair_fail(comm, p, MEP_ERR_PEER_FAILED,
                         "rank %d has failed (%s)", p, mep_strerror(failed));
    if (!pr->err) moved += mep__p2p_tx_fill(comm, p);
  }
  return moved;
}

/* ------------------------------------------------------------- requests */

static void admit_send(mep_comm_t *comm, mep__p2p_op_t *op) {
  mep__p2p_pair_t *pr = &comm->p2p->pairs[op->peer];
  if (pr->err)
    mep__p2p_finish(comm, op, pr->err, "%s", pr->errmsg);
  else if (pr->tx_err)
    mep__p2p_finish(comm, op, pr->tx_err, "an earlier send to rank %d "
                    "timed out mid-message, which left the stream to it "
                    "unusable", op->peer);
  else
    mep__p2p_q_push(&pr->sendq, op, MEP__P2P_SENDQ);
}

static void admit(mep_comm_t *comm, mep__p2p_op_t *op) {
  op->admitted = 1;
  if (op->is_send && op->peer == comm->rank)
    mep__p2p_admit_self_send(comm, op);
  else if (op->is_send)
    admit_send(comm, op);
  else
    mep__p2p_admit_recv(comm, op);
}

static void expire_send(mep_comm_t *comm, mep__p2p_op_t *op) {
  mep__p2p_pair_t *pr = &comm->p2p->pairs[op->peer];
  int t = comm->timeout_ms;
  if (!op->started) {
    if (pr->sendq.head == op)
      mep__p2p_finish(comm, op, MEP_ERR_TIMEOUT, "not started within %d ms: "
                      "rank %d returned no credits for its full ring (%zu "
                      "slots)", t, op->peer, comm->p2p->g.nslots);
    else
      mep__p2p_finish(comm, op, MEP_ERR_TIMEOUT, "not started within %d ms: "
                      "it waited behind earlier sends to rank %d", t,
                      op->peer);
    return;
  }
  /* Broken off mid-message: the receiver would take the next message's
   * fragments for this one's, so nothing more may go to that peer. */
  pr->tx_err = MEP_ERR_TIMEOUT;
  mep__p2p_finish(comm, op, MEP_ERR_TIMEOUT, "%llu of its bytes went out "
                  "within %d ms; rank %d returned no credits for %llu of "
                  "%zu ring slots", (unsigned long long)op->moved, t,
                  op->peer, (unsigned long long)(pr->head - pr->tail),
                  comm->p2p->g.nslots);
  while (pr->sendq.head)
    mep__p2p_finish(comm, pr->sendq.head, MEP_ERR_TIMEOUT, "an earlier send "
                    "to rank %d timed out mid-message", op->peer);
}

static void expire(mep_comm_t *comm, mep__p2p_op_t *op) {
  int t = comm->timeout_ms;
  if (op->is_send)
    expire_send(comm, op);
  else if (op->where == MEP__P2P_BOUND) /* the rest is dropped */
    mep__p2p_finish(comm, op, MEP_ERR_TIMEOUT, "%llu of the message's %llu "
                    "bytes arrived from rank %d within %d ms",
                    (unsigned long long)op->moved,
                    (unsigned long long)comm->p2p->pairs[op->from].in.total,
                    op->from, t);
  else if (op->peer == MEP_ANY_SOURCE)
    mep__p2p_finish(comm, op, MEP_ERR_TIMEOUT, "no message with tag %d "
                    "arrived from any rank within %d ms", op->tag, t);
  else
    mep__p2p_finish(comm, op, MEP_ERR_TIMEOUT, "no message with tag %d "
                    "arrived from rank %d within %d ms", op->tag, op->peer,
                    t);
}

static int advance(mep_req_t *req);

/* Admits every new request in submission order, so the sends of one
 * thread keep their order on the wire and a pass batches them all. */
static void admit_all(mep_comm_t *comm) {
  for (mep_req_t *r = comm->p2p_head; r; r = r->next) {
    mep__p2p_op_t *op = r->impl;
    if (r->advance == advance && !op->admitted) admit(comm, op);
  }
}

static int advance(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  mep__p2p_op_t *op = req->impl;
  if (!comm->p2p) { /* fini ran before the engine was closed */
    mep__req_set(req, MEP_ERR_CLOSED, "point-to-point state was released "
                 "while this request was running");
    return MEP__ADV_DONE;
  }
  /* The first request of the list does the pass for all of them. */
  if (req == comm->p2p_head) {
    admit_all(comm);
    mep__p2p_progress(comm);
  }
  if (!op->admitted) admit(comm, op);
  if (op->done) return MEP__ADV_DONE;
  if (!mep__passed(op->deadline_ms)) return MEP__ADV_WAIT;
  if (!op->probed) {
    /* Probe the peer before blaming it: one that does not answer is
     * dropped, and the pair fails with MEP_ERR_PEER_FAILED instead. */
    op->probed = 1;
    op->deadline_ms += 2 * mep__ft_probe_ms(comm) + 100;
    mep__ft_probe(comm);
    return MEP__ADV_WAIT;
  }
  expire(comm, op);
  return MEP__ADV_DONE;
}

static void cleanup(mep_req_t *req) { free(req->impl); }

static int start(mep_comm_t *comm, int is_send, const void *buf, size_t bytes,
                 int peer, int tag, mep_req_t **out) {
  const char *fn = is_send ? "mep_send" : "mep_recv";
  if (!comm) return mep__err(MEP_ERR_INVALID, "%s: NULL communicator", fn);
  if ((peer < 0 || peer >= comm->size) &&
      (is_send || peer != MEP_ANY_SOURCE))
    return mep__err(MEP_ERR_INVALID, "%s: peer %d is not in [0, %d)%s", fn,
                    peer, comm->size, is_send ? "" : " nor MEP_ANY_SOURCE");
  if (!buf && bytes)
    return mep__err(MEP_ERR_INVALID, "%s: NULL buffer for %zu bytes", fn,
                    bytes);
  if (tag < 0)
    return mep__err(MEP_ERR_INVALID, "%s: negative tag %d", fn, tag);
  if (!comm->p2p)
    return mep__err(MEP_ERR_INVALID, "%s: point-to-point is not set up on "
                    "this communicator", fn);
  if (mep__ft_excluded(comm))
    return mep__err(MEP_ERR_EXCLUDED, "%s: the other ranks dropped this rank "
                    "from the group", fn);
  mep__p2p_op_t *op = calloc(1, sizeof *op);
  if (!op) return mep__err(MEP_ERR_NOMEM, "%s: out of memory", fn);
  op->is_send = is_send;
  op->peer = peer;
  op->from = -1;
  op->tag = tag;
  op->bytes = bytes;
  if (is_send) op->sbuf = buf;
  else op->rbuf = (uint8_t *)buf;
  op->deadline_ms = mep__deadline_in((uint64_t)comm->timeout_ms);
  mep_req_t *req = mep__req_new(comm, MEP__REQ_P2P, advance, op, cleanup);
  if (!req) {
    free(op);
    return mep__err(MEP_ERR_NOMEM, "%s: out of memory", fn);
  }
  op->req = req;
  return mep__req_start(req, out);
}

int mep_send(mep_comm_t *comm, const void *buf, size_t bytes, int peer,
             int tag, mep_req_t **req) {
  return start(comm, 1, buf, bytes, peer, tag, req);
}

int mep_recv(mep_comm_t *comm, void *buf, size_t bytes, int peer, int tag,
             mep_req_t **req) {
  return start(comm, 0, buf, bytes, peer, tag, req);
}
