/* devcoll.h - kernel-driven collectives between the GPUs (or processes
 * sharing a GPU) of one host, over workspaces that every rank maps.
 *
 * Every rank owns a workspace of ws_bytes in device memory with the same
 * layout on every rank, and sees every peer's through a mapped pointer
 * (CUDA IPC). Kernels only ever write their own rank's workspace and read
 * the peers' ones ("direct read"), so a round needs no remote writes.
 *
 * Workspace layout: a flags region (round counter, per-block barrier
 * flags) followed by two data buffers used alternately by consecutive
 * rounds, so a round never overwrites data a peer may still be reading
 * from the previous one. Barrier flags carry the round counter, which the
 * kernels increment themselves: no sequence number is a kernel argument,
 * so a launch captured in a CUDA graph replays correctly.
 *
 * Every function enqueues on `stream` without synchronising the host or
 * allocating, and may be captured in a CUDA graph. One call is one
 * launch; sizes larger than the workspace stages at once go in rounds
 * inside it, alternating the two data buffers. Every rank
 * must call the same functions with the same sizes, in the same order, with
 * the same ws_bytes and sms. Returns 0 or a negative MEP_ERR_*; the message
 * of the last failure on this thread is mep__dc_last_error(). */
#ifndef MEP_SRC_CUDA_DEVCOLL_H
#define MEP_SRC_CUDA_DEVCOLL_H

#include <stddef.h>
#include <stdint.h>

#include <mep/mep.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Total bytes at or below which allreduce algo 0 (auto) picks one-shot. */
#define MEP__DC_ONESHOT_MAX (512u * 1024u)
/* Total bytes at or below which broadcast algo 0 pulls all from the root. */
#define MEP__DC_BCAST_DIRECT_MAX (512u * 1024u)
/* Most ranks of one group (a rank mask is a 32-bit word; kept small so the
 * per-element loads of all ranks stay in registers). */
#define MEP__DC_MAX_RANKS 16

typedef struct mep__dc_group {
  int rank, nranks;          /* this rank's index; ranks 0..nranks-1 */
  void *const *peer_ws;      /* DEVICE array [nranks] of mapped workspace
                                bases; [rank] is our own */
  size_t ws_bytes;           /* bytes of each workspace */
  volatile int32_t *active;  /* device-visible [nranks]: 1 active, 0 not;
                                kernels set an entry to 0 on a timeout */
  volatile uint32_t *status; /* device-visible word: kernels OR in bit r
                                when rank r timed out */
  uint64_t timeout_ns;       /* wait for a peer at most this; 0 = 10 s */
  int sms;                   /* max blocks per launch (0 = pick) */
  /* Host side only: `active` as the host reads it (mapped pinned memory),
   * or NULL, and then every launch asks the driver what `active` is. */
  const volatile int32_t *host_active;
} mep__dc_group_t;

/* Smallest useful workspace for nranks ranks. */
size_t mep__dc_ws_min(int nranks);

/* Bytes of payload one round moves (allreduce/broadcast: bytes of the
 * buffer; allgather: bytes of each rank's block; alltoall and
 * reduce_scatter: bytes summed over the per-rank pieces). 0 if g is
 * invalid. */
size_t mep__dc_chunk_max(const mep__dc_group_t *g);

/* Zeroes the flags region of a workspace; call once on every rank before
 * its first collective (and again only when no launch on it is pending). */
int mep__dc_init_ws(void *ws, size_t ws_bytes, void *stream);

/* algo: 0 auto, 1 one-shot, 2 two-shot, 3 push (two ranks with a 16-byte
 * aligned send; two-shot elsewhere; auto picks it over two-shot there).
 * send may equal recv. */
int mep__dc_allreduce(const mep__dc_group_t *g, const void *send, void *recv,
                      size_t count, mep_dtype_t dt, mep_op_t op, int algo,
                      void *stream);
/* recv holds nranks blocks of bytes_per_rank; send may be our own block. */
int mep__dc_allgather(const mep__dc_group_t *g, const void *send, void *recv,
                      size_t bytes_per_rank, void *stream);
/* send holds nranks slices of count_per_rank; recv gets our reduced one. */
int mep__dc_reduce_scatter(const mep__dc_group_t *g, const void *send,
                           void *recv, size_t count_per_rank, mep_dtype_t dt,
                           mep_op_t op, void *stream);
/* Block r of send goes to rank r's recv block [our rank]; send may equal
 * recv. */
int mep__dc_alltoall(const mep__dc_group_t *g, const void *send, void *recv,
                     size_t bytes_per_rank, void *stream);
/* algo: 0 auto (split above MEP__DC_BCAST_DIRECT_MAX on 3 ranks or more),
 * 1 direct (every rank pulls all from the root), 2 split (the others pull
 * a piece each from the root, then each other's pieces). */
int mep__dc_broadcast(const mep__dc_group_t *g, void *buf, size_t bytes,
                      int root, int algo, void *stream);

/* dst[i] = dst[i] op src[i] on the stream; MEP_AVG is a sum here. */
int mep__dc_reduce_local(void *dst, const void *src, size_t count,
                         mep_dtype_t dt, mep_op_t op, void *stream);
/* buf[i] /= n (floating types: one IEEE division, float16/bfloat16 in
 * float; integers truncate toward zero; bool is refused). */
int mep__dc_scale_avg(void *buf, size_t count, mep_dtype_t dt, int n,
                      void *stream);

/* The message of this thread's last failed mep__dc_* call, or "". */
const char *mep__dc_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
