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
  /* Added later: a struct_size that ends before it reads as NULL. Where
   * the outputs are, [local experts] int32 or NULL: the receive adds each
   * local expert's count to it (DeepEP's
   * cumulative_local_expert_recv_stats), in the same launch. */
  int32_t *recv_stats;
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

/* ===================================================================
 * The high-throughput ("normal") mode, for prefill and training: DeepEP's
 * get_dispatch_layout / dispatch / combine. Tokens go to ranks, not to
 * expert slots: a rank receives each token once, however many of its
 * experts the token names, in a packed [num_recv_tokens, hidden] tensor
 * ordered by source rank (rank 0's tokens first), each source's tokens in
 * their original order (DeepEP's order: rank_prefix_matrix[s][r] is the
 * end of source s's rows on rank r).
 *
 * A dispatch is two calls: mep_ep_notify_dispatch exchanges the counts
 * (every rank sends its num_tokens_per_rank row and the expert counts to
 * every rank) and says how many tokens this rank will receive, so the
 * caller can size the outputs; mep_ep_normal_dispatch then moves the
 * tokens. A cached dispatch (the rank_prefix_matrix of an earlier one)
 * skips the notify. mep_ep_normal_combine sends rows back and sums them
 * per token, unweighted (weights travel and are summed alongside).
 *
 * Memory: a normal buffer holds num_bytes of host memory per rank
 * (DeepEP's num_nvl_bytes), cut into fixed areas (docs/ep.md, "Normal
 * mode"): per call, source s may send rank r at most pair_bytes of
 * messages, pair_bytes = mep_ep_normal_pair_bytes(buf). A call that needs
 * more fails on every rank alike with MEP_ERR_INVALID naming the num_bytes
 * it needs (mep_ep_normal_size_hint).
 *
 * MEP_EP_CUDA (the CUDA path): the same areas are a device window
 * (mep/device.h) of num_bytes on the calling thread's GPU (and as much
 * pinned host memory when some pair of ranks goes through the proxy), and
 * dispatch and combine only queue kernels on args->stream: their arrays
 * (x, scales, top-k, is_token_in_rank, send_head, rank_prefix_matrix, the
 * outputs and active_ranks) are device memory, send_head is required (the
 * kernels place tokens by it), and a combine's num_recv_tokens is the rows
 * of x (>= the rows received: the kernels read the count from
 * rank_prefix_matrix). mep_ep_notify_dispatch with args->flags
 * MEP_EP_CUDA runs the count exchange in a kernel on args->stream over the
 * same window (its arrays are device memory but for the two host outputs
 * it waits for); with host arrays (flags 0) it runs on the host, as on the
 * CPU path, and with active_ranks NULL it reads and writes back the
 * buffer's device ones (mep_ep_normal_active_ranks), synchronously. The
 * kernels' agreement on
 * lost ranks is one round of words (docs/ep.md, "The CUDA path"): a rank
 * that dies during that round itself may be kept by some survivors for
 * that call; every later call drops it everywhere. A rank the others
 * dropped (it stalled) is not sent their views, so it ends its call with
 * them cleared instead of a MEP_ERR_EXCLUDED (a kernel returns nothing).
 *
 * Faults: as for the low-latency calls, every call takes active_ranks and
 * timeout_us; a source or destination that misses the deadline is
 * cleared in active_ranks and skipped in this and later calls (its tokens
 * are not received: zero rows, src_idx -1; its rows do not enter a
 * combine); the call still returns 0. The survivors agree on the ranks
 * lost (an all-reduce of the active flags over comm after each step), so
 * every survivor leaves out the same ones; a rank the others dropped gets
 * MEP_ERR_EXCLUDED. A caller compares active_ranks before and after a
 * call to see which ranks it lost. The calls use comm's collectives, so
 * they take their place in its order of collectives.
 *
 * Thread safety: calls on one buffer are serialised by the caller; every
 * rank makes the same sequence of notify / dispatch / combine calls.
 * =================================================================== */

/* Top-k columns a normal-mode call carries at most (DeepEP: 32). */
#define MEP_EP_NORMAL_MAX_TOPK 32

