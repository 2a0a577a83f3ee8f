/* ep_combine.cu - the combine kernels of the CUDA path.
 *
 * Send (grid: (local expert, source) pairs x split blocks): the rows the
 * dispatch gave expert el from source s (layout_range of the handle) go
 * back to s, each into the row of its token there (src_info), a warp per
 * 4 KB chunk of a row (all its loads in flight before its stores): stored
 * straight into a mapped peer, or into this rank's host-part stage and
 * put (a put per chunk) by the proxy. The pair's last block to finish then
 * sets s's flag of expert el (seq << 32 | MEP_EP_COMB_PUSHED), also for a
 * pair without rows.
 *
 * Zero-copy: mep_ep_combine_buffer is the device part's combine stage
 * (the CUDA path stages in the host part only), so experts write their
 * outputs in device memory, which mapped peers can read. A zero-copy call
 * with both phases therefore pulls: the send only writes, per row, its
 * place into s's combine map, and the flag says MEP_EP_COMB_PULL; s's
 * receive reads the rows from this rank's stage and says when it is done
 * (comb_done_reading). A proxied peer's rows still go through the
 * host-part stage, and a two-phase call pushes (its hook would otherwise
 * move the bytes instead of only waiting for them).
 *
 * Receive (a block per token at a time): the first threads wait for the
 * flags of the token's experts (a rank whose flag misses the deadline is
 * cleared in active and contributes nothing), then every thread sums its
 * 8 channels over the top-k rows in float and rounds to bf16 once. The
 * kernel also waits for one flag of every active rank, named or not: the
 * two halves are safe for back-to-back combines only with that (see the
 * end of comb_recv). */
#include <cuda_bf16.h>

#include "ep_dev.cuh"

