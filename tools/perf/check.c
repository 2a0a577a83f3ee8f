/* check.c - inputs before an iteration and the verdict after it. The
 * expected output is recomputed from the generator alone (every rank's
 * input is a function of seed, rank, iteration and index), naively: in
 * double for float types, exactly (with the dtype's wrap-around) for
 * integers. Loops take the dtype as a constant (PERF_BY_DTYPE) so that a
 * check of 64 MiB stays short next to the operation it checks. */
#include <math.h>
#include <string.h>

#include "gen.h"
#include "perf.h"

static void set_keys(perf_rank_t *r, int iter) {
  for (int q = 0; q < r->n; q++)
    r->keys[q] = perf_stream_key(r->o->seed, q, iter);
}

/* The reduction of element idx over every rank, as the dtype's bits, for
 * integer and bool dtypes. Sums and products wrap in the dtype's width, so
 * they are computed modulo 2^64 and truncated. */
static inline uint64_t ref_int(mep_dtype_t dt, const perf_rank_t *r,
                               size_t idx) {
  mep_op_t op = r->o->redop;
  if (dt == MEP_BOOL) {
    /* sum and max are "or", prod and min are "and". */
    int any = 0, all = 1;
    for (int q = 0; q < r->n; q++) {
      int b = perf_value_bits(dt, r->keys[q], idx) != 0;
      any |= b;
      all &= b;
    }
    return (op == MEP_SUM || op == MEP_MAX) ? (uint64_t)any : (uint64_t)all;
  }
  uint64_t mask = perf_width_mask(dt), acc = 0;
  int64_t best = 0;
  for (int q = 0; q < r->n; q++) {
    uint64_t bits = perf_value_bits(dt, r->keys[q], idx) & mask;
    int64_t v = perf_int_value(dt, bits);
    if (q == 0) {
      acc = bits;
      best = v;
      continue;
    }
    acc = op == MEP_PROD ? acc * bits : acc + bits;
    if (op == MEP_MIN ? v < best : v > best) best = v;
  }
  switch (op) {
  case MEP_MIN:
  case MEP_MAX: return (uint64_t)best & mask;
  case MEP_AVG:
    /* The wrapped sum, read as the dtype, divided truncating to zero. */
    return (uint64_t)(perf_int_value(dt, acc & mask) / r->n) & mask;
  default: return acc & mask;
  }
}

/* The reduction of element idx in double, and the magnitude the tolerance
 * scales with (0 for min/max, which must be exact). */
static inline double ref_float(mep_dtype_t dt, const perf_rank_t *r,
                               size_t idx, double *mag) {
  mep_op_t op = r->o->redop;
  double acc = 0, m = 0;
  for (int q = 0; q < r->n; q++) {
    double x = perf_float_value(dt, perf_value_bits(dt, r->keys[q], idx));
    if (q == 0) {
      acc = x;
      m = fabs(x);
    } else if (op == MEP_PROD) {
      acc *= x;
      m *= fabs(x);
    } else if (op == MEP_MIN) {
      acc = x < acc ? x : acc;
    } else if (op == MEP_MAX) {
      acc = x > acc ? x : acc;
    } else {
      acc += x;
      m += fabs(x);
    }
  }
  if (op == MEP_AVG) {
    acc /= r->n;
    m /= r->n;
  }
  *mag = (op == MEP_MIN || op == MEP_MAX) ? 0 : m;
  return acc;
}

/* Relative tolerance: float16/bfloat16/float32 accumulate in float32 and
 * float64 in float64, each of the n - 1 combines and the avg division
 * rounding once, then the result rounds once to the dtype. */
static double tolerance(const perf_rank_t *r) {
  mep_dtype_t dt = r->o->dtype;
  double u_acc = dt == MEP_FLOAT64 ? perf_unit_roundoff(MEP_FLOAT64)
                                   : perf_unit_roundoff(MEP_FLOAT32);
  return (r->n + 1) * u_acc + perf_unit_roundoff(dt);
}

/* The expected element i of segment s as bits; integer dtypes only for
 * reductions. */
static inline uint64_t want_bits(mep_dtype_t dt, const perf_rank_t *r,
                                 const perf_seg_t *s, size_t i) {
  if (s->src < 0) return ref_int(dt, r, s->src_idx + i);
  return perf_value_bits(dt, r->keys[s->src], s->src_idx + i) &
         perf_width_mask(dt);
}

static inline uint64_t count_wrong(mep_dtype_t dt, const perf_rank_t *r,
                                   const perf_seg_t *s) {
  uint64_t wrong = 0;
  if (s->src >= 0 || !perf_dtype_is_float(dt)) {
    for (size_t i = 0; i < s->count; i++)
      wrong +=
          perf_load_bits(dt, r->recv, s->dst + i) != want_bits(dt, r, s, i);
    return wrong;
  }
  double tol = tolerance(r);
  for (size_t i = 0; i < s->count; i++) {
    double mag, want = ref_float(dt, r, s->src_idx + i, &mag);
    double got = perf_float_value(dt, perf_load_bits(dt, r->recv, s->dst + i));
    wrong += !(fabs(got - want) <= tol * mag); /* NaN counts as wrong */
  }
  return wrong;
}

uint64_t perf_check(perf_rank_t *r, int iter) {
  set_keys(r, iter);
  uint64_t wrong = 0, w = 0;
  for (size_t k = 0; k < r->nsegs; k++) {
    PERF_BY_DTYPE(r->o->dtype, w =, count_wrong, r, &r->segs[k])
    wrong += w;
  }
  return wrong;
}

/* Output the operation must overwrite: all-ones bytes for floats (NaN)
 * and bool (neither 0 nor 1), which no input or result is; for integers,
 * where every pattern is a possible result, the complement of the
 * expected element. */
static inline void poison_seg(mep_dtype_t dt, perf_rank_t *r,
                              const perf_seg_t *s) {
  if (perf_dtype_is_float(dt) || dt == MEP_BOOL) {
    memset((char *)r->recv + s->dst * r->dsize, 0xff, s->count * r->dsize);
    return;
  }
  for (size_t i = 0; i < s->count; i++)
    perf_store_bits(dt, r->recv, s->dst + i, ~want_bits(dt, r, s, i));
}

void perf_prepare(perf_rank_t *r, int iter) {
  set_keys(r, iter);
  if (r->o->kind == PERF_BARRIER) return;
  /* Broadcast is in place: the root's buffer is its input. */
  int root_in_place = r->o->kind == PERF_BROADCAST && r->rank == r->o->root;
  if (r->o->kind != PERF_BROADCAST || root_in_place)
    perf_fill(r->o->dtype, r->keys[r->rank], 0, r->send, r->sh.send_elems);
  if (root_in_place || r->o->inplace) return; /* the input is the output */
  for (size_t k = 0; k < r->nsegs; k++)
    PERF_BY_DTYPE(r->o->dtype, , poison_seg, r, &r->segs[k])
}

void perf_spoil(perf_rank_t *r) {
  for (size_t k = 0; k < r->nsegs; k++) {
    if (r->segs[k].count == 0) continue;
    size_t i = r->segs[k].dst;
    perf_store_bits(r->o->dtype, r->recv, i,
                    ~perf_load_bits(r->o->dtype, r->recv, i));
    return;
  }
}
