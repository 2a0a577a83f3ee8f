/* ep_normal_dispatch.cu - the normal mode's dispatch: a send kernel that
 * numbers each token's place on every rank it goes to (send_head) and
 * stores its message there, and a receive kernel that unpacks the
 * messages into the outputs in source order. */
#include "ep_normal_dev.cuh"

namespace mep {
namespace ep {
namespace {

#define EPN_SEND_THREADS 512
#define EPN_RECV_THREADS 256

/* Loads in flight per lane in a send's row copy: its stores cross
 * NVLink, so each round trip should carry as much as registers allow. */
#define EPN_SEND_UNROLL 16

/* A warp stores token t's message at m (ep_normal.h: the layout). For
 * this rank itself only the header: its receive reads the rest from the
 * call's own inputs, which saves the send a copy of every row it keeps.
 * The first scales and top-k entries are loaded before the row, so that
 * their latency hides under the copy's instead of following it. */
__device__ __forceinline__ void write_msg(const mep__epn_k_t &k, int t,
                                          uint8_t *m, int lane, bool self) {
  const size_t xb = (size_t)k.hidden * (size_t)k.es;
  if (lane == 0) {
    ep_v16 h = {{(uint32_t)t, 0u, 0u, 0u}};
    ep_st16(m, h);
  }
  if (self) return;
  const uint32_t *xs = (const uint32_t *)k.x_scales;
  const size_t sts = (size_t)k.sts, shs = (size_t)k.shs;
  const int S = k.num_scales, K = k.K;
  const int64_t *ti = k.topk_idx + (size_t)t * K;
  const float *tw = k.topk_w + (size_t)t * K;
  const uint32_t s0 = lane < S ? xs[t * sts + lane * shs] : 0u;
  const uint32_t s1 = lane + 32 < S ? xs[t * sts + (lane + 32) * shs] : 0u;
  const int64_t e0 = lane < K ? ti[lane] : 0;
  const float w0 = lane < K ? tw[lane] : 0.0f;
  ep_warp_copy<false, EPN_SEND_UNROLL>(m + 16, k.x + (size_t)t * xb,
                                       (int)(xb / 16), lane);
  uint32_t *sc = (uint32_t *)(m + 16 + xb);
  if (lane < S) sc[lane] = s0;
  if (lane + 32 < S) sc[lane + 32] = s1;
  for (int i = lane + 64; i < S; i += 32) sc[i] = xs[t * sts + i * shs];
  int64_t *idx = (int64_t *)(m + k.idx_off);
  float *wt = (float *)(idx + K);
  if (lane < K) {
    idx[lane] = e0;
    wt[lane] = w0;
  }
  for (int j = lane + 32; j < K; j += 32) {
    idx[j] = ti[j];
    wt[j] = tw[j];
  }
}

/* Block b takes a contiguous range of tokens. Its place on rank r is what
 * sources before this rank send r, plus this rank's tokens for r before
 * it (counted by the block: earlier ranges, then a scan per chunk). */
__global__ void __launch_bounds__(EPN_SEND_THREADS)
    dispatch(mep__epn_k_t k) {
  extern __shared__ int sm[];
  int *base = sm, *wsum = sm + k.R;
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, nw = T >> 5;
  const mep_dev_win_t *w = k.win;
  const uint64_t seq = epn_seq(k, MEP__EP_DS);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + k.timeout_ns;
  const uint64_t P = k.P, dmsg = k.dmsg;
  const uint64_t to = k.drecv + ((uint64_t)half * R + me) * P;
  epn_stage_gate(k, 0, deadline);
  const int N = k.num_tokens, per = (N + gridDim.x - 1) / gridDim.x;
  const int t0 = min(N, (int)blockIdx.x * per), t1 = min(N, t0 + per);
  for (int r = tid; r < R; r += T) base[r] = epn_before(k.rpm, R, me, r);
  __syncthreads();
  for (int r = 0; r < R; r++) {
    int c = 0;
    for (int t = tid; t < t0; t += T) c += k.in_rank[(size_t)t * R + r] != 0;
    c = __reduce_add_sync(0xffffffffu, c);
    if (lane == 0 && c) atomicAdd(&base[r], c);
  }
  __syncthreads();
  for (int c0 = t0; c0 < t1; c0 += T) {
    const int t = c0 + tid;
    for (int r = 0; r < R; r++) {
      const bool f = t < t1 && k.in_rank[(size_t)t * R + r];
      const unsigned bal = __ballot_sync(0xffffffffu, f);
      if (lane == 0) wsum[warp] = __popc(bal);
      __syncthreads();
      int before = 0, total = 0;
      for (int i = 0; i < nw; i++) {
        before += i < warp ? wsum[i] : 0;
        total += wsum[i];
      }
      if (t < t1)
        k.send_head[(size_t)t * R + r] =
            f && ep_active(k.active, r)
                ? base[r] + before + __popc(bal & ((1u << lane) - 1))
                : -1;
      __syncthreads();
      if (tid == 0) base[r] += total;
    }
    __syncthreads();
    const int n = min(T, t1 - c0);
    for (int i = warp; i < n; i += nw) {
      const int tt = c0 + i;
      for (int r = 0; r < R; r++) {
        const int h = k.send_head[(size_t)tt * R + r];
        if (h < 0) continue;
        const uint64_t slot = (uint64_t)(h - epn_before(k.rpm, R, me, r));
        if ((slot + 1) * dmsg > P) continue; /* not this buffer's counts */
        write_msg(k, tt,
                  mep_dev_dst(w, r, to + slot * dmsg,
                              k.dstage + (uint64_t)r * P + slot * dmsg),
                  lane, r == me);
      }
    }
  }
  __threadfence_system();
  if (!ep_last_block(&k.st->d.done[MEP__EP_DS], gridDim.x)) return;
  for (int r = tid; r < R; r += T) {
    if (!ep_active(k.active, r)) continue;
    epn_deliver(k, r, to, k.dstage + (uint64_t)r * P,
                (uint64_t)epn_count(k.rpm, R, me, r), dmsg,
                k.dsig + ((uint64_t)half * R + me) * 8, seq, deadline);
  }
  epn_finish(k, MEP__EP_DS, 0, seq);
}

/* A warp per received row, rows in source order; then, for a non-cached
 * call, where each source's channels start (DeepEP's
 * recv_channel_prefix_matrix: the first row of the source whose token is
 * in the channel's range). */
__global__ void __launch_bounds__(EPN_RECV_THREADS)
    dispatch_recv(mep__epn_k_t k) {
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const int lane = tid & 31, nw = T >> 5;
  const mep_dev_win_t *w = k.win;
  const uint64_t seq = epn_seq(k, MEP__EP_DR);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + k.timeout_ns;
  epn_settle(k, 0, k.dsig, seq, half, deadline);
  const uint64_t P = k.P, dmsg = k.dmsg;
  const int M = k.rpm[(R - 1) * R + me], K = k.K, S = k.num_scales;
  const size_t xb = (size_t)k.hidden * (size_t)k.es;
  const int64_t lo = (int64_t)me * k.L, hi = lo + k.L;
  for (int j = blockIdx.x * nw + (tid >> 5); j < M; j += gridDim.x * nw) {
    int i;
    const int s = epn_row_source(k.rpm, R, me, j, &i);
    const uint8_t *m = NULL;
    if (ep_active(k.active, s) && ((uint64_t)i + 1) * dmsg <= P)
      m = mep_dev_src(w, s, k.drecv + ((uint64_t)half * R + s) * P +
                                (uint64_t)i * dmsg);
    uint8_t *rx = k.recv_x + (size_t)j * xb;
    uint32_t *rs = (uint32_t *)k.recv_scales + (size_t)j * S;
    if (m && s == me) { /* the rest of the message is the inputs' */
      const size_t t = epn_ld32_cg(m);
      const uint32_t *xs = (const uint32_t *)k.x_scales;
      ep_warp_copy<false>(rx, k.x + t * xb, (int)(xb / 16), lane);
      for (int q = lane; q < S; q += 32)
        rs[q] = xs[t * (size_t)k.sts + (size_t)q * (size_t)k.shs];
      if (lane == 0 && k.recv_src) k.recv_src[j] = (int32_t)t;
      for (int q = lane; q < K; q += 32) {
        const int64_t e = k.topk_idx[t * K + q];
        const bool in = e >= lo && e < hi;
        k.recv_topk[(size_t)j * K + q] = in ? e - lo : -1;
        k.recv_w[(size_t)j * K + q] = in ? k.topk_w[t * K + q] : 0.0f;
      }
    } else if (m) {
      ep_warp_copy<true>(rx, m + 16, (int)(xb / 16), lane);
      for (int q = lane; q < S; q += 32) rs[q] = epn_ld32_cg(m + 16 + xb + 4 * q);
      if (lane == 0 && k.recv_src) k.recv_src[j] = (int32_t)epn_ld32_cg(m);
      for (int q = lane; q < K; q += 32) {
        const int64_t e = (int64_t)epn_ld64_cg(m + k.idx_off + 8 * q);
        const uint32_t wb = epn_ld32_cg(m + k.idx_off + 8 * K + 4 * q);
        const bool in = e >= lo && e < hi;
        k.recv_topk[(size_t)j * K + q] = in ? e - lo : -1;
        k.recv_w[(size_t)j * K + q] = in ? __uint_as_float(wb) : 0.0f;
      }
    } else {
      const ep_v16 z = {{0u, 0u, 0u, 0u}};
      for (size_t v = lane; v < xb / 16; v += 32) ep_st16(rx + 16 * v, z);
      for (int q = lane; q < S; q += 32) rs[q] = 0;
      if (lane == 0 && k.recv_src) k.recv_src[j] = -1;
      for (int q = lane; q < K; q += 32) {
        k.recv_topk[(size_t)j * K + q] = -1;
        k.recv_w[(size_t)j * K + q] = 0.0f;
      }
    }
  }
  if (k.rcpm && k.src_tokens && k.C > 0) {
    const int C = k.C;
    for (int g = blockIdx.x * T + tid; g < R * C; g += gridDim.x * T) {
      const int s = g / C, c = g % C, Ns = k.src_tokens[s];
      const int per = (Ns + C - 1) / C, first = epn_before(k.rpm, R, s, me);
      const int start = min(per * c, Ns);
      int a = 0, b = epn_count(k.rpm, R, s, me);
      if (!ep_active(k.active, s) || (uint64_t)b * dmsg > P) b = 0;
      const uint8_t *area =
          mep_dev_src(w, s, k.drecv + ((uint64_t)half * R + s) * P);
      while (a < b) { /* the first row whose token is >= start */
        const int mid = (a + b) / 2;
        if ((int)epn_ld32_cg(area + (uint64_t)mid * dmsg) < start)
          a = mid + 1;
        else
          b = mid;
      }
      k.rcpm[g] = first + a;
    }
  }
  if (ep_last_block(&k.st->d.done[MEP__EP_DR], gridDim.x))
    epn_finish(k, MEP__EP_DR, -1, seq);
}

}  // namespace
}  // namespace ep
}  // namespace mep

extern "C" int mep__epn_launch_dispatch(const mep__epn_k_t *k, void *stream) {
  size_t smem = ((size_t)k->R + 32) * sizeof(int);
  int rc = ep_launch(mep::ep::dispatch, dim3((unsigned)k->send_blocks),
                     EPN_SEND_THREADS, smem, 0, stream, *k);
  if (rc) return rc;
  return ep_launch(mep::ep::dispatch_recv, dim3((unsigned)k->recv_blocks),
                   EPN_RECV_THREADS, 0, 0, stream, *k);
}
