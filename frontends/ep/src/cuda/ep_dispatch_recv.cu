/* ep_dispatch_recv.cu - the dispatch kernel's receive phase (CUDA path).
 *
 * Grid: split blocks x groups of local experts. Every block of a group
 * waits for each active source's count word for each of the group's
 * experts (a source that misses the deadline is cleared in active) and
 * lays the sources out in rank order; block 0 writes layout_range and
 * recv_count. Then the group's blocks copy the rows out, a warp per
 * (expert, slot, chunk of the row), reading the token's row the index
 * names. The send is in ep_dispatch_send.cu. */
#include "ep_dev.cuh"

namespace mep::ep {
namespace {

/* Exclusive prefix sum over the block of one int per thread (blockDim a
 * multiple of 32, at most 1024); *total gets the sum. */
__device__ int block_excl_scan(int v, int *total) {
  __shared__ int warp_sum[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int nw = blockDim.x >> 5;
  int incl = v;
  for (int d = 1; d < 32; d <<= 1) {
    int o = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += o;
  }
  if (lane == 31) warp_sum[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int ws = lane < nw ? warp_sum[lane] : 0;
    for (int d = 1; d < 32; d <<= 1) {
      int o = __shfl_up_sync(0xffffffffu, ws, d);
      if (lane >= d) ws += o;
    }
    if (lane < nw) warp_sum[lane] = ws; /* inclusive over warps */
  }
  __syncthreads();
  int before = warp == 0 ? 0 : warp_sum[warp - 1];
  *total = warp_sum[nw - 1];
  __syncthreads(); /* warp_sum is reused by the next call */
  return before + incl - v;
}

/* 16-byte units of a received row, and the chunks of EP_COPY_BATCH units
 * a warp copies in one go (all its loads in flight at once). */
__device__ __forceinline__ int recv_units(const mep__ep_kdisp_t &k) {
  return k.fp8 ? k.c.lay.hidden / 16 : k.c.lay.hidden / 8;
}

/* A warp: chunk `ch` of slot `slot` of source `src` for local expert el
 * (the token the index names, from the source's token rows) into output
 * row `row` of that expert; chunk 0 also moves the source token's index
 * and the scales. `base`: where src's bytes land here (mep_dev_src at
 * offset 0). */
__device__ __forceinline__ void recv_chunk(const mep__ep_kdisp_t &k,
                                           const uint8_t *base, int half,
                                           int el, int src, int slot,
                                           int row, int ch) {
  const mep__ep_layout_t *L = &k.c.lay;
  const int lane = threadIdx.x & 31, H = L->hidden;
  const size_t S = (size_t)L->ranks * L->tokens;
  const size_t orow = (size_t)el * S + row;
  const int32_t *ix =
      (const int32_t *)(base + mep__ep_disp_index(L, half, el, src, slot));
  const int t = __ldcg(ix); /* the same for every lane */
  if (ch == 0 && lane == 0) k.src_info[orow] = t;
  if (t < 0 || t >= L->tokens) return; /* cannot happen: the source wrote it */
  const uint8_t *data =
      base + mep__ep_disp_token(L, half, src, t) + MEP_EP_MSG_HEADER;
  const int nv = recv_units(k), v0 = ch * EP_COPY_BATCH;
  const int cnv = nv - v0 < EP_COPY_BATCH ? nv - v0 : EP_COPY_BATCH;
  const size_t row_bytes = (size_t)nv * 16;
  const float *sc = (const float *)(data + H);
  const int G = H / 128;
  /* the first 64 scales' loads go out with the row's, not after its
   * stores: one memory latency less per row (hidden 7168 has 56) */
  const bool pre = k.fp8 && ch == 0 && !k.ue8m0;
  float sc0 = pre && lane < G ? __ldcg(sc + lane) : 0.0f;
  float sc1 = pre && lane + 32 < G ? __ldcg(sc + lane + 32) : 0.0f;
  ep_warp_copy<true>((uint8_t *)k.recv_x + orow * row_bytes + (size_t)v0 * 16,
                     data + (size_t)v0 * 16, cnv, lane);
  if (!k.fp8 || ch != 0) return;
  if (!k.ue8m0) {
    float *o = (float *)k.recv_scales;
    for (int g = lane; g < G; g += 32)
      o[((size_t)el * G + g) * S + row] = g == lane        ? sc0
                                          : g == lane + 32 ? sc1
                                                           : __ldcg(sc + g);
    return;
  }
  /* ue8m0: group 4j+i's exponent byte in byte i of word j */
  int32_t *o = (int32_t *)k.recv_scales;
  for (int j = lane; j < G / 4; j += 32) {
    uint32_t word = 0;
    for (int i = 0; i < 4; i++)
      word |= ((__float_as_uint(__ldcg(sc + 4 * j + i)) >> 23) & 0xffu)
              << (8 * i);
    o[((size_t)el * (G / 4) + j) * S + row] = (int32_t)word;
  }
}

/* The counts of every source for the experts el0 .. el0 + P / R - 1 (a
 * group: pair p is expert el0 + p / R, source p % R) as this block sees
 * them: s_lr[p] packed as layout_range (the first row within the expert,
 * the count) and s_flat[p] the pair's first row among the group's (shared,
 * [P] each). The group's blocks share its rows out among all their warps,
 * so that an expert which got many rows does not keep its own few blocks
 * busy after the others' are done. Block 0 of the group (publish) stores
 * layout_range and recv_count too.
 * Each block reads the count words itself rather than wait for block 0
 * to publish them: that hand-off (block 0's fence and release, the
 * siblings' acquire and reload) sat between the last count and the first
 * copy. The words are final once they carry seq, so every block that saw
 * them all lays the rows out alike; a failed wait, after which views may
 * differ, marks the call (dr_lost) and the last block redoes the copy
 * from block 0's layout. */
__device__ void recv_layout(const mep__ep_kdisp_t &k, uint64_t seq, int half,
                            int el0, int P, uint64_t deadline, int64_t *s_lr,
                            int *s_flat, bool publish, bool first) {
  const mep__ep_kcommon_t &c = k.c;
  const mep__ep_layout_t *L = &c.lay;
  const int R = L->ranks, T = L->tokens;
  int running = 0;
  for (int base = 0; base < P; base += blockDim.x) {
    const int p = base + (int)threadIdx.x, s = p % R;
    int n = 0, chunk = 0;
    if (p < P && ep_live(c, s)) {
      const uint64_t *cw = (const uint64_t *)mep_dev_src(
          c.win, s, mep__ep_disp_count(L, half, el0 + p / R, s));
      /* a source without mapped memory put its index words and other
       * count words before it signalled the last one, and only the
       * signal orders them after its rows (ep_dispatch_send.cu) */
      const uint64_t *last = (const uint64_t *)mep_dev_src(
          c.win, s, mep__ep_disp_count(L, half, L->local - 1, s));
      uint64_t word = 0;
      if ((c.win->kind[s] == MEP_DEV_PTR ||
           ep_wait_host<true>(c, MEP__EP_DR, first, last, s, seq, deadline,
                              &word)) &&
          ep_wait_word<true>(cw, seq, c.active, s, deadline, &word)) {
        uint32_t got = (uint32_t)word;
        n = got > (uint32_t)T ? T : (int)got;
      } else {
        *(volatile unsigned int *)&c.st->dr_lost = 1u;
      }
    }
    int excl = block_excl_scan(n, &chunk);
    if (p < P) {
      s_flat[p] = running + excl;
      s_lr[p] = n; /* the count, until the expert's first row is known */
    }
    running += chunk;
  }
  __syncthreads(); /* s_flat is complete */
  for (int p = threadIdx.x; p < P; p += blockDim.x) {
    const int e0 = p - p % R, el = el0 + p / R;
    const int n = (int)s_lr[p], begin = s_flat[p] - s_flat[e0];
    s_lr[p] = mep__ep_lr_pack((uint32_t)begin, n);
    if (!publish) continue;
    k.layout_range[(size_t)el * R + p % R] = s_lr[p];
    if (p % R == R - 1) {
      k.recv_count[el] = begin + n;
      if (k.recv_stats) k.recv_stats[el] += begin + n;
    }
  }
  __syncthreads(); /* s_lr is complete */
}

/* Warp gw of GW copies its share of the rows of pairs 0 .. P - 1 from
 * expert el0 on (as recv_layout numbers them), laid out by lr: the
 * block's view in shared memory, or (kShared false) layout_range as
 * other blocks wrote it. bases[s]: mep_dev_src(win, s, 0), in shared
 * memory (the count words' acquire leaves nothing in L1, and each warp's
 * first item loaded the window's kind again: 0.4-0.7 us a dispatch,
 * docs/perf.md). The (row, chunk) items of the pairs, in order, go
 * round-robin over the warps; a warp walks to its next item without a
 * division: two 64-bit remainders per pair in every warp made a dispatch
 * with groups of 16 pairs 7 us slower (docs/perf.md). At most P * T * C
 * items: int. */
template <bool kShared>
__device__ void recv_rows(const mep__ep_kdisp_t &k, int half, int el0,
                          const int64_t *lr, const uint8_t *const *bases,
                          int P, int gw, int GW) {
  const int R = k.c.lay.ranks;
  const int C = (recv_units(k) + EP_COPY_BATCH - 1) / EP_COPY_BATCH;
  int q = 0, next = gw; /* items of the pairs before p; this warp's next */
  for (int p = 0; p < P; p++) {
    int64_t v = kShared ? lr[p] : __ldcg(lr + p);
    const int n = (int)mep__ep_lr_count(v), begin = (int)mep__ep_lr_begin(v);
    const int end = q + (n > 0 ? n : 0) * C;
    for (; next < end; next += GW) {
      const int row = (next - q) / C;
      recv_chunk(k, bases[p % R], half, el0 + p / R, p % R, row,
                 begin + row, next - q - row * C);
    }
    q = end;
  }
}

/* recv_threads is MEP__EP_WARP_THREADS (ep_cuda.c); three blocks an SM,
 * so that the grid the host sizes (a few blocks per expert) is resident
 * at once: a block that waits for the counts holds its SM, and blocks of
 * a second wave would start only after the first ones' copies. Grid:
 * recv_split blocks x groups of recv_group local experts. Dynamic shared
 * memory: the block's layout, 12 bytes per (expert, source) pair of its
 * group, and where each source's bytes land. Named as the send's kernel
 * (ep_dev.cuh: kernel names). */
template <bool kMlx5>
__global__ void __launch_bounds__(MEP__EP_WARP_THREADS, 3)
    dispatch(mep__ep_kdisp_t k) {
  const mep__ep_kcommon_t &c = k.c;
  const auto [L, w, seq, half, deadline] = ep_start(c, MEP__EP_DR);
  const int R = L->ranks, el0 = blockIdx.y * k.recv_group;
  const int P = min(k.recv_group, L->local - el0) * R;
  const int y = blockIdx.x, Y = gridDim.x;
  const int W = blockDim.x >> 5, warp = (int)(threadIdx.x >> 5);
  extern __shared__ int64_t s_lr[];
  const uint8_t **s_base = (const uint8_t **)(s_lr + P);
  int *s_flat = (int *)(s_base + R);
  for (int r = threadIdx.x; r < R; r += blockDim.x)
    s_base[r] = mep_dev_src(c.win, r, 0); /* read before the waits */

  ep_trace(c, MEP__EP_DR, MEP__EP_T_START);
  recv_layout(k, seq, half, el0, P, deadline, s_lr, s_flat, y == 0,
              y == 0 && el0 == 0);
  ep_trace(c, MEP__EP_DR, MEP__EP_T_MID);
  recv_rows<true>(k, half, el0, s_lr, s_base, P, y * W + warp, Y * W);
  ep_trace(c, MEP__EP_DR, MEP__EP_T_WORK);

  /* what the blocks wrote is read on this GPU, after the kernel (or here,
   * by the last block) */
  if (ep_last_block<true>(&c.st->done[MEP__EP_DR], gridDim.x * gridDim.y)) {
    /* every other block is done and its writes are visible here */
    if (*(volatile unsigned int *)&c.st->dr_lost) {
      for (int e = 0; e < L->local; e++)
        recv_rows<false>(k, half, e, k.layout_range + (size_t)e * R,
                         s_base, R, warp, W);
      __syncthreads();
      if (threadIdx.x == 0) c.st->dr_lost = 0u;
    }
    ep_finish(c, MEP__EP_DR, -1, seq);
  }
  ep_after_send();
}

} // namespace
} // namespace mep::ep

extern "C" int mep__ep_launch_dispatch_recv(const mep__ep_kdisp_t *k,
                                            void *stream) {
  const int g = k->recv_group, nl = k->c.lay.local;
  dim3 grid((unsigned)k->recv_split, (unsigned)((nl + g - 1) / g));
  return ep_launch(EP_KERNEL(mep::ep::dispatch, k->c.has_mlx5), grid,
                   k->recv_threads,
                   (size_t)k->c.lay.ranks *
                       (g * (sizeof(int64_t) + sizeof(int)) + sizeof(void *)),
                   k->c.early_recv, stream, *k);
}

extern "C" int mep__ep_dispatch_recv_per_sm(int threads) {
  return ep_blocks_per_sm(mep::ep::dispatch<false>, threads);
}
