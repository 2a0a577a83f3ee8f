/* run.c - one call of the measured operation, every wait bounded by -t. */
#include <stdio.h>

#include "perf.h"

enum { TAG_PING = 1, TAG_PONG = 2, TAG_RING = 3 };

static int failed(const perf_rank_t *r, const char *what, int rc) {
  fprintf(stderr, "mep-perf: rank %d: %s of %zu bytes failed: %s: %s\n",
          r->rank, what, r->sh.bytes, mep_strerror(rc), mep_last_error());
  return rc;
}

/* Releases a request. One still running (past its deadline) is detached
 * and may still use the buffers, which must then outlive the sweep. */
static void release(perf_rank_t *r, mep_req_t *req) {
  if (req && mep_req_status(req) == MEP_RUNNING) r->detached = 1;
  mep_req_free(req);
}

/* Waits for a request started with result `rc` and releases it. */
static int finish(perf_rank_t *r, const char *what, int rc, mep_req_t *req) {
  if (rc == 0) rc = mep_req_wait(req, r->o->timeout_ms);
  if (rc) failed(r, what, rc);
  release(r, req);
  return rc;
}

/* A receive must bring exactly the bytes that were sent. */
static int finish_recv(perf_rank_t *r, const char *what, int rc,
                       mep_req_t *req, size_t want) {
  if (rc == 0) rc = mep_req_wait(req, r->o->timeout_ms);
  if (rc == 0 && mep_req_bytes(req) != want) {
    fprintf(stderr, "mep-perf: rank %d: %s received %zu bytes, not the %zu "
            "sent\n", r->rank, what, mep_req_bytes(req), want);
    rc = MEP_ERR_PROTOCOL;
  } else if (rc) {
    failed(r, what, rc);
  }
  release(r, req);
  return rc;
}

static int run_sendrecv(perf_rank_t *r) {
  size_t bytes = r->sh.count * r->dsize;
  int next = (r->rank + 1) % r->n, prev = (r->rank + r->n - 1) % r->n;
  mep_req_t *rreq = NULL, *sreq = NULL;
  int rc = mep_recv(r->comm, r->recv, bytes, prev, TAG_RING, &rreq);
  if (rc) return failed(r, "sendrecv (recv)", rc);
  rc = mep_send(r->comm, r->send, bytes, next, TAG_RING, &sreq);
  if (rc) {
    release(r, rreq);
    return failed(r, "sendrecv (send)", rc);
  }
  rc = finish_recv(r, "sendrecv (recv)", 0, rreq, bytes);
  int src = finish(r, "sendrecv (send)", 0, sreq);
  return rc ? rc : src;
}

/* Rank 0 sends and gets the message back; rank 1 returns what it got. */
static int run_pingpong(perf_rank_t *r) {
  size_t bytes = r->sh.count * r->dsize;
  mep_req_t *req = NULL;
  int rc;
  if (r->rank == 0) {
    rc = mep_send(r->comm, r->send, bytes, 1, TAG_PING, &req);
    if ((rc = finish(r, "pingpong (ping)", rc, req))) return rc;
    rc = mep_recv(r->comm, r->recv, bytes, 1, TAG_PONG, &req);
    return finish_recv(r, "pingpong (pong)", rc, req, bytes);
  }
  if (r->rank == 1) {
    rc = mep_recv(r->comm, r->recv, bytes, 0, TAG_PING, &req);
    if ((rc = finish_recv(r, "pingpong (ping)", rc, req, bytes))) return rc;
    rc = mep_send(r->comm, r->recv, bytes, 0, TAG_PONG, &req);
    return finish(r, "pingpong (pong)", rc, req);
  }
  return 0;
}

/* alltoallv's counts and displacements in the form the API takes. */
static int run_alltoallv(const perf_rank_t *r, mep_req_t **req) {
  return mep_alltoallv(r->comm, r->send, r->scounts, r->sdispls, r->recv,
                       r->rcounts, r->rdispls, r->o->dtype, req);
}

int perf_run(perf_rank_t *r) {
  const perf_opts_t *o = r->o;
  mep_comm_t *c = r->comm;
  size_t n = r->sh.count;
  mep_dtype_t dt = o->dtype;
  mep_req_t *req = NULL;
  int rc = 0;
  switch (o->kind) {
  case PERF_ALLREDUCE:
    rc = mep_allreduce(c, r->send, r->recv, n, dt, o->redop, &req);
    break;
  case PERF_BROADCAST:
    rc = mep_broadcast(c, r->recv, n, dt, o->root, &req);
    break;
  case PERF_REDUCE:
    rc = mep_reduce(c, r->send, r->rank == o->root ? r->recv : NULL, n, dt,
                    o->redop, o->root, &req);
    break;
  case PERF_ALLGATHER:
    rc = mep_allgather(c, r->send, r->recv, n, dt, &req);
    break;
  case PERF_REDUCE_SCATTER:
    rc = mep_reduce_scatter(c, r->send, r->recv, n, dt, o->redop, &req);
    break;
  case PERF_ALLTOALL:
    rc = mep_alltoall(c, r->send, r->recv, n, dt, &req);
    break;
  case PERF_ALLTOALLV: rc = run_alltoallv(r, &req); break;
  case PERF_GATHER:
    rc = mep_gather(c, r->send, r->recv, n, dt, o->root, &req);
    break;
  case PERF_SCATTER:
    rc = mep_scatter(c, r->send, r->recv, n, dt, o->root, &req);
    break;
  case PERF_BARRIER: rc = mep_barrier(c, &req); break;
  case PERF_SENDRECV: return run_sendrecv(r);
  case PERF_PINGPONG: return run_pingpong(r);
  case PERF_OP_COUNT: return MEP_ERR_INVALID;
  }
  return finish(r, perf_op(o->kind)->name, rc, req);
}
