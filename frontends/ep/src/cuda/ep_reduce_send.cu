/* ep_reduce_send.cu - the combine kernel's send phase in reduce mode: the
 * weighted sum is split between the ranks, so a token's rows cross the
 * link once per rank that holds some of its experts instead of once per
 * expert.
 *
 * With top-8 of 256 experts on 2 ranks a token has about 4 experts on the
 * other rank: pushing their bf16 rows moves 4 * 2H bytes, sending their
 * weighted sum in float 4H, half as much; the link's rate sets combine's
 * time at large hidden sizes (docs/perf.md). It costs a hop more: the
 * weights must reach the experts' ranks first. ep_cuda.c picks it for
 * buffers without MEP_DEV_MLX5 peers when a token has more than two
 * experts per rank on average (top-k > 2 x ranks), or always with
 * MEP_EP_COMBINE_REDUCE=1. Every rank must make the same choice. No peer
 * is then MEP_DEV_MLX5: the kernels are compiled without those branches
 * (win.cuh: kMlx5).
 *
 * The send's first few blocks publish first: this rank's tokens' (expert,
 * weight) pairs go to every live rank, itself included (the expert's rank
 * needs the weights, which only the token's rank has), each pair a word
 * tagged with the call's seq, so no fence and no flag stands between them
 * and their reader; a word per rank says how many tokens this rank has.
 * Then (grid: split blocks x sources), for each token t of source s that
 * names an expert here, the rows of t among the expert's (found through
 * the handle: layout_range and src_info) are summed, weighted, in float,
 * in the order of t's top-k list; the sum goes into s's partial area and
 * t's flag there is raised.
 *
 * A rank reached through the proxy gets the same bytes by puts from
 * this rank's host part (layout.h: mep__ep_red_pstage, _wstage): the
 * weights in one put, the last publishing block's, whose signal is the
 * count word; each partial sum in a put of its own as soon as it is
 * staged (consecutive tokens go to consecutive rows, which the proxy
 * merges into one message; one put per run of tokens at the send's end
 * measured slower: the network then waits for the last sum); no
 * per-token flag, as its receive waits for the end-of-send flag, which
 * follows every put in the proxy's order. The publishing blocks pass the
 * stage gate (the combine kind's mark), as push mode's send does; the
 * blocks that put partial sums wait until the weights are in the ring,
 * so that the weights leave first.
 *
 * Back-to-back calls are safe without a flag at the end: a rank writes
 * a mapped peer's half h again (call seq + 2: weights, then sums) only
 * after its send of seq + 1 saw that peer's weight count of seq + 1,
 * which the peer publishes at the start of its send of seq + 1, queued
 * after its receive of seq (which read the sums of half h) and its send
 * of seq (which read the weights). An end-of-send flag, which the
 * receive awaited from every rank, came 4 to 5 us after the last token's
 * flag (its fence, a counter, another fence and the store); without it a
 * combine takes about 2 us less (docs/perf.md). A proxied rank still
 * gets one, after the source's last put: its receive has no flag per
 * token. */
#include <cuda_bf16.h>

#include "ep_dev.cuh"
#include "mep/ep.h"

namespace mep::ep {
namespace {

#define RED_THREADS 256   /* send: 8 warps; leaves room for the receive */
/* A weight word: tag (21 bits) | slot (11 bits: local expert + 1, 0 for
 * none) | float weight. The tag is never 0 (the zeroed window); a stale
 * word of the same half carries an older call's tag, and one a multiple
 * of 2^21 - 1 calls older would be taken for new. */
#define RED_TAG_SPAN 0x1fffffull
#define RED_SLOT_MASK 0x7ffu
static_assert(MEP_EP_MAX_LOCAL_EXPERTS < RED_SLOT_MASK,
              "a weight word's slot holds every local expert + 1");
static_assert(MEP_EP_MAX_TOPK <= MEP_EP_STAGE_TOPK, "top-k fits the lists");

__device__ __forceinline__ uint64_t red_tag(uint64_t seq) {
  return seq % RED_TAG_SPAN + 1;
}

__device__ __forceinline__ uint64_t red_word(uint64_t seq, uint32_t slot,
                                             float w) {
  return (red_tag(seq) << 43) | ((uint64_t)slot << 32) | __float_as_uint(w);
}

__device__ __forceinline__ void red_store(uint8_t *p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v)
               : "memory");
}

