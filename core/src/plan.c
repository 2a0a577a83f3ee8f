/* plan.c - collectives as plans (plan.h): which messages each rank sends
 * and receives in each step, and where they land; and the plans' memory.
 * The engine (coll.c) calls it when a collective starts and again over
 * the survivors; it calls nothing but the leaves. */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

typedef mep__plan_args_t args_t;

static int steps_alloc(mep__plan_t *p, int nsteps, int size);

int mep__plan_init(mep__plan_t *p, const args_t *a,
                   const mep__coll_spec_t *s, const char *algo, int nsteps) {
  memset(p, 0, sizeof *p);
  p->kind = s->kind;
  p->dtype = s->dtype;
  p->op = s->op;
  p->count = s->kind == MEP__COLL_ALLTOALLV ? 0 : s->count;
  p->root = s->root;
  p->algo = algo;
  return steps_alloc(p, nsteps, a->n);
}

/* First element of block b when `count` is split into n blocks (without
 * overflowing count * b). */
static size_t block_start(size_t count, int b, int n) {
  size_t q = count / (size_t)n, r = count % (size_t)n;
  return q * (size_t)b + r * (size_t)b / (size_t)n;
}

/* Step: every rank's `send` to every other rank, landing at
 * recv + p * bytes (the all-gather pattern). */
static void all_to_all_blocks(mep__step_t *st, const args_t *a,
                              const uint8_t *send, size_t sstride,
                              uint8_t *recv, size_t bytes) {
  for (int p = 0; p < a->n; p++) {
    st->send_to[p] = st->recv_from[p] = 1;
    st->sptr[p] = send + (size_t)p * sstride;
    st->sbytes[p] = st->rbytes[p] = bytes;
    st->rptr[p] = recv + (size_t)p * bytes;
  }
}

/* In rooted collectives data flows one way. Zero-length messages between
 * every other pair let every rank check that all agree on the call: a rank
 * naming another root gets MEP_ERR_MISMATCH instead of a silent success or
 * a timeout. The price is that a rooted collective ends on a rank only once
 * every rank joined it. */
static void complete_pairs(mep__step_t *st, const args_t *a) {
  for (int q = 0; q < a->n; q++) {
    if (q == a->me) continue;
    if (!st->send_to[q]) {
      st->send_to[q] = 1;
      st->sptr[q] = NULL;
      st->sbytes[q] = 0;
    }
    if (!(st->reduce && st->reduce_here) && !st->recv_from[q]) {
      st->recv_from[q] = 1;
      st->rptr[q] = NULL;
      st->rbytes[q] = 0;
    }
  }
}

/* ------------------------------------------------------- reductions */

/* Contributions of every rank reduced at `root` (all of count), or with
 * root -1 block p of the count at rank p (the reduce-scatter pattern). */
static void reduce_step(mep__step_t *st, const args_t *a, const uint8_t *send,
                        uint8_t *recv, size_t count, int root) {
  for (int p = 0; p < a->n; p++) {
    if (p == a->me || (root >= 0 && p != root)) continue;
    size_t b0 = root >= 0 ? 0 : block_start(count, p, a->n);
    size_t b1 = root >= 0 ? count : block_start(count, p + 1, a->n);
    st->send_to[p] = 1;
    st->sptr[p] = send + b0 * a->ds;
    st->sbytes[p] = (b1 - b0) * a->ds;
  }
  st->reduce = 1;
  if (root >= 0 && root != a->me) return;
  size_t b0 = root >= 0 ? 0 : block_start(count, a->me, a->n);
  size_t b1 = root >= 0 ? count : block_start(count, a->me + 1, a->n);
  st->reduce_here = 1;
  for (int q = 0; q < a->n; q++) st->recv_from[q] = q != a->me;
  st->rself = send + b0 * a->ds;
  st->rout = recv + b0 * a->ds;
  st->rlen = (b1 - b0) * a->ds;
}

/* Whether the survivors' set is the whole group: block-partitioned
 * (two-shot) algorithms run only then; a degraded group runs one-shot. */
static int whole(const args_t *a) { return a->nact == a->n; }

