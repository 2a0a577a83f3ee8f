/* reduce.c - element-wise reductions: one kernel per (accumulator, op),
 * picked by a switch once per call; each kernel is a plain loop the
 * compiler can vectorise. Elements go through memcpy so that no buffer
 * needs alignment (it compiles to unaligned loads, not calls). */
#include "reduce.h"

#include <string.h>

#include "error.h"

typedef unsigned char byte_t;

/* Runs STEP(i) for every i < n: in blocks of a constant length, then the
 * rest one by one. GCC's -O2 cost model vectorises only loops that need no
 * scalar epilogue, which the constant-length inner loop satisfies; a plain
 * loop over n would stay scalar there. */
#define MEP_BLOCK 64
#define MEP_FOR_EACH(n, STEP)                                               \
  do {                                                                      \
    size_t blk_ = 0;                                                        \
    for (; blk_ + MEP_BLOCK <= (n); blk_ += MEP_BLOCK)                      \
      for (size_t k_ = 0; k_ < MEP_BLOCK; k_++) {                           \
        size_t i = blk_ + k_;                                               \
        STEP;                                                               \
      }                                                                     \
    for (size_t i = blk_; i < (n); i++) STEP;                               \
  } while (0)

/* ---------------------------------------------------------- bit casts */

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ------------------------------------------------------- conversions
 * Every case is computed and the answer picked with masks: GCC will not
 * if-convert a branch around a float operation (it may trap), and a loop
 * with a branch left inside does not vectorise. */

/* All ones when c holds, else 0. */
static inline uint32_t mask_if(int c) { return 0u - (uint32_t)(c != 0); }

static inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  uint32_t normal = (em << 13) + (112u << 23); /* exponent bias 15 -> 127 */
  uint32_t special = normal + (112u << 23);    /* inf, NaN: payload kept */
  /* zero, subnormal: em * 2^-24 is exact in float32 (the signed
   * conversion is the one SSE2 has) */
  uint32_t small = f32_bits((float)(int32_t)em * 0x1p-24f);
  uint32_t is_special = mask_if(em >= 0x7c00u);
  uint32_t is_normal = mask_if(em >= 0x0400u);
  uint32_t mag = (special & is_special) | (normal & is_normal & ~is_special) |
                 (small & ~is_normal);
  return bits_f32(sign | mag);
}

static inline uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  /* NaN: the payload's top bits, with the quiet bit when they are all 0
   * (else it would read as infinity). */
  uint32_t nan_m = (a >> 13) & 0x3ffu;
  uint32_t nan_h = 0x7c00u | nan_m | (mask_if(nan_m == 0) & 0x200u);
  /* Normal half: rebias 127 -> 15, round off 13 bits to nearest even;
   * a carry out of the mantissa correctly bumps the exponent. */
  uint32_t r = a - (112u << 23);
  uint32_t normal_h = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  /* Subnormal half or zero: adding 0.5 (whose ulp is 2^-24, the subnormal
   * step) makes the FPU round the magnitude to nearest even; the step count
   * is the difference of the bit patterns. Assumes the default rounding
   * mode. */
  uint32_t small_h = f32_bits(bits_f32(a) + 0.5f) - f32_bits(0.5f);
  uint32_t is_nan = mask_if(a > 0x7f800000u);
  uint32_t is_inf = mask_if(a >= 0x477ff000u); /* >= 65520: past 65504 */
  uint32_t is_normal = mask_if(a >= 0x38800000u); /* >= 2^-14 */
  uint32_t h = (nan_h & is_nan) | (0x7c00u & is_inf & ~is_nan) |
               (normal_h & is_normal & ~is_inf) | (small_h & ~is_normal);
  return (uint16_t)(sign | h);
}

static inline float bf16_to_f32(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}

static inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t r;
  if ((x & 0x7fffffffu) > 0x7f800000u)
    r = (x >> 16) | 0x40u; /* NaN: quiet, never rounded into inf */
  else
    r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (uint16_t)r;
}

