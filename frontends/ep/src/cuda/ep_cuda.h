/* ep_cuda.h - between the CUDA path's host code (ep_cuda.c, C) and its
 * kernels (ep_dispatch_*.cu, ep_combine_*.cu, ep_reduce_*.cu): the device
 * state of a buffer and what each launch takes. Plain C and CUDA.
 *
 * Nothing per call comes from the host but kernel arguments: the call
 * numbers (seq) live in device memory and the last block of each kernel
 * advances its own, so a call captured in a CUDA graph replays right.
 * Each kind (dispatch send, dispatch receive, combine send, combine
 * receive) counts its calls apart, from 1; on every rank the k-th call of a
 * kind has seq k, which is what the signal words carry. */
#ifndef MEP_EP_CUDA_H
#define MEP_EP_CUDA_H

#include <stdint.h>

#include "layout.h"
#include "mep/device.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MEP__EP_DS, MEP__EP_DR, MEP__EP_CS, MEP__EP_CR, MEP__EP_KINDS };

/* Threads of the kernels that work a warp per row (dispatch receive,
 * combine send): their __launch_bounds__, which leaves them registers
 * for the batched copies. */
#define MEP__EP_WARP_THREADS 256
/* 16-byte units a warp copies in one batch (32 lanes x 8 loads in
 * flight); a combine row is sent in chunks of this many units. */
#define MEP__EP_CHUNK_UNITS 256

/* Device memory, zeroed at creation. */
typedef struct mep__ep_dstate {
  uint64_t seq[MEP__EP_KINDS];      /* calls of each kind completed */
  unsigned int done[MEP__EP_KINDS]; /* blocks of the running kernel that
                                     * finished ("last block" pattern) */
  /* The proxy ring's tail after the last dispatch / combine send: the
   * next send of that kind reuses the stages only once the proxy has
   * carried out every command up to it. */
  unsigned long long mark[2];
  /* A wait of the running dispatch receive failed (a source missed its
   * deadline): its blocks' views of the counts may differ, and the last
   * block lays the rows out again from block 0's (ep_dispatch_recv.cu). */
  unsigned int dr_lost;
  /* Reduce-mode send blocks done publishing the weights: the last one
   * puts them to proxied ranks and then sets pub_seq to the call's seq
   * (ep_reduce_send.cu). */
  unsigned int pub_done;
  unsigned long long pub_seq;
} mep__ep_dstate_t;

/* What every kernel takes (by value). */
typedef struct mep__ep_kcommon {
  const mep_dev_win_t *win;  /* device */
  mep__ep_layout_t lay;
  int rank;
  int has_proxy;             /* the window has a host part and a ring */
  int has_mlx5;              /* some peer is MEP_DEV_MLX5: the kernels
                              * instantiated with win.cuh's MLX5 branches */
  mep__ep_dstate_t *st;      /* device */
  int32_t *active;           /* device [ranks], the call's */
  uint64_t timeout_ns;
  /* the receive is launched as a programmatic dependent of the send of
   * the same call (both phases, sm_90 and later): it starts while the
   * send still runs (see ep_dev.cuh, ep_early_start) */
  int early_recv;
  /* MEP_EP_TRACE=1: %globaltimer stamps of each block of the last call
   * of each kind, [kind][MEP__EP_TRACE_BLOCKS][5] (start, waited or work
   * done, end of the last block, where a kernel has it the block's work
   * done after its wait, and its entry into the kernel); mapped host
   * memory. NULL: off. */
  uint64_t *trace;
  /* device [MEP__EP_KINDS][ranks]: a word of the call that a source
   * without mapped memory left in the host part, as the one block of
   * that kind which polls it there saw it (ep_dev.cuh: ep_wait_host) */
  uint64_t *seen;
} mep__ep_kcommon_t;

#define MEP__EP_TRACE_BLOCKS 1024
enum {
  MEP__EP_T_START,
  MEP__EP_T_MID,
  MEP__EP_T_END,
  MEP__EP_T_WORK,
  MEP__EP_T_ENTRY,
  MEP__EP_T_FIELDS
};

typedef struct mep__ep_kdisp {
  mep__ep_kcommon_t c;
  int *slots;                /* device [2][experts]: tokens sent to each
                              * expert in the call of that half */
  /* send */
  const uint16_t *x;
  const int64_t *topk_idx;
  int num_tokens, num_topk;
  int fp8, round_scale;
  /* receive */
  int ue8m0;
  void *recv_x;
  void *recv_scales;
  int32_t *src_info;
  int64_t *layout_range;
  int32_t *recv_count;
  int32_t *recv_stats;       /* device [local] or NULL: += recv_count */
  /* launch shape */
  int send_blocks, send_threads;
  int recv_group;             /* local experts whose blocks share rows */
  int recv_split, recv_threads; /* blocks per group, threads each */
} mep__ep_kdisp_t;

