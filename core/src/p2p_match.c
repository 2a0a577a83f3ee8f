/* p2p_match.c - matching messages with recvs in order per (peer, tag),
 * unexpected messages, and finishing requests. Progress thread only. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "p2p.h"
#include "req.h"

/* --------------------------------------------------------------- queues */

void mep__p2p_q_push(mep__p2p_queue_t *q, mep__p2p_op_t *op, int where) {
  op->next = NULL;
  op->where = where;
  if (q->tail) q->tail->next = op;
  else q->head = op;
  q->tail = op;
}

void mep__p2p_q_remove(mep__p2p_queue_t *q, mep__p2p_op_t *op) {
  mep__p2p_op_t *prev = NULL;
  for (mep__p2p_op_t *o = q->head; o; prev = o, o = o->next) {
    if (o != op) continue;
    if (prev) prev->next = o->next;
    else q->head = o->next;
    if (q->tail == o) q->tail = prev;
    o->next = NULL;
    return;
  }
}

static mep__p2p_op_t *first_posted(mep__p2p_queue_t *q, int32_t tag) {
  mep__p2p_op_t *o = q->head;
  while (o && o->tag != tag) o = o->next;
  return o;
}

/* The earliest posted recv for a message with `tag` from `peer`: of its
 * pair's queue and the any-source queue, the one queued first. Taken out
 * of its queue, with `from` set. */
static mep__p2p_op_t *take_posted(mep_comm_t *comm, int peer, int32_t tag) {
  struct mep__p2p *p2p = comm->p2p;
  mep__p2p_queue_t *pq = &p2p->pairs[peer].posted, *aq = &p2p->anyq;
  mep__p2p_op_t *a = first_posted(pq, tag), *b = first_posted(aq, tag);
  mep__p2p_queue_t *q = pq;
  if (!a || (b && b->post_no < a->post_no)) {
    a = b;
    q = aq;
  }
  if (!a) return NULL;
  mep__p2p_q_remove(q, a);
  a->where = MEP__P2P_NOWHERE;
  a->from = peer;
  return a;
}

static void unexp_push(mep__p2p_pair_t *pr, mep__p2p_umsg_t *um) {
  um->next = NULL;
  if (pr->unexp_tail) pr->unexp_tail->next = um;
  else pr->unexp = um;
  pr->unexp_tail = um;
}

static void unexp_remove(mep__p2p_pair_t *pr, mep__p2p_umsg_t *um) {
  mep__p2p_umsg_t *prev = NULL;
  for (mep__p2p_umsg_t *u = pr->unexp; u; prev = u, u = u->next) {
    if (u != um) continue;
    if (prev) prev->next = u->next;
    else pr->unexp = u->next;
    if (pr->unexp_tail == u) pr->unexp_tail = prev;
    return;
  }
}

static mep__p2p_umsg_t *unexp_new(mep_comm_t *comm, int32_t tag,
                                  uint64_t total) {
  mep__p2p_umsg_t *um = calloc(1, sizeof *um);
  if (!um) return NULL;
  um->tag = tag;
  um->arrival = ++comm->p2p->arrivals;
  um->total = total;
  if (total > SIZE_MAX || !(um->data = malloc(total ? (size_t)total : 1))) {
    free(um);
    return NULL;
  }
  return um;
}

static void unexp_free(mep__p2p_umsg_t *um) {
  if (!um) return;
  free(um->data);
  free(um);
}

/* ----------------------------------------------------------- finishing */

void mep__p2p_describe(const mep__p2p_op_t *op, char *buf, size_t len) {
  if (op->is_send)
    snprintf(buf, len, "mep_send of %zu bytes to rank %d tag %d", op->bytes,
             op->peer, op->tag);
  else if (op->peer == MEP_ANY_SOURCE)
    snprintf(buf, len, "mep_recv of up to %zu bytes from any rank tag %d",
             op->bytes, op->tag);
  else
    snprintf(buf, len, "mep_recv of up to %zu bytes from rank %d tag %d",
             op->bytes, op->peer, op->tag);
}

void mep__p2p_finish(mep_comm_t *comm, mep__p2p_op_t *op, int status,
                     const char *fmt, ...) {
  if (op->done) return;
  struct mep__p2p *p2p = comm->p2p;
  if (op->where == MEP__P2P_SENDQ)
    mep__p2p_q_remove(&p2p->pairs[op->peer].sendq, op);
  else if (op->where == MEP__P2P_POSTED && op->peer == MEP_ANY_SOURCE)
    mep__p2p_q_remove(&p2p->anyq, op);
  else if (op->where == MEP__P2P_POSTED)
    mep__p2p_q_remove(&p2p->pairs[op->peer].posted, op);
  else if (op->where == MEP__P2P_BOUND && p2p->pairs[op->from].in.op == op)
    p2p->pairs[op->from].in.op = NULL;
  op->where = MEP__P2P_NOWHERE;
  op->done = 1;
  int got = status == MEP_OK && !op->is_send;
  op->req->bytes = got ? (size_t)op->total : 0;
  op->req->source = got ? op->from : -1;
  if (status == MEP_OK || !fmt) {
    mep__req_set(op->req, status, NULL);
    return;
  }
  char what[160], why[400];
  mep__p2p_describe(op, what, sizeof what);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  mep__req_set(op->req, status, "%s: %s", what, why);
}

