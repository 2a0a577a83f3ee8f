/* ft_ref.c - step lists, inputs and the reference results over survivors. */
#include "ft_ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ft_util.h"
#include "tree.h"

/* Odd counts (1, 7, 1001), an empty all-reduce, and two of a few MiB that
 * with 4 KiB chunks take hundreds of chunks. */
static const ft_step_t full_list[] = {
    {FT_ALLREDUCE, MEP_INT64, MEP_SUM, 1},
    {FT_ALLREDUCE, MEP_FLOAT32, MEP_SUM, 7},
    {FT_ALLGATHER, MEP_INT64, MEP_SUM, 1001},
    {FT_ALLREDUCE, MEP_INT32, MEP_MIN, 1001},
    {FT_ALLREDUCE, MEP_FLOAT32, MEP_SUM, 1048583},
    {FT_ALLTOALL, MEP_INT32, MEP_SUM, 7},
    {FT_ALLREDUCE, MEP_INT64, MEP_AVG, 1001},
    {FT_BARRIER, MEP_INT64, MEP_SUM, 0},
    {FT_ALLREDUCE, MEP_INT64, MEP_SUM, 393241},
    {FT_ALLREDUCE, MEP_FLOAT32, MEP_MAX, 0},
    {FT_ALLREDUCE, MEP_FLOAT32, MEP_AVG, 1001},
    {FT_ALLTOALL, MEP_INT64, MEP_SUM, 1001},
};
#define FULL_LARGE 4

/* For many cycles: one medium all-reduce (64 chunks of 4 KiB) to die in. */
static const ft_step_t short_list[] = {
    {FT_ALLREDUCE, MEP_INT64, MEP_SUM, 7},
    {FT_ALLGATHER, MEP_INT32, MEP_SUM, 1},
    {FT_ALLREDUCE, MEP_FLOAT32, MEP_SUM, 65537},
    {FT_ALLTOALL, MEP_INT64, MEP_SUM, 3},
    {FT_ALLREDUCE, MEP_FLOAT32, MEP_AVG, 1001},
};
#define SHORT_LARGE 2

static const ft_step_t after_list[] = {
    {FT_ALLREDUCE, MEP_INT64, MEP_SUM, 7},
    {FT_ALLGATHER, MEP_FLOAT32, MEP_SUM, 1},
};

const ft_step_t *ft_steps(int short_one, size_t *n, int *large) {
  if (short_one) {
    *n = sizeof short_list / sizeof *short_list;
    *large = SHORT_LARGE;
    return short_list;
  }
  *n = sizeof full_list / sizeof *full_list;
  *large = FULL_LARGE;
  return full_list;
}

const ft_step_t *ft_steps_after(size_t *n) {
  *n = sizeof after_list / sizeof *after_list;
  return after_list;
}

/* Element sizes written here, not asked of the library. */
static size_t esize(mep_dtype_t dt) {
  switch (dt) {
  case MEP_INT64: return 8;
  case MEP_INT32: return 4;
  case MEP_FLOAT32: return 4;
  default: CHECK(0, "ft_ref: dtype %d is not used by these tests", (int)dt);
  }
  return 0;
}

void ft_step_name(const ft_step_t *s, char *buf, size_t len) {
  static const char *const colls[] = {"allreduce", "allgather", "alltoall",
                                      "barrier"};
  static const char *const ops[] = {"sum", "prod", "min", "max", "avg"};
  const char *dt = s->dt == MEP_INT64   ? "int64"
                   : s->dt == MEP_INT32 ? "int32"
                                        : "float32";
  if (s->coll == FT_BARRIER)
    snprintf(buf, len, "barrier");
  else if (s->coll == FT_ALLREDUCE)
    snprintf(buf, len, "allreduce %s %s x%zu", dt, ops[s->op], s->count);
  else
    snprintf(buf, len, "%s %s x%zu", colls[s->coll], dt, s->count);
}

int ft_step_small(const ft_step_t *s) {
  return s->coll == FT_BARRIER || s->count <= 1024;
}

/* The stream of one rank's input in one step: element idx is a mix of
 * base + idx, so any element can be made without the ones before it. */
