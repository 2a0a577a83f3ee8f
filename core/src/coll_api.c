/* coll_api.c - the collectives of mep.h: argument checks, then the spec
 * (plan.h) the engine (coll.c) starts. Above the engine; the CUDA staged
 * path (cuda_stage.c) and recovery (recover.c) call in here too. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "error.h"
#include "reduce.h"

typedef struct args {
  const char *fn;
  int me, n;
  size_t ds; /* dtype size */
} args_t;

static int check_comm(mep_comm_t *comm, const char *fn) {
  if (!comm) return mep__err(MEP_ERR_INVALID, "%s: NULL communicator", fn);
  if (!comm->coll)
    return mep__err(MEP_ERR_INVALID, "%s: communicator has no collective "
                    "staging", fn);
  return MEP_OK;
}

static int check(args_t *a, mep_comm_t *comm, const char *fn,
                 mep_dtype_t dtype, int root, int needs_root) {
  int rc = check_comm(comm, fn);
  if (rc) return rc;
  memset(a, 0, sizeof *a);
  a->fn = fn;
  a->me = comm->rank;
  a->n = comm->size;
  a->ds = mep_dtype_size(dtype);
  if (!a->ds) return mep__err(MEP_ERR_INVALID, "%s: unknown dtype %d", fn,
                              (int)dtype);
  if (needs_root && (root < 0 || root >= comm->size))
    return mep__err(MEP_ERR_INVALID, "%s: root %d is not in [0, %d)", fn,
                    root, comm->size);
  return MEP_OK;
}

/* count * dtype size * factor, refusing overflow. */
static int bytes_of(const args_t *a, size_t count, size_t factor,
                    size_t *out) {
  if (count && (a->ds > SIZE_MAX / count || count * a->ds > SIZE_MAX / factor))
    return mep__err(MEP_ERR_INVALID, "%s: count %zu overflows", a->fn, count);
  *out = count * a->ds * factor;
  return MEP_OK;
}

/* Bytes of one block of `count` elements and of one per rank. */
static int block_sizes(const args_t *a, size_t count, size_t *bytes,
                       size_t *total) {
  int rc = bytes_of(a, count, 1, bytes);
  return rc ? rc : bytes_of(a, count, (size_t)a->n, total);
}

static int need(const args_t *a, const void *p, size_t bytes,
                const char *what) {
  if (!p && bytes)
    return mep__err(MEP_ERR_INVALID, "%s: %s is NULL", a->fn, what);
  return MEP_OK;
}

static void spec_init(mep__coll_spec_t *s, int kind, mep_dtype_t dtype,
                      mep_op_t op, size_t count, int root, const void *send,
                      void *recv) {
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->dtype = dtype;
  s->op = op;
  s->count = count;
  s->root = root;
  s->send = send;
  s->recv = recv;
}

static int overlap(const void *a, size_t alen, const void *b, size_t blen) {
  const char *x = a, *y = b;
  return alen && blen && x < y + blen && y < x + alen;
}

/* An input that shares memory with the output (in place) is marked to be
 * copied aside (coll.c: when the collective starts, or by the copy thread
 * while a large all-reduce runs): the engine reads inputs after writing
 * outputs, and a collective run again over the survivors reads them once
 * more. */
static void private_input(mep__coll_spec_t *s, size_t sbytes,
                          size_t rbytes) {
  if (overlap(s->send, sbytes, s->recv, rbytes)) s->copy_bytes = sbytes;
}

/* The extent of a v-layout: max over p of displ + count, in bytes. */
static int extent(const args_t *a, const size_t *counts, const size_t *displs,
                  const char *what, size_t *out) {
  size_t end = 0;
  for (int p = 0; p < a->n; p++) {
    size_t e = 0;
    if (counts[p] > SIZE_MAX - displs[p] ||
        bytes_of(a, counts[p] + displs[p], 1, &e))
      return mep__err(MEP_ERR_INVALID, "%s: %s count + displacement of rank "
                      "%d overflows", a->fn, what, p);
    if (e > end) end = e;
  }
  *out = end;
  return MEP_OK;
}

/* -------------------------------------------------------------- calls
 * Each collective of one count, checked, started with the request hooks
 * its caller passes: none from mep.h, the CUDA staged path's gate through
 * mep__coll_submit. */

