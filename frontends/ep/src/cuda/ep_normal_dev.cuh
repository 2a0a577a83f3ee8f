/* ep_normal_dev.cuh - device steps the normal mode's kernels share: the
 * counts from rank_prefix_matrix, where a received row comes from, a
 * block's sum, the wait for every source followed by the agreement round,
 * the call's number and its end. */
#ifndef MEP_EP_NORMAL_DEV_CUH
#define MEP_EP_NORMAL_DEV_CUH

#include "ep_dev.cuh"
#include "ep_normal_k.h"

/* Tokens sources 0..s-1 send rank r (rank_prefix_matrix is inclusive). */
__device__ __forceinline__ int epn_before(const int32_t *rpm, int R, int s,
                                          int r) {
  return s ? rpm[(s - 1) * R + r] : 0;
}
__device__ __forceinline__ int epn_count(const int32_t *rpm, int R, int s,
                                         int r) {
  return rpm[s * R + r] - epn_before(rpm, R, s, r);
}

/* The source of this rank's received row j and, in *i, its index among
 * that source's rows: the first s whose prefix passes j. */
__device__ __forceinline__ int epn_row_source(const int32_t *rpm, int R,
                                              int me, int j, int *i) {
  int lo = 0, hi = R - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (rpm[mid * R + me] > j)
      hi = mid;
    else
      lo = mid + 1;
  }
  *i = j - epn_before(rpm, R, lo, me);
  return lo;
}

/* The sum of v over the block, in every thread (red: 32 ints of shared
 * memory the block may reuse after a __syncthreads). */
__device__ __forceinline__ int epn_block_sum(int v, int *red) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  if (lane == 0) red[wid] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? red[lane] : 0;
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  return v;
}

