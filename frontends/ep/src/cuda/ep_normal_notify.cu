/* ep_normal_notify.cu - the normal mode's count exchange on the GPU
 * (DeepEP's notify_dispatch), so that a non-cached dispatch costs one
 * kernel and the host's wait for two numbers instead of copies to the
 * host and an exchange over the communicator.
 *
 * Block r counts column r of is_token_in_rank per channel (row r of
 * channel_prefix_matrix, and the check against num_tokens_per_rank). The
 * last block to finish writes this rank's count slot into every active
 * rank's window (ncnt; through the proxy's stage for a rank that is not
 * mapped), raises its signal word there, waits for every source's and
 * runs the agreement round (epn_agree, the words of kind 2); then it
 * sums the slots of the ranks kept into rank_prefix_matrix, the sources'
 * num_tokens and this rank's tokens per expert, and publishes what the
 * host needs in mapped memory, its call number last.
 *
 * The stage needs no gate: a notify ends only after every peer it keeps
 * has sent its agreement view, which that peer sends only after this
 * rank's signal reached it, and the proxy carries out a rank's commands
 * in order, so the previous notify's puts from the stage are done. */
#include <limits.h>

#include "ep_normal_dev.cuh"

extern "C" {
#include "ep_normal.h"
}

namespace mep {
namespace ep {
namespace {

#define EPN_NOTIFY_THREADS 256
#define HDR MEP__EPN_CW_HDR

/* Row r of channel_prefix_matrix (tokens of channels 0..c to rank r; a
 * channel is DeepEP's range of ceil(N / C) tokens) and the check of
 * num_tokens_per_rank[r]. */
__device__ void count_column(const mep__epn_k_t &k, int r, int *red) {
  const int N = k.num_tokens, C = k.C > 0 ? k.C : 1;
  const int per = k.C > 0 ? (N + C - 1) / C : N;
  int run = 0;
  for (int c = 0; c < C; c++) {
    const int lo = min(per * c, N), hi = min(lo + per, N);
    int n = 0;
    for (int t = lo + (int)threadIdx.x; t < hi; t += blockDim.x)
      n += k.in_rank[(size_t)t * k.R + r] != 0;
    run += epn_block_sum(n, red);
    if (k.C > 0 && k.cpm_out && threadIdx.x == 0)
      k.cpm_out[(size_t)r * k.C + c] = run;
  }
  if (threadIdx.x == 0 && run != k.per_rank[r]) atomicOr(&k.st->nbad, 1u);
}

/* Word i of this rank's count slot for rank d (ep_normal.c: the slot). */
__device__ __forceinline__ int32_t slot_word(const mep__epn_k_t &k,
                                             int32_t status, int d, int i) {
  switch (i) {
  case 0: return status;
  case 1: return k.num_tokens;
  case 2: return k.E;
  case 3: return (int32_t)k.dmsg;
  case 4: return (int32_t)k.cmsg;
  }
  i -= HDR;
  return i < k.R ? k.per_rank[i] : k.per_expert[(size_t)d * k.L + i - k.R];
}

/* Source s's slot of this exchange in this rank's window. */
__device__ __forceinline__ const volatile int32_t *
src_slot(const mep__epn_k_t &k, int half, int s) {
  return (const volatile int32_t *)mep_dev_src(
      k.win, s, k.ncnt + ((uint64_t)half * k.R + s) * k.slot);
}

/* The last block: sends this rank's slot to every active rank and
 * signals it, then waits and agrees. */
template <bool kMlx5>
__device__ void send_and_agree(const mep__epn_k_t &k, uint64_t seq,
                               int half, uint64_t deadline) {
  __shared__ int32_t status;
  const int R = k.R, T = blockDim.x, tid = threadIdx.x;
  const mep_dev_win_t *w = k.win;
  if (tid == 0) {
    status = (int32_t)*(volatile unsigned int *)&k.st->nbad;
    k.st->nbad = 0;
  }
  __syncthreads();
  const int words = HDR + R + k.L;
  const uint64_t mine = k.ncnt + ((uint64_t)half * R + k.rank) * k.slot;
  for (int d = 0; d < R; d++) {
    if (!ep_active(k.active, d)) continue;
    int32_t *slot = (int32_t *)mep_dev_dst(
        w, d, mine, k.cnt_stage + (uint64_t)d * k.slot);
    for (int i = tid; i < words; i += T) slot[i] = slot_word(k, status, d, i);
  }
  __threadfence_system();
  __syncthreads();
  for (int d = tid; d < R; d += T) {
    if (!ep_active(k.active, d)) continue;
    (void)mep_dev_put<kMlx5>(w, d, mine, k.cnt_stage + (uint64_t)d * k.slot,
                      (uint64_t)words * 4, deadline);
    (void)mep_dev_signal<kMlx5>(w, d, k.nsig + ((uint64_t)half * R + k.rank) * 8,
                         (seq << 32) | 1, deadline);
  }
  epn_agree<kMlx5>(k, MEP__EPN_AGREE_NOTIFY, k.nsig, seq, half, deadline);
}

/* The last block, after the agreement: the matrices and the sources'
 * num_tokens from the slots of the ranks kept (a dropped rank counts
 * none), and the host's fields. */
__device__ void sum_slots(const mep__epn_k_t &k, uint64_t seq, int half) {
  __shared__ int other, bad;
  __shared__ unsigned long long worst;
  const int R = k.R, L = k.L, T = blockDim.x, tid = threadIdx.x;
  mep__epn_nres_t *res = k.res;
  if (tid == 0) {
    other = bad = INT_MAX;
    worst = 0;
  }
  __syncthreads();
  for (int s = tid; s < R; s += T) {
    const bool kept = ep_active(k.active, s);
    const volatile int32_t *sl = src_slot(k, half, s);
    if (kept && (sl[2] != k.E || sl[3] != (int32_t)k.dmsg ||
                 sl[4] != (int32_t)k.cmsg))
      atomicMin(&other, s);
    if (kept && sl[0]) atomicMin(&bad, s);
    k.counts[(size_t)R * R + s] = kept ? sl[1] : 0;
  }
  /* (count << 32) | ~pair: the largest count, the first pair among
   * equals, as the host path reports it */
  unsigned long long top = 0;
  for (int r = tid; r < R; r += T) {
    int32_t run = 0;
    for (int s = 0; s < R; s++) {
      const int32_t c =
          ep_active(k.active, s) ? src_slot(k, half, s)[HDR + r] : 0;
      const unsigned long long key =
          (unsigned long long)(uint32_t)c << 32 | ~(unsigned)(s * R + r);
      if (key > top) top = key;
      run += c;
      k.counts[(size_t)s * R + r] = run;
      if (k.rpm_out) k.rpm_out[(size_t)s * R + r] = run;
    }
  }
  atomicMax(&worst, top);
  for (int l = tid; l < L; l += T) {
    int32_t sum = 0;
    for (int s = 0; s < R; s++)
      if (ep_active(k.active, s)) sum += src_slot(k, half, s)[HDR + R + l];
    res->per_expert[l] = (sum + k.align - 1) / k.align * k.align;
  }
  __syncthreads();
  if (tid) return;
  res->nrecv = k.counts[(size_t)(R - 1) * R + k.rank];
  res->bad = bad == INT_MAX ? -1 : bad;
  res->other = other == INT_MAX ? -1 : other;
  for (int i = 0; i < 3 && other != INT_MAX; i++)
    res->shape[i] = src_slot(k, half, other)[2 + i];
  res->worst = (int32_t)(worst >> 32);
  const uint32_t pair = ~(uint32_t)worst;
  res->worst_s = (int32_t)(pair / (uint32_t)R);
  res->worst_r = (int32_t)(pair % (uint32_t)R);
  __threadfence_system();
  *(volatile uint64_t *)&res->seq = seq;
  *(volatile uint64_t *)&k.st->nseq = seq;
}

template <bool kMlx5>
__global__ void __launch_bounds__(EPN_NOTIFY_THREADS)
    notify_dispatch(mep__epn_k_t k) {
  __shared__ int red[32];
  count_column(k, blockIdx.x, red);
  if (!ep_last_block(&k.st->ndone, gridDim.x)) return;
  const uint64_t seq = *(const volatile uint64_t *)&k.st->nseq + 1;
  const int half = (int)(seq & 1);
  send_and_agree<kMlx5>(k, seq, half, mep_dev_now_ns() + k.timeout_ns);
  sum_slots(k, seq, half);
}

}  // namespace
}  // namespace ep
}  // namespace mep

extern "C" int mep__epn_launch_notify(const mep__epn_k_t *k, void *stream) {
  return ep_launch(EP_KERNEL(mep::ep::notify_dispatch, k->has_mlx5),
                   dim3((unsigned)k->R),
                   EPN_NOTIFY_THREADS, 0, 0, stream, *k);
}
