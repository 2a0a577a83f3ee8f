/* ref.c - inputs and naive reductions for the collective tests. */
#include "ref.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "tree.h"

size_t ref_size(mep_dtype_t dt) {
  switch (dt) {
  case MEP_FLOAT16: case MEP_BFLOAT16: return 2;
  case MEP_FLOAT32: case MEP_INT32: return 4;
  case MEP_FLOAT64: case MEP_INT64: return 8;
  case MEP_INT8: case MEP_UINT8: case MEP_BOOL: return 1;
  }
  return 0;
}

const char *ref_dtype_name(mep_dtype_t dt) {
  static const char *const names[] = {"float16", "bfloat16", "float32",
                                      "float64", "int8",     "uint8",
                                      "int32",   "int64",    "bool"};
  return (unsigned)dt < MEP_DTYPE_COUNT ? names[dt] : "?";
}

const char *ref_op_name(mep_op_t op) {
  static const char *const names[] = {"sum", "prod", "min", "max", "avg"};
  return (unsigned)op < MEP_OP_COUNT ? names[op] : "?";
}

/* Two rounds of mixing, so that (rank, idx) pairs never alias. */
static uint64_t bits_of(uint64_t seed, int rank, size_t idx) {
  uint64_t s = seed ^ ((uint64_t)(unsigned)rank << 32);
  uint64_t h = splitmix64(&s) + (uint64_t)idx;
  return splitmix64(&h);
}

/* A float of the format (mantissa bits, exponent bias) from random bits:
 * sign, exponent in [-2, 1], random mantissa; `subnormals` also allows a
 * nonzero subnormal one time in 32. */
static uint64_t float_bits(uint64_t r, int mbits, int bias, int subnormals) {
  uint64_t sign = r & 1, mant = (r >> 8) & ((UINT64_C(1) << mbits) - 1);
  uint64_t ebits = (uint64_t)(bias + (int)((r >> 1) & 3) - 2);
  if (subnormals && ((r >> 3) & 31) == 0) {
    ebits = 0;
    mant |= 1;
  }
  int width = mbits + (bias == 1023 ? 11 : bias == 127 ? 8 : 5);
  return sign << width | ebits << mbits | mant;
}

void ref_elem(mep_dtype_t dt, uint64_t seed, int rank, size_t idx,
              void *out) {
  uint64_t r = bits_of(seed, rank, idx);
  uint16_t h = 0;
  uint32_t w = 0;
  uint64_t d = 0;
  uint8_t b = 0;
  switch (dt) {
  case MEP_FLOAT16: h = (uint16_t)float_bits(r, 10, 15, 1); break;
  case MEP_BFLOAT16: h = (uint16_t)float_bits(r, 7, 127, 1); break;
  case MEP_FLOAT32: w = (uint32_t)float_bits(r, 23, 127, 0); break;
  case MEP_FLOAT64: d = float_bits(r, 52, 1023, 0); break;
  case MEP_BOOL:
    b = (uint8_t)(r >> 8);
    if (r & 1) b = 0;
    else if (b == 0) b = 0x80;
    break;
  default: break;
  }
  switch (ref_size(dt)) {
  case 1:
    if (dt != MEP_BOOL) b = (uint8_t)r;
    memcpy(out, &b, 1);
    break;
  case 2: memcpy(out, &h, 2); break;
  case 4:
    if (dt == MEP_INT32) w = (uint32_t)r;
    memcpy(out, &w, 4);
    break;
  case 8:
    if (dt == MEP_INT64) d = r;
    memcpy(out, &d, 8);
    break;
  }
}

void ref_fill(mep_dtype_t dt, uint64_t seed, int rank, size_t first,
              size_t count, void *buf) {
  size_t sz = ref_size(dt);
  for (size_t i = 0; i < count; i++)
    ref_elem(dt, seed, rank, first + i, (char *)buf + i * sz);
}

/* ------------------------------------------------ half-width conversions */

float ref_f16_to_f32(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 31  ? (m ? NAN : INFINITY)
             : e == 0 ? ldexp(m, -24)
                      : ldexp(m + 1024, e - 25);
  return (float)((h & 0x8000) ? -v : v);
}

float ref_bf16_to_f32(uint16_t h) {
  int e = (h >> 7) & 255, m = h & 127;
  double v = e == 255 ? (m ? NAN : INFINITY)
             : e == 0 ? ldexp(m, -133)
                      : ldexp(m + 128, e - 134);
  return (float)((h & 0x8000) ? -v : v);
}

/* Rounds |f| to a format with `mbits` fraction bits, exponent bias `bias`
 * and `ebits` exponent bits: the value is scaled so that its last kept bit
 * is the unit, rounded to an integer (ties to even, the default mode) and
 * re-encoded. Works in double, where every step is exact. */