typedef struct mep__ep_kcomb {
  mep__ep_kcommon_t c;
  unsigned int *pair_done;   /* device [local][ranks]: blocks of the
                              * (expert, source) pair that finished */
  /* send */
  const uint16_t *x;         /* [local, ranks * tokens, hidden] */
  const int32_t *src_info;
  const int64_t *layout_range;
  /* pull mode (zero-copy, both phases in this call, MEP_EP_COMBINE_PULL
   * not 0): the send leaves the rows for mapped peers (itself included)
   * where they are, in the combine stage, and tells each peer which rows
   * are its; the receive reads mapped peers' rows there and ends only once
   * they have read this rank's */
  int pull;
  /* reduce mode (no MEP_DEV_MLX5 peer, and 3 local experts or more
   * where a peer is proxied; top-k > 2 x ranks, or
   * MEP_EP_COMBINE_REDUCE=1; ep_reduce_send.cu): each rank sums the
   * rows of its experts per token, weighted, and sends that one float
   * row instead of one bf16 row per expert */
  int reduce;
  /* MEP_EP_COMBINE_PARTIAL=bf16: reduce mode's sums cross the link as
   * bf16 rows (2H bytes) instead of float ones (4H), rounded once more
   * (docs/ep.md); every rank must set it alike */
  int partial_bf16;
  unsigned int *red_done;    /* device [ranks]: blocks of the reduce send
                              * for that source that finished */
  /* receive */
  const int64_t *topk_idx;
  const float *topk_weights;
  uint16_t *out;
  int num_tokens, num_topk;
  /* launch shape */
  int send_split, send_threads; /* blocks per (expert, source) pair; in
                                 * reduce mode, per source */
  int recv_blocks, recv_threads;
} mep__ep_kcomb_t;

/* MEP_EP_TRACE (ep_trace.c): the stamps' memory, and the blocks of the
 * last launch of each kind. */
typedef struct mep__ep_trace {
  uint64_t *host, *dev;
  int blocks[MEP__EP_KINDS];
} mep__ep_trace_t;
/* Allocates the stamps when MEP_EP_TRACE=1 (else, or without mapped
 * memory, leaves *t off); returns 0. */
int mep__ep_trace_init(mep__ep_trace_t *t);
/* Prints the last call's summary on stderr and frees the stamps. */
void mep__ep_trace_report(mep__ep_trace_t *t, int rank);

/* Host side, before a window a proxy serves is freed: peers' commands
 * may still be on their way to this rank when its calls are done, so
 * every rank drains its proxy, then all meet (a barrier of comm). A
 * failure is only reported on stderr (fn, rank): the buffer goes anyway.
 * Nothing to do without a proxy. */
void mep__ep_devwin_leave(mep_comm_t *comm, mep_devwin_t *win,
                          const char *fn, int rank);

/* An environment switch set to 0 (a diagnosis aid, docs/ep.md): read
 * when a buffer is made, not per call. */
int mep__ep_env_off(const char *name);

/* 0 when p (may be NULL) is aligned to `a` bytes, which the kernels'
 * vector accesses need; else MEP_ERR_INVALID naming fn and what. */
int mep__ep_check_align(const char *fn, const char *what, const void *p,
                        uintptr_t a);

/* Each queues its phase of the operation's kernel on `stream` and returns
 * cudaGetLastError()'s code (0: queued). */
int mep__ep_launch_dispatch_send(const mep__ep_kdisp_t *k, void *stream);
int mep__ep_launch_dispatch_recv(const mep__ep_kdisp_t *k, void *stream);
int mep__ep_launch_combine_send(const mep__ep_kcomb_t *k, void *stream);
int mep__ep_launch_combine_recv(const mep__ep_kcomb_t *k, void *stream);
/* Reduce mode (ep_reduce_*.cu): the send (publish the weights, then
 * sum and send), and the receive. */
int mep__ep_launch_reduce_send(const mep__ep_kcomb_t *k, void *stream);
int mep__ep_launch_reduce_recv(const mep__ep_kcomb_t *k, void *stream);
/* Blocks of the combine / dispatch kernel (push mode's) one SM holds at
 * once with `threads` threads each (0: unknown); the combine's as
 * instantiated for has_mlx5. */
int mep__ep_combine_send_per_sm(int threads, int has_mlx5);
int mep__ep_dispatch_recv_per_sm(int threads);
/* Whether some peer of win is reached through MEP_DEV_MLX5. */
int mep__ep_win_has_mlx5(const mep_devwin_t *win, int size);

#ifdef __cplusplus
}
#endif
#endif /* MEP_EP_CUDA_H */
