/* dc_sync.cuh - workspace layout, launch counter and per-block barriers
 * of the device collectives (device side, included by the kernels).
 *
 * A launch's blocks never synchronise with each other: block b of a rank
 * only exchanges data with block b of its peers, and every rank splits the
 * work identically, so per-block flags are enough.
 *
 * A launch moves a message in rounds of at most one buffer's worth; every
 * round takes the next value of the counter ("seq") and so the other data
 * buffer. The counter lives in our own flags region; every block reads it
 * at start, and the last block to finish stores the seq of the launch's
 * last round (one writer), which the next launch on the stream reads. A
 * flag holds the seq of the last round that raised it, so a waiter waits
 * for flag >= seq.
 *
 * Reusing a buffer two rounds later is safe per block: block b of a rank
 * writes buffer X in round k + 2 only after it passed round k + 1's first
 * barrier, so block b of every peer it waits for has finished round k
 * (and stream order covers the launch before). That holds only because a
 * block owns the same bytes of a buffer in every round of a launch (see
 * dc_range): no other block of a peer ever reads them. */
#ifndef MEP_SRC_CUDA_DC_SYNC_CUH
#define MEP_SRC_CUDA_DC_SYNC_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "devcoll.h"

#define DC_MAX_BLOCKS 64
#define DC_NPHASE 2
#define DC_THREADS 512
/* 16-byte words each thread has in flight in a copy: one load per thread
 * at a time cannot cover NVLink's latency. */
#define DC_COPY_UNROLL 8
#define DC_FLAGS_BYTES 4096
#define DC_SEQ_OFF 0
#define DC_DONE_OFF 8
/* The launch's snapshot of active[]: (tag << 32) | mask of active ranks,
 * tag being the low 32 bits of the launch's first seq (dc_begin). */
#define DC_SNAP_OFF 16
#define DC_FLAG_OFF 64
#define DC_DEFAULT_TIMEOUT_NS 10000000000ull
/* Spins between two looks at active[] (mapped host memory, slow to read). */
#define DC_ACTIVE_POLL 256
/* How long a block waits for block 0's snapshot of active[] before it
 * reads active[] itself (block 0 normally starts with the others). */
#define DC_SNAP_WAIT_NS 20000ull

/* What every kernel needs of the group; passed by value. */
struct DcCtx {
  void *const *peer_ws;
  volatile int32_t *active;
  volatile uint32_t *status;
  unsigned long long timeout_ns;
  size_t buf_bytes; /* bytes of each of the two data buffers */
  size_t chunk;     /* offset of the result area inside a buffer */
  int rank, nranks;
};

/* Per-block state, in shared memory. */
struct DcBlock {
  char *ws[MEP__DC_MAX_RANKS];
  const char *src[MEP__DC_MAX_RANKS]; /* reduction sources, rank order */
  unsigned long long base; /* seq of the launch's first round */
  unsigned long long seq;  /* seq of the current round (dc_round) */
  unsigned int start_mask;
  unsigned int mask[DC_NPHASE];
  int have_snap; /* dc_begin: block 0's snapshot arrived */
};

__device__ __forceinline__ unsigned long long dc_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned long long
dc_ld_acquire(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];"
               : "=l"(v)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void dc_st_release(unsigned long long *p,
                                              unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v)
               : "memory");
}

__device__ __forceinline__ unsigned long long *dc_flag(char *ws, int block,
                                                       int phase) {
  return (unsigned long long *)(ws + DC_FLAG_OFF) + block * DC_NPHASE + phase;
}

/* The data buffer of round `seq` in rank r's workspace. */
__device__ __forceinline__ char *dc_buf_seq(const DcCtx &c, const DcBlock &sb,
                                            int r, unsigned long long seq) {
  return sb.ws[r] + DC_FLAGS_BYTES + (size_t)(seq & 1) * c.buf_bytes;
}

/* The data buffer of the current round in rank r's workspace. */
__device__ __forceinline__ char *dc_buf(const DcCtx &c, const DcBlock &sb,
                                        int r) {
  return dc_buf_seq(c, sb, r, sb.seq);
}

/* Area seq % 4 of rank r's workspace: a half (one result area's size,
 * c.chunk) of the buffer of round seq. For a kernel that reads a round's
 * data one round after its barrier (dc_k_broadcast_split), so that it
 * stays in place three rounds, not one. */
