/* ep_normal_layout.cu - mep_ep_get_dispatch_layout on device memory, one
 * kernel and no memsets (a call's host time is most of its cost): each
 * block owns a few experts, ranks or hosts, reads every token's top-k and
 * writes its own counts (and, for ranks, is_token_in_rank's columns), so
 * no output needs zeroing first and none takes an atomic. topk_idx is
 * small (N x K x 8 bytes) and stays in L2 across the blocks. */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "ep_normal_dev.cuh"

namespace mep {
namespace ep {
namespace {

#define EPN_LAYOUT_THREADS 256
#define EPN_LAYOUT_PER_BLOCK 8 /* experts, ranks or hosts a block counts */

/* Blocks [0, be): experts; [be, be + br): ranks; then hosts. A token
 * counts once per rank and once per host it reaches; an index outside
 * 0 .. E - 1 counts as none. */
__global__ void __launch_bounds__(EPN_LAYOUT_THREADS)
    layout(mep__epn_layout_k_t k) {
  __shared__ int red[32];
  const int P = EPN_LAYOUT_PER_BLOCK;
  const int be = (k.E + P - 1) / P, br = (k.R + P - 1) / P;
  int b = blockIdx.x, kind = 0, div = 1, n = k.E; /* expert = idx / 1 */
  if (b >= be) {
    b -= be;
    kind = 1, div = k.L, n = k.R;
    if (b >= br) b -= br, kind = 2, div = k.L * k.rph, n = k.H;
  }
  const int lo = b * P, hi = min(lo + P, n);
  int cnt[EPN_LAYOUT_PER_BLOCK] = {0};
  for (int t = threadIdx.x; t < k.N; t += blockDim.x) {
    unsigned hit = 0; /* bit i: lo + i */
    const int64_t *idx = k.topk_idx + (size_t)t * k.K;
    for (int j = 0; j < k.K; j++) {
      const int64_t e = idx[j];
      if (e < 0 || e >= k.E) continue;
      const int u = (int)e / div - lo;
      if (u < 0 || u >= hi - lo) continue;
      hit |= 1u << u;
      if (kind == 0) /* an expert counts every entry, repeats too */
#pragma unroll
        for (int i = 0; i < P; i++) cnt[i] += u == i;
    }
    if (kind != 0)
#pragma unroll
      for (int i = 0; i < P; i++) cnt[i] += hit >> i & 1;
    if (kind == 1)
      for (int r = lo; r < hi; r++)
        k.in_rank[(size_t)t * k.R + r] = hit >> (r - lo) & 1;
  }
  int *out = kind == 0 ? k.per_expert : kind == 1 ? k.per_rank : k.per_host;
#pragma unroll
  for (int i = 0; i < P; i++) {
    const int s = epn_block_sum(cnt[i], red);
    if (threadIdx.x == 0 && lo + i < hi) out[lo + i] = s;
  }
}

}  // namespace
}  // namespace ep
}  // namespace mep

extern "C" int mep__epn_launch_layout(const mep__epn_layout_k_t *k,
                                      void *stream) {
  const int P = EPN_LAYOUT_PER_BLOCK;
  const long long blocks = ((long long)k->E + P - 1) / P +
                           ((long long)k->R + P - 1) / P +
                           ((long long)k->H + P - 1) / P;
  return ep_launch(mep::ep::layout, dim3((unsigned)blocks),
                   EPN_LAYOUT_THREADS, 0, 0, stream, *k);
}
