/* ep_combine_reduce.cu - combine in reduce mode: the weighted sum is split
 * between the ranks, so a token's rows cross the link once per rank that
 * holds some of its experts instead of once per expert.
 *
 * With top-8 of 256 experts on 2 ranks a token has about 4 experts on the
 * other rank: pushing their bf16 rows moves 4 * 2H bytes, sending their
 * weighted sum in float 4H, half as much; the link's rate sets combine's
 * time at large hidden sizes (docs/perf.md). It costs a hop more: the
 * weights must reach the experts' ranks first. So it is opt-in
 * (MEP_EP_COMBINE_REDUCE=1, ep_cuda.c), for buffers whose peers are all
 * mapped (no proxy); it moves fewer bytes when a token has more than two
 * experts per rank on average (top-k > 2 x ranks). Every rank must make
 * the same choice.
 *
 * Three kernels, each a programmatic dependent of the one before:
 *  - publish: this rank's tokens' (expert, weight) pairs go to every live
 *    rank, itself included (the expert's rank needs the weights, which
 *    only the token's rank has), then one word per rank says they are
 *    there and how many tokens this rank has;
 *  - send (grid: split blocks x sources): for each token t of source s
 *    that names an expert here, the rows of t among the expert's (found
 *    through the handle: layout_range and src_info) are summed, weighted,
 *    in float, in the order of t's top-k list, and the sum goes into s's
 *    partial area; the source's last block signals s;
 *  - receive (a block per token at a time): waits for every live rank's
 *    signal, then adds up the partial sums of the ranks its experts are on
 *    (rank order) and rounds to bf16 once.
 * Waiting for every live rank's signal also keeps the halves safe for
 * back-to-back calls: a rank writes half h again (call seq + 2) only after
 * its receive of seq + 1 saw every peer's send of seq + 1, which that peer
 * started after its receive of seq read half h. */
#include <cuda_bf16.h>

#include "ep_dev.cuh"

namespace {

struct ep_wt {
  int32_t expert; /* -1: none */
  float weight;
};

#define RED_THREADS 512 /* at least MEP_EP_STAGE_TOPK warps (send) */

__global__ void __launch_bounds__(RED_THREADS) red_publish(mep__ep_kcomb_t k) {
  ep_early_start();
  const mep__ep_kcommon_t &c = k.c;
  const mep_ep_layout_t *L = &c.lay;
  const mep_dev_win_t *w = c.win;
  const uint64_t seq = ep_seq(c, MEP__EP_CS);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + c.timeout_ns;
  const int R = L->ranks, K = k.num_topk, n = k.num_tokens;
  const int64_t per = (int64_t)n * K;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
       i < per * R; i += (int64_t)gridDim.x * blockDim.x) {
    const int q = (int)(i / per);
    const int64_t tj = i % per;
    if (!ep_live(c, q)) continue;
    const int64_t e = k.topk_idx[tj];
    ep_wt v;
    v.expert = e >= 0 && e < L->experts ? (int32_t)e : -1;
    v.weight = k.topk_weights[tj];
    *(ep_wt *)mep_dev_dst(w, q,
                          mep_ep_comb_wts(L, half, c.rank, (int)(tj / K),
                                          (int)(tj % K)),
                          0) = v;
  }
  if (ep_last_block(&k.red_done[R], gridDim.x)) {
    for (int q = threadIdx.x; q < R; q += blockDim.x)
      if (ep_live(c, q))
        (void)mep_dev_signal(w, q, mep_ep_comb_wflag(L, half, c.rank),
                             mep_ep_word(seq, (uint32_t)n), deadline);
  }
}

/* One warp (lane 0's result): the row of token t among the rows expert el
 * got from source s, -1 if none (the first, should t name el twice). */
