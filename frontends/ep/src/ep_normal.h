/* ep_normal.h - the normal mode's buffer, between its CPU path and common
 * steps (ep_normal.c) and its CUDA path (cuda/ep_normal_cuda.c): the
 * areas of a rank's memory and the shape of the messages. */
#ifndef MEP_EP_NORMAL_H
#define MEP_EP_NORMAL_H

#include <stdint.h>

#include "mep/ep.h"

#define MEP__EPN_ALIGN 64u
#define MEP__EPN_PAGE 4096u
#define MEP__EPN_CW_HDR 5 /* count slot: status, num_tokens, num_experts,
                           * dmsg, cmsg */

/* Offsets of a rank's areas (ep_normal.c's header comment). The CUDA path
 * cuts its device window the same way; its count exchange (a kernel, or
 * the host region's head bytes for host arrays) uses ncnt, and the
 * window's cnt slots hold its agreement and progress words instead. */
typedef struct mep__epn_lay {
  int R;
  uint64_t cw; /* bytes of one count slot */
  uint64_t nsig, dsig, csig, cnt, cnt_stage, ncnt;
  uint64_t head; /* bytes before the data areas */
  uint64_t pair, drecv, crecv, dstage, cstage, total;
} mep__epn_lay_t;

struct mep__epn_cuda;

struct mep_ep_normal {
  mep_comm_t *comm;
  int rank, size;
  mep_ep_normal_config_t cfg;
  int64_t timeout_us;
  mep__epn_lay_t lay;
  void *mem; /* host: the whole layout (CPU path) or the head (CUDA) */
  mep_region_t *region;
  int32_t *active;     /* host [R]: the CPU path's, notify's on CUDA */
  uint64_t nseq, dseq, cseq;
  /* from the last notify, for the dispatch that follows it: none (0),
   * counts on the host (1), or on the device only (2: the CUDA path's
   * kernel); either way what the dispatch's checks need */
  int notified;
  int nrecv;           /* tokens this rank receives */
  int worst, worst_s, worst_r; /* the largest pair count, its pair */
  int32_t *counts;     /* [R][R]: tokens source s sends rank r */
  int32_t *src_tokens; /* [R]: num_tokens of each source */
  int32_t *work;       /* [R][R]: a cached dispatch's or a combine's */
  int32_t *itr_count;  /* [R] scratch */
  int32_t *agreed;     /* [R] scratch of agree() */
  struct mep__epn_cuda *cuda; /* MEP_EP_CUDA */
};

static inline uint64_t mep__epn_al(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

/* A dispatch message: [int32 source token | 12 pad | x (hidden * elem
 * bytes, a multiple of 16) | scales (4 bytes each) | pad to 8 | topk_idx
 * int64 [K] | topk_weights float [K]], padded to 16 bytes. A combine
 * message: [bf16 row | float weights [K]], padded to 16 bytes. */
static inline uint64_t mep__epn_dmsg_idx_off(int hidden, int es, int scales) {
  return mep__epn_al(16 + mep__epn_al((uint64_t)hidden * (uint64_t)es, 16) +
                         4 * (uint64_t)scales, 8);
}
static inline uint64_t mep__epn_dmsg_bytes(int hidden, int es, int scales,
                                           int k) {
  return mep__epn_al(mep__epn_dmsg_idx_off(hidden, es, scales) +
                         12 * (uint64_t)k, 16);
}
static inline uint64_t mep__epn_cmsg_bytes(int hidden, int k) {
  return mep__epn_al(2 * (uint64_t)hidden + 4 * (uint64_t)k, 16);
}

/* The errors of a count exchange, on either path (MEP_ERR_INVALID, or
 * MEP_ERR_MISMATCH for another rank's message shape; pair_error: 0 when
 * n messages of msg bytes fit a pair's bytes). */
int mep__epn_pair_error(const mep_ep_normal_t *b, int s, int r, int32_t n,
                        uint64_t msg, const char *fn, const char *what);
int mep__epn_shape_error(int s, const int32_t shape[3], int E, int dmsg,
                         int cmsg, const char *fn);
int mep__epn_status_error(const mep_ep_normal_t *b, int s, const char *fn);

#ifdef MEP_HAVE_CUDA
/* The CUDA path (cuda/ep_normal_cuda.c). create: collective, after the
 * host part of b is made; makes b->cuda (the device window of
 * b->lay.total bytes and the kernels' state). dispatch and combine take
 * arguments ep_normal.c validated and counts (device or host) as below. */
int mep__epn_cuda_create(mep_ep_normal_t *b);
void mep__epn_cuda_destroy(mep_ep_normal_t *b);
/* mep_ep_get_dispatch_layout with MEP_EP_CUDA, its arguments checked
 * but for the indices. */
int mep__epn_cuda_layout(const mep_ep_layout_args_t *a);
/* The buffer's device active ranks (int32 [R]). */
int32_t *mep__epn_cuda_active(mep_ep_normal_t *b);
/* Copies the device active ranks to host (to_host 1) or back (0),
 * synchronously. */
int mep__epn_cuda_sync_active(mep_ep_normal_t *b, int32_t *host, int to_host);
/* mep_ep_notify_dispatch with device arrays (args checked): queues the
 * exchange on args->stream, waits for what the host needs and fills b's
 * notify fields (notified 2). */
int mep__epn_cuda_notify(mep_ep_normal_t *b, const mep_ep_notify_args_t *a,
                         int32_t *active, int64_t timeout_us);
/* host_counts: the host notify's [R][R] counts, or NULL: a cached
 * dispatch's (args->cached_rank_prefix_matrix, device memory), else the
 * device notify's. */
int mep__epn_cuda_dispatch(mep_ep_normal_t *b,
                           const mep_ep_normal_dispatch_args_t *a,
                           const int32_t *host_counts, int32_t *active,
                           int64_t timeout_us);
int mep__epn_cuda_combine(mep_ep_normal_t *b,
                          const mep_ep_normal_combine_args_t *a, int channels,
                          int32_t *active, int64_t timeout_us);
#endif

#endif /* MEP_EP_NORMAL_H */