static int allreduce(mep_comm_t *comm, const void *send, void *recv,
                     size_t count, mep_dtype_t dtype, mep_op_t op,
                     const mep__req_hooks_t *hooks, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  size_t bytes = 0;
  int rc = check(&a, comm, "mep_allreduce", dtype, -1, 0);
  if (rc == MEP_OK) rc = mep__reduce_check(dtype, op);
  if (rc == MEP_OK) rc = bytes_of(&a, count, 1, &bytes);
  if (rc == MEP_OK) rc = need(&a, send, bytes, "send");
  if (rc == MEP_OK) rc = need(&a, recv, bytes, "recv");
  if (rc) return rc;
  spec_init(&s, MEP__COLL_ALLREDUCE, dtype, op, count, -1, send, recv);
  private_input(&s, bytes, bytes);
  return mep__coll_start(comm, &s, hooks, req);
}

static int reduce(mep_comm_t *comm, const void *send, void *recv,
                  size_t count, mep_dtype_t dtype, mep_op_t op, int root,
                  const mep__req_hooks_t *hooks, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  size_t bytes = 0;
  int rc = check(&a, comm, "mep_reduce", dtype, root, 1);
  if (rc == MEP_OK) rc = mep__reduce_check(dtype, op);
  if (rc == MEP_OK) rc = bytes_of(&a, count, 1, &bytes);
  if (rc == MEP_OK) rc = need(&a, send, bytes, "send");
  if (rc == MEP_OK && a.me == root) rc = need(&a, recv, bytes, "recv");
  if (rc) return rc;
  spec_init(&s, MEP__COLL_REDUCE, dtype, op, count, root, send, recv);
  if (a.me == root) private_input(&s, bytes, bytes);
  return mep__coll_start(comm, &s, hooks, req);
}

static int reduce_scatter(mep_comm_t *comm, const void *send, void *recv,
                          size_t count, mep_dtype_t dtype, mep_op_t op,
                          const mep__req_hooks_t *hooks, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  size_t bytes = 0, total = 0;
  int rc = check(&a, comm, "mep_reduce_scatter", dtype, -1, 0);
  if (rc == MEP_OK) rc = mep__reduce_check(dtype, op);
  if (rc == MEP_OK) rc = block_sizes(&a, count, &bytes, &total);
  if (rc == MEP_OK) rc = need(&a, send, total, "send");
  if (rc == MEP_OK) rc = need(&a, recv, bytes, "recv");
  if (rc) return rc;
  spec_init(&s, MEP__COLL_REDUCE_SCATTER, dtype, op, count, -1, send, recv);
  private_input(&s, total, bytes);
  return mep__coll_start(comm, &s, hooks, req);
}

static int broadcast(mep_comm_t *comm, void *buf, size_t count,
                     mep_dtype_t dtype, int root,
                     const mep__req_hooks_t *hooks, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  size_t bytes = 0;
  int rc = check(&a, comm, "mep_broadcast", dtype, root, 1);
  if (rc == MEP_OK) rc = bytes_of(&a, count, 1, &bytes);
  if (rc == MEP_OK) rc = need(&a, buf, bytes, "buf");
  if (rc) return rc;
  spec_init(&s, MEP__COLL_BROADCAST, dtype, MEP_SUM, count, root, buf, buf);
  return mep__coll_start(comm, &s, hooks, req);
}

static int allgather(mep_comm_t *comm, const void *send, void *recv,
                     size_t count, mep_dtype_t dtype,
                     const mep__req_hooks_t *hooks, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  size_t bytes = 0, total = 0;
  int rc = check(&a, comm, "mep_allgather", dtype, -1, 0);
  if (rc == MEP_OK) rc = block_sizes(&a, count, &bytes, &total);
  if (rc == MEP_OK) rc = need(&a, send, bytes, "send");
  if (rc == MEP_OK) rc = need(&a, recv, total, "recv");
  if (rc) return rc;
  spec_init(&s, MEP__COLL_ALLGATHER, dtype, MEP_SUM, count, -1, send, recv);
  uint8_t *mine = (uint8_t *)recv + (size_t)a.me * bytes;
  if (send != mine) private_input(&s, bytes, total);
  return mep__coll_start(comm, &s, hooks, req);
}

