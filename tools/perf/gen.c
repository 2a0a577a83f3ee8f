/* gen.c - deterministic inputs and element codecs for mep-perf. */
#include "gen.h"

#include <math.h>
#include <string.h>

uint64_t perf_stream_key(uint64_t seed, int rank, int iter) {
  uint64_t k = perf_mix64(seed + 0x9e3779b97f4a7c15ull);
  k = perf_mix64(k ^ ((uint64_t)(uint32_t)rank * 0xd1b54a32d192ed03ull));
  return perf_mix64(k ^
                    ((uint64_t)(uint32_t)iter * 0xaef17502108ef2d9ull + 1));
}

/* Inlined with a constant dtype, the per-element switches fold away. */
static inline void fill_loop(mep_dtype_t dt, uint64_t key, size_t idx0,
                             void *buf, size_t n) {
  for (size_t i = 0; i < n; i++)
    perf_store_bits(dt, buf, i, perf_value_bits(dt, key, idx0 + i));
}

void perf_fill(mep_dtype_t dt, uint64_t key, size_t idx0, void *buf,
               size_t n) {
  PERF_BY_DTYPE(dt, , fill_loop, key, idx0, buf, n)
}

double perf_unit_roundoff(mep_dtype_t dt) {
  switch (dt) {
  case MEP_FLOAT16: return ldexp(1, -11);
  case MEP_BFLOAT16: return ldexp(1, -8);
  case MEP_FLOAT32: return ldexp(1, -24);
  default: return ldexp(1, -53);
  }
}
