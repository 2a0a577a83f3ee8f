/* dc_reduce.cuh - element types, reduction operators and the
 * block-cooperative rank-ordered reduction of the device collectives.
 *
 * Semantics follow core/src/reduce.h: float16/bfloat16 accumulate in float
 * and round once (to nearest even) at the store; integers wrap (computed
 * unsigned); float min/max propagate NaN and keep the earlier rank's value
 * on ties; avg divides the sum by the contributors (integers: the wrapped
 * sum in the type's width, truncated toward zero); bool: sum/max are "or",
 * prod/min are "and", stored as 0/1. */
#ifndef MEP_SRC_CUDA_DC_REDUCE_CUH
#define MEP_SRC_CUDA_DC_REDUCE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "dc_sync.cuh"

template <typename F> __device__ __forceinline__ F dc_fmin(F a, F b) {
  if (a != a || b != b) return a + b; /* NaN in, NaN out */
  return b < a ? b : a;
}
template <typename F> __device__ __forceinline__ F dc_fmax(F a, F b) {
  if (a != a || b != b) return a + b;
  return b > a ? b : a;
}

/* A floating type: storage S, accumulator A. */
template <typename S, typename A> struct DcFloatOps {
  typedef S St;
  typedef A Acc;
  static __device__ __forceinline__ A sum(A a, A b) { return a + b; }
  static __device__ __forceinline__ A prod(A a, A b) { return a * b; }
  static __device__ __forceinline__ A mn(A a, A b) { return dc_fmin(a, b); }
  static __device__ __forceinline__ A mx(A a, A b) { return dc_fmax(a, b); }
};

struct DcF16 : DcFloatOps<uint16_t, float> {
  static __device__ __forceinline__ float ld(uint16_t v) {
    return __half2float(__ushort_as_half(v));
  }
  static __device__ __forceinline__ uint16_t st(float a) {
    return __half_as_ushort(__float2half_rn(a));
  }
  static __device__ __forceinline__ uint16_t avg(float a, int n) {
    return st(a / (float)n);
  }
};

struct DcBF16 : DcFloatOps<uint16_t, float> {
  static __device__ __forceinline__ float ld(uint16_t v) {
    return __bfloat162float(__ushort_as_bfloat16(v));
  }
  static __device__ __forceinline__ uint16_t st(float a) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(a));
  }
  static __device__ __forceinline__ uint16_t avg(float a, int n) {
    return st(a / (float)n);
  }
};

template <typename F> struct DcFP : DcFloatOps<F, F> {
  static __device__ __forceinline__ F ld(F v) { return v; }
  static __device__ __forceinline__ F st(F a) { return a; }
  static __device__ __forceinline__ F avg(F a, int n) { return a / (F)n; }
};
typedef DcFP<float> DcF32;
typedef DcFP<double> DcF64;

/* An integer type: accumulator A (at least int), arithmetic in U. */
template <typename S, typename A, typename U> struct DcInt {
  typedef S St;
  typedef A Acc;
  static __device__ __forceinline__ A ld(S v) { return (A)v; }
  /* Wraps to the type's width (two's complement). */
  static __device__ __forceinline__ S st(A a) { return (S)(U)a; }
  static __device__ __forceinline__ A sum(A a, A b) {
    return (A)((U)a + (U)b);
  }
  static __device__ __forceinline__ A prod(A a, A b) {
    return (A)((U)a * (U)b);
  }
  static __device__ __forceinline__ A mn(A a, A b) { return b < a ? b : a; }
  static __device__ __forceinline__ A mx(A a, A b) { return b > a ? b : a; }
  static __device__ __forceinline__ S avg(A a, int n) {
    return (S)(st(a) / (A)n);
  }
};
typedef DcInt<int8_t, int32_t, uint32_t> DcI8;
typedef DcInt<uint8_t, int32_t, uint32_t> DcU8;
typedef DcInt<int32_t, int32_t, uint32_t> DcI32;
typedef DcInt<int64_t, int64_t, uint64_t> DcI64;

struct DcBool {
  typedef uint8_t St;
  typedef uint32_t Acc;
  static __device__ __forceinline__ uint32_t ld(uint8_t v) { return v != 0; }
  static __device__ __forceinline__ uint8_t st(uint32_t a) { return a != 0; }
  static __device__ __forceinline__ uint32_t sum(uint32_t a, uint32_t b) {
    return a | b;
  }
  static __device__ __forceinline__ uint32_t prod(uint32_t a, uint32_t b) {
    return a & b;
  }
  static __device__ __forceinline__ uint32_t mn(uint32_t a, uint32_t b) {
    return a & b;
  }
  static __device__ __forceinline__ uint32_t mx(uint32_t a, uint32_t b) {
    return a | b;
  }
  static __device__ __forceinline__ uint8_t avg(uint32_t a, int) {
    return st(a); /* refused by the host side */
  }
};

template <class T, int OP>
__device__ __forceinline__ typename T::Acc dc_comb(typename T::Acc a,
                                                   typename T::Acc b) {
  if constexpr (OP == MEP_PROD) return T::prod(a, b);
  else if constexpr (OP == MEP_MIN) return T::mn(a, b);
  else if constexpr (OP == MEP_MAX) return T::mx(a, b);
  else return T::sum(a, b); /* sum, avg */
}