__device__ __forceinline__ uint32_t epn_ld32_cg(const void *p) {
  uint32_t v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint64_t epn_ld64_cg(const void *p) {
  uint64_t v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}

/* Where the words of slot (half, s) start in a window: rank s's
 * agreement view, at k.prog its dispatch progress and at k.cprog its
 * combine phases (ep_normal_k.h). */
__device__ __forceinline__ uint64_t epn_slot(const mep__epn_k_t &k, int half,
                                             int s) {
  return k.agree + ((uint64_t)half * k.R + s) * k.agree_slot;
}

/* Word i of the active ranks as a bitmask (bit b: rank 32 i + b). */
__device__ __forceinline__ unsigned int epn_active_word(const mep__epn_k_t &k,
                                                        int i) {
  unsigned int bits = 0;
  for (int b = 0; b < 32 && 32 * i + b < k.R; b++)
    bits |= (ep_active(k.active, 32 * i + b) ? 1u : 0u) << b;
  return bits;
}

/* The call's number of its kind (completed calls + 1). */
__device__ __forceinline__ uint64_t epn_seq(const mep__epn_k_t &k, int kind) {
  return *(const volatile uint64_t *)&k.st->d.seq[kind] + 1;
}

/* Thread 0, before a send rewrites the stages of the host part: the proxy
 * has carried out every command of the previous send of its kind, and the
 * NIC has read what was posted to MEP_DEV_MLX5 peers. */
template <bool kMlx5>
__device__ __forceinline__ void epn_stage_gate(const mep__epn_k_t &k,
                                               int mark, uint64_t deadline) {
  const mep_dev_win_t *w = k.win;
  if (!k.has_proxy || !w->ring_len || threadIdx.x) return;
  unsigned long long m = *(volatile unsigned long long *)&k.st->d.mark[mark];
  while (*w->ring_done < m && mep_dev_now_ns() <= deadline) __nanosleep(128);
  (void)mep_dev_quiet<kMlx5>(w, deadline);
}

/* One thread of a send's last block, for one active peer: puts the n
 * messages of msg bytes staged at `stage` (a proxy peer; nothing for a
 * mapped one, which has them) to the peer's area at `to`, then raises the
 * peer's word at sig: (seq << 32) | n. */
template <bool kMlx5>
__device__ __forceinline__ void epn_deliver(const mep__epn_k_t &k, int peer,
                                            uint64_t to, uint64_t stage,
                                            uint64_t n, uint64_t msg,
                                            uint64_t sig, uint64_t seq,
                                            uint64_t deadline) {
  if (n && n * msg <= k.P)
    (void)mep_dev_put<kMlx5>(k.win, peer, to, stage, n * msg, deadline);
  (void)mep_dev_signal<kMlx5>(k.win, peer, sig, (seq << 32) | n, deadline);
}

/* The last block of a kernel, at its end: records the ring's tail for
 * the stage gate (mark >= 0) and completes the call. */
__device__ __forceinline__ void epn_finish(const mep__epn_k_t &k, int kind,
                                           int mark, uint64_t seq) {
  __syncthreads();
  if (threadIdx.x) return;
  if (mark >= 0 && k.has_proxy && k.win->ring_len)
    k.st->d.mark[mark] = *(volatile unsigned long long *)k.win->ring_tail;
  *(volatile uint64_t *)&k.st->d.seq[kind] = seq;
}

/* The threads of one block: wait for each active rank's signal word at
 * sig_off (a source that misses the deadline is cleared), then run the
 * agreement round: send this rank's view of the active ranks to every
 * rank in it, wait for theirs (under a fresh deadline, so that survivors
 * that spent theirs on a dead rank still hear each other) and clear every
 * rank some view lacks; a rank whose view does not come is cleared too.
 * With one failure per call, every survivor ends with the same ranks: a
 * view differs from the others only by the ranks its owner did not hear
 * from, and every survivor takes every survivor's view. */
template <bool kMlx5>
static __device__ __noinline__ void epn_agree(const mep__epn_k_t &k,
                                              int which, uint64_t sig_off,
                                              uint64_t seq, int half,
                                              uint64_t deadline) {
  __shared__ unsigned int view[MEP__EPN_MAX_RANKS / 32];
  __shared__ unsigned int mask[MEP__EPN_MAX_RANKS / 32];
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const int W = (R + 31) / 32;
  const mep_dev_win_t *w = k.win;
  for (int r = tid; r < R; r += T) {
    uint64_t word;
    if (ep_active(k.active, r))
      (void)ep_wait_word((const uint64_t *)mep_dev_src(
                             w, r, sig_off + ((uint64_t)half * R + r) * 8),
                         seq, k.active, r, deadline, &word);
  }
  __syncthreads();
  for (int i = tid; i < W; i += T) view[i] = mask[i] = epn_active_word(k, i);
  __syncthreads();
  const uint64_t slot = (uint64_t)which * 8 * W;
  const uint64_t again = mep_dev_now_ns() + k.timeout_ns;
  for (int r = tid; r < R; r += T) {
    if (!(view[r / 32] >> (r % 32) & 1)) continue;
    const uint64_t off = epn_slot(k, half, me);
    for (int i = 0; i < W; i++)
      (void)mep_dev_signal<kMlx5>(w, r, off + slot + 8 * (uint64_t)i,
                           (seq << 32) | view[i], again);
  }
  for (int r = tid; r < R; r += T) {
    if (!(view[r / 32] >> (r % 32) & 1)) continue;
    const uint64_t off = epn_slot(k, half, r);
    for (int i = 0; i < W; i++) {
      uint64_t word = 0;
      if (!ep_wait_word((const uint64_t *)mep_dev_src(
                            w, r, off + slot + 8 * (uint64_t)i),
                        seq, k.active, r, again, &word)) {
        atomicAnd(&mask[r / 32], ~(1u << (r % 32)));
        break;
      }
      atomicAnd(&mask[i], (unsigned int)word);
    }
  }
  __syncthreads();
  for (int r = tid; r < R; r += T)
    if (!(mask[r / 32] >> (r % 32) & 1) && r != me) ep_clear(k.active, r);
  __syncthreads();
}

/* The last block of a receive (all threads), once its copies are done:
 * the agreement round (epn_agree), and in dropped[] the ranks the receive
 * may have taken rows from that the round leaves out: active before it,
 * or lost during the call (the bits its waits set in lost[], cleared here
 * for the next call), and not active after it. */
template <bool kMlx5>
static __device__ __noinline__ void epn_agree_dropped(
    const mep__epn_k_t &k, int which, uint64_t sig_off, unsigned int *lost,
    unsigned int *dropped, uint64_t seq, int half, uint64_t deadline) {
  const int W = (k.R + 31) / 32, T = blockDim.x, tid = threadIdx.x;
  for (int i = tid; i < W; i += T) {
    dropped[i] = epn_active_word(k, i) | lost[i];
    lost[i] = 0;
  }
  epn_agree<kMlx5>(k, which, sig_off, seq, half, deadline);
  for (int i = tid; i < W; i += T) dropped[i] &= ~epn_active_word(k, i);
  __syncthreads();
}

#endif /* MEP_EP_NORMAL_DEV_CUH */