__device__ __forceinline__ int64_t red_find_row(const mep__ep_kcomb_t &k,
                                                int el, int s, int t,
                                                int lane) {
  const mep_ep_layout_t *L = &k.c.lay;
  const int R = L->ranks;
  const int64_t S = (int64_t)R * L->tokens;
  const int64_t v = k.layout_range[(size_t)el * R + s];
  int64_t n = v >> 32, begin = (int64_t)(uint32_t)v;
  /* the handle is the caller's: rows stay inside the expert's */
  if (n < 0 || begin > S) n = 0;
  if (n > S - begin) n = S - begin;
  const int32_t *si = k.src_info + (size_t)el * S + begin;
  for (int64_t b = 0; b < n; b += 32) {
    const bool hit = b + lane < n && __ldg(si + b + lane) == t;
    const unsigned m = __ballot_sync(0xffffffffu, hit);
    if (m) return begin + b + __ffs(m) - 1;
  }
  return -1;
}

__global__ void __launch_bounds__(RED_THREADS) red_send(mep__ep_kcomb_t k) {
  ep_early_start();
  const mep__ep_kcommon_t &c = k.c;
  const mep_ep_layout_t *L = &c.lay;
  const mep_dev_win_t *w = c.win;
  const uint64_t seq = ep_seq(c, MEP__EP_CS);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + c.timeout_ns;
  const int T = L->tokens, H = L->hidden, K = k.num_topk, nl = L->local;
  const int64_t S = (int64_t)L->ranks * T;
  const int s = blockIdx.y, y = blockIdx.x, Y = gridDim.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ int s_n;
  __shared__ const uint8_t *s_row[MEP_EP_STAGE_TOPK];
  __shared__ float s_w[MEP_EP_STAGE_TOPK];
  __shared__ int s_any;

  ep_trace(c, MEP__EP_CS, MEP__EP_T_START);
  if (threadIdx.x == 0) {
    int n = -1;
    uint64_t word;
    if (ep_live(c, s)) {
      const uint64_t *f =
          (const uint64_t *)(w->dev_base + mep_ep_comb_wflag(L, half, s));
      if (ep_wait_word(f, seq, c.active, s, deadline, &word))
        n = (int)(uint32_t)word < T ? (int)(uint32_t)word : T;
      else
        ep_clear(c.active, s);
    }
    s_n = n;
  }
  __syncthreads();
  ep_trace(c, MEP__EP_CS, MEP__EP_T_MID);
  const int n = s_n;
  for (int t = y; t < n; t += Y) {
    if (threadIdx.x == 0) s_any = 0;
    __syncthreads();
    if (warp < K) {
      /* the weights' flag (thread 0's acquire) and the barrier order this
       * read after the publisher's writes */
      const uint2 raw = __ldcg((const uint2 *)(w->dev_base +
                                               mep_ep_comb_wts(L, half, s, t,
                                                               warp)));
      ep_wt v;
      v.expert = (int32_t)raw.x;
      v.weight = __uint_as_float(raw.y);
      const int el = v.expert - c.rank * nl;
      const uint8_t *row = nullptr;
      if (v.expert >= 0 && el >= 0 && el < nl) {
        const int64_t r = red_find_row(k, el, s, t, lane);
        if (r >= 0)
          row = (const uint8_t *)k.x + ((size_t)el * S + r) * 2 * (size_t)H;
        if (lane == 0) s_any = 1;
      }
      if (lane == 0) {
        s_row[warp] = row;
        s_w[warp] = v.weight;
      }
    }
    __syncthreads();
    /* a token none of whose experts is here gets no partial sum: its
     * rank does not read one (the same test on its topk_idx) */
    if (s_any) {
      float *dst = (float *)mep_dev_dst(
          w, s, mep_ep_comb_part(L, half, c.rank, t), 0);
      for (int q = threadIdx.x; q < H / 8; q += blockDim.x) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        ep_weighted_sum8(s_row, s_w, K, q, acc);
        float4 *o = (float4 *)(dst + (size_t)q * 8);
        o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      }
    }
    __syncthreads(); /* s_row, s_any are rewritten for the next token */
  }

  /* the source's last block signals, after every block's sums for it */
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    if (atomicAdd(k.red_done + s, 1u) == (unsigned)Y - 1) {
      *(volatile unsigned int *)(k.red_done + s) = 0;
      if (n >= 0)
        (void)mep_dev_signal(w, s, mep_ep_comb_pflag(L, half, c.rank),
                             mep_ep_word(seq, 1), deadline);
    }
  }
  if (ep_last_block(&c.st->done[MEP__EP_CS], gridDim.x * gridDim.y))
    ep_finish(c, MEP__EP_CS, -1, seq);
  ep_after_send(); /* the publish kernel, before it in the stream, is done */
}

