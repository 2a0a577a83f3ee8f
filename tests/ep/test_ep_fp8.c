/* test_ep_fp8: the host conversions of ep_fp8.c against brute force, and
 * the FP8 scales and codes against DeepEP's formula (written here from it).
 * The e4m3 values are derived here from the format's definition (1 sign, 4
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

/* DeepEP's FP8 scales, written here from its formula (calculate_fp8_scales
 * in its kernels' utils): amax floored by a 1e-4 margin; scale_inv = amax *
 * (1 / 448.f) and scale = 448.f / amax, each one float operation rounded to
 * nearest; with round_scale, e = ceil(log2(amax * (1 / 448.f))) (a float's
 * exponent, plus one when mantissa bits are set), scale = 2^-e, scale_inv =
 * 2^e. Computed in double and rounded once to float, which gives the same
 * bits as the float operations (a product of two floats is exact in double;
 * double's 53 bits make the double rounding of a quotient harmless). */
static void deepep_scales(float amax, int round_scale, float *scale,
                          float *inv) {
  double a = amax > 1e-4f ? amax : 1e-4f;
  const float inv448 = (float)(1.0 / 448.0);
  if (!round_scale) {
    *inv = (float)(a * (double)inv448);
    *scale = (float)(448.0 / a);
    return;
  }
  float t = (float)(a * (double)inv448);
  int e;
  double m = frexp(t, &e); /* t = m * 2^e, m in [0.5, 1) */
  int ceil_log2 = m == 0.5 ? e - 1 : e;
  *scale = (float)ldexp(1.0, -ceil_log2);
  *inv = (float)ldexp(1.0, ceil_log2);
}

static void test_scales(void) {
  float sc, inv, rs, rinv;
  mep__ep_fp8_scales(0.0f, 0, &sc, &inv);
  EXPECT(inv == 1e-4f * (1.0f / 448.0f) && sc == 448.0f / 1e-4f, "floor");
  mep__ep_fp8_scales(448.0f, 0, &sc, &inv);
  EXPECT(inv == 1.0f && sc == 1.0f, "448 -> 1");
  for (int i = 0; i < 200000; i++) {
    float amax = (float)ldexp((double)(next() & 0xffffff) / 0x1p24,
                              (int)(next() % 48) - 24);
    float want_s, want_inv;
    for (int round = 0; round < 2; round++) {
      deepep_scales(amax, round, &want_s, &want_inv);
      mep__ep_fp8_scales(amax, round, &sc, &inv);
      EXPECT(sc == want_s && inv == want_inv, "scales of %a (round %d): "
             "%a %a, DeepEP's %a %a", amax, round, sc, inv, want_s,
             want_inv);
    }
    mep__ep_fp8_scales(amax, 1, &rs, &rinv);
    mep__ep_fp8_scales(amax, 0, &sc, &inv);
    int e;
    EXPECT(frexpf(rinv, &e) == 0.5f && rs * rinv == 1.0f,
           "round scale %g is not a power of 2", rinv);
    EXPECT(rinv >= inv && rinv < 2 * inv, "round scale %g of %g", rinv, inv);
    uint8_t u = mep__ep_scale_to_ue8m0(rinv);
    EXPECT(u == e - 1 + 127, "ue8m0 of %g is %d, want %d", rinv, u,
           e - 1 + 127);
    EXPECT(mep__ep_ue8m0_to_scale(u) == rinv, "ue8m0 %d back to %g", u, rinv);
  }
  mep__ep_fp8_scales(0.5f * 448, 1, &rs, &rinv);
  EXPECT(rinv == 0.5f && rs == 2.0f, "exact power stays");
}

static void test_quantize(void) {
  enum { H = 512 };
  uint16_t x[H];
  uint8_t codes[H];
  float s[H / 128];
  for (int rs = 0; rs < 2; rs++)
    for (int it = 0; it < 400; it++) {
      for (int i = 0; i < H; i++) {
        double v = ((double)(next() % 2000000) / 1e6 - 1.0) *
                   ldexp(1, (int)(it % 40) - 25);
        x[i] = mep__ep_float_to_bf16((float)v);
      }
      mep__ep_quantize_row(x, H, rs, codes, s);
      for (int g = 0; g < H / 128; g++) {
        double amax = 0;
        for (int i = 0; i < 128; i++)
          amax = fmax(amax, fabs(mep__ep_bf16_to_float(x[g * 128 + i])));
        float scale, inv;
        deepep_scales((float)amax, rs, &scale, &inv);
        EXPECT(s[g] == inv, "group scale %a, DeepEP's %a", s[g], inv);
        for (int i = 0; i < 128; i++) {
          int h = g * 128 + i;
          double xv = mep__ep_bf16_to_float(x[h]);
          /* DeepEP codes x * scale, a float product rounded once */
          EXPECT(codes[h] == nearest((float)(xv * scale)), "code of %g", xv);
          /* the round trip error: half an e4m3 step relative to the value,
           * or half the smallest subnormal step relative to amax / 448 */
          double back = value[codes[h]] * s[g];
          EXPECT(fabs(back - xv) <= fabs(xv) / 16 + s[g] * 0x1p-9,
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