static void fail_queue(mep_comm_t *comm, mep__p2p_queue_t *q, int code,
                       const char *msg) {
  while (q->head) mep__p2p_finish(comm, q->head, code, "%s", msg);
}

void mep__p2p_pair_fail(mep_comm_t *comm, int peer, int code,
                        const char *fmt, ...) {
  mep__p2p_pair_t *pr = &comm->p2p->pairs[peer];
  if (pr->err) return;
  /* A peer that closed in order is as gone as one that died. */
  pr->err = code == MEP_ERR_CLOSED ? MEP_ERR_PEER_FAILED : code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pr->errmsg, sizeof pr->errmsg, fmt, ap);
  va_end(ap);
  if (code == MEP_ERR_PROTOCOL)
    mep__comm_fail_peer(comm, peer, MEP_ERR_PROTOCOL, pr->errmsg);
  fail_queue(comm, &pr->sendq, pr->err, pr->errmsg);
  fail_queue(comm, &pr->posted, pr->err, pr->errmsg);
  if (pr->in.op)
    mep__p2p_finish(comm, pr->in.op, pr->err, "%s, after %llu of the "
                    "message's %llu bytes arrived", pr->errmsg,
                    (unsigned long long)pr->in.got,
                    (unsigned long long)pr->in.total);
  /* A partly received unexpected message will never be whole; finished
   * ones stay receivable. */
  if (pr->in.um) {
    unexp_remove(pr, pr->in.um);
    unexp_free(pr->in.um);
  }
  memset(&pr->in, 0, sizeof pr->in);
  mep__p2p_any_check(comm);
}

/* Whether some other rank of the group may still send: one that has not
 * failed. A group of one has no other rank; only its own sends match. */
static int a_sender_lives(mep_comm_t *comm) {
  if (comm->size < 2) return 1;
  for (int p = 0; p < comm->size; p++)
    if (p != comm->rank && !comm->p2p->pairs[p].err &&
        !atomic_load(&comm->peers[p].failed))
      return 1;
  return 0;
}

void mep__p2p_any_check(mep_comm_t *comm) {
  mep__p2p_queue_t *q = &comm->p2p->anyq;
  if (!q->head || a_sender_lives(comm)) return;
  while (q->head)
    mep__p2p_finish(comm, q->head, MEP_ERR_PEER_FAILED, "every other rank "
                    "of the group has failed: no message can come any more");
}

/* ------------------------------------------------------------ matching */

/* Whether a message of `total` bytes fits `op`; fails op if not. */
static int fits(mep_comm_t *comm, mep__p2p_op_t *op, uint64_t total) {
  if (total <= op->bytes) return 1;
  mep__p2p_finish(comm, op, MEP_ERR_INVALID,
                  "the message has %llu bytes but the buffer only %zu (the "
                  "message is dropped)",
                  (unsigned long long)total, op->bytes);
  return 0;
}

static void complete_recv(mep_comm_t *comm, mep__p2p_op_t *op,
                          uint64_t total) {
  op->total = total;
  op->moved = total;
  mep__p2p_finish(comm, op, MEP_OK, NULL);
}

/* A message's first fragment: a posted recv takes it, else it is kept. */
static void begin_message(mep_comm_t *comm, int peer,
                          const mep__p2p_hdr_t *h) {
  mep__p2p_pair_t *pr = &comm->p2p->pairs[peer];
  mep__p2p_inmsg_t *in = &pr->in;
  *in = (mep__p2p_inmsg_t){
      .active = 1, .tag = h->tag, .seq = h->seq, .total = h->total};
  pr->rx_seq++;
  mep__p2p_op_t *op = take_posted(comm, peer, h->tag);
  if (op) {
    if (fits(comm, op, h->total)) {
      in->op = op;
      op->where = MEP__P2P_BOUND;
    }
    return; /* a recv too small drops the message: in->op stays NULL */
  }
  in->um = unexp_new(comm, h->tag, h->total);
  if (!in->um) {
    mep__p2p_pair_fail(comm, peer, MEP_ERR_NOMEM,
                       "out of memory for an unexpected message of %llu "
                       "bytes with tag %d from rank %d",
                       (unsigned long long)h->total, (int)h->tag, peer);
    return;
  }
  unexp_push(pr, in->um);
}

