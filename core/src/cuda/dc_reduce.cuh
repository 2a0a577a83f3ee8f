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

/* Elements [lo, hi) of dst (and of dst2 unless NULL) = the reduction, in
 * rank order, of the k sources sb.src[0..k) (16-byte aligned element-0
 * bases). lo is a multiple of the elements per 16 bytes; dst2 is 16-byte
 * aligned; dst needs only element alignment. */
template <class T, int OP>
static __device__ void dc_reduce_range(const DcBlock &sb, int k, char *dst,
                                char *dst2, size_t lo, size_t hi) {
  typedef typename T::St S;
  typedef typename T::Acc A;
  constexpr int E = 16 / sizeof(S);
  size_t p_hi = hi / E;
  bool dst_vec = ((uintptr_t)dst & 15) == 0;
  for (size_t p = lo / E + threadIdx.x; p < p_hi; p += blockDim.x) {
    DcPack<S> v[MEP__DC_MAX_RANKS];
#pragma unroll
    for (int j = 0; j < MEP__DC_MAX_RANKS; ++j)
      if (j < k) v[j].u = __ldcg((const uint4 *)sb.src[j] + p);
    A acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = T::ld(v[0].s[e]);
#pragma unroll
    for (int j = 1; j < MEP__DC_MAX_RANKS; ++j) {
      if (j < k) {
#pragma unroll
        for (int e = 0; e < E; ++e)
          acc[e] = dc_comb<T, OP>(acc[e], T::ld(v[j].s[e]));
      }
    }
    DcPack<S> out;
#pragma unroll
    for (int e = 0; e < E; ++e) out.s[e] = dc_fin<T, OP>(acc[e], k);
    if (dst_vec) {
      ((uint4 *)dst)[p] = out.u;
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) ((S *)dst)[p * E + e] = out.s[e];
    }
    if (dst2) ((uint4 *)dst2)[p] = out.u;
  }
  for (size_t i = p_hi * E + threadIdx.x; i < hi; i += blockDim.x) {
    A acc = T::ld(dc_ld1((const S *)sb.src[0] + i));
    for (int j = 1; j < k; ++j)
      acc = dc_comb<T, OP>(acc, T::ld(dc_ld1((const S *)sb.src[j] + i)));
    S out = dc_fin<T, OP>(acc, k);
    ((S *)dst)[i] = out;
    if (dst2) ((S *)dst2)[i] = out;
  }
}

#endif
