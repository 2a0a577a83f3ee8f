/* Unit tests of the element types and reductions (core/src/reduce.c).
 *
 * The references here are written independently of the implementation:
 * float16/bfloat16 values come from tables built with ldexp, rounding to
 * them is a search for the nearest table entry compared in double, and the
 * reductions are naive loops over decoded values (exact integers, double or
 * long double for floats). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "error.h"
#include "reduce.h"

static uint64_t g_seed = 0x5eed2024;
static uint64_t rnd(void) { return splitmix64(&g_seed); }
static uint32_t rnd_below(uint32_t n) { return (uint32_t)(rnd() % n); }

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ------------------------------------------------- reference tables
 * tab16[p] is the value of the non-negative float16 pattern p, for
 * p <= 0x7c00; the last entry stands for the first value past the largest
 * finite one (65536), where rounding overflows to infinity. Same for
 * bfloat16 up to 0x7f80 (2^128). */
#define N16 (0x7c00 + 1)
#define NB16 (0x7f80 + 1)
static double tab16[N16];
static double tabb16[NB16];

static void build_tables(void) {
  for (int p = 0; p < N16; p++) {
    int e = p >> 10, m = p & 0x3ff;
    tab16[p] = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
  }
  for (int p = 0; p < NB16; p++) {
    int e = p >> 7, m = p & 0x7f;
    tabb16[p] = e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
  }
  CHECK(tab16[0x7bff] == 65504.0 && tab16[N16 - 1] == 65536.0, "f16 table");
  CHECK(tabb16[NB16 - 1] == ldexp(1, 128), "bf16 table");
}

static int is_nan16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static int is_nanb16(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

/* Value of a 16-bit pattern from its table (inf/NaN by hand). */
static double dec16(uint16_t h, const double *tab, int n, uint16_t expmask,
                    int nan) {
  double v;
  uint16_t mag = h & 0x7fff;
  if (nan) v = NAN;
  else if (mag == expmask) v = INFINITY;
  else {
    CHECK(mag < n - 1, "pattern %#x past the table", h);
    v = tab[mag];
  }
  return (h & 0x8000) ? -v : v;
}
static double dec_f16(uint16_t h) {
  return dec16(h, tab16, N16, 0x7c00, is_nan16(h));
}
static double dec_bf16(uint16_t h) {
  return dec16(h, tabb16, NB16, 0x7f80, is_nanb16(h));
}

/* The pattern nearest to v (ties to the even pattern) by binary search of
 * the table; NaN gives 0xffff (callers only test for NaN-ness then). */
static uint16_t round_ref(double v, const double *tab, int n) {
  if (isnan(v)) return 0xffff;
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  if (a >= tab[n - 1]) return (uint16_t)(sign | (n - 1));
  int lo = 0, hi = n - 1; /* tab[lo] <= a < tab[hi] */
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    if (tab[mid] <= a) lo = mid;
    else hi = mid;
  }
  /* Both differences are exact (Sterbenz: the neighbours are within a
   * factor 2 of a, or one of them is 0). */
  double below = a - tab[lo], above = tab[hi] - a;
  int p = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return (uint16_t)(sign | p);
}
static uint16_t round_f16(double v) { return round_ref(v, tab16, N16); }
static uint16_t round_bf16(double v) { return round_ref(v, tabb16, NB16); }

/* ------------------------------------------------------- conversions */

static void test_names(void) {
  static const char *dn[] = {"float16", "bfloat16", "float32",
                             "float64", "int8",     "uint8",
                             "int32",   "int64",    "bool"};
  static const size_t ds[] = {2, 2, 4, 8, 1, 1, 4, 8, 1};
  static const char *on[] = {"sum", "prod", "min", "max", "avg"};
  for (int d = 0; d < MEP_DTYPE_COUNT; d++) {
    CHECK(strcmp(mep_dtype_name((mep_dtype_t)d), dn[d]) == 0, "name %d", d);
    CHECK(mep_dtype_size((mep_dtype_t)d) == ds[d], "size %d", d);
    size_t want_acc = d <= MEP_BFLOAT16 ? 4 : ds[d];
    CHECK(mep__acc_size((mep_dtype_t)d) == want_acc, "acc size %d", d);
  }
  for (int o = 0; o < MEP_OP_COUNT; o++)
    CHECK(strcmp(mep_op_name((mep_op_t)o), on[o]) == 0, "op name %d", o);
  CHECK(mep_dtype_name((mep_dtype_t)MEP_DTYPE_COUNT) == NULL, "unknown dt");
  CHECK(mep_dtype_name((mep_dtype_t)-1) == NULL, "negative dt");
  CHECK(mep_dtype_size((mep_dtype_t)MEP_DTYPE_COUNT) == 0, "unknown size");
  CHECK(mep__acc_size((mep_dtype_t)99) == 0, "unknown acc size");
  CHECK(mep_op_name((mep_op_t)MEP_OP_COUNT) == NULL, "unknown op");
  CHECK(mep_op_name((mep_op_t)-1) == NULL, "negative op");
}