static int alltoall(mep_comm_t *comm, const void *send, void *recv,
                    size_t count, mep_dtype_t dtype,
                    const mep__req_hooks_t *hooks, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  size_t bytes = 0, total = 0;
  int rc = check(&a, comm, "mep_alltoall", dtype, -1, 0);
  if (rc == MEP_OK) rc = block_sizes(&a, count, &bytes, &total);
  if (rc == MEP_OK) rc = need(&a, send, total, "send");
  if (rc == MEP_OK) rc = need(&a, recv, total, "recv");
  if (rc) return rc;
  spec_init(&s, MEP__COLL_ALLTOALL, dtype, MEP_SUM, count, -1, send, recv);
  private_input(&s, total, total);
  return mep__coll_start(comm, &s, hooks, req);
}

static int gather(mep_comm_t *comm, const void *send, void *recv,
                  size_t count, mep_dtype_t dtype, int root,
                  const mep__req_hooks_t *hooks, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  size_t bytes = 0, total = 0;
  int rc = check(&a, comm, "mep_gather", dtype, root, 1);
  if (rc == MEP_OK) rc = block_sizes(&a, count, &bytes, &total);
  if (rc == MEP_OK) rc = need(&a, send, bytes, "send");
  if (rc == MEP_OK && a.me == root) rc = need(&a, recv, total, "recv");
  if (rc) return rc;
  spec_init(&s, MEP__COLL_GATHER, dtype, MEP_SUM, count, root, send, recv);
  if (a.me == root) private_input(&s, bytes, total);
  return mep__coll_start(comm, &s, hooks, req);
}

static int scatter(mep_comm_t *comm, const void *send, void *recv,
                   size_t count, mep_dtype_t dtype, int root,
                   const mep__req_hooks_t *hooks, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  size_t bytes = 0, total = 0;
  int rc = check(&a, comm, "mep_scatter", dtype, root, 1);
  if (rc == MEP_OK) rc = block_sizes(&a, count, &bytes, &total);
  if (rc == MEP_OK && a.me == root) rc = need(&a, send, total, "send");
  if (rc == MEP_OK) rc = need(&a, recv, bytes, "recv");
  if (rc) return rc;
  spec_init(&s, MEP__COLL_SCATTER, dtype, MEP_SUM, count, root, send, recv);
  if (a.me == root) private_input(&s, total, bytes);
  return mep__coll_start(comm, &s, hooks, req);
}

int mep__coll_submit(mep_comm_t *comm, const mep__coll_call_t *c,
                     const mep__req_hooks_t *hooks, mep_req_t **req) {
  switch (c->kind) {
  case MEP__COLL_ALLREDUCE:
    return allreduce(comm, c->send, c->recv, c->count, c->dtype, c->op,
                     hooks, req);
  case MEP__COLL_REDUCE:
    return reduce(comm, c->send, c->recv, c->count, c->dtype, c->op,
                  c->root, hooks, req);
  case MEP__COLL_REDUCE_SCATTER:
    return reduce_scatter(comm, c->send, c->recv, c->count, c->dtype, c->op,
                          hooks, req);
  case MEP__COLL_BROADCAST:
    return broadcast(comm, c->recv, c->count, c->dtype, c->root, hooks, req);
  case MEP__COLL_ALLGATHER:
    return allgather(comm, c->send, c->recv, c->count, c->dtype, hooks, req);
  case MEP__COLL_ALLTOALL:
    return alltoall(comm, c->send, c->recv, c->count, c->dtype, hooks, req);
  case MEP__COLL_GATHER:
    return gather(comm, c->send, c->recv, c->count, c->dtype, c->root, hooks,
                  req);
  case MEP__COLL_SCATTER:
    return scatter(comm, c->send, c->recv, c->count, c->dtype, c->root,
                   hooks, req);
  default:
    return mep__err(MEP_ERR_INVALID, "collective %d has no entry point of "
                    "one count", c->kind);
  }
}

/* ------------------------------------------------------- entry points */

int mep_allreduce(mep_comm_t *comm, const void *send, void *recv,
                  size_t count, mep_dtype_t dtype, mep_op_t op,
                  mep_req_t **req) {
  return allreduce(comm, send, recv, count, dtype, op, NULL, req);
}

int mep_reduce(mep_comm_t *comm, const void *send, void *recv, size_t count,
               mep_dtype_t dtype, mep_op_t op, int root, mep_req_t **req) {
  return reduce(comm, send, recv, count, dtype, op, root, NULL, req);
}

