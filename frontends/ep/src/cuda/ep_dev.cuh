/* ep_dev.cuh - device helpers shared by the EP kernels: what a kernel
 * starts from (ep_start), waiting on signal words with a deadline, the
 * "last block done" step, vector moves. */
#ifndef MEP_EP_DEV_CUH
#define MEP_EP_DEV_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "ep_cuda.h"
#include "mep/device/win.cuh"

/* 16 bytes, aligned. */
struct __align__(16) ep_v16 {
  uint32_t w[4];
};

/* Reads bytes a peer (or the proxy) wrote: through L2, never a stale L1
 * line of an earlier call over the same half. */
__device__ __forceinline__ ep_v16 ep_ld16_cg(const void *p) {
  ep_v16 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p));
  return v;
}

/* Inputs of the call: read once, not kept in L1. */
__device__ __forceinline__ ep_v16 ep_ld16_nc(const void *p) {
  ep_v16 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p));
  return v;
}

__device__ __forceinline__ void ep_st16(void *p, const ep_v16 &v) {
  *reinterpret_cast<ep_v16 *>(p) = v;
}

/* 16-byte units a warp moves per batch in ep_warp_copy: each lane has
 * EP_COPY_UNROLL loads in flight before its first store, so a row costs
 * about one memory latency per batch instead of one per unit. */
#define EP_COPY_UNROLL (MEP__EP_CHUNK_UNITS / 32)
#define EP_COPY_BATCH MEP__EP_CHUNK_UNITS

/* A warp copies `nv` 16-byte units from src to dst (both 16-aligned);
 * cg: src is bytes a peer or the proxy wrote (ld.cg), else a read-only
 * input of the call (ld.nc). U: loads in flight per lane (a send whose
 * stores cross NVLink wants more than a local copy). */
template <bool CG, int U = EP_COPY_UNROLL>
__device__ __forceinline__ void ep_warp_copy(uint8_t *dst, const uint8_t *src,
                                             int nv, int lane) {
  for (int base = 0; base < nv; base += 32 * U) {
    ep_v16 d[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int v = base + u * 32 + lane;
      if (v < nv)
        d[u] = CG ? ep_ld16_cg(src + (size_t)v * 16)
                  : ep_ld16_nc(src + (size_t)v * 16);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int v = base + u * 32 + lane;
      if (v < nv) ep_st16(dst + (size_t)v * 16, d[u]);
    }
  }
}

/* The bf16 in the low / high half of w, as a float (exact). */
__device__ __forceinline__ float ep_bf16_lo(uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float ep_bf16_hi(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}

/* Eight floats as eight bf16 (round to nearest even), the first in the
 * low half of word 0. */
__device__ __forceinline__ ep_v16 ep_pack_bf16x8(const float *f) {
  ep_v16 o;
  for (int i = 0; i < 4; i++) {
    __nv_bfloat162 v = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    o.w[i] = *reinterpret_cast<uint32_t *>(&v);
  }
  return o;
}

/* Rows of a token whose loads a thread has in flight at once. */
#define EP_COMB_BATCH 8

/* acc[0..7] += w[j] * the 8 bf16 channels of rows[j] at 16-byte unit q,
 * for j = 0, 1, ... n - 1 in that order (the reference's), skipping NULL
 * rows; EP_COMB_BATCH rows' loads are in flight before the first use.
 * Rows are read through L2 (a peer may have written them). */
__device__ __forceinline__ void ep_weighted_sum8(const uint8_t *const *rows,
                                                 const float *w, int n, int q,
                                                 float acc[8]) {
  for (int j0 = 0; j0 < n; j0 += EP_COMB_BATCH) {
    ep_v16 d[EP_COMB_BATCH];
#pragma unroll
    for (int u = 0; u < EP_COMB_BATCH; u++) {
      const int j = j0 + u;
      if (j < n && rows[j]) d[u] = ep_ld16_cg(rows[j] + (size_t)q * 16);
    }
#pragma unroll
    for (int u = 0; u < EP_COMB_BATCH; u++) {
      const int j = j0 + u;
      if (j >= n || !rows[j]) continue;
      const float wt = w[j];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        acc[2 * i] = fmaf(wt, ep_bf16_lo(d[u].w[i]), acc[2 * i]);
        acc[2 * i + 1] = fmaf(wt, ep_bf16_hi(d[u].w[i]), acc[2 * i + 1]);
      }
    }
  }
}

/* The rows [*begin, *begin + n) of x that expert el got from source s,
 * n being returned, by the caller's layout_range (a handle of the
 * caller's: kept inside the expert's R * T rows, at most T of them). */