static void test_check(void) {
  for (int d = 0; d < MEP_DTYPE_COUNT; d++)
    for (int o = 0; o < MEP_OP_COUNT; o++) {
      int bad = d == MEP_BOOL && o == MEP_AVG;
      CHECK_RC(mep__reduce_check((mep_dtype_t)d, (mep_op_t)o),
               bad ? MEP_ERR_INVALID : MEP_OK);
    }
  CHECK_MSG("avg on bool");
  CHECK_RC(mep__reduce_check((mep_dtype_t)9, MEP_SUM), MEP_ERR_INVALID);
  CHECK_MSG("unknown dtype 9");
  CHECK_RC(mep__reduce_check((mep_dtype_t)-3, MEP_SUM), MEP_ERR_INVALID);
  CHECK_MSG("unknown dtype -3");
  CHECK_RC(mep__reduce_check(MEP_INT32, (mep_op_t)5), MEP_ERR_INVALID);
  CHECK_MSG("unknown op 5 on int32");
  CHECK_RC(mep__reduce_check(MEP_FLOAT16, (mep_op_t)-1), MEP_ERR_INVALID);
  CHECK_MSG("unknown op -1");

  /* Invalid pairs leave the buffers untouched. */
  uint8_t acc[16], src[16], keep[16];
  fill_random(acc, sizeof acc, 1);
  fill_random(src, sizeof src, 2);
  memcpy(keep, acc, sizeof acc);
  mep__acc_combine((mep_dtype_t)9, MEP_SUM, acc, src, 4);
  mep__acc_combine(MEP_INT8, (mep_op_t)7, acc, src, 4);
  mep__acc_store(MEP_INT8, (mep_op_t)7, src, acc, 4, 2);
  mep__acc_load((mep_dtype_t)12, acc, src, 4);
  mep__acc_combine(MEP_BOOL, MEP_AVG, acc, src, 4);
  mep__acc_store(MEP_BOOL, MEP_AVG, src, acc, 4, 2);
  CHECK(memcmp(acc, keep, sizeof acc) == 0, "invalid pair wrote");
}

static void test_f16_exhaustive(void) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = mep__f16_to_f32((uint16_t)h);
    double want = dec_f16((uint16_t)h);
    if (is_nan16((uint16_t)h)) {
      CHECK(isnan(f), "f16 %#x -> %g, want NaN", h, (double)f);
    } else {
      CHECK((double)f == want && !signbit(f) == !signbit(want),
            "f16 %#x -> %a, want %a", h, (double)f, want);
    }
    uint16_t back = mep__f32_to_f16(f);
    CHECK(back == h, "f16 %#x -> %a -> %#x", h, (double)f, back);
  }
}

static void test_bf16_exhaustive(void) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = mep__bf16_to_f32((uint16_t)h);
    double want = dec_bf16((uint16_t)h);
    uint16_t back = mep__f32_to_bf16(f);
    if (is_nanb16((uint16_t)h)) {
      CHECK(isnan(f), "bf16 %#x -> %g, want NaN", h, (double)f);
      CHECK(back == (h | 0x40), "bf16 NaN %#x -> %#x, want it quiet", h, back);
    } else {
      CHECK((double)f == want && !signbit(f) == !signbit(want),
            "bf16 %#x -> %a, want %a", h, (double)f, want);
      CHECK(back == h, "bf16 %#x -> %a -> %#x", h, (double)f, back);
    }
  }
}

/* One float against both references. */
static void check_round(float f) {
  uint16_t h = mep__f32_to_f16(f), hr = round_f16(f);
  uint16_t b = mep__f32_to_bf16(f), br = round_bf16(f);
  if (isnan(f)) {
    CHECK(is_nan16(h), "f32 NaN %#x -> f16 %#x, not NaN", fbits(f), h);
    CHECK(is_nanb16(b) && (b & 0x40), "f32 NaN %#x -> bf16 %#x, not qNaN",
          fbits(f), b);
    return;
  }
  CHECK(h == hr, "f32 %a (%#x) -> f16 %#x, want %#x", (double)f, fbits(f), h,
        hr);
  CHECK(b == br, "f32 %a (%#x) -> bf16 %#x, want %#x", (double)f, fbits(f),
        b, br);
}

/* A float and its neighbours one ulp either side. */
static void check_round_near(float f) {
  check_round(f);
  check_round(nextafterf(f, INFINITY));
  check_round(nextafterf(f, -INFINITY));
}