float mep__f16_to_f32(uint16_t h) { return f16_to_f32(h); }
uint16_t mep__f32_to_f16(float f) { return f32_to_f16(f); }
float mep__bf16_to_f32(uint16_t h) { return bf16_to_f32(h); }
uint16_t mep__f32_to_bf16(float f) { return f32_to_bf16(f); }

/* ------------------------------------------------ unaligned elements */

#define MEP_ACCESS(sfx, T)                                                  \
  static inline T ld_##sfx(const byte_t *p, size_t i) {                     \
    T v;                                                                    \
    memcpy(&v, p + i * sizeof v, sizeof v);                                 \
    return v;                                                               \
  }                                                                         \
  static inline void st_##sfx(byte_t *p, size_t i, T v) {                   \
    memcpy(p + i * sizeof v, &v, sizeof v);                                 \
  }
MEP_ACCESS(f32, float)
MEP_ACCESS(f64, double)
MEP_ACCESS(u8, uint8_t)
MEP_ACCESS(i8, int8_t)
MEP_ACCESS(u16, uint16_t)
MEP_ACCESS(u32, uint32_t)
MEP_ACCESS(i32, int32_t)
MEP_ACCESS(u64, uint64_t)
MEP_ACCESS(i64, int64_t)
#undef MEP_ACCESS

/* Source elements as accumulator values. */
static inline float ld_f16(const byte_t *p, size_t i) {
  return f16_to_f32(ld_u16(p, i));
}
static inline float ld_bf16(const byte_t *p, size_t i) {
  return bf16_to_f32(ld_u16(p, i));
}
static inline uint8_t ld_bool(const byte_t *p, size_t i) {
  return ld_u8(p, i) != 0;
}
static inline void st_bool(byte_t *p, size_t i, uint8_t v) { st_u8(p, i, v); }

/* ---------------------------------------------------------- operators
 * Integer sum and prod run on the unsigned type (wrapping is defined);
 * min and max on the signed or unsigned type the dtype has. Float min and
 * max pick b only when it is smaller (larger) or NaN, so a NaN on either
 * side wins and ties keep a, the earlier rank. */
#define OP_ADD(a, b) ((a) + (b))
#define OP_MUL(a, b) ((a) * (b))
#define OP_MIN(a, b) ((b) < (a) ? (b) : (a))
#define OP_MAX(a, b) ((b) > (a) ? (b) : (a))
#define OP_FMIN(a, b) (((b) < (a) || (b) != (b)) ? (b) : (a))
#define OP_FMAX(a, b) (((b) > (a) || (b) != (b)) ? (b) : (a))
#define OP_OR(a, b) ((a) | (b))
#define OP_AND(a, b) ((a) & (b))

typedef void (*combine_fn)(byte_t *restrict acc, const byte_t *restrict src,
                           size_t n);

#define MEP_COMBINE(name, AT, acc_sfx, src_ld, OP)                          \
  static void name(byte_t *restrict acc, const byte_t *restrict src,        \
                   size_t n) {                                              \
    MEP_FOR_EACH(n, st_##acc_sfx(acc, i, (AT)OP((AT)ld_##acc_sfx(acc, i),  \
                                                (AT)src_ld(src, i))));      \
  }