__device__ __forceinline__ char *dc_area(const DcCtx &c, const DcBlock &sb,
                                         int r, unsigned long long seq) {
  return dc_buf_seq(c, sb, r, seq) + (size_t)((seq >> 1) & 1) * c.chunk;
}

/* Reads the launch counter and the active set. active[] is mapped host
 * memory, and its reads by every block of a launch at once queue up behind
 * each other (the suspected fixed cost of launches with many blocks), so
 * block 0 alone reads it and hands the set to the other blocks in our own
 * workspace, tagged with the launch's first seq. A block that does not see
 * it in time reads active[] itself. A launch that finds our own rank
 * inactive does not advance the seq, so the next one may read its
 * snapshot: that says inactive again, which stays true (entries are only
 * ever cleared). Returns false (in every thread) when our own rank is
 * inactive: the block then does nothing. */
__device__ __forceinline__ bool dc_begin(const DcCtx &c, DcBlock &sb) {
  int t = threadIdx.x;
  if (t < c.nranks) sb.ws[t] = (char *)c.peer_ws[t];
  if (t == 0) {
    sb.start_mask = 0;
    for (int p = 0; p < DC_NPHASE; ++p) sb.mask[p] = 1u << c.rank;
  }
  __syncthreads();
  volatile unsigned long long *snap =
      (volatile unsigned long long *)(sb.ws[c.rank] + DC_SNAP_OFF);
  if (t == 0) {
    sb.base = *(volatile unsigned long long *)(sb.ws[c.rank] + DC_SEQ_OFF) + 1;
    sb.seq = sb.base;
    sb.have_snap = 0;
    const unsigned long long tag = sb.base & 0xffffffffull, t0 = dc_now();
    while (blockIdx.x != 0) {
      unsigned long long v = *snap;
      if ((v >> 32) == tag) {
        sb.start_mask = (unsigned int)v;
        sb.have_snap = 1;
        break;
      }
      if (dc_now() - t0 > DC_SNAP_WAIT_NS) break;
    }
  }
  __syncthreads();
  if (!sb.have_snap) { /* the same in every thread */
    if (t < c.nranks && c.active[t] != 0) atomicOr(&sb.start_mask, 1u << t);
    __syncthreads();
    if (t == 0 && blockIdx.x == 0)
      *snap = ((sb.base & 0xffffffffull) << 32) | sb.start_mask;
  }
  return (sb.start_mask >> c.rank) & 1u;
}

/* Starts round k of the launch (0 first): its seq, hence its buffer. The
 * first __syncthreads lets every thread finish with the previous round's
 * seq and shared state (sources, masks). */
__device__ __forceinline__ void dc_round(DcBlock &sb, unsigned long long k) {
  __syncthreads();
  if (threadIdx.x == 0) sb.seq = sb.base + k;
  __syncthreads();
}

/* Drops rank r: another block (or an earlier launch) may already have. */
__device__ __forceinline__ void dc_drop(const DcCtx &c, int r) {
  c.active[r] = 0;
  __threadfence_system();
  atomicOr((unsigned int *)c.status, 1u << r);
}

/* Waits until peer r raised flag (block, phase) to seq. False when r is,
 * or becomes, inactive, or timed out (then r is dropped). */
__device__ inline bool dc_wait_peer(const DcCtx &c, const DcBlock &sb, int r,
                             int phase) {
  const unsigned long long *f = dc_flag(sb.ws[r], blockIdx.x, phase);
  unsigned long long t0 = dc_now();
  for (unsigned int i = 1;; ++i) {
    if (dc_ld_acquire(f) >= sb.seq) return true;
    if (i % DC_ACTIVE_POLL == 0 && c.active[r] == 0) return false;
    if (dc_now() - t0 > c.timeout_ns) {
      dc_drop(c, r);
      return false;
    }
  }
}

/* Publishes this block's writes so far, raises our flag for `phase` and
 * waits for the same block of every rank in `wait`. Returns the ranks
 * whose flag arrived (ourselves included). */