__device__ __forceinline__ int64_t ep_pair_rows(const int64_t *layout_range,
                                                const mep__ep_layout_t *L,
                                                int el, int s,
                                                int64_t *begin) {
  const int64_t S = (int64_t)L->ranks * L->tokens;
  const int64_t v = layout_range[(size_t)el * L->ranks + s];
  int64_t n = mep__ep_lr_count(v);
  *begin = mep__ep_lr_begin(v);
  if (n < 0 || *begin > S) n = 0;
  if (n > S - *begin) n = S - *begin;
  return n < L->tokens ? n : L->tokens;
}

/* The block's threads bring row `t` (of `bytes`, t < n) of x into L2. */
__device__ __forceinline__ void ep_prefetch_row(const void *x, int t, int n,
                                                int bytes) {
  if (t >= n) return;
  const char *row = (const char *)x + (size_t)t * bytes;
  for (int o = (int)threadIdx.x * 128; o < bytes; o += (int)blockDim.x * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + o));
}

__device__ __forceinline__ int32_t ep_active(const int32_t *active, int r) {
  return *(const volatile int32_t *)(active + r);
}

/* Rank r takes part in the call: active, and routed in the window (a
 * rank that had left the group when the window was made has a proxy
 * kind without a proxy; a caller's own active_ranks may still say 1). */
__device__ __forceinline__ bool ep_live(const mep__ep_kcommon_t &c, int r) {
  /* both loads in flight at once: the kind is not loaded after the
   * active word is seen (a memory latency at the top of every kernel) */
  const int kind = c.win->kind[r];
  return ep_active(c.active, r) && (kind == MEP_DEV_PTR || c.has_proxy);
}

/* A source missed its deadline: it is skipped from now on. */
__device__ __forceinline__ void ep_clear(int32_t *active, int r) {
  atomicExch((int *)(active + r), 0);
}

#define EP_SPIN_NS 20000u

/* Whether signal word v carries call seq, or a later one, with a low half
 * of at least need. */
__device__ __forceinline__ bool ep_word_reached(uint64_t v, uint64_t seq,
                                               uint32_t need) {
  return (v >> 32) > seq || ((v >> 32) == seq && (uint32_t)v >= need);
}

/* A signal word, at system scope, without acquire semantics. */
__device__ __forceinline__ uint64_t ep_load_relaxed(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p)
               : "memory");
  return v;
}

/* Polls the signal word at p until it carries call `seq` (its high half,
 * the call number, reaches seq) with a low half of at least `need` (a
 * later call's word counts too), rank r goes inactive (another thread gave
 * up on it) or deadline_ns passes, which clears r in active: every waiter
 * skips a silent source from then on. 1 and *word on success; 0 else.
 * The word is read with an acquire at system scope: what the signal
 * covers is visible to the calling thread (and, after a barrier, to its
 * block). kRelaxed: the polls are relaxed loads, and the one that sees
 * the word is followed by the acquire. An acquire in every poll costs the
 * other blocks on the SM their L1 hits: the dispatch's receive blocks,
 * launched early, poll beside the send's, and made each send block 1.6 us
 * slower; a combine, whose send blocks are short, lost more to the second
 * load than it gained (docs/perf.md). */
template <bool kRelaxed = false>
__device__ __forceinline__ int ep_wait_count(const uint64_t *p, uint64_t seq,
                                             uint32_t need, int32_t *active,
                                             int r, uint64_t deadline_ns,
                                             uint64_t *word) {
  /* Spin without naps for the first EP_SPIN_NS: the signal usually
   * comes within microseconds and a nap only delays seeing it. Then
   * short naps (the peer's kernel may share this GPU, which time-slices
   * between processes anyway). */
  uint64_t nap_from = 0;
  unsigned ns = 32;
  for (;;) {
    uint64_t v = kRelaxed ? ep_load_relaxed(p)
                          : mep_dev_load_acquire((const volatile uint64_t *)p);
    if (kRelaxed && ep_word_reached(v, seq, need))
      v = mep_dev_load_acquire((const volatile uint64_t *)p);
    if (ep_word_reached(v, seq, need)) {
      *word = v;
      return 1;
    }
    if (!ep_active(active, r)) return 0;
    uint64_t now = mep_dev_now_ns();
    if (now > deadline_ns) {
      ep_clear(active, r);
      return 0;
    }
    if (!nap_from) nap_from = now + EP_SPIN_NS;
    if (now < nap_from) continue;
    __nanosleep(ns);
    if (ns < 256) ns *= 2;
  }
}