/* Float accumulators, by source type. */
#define MEP_COMBINE_FLOAT(tag, AT, acc_sfx, src_ld)                         \
  MEP_COMBINE(combine_##tag##_sum, AT, acc_sfx, src_ld, OP_ADD)             \
  MEP_COMBINE(combine_##tag##_prod, AT, acc_sfx, src_ld, OP_MUL)            \
  MEP_COMBINE(combine_##tag##_min, AT, acc_sfx, src_ld, OP_FMIN)            \
  MEP_COMBINE(combine_##tag##_max, AT, acc_sfx, src_ld, OP_FMAX)
MEP_COMBINE_FLOAT(f16, float, f32, ld_f16)
MEP_COMBINE_FLOAT(bf16, float, f32, ld_bf16)
MEP_COMBINE_FLOAT(f32, float, f32, ld_f32)
MEP_COMBINE_FLOAT(f64, double, f64, ld_f64)

/* Integers: wrapping sum/prod on the unsigned type (shared by int8 and
 * uint8), ordered min/max on the dtype's own signedness. */
#define MEP_COMBINE_WRAP(tag, UT, usfx)                                     \
  MEP_COMBINE(combine_##tag##_sum, UT, usfx, ld_##usfx, OP_ADD)             \
  MEP_COMBINE(combine_##tag##_prod, UT, usfx, ld_##usfx, OP_MUL)
#define MEP_COMBINE_ORDER(tag, T, sfx)                                      \
  MEP_COMBINE(combine_##tag##_min, T, sfx, ld_##sfx, OP_MIN)                \
  MEP_COMBINE(combine_##tag##_max, T, sfx, ld_##sfx, OP_MAX)
MEP_COMBINE_WRAP(w8, uint8_t, u8)
MEP_COMBINE_WRAP(w32, uint32_t, u32)
MEP_COMBINE_WRAP(w64, uint64_t, u64)
MEP_COMBINE_ORDER(i8, int8_t, i8)
MEP_COMBINE_ORDER(u8, uint8_t, u8)
MEP_COMBINE_ORDER(i32, int32_t, i32)
MEP_COMBINE_ORDER(i64, int64_t, i64)

/* bool reads both sides as "nonzero is true", so an accumulator that is a
 * plain copy of a bool buffer (not one from mep__acc_load) works too. */
MEP_COMBINE(combine_bool_or, uint8_t, bool, ld_bool, OP_OR)
MEP_COMBINE(combine_bool_and, uint8_t, bool, ld_bool, OP_AND)

/* dst = a op b in one pass, for the dtypes whose accumulator is the
 * dtype itself: what mep__reduce_pair computes through an accumulator
 * block, without copying into and out of it. The operands keep their
 * order (a first), so results match the accumulator's bit for bit. */
typedef void (*pair_fn)(byte_t *restrict dst, const byte_t *restrict a,
                        const byte_t *restrict b, size_t n);

#define MEP_PAIR(name, T, sfx, OP)                                          \
  static void name(byte_t *restrict dst, const byte_t *restrict a,          \
                   const byte_t *restrict b, size_t n) {                    \
    MEP_FOR_EACH(n, st_##sfx(dst, i, (T)OP((T)ld_##sfx(a, i),             \
                                           (T)ld_##sfx(b, i))));           \
  }
MEP_PAIR(pair_f32_sum, float, f32, OP_ADD)
MEP_PAIR(pair_f32_prod, float, f32, OP_MUL)
MEP_PAIR(pair_f32_min, float, f32, OP_FMIN)
MEP_PAIR(pair_f32_max, float, f32, OP_FMAX)
MEP_PAIR(pair_f64_sum, double, f64, OP_ADD)
MEP_PAIR(pair_f64_prod, double, f64, OP_MUL)
MEP_PAIR(pair_f64_min, double, f64, OP_FMIN)
MEP_PAIR(pair_f64_max, double, f64, OP_FMAX)
MEP_PAIR(pair_w8_sum, uint8_t, u8, OP_ADD)
MEP_PAIR(pair_w8_prod, uint8_t, u8, OP_MUL)
MEP_PAIR(pair_w32_sum, uint32_t, u32, OP_ADD)
MEP_PAIR(pair_w32_prod, uint32_t, u32, OP_MUL)
MEP_PAIR(pair_w64_sum, uint64_t, u64, OP_ADD)
MEP_PAIR(pair_w64_prod, uint64_t, u64, OP_MUL)
MEP_PAIR(pair_i8_min, int8_t, i8, OP_MIN)
MEP_PAIR(pair_i8_max, int8_t, i8, OP_MAX)
MEP_PAIR(pair_u8_min, uint8_t, u8, OP_MIN)
MEP_PAIR(pair_u8_max, uint8_t, u8, OP_MAX)
MEP_PAIR(pair_i32_min, int32_t, i32, OP_MIN)
MEP_PAIR(pair_i32_max, int32_t, i32, OP_MAX)
MEP_PAIR(pair_i64_min, int64_t, i64, OP_MIN)
MEP_PAIR(pair_i64_max, int64_t, i64, OP_MAX)

/* Where op's kernel stands in the order sum, prod, min, max (avg combines
 * as a sum), or -1. */
static int op_index(mep_op_t op) {
  switch (op) {
  case MEP_SUM:
  case MEP_AVG: return 0;
  case MEP_PROD: return 1;
  case MEP_MIN: return 2;
  case MEP_MAX: return 3;
  }
  return -1;
}

/* Of four kernels of type T in op_index order, op's (NULL for none). */
#define MEP_PICK(T, sum, prod, min, max)                                    \
  (op_index(op) < 0 ? (T)NULL                                               \
                    : ((const T[]){sum, prod, min, max})[op_index(op)])

#define MEP_PAIR_BY_OP(a, b)                                                \
  MEP_PICK(pair_fn, pair_##a##_sum, pair_##a##_prod, pair_##b##_min,        \
           pair_##b##_max)

/* NULL where the accumulator differs from the dtype (float16, bfloat16,
 * bool). */
static pair_fn pick_pair(mep_dtype_t dt, mep_op_t op) {
  switch (dt) {
  case MEP_FLOAT32: return MEP_PAIR_BY_OP(f32, f32);
  case MEP_FLOAT64: return MEP_PAIR_BY_OP(f64, f64);
  case MEP_INT8: return MEP_PAIR_BY_OP(w8, i8);
  case MEP_UINT8: return MEP_PAIR_BY_OP(w8, u8);
  case MEP_INT32: return MEP_PAIR_BY_OP(w32, i32);
  case MEP_INT64: return MEP_PAIR_BY_OP(w64, i64);
  case MEP_FLOAT16:
  case MEP_BFLOAT16:
  case MEP_BOOL: return NULL;
  }
  return NULL;
}

#define MEP_BY_OP(a, b)                                                     \
  MEP_PICK(combine_fn, combine_##a##_sum, combine_##a##_prod,               \
           combine_##b##_min, combine_##b##_max)

static combine_fn pick_combine(mep_dtype_t dt, mep_op_t op) {
  switch (dt) {
  case MEP_FLOAT16: return MEP_BY_OP(f16, f16);
  case MEP_BFLOAT16: return MEP_BY_OP(bf16, bf16);
  case MEP_FLOAT32: return MEP_BY_OP(f32, f32);
  case MEP_FLOAT64: return MEP_BY_OP(f64, f64);
  case MEP_INT8: return MEP_BY_OP(w8, i8);
  case MEP_UINT8: return MEP_BY_OP(w8, u8);
  case MEP_INT32: return MEP_BY_OP(w32, i32);
  case MEP_INT64: return MEP_BY_OP(w64, i64);
  case MEP_BOOL:
    return MEP_PICK(combine_fn, combine_bool_or, combine_bool_and,
                    combine_bool_and, combine_bool_or);
  }
  return NULL;
}

/* ------------------------------------------------------ load and store */

static void load_f16(byte_t *restrict acc, const byte_t *restrict src,
                     size_t n) {
  MEP_FOR_EACH(n, st_f32(acc, i, ld_f16(src, i)));
}

static void load_bf16(byte_t *restrict acc, const byte_t *restrict src,
                      size_t n) {
  MEP_FOR_EACH(n, st_f32(acc, i, ld_bf16(src, i)));
}

static void load_bool(byte_t *restrict acc, const byte_t *restrict src,
                      size_t n) {
  MEP_FOR_EACH(n, st_u8(acc, i, ld_bool(src, i)));
}

/* Float32 accumulators back to 16-bit patterns; avg divides in float32
 * first, then the result is rounded once. */
#define MEP_STORE16(name, to16)                                             \
  static void name(const byte_t *restrict acc, byte_t *restrict dst,        \
                   size_t n, int avg, int nranks) {                         \
    if (avg) {                                                              \
      float d = (float)nranks;                                              \
      MEP_FOR_EACH(n, st_u16(dst, i, to16(ld_f32(acc, i) / d)));           \
    } else {                                                                \
      MEP_FOR_EACH(n, st_u16(dst, i, to16(ld_f32(acc, i))));               \
    }                                                                       \
  }
MEP_STORE16(store_f16, f32_to_f16)
MEP_STORE16(store_bf16, f32_to_bf16)

/* In-place division for avg: p may be both acc and dst, so the loop reads
 * and writes the same element through one pointer. */
#define MEP_DIVIDE(name, T, sfx, DT)                                        \
  static void name(byte_t *p, size_t n, int nranks) {                       \
    DT d = (DT)nranks;                                                      \
    MEP_FOR_EACH(n, st_##sfx(p, i, (T)(ld_##sfx(p, i) / d)));             \
  }
MEP_DIVIDE(divide_f32, float, f32, float)
MEP_DIVIDE(divide_f64, double, f64, double)
/* Integer avg: C division truncates toward zero; int8 promotes to int. */
MEP_DIVIDE(divide_i8, int8_t, i8, int)
MEP_DIVIDE(divide_u8, uint8_t, u8, int)
MEP_DIVIDE(divide_i32, int32_t, i32, int32_t)
MEP_DIVIDE(divide_i64, int64_t, i64, int64_t)

static void store_bool(const byte_t *acc, byte_t *dst, size_t n) {
  /* Through one pointer when in place, for the same reason as above. */
  if (acc == dst) {
    MEP_FOR_EACH(n, st_u8(dst, i, ld_bool(dst, i)));
  } else {
    MEP_FOR_EACH(n, st_u8(dst, i, ld_bool(acc, i)));
  }
}

/* --------------------------------------------------------- public API */

size_t mep__acc_size(mep_dtype_t dt) {
  if (dt == MEP_FLOAT16 || dt == MEP_BFLOAT16) return sizeof(float);
  return mep_dtype_size(dt);
}

int mep__reduce_check(mep_dtype_t dt, mep_op_t op) {
  const char *dn = mep_dtype_name(dt);
  const char *on = mep_op_name(op);
  if (dn == NULL)
    return mep__err(MEP_ERR_INVALID,
                    "reduce: unknown dtype %d (known: 0 to %d, float16 to "
                    "bool)",
                    (int)dt, MEP_DTYPE_COUNT - 1);
  if (on == NULL)
    return mep__err(MEP_ERR_INVALID,
                    "reduce: unknown op %d on %s (known: 0 to %d, sum to avg)",
                    (int)op, dn, MEP_OP_COUNT - 1);
  if (dt == MEP_BOOL && op == MEP_AVG)
    return mep__err(MEP_ERR_INVALID,
                    "reduce: avg on bool is not defined; use sum (or) or "
                    "an integer dtype");
  return MEP_OK;
}

void mep__acc_load(mep_dtype_t dt, void *acc, const void *src, size_t n) {
  switch (dt) {
  case MEP_FLOAT16: load_f16(acc, src, n); return;
  case MEP_BFLOAT16: load_bf16(acc, src, n); return;
  case MEP_BOOL: load_bool(acc, src, n); return;
  case MEP_FLOAT32:
  case MEP_FLOAT64:
  case MEP_INT8:
  case MEP_UINT8:
  case MEP_INT32:
  case MEP_INT64:
    if (n > 0) memcpy(acc, src, n * mep_dtype_size(dt));
    return;
  }
}

/* mep__reduce_check without the message, for the trusted entry points. */
static int valid_pair(mep_dtype_t dt, mep_op_t op) {
  return mep_dtype_name(dt) != NULL && mep_op_name(op) != NULL &&
         !(dt == MEP_BOOL && op == MEP_AVG);
}

void mep__acc_combine(mep_dtype_t dt, mep_op_t op, void *acc, const void *src,
                      size_t n) {
  if (!valid_pair(dt, op)) return;
  combine_fn fn = pick_combine(dt, op);
  if (fn != NULL) fn(acc, src, n);
}

void mep__acc_store(mep_dtype_t dt, mep_op_t op, const void *acc, void *dst,
                    size_t n, int nranks) {
  int avg = op == MEP_AVG;
  if (!valid_pair(dt, op) || nranks <= 0) return;
  switch (dt) {
  case MEP_FLOAT16: store_f16(acc, dst, n, avg, nranks); return;
  case MEP_BFLOAT16: store_bf16(acc, dst, n, avg, nranks); return;
  case MEP_BOOL: store_bool(acc, dst, n); return;
  case MEP_FLOAT32:
  case MEP_FLOAT64:
  case MEP_INT8:
  case MEP_UINT8:
  case MEP_INT32:
  case MEP_INT64: break;
  default: return;
  }
  /* Same representation: a copy, then the avg division in place. */
  if (acc != dst && n > 0) memmove(dst, acc, n * mep_dtype_size(dt));
  if (!avg) return;
  switch (dt) {
  case MEP_FLOAT32: divide_f32(dst, n, nranks); return;
  case MEP_FLOAT64: divide_f64(dst, n, nranks); return;
  case MEP_INT8: divide_i8(dst, n, nranks); return;
  case MEP_UINT8: divide_u8(dst, n, nranks); return;
  case MEP_INT32: divide_i32(dst, n, nranks); return;
  case MEP_INT64: divide_i64(dst, n, nranks); return;
  default: return;
  }
}

/* Elements of a block the fused steps below run through at a time: the
 * accumulator's part (at most 8 KiB) stays in L1 between the steps, so
 * memory sees each operand once instead of once per step. */
#define FUSE_BYTES 8192

static size_t fuse_block(mep_dtype_t dt) {
  return FUSE_BYTES / mep__acc_size(dt);
}

void mep__acc_load_pair(mep_dtype_t dt, mep_op_t op, void *acc, const void *a,
                        const void *b, size_t n) {
  pair_fn pair = valid_pair(dt, op) ? pick_pair(dt, op) : NULL;
  if (pair && acc != a && acc != b) {
    pair(acc, a, b, n);
    return;
  }
  size_t B = fuse_block(dt), ds = mep_dtype_size(dt), as = mep__acc_size(dt);
  for (size_t i = 0; i < n; i += B) {
    size_t m = n - i < B ? n - i : B;
    byte_t *acc_i = (byte_t *)acc + i * as;
    mep__acc_load(dt, acc_i, (const byte_t *)a + i * ds, m);
    mep__acc_combine(dt, op, acc_i, (const byte_t *)b + i * ds, m);
  }
}

void mep__acc_combine_store(mep_dtype_t dt, mep_op_t op, void *acc,
                            const void *src, void *dst, size_t n,
                            int nranks) {
  pair_fn pair = valid_pair(dt, op) && nranks > 0 ? pick_pair(dt, op) : NULL;
  if (pair && dst != acc && dst != src) {
    pair(dst, acc, src, n);
    if (op == MEP_AVG) mep__acc_store(dt, op, dst, dst, n, nranks);
    return;
  }
  size_t B = fuse_block(dt), ds = mep_dtype_size(dt), as = mep__acc_size(dt);
  for (size_t i = 0; i < n; i += B) {
    size_t m = n - i < B ? n - i : B;
    byte_t *acc_i = (byte_t *)acc + i * as;
    mep__acc_combine(dt, op, acc_i, (const byte_t *)src + i * ds, m);
    mep__acc_store(dt, op, acc_i, (byte_t *)dst + i * ds, m, nranks);
  }
}

void mep__reduce_pair(mep_dtype_t dt, mep_op_t op, void *dst, const void *a,
                      const void *b, size_t n, int nranks) {
  pair_fn pair = valid_pair(dt, op) && nranks > 0 ? pick_pair(dt, op) : NULL;
  if (pair && dst != b) {
    /* in place over a: the combine kernel, whose two pointers differ */
    if (dst == a)
      pick_combine(dt, op)(dst, b, n);
    else
      pair(dst, a, b, n);
    if (op == MEP_AVG) mep__acc_store(dt, op, dst, dst, n, nranks);
    return;
  }
  _Alignas(64) byte_t blk[FUSE_BYTES];
  size_t B = fuse_block(dt), ds = mep_dtype_size(dt);
  for (size_t i = 0; i < n; i += B) {
    size_t m = n - i < B ? n - i : B;
    mep__acc_load(dt, blk, (const byte_t *)a + i * ds, m);
    mep__acc_combine(dt, op, blk, (const byte_t *)b + i * ds, m);
    mep__acc_store(dt, op, blk, (byte_t *)dst + i * ds, m, nranks);
  }
}