__device__ inline unsigned int dc_barrier(const DcCtx &c, DcBlock &sb, int phase,
                                   unsigned int wait) {
  int t = threadIdx.x;
  /* Every reader of this phase's previous mask passed a __syncthreads
   * since (dc_round or the other phase's barrier). */
  if (t == 0) sb.mask[phase] = 1u << c.rank;
  /* The __syncthreads orders every thread's writes before thread 0's
   * release store, and a release is cumulative: it publishes them all at
   * system scope. (A __threadfence_system in each of the 512 threads did
   * the same 16 times per block.) */
  __syncthreads();
  if (t == 0) dc_st_release(dc_flag(sb.ws[c.rank], blockIdx.x, phase), sb.seq);
  if (t < c.nranks && t != c.rank && ((wait >> t) & 1u)) {
    if (dc_wait_peer(c, sb, t, phase)) atomicOr(&sb.mask[phase], 1u << t);
  }
  __syncthreads();
  return sb.mask[phase];
}

/* The last block of the launch advances the launch counter. */
__device__ __forceinline__ void dc_end(const DcCtx &c, const DcBlock &sb) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  char *own = sb.ws[c.rank];
  __threadfence();
  unsigned int prev = atomicAdd((unsigned int *)(own + DC_DONE_OFF), 1u);
  if (prev == gridDim.x - 1) {
    atomicExch((unsigned int *)(own + DC_DONE_OFF), 0u);
    *(volatile unsigned long long *)(own + DC_SEQ_OFF) = sb.seq;
    __threadfence();
  }
}

/* The j-th peer (0 < j < nranks) a rank reads from: the ranks after it in
 * turn. Were every rank to go through its peers in rank order, all of
 * them would read rank 0's memory at once, then rank 1's: one rank's
 * NVLink egress would carry the load of all while the others idle. */
__device__ __forceinline__ int dc_peer(const DcCtx &c, int j) {
  int r = c.rank + j;
  return r < c.nranks ? r : r - c.nranks;
}

/* Fills sb.src with base + off of every rank in mask, in rank order;
 * returns how many. */
__device__ __forceinline__ int dc_sources(const DcCtx &c, DcBlock &sb,
                                          unsigned int mask, size_t off) {
  if (threadIdx.x == 0) {
    int k = 0;
    for (int r = 0; r < c.nranks; ++r)
      if ((mask >> r) & 1u) sb.src[k++] = dc_buf(c, sb, r) + off;
  }
  __syncthreads();
  return __popc(mask);
}

/* This block's share [lo, hi) of a round of n items, n <= n0 (the
 * launch's first, largest round). Block b owns [b * span, (b + 1) * span)
 * of every round, span being whole units of n0 / blocks; the last block
 * also the rest. Later rounds only cut the shares short, so a block never
 * touches bytes another block owned in an earlier round (see the top). lo
 * is a multiple of unit whenever lo < hi. */
__device__ __forceinline__ void dc_range(size_t n0, size_t n, size_t unit,
                                         size_t *lo, size_t *hi) {
  size_t span = (n0 / unit + gridDim.x - 1) / gridDim.x * unit;
  size_t b = blockIdx.x;
  *lo = min(n, span * b);
  *hi = (b == gridDim.x - 1) ? n : min(n, span * (b + 1));
}

/* Share j of k of [lo, hi): whole units, the rest to the last share. */
__device__ __forceinline__ void dc_split(size_t lo, size_t hi, size_t unit,
                                         int k, int j, size_t *slo,
                                         size_t *shi) {
  size_t units = (hi - lo) / unit;
  size_t per = (units + k - 1) / k;
  *slo = lo + min(units, per * j) * unit;
  *shi = (j == k - 1) ? hi : lo + min(units, per * (j + 1)) * unit;
}

/* Each thread loads DC_COPY_UNROLL words (a block-stride apart, so a
 * warp's loads stay coalesced) before it stores any: the loads are
 * independent and in flight together. */
template <typename W>
__device__ __forceinline__ void dc_copy_w(char *dst, char *dst2,
                                          const char *src, size_t n) {
  W *d = (W *)dst, *d2 = (W *)dst2;
  const W *s = (const W *)src;
  const size_t words = n / sizeof(W), bd = blockDim.x;
  size_t i = threadIdx.x;
  for (; i + (DC_COPY_UNROLL - 1) * bd < words; i += DC_COPY_UNROLL * bd) {
    W v[DC_COPY_UNROLL];
#pragma unroll
    for (int u = 0; u < DC_COPY_UNROLL; ++u) v[u] = __ldcg(s + i + u * bd);
#pragma unroll
    for (int u = 0; u < DC_COPY_UNROLL; ++u) d[i + u * bd] = v[u];
    if (d2) {
#pragma unroll
      for (int u = 0; u < DC_COPY_UNROLL; ++u) d2[i + u * bd] = v[u];
    }
  }
  for (; i < words; i += bd) {
    W v = __ldcg(s + i);
    d[i] = v;
    if (d2) d2[i] = v;
  }
}

