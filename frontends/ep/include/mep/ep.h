/*
 * ep.h - expert-parallel dispatch and combine (the low-latency kind used in
 * MoE decoding), for programs and engines that do not go through PyTorch.
 *
 * Every rank of a communicator holds num_experts / size experts ("local
 * experts"; global expert e lives on rank e / local_experts). dispatch
 * sends each token's hidden vector to the ranks of its top-k experts;
 * combine sends the experts' outputs back and sums them per token, weighted.
 * The layouts are those of DeepEP's low-latency mode, so tensors move
 * between the two unchanged:
 *
 *   x            [num_tokens, hidden]                bf16
 *   topk_idx     [num_tokens, num_topk]              int64, -1: no expert
 *   topk_weights [num_tokens, num_topk]              float
 *   recv_x       [local_experts, size * max_tokens, hidden]
 *                                      bf16, or fp8 e4m3 with MEP_EP_FP8
 *   recv_scales  fp8: float  [local_experts, hidden / 128, size * max_tokens]
 *                ue8m0: int32 [local_experts, hidden / 512, size * max_tokens]
 *                (4 exponent bytes per int32, group 4j+i in byte i)
 *                element (e, t, g) at e * G * S + g * S + t, S = size * max_tokens
 *   src_info     [local_experts, size * max_tokens]  int32: the token's
 *                                      index on its source rank
 *   layout_range [local_experts, size]  int64: (begin << 32) | count of the
 *                                      tokens from each source rank (as
 *                                      DeepEP packs it)
 *   recv_count   [local_experts]       int32: tokens received per expert
 *   out          [num_tokens, hidden]  bf16
 *
 * Within an expert, tokens are grouped by source rank in rank order; the
 * order among one source's tokens is unspecified (src_info names them).
 * A token that names an expert twice reaches it twice; an expert takes
 * at most max_tokens rows from one source, and copies beyond are dropped.
 *
 * FP8: per token and 128-channel group, scale = max(amax, 1e-4) / 448,
 * rounded up to a power of two with MEP_EP_ROUND_SCALE, and
 * recv_x = x / scale in e4m3 (saturating). MEP_EP_UE8M0 (needs
 * ROUND_SCALE and hidden % 512 == 0) stores each scale as its 8-bit
 * exponent (the float's bits 23..30) instead of a float.
 *
 * Faults: every call waits for each active source at most timeout_us; a
 * source that misses it is cleared in active_ranks (int32 [size], 1 =
 * active) and skipped, then and in later calls: its tokens are not
 * received and its experts contribute nothing to combine. Nothing hangs.
 *
 * Memory: a buffer made with MEP_EP_CUDA takes device pointers and runs on
 * the given CUDA stream (the call returns once the work is queued; it is
 * capturable in CUDA graphs); one made with MEP_EP_HOST takes host
 * pointers and runs on the calling thread (the CPU path: the same
 * semantics, over any transport, no GPU needed).
 *
 * Thread safety: the calls on one buffer are serialised by the caller;
 * every rank makes the same sequence of calls on its buffer.
 */
#ifndef MEP_EP_H
#define MEP_EP_H

#include <stddef.h>
#include <stdint.h>

#include "mep/mep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits (larger is MEP_ERR_INVALID, with the reason). */
#define MEP_EP_MAX_TOPK 16
#define MEP_EP_MAX_LOCAL_EXPERTS 1024

/* Buffer flags. */
#define MEP_EP_HOST 0x1u /* host memory, CPU path */
#define MEP_EP_CUDA 0x2u /* device memory, CUDA path, current device */

/* Call flags. */
#define MEP_EP_FP8 0x1u         /* dispatch: send e4m3 + scales */
#define MEP_EP_ROUND_SCALE 0x2u /* dispatch: scales are powers of two */
#define MEP_EP_UE8M0 0x4u       /* dispatch: scales as packed exponents */
#define MEP_EP_ZERO_COPY 0x8u   /* combine: x is mep_ep_combine_buffer() */
#define MEP_EP_SEND 0x10u       /* only send; a later call with RECV ends it */
#define MEP_EP_RECV 0x20u       /* only receive (after a SEND-only call) */
/* Neither SEND nor RECV: both, in one call. */

typedef struct mep_ep_buffer mep_ep_buffer_t;

typedef struct mep_ep_config {
  size_t struct_size;      /* sizeof(mep_ep_config_t) */
  int max_tokens_per_rank; /* >= 1: num_tokens of any call is at most it */
  int hidden;              /* a multiple of 128 */
  int num_experts;         /* a multiple of the group size */
  unsigned flags;          /* MEP_EP_HOST or MEP_EP_CUDA */
  int64_t timeout_us;      /* default per-call timeout; <= 0: the
                            * communicator's [core] timeout_ms */
} mep_ep_config_t;

/* Bytes of communication memory a buffer of these parameters uses per
 * rank (what DeepEP calls the RDMA size hint); 0 for invalid parameters. */
MEP_API size_t mep_ep_size_hint(int max_tokens_per_rank, int hidden,
                                int num_ranks, int num_experts);

