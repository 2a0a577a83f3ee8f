/* test_ep_fp8: the host conversions of ep_fp8.c against brute force. The
 * e4m3 values are derived here from the format's definition (1 sign, 4
 * exponent bits of bias 7, 3 mantissa bits, S.1111.111 NaN, no infinities)
 * and every encoding is compared with the nearest of all 256 codes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_fp8.h"

static int failures;
#define EXPECT(cond, ...)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      if (failures++ < 20) {                                                \
        fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
        fprintf(stderr, __VA_ARGS__);                                         \
        fprintf(stderr, "\n");                                                \
      }                                                                       \
    }                                                                         \
  } while (0)

static double value[256]; /* NAN for the two NaN codes */

static void make_table(void) {
  for (int c = 0; c < 256; c++) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? m / 8.0 * pow(2, -6) : (1 + m / 8.0) * pow(2, e - 7);
    if (e == 15 && m == 7) v = NAN;
    value[c] = s ? -v : v;
  }
}

/* The code __NV_SATFINITE e4m3 conversion gives: the nearest finite value
 * (|v| > 448 saturates), ties to the even code, the sign kept for zero. */
static int nearest(double v) {
  if (isnan(v)) return 0x7f;
  int sign = signbit(v) ? 0x80 : 0;
  double a = fabs(v);
  if (a > 448) return sign | 0x7e;
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c <= 0x7e; c++) {
    double d = fabs(value[c] - a);
    if (d < bd || (d == bd && (c & 1) == 0)) {
      best = c;
      bd = d;
    }
  }
  return sign | best;
}

static uint64_t rng = 0x1234567;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void test_decode(void) {
  for (int c = 0; c < 256; c++) {
    float got = mep__ep_e4m3_to_float((uint8_t)c);
    if (isnan(value[c]))
      EXPECT(isnan(got), "code 0x%02x decodes to %g, want NaN", c, got);
    else
      EXPECT(got == (float)value[c] && !signbit(got) == !signbit(value[c]),
             "code 0x%02x decodes to %g, want %g", c, got, value[c]);
  }
  EXPECT(mep__ep_e4m3_to_float(0x7e) == 448.0f, "largest");
  EXPECT(mep__ep_e4m3_to_float(0x01) == 0x1p-9f, "smallest subnormal");
  EXPECT(mep__ep_e4m3_to_float(0x38) == 1.0f, "one");
}

static void check_encode(float v) {
  int want = nearest(v), got = mep__ep_float_to_e4m3(v);
  EXPECT(got == want, "%.9g encodes to 0x%02x, want 0x%02x", v, got, want);
}

static void test_encode(void) {
  /* every code, every midpoint between neighbours (ties) and the floats
   * just beside them */
  for (int c = 0; c < 0x7f; c++) {
    float v = (float)value[c];
    check_encode(v);
    check_encode(-v);
    if (c < 0x7e) {
      float mid = (float)((value[c] + value[c + 1]) / 2);
      float f[3] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
      for (int i = 0; i < 3; i++) {
        check_encode(f[i]);
        check_encode(-f[i]);
      }
    }
  }
  /* ties: 0.5 * 2^-9 goes to 0, 1.5 * 2^-9 to 2 * 2^-9 */
  EXPECT(mep__ep_float_to_e4m3(0x1p-10f) == 0x00, "tie to zero");
  EXPECT(mep__ep_float_to_e4m3(0x3p-10f) == 0x02, "tie to even subnormal");
  /* 1 + 1/16 lies between 1 (0x38) and 1.125 (0x39): even is 0x38 */
  EXPECT(mep__ep_float_to_e4m3(1.0625f) == 0x38, "tie to even normal");
  EXPECT(mep__ep_float_to_e4m3(1.1875f) == 0x3a, "tie up to even");
  /* saturation and specials */
  float sat[] = {448.5f, 463.9f, 464.0f, 480.0f, 1e6f, 3.4e38f, INFINITY};
  for (size_t i = 0; i < sizeof sat / sizeof *sat; i++) {
    EXPECT(mep__ep_float_to_e4m3(sat[i]) == 0x7e, "%g saturates", sat[i]);
    EXPECT(mep__ep_float_to_e4m3(-sat[i]) == 0xfe, "-%g saturates", sat[i]);
  }
  EXPECT(mep__ep_float_to_e4m3(NAN) == 0x7f, "NaN");
  EXPECT((mep__ep_float_to_e4m3(-NAN) & 0x7f) == 0x7f, "-NaN");
  EXPECT(mep__ep_float_to_e4m3(-0.0f) == 0x80, "-0");
  EXPECT(mep__ep_float_to_e4m3(1e-30f) == 0x00, "tiny");
  /* random floats over the whole range */
  for (int i = 0; i < 200000; i++) {
    uint64_t r = next();
    float v = (float)ldexp((double)(r & 0xffffff) / 0x1p24,
                           (int)((r >> 24) % 40) - 20);
    check_encode((r >> 40) & 1 ? -v : v);
  }
}