int mep_reduce_scatter(mep_comm_t *comm, const void *send, void *recv,
                       size_t count, mep_dtype_t dtype, mep_op_t op,
                       mep_req_t **req) {
  return reduce_scatter(comm, send, recv, count, dtype, op, NULL, req);
}

int mep_broadcast(mep_comm_t *comm, void *buf, size_t count,
                  mep_dtype_t dtype, int root, mep_req_t **req) {
  return broadcast(comm, buf, count, dtype, root, NULL, req);
}

int mep_allgather(mep_comm_t *comm, const void *send, void *recv,
                  size_t count, mep_dtype_t dtype, mep_req_t **req) {
  return allgather(comm, send, recv, count, dtype, NULL, req);
}

int mep_alltoall(mep_comm_t *comm, const void *send, void *recv, size_t count,
                 mep_dtype_t dtype, mep_req_t **req) {
  return alltoall(comm, send, recv, count, dtype, NULL, req);
}

int mep_gather(mep_comm_t *comm, const void *send, void *recv, size_t count,
               mep_dtype_t dtype, int root, mep_req_t **req) {
  return gather(comm, send, recv, count, dtype, root, NULL, req);
}

int mep_scatter(mep_comm_t *comm, const void *send, void *recv, size_t count,
                mep_dtype_t dtype, int root, mep_req_t **req) {
  return scatter(comm, send, recv, count, dtype, root, NULL, req);
}

int mep_alltoallv(mep_comm_t *comm, const void *send, const size_t *scounts,
                  const size_t *sdispls, void *recv, const size_t *rcounts,
                  const size_t *rdispls, mep_dtype_t dtype, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  size_t sext = 0, rext = 0;
  int rc = check(&a, comm, "mep_alltoallv", dtype, -1, 0);
  if (rc == MEP_OK && (!scounts || !sdispls || !rcounts || !rdispls))
    rc = mep__err(MEP_ERR_INVALID, "mep_alltoallv: NULL counts or "
                  "displacements");
  if (rc == MEP_OK) rc = extent(&a, scounts, sdispls, "send", &sext);
  if (rc == MEP_OK) rc = extent(&a, rcounts, rdispls, "recv", &rext);
  if (rc == MEP_OK) rc = need(&a, send, sext, "send");
  if (rc == MEP_OK) rc = need(&a, recv, rext, "recv");
  if (rc == MEP_OK && scounts[a.me] != rcounts[a.me])
    rc = mep__err(MEP_ERR_INVALID, "mep_alltoallv: rank %d sends itself %zu "
                  "elements but expects %zu", a.me, scounts[a.me],
                  rcounts[a.me]);
  if (rc) return rc;
  spec_init(&s, MEP__COLL_ALLTOALLV, dtype, MEP_SUM, 0, -1, send, recv);
  /* The engine may build the plan again later: it keeps its own copy. */
  size_t n = (size_t)a.n;
  s.v = malloc(4 * n * sizeof *s.v);
  if (!s.v) return mep__err(MEP_ERR_NOMEM, "out of memory");
  memcpy(s.v, scounts, n * sizeof *s.v);
  memcpy(s.v + n, sdispls, n * sizeof *s.v);
  memcpy(s.v + 2 * n, rcounts, n * sizeof *s.v);
  memcpy(s.v + 3 * n, rdispls, n * sizeof *s.v);
  private_input(&s, sext, rext);
  return mep__coll_start(comm, &s, NULL, req);
}

int mep_barrier(mep_comm_t *comm, mep_req_t **req) {
  args_t a;
  mep__coll_spec_t s;
  int rc = check(&a, comm, "mep_barrier", MEP_UINT8, -1, 0);
  if (rc) return rc;
  spec_init(&s, MEP__COLL_BARRIER, MEP_UINT8, MEP_SUM, 0, -1, NULL, NULL);
  return mep__coll_start(comm, &s, NULL, req);
}

int mep__coll_barrier_tagged(mep_comm_t *comm, int kind, uint64_t tag) {
  args_t a;
  mep__coll_spec_t s;
  int rc = check(&a, comm, "membership barrier", MEP_UINT8, -1, 0);
  if (rc) return rc;
  spec_init(&s, kind, MEP_UINT8, MEP_SUM, (size_t)tag, -1, NULL, NULL);
  return mep__coll_start(comm, &s, NULL, NULL);
}
