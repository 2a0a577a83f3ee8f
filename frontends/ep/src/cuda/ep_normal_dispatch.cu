/* ep_normal_dispatch.cu - the normal mode's dispatch: a send kernel that
 * numbers each token's place on every rank it goes to (send_head) and
 * stores its message there, a receive kernel that unpacks the messages
 * into the outputs in source order while the sources still send, its
 * last block agreeing on the ranks lost and clearing their rows.
 *
 * Pipelining: a send block owns a contiguous range of tokens, so its rows
 * for a rank fill a contiguous run of that rank's area. For a mapped
 * destination the block publishes where its run starts as soon as it has
 * counted, and how many rows of it are stored after every few tokens; the
 * receive (launched early, on the SMs the send leaves) follows those words
 * row by row. A source reached through the proxy sends its area in one
 * put at the end, so for it the receive waits for the final signal. */
#include <atomic>

#include "ep_normal_dev.cuh"

namespace mep {
namespace ep {
namespace {

#define EPN_SEND_THREADS 512
#define EPN_RECV_THREADS 256

/* Loads in flight per lane in a send's row copy: its stores cross
 * NVLink, so each round trip should carry as much as registers allow. */
#define EPN_SEND_UNROLL 12

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

/* Tokens each warp stores between two progress words of its block: a
 * word costs a block barrier and the publishing thread's fence; the
 * receive trails the send by about this many tokens per warp. */
#define EPN_PUBLISH 2

/* A rank this send's progress words go to: active and mapped (a proxy
 * peer gets its rows in one put at the end), so they are signalled
 * without win.cuh's MLX5 branches. */
__device__ __forceinline__ bool epn_follows(const mep__epn_k_t &k, int r) {
  return ep_active(k.active, r) && k.win->kind[r] == MEP_DEV_PTR;
}

/* Block b takes a contiguous range of tokens. Its place on rank r is what
 * sources before this rank send r, plus this rank's tokens for r before
 * it (counted by the block: earlier ranges, then a scan per chunk). */
template <bool kMlx5>
__global__ void __launch_bounds__(EPN_SEND_THREADS)
    dispatch(mep__epn_k_t k) {
  extern __shared__ int sm[];
  int *base = sm, *done = sm + k.R, *wsum = sm + 2 * k.R;
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5, nw = T >> 5;
  const mep_dev_win_t *w = k.win;
  ep_early_start(); /* the receive may start on the SMs this leaves */
  const uint64_t seq = epn_seq(k, MEP__EP_DS);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + k.timeout_ns;
  const uint64_t P = k.P, dmsg = k.dmsg;
  const uint64_t to = k.drecv + ((uint64_t)half * R + me) * P;
  /* this rank's progress words in a destination's window */
  const uint64_t prog = epn_slot(k, half, me) + k.prog;
  epn_stage_gate<kMlx5>(k, 0, deadline);
  const int N = k.num_tokens, per = (N + gridDim.x - 1) / gridDim.x;
  const int t0 = min(N, (int)blockIdx.x * per), t1 = min(N, t0 + per);
  for (int r = tid; r < R; r += T) {
    base[r] = epn_before(k.rpm, R, me, r);
    done[r] = 0;
  }
  __syncthreads();
  for (int r = 0; r < R; r++) {
    int c = 0;
    for (int t = tid; t < t0; t += T) c += k.in_rank[(size_t)t * R + r] != 0;
    c = __reduce_add_sync(0xffffffffu, c);
    if (lane == 0 && c) atomicAdd(&base[r], c);
  }
  __syncthreads();
  for (int r = tid; r < R; r += T) {
    if (!epn_follows(k, r)) continue;
    if (blockIdx.x == 0)
      (void)mep_dev_signal_fenced<false>(w, r, prog,
                                         (seq << 32) | gridDim.x, deadline);
    (void)mep_dev_signal_fenced<false>(
        w, r, prog + 8 + 16 * (uint64_t)blockIdx.x,
        (seq << 32) | (uint32_t)(base[r] - epn_before(k.rpm, R, me, r)),
        deadline);
  }
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
    for (int q0 = 0; q0 < n; q0 += EPN_PUBLISH * nw) {
      const int q1 = min(n, q0 + EPN_PUBLISH * nw);
      for (int i = q0 + warp; i < q1; i += nw) {
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
      /* the rows of these tokens are stored: say so to each rank. The
       * barrier orders every warp's stores before the publishing
       * thread's fence, which makes them visible before its word. */
      for (int r = tid; r < R; r += T)
        for (int i = q0; i < q1; i++)
          done[r] += k.send_head[(size_t)(c0 + i) * R + r] >= 0;
      __syncthreads();
      for (int r = tid; r < R; r += T)
        if (epn_follows(k, r))
          (void)mep_dev_signal<false>(
              w, r, prog + 16 + 16 * (uint64_t)blockIdx.x,
              (seq << 32) | (uint32_t)done[r], deadline);
    }
  }
  __threadfence_system();
  if (!ep_last_block(&k.st->d.done[MEP__EP_DS], gridDim.x)) return;
  for (int r = tid; r < R; r += T) {
    if (!ep_active(k.active, r)) continue;
    epn_deliver<kMlx5>(k, r, to, k.dstage + (uint64_t)r * P,
                (uint64_t)epn_count(k.rpm, R, me, r), dmsg,
                k.dsig + ((uint64_t)half * R + me) * 8, seq, deadline);
  }
  epn_finish(k, MEP__EP_DS, 0, seq);
}

/* Where a warp of the receive stands in one source's progress words (its
 * lane 0's; rows come in increasing order). */
struct epn_cursor {
  int s;          /* the source the rest is about; -1: none yet */
  int b, B;       /* the send block of the last row, the source's blocks */
  uint32_t start; /* that block's first row, */
  uint32_t end;   /* the row after its last, */
  uint32_t done;  /* and its rows known stored */
};

/* Lane 0: waits until row i of source s's cnt rows is in this rank's
 * area. 0 if s is dropped meanwhile (a wait reached the deadline, or
 * another waiter gave up on s). */
__device__ __forceinline__ int epn_row_ready(const mep__epn_k_t &k,
                                          epn_cursor &c, int s, uint32_t i,
                                          uint32_t cnt, uint64_t seq,
                                          int half, uint64_t deadline) {
  const mep_dev_win_t *w = k.win;
  uint64_t v;
  if (w->kind[s] != MEP_DEV_PTR) { /* the proxy's one put, then its signal */
    if (c.s == s) return 1;
    if (!ep_wait_word((const uint64_t *)mep_dev_src(
                          w, s, k.dsig + ((uint64_t)half * k.R + s) * 8),
                      seq, k.active, s, deadline, &v))
      return 0;
    c.s = s;
    return 1;
  }
  const uint64_t *pw =
      (const uint64_t *)mep_dev_src(w, s, epn_slot(k, half, s) + k.prog);
  if (c.s != s) {
    if (!ep_wait_word(pw, seq, k.active, s, deadline, &v)) return 0;
    c.s = s;
    c.B = (int)(uint32_t)v;
    c.b = -1;
    c.end = 0;
  }
  while (i >= c.end) { /* the last block ends at cnt > i */
    c.b++;
    c.start = c.end;
    c.done = 0;
    if (c.b + 1 < c.B) {
      if (!ep_wait_word(pw + 1 + 2 * (c.b + 1), seq, k.active, s, deadline,
                        &v))
        return 0;
      c.end = (uint32_t)v;
    } else {
      c.end = cnt;
    }
  }
  const uint32_t need = i - c.start + 1;
  if (c.done < need) {
    if (!ep_wait_count(pw + 2 + 2 * c.b, seq, need, k.active, s, deadline,
                       &v))
      return 0;
    c.done = (v >> 32) > seq ? c.end - c.start : (uint32_t)v;
  }
  return 1;
}

/* Row j as a source that sent nothing for it (lost): zeros, no expert. */
__device__ __forceinline__ void zero_row(const mep__epn_k_t &k, int j,
                                         int lane) {
  const size_t xb = (size_t)k.hidden * (size_t)k.es;
  const int K = k.K, S = k.num_scales;
  uint8_t *rx = k.recv_x + (size_t)j * xb;
  uint32_t *rs = (uint32_t *)k.recv_scales + (size_t)j * S;
  const ep_v16 z = {{0u, 0u, 0u, 0u}};
  for (size_t v = lane; v < xb / 16; v += 32) ep_st16(rx + 16 * v, z);
  for (int q = lane; q < S; q += 32) rs[q] = 0;
  if (lane == 0 && k.recv_src) k.recv_src[j] = -1;
  for (int q = lane; q < K; q += 32) {
    k.recv_topk[(size_t)j * K + q] = -1;
    k.recv_w[(size_t)j * K + q] = 0.0f;
  }
}

/* The receive's last block, once every row is copied: every source's
 * final signal and the agreement round (epn_agree); zeros for the rows of
 * the sources lost during the call (the receive may have copied some rows
 * of a source that a wait gave up on or the agreement drops); then, for a
 * non-cached call, where each source's channels start (DeepEP's
 * recv_channel_prefix_matrix: the first row of the source whose token is
 * in the channel's range); the call's end. */
template <bool kMlx5>
__device__ __noinline__ void dispatch_settle(const mep__epn_k_t &k,
                                             uint64_t seq, int half,
                                             uint64_t deadline) {
  __shared__ unsigned int dropped[MEP__EPN_MAX_RANKS / 32];
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const int lane = tid & 31, nw = T >> 5;
  const mep_dev_win_t *w = k.win;
  const uint64_t P = k.P, dmsg = k.dmsg;
  epn_agree_dropped<kMlx5>(k, MEP__EPN_AGREE_DISPATCH, k.dsig, k.st->lost, dropped,
                    seq, half, deadline);
  for (int s = 0; s < R; s++) {
    if (!(dropped[s / 32] >> (s % 32) & 1)) continue;
    const int e = k.rpm[s * R + me];
    for (int j = epn_before(k.rpm, R, s, me) + (tid >> 5); j < e; j += nw)
      zero_row(k, j, lane);
  }
  if (k.rcpm && k.src_tokens && k.C > 0) {
    const int C = k.C;
    for (int g = tid; g < R * C; g += T) {
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
  epn_finish(k, MEP__EP_DR, -1, seq);
}

/* A warp per received row, rows in source order, each as soon as its
 * source has stored it. Launched while the send runs; its last block
 * settles the call. */
template <bool kMlx5>
__global__ void __launch_bounds__(EPN_RECV_THREADS)
    dispatch_recv(mep__epn_k_t k) {
  const int R = k.R, me = k.rank, T = blockDim.x, tid = threadIdx.x;
  const int lane = tid & 31, nw = T >> 5;
  const mep_dev_win_t *w = k.win;
  const uint64_t seq = epn_seq(k, MEP__EP_DR);
  const int half = (int)(seq & 1);
  const uint64_t deadline = mep_dev_now_ns() + k.timeout_ns;
  const uint64_t P = k.P, dmsg = k.dmsg;
  const int M = k.rpm[(R - 1) * R + me], K = k.K, S = k.num_scales;
  const size_t xb = (size_t)k.hidden * (size_t)k.es;
  const int64_t lo = (int64_t)me * k.L, hi = lo + k.L;
  epn_cursor cur = {-1, 0, 0, 0, 0, 0};
  for (int j = blockIdx.x * nw + (tid >> 5); j < M; j += gridDim.x * nw) {
    int i;
    const int s = epn_row_source(k.rpm, R, me, j, &i);
    int ok = 0;
    if (lane == 0 && ep_active(k.active, s) && ((uint64_t)i + 1) * dmsg <= P)
      ok = epn_row_ready(k, cur, s, (uint32_t)i,
                         (uint32_t)epn_count(k.rpm, R, s, me), seq, half,
                         deadline)
               ? 1
               : -1; /* lost during the call: its rows become zeros */
    ok = __shfl_sync(0xffffffffu, ok, 0);
    if (ok <= 0) { /* 0: inactive from the start */
      if (ok < 0 && lane == 0)
        atomicOr(&k.st->lost[s / 32], 1u << (s % 32));
      zero_row(k, j, lane);
      continue;
    }
    const uint8_t *m = mep_dev_src(
        w, s, k.drecv + ((uint64_t)half * R + s) * P + (uint64_t)i * dmsg);
    uint8_t *rx = k.recv_x + (size_t)j * xb;
    uint32_t *rs = (uint32_t *)k.recv_scales + (size_t)j * S;
    if (s == me) { /* the rest of the message is the inputs' */
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
    } else {
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
    }
  }
  if (ep_last_block(&k.st->d.done[MEP__EP_DR], gridDim.x))
    dispatch_settle<kMlx5>(k, seq, half, deadline);
  ep_after_send(); /* the stream sees the send end before this kernel */
}

}  // namespace
}  // namespace ep
}  // namespace mep

extern "C" int mep__epn_launch_dispatch(const mep__epn_k_t *k, void *stream) {
  size_t smem = (2 * (size_t)k->R + 32) * sizeof(int);
  int rc = ep_launch(EP_KERNEL(mep::ep::dispatch, k->has_mlx5),
                     dim3((unsigned)k->send_blocks), EPN_SEND_THREADS, smem,
                     0, stream, *k);
  if (rc) return rc;
  auto recv = EP_KERNEL(mep::ep::dispatch_recv, k->has_mlx5);
  static std::atomic<int> per_sm_of[2];
  std::atomic<int> &cached = per_sm_of[k->has_mlx5 != 0];
  int per_sm = cached.load(std::memory_order_relaxed);
  if (!per_sm) {
    per_sm = ep_blocks_per_sm(recv, EPN_RECV_THREADS);
    cached.store(per_sm = per_sm > 0 ? per_sm : 1, std::memory_order_relaxed);
  }
  long long rows = ((long long)k->recv_rows + EPN_RECV_THREADS / 32 - 1) /
                   (EPN_RECV_THREADS / 32);
  long long grid = (long long)k->recv_blocks * per_sm;
  if (grid > rows) grid = rows;
  return ep_launch(recv, dim3(grid > 0 ? (unsigned)grid : 1u), EPN_RECV_THREADS, 0,
                   1, stream, *k);
}
