/* plan_log.c - logarithmic plans (plan.h): small all-reduces by recursive
 * doubling and barriers by dissemination, in ceil(log2 N) rounds of one
 * message each instead of one round of N - 1 messages per rank.
 *
 * Ranks are numbered by their place among the attempt's active ranks, so
 * the plans run over the survivors as over the whole group.
 *
 * All-reduce over P ranks, m the largest power of two <= P, e = P - m:
 *  - fold (e > 0): of the first 2e ranks, each even one sends its input to
 *    the odd one after it, which reduces the pair; m ranks remain;
 *  - log2 m rounds: in round k a remaining rank exchanges its partial
 *    result with the one whose place among them differs in bit k, and both
 *    reduce the pair;
 *  - unfold (e > 0): each odd one of the first 2e sends the result back.
 * A rank's partner in every reduction holds the ranks next to its own in
 * rank order, and both reduce lower before higher, so every rank computes
 * the same bits; the order is a tree, not a chain, which changes float
 * rounding against the one-shot plan (within the same bounds). float16 and
 * bfloat16 stay on the other plans: they round once, from a float32 sum in
 * rank order, which partial results in the dtype cannot keep.
 *
 * With [core] agreement on, a dissemination barrier follows the data
 * steps: once it passed, every rank passed its data steps, which is what
 * agreement promises (the credits that tell the other plans so reach only
 * a rank's partners here). A barrier is that dissemination alone. */
#include <stdlib.h>

#include "error.h"
#include "plan.h"

/* ceil(log2 n), n >= 1 */
static int rounds_of(int n) {
  int k = 0;
  while ((1 << k) < n) k++;
  return k;
}

/* Dissemination from step k0 on: in round k every rank sends an empty
 * message to the one 2^k places after it and receives one from the one
 * 2^k places before it (cyclically); after ceil(log2 P) rounds every rank
 * has heard, through some chain, from every rank. */
static void dissemination(mep__plan_t *p, int k0, const int *rk, int P,
                          int i) {
  for (int k = 0; k0 + k < p->nsteps; k++) {
    mep__step_t *st = &p->steps[k0 + k];
    int d = 1 << k;
    st->send_to[rk[(i + d) % P]] = 1;
    st->recv_from[rk[(i - d % P + P) % P]] = 1;
  }
}

/* Step st: this rank reduces its `self` and the message from q into out. */
static void reduce_from(mep__step_t *st, int q, const uint8_t *self,
                        uint8_t *out, size_t bytes, int partial) {
  st->reduce = st->reduce_here = 1;
  st->partial = partial;
  st->recv_from[q] = 1;
  st->rself = self;
  st->rout = out;
  st->rlen = bytes;
}

/* The same, after sending `self` to q. */
static void exchange(mep__step_t *st, int q, const uint8_t *self,
                     uint8_t *out, size_t bytes, int partial) {
  reduce_from(st, q, self, out, bytes, partial);
  st->send_to[q] = 1;
  st->sptr[q] = self;
  st->sbytes[q] = bytes;
}

static int build_rd(const mep__plan_args_t *a, const mep__coll_spec_t *s,
                    mep__plan_t *p, const int *rk, int P, int i) {
  int m = 1 << (rounds_of(P + 1) - 1), e = P - m, L = rounds_of(m);
  int fold = e > 0, ndata = L + 2 * fold;
  int nconf = a->opts->confirm ? rounds_of(P) : 0;
  int rc = mep__plan_init(p, a, s, MEP__ALGO_RD, ndata + nconf);
  if (rc) return rc;
  p->ndata = ndata;
  p->sparse = 1;
  size_t bytes = s->count * a->ds;
  const uint8_t *cur = s->send;
  uint8_t *out = s->recv;
  /* place among the m that remain after the fold; -1: folded away */
  int j = i >= 2 * e ? i - e : (i & 1 ? i / 2 : -1);
  /* Partial results alternate between two scratch areas: a step reads
   * (and sends, staged, so copied as it goes) one and writes the other. */
  if (j >= 0 && L + fold > 1) {
    p->scratch = malloc(2 * bytes);
    if (!p->scratch) {
      mep__plan_free(p);
      return mep__err(MEP_ERR_NOMEM, "out of memory for %zu bytes of "
                      "partial results", 2 * bytes);
    }
  }
  int made = 0; /* reductions this rank made so far */
  if (fold && i < 2 * e) {
    mep__step_t *st = &p->steps[0];
    st->reduce = 1;
    if (j < 0) {
      st->send_to[rk[i + 1]] = 1;
      st->sptr[rk[i + 1]] = cur;
      st->sbytes[rk[i + 1]] = bytes;
    } else {
      uint8_t *to = L ? p->scratch : out;
      reduce_from(st, rk[i - 1], cur, to, bytes, L > 0);
      cur = to;
      made++;
    }
  }
  for (int k = 0; j >= 0 && k < L; k++) {
    int q = j ^ (1 << k);
    int qr = q < e ? rk[2 * q + 1] : rk[q + e];
    uint8_t *to = k == L - 1 ? out : p->scratch + (size_t)(made % 2) * bytes;
    exchange(&p->steps[fold + k], qr, cur, to, bytes, k < L - 1);
    cur = to;
    made++;
  }
  if (fold && i < 2 * e) {
    mep__step_t *st = &p->steps[ndata - 1];
    int q = rk[j < 0 ? i + 1 : i - 1];
    if (j < 0) {
      st->recv_from[q] = 1;
      st->rptr[q] = out;
      st->rbytes[q] = bytes;
    } else {
      st->send_to[q] = 1;
      st->sptr[q] = out;
      st->sbytes[q] = bytes;
    }
  }
  dissemination(p, ndata, rk, P, i);
  return 1;
}

static int build_dissemination(const mep__plan_args_t *a,
                               const mep__coll_spec_t *s, mep__plan_t *p,
                               const int *rk, int P, int i) {
  int rc = mep__plan_init(p, a, s, MEP__ALGO_DISSEMINATION, rounds_of(P));
  if (rc) return rc;
  p->ndata = 0; /* a barrier carries no data */
  p->sparse = 1;
  dissemination(p, 0, rk, P, i);
  return 1;
}

/* Whether `s` takes a logarithmic plan (module comment). */
static int fits(const mep__plan_args_t *a, const mep__coll_spec_t *s) {
  const mep__plan_opts_t *o = a->opts;
  if (o->log_ranks <= 0 || a->nact < o->log_ranks || a->nact < 2) return 0;
  if (s->kind == MEP__COLL_BARRIER) return 1;
  return s->kind == MEP__COLL_ALLREDUCE && s->count > 0 &&
         s->count * a->ds <= o->log_bytes && s->dtype != MEP_FLOAT16 &&
         s->dtype != MEP_BFLOAT16;
}

int mep__plan_log(const mep__plan_args_t *a, const mep__coll_spec_t *s,
                  mep__plan_t *p) {
  if (!fits(a, s)) return 0;
  int *rk = malloc((size_t)a->nact * sizeof *rk), P = 0, i = -1;
  if (!rk) return mep__err(MEP_ERR_NOMEM, "out of memory");
  for (int r = 0; r < a->n; r++) {
    if (!a->act[r]) continue;
    if (r == a->me) i = P;
    rk[P++] = r;
  }
  int rc = i < 0 ? 0
           : s->kind == MEP__COLL_BARRIER ? build_dissemination(a, s, p, rk,
                                                                P, i)
                                          : build_rd(a, s, p, rk, P, i);
  free(rk);
  return rc;
}
