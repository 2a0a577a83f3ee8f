/* ep_fp8.h - host conversions of the EP frontend: bf16 <-> float, float <->
 * fp8 e4m3 (the "fn" kind: no infinities, 0x7f/0xff are NaN, largest
 * finite 448) and the FP8 scale rules of ep.h. The CPU path quantises with
 * these; the tests use them as the reference of the CUDA kernels, so they
 * round exactly as CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE,
 * __NV_E4M3) and __float2bfloat16 do (round to nearest, ties to even). */
#ifndef MEP_EP_FP8_H
#define MEP_EP_FP8_H

#include <stdint.h>

#define MEP_EP_FP8_GROUP 128 /* channels per scale */
#define MEP_EP_UE8M0_PACK 4  /* exponents per int32 word */
#define MEP_EP_E4M3_MAX 448.0f
#define MEP_EP_AMAX_MIN 1e-4f

float mep__ep_bf16_to_float(uint16_t b);
/* Round to nearest even; NaN stays NaN (quiet). */
uint16_t mep__ep_float_to_bf16(float f);

/* Round to nearest even; |v| beyond 448 (infinities too) saturates to
 * +-448; NaN becomes 0x7f. */
uint8_t mep__ep_float_to_e4m3(float v);
float mep__ep_e4m3_to_float(uint8_t code);

/* The scales of a group whose largest magnitude is amax, computed as
 * DeepEP computes them, so that codes and scales are the same bits: amax
 * is floored at 1e-4; without round_scale, *inv = amax * (1/448) and
 * *scale = 448 / amax (two float operations, round to nearest); with it,
 * *inv = 2^e with e = ceil(log2(amax * (1/448))) read off the float's bits,
 * and *scale = 2^-e. A value x is coded e4m3(x * *scale); *inv is the
 * dequantising scale that travels with the codes. */
void mep__ep_fp8_scales(float amax, int round_scale, float *scale,
                        float *inv);
/* The UE8M0 byte of a power-of-two scale (its exponent bits) and back. */
uint8_t mep__ep_scale_to_ue8m0(float scale);
float mep__ep_ue8m0_to_scale(uint8_t e);

/* Quantises one token: hidden bf16 values (hidden % 128 == 0) into hidden
 * e4m3 codes and hidden / 128 float scales. */
void mep__ep_quantize_row(const uint16_t *x, int hidden, int round_scale,
                          uint8_t *codes, float *scales);

#endif /* MEP_EP_FP8_H */
