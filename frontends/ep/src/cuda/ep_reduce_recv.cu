/* ep_reduce_recv.cu - the combine kernel's receive phase in reduce mode
 * (ep_reduce_send.cu says what reduce mode is and what the send leaves).
 *
 * A block per token at a time, started while the send runs: waits for the
 * flags of the token's ranks (a proxied rank's end-of-send flag: it
 * raises no flag per token), adds up their sums (rank order) and rounds
 * to bf16 once; at the end it waits for every live proxied rank's
 * end-of-send flag. */
#include <cuda_bf16.h>

#include "ep_dev.cuh"

#define RED_RECV_THREADS 512

namespace mep::ep {
namespace {

/* acc[0..7] += the 8 channels of unit q (16 bytes of a bf16 row) of the
 * partial sum at `part`: float, or bf16 (MEP_EP_COMBINE_PARTIAL=bf16). */
__device__ __forceinline__ void add_part(float acc[8], const uint8_t *part,
                                         int q, int bf16) {
  if (bf16) {
    const ep_v16 v = ep_ld16_cg(part + (size_t)q * 16);
    for (int u = 0; u < 4; u++) {
      acc[2 * u] += ep_bf16_lo(v.w[u]);
      acc[2 * u + 1] += ep_bf16_hi(v.w[u]);
    }
    return;
  }
  const float4 *p = (const float4 *)part + (size_t)q * 2;
  const float4 a = __ldcg(p), b = __ldcg(p + 1);
  acc[0] += a.x, acc[1] += a.y, acc[2] += a.z, acc[3] += a.w;
  acc[4] += b.x, acc[5] += b.y, acc[6] += b.z, acc[7] += b.w;
}

/* The wait for rank r's sum of token t: its flag for t where r is mapped,
 * else (and for t < 0) its end-of-send flag, which block 0 polls in host
 * memory for every block (ep_wait_host). */
__device__ __forceinline__ int wait_rank(const mep__ep_kcomb_t &k, int r,
                                         int t, uint64_t seq,
                                         uint64_t deadline, uint64_t *word) {
  const mep__ep_kcommon_t &c = k.c;
  const mep_dev_win_t *w = c.win;
  const int half = (int)(seq & 1);
  const uint64_t *f = (const uint64_t *)mep_dev_src(
      w, r, w->kind[r] == MEP_DEV_PTR && t >= 0
                ? mep__ep_comb_tflag(&c.lay, half, r, t)
                : mep__ep_comb_pflag(&c.lay, half, r));
  return ep_wait_host(c, MEP__EP_CR, blockIdx.x == 0, f, r, seq, deadline,
                      word);
}

/* Named as the send's kernel, and as push mode's (ep_dev.cuh: kernel
 * names). */
template <bool kMlx5>
__global__ void __launch_bounds__(RED_RECV_THREADS)
    combine(mep__ep_kcomb_t k) {
  const mep__ep_kcommon_t &c = k.c;
  const auto [L, w, seq, half, deadline] = ep_start(c, MEP__EP_CR);
  const int E = L->experts, nl = L->local, H = L->hidden, K = k.num_topk;
  __shared__ int s_of[MEP_EP_STAGE_TOPK];   /* rank of entry j, -1: none */
  __shared__ int s_rank[MEP_EP_STAGE_TOPK]; /* t's ranks, in rank order */
  __shared__ int s_ok[MEP_EP_STAGE_TOPK];
  __shared__ int s_nr;
  ep_trace(c, MEP__EP_CR, MEP__EP_T_START);

  for (int t = blockIdx.x; t < k.num_tokens; t += gridDim.x) {
    if ((int)threadIdx.x < K) {
      const int64_t e = k.topk_idx[(size_t)t * K + threadIdx.x];
      const int r = e >= 0 && e < E ? (int)(e / nl) : -1;
      s_of[threadIdx.x] = r >= 0 && ep_active(c.active, r) ? r : -1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      /* the ranks of t's experts, once each, in rank order */
      int nr = 0;
      for (int j = 0; j < K; j++) {
        const int r = s_of[j];
        if (r < 0) continue;
        int i = nr;
        while (i > 0 && s_rank[i - 1] > r) i--;
        if (i > 0 && s_rank[i - 1] == r) continue;
        for (int m = nr; m > i; m--) s_rank[m] = s_rank[m - 1];
        s_rank[i] = r;
        nr++;
      }
      s_nr = nr;
    }
    __syncthreads();
    if ((int)threadIdx.x < s_nr) {
      const int r = s_rank[threadIdx.x];
      uint64_t word;
      s_ok[threadIdx.x] = wait_rank(k, r, t, seq, deadline, &word);
    }
    __syncthreads(); /* the flags' acquires precede every read of a sum */
    if (t == (int)blockIdx.x) ep_trace(c, MEP__EP_CR, MEP__EP_T_MID);
    uint8_t *out = (uint8_t *)k.out + (size_t)t * 2 * H;
    /* two units a thread at once (hidden 7168 is 896 units for 512
     * threads): both units' loads are in flight before the first add */
    const int nq = H / 8, B = blockDim.x;
    for (int q = threadIdx.x; q < nq; q += 2 * B) {
      const bool two = q + B < nq;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      float acc2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int i = 0; i < s_nr; i++) {
        if (!s_ok[i]) continue;
        const int r = s_rank[i];
        const uint8_t *part =
            mep_dev_src(w, r, mep__ep_comb_part(L, half, r, t));
        add_part(acc, part, q, k.partial_bf16);
        if (two) add_part(acc2, part, q + B, k.partial_bf16);
      }
      ep_st16(out + (size_t)q * 16, ep_pack_bf16x8(acc));
      if (two) ep_st16(out + (size_t)(q + B) * 16, ep_pack_bf16x8(acc2));
    }
    __syncthreads(); /* the shared lists are rewritten for the next token */
  }

  ep_trace(c, MEP__EP_CR, MEP__EP_T_WORK);
  /* every live proxied rank's end-of-send flag: block 0 polls it in host
   * memory for the others (ep_wait_host), so it waits for every one,
   * whichever its tokens named. Mapped ranks raise none (ep_reduce_send.cu:
   * back-to-back calls). */
  for (int r = threadIdx.x; r < L->ranks; r += blockDim.x) {
    uint64_t word;
    if (!ep_live(c, r) || w->kind[r] == MEP_DEV_PTR) continue;
    (void)wait_rank(k, r, -1, seq, deadline, &word);
  }

  /* the blocks wrote out, which is read on this GPU after the kernel */
  if (ep_last_block<true>(&c.st->done[MEP__EP_CR], gridDim.x))
    ep_finish(c, MEP__EP_CR, -1, seq);
  ep_after_send();
}

} // namespace
} // namespace mep::ep

extern "C" int mep__ep_launch_reduce_recv(const mep__ep_kcomb_t *k,
                                          void *stream) {
  return ep_launch(mep::ep::combine<false>, dim3((unsigned)k->recv_blocks),
                   RED_RECV_THREADS, 0, k->c.early_recv, stream, *k);
}