static int build_allreduce(const args_t *a, const mep__coll_spec_t *s,
                           mep__plan_t *p) {
  size_t count = s->count, bytes = count * a->ds;
  const uint8_t *send = s->send;
  uint8_t *recv = s->recv;
  /* Also on 2 ranks: both move the same bytes, but two-shot reduces half
   * the data on each rank (measured faster from 1 MiB, docs/perf.md). */
  int two = bytes > a->opts->two_shot && a->n >= 2 &&
            count >= (size_t)a->n && whole(a);
  int rc = mep__plan_init(p, a, s,
                          two ? MEP__ALGO_TWO_SHOT : MEP__ALGO_ONE_SHOT,
                          two ? 2 : 1);
  if (rc) return rc;
  if (!two) {
    mep__step_t *st = &p->steps[0];
    st->reduce = st->reduce_here = 1;
    for (int q = 0; q < a->n; q++) {
      st->send_to[q] = st->recv_from[q] = q != a->me;
      st->sptr[q] = send;
      st->sbytes[q] = bytes;
    }
    st->rself = send;
    st->rout = recv;
    st->rlen = bytes;
    return MEP_OK;
  }
  reduce_step(&p->steps[0], a, send, recv, count, -1);
  /* then everyone's reduced block to everyone */
  mep__step_t *st = &p->steps[1];
  size_t m0 = block_start(count, a->me, a->n);
  for (int q = 0; q < a->n; q++) {
    size_t q0 = block_start(count, q, a->n), q1 = block_start(count, q + 1, a->n);
    st->send_to[q] = st->recv_from[q] = q != a->me;
    st->sptr[q] = recv + m0 * a->ds;
    st->sbytes[q] = (block_start(count, a->me + 1, a->n) - m0) * a->ds;
    st->rptr[q] = recv + q0 * a->ds;
    st->rbytes[q] = (q1 - q0) * a->ds;
  }
  return MEP_OK;
}

static int build_reduce(const args_t *a, const mep__coll_spec_t *s,
                        mep__plan_t *p) {
  int rc = mep__plan_init(p, a, s, "direct", 1);
  if (rc) return rc;
  reduce_step(&p->steps[0], a, s->send, s->recv, s->count, s->root);
  complete_pairs(&p->steps[0], a);
  return MEP_OK;
}

static int build_reduce_scatter(const args_t *a, const mep__coll_spec_t *s,
                                mep__plan_t *p) {
  int rc = mep__plan_init(p, a, s, "direct", 1);
  if (rc) return rc;
  /* Block q of send is count elements at q * count: reduce it into q's
   * recv. */
  size_t bytes = s->count * a->ds;
  const uint8_t *send = s->send;
  mep__step_t *st = &p->steps[0];
  st->reduce = st->reduce_here = 1;
  for (int q = 0; q < a->n; q++) {
    st->send_to[q] = st->recv_from[q] = q != a->me;
    st->sptr[q] = send + (size_t)q * bytes;
    st->sbytes[q] = bytes;
  }
  st->rself = send + (size_t)a->me * bytes;
  st->rout = s->recv;
  st->rlen = bytes;
  return MEP_OK;
}

/* ------------------------------------------------------------ copies */

static int build_broadcast(const args_t *a, const mep__coll_spec_t *s,
                           mep__plan_t *p) {
  size_t count = s->count, bytes = count * a->ds;
  int root = s->root, n = a->n, me = a->me;
  int two = bytes > a->opts->two_shot && n > 2 &&
            count >= (size_t)n && whole(a);
  int rc = mep__plan_init(p, a, s,
                          two ? MEP__ALGO_TWO_SHOT : MEP__ALGO_ONE_SHOT,
                          two ? 2 : 1);
  if (rc) return rc;
  uint8_t *b = s->recv;
  mep__step_t *s0 = &p->steps[0], *s1 = &p->steps[1];
  for (int q = 0; q < n; q++) {
    size_t q0 = two ? block_start(count, q, n) * a->ds : 0;
    size_t ql = two ? block_start(count, q + 1, n) * a->ds - q0 : bytes;
    /* one-shot: root sends all of it; two-shot: root scatters block q */
    if (me == root && q != root) {
      s0->send_to[q] = 1;
      s0->sptr[q] = b + q0;
      s0->sbytes[q] = ql;
    }
    if (me != root && q == root) {
      size_t m0 = two ? block_start(count, me, n) * a->ds : 0;
      s0->recv_from[q] = 1;
      s0->rptr[q] = b + m0;
      s0->rbytes[q] = two ? block_start(count, me + 1, n) * a->ds - m0
                          : bytes;
    }
    if (!two) continue;
    /* then every rank sends its block to every rank but the root, which
     * has it all */
    size_t m0 = block_start(count, me, n) * a->ds;
    if (q != me && q != root) {
      s1->send_to[q] = 1;
      s1->sptr[q] = b + m0;
      s1->sbytes[q] = block_start(count, me + 1, n) * a->ds - m0;
    }
    if (me != root && q != me) {
      s1->recv_from[q] = 1;
      s1->rptr[q] = b + q0;
      s1->rbytes[q] = ql;
    }
  }
  complete_pairs(s0, a);
  return MEP_OK;
}

