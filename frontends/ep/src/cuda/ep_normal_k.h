/* ep_normal_k.h - between the normal mode's CUDA host code
 * (ep_normal_cuda.c) and its kernels (ep_normal_dispatch.cu,
 * ep_normal_combine.cu). Plain C and CUDA.
 *
 * The window is cut as the CPU path's memory (ep_normal.c): per-source
 * receive areas in two halves, stages for the proxy, the signal words of
 * the count exchange, dispatch and combine. The exchange's kernel
 * (ep_normal_notify.cu) puts a source's counts in the ncnt slots, so the
 * window's count slots hold the agreement words instead: slot (half, s)
 * holds rank s's view of the active ranks after its waits, W = ceil(R /
 * 32) words each for dispatch, combine and the count exchange, each
 * (seq << 32) | 32 bits.
 * After them, at `prog` in the slot, the dispatch's progress words for a
 * mapped source: (seq << 32) | its number of send blocks, then per block
 * (seq << 32) | its first place in this rank's area and (seq << 32) |
 * the rows it has stored so far, so that this rank's receive copies rows
 * while the source still sends (ep_normal_dispatch.cu). At the slot's
 * end, at `cprog`, combine's phase words: (seq << 32) | 1 once the
 * source has stored the rows of phase g (ep_normal_combine.cu).
 * Call numbers live in device memory (mep__ep_dstate_t's seq, per kind),
 * as in the low-latency kernels, so calls replay in CUDA graphs. */
#ifndef MEP_EP_NORMAL_K_H
#define MEP_EP_NORMAL_K_H

#include <stdint.h>

#include "ep_cuda.h"
#include "mep/device.h"
#include "mep/ep.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most ranks of a CUDA normal buffer (the agreement's masks live in
 * shared memory). */
#define MEP__EPN_MAX_RANKS 1024

/* The agreement words of an agree slot, W words each, in this order
 * (epn_agree's `which`). */
enum {
  MEP__EPN_AGREE_DISPATCH,
  MEP__EPN_AGREE_COMBINE,
  MEP__EPN_AGREE_NOTIFY,
  MEP__EPN_AGREE_KINDS
};

/* Phases of combine's send, each announced by a word per destination
 * (ep_normal_combine.cu). */
#define MEP__EPN_CPHASES 16

typedef struct mep__epn_state {
  mep__ep_dstate_t d;  /* seq, done (last block) and mark per kind */
  unsigned int lost[MEP__EPN_MAX_RANKS / 32]; /* sources whose wait gave up
                                               * in the dispatch receive
                                               * (its last block clears) */
  unsigned int clost[MEP__EPN_MAX_RANKS / 32]; /* the same in combine's */
  unsigned int cphase[MEP__EPN_CPHASES]; /* combine's send blocks done with
                                          * each phase (the last resets) */
  uint64_t nseq;       /* count exchanges completed */
  unsigned int ndone;  /* its blocks finished (last-block pattern) */
  unsigned int nbad;   /* some column of is_token_in_rank disagrees with
                        * num_tokens_per_rank (the last block resets) */
} mep__epn_state_t;

/* What the count exchange's kernel publishes for the host, in mapped host
 * memory: seq last, after the rest. */
typedef struct mep__epn_nres {
  uint64_t seq;       /* the exchange these fields are of */
  int32_t nrecv;      /* tokens this rank receives */
  int32_t bad;        /* the first source whose is_token_in_rank disagrees
                       * with its num_tokens_per_rank, or -1 */
  int32_t other;      /* the first source of another message shape, or -1 */
  int32_t shape[3];   /* its num_experts, dispatch and combine bytes */
  int32_t worst, worst_s, worst_r; /* the largest pair count and its pair */
  int32_t per_expert[MEP_EP_MAX_LOCAL_EXPERTS]; /* rounded up */
} mep__epn_nres_t;

typedef struct mep__epn_k {
  const mep_dev_win_t *win;  /* device */
  mep__epn_state_t *st;      /* device */
  int rank, R, has_proxy;
  int has_mlx5;              /* as mep__ep_kcommon_t's */
  uint64_t timeout_ns;
  int32_t *active;           /* device [R], the call's */
  /* offsets of the window's areas; P bytes per (half, source) */
  uint64_t P, drecv, crecv, dstage, cstage, dsig, csig, agree, agree_slot;
  uint64_t prog;             /* progress words' offset in an agree slot */
  uint64_t cprog;            /* combine's phase words' offset there */
  const int32_t *rpm;        /* device [R][R]: rank_prefix_matrix */
  const int32_t *src_tokens; /* device [R]: each source's num_tokens, for
                              * recv_channel_prefix_matrix; NULL: none */
  int send_blocks, send_threads, recv_blocks, recv_threads;
  int recv_rows;             /* dispatch: rows the receive may get (its
                              * blocks: recv_blocks SMs' worth, at most a
                              * warp per row) */
  int num_tokens;
  const int32_t *send_head_in; /* combine: the dispatch's send_head */
  /* dispatch */
  const uint8_t *x;
  int hidden, es, num_scales;
  const uint8_t *x_scales;
  int64_t sts, shs;          /* scale strides, in elements */
  const int64_t *topk_idx;
  const float *topk_w;
  int K, L;
  const uint8_t *in_rank;    /* [num_tokens][R] */
  int32_t *send_head;        /* [num_tokens][R], written */
  uint64_t dmsg, idx_off;
  uint8_t *recv_x, *recv_scales;
  int32_t *recv_src;
  int64_t *recv_topk;
  float *recv_w;
  int32_t *rcpm;
  int C;
  /* combine */
  const uint16_t *cx;
  const float *cw;
  const uint16_t *bias0, *bias1;
  uint16_t *out;
  float *out_w;
  uint64_t cmsg;
  /* the count exchange (in_rank, num_tokens, L, C, dmsg and cmsg too) */
  const int32_t *per_rank;   /* [R] */
  const int32_t *per_expert; /* [L * R] */
  int32_t *rpm_out, *cpm_out; /* [R][R], [R][C] (NULL: not wanted) */
  int32_t *counts;           /* [R][R] + [R]: rank_prefix_matrix and the
                              * sources' num_tokens, for the dispatch */
  mep__epn_nres_t *res;      /* mapped host memory, its device address */
  uint64_t nsig, ncnt, cnt_stage, slot; /* slot: bytes of a count slot */
  int E, align;
} mep__epn_k_t;

/* mep_ep_get_dispatch_layout on device memory (ep_normal_layout.cu). */
typedef struct mep__epn_layout_k {
  const int64_t *topk_idx; /* [N][K] */
  int N, K, E, R, L, H, rph; /* H hosts of rph ranks (0: not counted) */
  int32_t *per_rank, *per_host, *per_expert;
  uint8_t *in_rank;          /* [N][R] */
} mep__epn_layout_k_t;

/* Queues the layout kernel on `stream`; a cudaError_t (0: queued). */
int mep__epn_launch_layout(const mep__epn_layout_k_t *k, void *stream);

/* Queue the kernels of an operation on `stream`; cudaGetLastError()'s
 * code (0: queued). */
int mep__epn_launch_notify(const mep__epn_k_t *k, void *stream);
int mep__epn_launch_dispatch(const mep__epn_k_t *k, void *stream);
int mep__epn_launch_combine(const mep__epn_k_t *k, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* MEP_EP_NORMAL_K_H */