typedef struct mep_ep_normal mep_ep_normal_t;

typedef struct mep_ep_normal_config {
  size_t struct_size; /* sizeof(mep_ep_normal_config_t) */
  size_t num_bytes;   /* memory per rank (DeepEP's num_nvl_bytes) */
  unsigned flags;     /* MEP_EP_HOST or MEP_EP_CUDA */
  int64_t timeout_us; /* default per-call timeout; <= 0: the
                       * communicator's [core] timeout_ms */
} mep_ep_normal_config_t;

/* num_bytes a normal buffer needs so that one source may send one rank
 * tokens_per_pair tokens of `hidden` bf16 values (or smaller: FP8 with
 * hidden / 128 scales) with num_topk (0..MEP_EP_NORMAL_MAX_TOPK) indices
 * and weights, and combine them back; 0 for invalid parameters.
 * Pure function, thread-safe. */
MEP_API size_t mep_ep_normal_size_hint(int num_ranks, int tokens_per_pair,
                                       int hidden, int num_topk);

/* Creates a normal buffer. Collective over comm (every rank, the same
 * config), which must outlive it. Errors: MEP_ERR_INVALID (num_bytes too
 * small for the bookkeeping of this many ranks: the message names the
 * least), MEP_ERR_UNSUPPORTED (MEP_EP_CUDA in a build or on a machine
 * without CUDA), MEP_ERR_NOMEM, MEP_ERR_SYSTEM (a CUDA failure), errors
 * of the core and of mep_devwin_create. */
MEP_API int mep_ep_normal_create(mep_comm_t *comm,
                                 const mep_ep_normal_config_t *cfg,
                                 mep_ep_normal_t **out);
/* Frees it (lets this rank's puts finish first). Not collective. NULL:
 * no-op. */
MEP_API int mep_ep_normal_destroy(mep_ep_normal_t *buf);
/* The buffer's own active ranks, int32 [size] (1 = active): host memory,
 * or device memory for MEP_EP_CUDA. */
MEP_API int32_t *mep_ep_normal_active_ranks(mep_ep_normal_t *buf);
/* Bytes one source may send one rank per call (see above). */
MEP_API size_t mep_ep_normal_pair_bytes(const mep_ep_normal_t *buf);

/* DeepEP's get_dispatch_layout, computed locally (no communication, no
 * buffer needed). topk_idx [num_tokens, num_topk] int64 (-1: none; a
 * token naming two experts of one rank counts once for that rank).
 * Outputs: num_tokens_per_rank int32 [num_ranks]; num_tokens_per_rdma_rank
 * int32 [num_ranks / ranks_per_host] (tokens for each host; NULL: not
 * wanted); num_tokens_per_expert int32 [num_experts]; is_token_in_rank
 * bool (uint8 0/1) [num_tokens, num_ranks]. MEP_ERR_INVALID for an index
 * outside -1..num_experts-1, num_experts not a multiple of num_ranks,
 * ranks_per_host not dividing num_ranks, NULL pointers. Thread-safe.
 * flags MEP_EP_CUDA: every array is device memory and the work is only
 * queued on `stream` (a cudaStream_t; NULL: the legacy default stream),
 * as DeepEP's layout kernel; an index outside -1..num_experts-1 then
 * counts as -1 (reporting it would need the stream to stop;
 * mep_ep_normal_dispatch's kernels ignore such an index too).
 * MEP_ERR_UNSUPPORTED from a library built without CUDA. Structs of the
 * size before `flags` are taken as flags MEP_EP_HOST. */
typedef struct mep_ep_layout_args {
  size_t struct_size; /* sizeof(mep_ep_layout_args_t) */
  const int64_t *topk_idx;
  int num_tokens, num_topk, num_experts, num_ranks;
  int ranks_per_host;               /* for num_tokens_per_rdma_rank */
  int32_t *num_tokens_per_rank;
  int32_t *num_tokens_per_rdma_rank; /* may be NULL */
  int32_t *num_tokens_per_expert;
  uint8_t *is_token_in_rank;
  unsigned flags;                   /* 0 or MEP_EP_HOST, or MEP_EP_CUDA */
  void *stream;                     /* MEP_EP_CUDA: cudaStream_t */
} mep_ep_layout_args_t;
MEP_API int mep_ep_get_dispatch_layout(const mep_ep_layout_args_t *args);