static void test_bf16(void) {
  for (int i = 0; i < 65536; i++) {
    float f = mep__ep_bf16_to_float((uint16_t)i);
    uint32_t u;
    memcpy(&u, &f, 4);
    EXPECT(u == (uint32_t)i << 16, "bf16 0x%04x widens to 0x%08x", i, u);
    if (!isnan(f))
      EXPECT(mep__ep_float_to_bf16(f) == i, "bf16 0x%04x round trip", i);
  }
  for (int i = 0; i < 200000; i++) {
    uint32_t u = (uint32_t)next();
    float f;
    memcpy(&f, &u, 4);
    if (isnan(f)) {
      EXPECT(isnan(mep__ep_bf16_to_float(mep__ep_float_to_bf16(f))), "NaN");
      continue;
    }
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dlo = fabs((double)mep__ep_bf16_to_float(lo) - f);
    /* past the largest bf16 the next value would be 2^128 */
    double vhi = (hi & 0x7fff) == 0x7f80 ? copysign(0x1p128, f)
                                         : mep__ep_bf16_to_float(hi);
    double dhi = fabs(vhi - f);
    uint16_t want = dlo < dhi || (dlo == dhi && !(lo & 1)) ? lo : hi;
    if ((u & 0xffff) == 0) want = lo;
    EXPECT(mep__ep_float_to_bf16(f) == want, "%.9g to bf16 0x%04x, want "
           "0x%04x", f, mep__ep_float_to_bf16(f), want);
  }
}

static void test_scales(void) {
  EXPECT(mep__ep_fp8_scale(0.0f, 0) == 1e-4f / 448.0f, "amax floor");
  EXPECT(mep__ep_fp8_scale(448.0f, 0) == 1.0f, "448 -> 1");
  for (int i = 0; i < 100000; i++) {
    float amax = (float)ldexp((double)(next() & 0xffffff) / 0x1p24,
                              (int)(next() % 40) - 20);
    float raw = fmaxf(amax, 1e-4f) / 448.0f;
    EXPECT(mep__ep_fp8_scale(amax, 0) == raw, "scale of %g", amax);
    float r = mep__ep_fp8_scale(amax, 1);
    int e;
    EXPECT(frexpf(r, &e) == 0.5f, "round scale %g is not a power of 2", r);
    EXPECT(r >= raw && r < 2 * raw, "round scale %g of raw %g", r, raw);
    uint8_t u = mep__ep_scale_to_ue8m0(r);
    EXPECT(u == e - 1 + 127, "ue8m0 of %g is %d, want %d", r, u, e - 1 + 127);
    EXPECT(mep__ep_ue8m0_to_scale(u) == r, "ue8m0 %d back to %g", u, r);
  }
  EXPECT(mep__ep_fp8_scale(0.5f * 448, 1) == 0.5f, "exact power stays");
}

static void test_quantize(void) {
  enum { H = 512 };
  uint16_t x[H];
  uint8_t codes[H];
  float s[H / 128];
  for (int rs = 0; rs < 2; rs++)
    for (int it = 0; it < 200; it++) {
      for (int i = 0; i < H; i++) {
        double v = ((double)(next() % 2000000) / 1e6 - 1.0) *
                   ldexp(1, (int)(it % 30) - 15);
        x[i] = mep__ep_float_to_bf16((float)v);
      }
      mep__ep_quantize_row(x, H, rs, codes, s);
      for (int g = 0; g < H / 128; g++) {
        double amax = 0;
        for (int i = 0; i < 128; i++)
          amax = fmax(amax, fabs(mep__ep_bf16_to_float(x[g * 128 + i])));
        EXPECT(s[g] == mep__ep_fp8_scale((float)amax, rs), "group scale");
        for (int i = 0; i < 128; i++) {
          int h = g * 128 + i;
          double xv = mep__ep_bf16_to_float(x[h]);
          EXPECT(codes[h] == nearest((float)(xv / s[g])), "code of %g", xv);
          /* the round trip error: half an e4m3 step relative to the value,
           * or half the smallest subnormal step relative to amax / 448 */
          double back = value[codes[h]] * s[g];
          EXPECT(fabs(back - xv) <= fabs(xv) / 16 + s[g] * 0x1p-10,
                 "round trip of %g is %g (scale %g)", xv, back, s[g]);
        }
      }
    }
}

int main(void) {
  make_table();
  test_decode();
  test_encode();
  test_bf16();
  test_scales();
  test_quantize();
  if (failures) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("ep fp8: all checks passed\n");
  return 0;
}
