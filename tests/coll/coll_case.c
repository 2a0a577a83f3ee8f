/* coll_case.c - one collective's buffers, call and check. Rank r's input
 * element j is ref_elem(dt, seed, r, j), j counted from the start of its
 * send buffer, so the expected output of any rank is a function of the
 * case alone. */
#include "coll_case.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"
#include "tree.h"

static const char *const kind_names[K_KINDS] = {
    "broadcast",      "reduce",   "allreduce", "allgather", "reduce_scatter",
    "alltoall",       "alltoallv", "gather",   "scatter"};

const char *kind_name(coll_kind_t kind) {
  return (unsigned)kind < K_KINDS ? kind_names[kind] : "?";
}

int kind_has_root(coll_kind_t k) {
  return k == K_BROADCAST || k == K_REDUCE || k == K_GATHER || k == K_SCATTER;
}

int kind_reduces(coll_kind_t k) {
  return k == K_REDUCE || k == K_ALLREDUCE || k == K_REDUCE_SCATTER;
}

/* In place, the send buffer is (part of) the receive buffer. */
static int in_place(const coll_case_t *c) {
  return (c->flags & CASE_INPLACE) &&
         (c->kind == K_ALLREDUCE || c->kind == K_ALLGATHER ||
          c->kind == K_ALLTOALL);
}

void case_init(coll_ctx_t *ctx, coll_case_t *c, coll_kind_t kind,
               mep_dtype_t dt, mep_op_t op, size_t count, int root,
               int flags) {
  memset(c, 0, sizeof *c);
  c->kind = kind;
  c->dt = dt;
  c->op = op;
  c->count = count;
  c->root = root;
  c->flags = flags;
  uint64_t s = ctx->seed + 0x5157ull * ++ctx->cases;
  c->seed = splitmix64(&s);
  int len = snprintf(c->desc, sizeof c->desc, "case %u: %s %s", ctx->cases,
                     kind_name(kind), ref_dtype_name(dt));
  if (kind_reduces(kind))
    len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, " %s",
                    ref_op_name(op));
  len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, " count %zu",
                  count);
  if (kind_has_root(kind))
    len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, " root %d",
                    root);
  snprintf(c->desc + len, sizeof c->desc - (size_t)len, "%s%s%s",
           in_place(c) ? " in place" : "",
           (flags & CASE_UNALIGNED) ? " unaligned" : "",
           (flags & CASE_NULL) && kind == K_REDUCE ? " NULL off the root"
                                                   : "");
}

/* ------------------------------------------------------------- alltoallv */

/* Elements rank src sends rank dst: none for about a quarter of the pairs,
 * else between count/2 and 3*count/2. */
static size_t v_count(const coll_case_t *c, int src, int dst) {
  uint64_t s = c->seed ^ ((uint64_t)(unsigned)src << 20) ^
               ((uint64_t)(unsigned)dst << 42) ^ 0xa11ull;
  uint64_t h = splitmix64(&s);
  if (c->count == 0 || h % 4 == 0) return 0;
  return c->count / 2 + (size_t)((h >> 8) % (c->count + 1));
}

/* Rank's send layout: blocks in decreasing peer order with gaps between
 * them, so displacements are neither sorted nor packed. Returns the
 * elements the buffer spans. */
static size_t v_send_layout(const coll_case_t *c, int n, int rank,
                            size_t *counts, size_t *displs) {
  size_t at = 0;
  for (int p = n - 1; p >= 0; p--) {
    at += (size_t)(p % 3);
    counts[p] = v_count(c, rank, p);
    displs[p] = at;
    at += counts[p];
  }
  return at;
}

/* Rank's receive layout: blocks in rank order, a gap of one element before
 * every other block and after the last, where nothing may be written. */
static size_t v_recv_layout(const coll_case_t *c, int n, int rank,
                            size_t *counts, size_t *displs) {
  size_t at = 0;
  for (int q = 0; q < n; q++) {
    at += (size_t)((q + 1) % 2);
    counts[q] = v_count(c, q, rank);
    displs[q] = at;
    at += counts[q];
  }
  return at + 1;
}

/* ---------------------------------------------------------------- buffers */