static uint16_t to_half(float f, int mbits, int ebits, int bias) {
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  uint16_t inf = (uint16_t)(((1u << ebits) - 1) << mbits);
  if (isnan(f)) return (uint16_t)(sign | inf | 1u << (mbits - 1));
  double a = fabs((double)f);
  if (isinf(a)) return sign | inf;
  int e;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  int min_exp = 1 - bias, q = e - 1 - mbits;
  if (q < min_exp - mbits) q = min_exp - mbits; /* subnormal spacing */
  double k = nearbyint(ldexp(a, -q)), r = ldexp(k, q);
  if (r >= ldexp(1, bias + 1)) return sign | inf;
  if (r < ldexp(1, min_exp)) return (uint16_t)(sign | (uint16_t)k);
  frexp(r, &e);
  double frac = ldexp(r, -(e - 1)) - 1; /* in [0, 1) */
  return (uint16_t)(sign | (uint16_t)(e - 1 + bias) << mbits |
                    (uint16_t)ldexp(frac, mbits));
}

uint16_t ref_f32_to_f16(float f) { return to_half(f, 10, 5, 15); }
uint16_t ref_f32_to_bf16(float f) { return to_half(f, 7, 8, 127); }

/* ------------------------------------------------------------ reductions */

static float combine_f(mep_op_t op, float a, float x) {
  switch (op) {
  case MEP_PROD: return a * x;
  case MEP_MIN: return x < a ? x : a;
  case MEP_MAX: return x > a ? x : a;
  default: return a + x;
  }
}

static double combine_d(mep_op_t op, double a, double x) {
  switch (op) {
  case MEP_PROD: return a * x;
  case MEP_MIN: return x < a ? x : a;
  case MEP_MAX: return x > a ? x : a;
  default: return a + x;
  }
}

static long double combine_ld(mep_op_t op, long double a, long double x) {
  switch (op) {
  case MEP_PROD: return a * x;
  case MEP_MIN: return x < a ? x : a;
  case MEP_MAX: return x > a ? x : a;
  default: return a + x;
  }
}

/* float16/bfloat16: widened to float32, combined in rank order, rounded
 * once. */
static void reduce_half(mep_dtype_t dt, mep_op_t op, int n, uint64_t seed,
                        size_t idx, void *want) {
  int bf = dt == MEP_BFLOAT16;
  float acc = 0;
  for (int r = 0; r < n; r++) {
    uint16_t h;
    ref_elem(dt, seed, r, idx, &h);
    float x = bf ? ref_bf16_to_f32(h) : ref_f16_to_f32(h);
    acc = r == 0 ? x : combine_f(op, acc, x);
  }
  if (op == MEP_AVG) acc /= (float)n;
  uint16_t h = bf ? ref_f32_to_bf16(acc) : ref_f32_to_f16(acc);
  memcpy(want, &h, 2);
}

static int tree_order;
void ref_set_tree(int on) { tree_order = on; }

static mep_op_t tree_op;
static float tree_cf(float a, float x) { return combine_f(tree_op, a, x); }
static double tree_cd(double a, double x) { return combine_d(tree_op, a, x); }

/* float32/float64 in rank order in the dtype (or the tree's, with
 * ref_set_tree); with the long double result and the bound on the
 * difference any order of summation meets: n-1 roundings of the running
 * result plus the final one (and the average's division). */
static void reduce_float(mep_dtype_t dt, mep_op_t op, int n, uint64_t seed,
                         size_t idx, void *want, long double *exact,
                         long double *tol) {
  int wide = dt == MEP_FLOAT64;
  float sf = 0;
  double sd = 0;
  long double ld = 0, mag = 0;
  float vf[REF_MAX_RANKS];
  double vd[REF_MAX_RANKS];
  for (int r = 0; r < n; r++) {
    float xf = 0;
    double xd = 0;
    if (wide) ref_elem(dt, seed, r, idx, &xd);
    else ref_elem(dt, seed, r, idx, &xf), xd = xf;
    sf = r == 0 ? xf : combine_f(op, sf, xf);
    sd = r == 0 ? xd : combine_d(op, sd, xd);
    ld = r == 0 ? xd : combine_ld(op, ld, xd);
    mag += fabsl((long double)xd);
    vf[r] = xf;
    vd[r] = xd;
  }
  if (tree_order) {
    tree_op = op;
    TREE_REDUCE(vf, n, tree_cf);
    TREE_REDUCE(vd, n, tree_cd);
    sf = vf[0];
    sd = vd[0];
  }
  if (op == MEP_AVG) sf /= (float)n, sd /= n, ld /= n, mag /= n;
  long double u = wide ? DBL_EPSILON / 2 : FLT_EPSILON / 2;
  *tol = 0;
  if (op == MEP_SUM || op == MEP_AVG) *tol = (n + 1) * u * mag;
  if (op == MEP_PROD) *tol = (n + 1) * u * fabsl(ld);
  *exact = ld;
  if (wide) memcpy(want, &sd, 8);
  else memcpy(want, &sf, 4);
}