namespace {

/* send_threads is MEP__EP_WARP_THREADS (ep_cuda.c). */
__global__ void __launch_bounds__(MEP__EP_WARP_THREADS)
    comb_send(mep__ep_kcomb_t k) {
  ep_early_start();
  const mep__ep_kcommon_t &c = k.c;
  const auto [L, w, seq, half, deadline] = ep_start(c, MEP__EP_CS);
  const int R = L->ranks, T = L->tokens, H = L->hidden;
  const int64_t S = (int64_t)R * T;
  /* pairs on x: there may be more than grid.y takes */
  const int pair = blockIdx.x, el = pair / R, s = pair % R;
  const int y = blockIdx.y, Y = gridDim.y;
  const int e = c.rank * L->local + el;
  __shared__ int s_on;

  ep_trace(c, MEP__EP_CS, MEP__EP_T_START);
  if (threadIdx.x == 0) {
    ep_stage_gate(c, 1, deadline);
    s_on = ep_live(c, s);
  }
  __syncthreads();
  const bool on = s_on != 0;
  int64_t begin = 0;
  const int64_t n = on ? ep_pair_rows(k.layout_range, L, el, s, &begin) : 0;
  const bool proxied = w->kind[s] != MEP_DEV_PTR;
  /* a pulled row stays where it is (x is the stage): s learns which it is */
  const bool pull = k.pull && !proxied;
  const int lane = threadIdx.x & 31, W = blockDim.x >> 5;
  /* work items are (row, chunk of EP_COPY_BATCH units): a warp moves one
   * chunk with all its loads in flight at once, and a row's chunks go to
   * different warps, so a pair's few rows use many warps */
  const int nv = H / 8;
  const int C = pull ? 1 : (nv + EP_COPY_BATCH - 1) / EP_COPY_BATCH;
  const int64_t step = (int64_t)Y * W;
  for (int64_t i = (int64_t)y * W + (threadIdx.x >> 5); i < n * C;
       i += step) {
    const int64_t row = begin + i / C;
    const int ch = (int)(i % C), v0 = ch * EP_COPY_BATCH;
    const int cnv = nv - v0 < EP_COPY_BATCH ? nv - v0 : EP_COPY_BATCH;
    const size_t xrow = (size_t)el * S + row;
    /* the token's load overlaps the data's: only dst depends on it */
    const int tok = __ldg(k.src_info + xrow);
    const uint8_t *src = (const uint8_t *)k.x + xrow * 2 * H + (size_t)v0 * 16;
    if (pull) {
      if (lane == 0 && tok >= 0 && tok < T)
        *(int32_t *)mep_dev_dst(w, s, mep__ep_comb_map(L, half, e, tok), 0) =
            (int32_t)row;
      continue;
    }
    ep_v16 d[EP_COPY_UNROLL];
#pragma unroll
    for (int u = 0; u < EP_COPY_UNROLL; u++)
      if (u * 32 + lane < cnv) d[u] = ep_ld16_nc(src + (size_t)(u * 32 + lane) * 16);
    if (tok < 0 || tok >= T) continue; /* the same for the whole warp */
    const uint64_t off = mep__ep_comb_row(L, half, e, tok) + (uint64_t)v0 * 16;
    const uint64_t stage =
        mep__ep_comb_stage(L, el, (int)row) + (uint64_t)v0 * 16;
    uint8_t *dst = mep_dev_dst(w, s, off, stage);
#pragma unroll
    for (int u = 0; u < EP_COPY_UNROLL; u++)
      if (u * 32 + lane < cnv) ep_st16(dst + (size_t)(u * 32 + lane) * 16, d[u]);
    if (proxied) {
      __threadfence_system();
      __syncwarp();
      if (lane == 0)
        (void)mep_dev_put(w, s, off, stage, 16 * (uint64_t)cnv, deadline);
    }
  }

  /* the pair's last block signals: after every row of the pair, from any
   * block, was stored (mapped peer, or this rank's stage for a pull) or
   * queued (proxy) */
  __syncthreads();
  ep_trace(c, MEP__EP_CS, MEP__EP_T_MID);
  if (threadIdx.x == 0) {
    __threadfence_system();
    if (atomicAdd(k.pair_done + pair, 1u) == (unsigned)Y - 1) {
      *(volatile unsigned int *)(k.pair_done + pair) = 0;
      if (on)
        (void)mep_dev_signal(
            w, s, mep__ep_comb_flag(L, half, e),
            mep__ep_word(seq, pull ? MEP_EP_COMB_PULL : MEP_EP_COMB_PUSHED),
            deadline);
    }
  }
  if (ep_last_block(&c.st->done[MEP__EP_CS], gridDim.x * gridDim.y))
    ep_finish(c, MEP__EP_CS, 1, seq);
}

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
      (void)mep_dev_signal(w, r, mep__ep_comb_done(L, c.rank),
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

/* recv_threads is at most 512 (ep_cuda.c): registers for the batch. */
__global__ void __launch_bounds__(512) comb_recv(mep__ep_kcomb_t k) {
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
      ep_v16 o;
      for (int i = 0; i < 4; i++) {
        __nv_bfloat162 b = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
        o.w[i] = *reinterpret_cast<uint32_t *>(&b);
      }
      ep_st16(out + (size_t)q * 16, o);
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

extern "C" int mep__ep_launch_combine_send(const mep__ep_kcomb_t *k,
                                           void *stream) {
  dim3 grid((unsigned)(k->c.lay.local * k->c.lay.ranks),
            (unsigned)k->send_split);
  comb_send<<<grid, k->send_threads, 0, (cudaStream_t)stream>>>(*k);
  return (int)cudaGetLastError();
}

extern "C" int mep__ep_launch_combine_recv(const mep__ep_kcomb_t *k,
                                           void *stream) {
  return ep_launch_dependent(comb_recv, dim3((unsigned)k->recv_blocks),
                        k->recv_threads, k->c.early_recv, stream, *k);
}

extern "C" int mep__ep_combine_send_per_sm(int threads) {
  return ep_blocks_per_sm(comb_send, threads);
}
