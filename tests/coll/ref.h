/* ref.h - the independent reference of the collective tests. Every rank's
 * input is a pure function of (seed, rank, index), so any rank can
 * regenerate any other rank's data; element types and reductions are
 * written here from their definitions, without the library's own code. */
#ifndef MEP_TESTS_COLL_REF_H
#define MEP_TESTS_COLL_REF_H

#include <stddef.h>
#include <stdint.h>

#include <mep/mep.h>

/* Bytes per element, written here rather than trusted from the library. */
size_t ref_size(mep_dtype_t dt);
const char *ref_dtype_name(mep_dtype_t dt);
const char *ref_op_name(mep_op_t op);

/* Element `idx` of `rank`'s input under `seed`, as the dtype's bytes.
 * Floats are finite and nonzero with magnitudes in [1/4, 4) (float16 and
 * bfloat16 also some subnormals), so sums and products of a few ranks stay
 * in range; integers use every bit, so sums and products wrap; bool bytes
 * are 0 about half the time and any nonzero byte otherwise. */
void ref_elem(mep_dtype_t dt, uint64_t seed, int rank, size_t idx, void *out);
/* Elements [first, first + count) of rank's input, packed into buf. */
void ref_fill(mep_dtype_t dt, uint64_t seed, int rank, size_t first,
              size_t count, void *buf);

/* IEEE binary16 and bfloat16 <-> float, round to nearest even. */
float ref_f16_to_f32(uint16_t h);
uint16_t ref_f32_to_f16(float f);
float ref_bf16_to_f32(uint16_t h);
uint16_t ref_f32_to_bf16(float f);

/* Checks `got` against element `idx` of the reduction by `op` of the inputs
 * of ranks 0..n-1. float32/float64: within a bound of the sum computed in
 * long double and rounded once, and bit-equal to the rank-order sum in the
 * dtype (the order mep.h promises); float16/bfloat16: bit-equal to the
 * float32 rank-order accumulation rounded once; integers wrap, exactly;
 * bool: or/and, stored as 0 or 1. Returns 0, or -1 with a sentence in why. */
int ref_check_reduced(mep_dtype_t dt, mep_op_t op, int n, uint64_t seed,
                      size_t idx, const void *got, char *why, size_t whylen);

/* The bits element `idx` of the reduction must have: the rank-order
 * result described above. */
/* With on != 0, float32 and float64 results are checked against the
 * order of the logarithmic plan (recursive doubling: a fold, then a tree
 * of adjacent blocks) instead of rank order; other dtypes do not depend
 * on the order. For up to REF_MAX_RANKS ranks. */
#define REF_MAX_RANKS 256
void ref_set_tree(int on);
void ref_reduced(mep_dtype_t dt, mep_op_t op, int n, uint64_t seed,
                 size_t idx, void *want);

/* FNV-1a over len bytes, continuing from h (start with REF_HASH_INIT). */
#define REF_HASH_INIT 0xcbf29ce484222325ull
uint64_t ref_hash(const void *buf, size_t len, uint64_t h);

#endif