/* An integer element widened to int64 (signed types sign-extend). */
static int64_t int_load(mep_dtype_t dt, const void *p) {
  int8_t i8;
  uint8_t u8;
  int32_t i32;
  int64_t i64;
  switch (dt) {
  case MEP_INT8: memcpy(&i8, p, 1); return i8;
  case MEP_UINT8: memcpy(&u8, p, 1); return u8;
  case MEP_INT32: memcpy(&i32, p, 4); return i32;
  default: memcpy(&i64, p, 8); return i64;
  }
}

/* v truncated to the dtype's width, then widened back (wrap-around). */
static int64_t int_wrap(mep_dtype_t dt, uint64_t v) {
  switch (dt) {
  case MEP_INT8: return (int8_t)(uint8_t)v;
  case MEP_UINT8: return (uint8_t)v;
  case MEP_INT32: return (int32_t)(uint32_t)v;
  default: return (int64_t)v;
  }
}

static void reduce_int(mep_dtype_t dt, mep_op_t op, int n, uint64_t seed,
                       size_t idx, void *want) {
  uint64_t acc = 0; /* unsigned: wrapping is defined */
  for (int r = 0; r < n; r++) {
    uint8_t raw[8];
    ref_elem(dt, seed, r, idx, raw);
    int64_t x = int_load(dt, raw), a = int_wrap(dt, acc);
    if (r == 0) acc = (uint64_t)x;
    else if (op == MEP_PROD) acc *= (uint64_t)x;
    else if (op == MEP_MIN) acc = (uint64_t)(x < a ? x : a);
    else if (op == MEP_MAX) acc = (uint64_t)(x > a ? x : a);
    else acc += (uint64_t)x;
  }
  int64_t v = int_wrap(dt, acc);
  if (op == MEP_AVG) v /= n; /* C division truncates toward zero */
  uint64_t bits = (uint64_t)v; /* little-endian: the low bytes */
  memcpy(want, &bits, ref_size(dt));
}

static void reduce_bool(mep_op_t op, int n, uint64_t seed, size_t idx,
                        void *want) {
  int any = 0, all = 1;
  for (int r = 0; r < n; r++) {
    uint8_t b;
    ref_elem(MEP_BOOL, seed, r, idx, &b);
    any |= b != 0;
    all &= b != 0;
  }
  uint8_t v = (uint8_t)(op == MEP_SUM || op == MEP_MAX ? any : all);
  memcpy(want, &v, 1);
}

void ref_reduced(mep_dtype_t dt, mep_op_t op, int n, uint64_t seed,
                 size_t idx, void *want) {
  long double exact, tol;
  switch (dt) {
  case MEP_FLOAT16:
  case MEP_BFLOAT16: reduce_half(dt, op, n, seed, idx, want); break;
  case MEP_FLOAT32:
  case MEP_FLOAT64:
    reduce_float(dt, op, n, seed, idx, want, &exact, &tol);
    break;
  case MEP_BOOL: reduce_bool(op, n, seed, idx, want); break;
  default: reduce_int(dt, op, n, seed, idx, want); break;
  }
}

/* The element as a number, for messages. */
static long double as_number(mep_dtype_t dt, const void *p) {
  uint16_t h;
  float f;
  double d;
  switch (dt) {
  case MEP_FLOAT16: memcpy(&h, p, 2); return ref_f16_to_f32(h);
  case MEP_BFLOAT16: memcpy(&h, p, 2); return ref_bf16_to_f32(h);
  case MEP_FLOAT32: memcpy(&f, p, 4); return f;
  case MEP_FLOAT64: memcpy(&d, p, 8); return d;
  case MEP_BOOL: return *(const uint8_t *)p;
  default: return (long double)int_load(dt, p);
  }
}

int ref_check_reduced(mep_dtype_t dt, mep_op_t op, int n, uint64_t seed,
                      size_t idx, const void *got, char *why, size_t wl) {
  uint8_t want[8];
  size_t sz = ref_size(dt);
  if (dt == MEP_FLOAT32 || dt == MEP_FLOAT64) {
    long double exact, tol, g = as_number(dt, got);
    reduce_float(dt, op, n, seed, idx, want, &exact, &tol);
    if (!(fabsl(g - exact) <= tol)) {
      snprintf(why, wl, "got %.17Lg, want %.17Lg within %.3Lg", g, exact,
               tol);
      return -1;
    }
  } else {
    ref_reduced(dt, op, n, seed, idx, want);
  }
  if (memcmp(got, want, sz) == 0) return 0;
  snprintf(why, wl, "got %.17Lg, want %.17Lg (bit for bit: the result of "
           "combining in rank order)", as_number(dt, got),
           as_number(dt, want));
  return -1;
}

uint64_t ref_hash(const void *buf, size_t len, uint64_t h) {
  const uint8_t *p = buf;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
