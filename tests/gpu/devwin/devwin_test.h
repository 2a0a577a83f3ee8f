/* devwin_test.h - what the GPU test of the device window shares between
 * its host program (devwin_test.c) and its kernels (devwin_kernels.cu):
 * the layout of the window, the pieces each rank sends to each peer and
 * the bytes in them, all functions of a seed. */
#ifndef MEP_TESTS_DEVWIN_TEST_H
#define MEP_TESTS_DEVWIN_TEST_H

#include <stdint.h>

#include <mep/device.h>

#ifdef __CUDACC__
#define DW_FN __host__ __device__ static inline
#else
#define DW_FN static inline
#endif

#define DW_PIECES 8

typedef struct dw_params {
  int n;            /* ranks */
  uint64_t area;    /* bytes per peer of the stage and receive areas */
  uint64_t seed;    /* of this round */
  uint64_t value;   /* the signal of this round (grows) */
  uint64_t timeout_ns;
} dw_params_t;

/* What the receiving kernel found, per source rank. */
typedef struct dw_result {
  unsigned long long bad;   /* bytes that differ */
  unsigned long long first; /* the first of them (offset in the area) */
  unsigned int timeout;     /* the signal never came */
  unsigned int send_err;    /* (own rank's slot) a send gave up */
} dw_result_t;

DW_FN uint64_t dw_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Window layout: n signal words, a stage area per destination, a receive
 * area per source. */
DW_FN uint64_t dw_sig(int src) { return (uint64_t)src * 8; }
DW_FN uint64_t dw_stage(const dw_params_t *p, int dst) {
  return 64 + (uint64_t)p->n * 8 + (uint64_t)dst * p->area;
}
DW_FN uint64_t dw_recv(const dw_params_t *p, int src) {
  return dw_stage(p, p->n) + (uint64_t)src * p->area;
}
DW_FN uint64_t dw_bytes(const dw_params_t *p) { return dw_recv(p, p->n); }

/* Piece k from src to dst: offset in the area (odd first) and length:
 * 0, 1, 7, a quarter of the area, then random; gaps of 1..6 bytes. */
DW_FN void dw_piece(const dw_params_t *p, int src, int dst, int k,
                    uint64_t *off, uint64_t *len) {
  uint64_t cur = 1, l = 0;
  for (int j = 0; j <= k; j++) {
    uint64_t r = dw_mix(p->seed ^ ((uint64_t)src << 40) ^
                        ((uint64_t)dst << 20) ^ (uint64_t)j);
    if (j) cur += l + 1 + (r >> 40) % 6;
    l = j == 0 ? 0 : j == 1 ? 1 : j == 2 ? 7 : j == 3 ? p->area / 4
                                                      : r % (p->area / 16);
  }
  *off = cur;
  *len = l;
}

/* Byte i of piece k from src to dst. */
DW_FN uint8_t dw_byte(const dw_params_t *p, int src, int dst, int k,
                      uint64_t i) {
  uint64_t h = dw_mix(p->seed ^ ((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^
                      ((uint64_t)k << 24) ^ dw_mix(i / 8));
  return (uint8_t)(h >> (8 * (i % 8)));
}

#ifdef __cplusplus
extern "C" {
#endif
/* One round on the window `w` (its device descriptor): every rank sends
 * to every peer, then waits for and checks what every peer sent. Results
 * per source in res[n]. Returns 0, or -1 with a CUDA error in err. */
int dw_round(const mep_dev_win_t *w, int rank, const dw_params_t *p,
             dw_result_t *res, char *err, size_t err_len);
#ifdef __cplusplus
}
#endif

#endif