/* Creates a buffer. Collective over `comm` (every rank, same config).
 * The buffer keeps `comm`, which must outlive it. Its own active_ranks
 * start as the communicator's active set (0 for ranks that had left). Errors: MEP_ERR_INVALID (the message names the parameter
 * and the limit), MEP_ERR_UNSUPPORTED (MEP_EP_CUDA without a GPU or a
 * CUDA build), MEP_ERR_NOMEM, errors of the core. */
MEP_API int mep_ep_buffer_create(mep_comm_t *comm, const mep_ep_config_t *cfg,
                                 mep_ep_buffer_t **out);

/* Frees the buffer; for MEP_EP_CUDA after the work queued on it finished
 * (the caller synchronises its streams first). Call it on every rank:
 * when a CUDA buffer's peers are reached through the proxy (a transport
 * other than nvlink), it first lets the proxy carry out the messages the
 * kernels queued and then waits for every active rank to get there too
 * (up to the communicator's timeout), so that no late message reaches a
 * peer's freed memory. NULL: no-op. */
MEP_API int mep_ep_buffer_destroy(mep_ep_buffer_t *buf);

/* The buffer's own active-rank array, int32 [size]: device memory for a
 * MEP_EP_CUDA buffer, host memory else. Calls use it when theirs is NULL. */
MEP_API int32_t *mep_ep_active_ranks(mep_ep_buffer_t *buf);

/* Where to write expert outputs [local_experts, size * max_tokens, hidden]
 * bf16 for a combine with MEP_EP_ZERO_COPY (device memory for
 * MEP_EP_CUDA). Valid until the buffer is destroyed. Fill it between the
 * combine before the one that reads it and that one: on the CUDA path
 * every combine may use it to hold rows that peers read (as DeepEP's
 * next combine buffer). */
MEP_API void *mep_ep_combine_buffer(mep_ep_buffer_t *buf);

typedef struct mep_ep_dispatch_args {
  size_t struct_size;         /* sizeof(mep_ep_dispatch_args_t) */
  const void *x;              /* [num_tokens, hidden] bf16 */
  const int64_t *topk_idx;    /* [num_tokens, num_topk] */
  int num_tokens;             /* 0 .. max_tokens_per_rank */
  int num_topk;               /* 1 .. MEP_EP_MAX_TOPK */
  unsigned flags;             /* MEP_EP_FP8, ROUND_SCALE, UE8M0, SEND, RECV */
  int32_t *active_ranks;      /* [size], in/out; NULL: the buffer's own */
  int64_t timeout_us;         /* <= 0: the buffer's */
  void *recv_x;               /* outputs, layouts above */
  void *recv_scales;          /* FP8 only (NULL else) */
  int32_t *recv_src_info;
  int64_t *recv_layout_range;
  int32_t *recv_count;
  void *stream;               /* cudaStream_t (MEP_EP_CUDA); else ignored */
} mep_ep_dispatch_args_t;

/* Sends the tokens to their experts' ranks and receives this rank's
 * experts' tokens. With MEP_EP_SEND it returns after sending; a call with
 * MEP_EP_RECV and the same arguments then receives (the two-phase mode:
 * other work runs between them). Every output is written in full.
 * Returns 0 (also when sources timed out: see active_ranks), or
 * MEP_ERR_INVALID for arguments outside the buffer's limits, or
 * MEP_ERR_SYSTEM for a CUDA failure. */
MEP_API int mep_ep_dispatch(mep_ep_buffer_t *buf,
                            const mep_ep_dispatch_args_t *args);

typedef struct mep_ep_combine_args {
  size_t struct_size;          /* sizeof(mep_ep_combine_args_t) */
  const void *x;               /* [local_experts, size * max_tokens, hidden]
                                * bf16, rows as the dispatch delivered them */
  const int64_t *topk_idx;     /* [num_tokens, num_topk], as dispatched */
  const float *topk_weights;   /* [num_tokens, num_topk] */
  const int32_t *src_info;     /* the dispatch's recv_src_info */
  const int64_t *layout_range; /* the dispatch's recv_layout_range */
  int num_tokens;
  int num_topk;
  unsigned flags;              /* MEP_EP_ZERO_COPY, SEND, RECV */
  int32_t *active_ranks;       /* as for dispatch */
  int64_t timeout_us;
  void *out;                   /* [num_tokens, hidden] bf16 */
  void *stream;
} mep_ep_combine_args_t;

/* Sends each expert's outputs back to the tokens' ranks and writes
 * out[t] = sum over k of topk_weights[t][k] * output of expert
 * topk_idx[t][k] for token t (skipping -1 and inactive ranks), summed in
 * float, rounded to bf16 once. The CUDA path may sum a rank's share of
 * the experts there first (docs/ep.md, reduce mode), so the float sum's
 * order differs from k = 0, 1, ... by rounding only. Every rank passes
 * the same num_topk. Phases and errors as for dispatch. */
MEP_API int mep_ep_combine(mep_ep_buffer_t *buf,
                           const mep_ep_combine_args_t *args);

#ifdef __cplusplus
}
#endif
#endif /* MEP_EP_H */
