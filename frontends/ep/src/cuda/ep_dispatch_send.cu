/* ep_dispatch_send.cu - the dispatch kernel's send phase (CUDA path).
 *
 * A block per token at a time: all threads move the row once to every
 * destination rank (not once per expert: with few ranks a token names
 * several experts of each, and NVLink bytes are the cost): bf16 as is,
 * or FP8 codes and one float scale per 128 channels (a group is 8
 * consecutive threads of a warp, 16 channels each; the scales go after
 * the codes, 16 bytes a store). Meanwhile the first warp's lanes take a
 * slot per top-k expert (an atomic counter per expert and half) and
 * write the token's index into that slot of the destination's dispatch
 * index. Rows and index words go straight into a mapped peer's
 * window, or into this rank's host-part stages followed by proxy puts.
 * The block that finishes last sends every expert of every active rank
 * its count word (seq << 32 | tokens), also "0 tokens": a peer reached
 * through the host part gets its words in one put and a signal. The
 * receive is in ep_dispatch_recv.cu. */
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "ep_dev.cuh"

namespace mep::ep {
namespace {


/* The group's scales as DeepEP computes them (and ep_fp8.c, the CPU
 * path's and the tests' reference): amax floored at 1e-4; inv = amax *
 * (1/448) and scale = 448 / amax, or with round_scale the powers of two
 * 2^e and 2^-e, e = ceil(log2(amax * (1/448))) from the float's bits.
 * Values are coded e4m3(x * scale); inv travels. IEEE division (no fast
 * math), as on the host. */
__device__ __forceinline__ void fp8_scales(float amax, int round_scale,
                                           float *scale, float *inv) {
  const float inv448 = 1.0f / 448.0f;
  amax = fmaxf(amax, 1e-4f);
  if (!round_scale) {
    *inv = __fmul_rn(amax, inv448);
    *scale = __fdiv_rn(448.0f, amax);
    return;
  }
  uint32_t b = __float_as_uint(__fmul_rn(amax, inv448));
  int e = (int)((b >> 23) & 0xffu) - 127 + ((b & 0x7fffffu) != 0);
  *scale = __uint_as_float((uint32_t)(127 - e) << 23);
  *inv = __uint_as_float((uint32_t)(127 + e) << 23);
}

/* Two values to two e4m3 codes (round to nearest even, saturating to
 * +-448), the first in the low byte. */
__device__ __forceinline__ uint32_t fp8x2(float a, float b) {
  __nv_fp8x2_storage_t r =
      __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  return (uint32_t)r;
}

/* One token's row into the messages of its destinations (ptr[j] != NULL):
 * data after the 16-byte header. */
__device__ __forceinline__ void send_bf16(const uint8_t *row, int hidden,
                                          uint8_t *const *ptr, int topk) {
  int nv = hidden / 8;
  for (int v = threadIdx.x; v < nv; v += blockDim.x) {
    ep_v16 d = ep_ld16_nc(row + (size_t)v * 16);
    for (int j = 0; j < topk; j++)
      if (ptr[j]) ep_st16(ptr[j] + MEP_EP_MSG_HEADER + (size_t)v * 16, d);
  }
}

__device__ __forceinline__ void send_fp8(const uint8_t *row, int hidden,
                                         int round_scale,
                                         uint8_t *const *ptr, int topk,
                                         float *s_scale) {
  int nu = hidden / 16; /* units of 16 channels; 8 make a group */
  for (int base = 0; base < nu; base += blockDim.x) {
    int u = base + (int)threadIdx.x;
    bool ok = u < nu;
    float f[16];
    float amax = 0.0f;
    if (ok) {
      ep_v16 a = ep_ld16_nc(row + (size_t)u * 32);
      ep_v16 b = ep_ld16_nc(row + (size_t)u * 32 + 16);
      for (int i = 0; i < 4; i++) {
        f[2 * i] = ep_bf16_lo(a.w[i]);
        f[2 * i + 1] = ep_bf16_hi(a.w[i]);
        f[8 + 2 * i] = ep_bf16_lo(b.w[i]);
        f[8 + 2 * i + 1] = ep_bf16_hi(b.w[i]);
      }
      for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(f[i]));
    }
    /* nu is a multiple of 8 and blockDim of 32: the 8 threads of a group
     * sit in one warp and are all ok or all not; every lane shuffles */
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
    if (!ok) continue;
    float scale, s;
    fp8_scales(amax, round_scale, &scale, &s);
    ep_v16 q;
    for (int i = 0; i < 4; i++) {
      uint32_t lo = fp8x2(__fmul_rn(f[4 * i], scale),
                          __fmul_rn(f[4 * i + 1], scale));
      uint32_t hi = fp8x2(__fmul_rn(f[4 * i + 2], scale),
                          __fmul_rn(f[4 * i + 3], scale));
      q.w[i] = lo | (hi << 16);
    }
    for (int j = 0; j < topk; j++)
      if (ptr[j]) ep_st16(ptr[j] + MEP_EP_MSG_HEADER + (size_t)u * 16, q);
    if ((u & 7) == 0) s_scale[u / 8] = s;
  }
}

/* The row's scales (s_scale, shared, filled by send_fp8; the caller
 * synchronised the block) to its destinations, 16 bytes a store where
 * they fill a vector. Stored one by one, from the lane that had each,
 * they were 4-byte writes over NVLink, one for every 128 channels. */
__device__ __forceinline__ void send_scales(const float *s_scale, int hidden,
                                            uint8_t *const *ptr, int topk) {
  const int G = hidden / 128, nv = (G + 3) / 4;
  for (int i = threadIdx.x; i < nv; i += blockDim.x)
    for (int j = 0; j < topk; j++) {
      if (!ptr[j]) continue;
      float *o = (float *)(ptr[j] + MEP_EP_MSG_HEADER + hidden) + 4 * i;
      if (4 * i + 4 <= G) {
        *(float4 *)o = *(const float4 *)(s_scale + 4 * i);
        continue;
      }
      for (int g = 4 * i; g < G; g++) o[g - 4 * i] = s_scale[g];
    }
}

/* Dynamic shared memory of the send: the live ranks, then (FP8) a row's
 * scales. */
__host__ __device__ __forceinline__ size_t send_smem(int ranks, int hidden,
                                                    int fp8) {
  return mep__ep_round16((uint64_t)ranks) +
         (fp8 ? mep__ep_round16((uint64_t)hidden / 128 * 4) : 0);
}

/* Expert e's count word: its tokens (at most T) under seq. */
__device__ __forceinline__ uint64_t count_word(const int *cnt, int e, int T,
                                               uint64_t seq) {
  int n = __ldcg(cnt + e);
  return mep__ep_word(seq, (uint32_t)(n > T ? T : n));
}

/* Named as the receive's kernel (ep_dev.cuh: kernel names). */
template <bool kMlx5>
__global__ void __launch_bounds__(1024) dispatch(mep__ep_kdisp_t k) {
  ep_early_start();
  const mep__ep_kcommon_t &c = k.c;
  const auto [L, w, seq, half, deadline] = ep_start(c, MEP__EP_DS);
  const int E = L->experts, nl = L->local, H = L->hidden, T = L->tokens;
  const int topk = k.num_topk;
  int *cnt = k.slots + (size_t)half * E;
  const uint64_t len = k.fp8 ? MEP_EP_MSG_HEADER + (uint64_t)H + H / 32
                             : MEP_EP_MSG_HEADER + 2 * (uint64_t)H;

  /* the other half's counters: its last call ended before this one began
   * on the stream, its next begins after this one ends */
  if (blockIdx.x == 0)
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      k.slots[(size_t)(1 - half) * E + e] = 0;
  ep_trace(c, MEP__EP_DS, MEP__EP_T_START);

  /* The loads a token's sends wait for are issued here, together, rather
   * than one after another: the first token's experts and row (into L2),
   * and which ranks take part (s_live, dynamic shared memory of `ranks`
   * bytes, then the row's scales), which also brings the window's kind and
   * peer words of every rank into L1 for mep_dev_dst. */
  extern __shared__ __align__(16) uint8_t s_live[];
  float *s_scale = (float *)(s_live + mep__ep_round16(L->ranks));
  const int tid = threadIdx.x;
  int64_t next_e = -1;
  if (tid < topk && (int)blockIdx.x < k.num_tokens)
    next_e = k.topk_idx[(size_t)blockIdx.x * topk + tid];
  ep_prefetch_row(k.x, blockIdx.x, k.num_tokens, 2 * H);
  for (int r = tid; r < L->ranks; r += blockDim.x) {
    const void *peer = w->peer[r]; /* loaded with ep_live's words */
    s_live[r] = ep_live(c, r) && (w->kind[r] != MEP_DEV_PTR || peer);
  }
  __shared__ uint8_t *s_ptr[MEP_EP_STAGE_TOPK];
  __shared__ int s_any_proxy;
  if (tid == 0) {
    s_any_proxy = 0;
    ep_stage_gate<kMlx5>(c, 0, deadline);
  }
  __syncthreads();
  for (int t = blockIdx.x; t < k.num_tokens; t += gridDim.x) {
    ep_prefetch_row(k.x, t + gridDim.x, k.num_tokens, 2 * H);
    /* Warp 0, lane j < topk: expert j. The row goes once to each rank,
     * from the first of the token's experts there, and its stores go out
     * before the expert's slot is known: the row's place depends on the
     * token only, and the slot's atomic (a round trip to L2) is waited
     * for only by the index word, written after the row. */
    int dst = -1, el = 0, slot = T;
    if (tid < 32) {
      int64_t e = next_e;
      if (tid < topk && t + (int)gridDim.x < k.num_tokens)
        next_e = k.topk_idx[(size_t)(t + gridDim.x) * topk + tid];
      if (tid < topk && e >= 0 && e < E && s_live[e / nl]) {
        dst = (int)(e / nl);
        el = (int)(e % nl);
        slot = atomicAdd(cnt + e, 1);
      }
      const unsigned same = __match_any_sync(0xffffffffu, dst);
      const bool first = dst >= 0 && (same & ((1u << tid) - 1)) == 0;
      if (tid < topk)
        s_ptr[tid] =
            first ? mep_dev_dst(w, dst, mep__ep_disp_token(L, half, c.rank, t),
                                mep__ep_disp_stage(L, t, tid))
                  : nullptr;
      const bool proxy = dst >= 0 && w->kind[dst] != MEP_DEV_PTR;
      if (__any_sync(0xffffffffu, proxy) && tid == 0) s_any_proxy = 1;
    }
    __syncthreads();
    const uint8_t *row = (const uint8_t *)k.x + (size_t)t * 2 * H;
    if (k.fp8)
      send_fp8(row, H, k.round_scale, s_ptr, topk, s_scale);
    else
      send_bf16(row, H, s_ptr, topk);
    /* more than T only with a token naming one expert twice: the extra
     * copies are dropped (the count is capped to T too) */
    if (slot < T)
      *(int32_t *)mep_dev_dst(
          w, dst, mep__ep_disp_index(L, half, el, c.rank, slot),
          mep__ep_index_stage(L, dst * nl + el, slot)) = t;
    if (k.fp8) {
      __syncthreads();
      send_scales(s_scale, H, s_ptr, topk);
    }
    /* a staged message is read by the proxy on the host: every writer
     * fences at system scope before the put is queued. Mapped peers need
     * nothing here: the count signal's fence covers them. */
    const bool any_proxy = s_any_proxy;
    if (any_proxy) __threadfence_system();
    __syncthreads();
    /* the index words go after every token (below) */
    if (tid < topk && s_ptr[tid])
      (void)mep_dev_put<kMlx5>(w, dst, mep__ep_disp_token(L, half, c.rank, t),
                               mep__ep_disp_stage(L, t, tid), len, deadline);
    if (tid == 0) s_any_proxy = 0;
    __syncthreads(); /* s_ptr and s_scale are rewritten for the next token */
  }

  ep_trace(c, MEP__EP_DS, MEP__EP_T_MID);
  if (!ep_last_block(&c.st->done[MEP__EP_DS], gridDim.x)) return;
  ep_trace(c, MEP__EP_DS, MEP__EP_T_WORK);
  /* every block's slots and puts are done: the counts are final, and
   * every block's writes were fenced before its count (ep_last_block),
   * which thread 0 here fenced again after seeing: the count words need
   * no fence each. A mapped peer gets each word stored. Any other gets,
   * in a few messages instead of one per word (each of which costs tcp
   * a system call: 620 a call at 128 tokens, docs/perf.md), its index
   * words and its count words but the last, and then the last signalled:
   * the receiver waits for that one first (ep_dispatch_recv.cu). */
  const bool one_index_put = mep__ep_index_one_put(L);
  int staged = 0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int dst = e / nl, el = e % nl;
    if (!s_live[dst]) continue;
    uint64_t word = count_word(cnt, e, T, seq);
    uint64_t off = mep__ep_disp_count(L, half, el, c.rank);
    if (w->kind[dst] == MEP_DEV_PTR) {
      (void)mep_dev_signal_fenced<kMlx5>(w, dst, off, word, deadline);
      continue;
    }
    if (el < nl - 1) /* the last is signalled, not put */
      *(uint64_t *)(w->host_base + mep__ep_count_stage(L, dst, el)) = word;
    /* the index words were fenced by their writers (ep_last_block) */
    if (!one_index_put && (uint32_t)word)
      (void)mep_dev_put<kMlx5>(w, dst,
                               mep__ep_disp_index(L, half, el, c.rank, 0),
                               mep__ep_index_stage(L, e, 0),
                               (uint64_t)(uint32_t)word * 4, deadline);
    staged = 1;
  }
  /* the staged count words before their puts, the index puts before the
   * signals */
  if (__syncthreads_or(staged)) {
    __threadfence_system();
    __syncthreads();
    for (int dst = threadIdx.x; dst < L->ranks; dst += blockDim.x) {
      if (!s_live[dst] || w->kind[dst] == MEP_DEV_PTR) continue;
      if (one_index_put)
        (void)mep_dev_put<kMlx5>(w, dst,
                                 mep__ep_disp_index(L, half, 0, c.rank, 0),
                                 mep__ep_index_stage(L, dst * nl, 0),
                                 (uint64_t)nl * T * 4, deadline);
      if (nl > 1)
        (void)mep_dev_put<kMlx5>(w, dst, mep__ep_disp_count(L, half, 0, c.rank),
                                 mep__ep_count_stage(L, dst, 0),
                                 (uint64_t)(nl - 1) * 8, deadline);
      int last = dst * nl + nl - 1;
      (void)mep_dev_signal_fenced<kMlx5>(
          w, dst, mep__ep_disp_count(L, half, nl - 1, c.rank),
          count_word(cnt, last, T, seq), deadline);
    }
  }
  ep_finish(c, MEP__EP_DS, 0, seq);
}

} // namespace
} // namespace mep::ep

extern "C" int mep__ep_launch_dispatch_send(const mep__ep_kdisp_t *k,
                                            void *stream) {
  return ep_launch(EP_KERNEL(mep::ep::dispatch, k->c.has_mlx5),
                   dim3((unsigned)k->send_blocks), k->send_threads,
                   mep::ep::send_smem(k->c.lay.ranks, k->c.lay.hidden, k->fp8),
                   0, stream, *k);
}