template <class T, int OP>
__device__ __forceinline__ typename T::St dc_fin(typename T::Acc a,
                                                 int navg) {
  if constexpr (OP == MEP_AVG) return T::avg(a, navg);
  else return T::st(a);
}

/* One element loaded past L1 (see dc_copy), any element size. */
template <typename S> __device__ __forceinline__ S dc_ld1(const S *p) {
  if constexpr (sizeof(S) == 1) {
    unsigned char v = __ldcg((const unsigned char *)p);
    return *(S *)&v;
  } else if constexpr (sizeof(S) == 2) {
    unsigned short v = __ldcg((const unsigned short *)p);
    return *(S *)&v;
  } else if constexpr (sizeof(S) == 4) {
    unsigned int v = __ldcg((const unsigned int *)p);
    return *(S *)&v;
  } else {
    unsigned long long v = __ldcg((const unsigned long long *)p);
    return *(S *)&v;
  }
}

template <typename S> union DcPack {
  uint4 u;
  S s[16 / sizeof(S)];
};

/* Packs to reduce per thread at once: with the next source's loads issued
 * before the current one is combined, 2 x this many 16-byte loads are in
 * flight. Smaller for the 1-byte types, whose int accumulators take 16
 * registers a pack. */
#define DC_REDUCE_UNROLL(S) (sizeof(S) == 1 ? 2 : 4)

/* Loads U packs, a block-stride apart, of one source. */
template <typename S, int U>
__device__ __forceinline__ void dc_ld_packs(DcPack<S> (&v)[U], const char *src,
                                            size_t p, size_t bd) {
#pragma unroll
  for (int u = 0; u < U; ++u) v[u].u = __ldcg((const uint4 *)src + p + u * bd);
}

/* Packs p, p + bd, ... (U of them) of dst (and of dst2 unless NULL) = the
 * rank-ordered reduction of the k sources. */
template <class T, int OP, int U>
__device__ __forceinline__ void dc_reduce_packs(const DcBlock &sb, int k,
                                                char *dst, bool dst_vec,
                                                char *dst2, size_t p,
                                                size_t bd) {
  typedef typename T::St S;
  typedef typename T::Acc A;
  constexpr int E = 16 / sizeof(S);
  DcPack<S> v[U], w[U];
  A acc[U][E];
  dc_ld_packs<S, U>(v, sb.src[0], p, bd);
  if (k > 1) dc_ld_packs<S, U>(w, sb.src[1], p, bd);
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int e = 0; e < E; ++e) acc[u][e] = T::ld(v[u].s[e]);
  for (int j = 1; j < k; ++j) {
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = w[u]; /* source j */
    if (j + 1 < k) dc_ld_packs<S, U>(w, sb.src[j + 1], p, bd);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int e = 0; e < E; ++e)
        acc[u][e] = dc_comb<T, OP>(acc[u][e], T::ld(v[u].s[e]));
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    DcPack<S> out;
#pragma unroll
    for (int e = 0; e < E; ++e) out.s[e] = dc_fin<T, OP>(acc[u][e], k);
    size_t q = p + u * bd;
    if (dst_vec) {
      ((uint4 *)dst)[q] = out.u;
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) ((S *)dst)[q * E + e] = out.s[e];
    }
    if (dst2) ((uint4 *)dst2)[q] = out.u;
  }
}

/* Elements [lo, hi) of dst (and of dst2 unless NULL) = the reduction, in
 * rank order, of the k >= 1 sources sb.src[0..k) (16-byte aligned
 * element-0 bases). lo is a multiple of the elements per 16 bytes unless
 * the range is empty; dst2 is 16-byte aligned; dst needs only element
 * alignment. */
template <class T, int OP>
static __device__ void dc_reduce_range(const DcBlock &sb, int k, char *dst,
                                       char *dst2, size_t lo, size_t hi) {
  typedef typename T::St S;
  typedef typename T::Acc A;
  constexpr int E = 16 / sizeof(S);
  constexpr int U = DC_REDUCE_UNROLL(S);
  if (lo >= hi) return;
  const size_t bd = blockDim.x, p_hi = hi / E;
  const bool dst_vec = ((uintptr_t)dst & 15) == 0;
  size_t p = lo / E + threadIdx.x;
  for (; p + (U - 1) * bd < p_hi; p += U * bd)
    dc_reduce_packs<T, OP, U>(sb, k, dst, dst_vec, dst2, p, bd);
  for (; p < p_hi; p += bd)
    dc_reduce_packs<T, OP, 1>(sb, k, dst, dst_vec, dst2, p, bd);
  for (size_t i = p_hi * E + threadIdx.x; i < hi; i += bd) {
    A acc = T::ld(dc_ld1((const S *)sb.src[0] + i));
    for (int j = 1; j < k; ++j)
      acc = dc_comb<T, OP>(acc, T::ld(dc_ld1((const S *)sb.src[j] + i)));
    S out = dc_fin<T, OP>(acc, k);
    ((S *)dst)[i] = out;
    if (dst2) ((S *)dst2)[i] = out;
  }
}

#endif