void mep__p2p_deliver(mep_comm_t *comm, int peer, const mep__p2p_hdr_t *h,
                      const uint8_t *payload) {
  mep__p2p_pair_t *pr = &comm->p2p->pairs[peer];
  mep__p2p_inmsg_t *in = &pr->in;
  if (!in->active) begin_message(comm, peer, h);
  if (!in->active) return; /* the pair failed */
  if (h->len && in->op) memcpy(in->op->rbuf + in->got, payload, h->len);
  if (h->len && in->um) memcpy(in->um->data + in->got, payload, h->len);
  in->got += h->len;
  if (in->op) in->op->moved = in->got;
  if (in->um) in->um->got = in->got;
  if (in->got < in->total) return;
  if (in->op) complete_recv(comm, in->op, in->total);
  if (in->um) in->um->complete = 1;
  memset(in, 0, sizeof *in);
}

/* The unexpected message an any-source recv of `tag` takes: the earliest
 * arrived over every pair; NULL if none. Sets *from. */
static mep__p2p_umsg_t *first_unexpected_any(mep_comm_t *comm, int32_t tag,
                                             int *from) {
  mep__p2p_umsg_t *best = NULL;
  for (int p = 0; p < comm->size; p++) {
    mep__p2p_umsg_t *um = comm->p2p->pairs[p].unexp;
    while (um && um->tag != tag) um = um->next;
    if (um && (!best || um->arrival < best->arrival)) {
      best = um;
      *from = p;
    }
  }
  return best;
}

/* `op` takes the unexpected message `um` of pair `from`. */
static void take_unexpected(mep_comm_t *comm, mep__p2p_op_t *op, int from,
                            mep__p2p_umsg_t *um) {
  mep__p2p_pair_t *pr = &comm->p2p->pairs[from];
  op->from = from;
  unexp_remove(pr, um);
  int arriving = !um->complete; /* it is the pair's message in flight */
  if (arriving) pr->in.um = NULL;
  if (fits(comm, op, um->total)) {
    if (um->got) memcpy(op->rbuf, um->data, (size_t)um->got);
    if (arriving) { /* the rest goes straight into the buffer */
      pr->in.op = op;
      op->moved = um->got;
      op->where = MEP__P2P_BOUND;
    } else {
      complete_recv(comm, op, um->total);
    }
  }
  unexp_free(um);
}

static void admit_recv_any(mep_comm_t *comm, mep__p2p_op_t *op) {
  int from = -1;
  mep__p2p_umsg_t *um = first_unexpected_any(comm, op->tag, &from);
  if (um) {
    take_unexpected(comm, op, from, um);
    return;
  }
  op->post_no = ++comm->p2p->posts;
  mep__p2p_q_push(&comm->p2p->anyq, op, MEP__P2P_POSTED);
  mep__p2p_any_check(comm);
}

void mep__p2p_admit_recv(mep_comm_t *comm, mep__p2p_op_t *op) {
  op->from = -1;
  if (op->peer == MEP_ANY_SOURCE) {
    admit_recv_any(comm, op);
    return;
  }
  mep__p2p_pair_t *pr = &comm->p2p->pairs[op->peer];
  mep__p2p_umsg_t *um = pr->unexp;
  while (um && um->tag != op->tag) um = um->next;
  if (um) {
    take_unexpected(comm, op, op->peer, um);
    return;
  }
  if (pr->err) {
    mep__p2p_finish(comm, op, pr->err, "%s", pr->errmsg);
    return;
  }
  op->post_no = ++comm->p2p->posts;
  mep__p2p_q_push(&pr->posted, op, MEP__P2P_POSTED);
}

/* To the own rank: straight into a posted recv, else kept as unexpected;
 * the send is done either way. */
void mep__p2p_admit_self_send(mep_comm_t *comm, mep__p2p_op_t *op) {
  mep__p2p_pair_t *pr = &comm->p2p->pairs[comm->rank];
  mep__p2p_op_t *r = take_posted(comm, comm->rank, op->tag);
  if (r) {
    if (fits(comm, r, op->bytes)) {
      if (op->bytes) memcpy(r->rbuf, op->sbuf, op->bytes);
      complete_recv(comm, r, op->bytes);
    }
  } else {
    mep__p2p_umsg_t *um = unexp_new(comm, op->tag, op->bytes);
    if (!um) {
      mep__p2p_finish(comm, op, MEP_ERR_NOMEM,
                      "out of memory for a copy of the message");
      return;
    }
    if (op->bytes) memcpy(um->data, op->sbuf, op->bytes);
    um->got = op->bytes;
    um->complete = 1;
    unexp_push(pr, um);
  }
  op->moved = op->bytes;
  mep__p2p_finish(comm, op, MEP_OK, NULL);
}

void mep__p2p_free_unexpected(mep__p2p_pair_t *pr) {
  for (mep__p2p_umsg_t *u = pr->unexp, *next; u; u = next) {
    next = u->next;
    unexp_free(u);
  }
  pr->unexp = pr->unexp_tail = NULL;
  pr->in.um = NULL;
}
