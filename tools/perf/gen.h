/* gen.h - mep-perf's inputs: every element of every rank's input is a pure
 * function of (seed, rank, iteration, index), so any rank can regenerate
 * any other rank's input to check a result, with no data exchanged. Also
 * the element codecs the checker reads results with; they are written here
 * rather than taken from libmep so that the check does not share code with
 * what it checks. The per-element functions are inline: called with a
 * constant dtype, their switches fold away in the checker's loops. */
#ifndef MEP_PERF_GEN_H
#define MEP_PERF_GEN_H

#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <mep/mep.h>

/* The stream of one (seed, rank, iteration). */
uint64_t perf_stream_key(uint64_t seed, int rank, int iter);

/* Writes elements [idx0, idx0 + n) of a stream to buf (native layout). */
void perf_fill(mep_dtype_t dt, uint64_t key, size_t idx0, void *buf, size_t n);

/* Unit roundoff of a float dtype's storage (2^-11 for float16, ...). */
double perf_unit_roundoff(mep_dtype_t dt);

/* The splitmix64 finaliser: a bijection that spreads every input bit. */
static inline uint64_t perf_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Sign | exponent | mantissa of m / 64 for |m| <= 128, in a 16-bit float
 * format: m / 64 = 1.f * 2^(e - 6) with e = floor(log2 |m|) <= 7, so f
 * fits in 7 bits and the value is exact in float16 and bfloat16. */
static inline uint16_t perf_small_float(int m, int mant_bits, int bias) {
  if (m == 0) return 0;
  unsigned sign = m < 0, a = (unsigned)(m < 0 ? -m : m);
  int e = 0;
  while ((a >> (e + 1)) != 0) e++;
  unsigned frac = (a - (1u << e)) << (mant_bits - e);
  return (uint16_t)(sign << 15 | (unsigned)(e - 6 + bias) << mant_bits | frac);
}

static inline int perf_dtype_is_float(mep_dtype_t dt) {
  return dt == MEP_FLOAT16 || dt == MEP_BFLOAT16 || dt == MEP_FLOAT32 ||
         dt == MEP_FLOAT64;
}

/* Element `idx` of a stream, as the dtype's bit pattern in the low bytes
 * (integers: the full 64 bits, of which the dtype keeps its width):
 * float16/bfloat16 are k/64 for k in [-128, 128], float32/float64 uniform
 * in [-1, 1), integers uniform over their range, bool 0 or 1. Never the
 * all-ones pattern for floats or bool, which the checker uses as poison. */
static inline uint64_t perf_value_bits(mep_dtype_t dt, uint64_t key,
                                       size_t idx) {
  uint64_t h = perf_mix64(key + (uint64_t)idx * 0x9e3779b97f4a7c15ull);
  /* 53 random bits scaled by 2^-52 (exact) give [0, 2). */
  double u = (double)(h >> 11) * 0x1p-52 - 1.0;
  switch (dt) {
  case MEP_FLOAT16: return perf_small_float((int)(h % 257) - 128, 10, 15);
  case MEP_BFLOAT16: return perf_small_float((int)(h % 257) - 128, 7, 127);
  case MEP_FLOAT32: {
    float f = (float)u;
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
  }
  case MEP_FLOAT64: {
    uint64_t b;
    memcpy(&b, &u, sizeof b);
    return b;
  }
  case MEP_BOOL: return h >> 63;
  default: return h;
  }
}


/* Element i of buf as bits, zero-extended. */
static inline uint64_t perf_load_bits(mep_dtype_t dt, const void *buf,
                                      size_t i) {
  const unsigned char *p = buf;
  switch (mep_dtype_size(dt)) {
  case 1: return p[i];
  case 2: {
    uint16_t v;
    memcpy(&v, p + 2 * i, 2);
    return v;
  }
  case 4: {
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
  }
  default: {
    uint64_t v;
    memcpy(&v, p + 8 * i, 8);
    return v;
  }
  }
}

/* Stores the dtype's low bytes of bits as element i of buf. */
static inline void perf_store_bits(mep_dtype_t dt, void *buf, size_t i,
                                   uint64_t bits) {
  unsigned char *p = buf;
  switch (mep_dtype_size(dt)) {
  case 1: p[i] = (unsigned char)bits; break;
  case 2: {
    uint16_t v = (uint16_t)bits;
    memcpy(p + 2 * i, &v, 2);
    break;
  }
  case 4: {
    uint32_t v = (uint32_t)bits;
    memcpy(p + 4 * i, &v, 4);
    break;
  }
  default: memcpy(p + 8 * i, &bits, 8); break;
  }
}

/* 2^e for a normal double's exponent range. */
static inline double perf_pow2(int e) {
  uint64_t b = (uint64_t)(e + 1023) << 52;
  double d;
  memcpy(&d, &b, sizeof d);
  return d;
}

static inline double perf_f16_value(uint16_t h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0)
    v = mant * perf_pow2(-24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = (mant + 1024) * perf_pow2(exp - 25);
  return h >> 15 ? -v : v;
}

static inline double perf_bf16_value(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The value of a float dtype's bits. */
static inline double perf_float_value(mep_dtype_t dt, uint64_t bits) {
  switch (dt) {
  case MEP_FLOAT16: return perf_f16_value((uint16_t)bits);
  case MEP_BFLOAT16: return perf_bf16_value((uint16_t)bits);
  case MEP_FLOAT32: {
    uint32_t u = (uint32_t)bits;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  default: {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
  }
  }
}

/* The value of an integer or bool dtype's bits (sign-extended where
 * signed; bool 0 or 1). */
static inline int64_t perf_int_value(mep_dtype_t dt, uint64_t bits) {
  switch (dt) {
  case MEP_INT8: return (int8_t)(uint8_t)bits;
  case MEP_INT32: return (int32_t)(uint32_t)bits;
  case MEP_INT64: return (int64_t)bits;
  case MEP_UINT8: return (uint8_t)bits;
  default: return bits != 0; /* bool */
  }
}

/* Runs `lhs fn(DT, ...)` with DT the constant equal to dt (lhs may be
 * empty or "x ="), so that fn, inline, is compiled once per dtype with its
 * per-element switches folded. */
#define PERF_BY_DTYPE(dt, lhs, fn, ...)                                       \
  switch (dt) {                                                               \
  case MEP_FLOAT16: lhs fn(MEP_FLOAT16, __VA_ARGS__); break;                  \
  case MEP_BFLOAT16: lhs fn(MEP_BFLOAT16, __VA_ARGS__); break;                \
  case MEP_FLOAT32: lhs fn(MEP_FLOAT32, __VA_ARGS__); break;                  \
  case MEP_FLOAT64: lhs fn(MEP_FLOAT64, __VA_ARGS__); break;                  \
  case MEP_INT8: lhs fn(MEP_INT8, __VA_ARGS__); break;                        \
  case MEP_UINT8: lhs fn(MEP_UINT8, __VA_ARGS__); break;                      \
  case MEP_INT32: lhs fn(MEP_INT32, __VA_ARGS__); break;                      \
  case MEP_INT64: lhs fn(MEP_INT64, __VA_ARGS__); break;                      \
  case MEP_BOOL: lhs fn(MEP_BOOL, __VA_ARGS__); break;                        \
  }

/* The dtype's width as a mask of bits. */
static inline uint64_t perf_width_mask(mep_dtype_t dt) {
  size_t bits = 8 * mep_dtype_size(dt);
  return bits >= 64 ? ~0ull : (1ull << bits) - 1;
}

#endif