__global__ void __launch_bounds__(RED_THREADS) red_recv(mep__ep_kcomb_t k) {
  const mep__ep_kcommon_t &c = k.c;
  const mep_ep_layout_t *L = &c.lay;
  const mep_dev_win_t *w = c.win;
  const uint64_t seq = ep_seq(c, MEP__EP_CR);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + c.timeout_ns;
  const int E = L->experts, nl = L->local, H = L->hidden, K = k.num_topk;
  __shared__ int s_rank[MEP_EP_STAGE_TOPK];
  __shared__ int s_nr;
  ep_trace(c, MEP__EP_CR, MEP__EP_T_START);

  /* every live rank's signal: its sums for this rank's tokens are in */
  for (int r = threadIdx.x; r < L->ranks; r += blockDim.x) {
    uint64_t word;
    if (!ep_live(c, r)) continue;
    const uint64_t *f =
        (const uint64_t *)(w->dev_base + mep_ep_comb_pflag(L, half, r));
    if (!ep_wait_word(f, seq, c.active, r, deadline, &word))
      ep_clear(c.active, r);
  }
  __syncthreads();
  ep_trace(c, MEP__EP_CR, MEP__EP_T_MID);

  for (int t = blockIdx.x; t < k.num_tokens; t += gridDim.x) {
    if (threadIdx.x == 0) {
      /* the ranks of t's experts, once each, in rank order */
      int nr = 0;
      for (int j = 0; j < K; j++) {
        const int64_t e = k.topk_idx[(size_t)t * K + j];
        if (e < 0 || e >= E) continue;
        const int r = (int)(e / nl);
        if (!ep_active(c.active, r)) continue;
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
    uint8_t *out = (uint8_t *)k.out + (size_t)t * 2 * H;
    for (int q = threadIdx.x; q < H / 8; q += blockDim.x) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int i = 0; i < s_nr; i++) {
        const float4 *p = (const float4 *)(w->dev_base +
                                           mep_ep_comb_part(L, half,
                                                            s_rank[i], t)) +
                          (size_t)q * 2;
        const float4 a = __ldcg(p), b = __ldcg(p + 1);
        acc[0] += a.x, acc[1] += a.y, acc[2] += a.z, acc[3] += a.w;
        acc[4] += b.x, acc[5] += b.y, acc[6] += b.z, acc[7] += b.w;
      }
      ep_v16 o;
      for (int i = 0; i < 4; i++) {
        __nv_bfloat162 v = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
        o.w[i] = *reinterpret_cast<uint32_t *>(&v);
      }
      ep_st16(out + (size_t)q * 16, o);
    }
    __syncthreads(); /* s_rank is rewritten for the next token */
  }

  if (ep_last_block(&c.st->done[MEP__EP_CR], gridDim.x))
    ep_finish(c, MEP__EP_CR, -1, seq);
  ep_after_send();
}

} // namespace

extern "C" int mep__ep_launch_reduce_send(const mep__ep_kcomb_t *k,
                                          void *stream) {
  /* the publish grid is small: a few thousand (expert, weight) pairs */
  red_publish<<<4, RED_THREADS, 0, (cudaStream_t)stream>>>(*k);
  int rc = (int)cudaGetLastError();
  if (rc) return rc;
  return ep_launch_dependent(
      red_send, dim3((unsigned)k->send_split, (unsigned)k->c.lay.ranks),
      RED_THREADS, k->c.early_recv, stream, *k);
}

extern "C" int mep__ep_launch_reduce_recv(const mep__ep_kcomb_t *k,
                                          void *stream) {
  return ep_launch_dependent(red_recv, dim3((unsigned)k->recv_blocks),
                             RED_THREADS, k->c.early_recv, stream, *k);
}