static void test_rounding(void) {
  long n = 0;
  /* Any bit pattern: all exponents, f32 subnormals, NaNs, infinities. */
  for (int i = 0; i < 1500000; i++, n++) check_round(bitsf((uint32_t)rnd()));
  /* Exponents around the float16 range, where the rounding happens. */
  for (int i = 0; i < 1500000; i++, n++) {
    uint32_t e = 127 - 28 + rnd_below(28 + 18);
    uint32_t u = (uint32_t)rnd();
    check_round(bitsf((u & 0x807fffffu) | e << 23));
  }
  /* Exact midpoints between neighbouring float16 values (incl. the one
   * between 65504 and the overflow, and half the smallest subnormal), and
   * a float ulp either side: ties must go to the even pattern. */
  for (int p = 0; p + 1 < N16; p++, n += 6) {
    float mid = (float)((tab16[p] + tab16[p + 1]) / 2);
    CHECK((double)mid == (tab16[p] + tab16[p + 1]) / 2, "f16 midpoint exact");
    check_round_near(mid);
    check_round_near(-mid);
  }
  for (int i = 0; i < 200000; i++, n += 3) {
    uint32_t p = (uint32_t)rnd() & 0xffff7fffu; /* not the inf/nan tail */
    check_round_near(bitsf((p & 0xffff0000u) | 0x8000u));
  }
  static const float edges[] = {0.0f,       -0.0f,        65504.0f,
                                65519.996f, 65520.0f,     65536.0f,
                                1e10f,      0x1p-24f,     0x1p-25f,
                                0x1p-26f,   0x1.8p-25f,   0x1p-14f,
                                FLT_MAX,    FLT_MIN,      0x1p-149f,
                                INFINITY,   -INFINITY,    3.3895314e38f};
  for (size_t i = 0; i < sizeof edges / sizeof *edges; i++, n += 6) {
    check_round_near(edges[i]);
    check_round_near(-edges[i]);
  }
  /* Hand-checked anchors, in case both the table and the code were wrong
   * the same way. */
  CHECK(mep__f32_to_f16(65520.0f) == 0x7c00, "65520 overflows");
  CHECK(mep__f32_to_f16(65519.0f) == 0x7bff, "65519 -> 65504");
  CHECK(mep__f32_to_f16(0x1p-25f) == 0x0000, "2^-25 ties to 0");
  CHECK(mep__f32_to_f16(0x1.8p-25f) == 0x0001, "1.5*2^-25 -> 2^-24");
  CHECK(mep__f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "1+2^-11 ties down");
  CHECK(mep__f32_to_f16(1.0f + 0x3p-11f) == 0x3c02, "1+3*2^-11 ties up");
  CHECK(mep__f32_to_f16(-2.0f) == 0xc000, "-2");
  CHECK(mep__f32_to_bf16(FLT_MAX) == 0x7f80, "FLT_MAX rounds to inf");
  CHECK(mep__f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "bf16 tie down");
  CHECK(mep__f32_to_bf16(1.0f + 0x3p-8f) == 0x3f82, "bf16 tie up");
  printf("rounding: %ld floats checked against the table reference\n", n);
}

/* ------------------------------------------------------- reductions */

enum { MAX_RANKS = 7 };
static const size_t lengths[] = {0, 1, 7, 1000, 4097};

/* A random element of dtype at p. `special` mixes in NaN, infinities and
 * zeros for the float types. Ranges keep float32/float64 sums and products
 * far from overflow and underflow, so their error bound holds. */
static void gen(mep_dtype_t dt, int special, uint8_t *p) {
  uint64_t r = rnd();
  uint32_t pick = (uint32_t)(r >> 56); /* 0..255 */
  switch (dt) {
  case MEP_FLOAT16:
  case MEP_BFLOAT16: {
    uint16_t h;
    int f16 = dt == MEP_FLOAT16;
    if (pick < 200) { /* moderate: |v| in [2^-6, 2^8) */
      uint32_t e = (f16 ? 15 : 127) - 6 + (uint32_t)(r % 14);
      h = (uint16_t)(((r >> 8) & (f16 ? 0x83ff : 0x807f)) | e << (f16 ? 10 : 7));
    } else { /* any finite pattern, subnormals included */
      h = (uint16_t)(r >> 8);
      if (f16 ? (h & 0x7c00) == 0x7c00 : (h & 0x7f80) == 0x7f80)
        h &= f16 ? 0xbbff : 0xbf7f;
    }
    if (special && pick >= 245) {
      static const uint16_t s16[] = {0x7e00, 0xfc01, 0x7c00, 0xfc00, 0x0000,
                                     0x8000, 0x7d00, 0x0001, 0x8001, 0x7bff,
                                     0xfbff};
      static const uint16_t sb[] = {0x7fc0, 0xff81, 0x7f80, 0xff80, 0x0000,
                                    0x8000, 0x7fa0, 0x0001, 0x8001, 0x7f7f,
                                    0xff7f};
      h = (f16 ? s16 : sb)[pick - 245];
    }
    memcpy(p, &h, 2);
    return;
  }
  case MEP_FLOAT32:
  case MEP_FLOAT64: {
    double v = ldexp((double)((r >> 11) & 0xffffff) / 0x1p24 + 1.0,
                     (int)(r % 14) - 6);
    if (r & (1ull << 10)) v = -v;
    if (special && pick >= 248) {
      static const double s[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0,
                                 1.0, -1.0};
      v = s[pick - 248];
    }
    if (dt == MEP_FLOAT32) {
      float f = (float)v;
      memcpy(p, &f, 4);
    } else {
      v += (double)((r >> 35) & 0xfffff) * 0x1p-60 * v; /* use low bits */
      memcpy(p, &v, 8);
    }
    return;
  }
  case MEP_BOOL:
    /* half false; true as assorted nonzero bytes, not just 1 */
    *p = (r & 1) ? 0 : (uint8_t)(1 + ((r >> 8) % 255));
    return;
  default:
    memcpy(p, &r, mep_dtype_size(dt)); /* any bits: wrapping is tested */
    return;
  }
}