/* The count exchange of a (non-cached) dispatch. Inputs: this rank's
 * num_tokens and its layout (num_tokens_per_rank [R], num_tokens_per_expert
 * [num_experts], is_token_in_rank [num_tokens, R], e.g. from
 * mep_ep_get_dispatch_layout); expert_alignment >= 1; num_channels >= 0
 * (DeepEP's config.num_sms / 2; only for channel_prefix_matrix).
 * Outputs: *num_recv_tokens; num_recv_tokens_per_expert int32 [L] (each
 * rounded up to expert_alignment); rank_prefix_matrix int32 [R, R]
 * (entry [s][r]: tokens sources 0..s send rank r, inclusive; every rank
 * gets the whole matrix); channel_prefix_matrix int32 [R, num_channels]
 * (may be NULL: entry [r][c], tokens of channels 0..c this rank sends to
 * r, a channel being DeepEP's contiguous range of ceil(num_tokens /
 * num_channels) tokens). The counts are kept in the buffer for the next
 * mep_ep_normal_dispatch, which must follow before the next notify.
 * Fails alike on every rank (MEP_ERR_INVALID, naming the num_bytes
 * needed) when some pair would exceed the buffer.
 * flags MEP_EP_CUDA (a MEP_EP_CUDA buffer only): num_tokens_per_rank,
 * num_tokens_per_expert, is_token_in_rank, active_ranks and the two
 * matrices are device memory; num_recv_tokens and
 * num_recv_tokens_per_expert stay host memory. The exchange is one kernel
 * queued on `stream` (a cudaStream_t) after the work before it there (the
 * layout kernel, say); the call blocks until the kernel has published
 * those two outputs (as DeepEP's notify does), at most twice the timeout
 * plus 10 s, else MEP_ERR_TIMEOUT. The matrices are written in stream
 * order. Errors of a peer's inputs are reported as on the host path.
 * Structs of the size before `flags` are taken as flags 0. */
typedef struct mep_ep_notify_args {
  size_t struct_size; /* sizeof(mep_ep_notify_args_t) */
  int num_tokens, num_experts, expert_alignment, num_channels;
  const int32_t *num_tokens_per_rank;
  const int32_t *num_tokens_per_expert;
  const uint8_t *is_token_in_rank;
  /* message shape, for the buffer check: hidden values of x_elem_size
   * bytes (2 bf16, 1 fp8), num_scales 4-byte scales, num_topk */
  int hidden, x_elem_size, num_scales, num_topk;
  int32_t *active_ranks; /* [R] in/out; NULL: the buffer's own */
  int64_t timeout_us;    /* <= 0: the buffer's */
  int *num_recv_tokens;                /* out */
  int32_t *num_recv_tokens_per_expert; /* out [L] */
  int32_t *rank_prefix_matrix;         /* out [R, R] */
  int32_t *channel_prefix_matrix;      /* out [R, num_channels] or NULL */
  unsigned flags;                      /* 0 (host arrays) or MEP_EP_CUDA */
  void *stream;                        /* MEP_EP_CUDA: cudaStream_t */
} mep_ep_notify_args_t;
MEP_API int mep_ep_notify_dispatch(mep_ep_normal_t *buf,
                                   const mep_ep_notify_args_t *args);

