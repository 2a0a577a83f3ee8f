/* ep_combine_send.cu - the combine kernel's send phase (CUDA path), rows
 * pushed or pulled; reduce mode is ep_reduce_send.cu.
 *
 * Grid: (local expert, source) pairs x split blocks. The rows the
 * dispatch gave expert el from source s (layout_range of the handle) go
 * back to s, each into the row of its token there (src_info), a warp per
 * 4 KB chunk of a row (all its loads in flight before its stores): stored
 * straight into a mapped peer, or, a warp per row, into this rank's
 * host-part stage and put (a put per row) by the proxy. The pair's last
 * block to finish then sets s's flag of expert el (seq << 32 | MEP_EP_COMB_PUSHED), also for a
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
 * move the bytes instead of only waiting for them). The receive is in
 * ep_combine_recv.cu. */
#include <cuda_bf16.h>

#include "ep_dev.cuh"

namespace mep::ep {
namespace {

/* send_threads is MEP__EP_WARP_THREADS (ep_cuda.c). Named as the
 * receive's kernel (ep_dev.cuh: kernel names). */
template <bool kMlx5>
__global__ void __launch_bounds__(MEP__EP_WARP_THREADS)
    combine(mep__ep_kcomb_t k) {
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
    ep_stage_gate<kMlx5>(c, 1, deadline);
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
   * different warps, so a pair's few rows use many warps. A proxied
   * peer's row is one item instead, its chunks moved by one warp, which
   * then fences once and queues one put: with a fence and a command per
   * chunk (2048 a call at 128 tokens) the send took 2.4 ms, the commands
   * and fences waiting on each other's writes to host memory
   * (docs/perf.md). */
  const int nv = H / 8;
  const int C = pull ? 1 : (nv + EP_COPY_BATCH - 1) / EP_COPY_BATCH;
  const int per = proxied ? 1 : C; /* items per row */
  const int64_t step = (int64_t)Y * W;
  for (int64_t i = (int64_t)y * W + (threadIdx.x >> 5); i < n * per;
       i += step) {
    const int64_t row = begin + i / per;
    const int ch0 = proxied ? 0 : (int)(i % per), ch1 = proxied ? C : ch0 + 1;
    const size_t xrow = (size_t)el * S + row;
    /* the token's load overlaps the data's: only dst depends on it */
    const int tok = __ldg(k.src_info + xrow);
    if (pull) {
      if (lane == 0 && tok >= 0 && tok < T)
        *(int32_t *)mep_dev_dst(w, s, mep__ep_comb_map(L, half, e, tok), 0) =
            (int32_t)row;
      continue;
    }
    const uint64_t off = mep__ep_comb_row(L, half, e, tok);
    const uint64_t stage = mep__ep_comb_stage(L, el, (int)row);
    for (int ch = ch0; ch < ch1; ch++) {
      const int v0 = ch * EP_COPY_BATCH;
      const int cnv = nv - v0 < EP_COPY_BATCH ? nv - v0 : EP_COPY_BATCH;
      const uint8_t *src =
          (const uint8_t *)k.x + xrow * 2 * H + (size_t)v0 * 16;
      ep_v16 d[EP_COPY_UNROLL];
#pragma unroll
      for (int u = 0; u < EP_COPY_UNROLL; u++)
        if (u * 32 + lane < cnv)
          d[u] = ep_ld16_nc(src + (size_t)(u * 32 + lane) * 16);
      if (tok < 0 || tok >= T) break; /* the same for the whole warp */
      uint8_t *dst = mep_dev_dst(w, s, off, stage) + (size_t)v0 * 16;
#pragma unroll
      for (int u = 0; u < EP_COPY_UNROLL; u++)
        if (u * 32 + lane < cnv)
          ep_st16(dst + (size_t)(u * 32 + lane) * 16, d[u]);
    }
    if (proxied && tok >= 0 && tok < T) {
      __threadfence_system();
      __syncwarp();
      if (lane == 0)
        (void)mep_dev_put<kMlx5>(w, s, off, stage, 2 * (uint64_t)H, deadline);
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
        (void)mep_dev_signal<kMlx5>(
            w, s, mep__ep_comb_flag(L, half, e),
            mep__ep_word(seq, pull ? MEP_EP_COMB_PULL : MEP_EP_COMB_PUSHED),
            deadline);
    }
  }
  if (ep_last_block(&c.st->done[MEP__EP_CS], gridDim.x * gridDim.y))
    ep_finish(c, MEP__EP_CS, 1, seq);
}

} // namespace
} // namespace mep::ep

extern "C" int mep__ep_launch_combine_send(const mep__ep_kcomb_t *k,
                                           void *stream) {
  dim3 grid((unsigned)(k->c.lay.local * k->c.lay.ranks),
            (unsigned)k->send_split);
  return ep_launch(EP_KERNEL(mep::ep::combine, k->c.has_mlx5), grid,
                   k->send_threads, 0, 0, stream, *k);
}

extern "C" int mep__ep_combine_send_per_sm(int threads, int has_mlx5) {
  return ep_blocks_per_sm(EP_KERNEL(mep::ep::combine, has_mlx5), threads);
}