/* The wait for a word of call `seq`, whatever its low half. */
template <bool kRelaxed = false>
__device__ __forceinline__ int ep_wait_word(const uint64_t *p, uint64_t seq,
                                            int32_t *active, int r,
                                            uint64_t deadline_ns,
                                            uint64_t *word) {
  return ep_wait_count<kRelaxed>(p, seq, 0, active, r, deadline_ns, word);
}

/* The wait for a word of call `seq` from source r: ep_wait_word where r
 * is mapped. Else r left it in this rank's host part, and the wait is
 * shared by the blocks of a kernel:
 * the block that is `first` polls the word there, over PCIe, and copies
 * it to c.seen[kind][r] in GPU memory, where the others poll. A hundred
 * blocks polling host memory crowded out this GPU's own stores and proxy
 * commands on the link: a combine through the proxy took 1.6 times as
 * long (docs/perf.md). The acquire of the copy orders what the word
 * covers before the caller's reads, as the acquire of the word would. A
 * failed wait of the first block marks r inactive, which ends the
 * others' waits. */
template <bool kRelaxed = false>
__device__ __forceinline__ int ep_wait_host(const mep__ep_kcommon_t &c,
                                            int kind, bool first,
                                            const uint64_t *p, int r,
                                            uint64_t seq,
                                            uint64_t deadline_ns,
                                            uint64_t *word) {
  if (c.win->kind[r] == MEP_DEV_PTR)
    return ep_wait_word<kRelaxed>(p, seq, c.active, r, deadline_ns, word);
  uint64_t *seen = c.seen + (size_t)kind * c.lay.ranks + r;
  if (!first)
    return ep_wait_word<kRelaxed>(seen, seq, c.active, r, deadline_ns, word);
  if (!ep_wait_word<kRelaxed>(p, seq, c.active, r, deadline_ns, word))
    return 0;
  mep_dev_store_release((volatile uint64_t *)seen, *word);
  return 1;
}

/* One thread: before a send kernel writes the stages of this rank's host
 * part again, the proxy must have carried out every command of the
 * previous send of its kind (mark), and the NIC must have read what was
 * posted to MEP_DEV_MLX5 peers. Gives up at the deadline (the proxy or a
 * queue pair is stuck on a failed peer: receivers' timeouts handle
 * that). */
template <bool kMlx5>
__device__ __forceinline__ void ep_stage_gate(const mep__ep_kcommon_t &c,
                                              int kind, uint64_t deadline) {
  const mep_dev_win_t *w = c.win;
  if (!c.has_proxy || !w->ring_len) return;
  unsigned long long mark =
      *(volatile unsigned long long *)&c.st->mark[kind];
  while (*w->ring_done < mark && mep_dev_now_ns() <= deadline)
    __nanosleep(128);
  (void)mep_dev_quiet<kMlx5>(w, deadline);
}

/* Thread 0 of a block stamps `field` of its block for kind (a diagnosis
 * aid, ep_cuda.h: trace). */
__device__ __forceinline__ void ep_trace(const mep__ep_kcommon_t &c,
                                         int kind, int field) {
  if (!c.trace || threadIdx.x) return;
  unsigned b = blockIdx.x + blockIdx.y * gridDim.x;
  if (b < MEP__EP_TRACE_BLOCKS)
    c.trace[((size_t)kind * MEP__EP_TRACE_BLOCKS + b) * MEP__EP_T_FIELDS +
            field] = mep_dev_now_ns();
}

/* Every block calls it once at its end (all threads): returns true in the
 * one block that finished last, after which every other block's writes
 * and atomics are visible to it. It resets the counter for the next
 * launch. The fences are at system scope: the last block of a send goes
 * on to signal peers, which must see the other blocks' writes too. A
 * kernel whose blocks' writes only this GPU reads after it passes
 * kGpuScope: a GPU-scope fence does not wait for earlier stores to reach
 * peers or the host (ep_bench on 2 H100s: about 1.5 us less per dispatch
 * receive). */
template <bool kGpuScope>
__device__ __forceinline__ void ep_fence(void) {
  if (kGpuScope)
    __threadfence();
  else
    __threadfence_system();
}

template <bool kGpuScope = false>
__device__ __forceinline__ bool ep_last_block(unsigned int *done,
                                              unsigned int blocks) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    ep_fence<kGpuScope>();
    last = atomicAdd(done, 1u) == blocks - 1;
    if (last) {
      *(volatile unsigned int *)done = 0;
      ep_fence<kGpuScope>();
    }
  }
  __syncthreads();
  return last;
}