/* Integer decoding into int64 (uint8 zero-extended). */
static int64_t dec_int(mep_dtype_t dt, const uint8_t *p) {
  switch (dt) {
  case MEP_INT8: { int8_t v; memcpy(&v, p, 1); return v; }
  case MEP_UINT8: return *p;
  case MEP_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
  default: { int64_t v; memcpy(&v, p, 8); return v; }
  }
}

/* v reduced modulo 2^(8*size), read back as the dtype (sign-extended for
 * the signed ones). */
static int64_t wrap_int(mep_dtype_t dt, uint64_t v) {
  switch (dt) {
  case MEP_INT8: {
    uint8_t u = (uint8_t)(v & 0xffu);
    int8_t s;
    memcpy(&s, &u, 1);
    return s;
  }
  case MEP_UINT8: return (int64_t)(v & 0xffu);
  case MEP_INT32: {
    uint32_t u = (uint32_t)(v & 0xffffffffu);
    int32_t s;
    memcpy(&s, &u, 4);
    return s;
  }
  default: {
    int64_t s;
    memcpy(&s, &v, 8);
    return s;
  }
  }
}

static int64_t ref_int(mep_dtype_t dt, mep_op_t op, const int64_t *x, int k) {
  uint64_t acc;
  switch (op) {
  case MEP_SUM:
  case MEP_AVG:
    acc = 0;
    for (int r = 0; r < k; r++) acc += (uint64_t)x[r];
    break;
  case MEP_PROD:
    acc = 1;
    for (int r = 0; r < k; r++) acc *= (uint64_t)x[r];
    break;
  case MEP_MIN:
  case MEP_MAX: {
    int64_t m = x[0];
    for (int r = 1; r < k; r++)
      if (op == MEP_MIN ? x[r] < m : x[r] > m) m = x[r];
    return m;
  }
  default: CHECK(0, "op"); return 0;
  }
  int64_t s = wrap_int(dt, acc);
  if (op != MEP_AVG) return s;
  /* Truncation toward zero, on magnitudes. */
  uint64_t mag = s < 0 ? 0 - (uint64_t)s : (uint64_t)s;
  uint64_t q = mag / (uint64_t)k;
  return s < 0 ? wrap_int(MEP_INT64, 0 - q) : (int64_t)q;
}

/* The reference minimum / maximum: NaN if any input is; otherwise the first
 * rank's value among the extreme ones. */
static double ref_minmax(mep_op_t op, const double *x, int k) {
  double m = x[0];
  for (int r = 0; r < k; r++)
    if (isnan(x[r])) return NAN;
  for (int r = 1; r < k; r++)
    if (op == MEP_MIN ? x[r] < m : x[r] > m) m = x[r];
  return m;
}

static int same_double(double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  return a == b && !signbit(a) == !signbit(b);
}

/* float16/bfloat16: float accumulation in rank order, one rounding. */
static void check_half(mep_dtype_t dt, mep_op_t op, const double *x, int k,
                       const uint8_t *got, size_t i) {
  int f16 = dt == MEP_FLOAT16;
  uint16_t h;
  memcpy(&h, got, 2);
  double v;
  if (op == MEP_MIN || op == MEP_MAX) {
    v = ref_minmax(op, x, k);
  } else {
    float a = (float)x[0];
    for (int r = 1; r < k; r++)
      a = op == MEP_PROD ? a * (float)x[r] : a + (float)x[r];
    if (op == MEP_AVG) a = a / (float)k;
    v = a;
  }
  uint16_t want = f16 ? round_f16(v) : round_bf16(v);
  if (isnan(v))
    CHECK(f16 ? is_nan16(h) : is_nanb16(h), "%s %s k=%d [%zu]: %#x, want NaN",
          mep_dtype_name(dt), mep_op_name(op), k, i, h);
  else
    CHECK(h == want, "%s %s k=%d [%zu]: %#x, want %#x (%a)",
          mep_dtype_name(dt), mep_op_name(op), k, i, h, want, v);
}

/* float32 against double, float64 against long double. The bound: each of
 * the k-1 roundings of a sum errs by at most half an ulp of a partial sum,
 * itself at most sum|x|; so |err| <= (k-1) * eps/2 * sum|x| < k * eps *
 * sum|x|. A product's k-1 roundings give a relative error below
 * (1+eps/2)^(k-1) - 1 < k * eps. avg adds one division (eps/2 relative).
 * min and max do no arithmetic and must be exact. */
