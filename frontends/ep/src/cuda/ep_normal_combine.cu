/* ep_normal_combine.cu - the normal mode's combine: a send kernel that
 * stores each received row (and its top-k weights) back at its place in
 * the source's receive area, and a receive kernel that sums each token's
 * rows in rank order, after the bias, in float, rounding to bf16 once (the
 * CPU path's order, so both give the same bits). */
#include <cuda_bf16.h>

#include "ep_normal_dev.cuh"

namespace mep {
namespace ep {
namespace {

#define EPN_CSEND_THREADS 256
#define EPN_CRECV_THREADS_MAX 512

__global__ void __launch_bounds__(EPN_CSEND_THREADS)
    combine(mep__epn_k_t k) {
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const int lane = tid & 31, nw = T >> 5;
  const mep_dev_win_t *w = k.win;
  const uint64_t seq = epn_seq(k, MEP__EP_CS);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + k.timeout_ns;
  const uint64_t P = k.P, cmsg = k.cmsg;
  const uint64_t to = k.crecv + ((uint64_t)half * R + me) * P;
  epn_stage_gate(k, 1, deadline);
  __syncthreads();
  /* the rows this rank keeps (its own tokens') are not sent: its
   * receive reads them from x. The others go in the order of their
   * sources from this rank on (me + 1, ..., me - 1): at any moment the
   * grid writes to one source, and with every rank starting at source 0
   * all would queue on the same links (on 4 H100s combine took 983 us
   * instead of 752). */
  const int M = k.rpm[(R - 1) * R + me], K = k.K;
  const int a = epn_before(k.rpm, R, me, me), c = epn_count(k.rpm, R, me, me);
  const int after = M - a - c; /* rows of the sources after this rank */
  const size_t rb = 2 * (size_t)k.hidden;
  for (int jj = blockIdx.x * nw + (tid >> 5); jj < M - c;
       jj += gridDim.x * nw) {
    const int j = jj < after ? a + c + jj : jj - after;
    int i;
    const int s = epn_row_source(k.rpm, R, me, j, &i);
    if (!ep_active(k.active, s) || ((uint64_t)i + 1) * cmsg > P) continue;
    uint8_t *m = mep_dev_dst(w, s, to + (uint64_t)i * cmsg,
                             k.cstage + (uint64_t)j * cmsg);
    ep_warp_copy<false, 16>(m, (const uint8_t *)k.cx + (size_t)j * rb,
                            (int)(rb / 16), lane);
    for (int q = lane; q < K; q += 32)
      ((float *)(m + rb))[q] = k.cw[(size_t)j * K + q];
  }
  __threadfence_system();
  if (!ep_last_block(&k.st->d.done[MEP__EP_CS], gridDim.x)) return;
  for (int s = tid; s < R; s += T) {
    if (!ep_active(k.active, s)) continue;
    epn_deliver(k, s, to,
                k.cstage + (uint64_t)epn_before(k.rpm, R, s, me) * cmsg,
                s == me ? 0 : (uint64_t)epn_count(k.rpm, R, s, me), cmsg,
                k.csig + ((uint64_t)half * R + me) * 8, seq, deadline);
  }
  epn_finish(k, MEP__EP_CS, 1, seq);
}

/* A block per token: its rows' places from send_head (rank r keeps this
 * rank's rows after those of the sources before it; this rank's own are
 * rows of x, their weights rows of topk_weights). */
__global__ void __launch_bounds__(EPN_CRECV_THREADS_MAX)
    combine_recv(mep__epn_k_t k) {
  extern __shared__ const uint8_t *rows[];
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const mep_dev_win_t *w = k.win;
  const uint64_t seq = epn_seq(k, MEP__EP_CR);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + k.timeout_ns;
  epn_settle(k, 1, k.csig, seq, half, deadline);
  const uint64_t P = k.P, cmsg = k.cmsg;
  const int H = k.hidden, K = k.K, nv = H / 8;
  for (int t = blockIdx.x; t < k.num_tokens; t += gridDim.x) {
    for (int r = tid; r < R; r += T) {
      const int h = k.send_head_in[(size_t)t * R + r];
      const uint64_t slot = (uint64_t)(h - epn_before(k.rpm, R, me, r));
      const uint8_t *p = NULL;
      if (h >= 0 && r == me)
        p = (const uint8_t *)k.cx + (size_t)h * 2 * H;
      else if (h >= 0 && ep_active(k.active, r) && (slot + 1) * cmsg <= P)
        p = mep_dev_src(w, r,
                        k.crecv + ((uint64_t)half * R + r) * P + slot * cmsg);
      rows[r] = p;
    }
    __syncthreads();
    for (int q = tid; q < nv; q += T) {
      float acc[8];
      ep_v16 b0 = {{0u, 0u, 0u, 0u}}, b1 = b0;
      if (k.bias0) b0 = ep_ld16_nc(k.bias0 + (size_t)t * H + 8 * q);
      if (k.bias1) b1 = ep_ld16_nc(k.bias1 + (size_t)t * H + 8 * q);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        acc[2 * i] = ep_bf16_lo(b0.w[i]) + ep_bf16_lo(b1.w[i]);
        acc[2 * i + 1] = ep_bf16_hi(b0.w[i]) + ep_bf16_hi(b1.w[i]);
      }
      for (int r = 0; r < R; r++) {
        if (!rows[r]) continue;
        const ep_v16 v = ep_ld16_cg(rows[r] + 16 * (size_t)q);
#pragma unroll
        for (int i = 0; i < 4; i++) {
          acc[2 * i] = __fadd_rn(acc[2 * i], ep_bf16_lo(v.w[i]));
          acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], ep_bf16_hi(v.w[i]));
        }
      }
      ep_v16 o;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        __nv_bfloat162 p = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
        o.w[i] = *reinterpret_cast<uint32_t *>(&p);
      }
      ep_st16(k.out + (size_t)t * H + 8 * q, o);
    }
    for (int q = tid; q < K; q += T) {
      float sum = 0.0f;
      for (int r = 0; r < R; r++) {
        if (!rows[r]) continue;
        const float *wr =
            r == me ? k.cw + (size_t)k.send_head_in[(size_t)t * R + me] * K
                    : (const float *)(rows[r] + 2 * (size_t)H);
        sum += __uint_as_float(epn_ld32_cg(wr + q));
      }
      k.out_w[(size_t)t * K + q] = sum;
    }
    __syncthreads();
  }
  if (ep_last_block(&k.st->d.done[MEP__EP_CR], gridDim.x))
    epn_finish(k, MEP__EP_CR, -1, seq);
}

}  // namespace
}  // namespace ep
}  // namespace mep

extern "C" int mep__epn_launch_combine(const mep__epn_k_t *k, void *stream) {
  int rc = ep_launch(mep::ep::combine, dim3((unsigned)k->send_blocks),
                     EPN_CSEND_THREADS, 0, 0, stream, *k);
  if (rc) return rc;
  return ep_launch(mep::ep::combine_recv, dim3((unsigned)k->recv_blocks),
                   k->recv_threads, (size_t)k->R * sizeof(void *), 0, stream,
                   *k);
}