/* The last block, after its own work: records the ring's tail for the
 * stage gate (kind 0 dispatch, 1 combine, -1 none) and completes the call
 * (seq). */
__device__ __forceinline__ void ep_finish(const mep__ep_kcommon_t &c,
                                          int seq_kind, int mark_kind,
                                          uint64_t seq) {
  __syncthreads();
  ep_trace(c, seq_kind, MEP__EP_T_END);
  if (threadIdx.x == 0) {
    if (mark_kind >= 0 && c.has_proxy && c.win->ring_len)
      c.st->mark[mark_kind] = *(volatile unsigned long long *)c.win->ring_tail;
    *(volatile uint64_t *)&c.st->seq[seq_kind] = seq;
  }
}

/* Programmatic dependent launch (sm_90 and later). A send kernel lets
 * the receive kernel queued after it start at once (every block says so
 * at its start): the receiver needs nothing from this rank's send but
 * what the signal words already order, so its blocks can wait for the
 * peers' signals while the send runs, and one launch gap goes. The
 * receive kernel waits for the send grid to finish before its own blocks
 * exit, so the stream still sees the two in order. Without a programmatic
 * launch both instructions return at once. */
__device__ __forceinline__ void ep_early_start(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void ep_after_send(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Kernel names. Each operation's send and receive are two kernels, each
 * compiled with its own launch bounds and registers, in two files, and
 * both are called mep::ep::(anonymous namespace)::dispatch<F> (or
 * ::combine<F>, F the same flag: EP_KERNEL), which is the name a profiler
 * shows: one name per operation,
 * holding "::dispatch" or "::combine", as DeepEP's kernels do. Its tools
 * (and users' scripts) look kernels up by those words, expect one name
 * per operation, and split a call's launches into send and receive by
 * count, as DeepEP's kernel is launched once per phase with hooks (without
 * hooks DeepEP launches it once, mep still twice: docs/ep.md). */

/* The instantiation of a kernel template for the window's kinds: with
 * the MLX5 branches of win.cuh when some peer is MEP_DEV_MLX5 (has_mlx5),
 * without them otherwise (each kernel that puts or signals passes kMlx5
 * to win.cuh). The low-latency receive kernels take the flag too, unused,
 * so that a send and its receive keep one name (kernel names, above);
 * reduce mode, whose peers are all mapped, launches <false>. */
#define EP_KERNEL(kernel, mlx5) ((mlx5) ? kernel<true> : kernel<false>)

/* Queues `kernel` (`smem` bytes of dynamic shared memory), as a
 * programmatic dependent of the kernel before it when `early` (a receive
 * launch); returns cudaGetLastError()'s code (0: queued). */
template <typename K>
static int ep_launch(void (*kernel)(K), dim3 grid, int threads, size_t smem,
                     int early, void *stream, const K &args) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = grid;
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = (cudaStream_t)stream;
  if (early) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args);
  return (int)(e != cudaSuccess ? e : cudaGetLastError());
}

/* Blocks of `kernel` with `threads` threads one SM holds at once (0:
 * unknown). */
template <typename K>
static int ep_blocks_per_sm(void (*kernel)(K), int threads) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

__device__ __forceinline__ uint64_t ep_seq(const mep__ep_kcommon_t &c,
                                           int kind) {
  return *(const volatile uint64_t *)&c.st->seq[kind] + 1;
}

/* Where a kernel of a call starts from: the layout and the window, the
 * call's number of its kind (seq), the half of the areas it uses, and
 * its deadline, the clock being read once, after seq. A kernel takes it
 * apart at its top, so its body keeps plain names:
 *   const auto [L, w, seq, half, deadline] = ep_start(c, MEP__EP_CS); */
struct ep_call {
  const mep__ep_layout_t *L;
  const mep_dev_win_t *w;
  uint64_t seq;
  int half;
  uint64_t deadline;
};

__device__ __forceinline__ ep_call ep_start(const mep__ep_kcommon_t &c,
                                            int kind) {
  ep_call s;
  s.L = &c.lay;
  s.w = c.win;
  s.seq = ep_seq(c, kind);
  s.half = (int)(s.seq & 1);
  s.deadline = mep_dev_now_ns() + c.timeout_ns;
  ep_trace(c, kind, MEP__EP_T_ENTRY);
  return s;
}

#endif /* MEP_EP_DEV_CUH */