/* A warp's float sums of 32 consecutive units (8 channels each, lane i
 * unit i: 1 KB at dst) go out as 16 contiguous bytes per lane and
 * instruction, through `st` (64 float4 of shared memory of the warp's
 * own); n: the float4s of the 64 that exist (the row's end). Stored from
 * each lane's registers, an instruction wrote 16 of every 32 bytes, and
 * NVLink carried each line in two halves. */
__device__ __forceinline__ void red_store_f32x8(const float acc[8],
                                                float4 *st, uint8_t *dst,
                                                int n, int lane) {
  st[2 * lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  st[2 * lane + 1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  __syncwarp();
  float4 *o = (float4 *)dst;
  if (lane < n) o[lane] = st[lane];
  if (32 + lane < n) o[32 + lane] = st[32 + lane];
  __syncwarp(); /* st is rewritten by the next call */
}

/* Blocks of the send that publish the weights first: the lowest linear
 * indices, which start first; the grid is resident at once (ep_cuda.c
 * sizes it), so a block that then waits for weights never holds out
 * another that still has to publish. */
#define RED_PUBLISH_BLOCKS 8

/* Block b of the first P (RED_PUBLISH_BLOCKS, or the grid if smaller):
 * its share of the publish. */
__device__ __forceinline__ void red_publish(const mep__ep_kcomb_t &k, int b,
                                            int P, uint64_t seq,
                                            uint64_t deadline) {
  const mep__ep_kcommon_t &c = k.c;
  const mep__ep_layout_t *L = &c.lay;
  const mep_dev_win_t *w = c.win;
  const int half = (int)(seq & 1);
  const int R = L->ranks, K = k.num_topk, n = k.num_tokens, nl = L->local;
  const int64_t per = (int64_t)n * K;
  const uint64_t count = mep__ep_word(seq, (uint32_t)n);
  if (b == 0)
    for (int q = threadIdx.x; q < R; q += blockDim.x)
      if (ep_live(c, q) && w->kind[q] == MEP_DEV_PTR)
        red_store(w->peer[q] + mep__ep_comb_wflag(L, half, c.rank), count);
  for (int64_t i = (int64_t)b * blockDim.x + threadIdx.x; i < per * R;
       i += (int64_t)P * blockDim.x) {
    const int q = (int)(i / per);
    const int64_t tj = i % per;
    if (!ep_live(c, q)) continue;
    const int64_t e = k.topk_idx[tj] - (int64_t)q * nl;
    const uint32_t slot = e >= 0 && e < nl ? (uint32_t)e + 1 : 0;
    const int t = (int)(tj / K), j = (int)(tj % K);
    const uint64_t v = red_word(seq, slot, k.topk_weights[tj]);
    /* a mapped peer polls the word itself; a staged word is read after
     * the fence below and the put. A strong (sys-scope) store to host
     * memory cost about 150 ns each, one after another: 1024 of them took
     * 120-190 us of a combine (docs/perf.md). */
    if (w->kind[q] == MEP_DEV_PTR)
      red_store(w->peer[q] + mep__ep_comb_wts(L, half, c.rank, t, j), v);
    else
      *(uint64_t *)(w->host_base + mep__ep_red_wstage(L, q, t, j)) = v;
  }
  if (!c.has_proxy) return;
  /* the proxied ranks' words, once every publishing block staged its
   * share: one put each, and the count word after it */
  __threadfence_system();
  if (!ep_last_block(&c.st->pub_done, (unsigned)P)) return;
  for (int q = threadIdx.x; q < R; q += blockDim.x) {
    if (!ep_live(c, q) || w->kind[q] == MEP_DEV_PTR) continue;
    const uint64_t at = mep__ep_comb_wts(L, half, c.rank, 0, 0);
    if (n > 0)
      (void)mep_dev_put<false>(w, q, at, mep__ep_red_wstage(L, q, 0, 0),
                               (uint64_t)n * MEP_EP_STAGE_TOPK * 8, deadline);
    (void)mep_dev_signal<false>(w, q, mep__ep_comb_wflag(L, half, c.rank),
                                count, deadline);
  }
  __syncthreads(); /* every put and signal is in the ring */
  if (threadIdx.x == 0)
    mep_dev_store_release((volatile uint64_t *)&c.st->pub_seq, seq);
  ep_trace(c, MEP__EP_CS, MEP__EP_T_WORK);
}

/* Thread 0 of a block that will put partial sums to a proxied rank:
 * waits until this rank's weights are in the ring (red_publish), so that
 * they leave ahead of the sums. Queued behind them, the weights reached
 * the peer after megabytes of this rank's sums, and the peer's sums only
 * started then: up to 1.1 ms of a 1.6 ms combine at 128 tokens
 * (docs/perf.md). */
__device__ __forceinline__ void red_wait_published(const mep__ep_kcommon_t &c,
                                                   uint64_t seq,
                                                   uint64_t deadline) {
  const volatile uint64_t *p = (const volatile uint64_t *)&c.st->pub_seq;
  while (mep_dev_load_acquire(p) < seq && mep_dev_now_ns() <= deadline)
    __nanosleep(64);
}

/* Lane 0: waits for source s's weight word (t, j) of call seq into *v;
 * false past the deadline or once s is inactive. */
__device__ __forceinline__ bool red_wait_weight(const mep__ep_kcomb_t &k,
                                                int half, int s, int t, int j,
                                                uint64_t seq,
                                                uint64_t deadline,
                                                uint64_t *v) {
  const mep__ep_kcommon_t &c = k.c;
  const uint8_t *p =
      mep_dev_src(c.win, s, mep__ep_comb_wts(&c.lay, half, s, t, j));
  const uint64_t tag = red_tag(seq);
  for (;;) {
    *v = ep_load_relaxed((const uint64_t *)p);
    if ((*v >> 43) == tag) return true;
    if (!ep_active(c.active, s) || mep_dev_now_ns() > deadline) return false;
  }
}

/* One warp (lane 0's result): the row of token t among the rows expert el
 * got from source s, -1 if none (the first, should t name el twice). */
__device__ __forceinline__ int64_t red_find_row(const mep__ep_kcomb_t &k,
                                                int el, int s, int t,
                                                int lane) {
  const mep__ep_layout_t *L = &k.c.lay;
  const int64_t S = (int64_t)L->ranks * L->tokens;
  int64_t begin;
  const int64_t n = ep_pair_rows(k.layout_range, L, el, s, &begin);
  const int32_t *si = k.src_info + (size_t)el * S + begin;
  for (int64_t b = 0; b < n; b += 32) {
    const bool hit = b + lane < n && __ldg(si + b + lane) == t;
    const unsigned m = __ballot_sync(0xffffffffu, hit);
    if (m) return begin + b + __ffs(m) - 1;
  }
  return -1;
}

/* Named as the receive's kernel, and as push mode's (ep_dev.cuh: kernel
 * names); a buffer's calls use one mode. */
template <bool kMlx5>
__global__ void __launch_bounds__(RED_THREADS, 4) combine(mep__ep_kcomb_t k) {
  ep_early_start();
  const mep__ep_kcommon_t &c = k.c;
  const auto [L, w, seq, half, deadline] = ep_start(c, MEP__EP_CS);
  const int b = blockIdx.y * gridDim.x + blockIdx.x;
  const int P = min(RED_PUBLISH_BLOCKS, (int)(gridDim.x * gridDim.y));
  /* Only the publishers pass the stage gate: every other block that
   * writes the host part's stages waits for them first
   * (red_wait_published). Each pass reads the ring's counter in host
   * memory; 256 blocks doing so delayed the publish by 20 us. */
  if (b < P) {
    if (c.has_proxy) {
      if (threadIdx.x == 0) ep_stage_gate<false>(c, 1, deadline);
      __syncthreads();
    }
    red_publish(k, b, P, seq, deadline);
  }
  const int T = L->tokens, H = L->hidden, K = k.num_topk;
  const int64_t S = (int64_t)L->ranks * T;
  const int s = blockIdx.y, y = blockIdx.x, Y = gridDim.x;
  const bool proxied = w->kind[s] != MEP_DEV_PTR;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int W = blockDim.x >> 5;
  __shared__ int s_n;
  __shared__ const uint8_t *s_row[MEP_EP_STAGE_TOPK];
  __shared__ float s_w[MEP_EP_STAGE_TOPK];
  __shared__ int s_any, s_lost;
  __shared__ float4 s_out[RED_THREADS / 32 * 64]; /* red_store_f32x8 */

  ep_trace(c, MEP__EP_CS, MEP__EP_T_START);
  if (threadIdx.x == 0) {
    int n = -1;
    uint64_t word;
    if (proxied) red_wait_published(c, seq, deadline);
    if (ep_live(c, s)) {
      const uint64_t *f = (const uint64_t *)mep_dev_src(
          w, s, mep__ep_comb_wflag(L, half, s));
      if (ep_wait_host(c, MEP__EP_CS, y == 0, f, s, seq, deadline, &word))
        n = (int)(uint32_t)word < T ? (int)(uint32_t)word : T;
    }
    s_n = n;
    s_lost = 0;
  }
  __syncthreads();
  ep_trace(c, MEP__EP_CS, MEP__EP_T_MID);
  const int n = s_n;
  for (int t = y; t < n; t += Y) {
    if (threadIdx.x == 0) s_any = 0;
    __syncthreads();
    for (int j = warp; j < K; j += W) {
      uint64_t v = 0;
      int ok = 0;
      if (lane == 0) ok = red_wait_weight(k, half, s, t, j, seq, deadline, &v);
      v = __shfl_sync(0xffffffffu, v, 0);
      ok = __shfl_sync(0xffffffffu, ok, 0);
      const uint32_t slot = ok ? (uint32_t)(v >> 32) & RED_SLOT_MASK : 0;
      const uint8_t *row = nullptr;
      if (slot) {
        const int el = (int)slot - 1;
        const int64_t r = red_find_row(k, el, s, t, lane);
        if (r >= 0)
          row = (const uint8_t *)k.x + ((size_t)el * S + r) * 2 * (size_t)H;
      }
      if (lane == 0) {
        if (!ok) s_lost = 1;
        if (slot) s_any = 1;
        s_row[j] = row;
        s_w[j] = __uint_as_float((uint32_t)v);
      }
    }
    __syncthreads();
    if (s_lost) break; /* s went silent: the same in every thread */
    /* a token none of whose experts is here gets no partial sum: its
     * rank does not wait for one (the same test on its topk_idx) */
    if (s_any) {
      const uint64_t at = mep__ep_comb_part(L, half, c.rank, t);
      const uint64_t stage = mep__ep_red_pstage(L, s, t);
      uint8_t *dst = mep_dev_dst(w, s, at, stage);
      const int nq = H / 8; /* 16-byte units of a bf16 row */
      for (int qb = warp * 32; qb < nq; qb += W * 32) {
        const int q = qb + lane;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (q < nq) ep_weighted_sum8(s_row, s_w, K, q, acc);
        if (k.partial_bf16) {
          if (q < nq) ep_st16(dst + (size_t)q * 16, ep_pack_bf16x8(acc));
          continue;
        }
        red_store_f32x8(acc, s_out + warp * 64, dst + (size_t)qb * 32,
                        2 * (nq - qb), lane);
      }
      if (proxied) __threadfence_system(); /* each writer: win.cuh */
      __syncthreads();
      if (threadIdx.x == 0) {
        if (proxied)
          (void)mep_dev_put<false>(w, s, at, stage,
                                   (k.partial_bf16 ? 2 : 4) * (uint64_t)H,
                                   deadline);
        else
          (void)mep_dev_signal<false>(
              w, s, mep__ep_comb_tflag(L, half, c.rank, t),
              mep__ep_word(seq, 1), deadline);
      }
    }
    __syncthreads(); /* s_row, s_any are rewritten for the next token */
  }
  if (threadIdx.x == 0 && s_lost) ep_clear(c.active, s);

  /* a proxied source's last block raises the end-of-send flag, after
   * every put in the proxy's order; a mapped one has every token's flag
   * and needs none (top of file) */
  __syncthreads();
  if (threadIdx.x == 0 && proxied) {
    __threadfence_system();
    if (atomicAdd(k.red_done + s, 1u) == (unsigned)Y - 1) {
      *(volatile unsigned int *)(k.red_done + s) = 0;
      if (n >= 0 && ep_active(c.active, s))
        (void)mep_dev_signal<false>(w, s,
                                    mep__ep_comb_pflag(L, half, c.rank),
                                    mep__ep_word(seq, 1), deadline);
    }
  }
  /* Without a host part nothing is left to send: a fence at system scope
   * here would only wait for the last flags to land. */
  unsigned int *done = &c.st->done[MEP__EP_CS];
  const unsigned blocks = gridDim.x * gridDim.y;
  if (c.has_proxy ? ep_last_block(done, blocks)
                  : ep_last_block<true>(done, blocks))
    ep_finish(c, MEP__EP_CS, 1, seq);
}

} // namespace
} // namespace mep::ep

extern "C" int mep__ep_launch_reduce_send(const mep__ep_kcomb_t *k,
                                          void *stream) {
  return ep_launch(mep::ep::combine<false>,
                   dim3((unsigned)k->send_split, (unsigned)k->c.lay.ranks),
                   RED_THREADS, 0, 0, stream, *k);
}
