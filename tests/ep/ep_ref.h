/* ep_ref.h - the independent reference of the EP tests (C tests of the CPU
 * path and GPU tests of the CUDA path): every rank regenerates every rank's
 * inputs from the case's seed and checks its own outputs against them.
 * Layouts are those of mep/ep.h. Host memory only. */
#ifndef MEP_TESTS_EP_REF_H
#define MEP_TESTS_EP_REF_H

#include <stddef.h>
#include <stdint.h>

typedef struct ep_case {
  int ranks, max_tokens, hidden, experts, topk;
  unsigned flags;   /* MEP_EP_FP8 | MEP_EP_ROUND_SCALE | MEP_EP_UE8M0 (dispatch format) */
  uint64_t seed;    /* differs per call: inputs differ per call */
} ep_case_t;

/* Tokens `rank` sends in this case: 0..max_tokens, varying by rank and seed
 * (0, 1 and max occur). */
int ep_ref_num_tokens(const ep_case_t *c, int rank);

/* Deterministic inputs of `rank`: x bf16 bits [n*hidden] random
 * (normal-ish, some large outliers), topk_idx [n*topk] distinct experts per
 * token with some -1, weights [n*topk] random. Any pointer may be NULL. */
void ep_ref_inputs(const ep_case_t *c, int rank, uint16_t *x,
                   int64_t *topk_idx, float *weights);

/* Checks one rank's dispatch outputs (host copies, layouts of ep.h) against
 * every rank's inputs, counting only ranks with active[r] != 0: per local
 * expert the SET of (src rank, token) and each row's data (bf16 exact; fp8:
 * codes and scales equal to the host quantization, or within one e4m3 step
 * if codes differ by rounding), layout_range and recv_count exact. 0, or -1
 * with a sentence in why. */
int ep_ref_check_dispatch(const ep_case_t *c, int rank, const int32_t *active,
                          const void *recv_x, const void *recv_scales,
                          const int32_t *src_info, const int64_t *layout_range,
                          const int32_t *recv_count, char *why,
                          size_t why_len);

/* The test's experts, as a model would apply them to what dispatch
 * delivered: comb_x [L, R*T, hidden] bf16, row = bf16(f_e(dequantized recv
 * row)) with f_e(v) = v * (1 + (e % 7) / 8) for global expert e; rows
 * outside the layout ranges are left alone. */
void ep_ref_expert_rows(const ep_case_t *c, int rank, const void *recv_x,
                        const void *recv_scales, const int64_t *layout_range,
                        uint16_t *comb_x);

/* Checks combine output out [n, hidden] bf16 of `rank`: sum over k of w *
 * f_e(quantized-dequantized x_t) for experts on active ranks, within a
 * tolerance stated in the code (bf16 rounding of rows and of the sum). */
int ep_ref_check_combine(const ep_case_t *c, int rank, const int32_t *active,
                         const uint16_t *out, char *why, size_t why_len);

#endif /* MEP_TESTS_EP_REF_H */