static void check_wide(mep_dtype_t dt, mep_op_t op, const long double *x,
                       int k, const uint8_t *got, size_t i) {
  int f32 = dt == MEP_FLOAT32;
  long double g;
  if (f32) {
    float f;
    memcpy(&f, got, 4);
    g = f;
  } else {
    double d;
    memcpy(&d, got, 8);
    g = d;
  }
  long double eps = f32 ? FLT_EPSILON : DBL_EPSILON;
  long double want, tol;
  if (op == MEP_MIN || op == MEP_MAX) {
    double xd[MAX_RANKS];
    for (int r = 0; r < k; r++) xd[r] = (double)x[r];
    double m = ref_minmax(op, xd, k);
    CHECK(same_double((double)g, m), "%s %s k=%d [%zu]: %La, want %a",
          mep_dtype_name(dt), mep_op_name(op), k, i, g, m);
    return;
  }
  if (op == MEP_PROD) {
    want = 1;
    for (int r = 0; r < k; r++) want *= x[r];
    tol = k * eps * fabsl(want);
  } else {
    long double abs = 0;
    want = 0;
    for (int r = 0; r < k; r++) {
      want += x[r];
      abs += fabsl(x[r]);
    }
    tol = k * eps * abs;
    if (op == MEP_AVG) {
      want /= k;
      tol = tol / k + eps * fabsl(want);
    }
  }
  if (!isfinite(want)) {
    CHECK(same_double((double)g, (double)want),
          "%s %s k=%d [%zu]: %La, want %La", mep_dtype_name(dt),
          mep_op_name(op), k, i, g, want);
    return;
  }
  CHECK(isfinite(g) && fabsl(g - want) <= tol,
        "%s %s k=%d [%zu]: %La, want %La within %La", mep_dtype_name(dt),
        mep_op_name(op), k, i, g, want, tol);
}

static void check_elem(mep_dtype_t dt, mep_op_t op, uint8_t *const *src,
                       int k, const uint8_t *got, size_t i) {
  size_t es = mep_dtype_size(dt);
  switch (dt) {
  case MEP_FLOAT16:
  case MEP_BFLOAT16: {
    double x[MAX_RANKS];
    for (int r = 0; r < k; r++) {
      uint16_t h;
      memcpy(&h, src[r] + i * es, 2);
      x[r] = dt == MEP_FLOAT16 ? dec_f16(h) : dec_bf16(h);
    }
    check_half(dt, op, x, k, got, i);
    return;
  }
  case MEP_FLOAT32:
  case MEP_FLOAT64: {
    long double x[MAX_RANKS];
    for (int r = 0; r < k; r++) {
      if (dt == MEP_FLOAT32) {
        float f;
        memcpy(&f, src[r] + i * es, 4);
        x[r] = f;
      } else {
        double d;
        memcpy(&d, src[r] + i * es, 8);
        x[r] = d;
      }
    }
    check_wide(dt, op, x, k, got, i);
    return;
  }
  case MEP_BOOL: {
    int any = 0, all = 1;
    for (int r = 0; r < k; r++) {
      any |= src[r][i] != 0;
      all &= src[r][i] != 0;
    }
    int want = (op == MEP_SUM || op == MEP_MAX) ? any : all;
    CHECK(got[0] == want, "bool %s k=%d [%zu]: %u, want %d", mep_op_name(op),
          k, i, got[0], want);
    return;
  }
  default: {
    int64_t x[MAX_RANKS];
    for (int r = 0; r < k; r++) x[r] = dec_int(dt, src[r] + i * es);
    int64_t want = ref_int(dt, op, x, k), g = dec_int(dt, got);
    CHECK(g == want, "%s %s k=%d [%zu]: %lld, want %lld", mep_dtype_name(dt),
          mep_op_name(op), k, i, (long long)g, (long long)want);
    return;
  }
  }
}

/* A buffer of len bytes at an odd offset, with guard bytes around it. */
typedef struct {
  uint8_t *base, *p;
  size_t off, len;
} gbuf_t;

enum { GUARD = 16 };

static gbuf_t gbuf(size_t len) {
  gbuf_t b;
  b.off = 1 + 2 * rnd_below(4) + GUARD; /* odd, so never aligned */
  b.len = len;
  b.base = malloc(len + b.off + GUARD);
  CHECK(b.base != NULL, "malloc");
  memset(b.base, 0xa5, len + b.off + GUARD);
  b.p = b.base + b.off;
  return b;
}

static void gbuf_check(const gbuf_t *b, const char *what) {
  for (size_t i = 0; i < b->off; i++)
    CHECK(b->base[i] == 0xa5, "%s: byte %zu before the buffer written", what,
          b->off - i);
  for (size_t i = 0; i < GUARD; i++)
    CHECK(b->p[b->len + i] == 0xa5, "%s: byte %zu past the buffer written",
          what, i);
}

/* copy: start the accumulator as a plain copy of rank 0's data, which
 * reduce.h allows when the accumulator has the dtype's size. */