static int build_allgather(const args_t *a, const mep__coll_spec_t *s,
                           mep__plan_t *p) {
  int rc = mep__plan_init(p, a, s, "direct", 1);
  if (rc == MEP_OK)
    all_to_all_blocks(&p->steps[0], a, s->send, 0, s->recv,
                      s->count * a->ds);
  return rc;
}

static int build_alltoall(const args_t *a, const mep__coll_spec_t *s,
                          mep__plan_t *p) {
  int rc = mep__plan_init(p, a, s, "direct", 1);
  size_t bytes = s->count * a->ds;
  if (rc == MEP_OK)
    all_to_all_blocks(&p->steps[0], a, s->send, bytes, s->recv, bytes);
  return rc;
}

static int build_alltoallv(const args_t *a, const mep__coll_spec_t *s,
                           mep__plan_t *p) {
  /* The digest cannot hold every count; per-pair lengths are checked by
   * the receiver instead. */
  int rc = mep__plan_init(p, a, s, "direct", 1);
  if (rc) return rc;
  size_t n = (size_t)a->n;
  const size_t *sc = s->v, *sd = s->v + n, *rcn = s->v + 2 * n,
               *rd = s->v + 3 * n;
  mep__step_t *st = &p->steps[0];
  for (int q = 0; q < a->n; q++) {
    st->send_to[q] = st->recv_from[q] = 1;
    st->sptr[q] = (const uint8_t *)s->send + sd[q] * a->ds;
    st->sbytes[q] = sc[q] * a->ds;
    st->rptr[q] = (uint8_t *)s->recv + rd[q] * a->ds;
    st->rbytes[q] = rcn[q] * a->ds;
  }
  return MEP_OK;
}

static int build_gather(const args_t *a, const mep__coll_spec_t *s,
                        mep__plan_t *p) {
  int rc = mep__plan_init(p, a, s, "direct", 1);
  if (rc) return rc;
  size_t bytes = s->count * a->ds;
  mep__step_t *st = &p->steps[0];
  if (a->me != s->root) {
    st->send_to[s->root] = 1;
    st->sptr[s->root] = s->send;
    st->sbytes[s->root] = bytes;
  } else {
    all_to_all_blocks(st, a, s->send, 0, s->recv, bytes);
    for (int q = 0; q < a->n; q++) st->send_to[q] = q == s->root;
  }
  complete_pairs(st, a);
  return MEP_OK;
}

static int build_scatter(const args_t *a, const mep__coll_spec_t *s,
                         mep__plan_t *p) {
  int rc = mep__plan_init(p, a, s, "direct", 1);
  if (rc) return rc;
  size_t bytes = s->count * a->ds;
  mep__step_t *st = &p->steps[0];
  if (a->me == s->root) {
    for (int q = 0; q < a->n; q++) {
      st->send_to[q] = 1;
      st->sptr[q] = (const uint8_t *)s->send + (size_t)q * bytes;
      st->sbytes[q] = bytes;
    }
  }
  st->recv_from[s->root] = 1;
  st->rptr[s->root] = s->recv;
  st->rbytes[s->root] = bytes;
  complete_pairs(st, a);
  return MEP_OK;
}

/* Also the membership barrier of mep_comm_recover_ranks, whose kind and
 * count (a digest of the admitted ranks) make ranks passing different
 * lists disagree. */
static int build_barrier(const args_t *a, const mep__coll_spec_t *s,
                         mep__plan_t *p) {
  int rc = mep__plan_init(p, a, s, "direct", 1);
  for (int q = 0; rc == MEP_OK && q < a->n; q++)
    p->steps[0].send_to[q] = p->steps[0].recv_from[q] = q != a->me;
  return rc;
}

/* ------------------------------------------------------ building plans */

typedef int (*build_fn)(const args_t *, const mep__coll_spec_t *,
                        mep__plan_t *);

static build_fn builder(int kind) {
  switch (kind) {
  case MEP__COLL_BROADCAST: return build_broadcast;
  case MEP__COLL_REDUCE: return build_reduce;
  case MEP__COLL_ALLREDUCE: return build_allreduce;
  case MEP__COLL_ALLGATHER: return build_allgather;
  case MEP__COLL_REDUCE_SCATTER: return build_reduce_scatter;
  case MEP__COLL_ALLTOALL: return build_alltoall;
  case MEP__COLL_ALLTOALLV: return build_alltoallv;
  case MEP__COLL_GATHER: return build_gather;
  case MEP__COLL_SCATTER: return build_scatter;
  default: return build_barrier; /* and the membership barriers */
  }
}

/* Appends to out[k..] the ranks q in [from, to) with f[q] set; returns the
 * new length. Eight flags at a time where they are all clear: a step of a
 * logarithmic plan has one or two partners among thousands of ranks. */
