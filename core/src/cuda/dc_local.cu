/* dc_local.cu - element-wise kernels on one rank's buffers, for the
 * staging path: dst = dst op src, and the avg division. */
#include "dc_host.h"

#define DC_LOCAL_BLOCKS_MAX 1024

template <class T, int OP>
__global__ void dc_k_reduce_local(char *dst, const char *src, size_t n) {
  typedef typename T::St S;
  constexpr size_t E = 16 / sizeof(S);
  size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t nth = (size_t)gridDim.x * blockDim.x;
  size_t vec = ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) ? n / E : 0;
  for (size_t p = tid; p < vec; p += nth) {
    DcPack<S> a, b;
    a.u = ((const uint4 *)dst)[p];
    b.u = ((const uint4 *)src)[p];
#pragma unroll
    for (size_t e = 0; e < E; ++e)
      a.s[e] = T::st(dc_comb<T, OP>(T::ld(a.s[e]), T::ld(b.s[e])));
    ((uint4 *)dst)[p] = a.u;
  }
  S *d = (S *)dst;
  const S *s = (const S *)src;
  for (size_t i = vec * E + tid; i < n; i += nth)
    d[i] = T::st(dc_comb<T, OP>(T::ld(d[i]), T::ld(s[i])));
}

template <class T, int OP>
__global__ void dc_k_scale(char *buf, size_t n, int div) {
  typedef typename T::St S;
  size_t nth = (size_t)gridDim.x * blockDim.x;
  S *b = (S *)buf;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += nth)
    b[i] = T::avg(T::ld(b[i]), div);
}

static int dc_local_blocks(size_t items) {
  size_t b = (items + DC_THREADS - 1) / DC_THREADS;
  if (b < 1) b = 1;
  return b > DC_LOCAL_BLOCKS_MAX ? DC_LOCAL_BLOCKS_MAX : (int)b;
}

static int dc_local_launched(const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  return dc_fail(MEP_ERR_SYSTEM, "devcoll: %s: kernel launch failed: %s",
                 what, cudaGetErrorString(e));
}

template <class T, int OP> struct DcReduceLocal {
  static int run(char *dst, const char *src, size_t n, cudaStream_t st) {
    size_t packs = n / (16 / sizeof(typename T::St)) + 16;
    dc_k_reduce_local<T, OP>
        <<<dc_local_blocks(packs), DC_THREADS, 0, st>>>(dst, src, n);
    return dc_local_launched("reduce_local");
  }
};

/* Only the avg instance is launched; OP is there for dc_dispatch. */
template <class T, int OP> struct DcScale {
  static int run(char *buf, size_t n, int div, cudaStream_t st) {
    if constexpr (OP == MEP_AVG) {
      dc_k_scale<T, OP><<<dc_local_blocks(n), DC_THREADS, 0, st>>>(buf, n, div);
      return dc_local_launched("scale_avg");
    } else {
      (void)buf, (void)n, (void)div, (void)st;
      return dc_fail(MEP_ERR_INVALID, "devcoll: scale_avg: internal op %d",
                     OP);
    }
  }
};

extern "C" int mep__dc_reduce_local(void *dst, const void *src, size_t count,
                                    mep_dtype_t dt, mep_op_t op,
                                    void *stream) {
  int rc = dc_check_reduction("reduce_local", dt, op, 1);
  if (rc) return rc;
  if (count == 0) return 0;
  if (!dst || !src)
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: reduce_local: %zu elements with dst %p and src %p",
                   count, dst, src);
  if (op == MEP_AVG) op = MEP_SUM;
  return dc_dispatch<DcReduceLocal>(dt, op, (char *)dst, (const char *)src,
                                    count, (cudaStream_t)stream);
}

extern "C" int mep__dc_scale_avg(void *buf, size_t count, mep_dtype_t dt,
                                 int n, void *stream) {
  int rc = dc_check_reduction("scale_avg", dt, MEP_AVG, 0);
  if (rc) return rc;
  if (n < 1)
    return dc_fail(MEP_ERR_INVALID, "devcoll: scale_avg: divisor %d is not positive", n);
  if (count == 0) return 0;
  if (!buf)
    return dc_fail(MEP_ERR_INVALID, "devcoll: scale_avg: %zu elements at NULL",
                   count);
  return dc_dispatch<DcScale>(dt, MEP_AVG, (char *)buf, count, n,
                              (cudaStream_t)stream);
}
