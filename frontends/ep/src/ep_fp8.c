/* ep_fp8.c - bf16 and e4m3 conversions and the FP8 scale rules (ep_fp8.h). */
#include "ep_fp8.h"

#include <math.h>
#include <string.h>

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float mep__ep_bf16_to_float(uint16_t b) {
  return bits_float((uint32_t)b << 16);
}

uint16_t mep__ep_float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x40u);
  /* adding 0x7fff plus the lowest kept bit rounds half to even */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

uint8_t mep__ep_float_to_e4m3(float v) {
  if (isnan(v)) return 0x7f;
  uint8_t sign = signbit(v) ? 0x80 : 0x00;
  float a = fabsf(v);
  if (a > MEP_EP_E4M3_MAX) return (uint8_t)(sign | 0x7e);
  if (a < 0x1p-6f) {
    /* subnormals (and zero) step by 2^-9; 8 steps is the smallest normal,
     * whose code is 8 too. Default rounding mode: ties to even. */
    return (uint8_t)(sign | (uint8_t)nearbyintf(a * 0x1p9f));
  }
  int e2;
  (void)frexpf(a, &e2);
  int e = e2 - 1; /* a = 1.m * 2^e, -6 <= e <= 8 */
  /* exact: a / 2^e is in [1, 2) and keeps a's 24 bits */
  int m = (int)nearbyintf((ldexpf(a, -e) - 1.0f) * 8.0f);
  if (m == 8) {
    m = 0;
    e++;
  }
  /* 448 = 1.75 * 2^8 is the largest finite; a <= 448 cannot round past */
  return (uint8_t)(sign | (uint8_t)((e + 7) << 3) | (uint8_t)m);
}

float mep__ep_e4m3_to_float(uint8_t code) {
  int exp = (code >> 3) & 0xf, man = code & 7;
  float s = (code & 0x80) ? -1.0f : 1.0f;
  if (exp == 0xf && man == 7) return NAN;
  if (exp == 0) return s * ldexpf((float)man, -9);
  return s * ldexpf(1.0f + (float)man / 8.0f, exp - 7);
}

/* 2^e for -126 <= e <= 127, from the bits. */
static float pow2(int e) { return bits_float((uint32_t)(e + 127) << 23); }

void mep__ep_fp8_scales(float amax, int round_scale, float *scale,
                        float *inv) {
  const float inv448 = 1.0f / MEP_EP_E4M3_MAX;
  amax = fmaxf(amax, MEP_EP_AMAX_MIN);
  if (!round_scale) {
    *inv = amax * inv448;
    *scale = MEP_EP_E4M3_MAX / amax;
    return;
  }
  uint32_t b = float_bits(amax * inv448);
  int e = (int)((b >> 23) & 0xffu) - 127 + ((b & 0x7fffffu) != 0);
  *scale = pow2(-e);
  *inv = pow2(e);
}

uint8_t mep__ep_scale_to_ue8m0(float scale) {
  return (uint8_t)((float_bits(scale) >> 23) & 0xffu);
}

float mep__ep_ue8m0_to_scale(uint8_t e) {
  return bits_float((uint32_t)e << 23);
}

void mep__ep_quantize_row(const uint16_t *x, int hidden, int round_scale,
                          uint8_t *codes, float *scales) {
  for (int g = 0; g < hidden / MEP_EP_FP8_GROUP; g++) {
    const uint16_t *in = x + g * MEP_EP_FP8_GROUP;
    float amax = 0.0f;
    for (int i = 0; i < MEP_EP_FP8_GROUP; i++)
      amax = fmaxf(amax, fabsf(mep__ep_bf16_to_float(in[i])));
    float scale, inv;
    mep__ep_fp8_scales(amax, round_scale, &scale, &inv);
    scales[g] = inv;
    for (int i = 0; i < MEP_EP_FP8_GROUP; i++)
      codes[g * MEP_EP_FP8_GROUP + i] =
          mep__ep_float_to_e4m3(mep__ep_bf16_to_float(in[i]) * scale);
  }
}
