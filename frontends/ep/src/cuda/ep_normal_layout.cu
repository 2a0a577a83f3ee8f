/* ep_normal_layout.cu - mep_ep_get_dispatch_layout on device memory: a
 * thread per token marks the ranks (and hosts) its experts are on and
 * counts into block-local histograms, which each block adds to the
 * outputs once (the outputs are zeroed first, on the same stream). */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "ep_dev.cuh"
#include "ep_normal_k.h"

namespace mep {
namespace ep {
namespace {

#define EPN_LAYOUT_THREADS 256

/* Experts and ranks a block counts in shared memory; beyond that straight
 * into the outputs. */
#define EPN_LAYOUT_SHARED 8192

__global__ void __launch_bounds__(EPN_LAYOUT_THREADS)
    layout(mep__epn_layout_k_t k) {
  extern __shared__ int hist[]; /* [E] experts, [R] ranks, [H] hosts */
  const int E = k.E, R = k.R, H = k.H, tid = threadIdx.x;
  const bool sh = k.shared;
  int *he = sh ? hist : k.per_expert, *hr = sh ? hist + E : k.per_rank;
  int *hh = sh ? hist + E + R : k.per_host;
  if (sh) {
    for (int i = tid; i < E + R + H; i += blockDim.x) hist[i] = 0;
    __syncthreads();
  }
  const int t = blockIdx.x * blockDim.x + tid;
  if (t < k.N) {
    uint8_t *in = k.in_rank + (size_t)t * R;
    for (int r = 0; r < R; r++) in[r] = 0;
    const int64_t *idx = k.topk_idx + (size_t)t * k.K;
    for (int j = 0; j < k.K; j++) {
      const int64_t e = idx[j];
      if (e < 0 || e >= E) continue; /* -1, or out of range: no expert */
      atomicAdd(&he[e], 1);
      const int r = (int)(e / k.L);
      if (!in[r]) {
        in[r] = 1;
        atomicAdd(&hr[r], 1);
      }
    }
    for (int h = 0; h < H; h++) /* a host counts once per token */
      for (int r = h * k.rph; r < (h + 1) * k.rph; r++)
        if (in[r]) {
          atomicAdd(&hh[h], 1);
          break;
        }
  }
  if (!sh) return;
  __syncthreads();
  for (int i = tid; i < E + R + H; i += blockDim.x) {
    if (!hist[i]) continue;
    int *out = i < E ? k.per_expert + i
               : i < E + R ? k.per_rank + (i - E)
                           : k.per_host + (i - E - R);
    atomicAdd(out, hist[i]);
  }
}

}  // namespace
}  // namespace ep
}  // namespace mep

extern "C" int mep__epn_launch_layout(const mep__epn_layout_k_t *k,
                                      void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t e = cudaMemsetAsync(k->per_expert, 0, (size_t)k->E * 4, s);
  if (e == cudaSuccess)
    e = cudaMemsetAsync(k->per_rank, 0, (size_t)k->R * 4, s);
  if (e == cudaSuccess && k->H)
    e = cudaMemsetAsync(k->per_host, 0, (size_t)k->H * 4, s);
  if (e != cudaSuccess) return (int)e;
  if (k->N == 0) return 0;
  mep__epn_layout_k_t a = *k;
  const size_t cells = (size_t)a.E + (size_t)a.R + (size_t)a.H;
  a.shared = cells <= EPN_LAYOUT_SHARED;
  const unsigned grid =
      (unsigned)((a.N + EPN_LAYOUT_THREADS - 1) / EPN_LAYOUT_THREADS);
  return ep_launch(mep::ep::layout, dim3(grid), EPN_LAYOUT_THREADS,
                   a.shared ? cells * sizeof(int) : 0, 0, stream, a);
}
