/* ep_combine_recv.cu - the combine kernel's receive phase (CUDA path), rows
 * pushed or pulled (ep_combine_send.cu says how they come); reduce mode is
 * ep_reduce_recv.cu.
 *
 * A block per token at a time: the first threads wait for the
 * flags of the token's experts (a rank whose flag misses the deadline is
 * cleared in active and contributes nothing), then every thread sums its
 * 8 channels over the top-k rows in float and rounds to bf16 once. The
 * kernel also waits for one flag of every active rank, named or not: the
 * two halves are safe for back-to-back combines only with that (see the
 * end of the kernel). */
#include <cuda_bf16.h>

#include "ep_dev.cuh"

namespace mep::ep {
namespace {

/* Where expert e's output for token t is, once the flag `word` of e's
 * rank r for the call arrived; NULL for a map entry outside the expert's
 * rows (it then contributes nothing). */
__device__ __forceinline__ const uint8_t *comb_row_of(const mep__ep_kcomb_t &k,
                                                      int half, int e, int r,
                                                      int t, uint64_t word) {
  const mep__ep_kcommon_t &c = k.c;
  const mep__ep_layout_t *L = &c.lay;
  const mep_dev_win_t *w = c.win;
  if ((uint32_t)word != MEP_EP_COMB_PULL)
    return mep_dev_src(w, r, mep__ep_comb_row(L, half, e, t));
  const int64_t S = (int64_t)L->ranks * L->tokens;
  const int m = *(const volatile int32_t *)(w->dev_base +
                                             mep__ep_comb_map(L, half, e, t));
  if (m < 0 || m >= S) return nullptr;
  return mep_dev_peer_src(w, r, mep__ep_comb_stage(L, e - r * L->local, m));
}

/* The last block of a combine receive, after every block's reads: tells
 * each mapped peer that this rank is done with its rows of call seq (its
 * next send may overwrite its stage, its caller its zero-copy buffer)
 * and, when this call's send left rows for mapped peers to pull, waits
 * until each of them is done with this rank's. A peer that does not say
 * so by the deadline is cleared in active. */
__device__ void comb_done_reading(const mep__ep_kcomb_t &k, uint64_t seq,
                                  uint64_t deadline) {
  const mep__ep_kcommon_t &c = k.c;
  const mep__ep_layout_t *L = &c.lay;
  const mep_dev_win_t *w = c.win;
  for (int r = threadIdx.x; r < L->ranks; r += blockDim.x)
    if (r != c.rank && w->kind[r] == MEP_DEV_PTR && ep_active(c.active, r))
      (void)mep_dev_signal<false>(w, r, mep__ep_comb_done(L, c.rank),
                           mep__ep_word(seq, 1), deadline);
  if (!k.pull) return;
  for (int r = threadIdx.x; r < L->ranks; r += blockDim.x) {
    uint64_t word;
    if (r == c.rank || w->kind[r] != MEP_DEV_PTR || !ep_active(c.active, r))
      continue;
    const uint64_t *f =
        (const uint64_t *)(w->dev_base + mep__ep_comb_done(L, r));
    (void)ep_wait_word(f, seq, c.active, r, deadline, &word);
  }
}

/* recv_threads is at most 512 (ep_cuda.c): registers for the batch.
 * Named as the send's kernel (ep_dev.cuh: kernel names). */
template <bool kMlx5>
__global__ void __launch_bounds__(512) combine(mep__ep_kcomb_t k) {
  const mep__ep_kcommon_t &c = k.c;
  const auto [L, w, seq, half, deadline] = ep_start(c, MEP__EP_CR);
  const int E = L->experts, nl = L->local, H = L->hidden;
  const int topk = k.num_topk;
  __shared__ const uint8_t *s_row[MEP_EP_STAGE_TOPK];
  __shared__ float s_w[MEP_EP_STAGE_TOPK];
  ep_trace(c, MEP__EP_CR, MEP__EP_T_START);

  for (int t = blockIdx.x; t < k.num_tokens; t += gridDim.x) {
    if ((int)threadIdx.x < topk) {
      int j = threadIdx.x;
      int64_t e = k.topk_idx[(size_t)t * topk + j];
      const uint8_t *row = nullptr;
      float wt = 0.0f;
      if (e >= 0 && e < E) {
        int r = (int)(e / nl);
        uint64_t word;
        if (ep_live(c, r)) {
          const uint64_t *f = (const uint64_t *)mep_dev_src(
              w, r, mep__ep_comb_flag(L, half, (int)e));
          if (ep_wait_word(f, seq, c.active, r, deadline, &word)) {
            row = comb_row_of(k, half, (int)e, r, t, word);
            wt = row ? k.topk_weights[(size_t)t * topk + j] : 0.0f;
          }
        }
      }
      s_row[j] = row;
      s_w[j] = wt;
    }
    __syncthreads(); /* the flags' acquires precede every row read */
    if (t == (int)blockIdx.x) ep_trace(c, MEP__EP_CR, MEP__EP_T_MID);
    uint8_t *out = (uint8_t *)k.out + (size_t)t * 2 * H;
    for (int q = threadIdx.x; q < H / 8; q += blockDim.x) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      ep_weighted_sum8(s_row, s_w, topk, q, acc);
      ep_st16(out + (size_t)q * 16, ep_pack_bf16x8(acc));
    }
    __syncthreads(); /* s_row is rewritten for the next token */
  }

  /* Every active rank's flag of this call, whatever the tokens here name:
   * rank r sets it from its send kernel, which runs after its receive of
   * the previous call. So this kernel ends only after every peer's
   * receive of call seq-1 read its rows, and the next send here (call
   * seq+1, half 1-half) cannot overwrite rows of half 1-half that a slow
   * peer still reads. Without it a rank whose tokens name none of r's
   * experts (0 tokens, say) ran ahead two combines and overwrote r's
   * rows of call seq-1 (seen over tcp). The expert polled is r's first:
   * every pair (el, this rank) of r signals. */
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < L->ranks;
       r += gridDim.x * blockDim.x) {
    uint64_t word;
    if (!ep_live(c, r)) continue;
    const uint64_t *f =
        (const uint64_t *)mep_dev_src(w, r, mep__ep_comb_flag(L, half, r * nl));
    (void)ep_wait_word(f, seq, c.active, r, deadline, &word);
  }

  if (ep_last_block(&c.st->done[MEP__EP_CR], gridDim.x)) {
    comb_done_reading(k, seq, deadline);
    ep_finish(c, MEP__EP_CR, -1, seq);
  }
  ep_after_send();
}

} // namespace
} // namespace mep::ep

extern "C" int mep__ep_launch_combine_recv(const mep__ep_kcomb_t *k,
                                           void *stream) {
  return ep_launch(EP_KERNEL(mep::ep::combine, k->c.has_mlx5),
                   dim3((unsigned)k->recv_blocks),
                   k->recv_threads, 0, k->c.early_recv, stream, *k);
}