/* Moves the tokens. x [num_tokens, hidden]: bf16 (x_elem_size 2) or e4m3
 * codes (1) with x_scales [num_tokens, num_scales] 4-byte values (float or
 * int32, copied as bits) at element strides (scale_token_stride,
 * scale_hidden_stride); hidden * x_elem_size a multiple of 16 (DeepEP's
 * rule). topk_idx / topk_weights [num_tokens, num_topk] (num_topk 0: none).
 * is_token_in_rank [num_tokens, R] names the destinations.
 * cached_rank_prefix_matrix NULL: the counts of the preceding
 * mep_ep_notify_dispatch; else a previous dispatch's matrix (the cached
 * mode: no count exchange; the same is_token_in_rank).
 * Outputs, recv_capacity rows each (>= the rows received, DeepEP's
 * num_worst_tokens; rows past them are not written): recv_x [.., hidden];
 * recv_x_scales [.., num_scales] (FP8); recv_src_idx int32 (the token's
 * index on its source; may be NULL); recv_topk_idx int64 [.., num_topk]
 * (the expert minus this rank's first, -1 for experts elsewhere);
 * recv_topk_weights float (0 where recv_topk_idx is -1); send_head int32
 * [num_tokens, R] (the row token t lands in on rank r, -1 for none; may
 * be NULL); recv_channel_prefix_matrix int32 [R, num_channels] (may be
 * NULL; non-cached only: where source s's channel c starts here). */
typedef struct mep_ep_normal_dispatch_args {
  size_t struct_size; /* sizeof(mep_ep_normal_dispatch_args_t) */
  const void *x;
  int num_tokens, hidden, x_elem_size;
  const void *x_scales;
  int num_scales;
  int64_t scale_token_stride, scale_hidden_stride;
  const int64_t *topk_idx;
  const float *topk_weights;
  int num_topk, num_experts;
  const uint8_t *is_token_in_rank;
  const int32_t *cached_rank_prefix_matrix;
  int num_channels;
  int32_t *active_ranks;
  int64_t timeout_us;
  int recv_capacity;
  void *recv_x;
  void *recv_x_scales;
  int32_t *recv_src_idx;
  int64_t *recv_topk_idx;
  float *recv_topk_weights;
  int32_t *send_head;
  int32_t *recv_channel_prefix_matrix;
  void *stream; /* ignored on the CPU path */
} mep_ep_normal_dispatch_args_t;
MEP_API int mep_ep_normal_dispatch(mep_ep_normal_t *buf,
                                   const mep_ep_normal_dispatch_args_t *args);

/* Sends the rows x [num_recv_tokens, hidden] bf16 (in the order the
 * dispatch delivered them) back to their sources and writes, for each of
 * this rank's num_tokens tokens, combined_x[t] = bias_0[t] + bias_1[t] +
 * the sum of the rows of t that the ranks r with is_token_in_rank[t][r]
 * sent back, in float, rounded to bf16 once (DeepEP: no weights applied).
 * With num_topk > 0, topk_weights [num_recv_tokens, num_topk] travel too
 * and combined_topk_weights [num_tokens, num_topk] gets their sum over
 * the same ranks; every rank passes the same num_topk. bias_0,
 * bias_1: [num_tokens, hidden] bf16 or NULL. rank_prefix_matrix and
 * is_token_in_rank: the dispatch's. Inactive ranks' rows are left out. */
typedef struct mep_ep_normal_combine_args {
  size_t struct_size; /* sizeof(mep_ep_normal_combine_args_t) */
  const void *x;
  int num_recv_tokens, hidden;
  const float *topk_weights;
  int num_topk;
  const void *bias_0, *bias_1;
  const int32_t *rank_prefix_matrix;
  const uint8_t *is_token_in_rank;
  int num_tokens;
  int32_t *active_ranks;
  int64_t timeout_us;
  void *combined_x;
  float *combined_topk_weights;
  void *stream;
  /* Added after the first release (a smaller struct_size means NULL):
   * the dispatch's send_head [num_tokens, R]; the CUDA path needs it
   * (where each token's rows are), the CPU path does not read it. */
  const int32_t *send_head;
  /* The CUDA path's send uses 2 x num_channels blocks (DeepEP's
   * config.num_sms); 0 (or a struct without it): every SM. */
  int num_channels;
} mep_ep_normal_combine_args_t;
MEP_API int mep_ep_normal_combine(mep_ep_normal_t *buf,
                                  const mep_ep_normal_combine_args_t *args);

#ifdef __cplusplus
}
#endif
#endif /* MEP_EP_H */