static int append_set(const uint8_t *f, int from, int to, int *out, int k) {
  int q = from;
  while (q < to) {
    uint64_t w;
    if ((q & 7) == 0 && to - q >= 8) {
      memcpy(&w, f + q, 8);
      if (!w) {
        q += 8;
        continue;
      }
    }
    if (f[q]) out[k++] = q;
    q++;
  }
  return k;
}

/* The steps' lists of partners (mep__step_t: sends, recvs). */
static void list_partners(mep__plan_t *p, int me, int n) {
  for (int i = 0; i < p->nsteps; i++) {
    mep__step_t *st = &p->steps[i];
    int k = append_set(st->send_to, me + 1, n, st->sends, 0);
    st->nsends = append_set(st->send_to, 0, me, st->sends, k);
    k = append_set(st->recv_from, 0, me, st->recvs, 0);
    if (st->reduce && st->reduce_here) st->recvs[k++] = me;
    st->nrecvs = append_set(st->recv_from, me + 1, n, st->recvs, k);
  }
}

/* Pairs with ranks outside the active set exchange nothing. */
static void restrict_to(mep__plan_t *p, const uint8_t *act, int n) {
  for (int i = 0; i < p->nsteps; i++)
    for (int q = 0; q < n; q++)
      if (!act[q]) p->steps[i].send_to[q] = p->steps[i].recv_from[q] = 0;
}

int mep__plan_build(mep_comm_t *comm, const mep__coll_spec_t *s,
                    const uint8_t *act, const mep__plan_opts_t *o,
                    mep__plan_t *p) {
  args_t a = {.me = comm->rank, .n = comm->size,
              .ds = mep_dtype_size(s->dtype), .act = act, .opts = o};
  if (!a.ds)
    return mep__err(MEP_ERR_INVALID, "collective: unknown dtype %d",
                    (int)s->dtype);
  for (int q = 0; q < a.n; q++) a.nact += act[q] != 0;
  if (s->root >= 0 && !act[s->root])
    return mep__err(MEP_ERR_PEER_FAILED, "its root, rank %d, left the "
                    "group", s->root);
  int rc = mep__plan_log(&a, s, p);
  if (rc == 0) rc = builder(s->kind)(&a, s, p);
  if (rc > 0) rc = MEP_OK;
  if (rc == MEP_OK && a.nact < a.n) restrict_to(p, act, a.n);
  if (rc == MEP_OK) list_partners(p, a.me, a.n);
  return rc;
}

/* ---------------------------------------------------------------- memory */

/* Every step's per-rank arrays and partner lists in one zeroed block
 * (p->arena): a plan is built for every call, and at a thousand ranks six
 * allocations a step cost a logarithmic plan more than its messages
 * (docs/scaling.md, "Building and walking the plan"). */
static int steps_alloc(mep__plan_t *p, int nsteps, int size) {
  size_t n = (size_t)size;
  size_t words = 2 * n * sizeof(void *) + 2 * n * sizeof(size_t);
  size_t ints = 2 * n * sizeof(int);
  size_t per = words + ints + ((2 * n + 7) & ~(size_t)7);
  size_t k = nsteps > 0 ? (size_t)nsteps : 1; /* calloc(0) may be NULL */
  p->steps = calloc(k, sizeof *p->steps);
  p->arena = calloc(k, per);
  if (!p->steps || !p->arena) {
    mep__plan_free(p);
    return mep__err(MEP_ERR_NOMEM, "out of memory for a plan of %d steps "
                    "over %d ranks", nsteps, size);
  }
  p->nsteps = p->ndata = nsteps;
  for (int i = 0; i < nsteps; i++) {
    mep__step_t *st = &p->steps[i];
    uint8_t *b = p->arena + (size_t)i * per;
    st->sptr = (const uint8_t **)(void *)b;
    st->rptr = (uint8_t **)(void *)(b + n * sizeof(void *));
    st->sbytes = (size_t *)(void *)(b + 2 * n * sizeof(void *));
    st->rbytes = (size_t *)(void *)(b + 2 * n * sizeof(void *) +
                                    n * sizeof(size_t));
    st->sends = (int *)(void *)(b + words);
    st->recvs = (int *)(void *)(b + words + n * sizeof(int));
    st->send_to = b + words + ints;
    st->recv_from = b + words + ints + n;
  }
  return MEP_OK;
}

void mep__plan_free(mep__plan_t *plan) {
  free(plan->steps);
  free(plan->arena);
  free(plan->scratch);
  memset(plan, 0, sizeof *plan);
}

void mep__coll_spec_free(mep__coll_spec_t *s) {
  free(s->v);
  memset(s, 0, sizeof *s);
}
