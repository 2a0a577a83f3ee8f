/* ep_normal_combine.cu - the normal mode's combine: a send kernel that
 * stores each received row (and its top-k weights) back at its place in
 * the source's receive area, and a receive kernel, running beside it,
 * that sums each token's rows in rank order, after the bias, in float,
 * rounding to bf16 once (the CPU path's order, so both give the same
 * bits).
 *
 * The send goes through its rows in MEP__EPN_CPHASES phases: phase g
 * holds, for every destination, the g-th of as many equal runs of the
 * rows it gets (so every link is busy at once, and every destination
 * gets its rows in its own token order). When the last block finishes a
 * phase it raises that phase's word in each mapped destination's window;
 * a token's receive waits for the phase of each of its rows. A proxy
 * destination gets its rows in one put and the final signal. A source
 * lost during the call may have been summed into some tokens: the
 * receive's last block then sums every token again over the ranks the
 * agreement kept. */
#include <cuda_bf16.h>

#include <atomic>

#include "ep_normal_dev.cuh"

namespace mep {
namespace ep {
namespace {

#define EPN_CSEND_THREADS 512
/* 16-byte loads a lane of the send keeps in flight per row */
#define EPN_CSEND_UNROLL 16
#define EPN_CRECV_THREADS_MAX 512

/* Rows in phase g of the c a destination gets: [lo, hi). */
__device__ __forceinline__ int phase_lo(int g, int c) {
  return (int)((long long)g * c / MEP__EPN_CPHASES);
}
/* The phase of row i of c (the last g with phase_lo(g, c) <= i). */
__device__ __forceinline__ int phase_of(int i, int c) {
  return (int)(((long long)(i + 1) * MEP__EPN_CPHASES - 1) / c);
}

/* Destination d of this rank's sends: the sources from the next rank on. */
__device__ __forceinline__ int dest(int me, int d, int R) {
  return (me + 1 + d) % R;
}

template <bool kMlx5>
__global__ void __launch_bounds__(EPN_CSEND_THREADS)
    combine(mep__epn_k_t k) {
  extern __shared__ int off[]; /* [phase][d]: its rows of d' < d */
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const int lane = tid & 31, nw = T >> 5, D = R - 1, G = MEP__EPN_CPHASES;
  const mep_dev_win_t *w = k.win;
  ep_early_start(); /* the receive may start on the SMs this leaves */
  const uint64_t seq = epn_seq(k, MEP__EP_CS);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + k.timeout_ns;
  const uint64_t P = k.P, cmsg = k.cmsg;
  const uint64_t to = k.crecv + ((uint64_t)half * R + me) * P;
  /* this rank's phase words in a destination's window */
  const uint64_t words = epn_slot(k, half, me) + k.cprog;
  epn_stage_gate<kMlx5>(k, 1, deadline);
  for (int d = tid; d < D; d += T) {
    const int c = epn_count(k.rpm, R, dest(me, d, R), me);
    for (int g = 0; g < G; g++)
      off[g * R + d + 1] = phase_lo(g + 1, c) - phase_lo(g, c);
  }
  if (tid < G) off[tid * R] = 0;
  __syncthreads();
  if (tid < G)
    for (int d = 1; d <= D; d++) off[tid * R + d] += off[tid * R + d - 1];
  __syncthreads();
  const size_t rb = 2 * (size_t)k.hidden;
  const int K = k.K, W = gridDim.x * nw;
  for (int g = 0; g < G; g++) {
    const int *o = off + g * R;
    for (int f = blockIdx.x * nw + (tid >> 5); f < o[D]; f += W) {
      int lo = 0, hi = D - 1; /* the d with o[d] <= f < o[d + 1] */
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (o[mid] <= f)
          lo = mid;
        else
          hi = mid - 1;
      }
      const int s = dest(me, lo, R);
      const int i = phase_lo(g, epn_count(k.rpm, R, s, me)) + f - o[lo];
      if (!ep_active(k.active, s) || ((uint64_t)i + 1) * cmsg > P) continue;
      const int j = epn_before(k.rpm, R, s, me) + i;
      uint8_t *m = mep_dev_dst(w, s, to + (uint64_t)i * cmsg,
                               k.cstage + (uint64_t)j * cmsg);
      ep_warp_copy<false, EPN_CSEND_UNROLL>(
          m, (const uint8_t *)k.cx + (size_t)j * rb, (int)(rb / 16), lane);
      for (int q = lane; q < K; q += 32)
        ((float *)(m + rb))[q] = k.cw[(size_t)j * K + q];
    }
    if (ep_last_block(&k.st->cphase[g], gridDim.x)) /* resets it */
      for (int s = tid; s < R; s += T)
        if (s != me && ep_active(k.active, s) && w->kind[s] == MEP_DEV_PTR)
          (void)mep_dev_signal<false>(w, s, words + 8 * (uint64_t)g,
                                      (seq << 32) | 1u, deadline);
  }
  __threadfence_system();
  if (!ep_last_block(&k.st->d.done[MEP__EP_CS], gridDim.x)) return;
  for (int s = tid; s < R; s += T) {
    if (!ep_active(k.active, s)) continue;
    epn_deliver<kMlx5>(k, s, to,
                k.cstage + (uint64_t)epn_before(k.rpm, R, s, me) * cmsg,
                s == me ? 0 : (uint64_t)epn_count(k.rpm, R, s, me), cmsg,
                k.csig + ((uint64_t)half * R + me) * 8, seq, deadline);
  }
  epn_finish(k, MEP__EP_CS, 1, seq);
}

/* Where token t's row from rank r is in this rank's window (its own rows
 * are rows of x), or NULL: r sent none, or is not active. With `wait`,
 * first waits for the phase that holds it (a mapped r) or for r's final
 * signal (a proxy); a wait that gives up records r in clost. */
__device__ __forceinline__ const uint8_t *token_row(const mep__epn_k_t &k,
                                                    int t, int r, int wait,
                                                    uint64_t seq, int half,
                                                    uint64_t deadline) {
  const int R = k.R, me = k.rank;
  const int h = k.send_head_in[(size_t)t * R + r];
  if (h < 0) return NULL;
  if (r == me) return (const uint8_t *)k.cx + (size_t)h * 2 * k.hidden;
  const int c = epn_count(k.rpm, R, me, r), i = h - epn_before(k.rpm, R, me, r);
  if (!ep_active(k.active, r) || ((uint64_t)i + 1) * k.cmsg > k.P) return NULL;
  const mep_dev_win_t *w = k.win;
  uint64_t v;
  const uint64_t at =
      w->kind[r] == MEP_DEV_PTR
          ? epn_slot(k, half, r) + k.cprog + 8 * (uint64_t)phase_of(i, c)
          : k.csig + ((uint64_t)half * R + r) * 8;
  if (wait && !ep_wait_word((const uint64_t *)mep_dev_src(w, r, at), seq,
                            k.active, r, deadline, &v)) {
    atomicOr(&k.st->clost[r / 32], 1u << (r % 32));
    return NULL;
  }
  return mep_dev_src(w, r, k.crecv + ((uint64_t)half * R + r) * k.P +
                               (uint64_t)i * k.cmsg);
}

/* The threads of a block: token t's sum of the rows at rows[0..R) (NULL:
 * none), and of their weights. */
__device__ __forceinline__ void sum_token(const mep__epn_k_t &k, int t,
                                          const uint8_t *const *rows) {
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const int H = k.hidden, K = k.K, nv = H / 8;
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
}

/* The receive's last block, once every token is summed: every source's
 * final signal and the agreement round (epn_agree); if it dropped a
 * source some token may have summed (lost during the call), every token
 * again over the ranks kept; the call's end. */
template <bool kMlx5>
__device__ __noinline__ void combine_settle(const mep__epn_k_t &k,
                                            uint64_t seq, int half,
                                            uint64_t deadline) {
  __shared__ unsigned int dropped[MEP__EPN_MAX_RANKS / 32];
  extern __shared__ const uint8_t *rows[];
  const int R = k.R, T = blockDim.x, tid = threadIdx.x;
  epn_agree_dropped<kMlx5>(k, MEP__EPN_AGREE_COMBINE, k.csig, k.st->clost, dropped,
                    seq, half, deadline);
  int again = 0; /* the same in every thread */
  for (int i = 0; i < (R + 31) / 32; i++) again |= dropped[i] != 0;
  for (int t = 0; again && t < k.num_tokens; t++) {
    for (int r = tid; r < R; r += T)
      rows[r] = token_row(k, t, r, 0, seq, half, deadline);
    __syncthreads();
    sum_token(k, t, rows);
    __syncthreads();
  }
  epn_finish(k, MEP__EP_CR, -1, seq);
}

/* A block per token, tokens in order, each as soon as its rows are in.
 * Launched while the send runs; its last block settles the call. */
template <bool kMlx5>
__global__ void __launch_bounds__(EPN_CRECV_THREADS_MAX)
    combine_recv(mep__epn_k_t k) {
  extern __shared__ const uint8_t *rows[];
  const int R = k.R, T = blockDim.x, tid = threadIdx.x;
  const uint64_t seq = epn_seq(k, MEP__EP_CR);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + k.timeout_ns;
  for (int t = blockIdx.x; t < k.num_tokens; t += gridDim.x) {
    for (int r = tid; r < R; r += T)
      rows[r] = token_row(k, t, r, 1, seq, half, deadline);
    __syncthreads();
    sum_token(k, t, rows);
    __syncthreads();
  }
  if (ep_last_block(&k.st->d.done[MEP__EP_CR], gridDim.x))
    combine_settle<kMlx5>(k, seq, half, deadline);
  ep_after_send(); /* the stream sees the send end before this kernel */
}

}  // namespace
}  // namespace ep
}  // namespace mep