static void run_case(mep_dtype_t dt, mep_op_t op, int k, size_t n,
                     int special, int in_place, int copy) {
  size_t es = mep_dtype_size(dt), as = mep__acc_size(dt);
  gbuf_t src[MAX_RANKS];
  uint8_t *sp[MAX_RANKS];
  for (int r = 0; r < k; r++) {
    src[r] = gbuf(n * es);
    sp[r] = src[r].p;
    for (size_t i = 0; i < n; i++) gen(dt, special, src[r].p + i * es);
  }
  gbuf_t acc = gbuf(n * as);
  gbuf_t dst = in_place ? acc : gbuf(n * es);
  if (copy)
    memcpy(acc.p, src[0].p, n * es);
  else
    mep__acc_load(dt, acc.p, src[0].p, n);
  for (int r = 1; r < k; r++) mep__acc_combine(dt, op, acc.p, src[r].p, n);
  mep__acc_store(dt, op, acc.p, dst.p, n, k);
  for (size_t i = 0; i < n; i++) check_elem(dt, op, sp, k, dst.p + i * es, i);
  gbuf_check(&acc, "acc");
  if (!in_place) gbuf_check(&dst, "dst");
  for (int r = 0; r < k; r++) free(src[r].base);
  free(acc.base);
  if (!in_place) free(dst.base);
}

/* Runs fn on every (dtype, op) pair mep__reduce_check accepts; the sum of
 * the cases it ran. */
static long each_pair(long (*fn)(mep_dtype_t dt, mep_op_t op)) {
  long cases = 0;
  for (int d = 0; d < MEP_DTYPE_COUNT; d++)
    for (int o = 0; o < MEP_OP_COUNT; o++)
      if (mep__reduce_check((mep_dtype_t)d, (mep_op_t)o) == MEP_OK)
        cases += fn((mep_dtype_t)d, (mep_op_t)o);
  return cases;
}

static long reductions_of(mep_dtype_t dt, mep_op_t op) {
  long cases = 0;
  int can_in_place = mep__acc_size(dt) == mep_dtype_size(dt);
  for (int k = 1; k <= MAX_RANKS; k++)
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
      int special = dt <= MEP_FLOAT64 && (k + (int)li) % 2 == 0;
      int in_place = can_in_place && (k + (int)li) % 3 == 0;
      int copy = can_in_place && (k + (int)li) % 2 == 1;
      run_case(dt, op, k, lengths[li], special, in_place, copy);
      cases++;
    }
  return cases;
}

static void test_reductions(void) {
  printf("reductions: %ld cases (dtype x op x ranks x length) match\n",
         each_pair(reductions_of));
}

/* The fused steps (mep__reduce_pair, mep__acc_load_pair,
 * mep__acc_combine_store) against the steps one by one on the same
 * inputs, bit for bit, at lengths around their block (8 KiB of
 * accumulator: 1024 to 8192 elements); reduce_pair also in place over
 * either input. */
static void run_fused(mep_dtype_t dt, mep_op_t op, int k, size_t n,
                      int special, int alias) {
  size_t es = mep_dtype_size(dt), as = mep__acc_size(dt);
  gbuf_t src[MAX_RANKS] = {{0}};
  for (int r = 0; r < k; r++) {
    src[r] = gbuf(n * es);
    for (size_t i = 0; i < n; i++) gen(dt, special, src[r].p + i * es);
  }
  gbuf_t acc = gbuf(n * as), want = gbuf(n * es), got = gbuf(n * es);
  mep__acc_load(dt, acc.p, src[0].p, n);
  for (int r = 1; r < k; r++) mep__acc_combine(dt, op, acc.p, src[r].p, n);
  mep__acc_store(dt, op, acc.p, want.p, n, k);
  if (k == 2 && alias) {
    uint8_t *in = src[alias - 1].p;
    mep__reduce_pair(dt, op, in, src[0].p, src[1].p, n, k);
    CHECK(memcmp(in, want.p, n * es) == 0, "%s %s reduce_pair over input "
          "%d, n %zu", mep_dtype_name(dt), mep_op_name(op), alias - 1, n);
  } else if (k == 2) {
    mep__reduce_pair(dt, op, got.p, src[0].p, src[1].p, n, k);
  } else {
    mep__acc_load_pair(dt, op, acc.p, src[0].p, src[1].p, n);
    for (int r = 2; r < k - 1; r++)
      mep__acc_combine(dt, op, acc.p, src[r].p, n);
    mep__acc_combine_store(dt, op, acc.p, src[k - 1].p, got.p, n, k);
  }
  if (!(k == 2 && alias))
    CHECK(memcmp(got.p, want.p, n * es) == 0, "%s %s k=%d n %zu: fused "
          "differs", mep_dtype_name(dt), mep_op_name(op), k, n);
  gbuf_check(&acc, "acc");
  gbuf_check(&got, "fused dst");
  for (int r = 0; r < k; r++) {
    gbuf_check(&src[r], "input");
    free(src[r].base);
  }
  free(acc.base);
  free(want.base);
  free(got.base);
}