/* Block-cooperative copy of n bytes to dst and, unless NULL, to dst2, with
 * the widest word all addresses and n allow. Loads bypass L1: they may
 * read a peer's memory that changed since an earlier round. A thread
 * stores only the words it loaded itself, so src may equal dst or dst2. */
__device__ __forceinline__ void dc_copy2(char *dst, char *dst2,
                                         const char *src, size_t n) {
  uintptr_t a = (uintptr_t)dst | (uintptr_t)dst2 | (uintptr_t)src |
                (uintptr_t)n;
  if ((a & 15) == 0)
    dc_copy_w<uint4>(dst, dst2, src, n);
  else if ((a & 7) == 0)
    dc_copy_w<unsigned long long>(dst, dst2, src, n);
  else if ((a & 3) == 0)
    dc_copy_w<unsigned int>(dst, dst2, src, n);
  else if ((a & 1) == 0)
    dc_copy_w<unsigned short>(dst, dst2, src, n);
  else
    dc_copy_w<unsigned char>(dst, dst2, src, n);
}

__device__ __forceinline__ void dc_copy(char *dst, const char *src,
                                        size_t n) {
  dc_copy2(dst, nullptr, src, n);
}

/* One of the copies dc_copy_spans does together. */
struct DcSpan {
  char *dst;
  const char *src;
  size_t n;
};

/* 16-byte words each thread has in flight over all spans of a fused copy
 * (4 per span for 3 spans): more would spill under DC_THREADS threads. */
#define DC_FUSE_WORDS 12

/* The first `words` 16-byte words of every span of sp: each thread loads
 * its words of all spans before it stores any. */
template <int S>
__device__ __forceinline__ void dc_copy_fused(const DcSpan (&sp)[S],
                                              size_t words) {
  constexpr int U = DC_FUSE_WORDS / S;
  const size_t bd = blockDim.x;
  size_t i = threadIdx.x;
  for (; i + (U - 1) * bd < words; i += U * bd) {
    uint4 v[S][U];
#pragma unroll
    for (int j = 0; j < S; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u)
        v[j][u] = __ldcg((const uint4 *)sp[j].src + i + u * bd);
#pragma unroll
    for (int j = 0; j < S; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u) ((uint4 *)sp[j].dst)[i + u * bd] = v[j][u];
  }
  for (; i < words; i += bd) {
    uint4 v[S];
#pragma unroll
    for (int j = 0; j < S; ++j) v[j] = __ldcg((const uint4 *)sp[j].src + i);
#pragma unroll
    for (int j = 0; j < S; ++j) ((uint4 *)sp[j].dst)[i] = v[j];
  }
}

/* Block-cooperative copy of S spans at once, so that a slow one (a peer's
 * memory) overlaps the others instead of adding to them. When every
 * pointer is 16-byte aligned, the words all spans have go together; the
 * rest of each span (or all of it when a pointer is not aligned) goes
 * through dc_copy, one span after the other. A span may be empty or copy
 * onto itself, but no span's dst may overlap another span's src or dst:
 * a thread's loads of one span do not wait for other threads' stores. */
template <int S>
__device__ __forceinline__ void dc_copy_spans(const DcSpan (&sp)[S]) {
  uintptr_t a = 0;
  size_t words = (size_t)-1;
#pragma unroll
  for (int j = 0; j < S; ++j) {
    a |= (uintptr_t)sp[j].dst | (uintptr_t)sp[j].src;
    words = min(words, sp[j].n / 16);
  }
  size_t done = 0;
  if ((a & 15) == 0 && words > 0) {
    dc_copy_fused<S>(sp, words);
    done = words * 16;
  }
#pragma unroll
  for (int j = 0; j < S; ++j)
    dc_copy(sp[j].dst + done, sp[j].src + done, sp[j].n - done);
}

#endif