extern "C" int mep__epn_launch_combine(const mep__epn_k_t *k, void *stream) {
  int rc = ep_launch(EP_KERNEL(mep::ep::combine, k->has_mlx5),
                     dim3((unsigned)k->send_blocks),
                     EPN_CSEND_THREADS,
                     (size_t)MEP__EPN_CPHASES * k->R * sizeof(int), 0, stream,
                     *k);
  if (rc) return rc;
  /* every block resident from the start (one that waited for an SM would
   * start only as the first ones end, after the send), so as many as fit
   * on the SMs given; blocks per SM by threads (a warp's multiple up to
   * the bound), looked up once per size */
  static std::atomic<int> per_sm[2][EPN_CRECV_THREADS_MAX / 32 + 1];
  auto recv = EP_KERNEL(mep::ep::combine_recv, k->has_mlx5);
  std::atomic<int> &cached = per_sm[k->has_mlx5 != 0][k->recv_threads / 32];
  int n = cached.load(std::memory_order_relaxed);
  if (!n) {
    n = ep_blocks_per_sm(recv, k->recv_threads);
    cached.store(n = n > 0 ? n : 1, std::memory_order_relaxed);
  }
  long long grid = (long long)k->recv_blocks * n;
  if (grid > k->num_tokens) grid = k->num_tokens;
  return ep_launch(recv, dim3(grid > 0 ? (unsigned)grid : 1u), k->recv_threads,
                   (size_t)k->R * sizeof(void *), 1, stream, *k);
}