/* Element counts of the send and receive buffers (0: none). */
static void buffer_counts(const coll_ctx_t *ctx, coll_case_t *c,
                          size_t *scount, size_t *rcount) {
  size_t cnt = c->count, n = (size_t)ctx->n;
  int root = ctx->me == c->root;
  *scount = *rcount = 0;
  switch (c->kind) {
  case K_BROADCAST: *rcount = cnt; break;
  case K_REDUCE:
    *scount = cnt;
    if (root || !(c->flags & CASE_NULL)) *rcount = cnt;
    break;
  case K_ALLREDUCE: *scount = *rcount = cnt; break;
  case K_ALLGATHER: *scount = cnt, *rcount = n * cnt; break;
  case K_REDUCE_SCATTER: *scount = n * cnt, *rcount = cnt; break;
  case K_ALLTOALL: *scount = *rcount = n * cnt; break;
  case K_ALLTOALLV:
    c->v = xmalloc(4 * n * sizeof *c->v);
    *scount = v_send_layout(c, ctx->n, ctx->me, c->v, c->v + n);
    *rcount = v_recv_layout(c, ctx->n, ctx->me, c->v + 2 * n, c->v + 3 * n);
    break;
  case K_GATHER: *scount = cnt, *rcount = n * cnt; break;
  case K_SCATTER: *scount = n * cnt, *rcount = cnt; break;
  default: CHECK(0, "unknown kind %d", (int)c->kind);
  }
}

void case_prepare(const coll_ctx_t *ctx, coll_case_t *c) {
  size_t sz = ref_size(c->dt), scount, rcount;
  size_t off = (c->flags & CASE_UNALIGNED) ? 3 : 0;
  int me = ctx->me;
  buffer_counts(ctx, c, &scount, &rcount);
  int has_recv =
      !(c->kind == K_REDUCE && me != c->root && (c->flags & CASE_NULL));
  if (has_recv) tbuf_alloc(&c->recv, rcount * sz, off, c->seed ^ 0xc0ffeeull);
  if (in_place(c)) {
    size_t first = c->kind == K_ALLGATHER ? (size_t)me * c->count : 0;
    ref_fill(c->dt, c->seed, me, 0, scount,
             tbuf_data(&c->recv) + first * sz);
  } else if (c->kind != K_BROADCAST) {
    tbuf_alloc(&c->send, scount * sz, off, c->seed ^ 0xbeefull);
    if (c->kind != K_SCATTER || me == c->root)
      ref_fill(c->dt, c->seed, me, 0, scount, tbuf_data(&c->send));
    c->send_copy = xmalloc(c->send.total);
    memcpy(c->send_copy, c->send.base, c->send.total);
  }
  if (c->kind == K_BROADCAST && me == c->root)
    ref_fill(c->dt, c->seed, me, 0, c->count, tbuf_data(&c->recv));
}

int case_issue(coll_ctx_t *ctx, coll_case_t *c, mep_req_t **req) {
  mep_comm_t *comm = ctx->comm;
  void *r = c->recv.base ? tbuf_data(&c->recv) : NULL;
  const void *s = c->send.base ? tbuf_data(&c->send) : NULL;
  size_t cnt = c->count, n = (size_t)ctx->n;
  if (in_place(c))
    s = c->kind == K_ALLGATHER
            ? (uint8_t *)r + (size_t)ctx->me * cnt * ref_size(c->dt)
            : r;
  switch (c->kind) {
  case K_BROADCAST:
    return mep_broadcast(comm, r, cnt, c->dt, c->root, req);
  case K_REDUCE:
    return mep_reduce(comm, s, r, cnt, c->dt, c->op, c->root, req);
  case K_ALLREDUCE:
    return mep_allreduce(comm, s, r, cnt, c->dt, c->op, req);
  case K_ALLGATHER: return mep_allgather(comm, s, r, cnt, c->dt, req);
  case K_REDUCE_SCATTER:
    return mep_reduce_scatter(comm, s, r, cnt, c->dt, c->op, req);
  case K_ALLTOALL: return mep_alltoall(comm, s, r, cnt, c->dt, req);
  case K_ALLTOALLV:
    return mep_alltoallv(comm, s, c->v, c->v + n, r, c->v + 2 * n,
                         c->v + 3 * n, c->dt, req);
  case K_GATHER: return mep_gather(comm, s, r, cnt, c->dt, c->root, req);
  case K_SCATTER: return mep_scatter(comm, s, r, cnt, c->dt, c->root, req);
  default: return MEP_ERR_INVALID;
  }
}

/* ----------------------------------------------------------------- checks */

/* Checks the `count` reduced elements at got, element i being element
 * first + i of every rank's input. */
static void check_reduced(const coll_ctx_t *ctx, const coll_case_t *c,
                          const uint8_t *got, size_t first, size_t count) {
  size_t sz = ref_size(c->dt), bad = 0, first_bad = 0;
  char why[256] = "", tmp[256];
  /* the logarithmic plan combines in another order */
  ref_set_tree(c->kind == K_ALLREDUCE &&
               tree_applies(c->count * ref_size(c->dt), ctx->n));
  for (size_t i = 0; i < count; i++) {
    if (ref_check_reduced(c->dt, c->op, ctx->n, c->seed, first + i,
                          got + i * sz, tmp, sizeof tmp) == 0)
      continue;
    if (bad++ == 0) {
      first_bad = i;
      memcpy(why, tmp, sizeof why);
    }
  }
  CHECK(bad == 0, "rank %d: %s: %zu of %zu elements wrong; element %zu: %s",
        ctx->me, c->desc, bad, count, first_bad, why);
}

