/* reduce.h - element-wise reductions of the collectives, on host memory.
 *
 * A reduction runs in three steps over a chunk of n elements: load the
 * first contribution into an accumulator, combine every further one into
 * it (in rank order, so every rank computes bit-identical results), store
 * the accumulator back in the element type. The accumulator has the
 * dtype's own type, except float16 and bfloat16, which accumulate in
 * float32 and are rounded once, at the store.
 *
 * Semantics:
 *  - Integers wrap on overflow (two's complement, computed in unsigned
 *    arithmetic). avg = the wrapped sum in the type's own width divided by
 *    nranks, truncated toward zero (C division), also for negative sums.
 *  - Floats: sum and prod are plain IEEE arithmetic in the accumulator
 *    type (float32 or float64), in rank order. min and max propagate NaN:
 *    if either operand is NaN the result is NaN (which NaN is unspecified).
 *    On ties, including -0 against +0, the earlier rank's value stays.
 *    avg = sum / nranks, one IEEE division in the accumulator type, then
 *    (float16/bfloat16) one rounding to the dtype.
 *  - bool: a nonzero byte is true. sum and max are "or", prod and min are
 *    "and"; stored bytes are 0 or 1. avg is refused.
 *  - float16 (IEEE binary16) and bfloat16 are uint16_t bit patterns;
 *    subnormals are converted exactly; rounding to them is to nearest,
 *    ties to even.
 *
 * Buffers need no alignment. The functions below trust their arguments:
 * callers validate (dtype, op) once with mep__reduce_check; an invalid pair
 * leaves the buffers untouched. acc and src must not overlap. */
#ifndef MEP_SRC_REDUCE_H
#define MEP_SRC_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "mep/mep.h"

/* Bytes per element of the accumulator of dtype: 4 for float16/bfloat16
 * (they accumulate in float32), else the dtype's own size. 0 if unknown. */
size_t mep__acc_size(mep_dtype_t dt);

/* MEP_OK, or MEP_ERR_INVALID with a sentence (unknown dtype/op, avg on
 * bool). */
int mep__reduce_check(mep_dtype_t dt, mep_op_t op);

/* acc[i] = src[i] converted to the accumulator type, i < n. When
 * mep__acc_size(dt) equals the dtype's size this is a plain copy (bool
 * aside, which it turns into 0/1 bytes; combine and store take any nonzero
 * byte as true), so a caller may start from a copy of the first
 * contribution instead. */
void mep__acc_load(mep_dtype_t dt, void *acc, const void *src, size_t n);

/* acc[i] = acc[i] op src[i]  (src in the dtype, acc in the accumulator
 * type). For MEP_AVG this is a sum. */
void mep__acc_combine(mep_dtype_t dt, mep_op_t op, void *acc, const void *src,
                      size_t n);

/* dst[i] = acc[i] (for MEP_AVG divided by nranks first), converted back to
 * the dtype. acc and dst may be the same memory when acc_size == dtype
 * size; otherwise they must not overlap. nranks > 0. */
void mep__acc_store(mep_dtype_t dt, mep_op_t op, const void *acc, void *dst,
                    size_t n, int nranks);

/* The steps above fused, for the first two contributions and for the
 * last one: the same results bit for bit, each operand read once (in one
 * pass where the dtype is its own accumulator, else over blocks that stay
 * in cache). load_pair: acc = a op b; combine_store: dst = store(acc op
 * src) (any alias of dst and acc as for mep__acc_store; acc holds the sum
 * afterwards only where it is dst or the accumulator type differs from
 * the dtype); reduce_pair: dst = store(a op b), with no accumulator (dst
 * may be a or b). */
void mep__acc_load_pair(mep_dtype_t dt, mep_op_t op, void *acc, const void *a,
                        const void *b, size_t n);
void mep__acc_combine_store(mep_dtype_t dt, mep_op_t op, void *acc,
                            const void *src, void *dst, size_t n, int nranks);
void mep__reduce_pair(mep_dtype_t dt, mep_op_t op, void *dst, const void *a,
                      const void *b, size_t n, int nranks);

/* Conversions, exposed for tests and for the CUDA path later. */
float mep__f16_to_f32(uint16_t h);   /* exact, NaN payload kept */
/* Round to nearest even; overflow -> inf; NaN stays NaN (payload truncated,
 * quiet bit set only when the truncation would leave an infinity). */
uint16_t mep__f32_to_f16(float f);
float mep__bf16_to_f32(uint16_t h);  /* exact */
uint16_t mep__f32_to_bf16(float f);  /* round to nearest even; NaN stays NaN
                                      * (quiet) */

#endif