static uint64_t stream_base(uint64_t seed, uint64_t gid, int rank) {
  return ft_rand3(seed, gid, (uint64_t)rank + 1);
}

static uint64_t elem_bits(uint64_t base, size_t idx) {
  uint64_t z = base + (uint64_t)(idx + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A float32 in [-4, 4) with 24 significant bits: sums of a few of them
 * round, so only a sum in the right order matches bit for bit. */
static float bits_f32(uint64_t bits) {
  int32_t m = (int32_t)((bits >> 40) & 0xffffff) - 0x800000;
  return (float)m / 2097152.0f;
}

static void put_elem(mep_dtype_t dt, uint64_t bits, uint8_t *dst) {
  if (dt == MEP_INT64) {
    memcpy(dst, &bits, 8);
  } else if (dt == MEP_INT32) {
    uint32_t v = (uint32_t)(bits >> 32);
    memcpy(dst, &v, 4);
  } else {
    float f = bits_f32(bits);
    memcpy(dst, &f, 4);
  }
}

/* The same on every rank, so the untouched blocks of dropped ranks hash
 * alike everywhere. */
static uint64_t canary_seed(uint64_t seed, uint64_t gid) {
  return ft_rand3(seed, gid, 0xca9a0000ull);
}

void ft_bufs_make(const ft_step_t *s, uint64_t seed, uint64_t gid, int rank,
                  int size, ft_bufs_t *b) {
  memset(b, 0, sizeof *b);
  if (s->coll == FT_BARRIER) {
    b->recv = ft_xmalloc(FT_TAIL);
    fill_random(b->recv, FT_TAIL, canary_seed(seed, gid));
    return;
  }
  size_t es = esize(s->dt);
  size_t in = s->coll == FT_ALLTOALL ? (size_t)size * s->count : s->count;
  size_t out = s->coll == FT_ALLREDUCE ? s->count : (size_t)size * s->count;
  b->send_len = in * es;
  b->recv_len = out * es;
  b->send = ft_xmalloc(b->send_len);
  b->recv = ft_xmalloc(b->recv_len + FT_TAIL);
  uint64_t base = stream_base(seed, gid, rank);
  for (size_t i = 0; i < in; i++)
    put_elem(s->dt, elem_bits(base, i), b->send + i * es);
  fill_random(b->recv, b->recv_len + FT_TAIL, canary_seed(seed, gid));
}

void ft_bufs_free(ft_bufs_t *b) {
  free(b->send);
  free(b->recv);
  memset(b, 0, sizeof *b);
}

static mep_op_t f32_op;
static float f32_combine(float acc, float x) {
  if (f32_op == MEP_MIN) return x < acc ? x : acc;
  if (f32_op == MEP_MAX) return x > acc ? x : acc;
  return acc + x;
}

/* Element idx of the reduction over the alive ranks, in rank order (or
 * the logarithmic plan's, with `tree`). `v` is scratch for `size` floats.
 * Called once per element of a few-MiB step: what does not depend on idx
 * is decided by the caller, because under emulation (the verbs tests'
 * VM) this loop's cost is the skew between ranks that a step measures. */
static void reduce_elem(const ft_step_t *s, const uint64_t *bases,
                        const uint8_t *alive, int size, int tree,
                        float *v, size_t idx, uint8_t *dst) {
  int first = 1, n = 0;
  if (s->dt == MEP_FLOAT32) {
    float acc = 0;
    for (int r = 0; r < size; r++) {
      if (!alive[r]) continue;
      float x = bits_f32(elem_bits(bases[r], idx));
      v[n++] = x;
      acc = first ? x : f32_combine(acc, x);
      first = 0;
    }
    if (tree) {
      TREE_REDUCE(v, n, f32_combine);
      acc = v[0];
    }
    if (s->op == MEP_AVG) acc = acc / (float)n;
    memcpy(dst, &acc, 4);
    return;
  }
  uint64_t acc = 0; /* unsigned: wrap-around is defined */
  for (int r = 0; r < size; r++) {
    if (!alive[r]) continue;
    uint64_t bits = elem_bits(bases[r], idx);
    int64_t x = s->dt == MEP_INT64 ? (int64_t)bits
                                   : (int64_t)(int32_t)(uint32_t)(bits >> 32);
    int64_t a = s->dt == MEP_INT64 ? (int64_t)acc
                                   : (int64_t)(int32_t)(uint32_t)acc;
    n++;
    if (first) acc = (uint64_t)x;
    else if (s->op == MEP_MIN) acc = (uint64_t)(x < a ? x : a);
    else if (s->op == MEP_MAX) acc = (uint64_t)(x > a ? x : a);
    else acc += (uint64_t)x;
    first = 0;
  }
  if (s->dt == MEP_INT64) {
    int64_t v = (int64_t)acc;
    if (s->op == MEP_AVG) v /= n;
    memcpy(dst, &v, 8);
  } else {
    int32_t v = (int32_t)(uint32_t)acc;
    if (s->op == MEP_AVG) v /= n;
    memcpy(dst, &v, 4);
  }
}

/* What recv must hold: the canary where nothing is delivered. */
static uint8_t *expected(const ft_step_t *s, uint64_t seed, uint64_t gid,
                         int rank, int size, const uint8_t *alive,
                         const ft_bufs_t *b) {
  size_t total = b->recv_len + FT_TAIL;
  uint8_t *want = ft_xmalloc(total);
  fill_random(want, total, canary_seed(seed, gid));
  if (s->coll == FT_BARRIER) return want;
  size_t es = esize(s->dt);
  uint64_t *bases = ft_xcalloc((size_t)size, sizeof *bases);
  for (int r = 0; r < size; r++) bases[r] = stream_base(seed, gid, r);
  if (s->coll == FT_ALLREDUCE) {
    int n = 0;
    for (int r = 0; r < size; r++) n += alive[r] != 0;
    int tree = n > 0 && tree_applies(s->count * es, n);
    float *v = ft_xcalloc((size_t)size, sizeof *v);
    f32_op = s->op;
    for (size_t i = 0; i < s->count; i++)
      reduce_elem(s, bases, alive, size, tree, v, i, want + i * es);
    free(v);
  } else {
    for (int q = 0; q < size; q++) {
      if (!alive[q]) continue;
      /* all-gather: q's whole input; all-to-all: q's block for me */
      size_t from = s->coll == FT_ALLTOALL ? (size_t)rank * s->count : 0;
      uint8_t *blk = want + (size_t)q * s->count * es;
      for (size_t j = 0; j < s->count; j++)
        put_elem(s->dt, elem_bits(bases[q], from + j), blk + j * es);
    }
  }
  free(bases);
  return want;
}

int ft_ref_check(const ft_step_t *s, uint64_t seed, uint64_t gid, int rank,
                 int size, const uint8_t *alive, const ft_bufs_t *b,
                 char *why, size_t whylen) {
  uint8_t *want = expected(s, seed, gid, rank, size, alive, b);
  size_t total = b->recv_len + FT_TAIL;
  int rc = 0;
  if (memcmp(want, b->recv, total) != 0) {
    size_t i = 0;
    while (want[i] == b->recv[i]) i++;
    char name[96];
    ft_step_name(s, name, sizeof name);
    if (i >= b->recv_len) {
      snprintf(why, whylen, "%s: wrote %zu bytes past the end of recv", name,
               i - b->recv_len + 1);
    } else {
      size_t es = s->coll == FT_BARRIER ? 1 : esize(s->dt);
      size_t e = i / es;
      size_t blk = s->count ? e / s->count : 0;
      uint64_t g = 0, w = 0;
      memcpy(&g, b->recv + e * es, es);
      memcpy(&w, want + e * es, es);
      snprintf(why, whylen,
               "%s: element %zu (block %zu, from rank %s) is 0x%llx, want "
               "0x%llx",
               name, e, blk,
               s->coll == FT_ALLREDUCE ? "-"
               : blk < (size_t)size && alive[blk] ? "alive"
                                                  : "dropped, untouched",
               (unsigned long long)g, (unsigned long long)w);
    }
    rc = -1;
  }
  free(want);
  return rc;
}

uint64_t ft_hash(const ft_bufs_t *b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < b->recv_len; i++) {
    h ^= b->recv[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