/* Writes into exp (the receive buffer's data as it should be, canary
 * elsewhere) what the case delivers to this rank. Reductions are checked
 * element by element here instead and their output copied over. */
static void expected_output(const coll_ctx_t *ctx, const coll_case_t *c,
                            uint8_t *exp) {
  size_t sz = ref_size(c->dt), cnt = c->count, n = (size_t)ctx->n;
  int me = ctx->me, root = me == c->root;
  const uint8_t *got = tbuf_data(&c->recv);
  switch (c->kind) {
  case K_BROADCAST: ref_fill(c->dt, c->seed, c->root, 0, cnt, exp); break;
  case K_REDUCE:
    if (!root) break;
    /* fall through */
  case K_ALLREDUCE:
    check_reduced(ctx, c, got, 0, cnt);
    memcpy(exp, got, cnt * sz);
    break;
  case K_REDUCE_SCATTER:
    check_reduced(ctx, c, got, (size_t)me * cnt, cnt);
    memcpy(exp, got, cnt * sz);
    break;
  case K_GATHER:
    if (!root) break;
    /* fall through */
  case K_ALLGATHER:
    for (int q = 0; q < ctx->n; q++)
      ref_fill(c->dt, c->seed, q, 0, cnt, exp + (size_t)q * cnt * sz);
    break;
  case K_ALLTOALL:
    for (int q = 0; q < ctx->n; q++)
      ref_fill(c->dt, c->seed, q, (size_t)me * cnt, cnt,
               exp + (size_t)q * cnt * sz);
    break;
  case K_ALLTOALLV: {
    size_t *theirs = xmalloc(2 * n * sizeof *theirs);
    const size_t *rcounts = c->v + 2 * n, *rdispls = c->v + 3 * n;
    for (int q = 0; q < ctx->n; q++) {
      v_send_layout(c, ctx->n, q, theirs, theirs + n);
      CHECK(theirs[me] == rcounts[q], "alltoallv layout disagrees");
      ref_fill(c->dt, c->seed, q, theirs[n + (size_t)me], rcounts[q],
               exp + rdispls[q] * sz);
    }
    free(theirs);
    break;
  }
  case K_SCATTER:
    ref_fill(c->dt, c->seed, c->root, (size_t)me * cnt, cnt, exp);
    break;
  default: break;
  }
}

static void check_diff(const coll_ctx_t *ctx, const coll_case_t *c,
                       const char *what, const tbuf_t *b,
                       const uint8_t *exp) {
  long long at = tbuf_diff(b, exp);
  if (at == TBUF_SAME) return;
  size_t sz = ref_size(c->dt);
  if (at < 0)
    CHECK(0, "rank %d: %s: %s: canary byte %lld before the data was "
          "overwritten", ctx->me, c->desc, what, -at);
  if ((size_t)at >= b->len)
    CHECK(0, "rank %d: %s: %s: byte %lld after the %zu data bytes was "
          "overwritten", ctx->me, c->desc, what, at - (long long)b->len,
          b->len);
  CHECK(0, "rank %d: %s: %s: byte %lld (element %lld) is 0x%02x, want 0x%02x",
        ctx->me, c->desc, what, at, at / (long long)sz,
        b->base[b->off + (size_t)at], exp[b->off + (size_t)at]);
}

void case_check(coll_ctx_t *ctx, coll_case_t *c) {
  if (c->send_copy) {
    tbuf_t copy = c->send;
    copy.base = c->send_copy;
    check_diff(ctx, c, "send buffer changed", &c->send, copy.base);
  }
  if (!c->recv.base) return;
  uint8_t *exp = tbuf_pristine(&c->recv);
  expected_output(ctx, c, exp + c->recv.off);
  check_diff(ctx, c, "output", &c->recv, exp);
  free(exp);
  if (c->kind == K_ALLREDUCE || c->kind == K_BROADCAST ||
      c->kind == K_ALLGATHER)
    hashes_add(ctx, c->desc, tbuf_data(&c->recv), c->recv.len);
}

void case_release(coll_case_t *c) {
  tbuf_free(&c->send);
  tbuf_free(&c->recv);
  free(c->send_copy);
  free(c->v);
  c->send_copy = NULL;
  c->v = NULL;
}

void case_run(coll_ctx_t *ctx, coll_kind_t kind, mep_dtype_t dt, mep_op_t op,
              size_t count, int root, int flags) {
  coll_case_t c;
  case_init(ctx, &c, kind, dt, op, count, root, flags);
  case_prepare(ctx, &c);
  int rc = case_issue(ctx, &c, NULL);
  CHECK(rc == 0, "rank %d: %s: returned %d (%s): %s", ctx->me, c.desc, rc,
        mep_strerror(rc), mep_last_error());
  case_check(ctx, &c);
  case_release(&c);
}