static long fused_of(mep_dtype_t dt, mep_op_t op) {
  static const size_t lens[] = {0, 1, 7, 1023, 1024, 1025, 2047, 2048,
                                2049, 8191, 8192, 8193, 20001};
  static const int ks[] = {2, 3, 5};
  long cases = 0;
  for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
      int special = dt <= MEP_FLOAT64 && li % 2 == 0;
      run_fused(dt, op, ks[ki], lens[li], special, 0);
      if (ks[ki] == 2) {
        run_fused(dt, op, 2, lens[li], special, 1);
        run_fused(dt, op, 2, lens[li], special, 2);
      }
      cases++;
    }
  return cases;
}

static void test_fused(void) {
  printf("fused reductions: %ld cases match the steps one by one\n",
         each_pair(fused_of));
}

/* Fixed cases whose answers are known without any reference code. */
static void test_fixed(void) {
  /* Float min/max propagate NaN from either side; sum of opposite
   * infinities is NaN. */
  float a[4] = {NAN, 1.0f, -INFINITY, 3.0f};
  float b[4] = {2.0f, NAN, NAN, INFINITY};
  float acc[4], out[4];
  for (int op = MEP_MIN; op <= MEP_MAX; op++) {
    mep__acc_load(MEP_FLOAT32, acc, a, 4);
    mep__acc_combine(MEP_FLOAT32, (mep_op_t)op, acc, b, 4);
    mep__acc_store(MEP_FLOAT32, (mep_op_t)op, acc, out, 4, 2);
    CHECK(isnan(out[0]) && isnan(out[1]) && isnan(out[2]), "NaN %s",
          mep_op_name((mep_op_t)op));
    CHECK(out[3] == (op == MEP_MIN ? 3.0f : INFINITY), "inf %s",
          mep_op_name((mep_op_t)op));
  }
  float c[2] = {INFINITY, INFINITY}, d[2] = {-INFINITY, 1.0f};
  mep__acc_load(MEP_FLOAT32, acc, c, 2);
  mep__acc_combine(MEP_FLOAT32, MEP_SUM, acc, d, 2);
  mep__acc_store(MEP_FLOAT32, MEP_SUM, acc, out, 2, 2);
  CHECK(isnan(out[0]) && out[1] == INFINITY, "inf sums");

  /* bfloat16 NaN in min, float16 overflow at the store only. */
  uint16_t h1[2] = {0x7fc0, 0x7bff}, h2[2] = {0x3f80, 0x7bff}, ho[2];
  float hacc[2];
  mep__acc_load(MEP_BFLOAT16, hacc, h1, 1);
  mep__acc_combine(MEP_BFLOAT16, MEP_MIN, hacc, h2, 1);
  mep__acc_store(MEP_BFLOAT16, MEP_MIN, hacc, ho, 1, 2);
  CHECK(is_nanb16(ho[0]), "bf16 min NaN");
  mep__acc_load(MEP_FLOAT16, hacc, h1 + 1, 1);
  mep__acc_combine(MEP_FLOAT16, MEP_SUM, hacc, h2 + 1, 1);
  mep__acc_store(MEP_FLOAT16, MEP_AVG, hacc, ho, 1, 2);
  CHECK(ho[0] == 0x7bff, "f16 avg of 65504s, %#x", ho[0]); /* no overflow */
  mep__acc_store(MEP_FLOAT16, MEP_SUM, hacc, ho, 1, 2);
  CHECK(ho[0] == 0x7c00, "f16 sum of 65504s overflows, %#x", ho[0]);

  /* Integer avg truncates toward zero, negative sums too, after the sum
   * wrapped in the type's width. */
  int32_t i1[3] = {-7, 7, INT32_MAX}, i2[3] = {0, 0, 1}, io[3];
  mep__acc_load(MEP_INT32, io, i1, 3);
  mep__acc_combine(MEP_INT32, MEP_AVG, io, i2, 3);
  mep__acc_store(MEP_INT32, MEP_AVG, io, io, 3, 2);
  CHECK(io[0] == -3 && io[1] == 3, "int32 avg %d %d", io[0], io[1]);
  CHECK(io[2] == INT32_MIN / 2, "int32 avg of a wrapped sum %d", io[2]);
  int8_t c1[2] = {-100, -5}, c2[2] = {-100, 0}, co[2];
  mep__acc_load(MEP_INT8, co, c1, 2);
  mep__acc_combine(MEP_INT8, MEP_AVG, co, c2, 2);
  mep__acc_store(MEP_INT8, MEP_AVG, co, co, 2, 2);
  CHECK(co[0] == 28 && co[1] == -2, "int8 avg %d %d", co[0], co[1]);
  int64_t l1 = INT64_MIN, l2 = -1, lo;
  mep__acc_load(MEP_INT64, &lo, &l1, 1);
  mep__acc_combine(MEP_INT64, MEP_PROD, &lo, &l2, 1);
  CHECK(lo == INT64_MIN, "int64 prod wraps: %lld", (long long)lo);
  uint8_t u1 = 200, u2 = 100, uo;
  mep__acc_load(MEP_UINT8, &uo, &u1, 1);
  mep__acc_combine(MEP_UINT8, MEP_MAX, &uo, &u2, 1);
  CHECK(uo == 200, "uint8 max is unsigned: %u", uo);

  /* Float min/max ties, +0 against -0 included, keep the earlier rank's
   * value. */
  static const mep_dtype_t fts[] = {MEP_FLOAT16, MEP_BFLOAT16, MEP_FLOAT32,
                                    MEP_FLOAT64};
  for (size_t t = 0; t < 4; t++)
    for (int op = MEP_MIN; op <= MEP_MAX; op++)
      for (int first_neg = 0; first_neg < 2; first_neg++) {
        mep_dtype_t dt = fts[t];
        size_t es = mep_dtype_size(dt);
        uint8_t zp[8] = {0}, zn[8], res[8], zacc[8];
        uint16_t n16 = 0x8000;
        float n32 = -0.0f;
        double n64 = -0.0;
        memcpy(zn, es == 2 ? (void *)&n16 : es == 4 ? (void *)&n32 : &n64, es);
        mep__acc_load(dt, zacc, first_neg ? zn : zp, 1);
        mep__acc_combine(dt, (mep_op_t)op, zacc, first_neg ? zp : zn, 1);
        mep__acc_store(dt, (mep_op_t)op, zacc, res, 1, 2);
        CHECK(memcmp(res, first_neg ? zn : zp, es) == 0,
              "%s %s of %s0 and %s0 keeps the first", mep_dtype_name(dt),
              mep_op_name((mep_op_t)op), first_neg ? "-" : "+",
              first_neg ? "+" : "-");
      }

  /* bool: nonzero bytes are true, output is 0/1. */
  uint8_t b1[4] = {0, 7, 0, 255}, b2[4] = {0, 0, 9, 128}, bo[4], bacc[4];
  mep__acc_load(MEP_BOOL, bacc, b1, 4);
  mep__acc_combine(MEP_BOOL, MEP_SUM, bacc, b2, 4);
  mep__acc_store(MEP_BOOL, MEP_SUM, bacc, bo, 4, 2);
  CHECK(bo[0] == 0 && bo[1] == 1 && bo[2] == 1 && bo[3] == 1, "bool or");
  mep__acc_load(MEP_BOOL, bacc, b1, 4);
  mep__acc_combine(MEP_BOOL, MEP_MIN, bacc, b2, 4);
  mep__acc_store(MEP_BOOL, MEP_MIN, bacc, bo, 4, 2);
  CHECK(bo[0] == 0 && bo[1] == 0 && bo[2] == 0 && bo[3] == 1, "bool and");
  /* An accumulator copied raw (not loaded) still reads nonzero as true. */
  uint8_t raw[4] = {2, 0, 6, 128}, r2[4] = {1, 5, 0, 64};
  mep__acc_combine(MEP_BOOL, MEP_PROD, raw, r2, 4);
  mep__acc_store(MEP_BOOL, MEP_PROD, raw, bo, 4, 2);
  CHECK(bo[0] == 1 && bo[1] == 0 && bo[2] == 0 && bo[3] == 1, "raw bool and");
  uint8_t raw2[3] = {7, 0, 0}, r3[3] = {0, 0, 3};
  mep__acc_combine(MEP_BOOL, MEP_MAX, raw2, r3, 3);
  mep__acc_store(MEP_BOOL, MEP_MAX, raw2, raw2, 3, 2);
  CHECK(raw2[0] == 1 && raw2[1] == 0 && raw2[2] == 1, "raw bool or in place");
}

/* ------------------------------------------------- throughput (info) */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bench(mep_dtype_t dt) {
  size_t bytes = 4u << 20, n = bytes / mep_dtype_size(dt);
  uint8_t *src = malloc(bytes), *acc = malloc(n * mep__acc_size(dt));
  CHECK(src && acc, "malloc");
  for (size_t i = 0; i < n; i++) gen(dt, 0, src + i * mep_dtype_size(dt));
  mep__acc_load(dt, acc, src, n);
  int reps = 0;
  double t0 = now_s(), t;
  do {
    mep__acc_combine(dt, MEP_SUM, acc, src, n);
    reps++;
    t = now_s() - t0;
  } while (t < 0.2);
  printf("combine %s sum, 4 MiB of input: %.2f GB/s of input "
         "(%.2f GB/s moved: input + accumulator read and written)\n",
         mep_dtype_name(dt), (double)bytes * reps / t / 1e9,
         (double)(bytes + 2 * n * mep__acc_size(dt)) * reps / t / 1e9);
  free(src);
  free(acc);
}

int main(int argc, char **argv) {
  if (argc > 1) g_seed = strtoull(argv[1], NULL, 0);
  printf("seed %#llx\n", (unsigned long long)g_seed);
  build_tables();
  test_names();
  test_check();
  test_f16_exhaustive();
  test_bf16_exhaustive();
  test_rounding();
  test_fixed();
  test_reductions();
  test_fused();
  bench(MEP_FLOAT32);
  bench(MEP_BFLOAT16);
  printf("ok\n");
  return 0;
}
