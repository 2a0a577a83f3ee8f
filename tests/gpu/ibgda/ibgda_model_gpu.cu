/* ibgda_model_gpu.cu - GPU kernels post on an mlx5 queue pair through
 * mep/device/mlx5.cuh and the software model of the NIC (plugins/ibgda/
 * model.h, in this process) carries the WQEs out: many warps at once, a
 * ring small enough to wrap and fill, puts from registered host memory
 * the kernel wrote, inline puts, SETs and ADDs. The host checks every
 * byte and word against a reference regenerated from the seeds, that the
 * counters agree after quiet, and that an error CQE fails the queue pair
 * for the kernel. Exits 77 without a usable GPU. */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "model.h"
}
#include "mep/device/mlx5.cuh"

#define CK(x)                                                                 \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #x,        \
              cudaGetErrorString(e_));                                        \
      exit(1);                                                                \
    }                                                                         \
  } while (0)
#define CHECK(c, ...)                                                         \
  do {                                                                        \
    if (!(c)) {                                                               \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);           \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, "\n");                                                  \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

static void t_log(mep_log_level_t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
}
static void t_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
}

#define WARPS 32 /* 4 blocks of 8 warps */
#define OPS 200
#define SLOT 256

__host__ __device__ static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
__host__ __device__ static uint8_t byte_of(uint64_t seed, uint32_t i) {
  return (uint8_t)(mix(seed + i / 8) >> (8 * (i % 8)));
}

struct args {
  mep_dev_mlx5_peer_t *desc; /* device-resident */
  uint8_t *src;              /* host-mapped, registered (lkey) */
  uint64_t dst, words;       /* remote addresses (the model's view) */
  uint32_t skey, dkey, wkey;
  int *rc;
};

__global__ void post(args a) {
  mep_mlx5_qp_t q = mep_mlx5_qp_view(a.desc);
  unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  unsigned lane = threadIdx.x & 31;
  int rc = 0;
  for (int i = 0; i < OPS && !rc; i++) {
    uint64_t seed = mix(warp * 100003ull + i);
    uint32_t len = 1 + (uint32_t)(seed % SLOT);
    uint64_t off = ((uint64_t)warp * OPS + i) * SLOT;
    uint64_t dl = mep_mlx5_now_ns() + 20000000000ull;
    if (seed & (1ull << 40)) {
      uint8_t *s = a.src + off;
      for (uint32_t b = lane; b < len; b += 32) s[b] = byte_of(seed, b);
      rc = mep_dev_mlx5_put_warp(&q, a.dst + off, a.dkey,
                                 (uint64_t)(uintptr_t)s, a.skey, len, dl);
    } else {
      if (len > MEP_MLX5_MAX_INLINE) len = MEP_MLX5_MAX_INLINE;
      __shared__ uint8_t buf[8][MEP_MLX5_MAX_INLINE];
      uint8_t *b = buf[threadIdx.x / 32];
      for (uint32_t k = lane; k < len; k += 32) b[k] = byte_of(seed, k);
      __syncwarp();
      rc = mep_dev_mlx5_put_inline_warp(&q, a.dst + off, a.dkey, b, len, dl);
    }
    if (!rc)
      rc = mep_dev_mlx5_signal_warp(&q, a.words + 8 * WARPS, a.wkey,
                                    seed & 0xffff, 1, dl);
    if (!rc)
      rc = mep_dev_mlx5_signal_warp(&q, a.words + 8 * warp, a.wkey,
                                    (uint64_t)i + 1, 0, dl);
  }
  if (lane == 0) a.rc[warp] = rc;
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no usable GPU\n");
    return 77;
  }
  alarm(240);
  static mep_tp_env_t env;
  env.struct_size = sizeof env;
  env.log = t_log;
  env.set_error = t_err;
  static m5_t m;
  CHECK(!mep__m5_open(&m, &env, 0), "model");
  m5_qp_t *qp;
  CHECK(!mep__m5_qp_create(&m, 64, 64, &qp), "qp");
  mep__m5_qp_target(&m, qp, 0, getpid(), (uint64_t)(uintptr_t)m.keys);
  /* the queue pair's memory, mapped for the GPU as the plugin's would be */
  uint64_t *ctr, *sink, *words;
  uint8_t *src, *dst;
  size_t bytes = (size_t)WARPS * OPS * SLOT;
  CK(cudaHostAlloc(&sink, 64, cudaHostAllocMapped));
  CK(cudaHostAlloc(&words, 8 * (WARPS + 1), cudaHostAllocMapped));
  CK(cudaHostAlloc(&src, bytes, cudaHostAllocMapped));
  dst = (uint8_t *)calloc(1, bytes);
  memset(words, 0, 8 * (WARPS + 1));
  /* one page-aligned block: SQ, CQ, doorbell record and register, CQ
   * record, the producers' counters (qp->user) */
  CK(cudaHostRegister(qp->mem, qp->mem_len, cudaHostRegisterMapped));
  ctr = qp->user;
  uint32_t skey, dkey, wkey, sinkkey;
  CHECK(!mep__m5_reg(&m, src, bytes, &skey) &&
            !mep__m5_reg(&m, dst, bytes, &dkey) &&
            !mep__m5_reg(&m, words, 8 * (WARPS + 1), &wkey) &&
            !mep__m5_reg(&m, sink, 8, &sinkkey),
        "reg");
  /* device pointers of mapped host memory (the same addresses under UVA
   * where the GPU can use host pointers; asked for, not assumed) */
  auto dp = [](void *h) {
    void *d = NULL;
    CK(cudaHostGetDevicePointer(&d, h, 0));
    return (uint64_t)(uintptr_t)d;
  };
  mep_dev_mlx5_peer_t h = {};
  h.hdr.kind = MEP_DEV_MLX5;
  h.hdr.version = MEP_DEV_MLX5_VERSION;
  h.hdr.size = sizeof h;
  h.qpn = qp->qpn;
  h.sq_bbs = qp->sq_bbs;
  h.sq = dp(qp->sq);
  h.dbrec = dp(qp->dbrec);
  h.db = dp(qp->db);
  h.pi = dp(&ctr[0]);
  h.ready = dp(&ctr[1]);
  h.ci = dp(&ctr[2]);
  h.cq = dp(qp->cq);
  h.cq_n = qp->cq_n;
  h.sink_lkey = sinkkey;
  h.cq_dbrec = dp(qp->cq_dbrec);
  h.cq_ci = dp(&ctr[3]);
  h.cq_lock = dp(&ctr[4]);
  h.sink = (uint64_t)(uintptr_t)sink; /* the model's address for it */
  h.flags = MEP_DEV_MLX5_MODEL;
  mep_dev_mlx5_peer_t *d;
  int *rc;
  CK(cudaMalloc(&d, sizeof h));
  CK(cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice));
  CK(cudaMallocManaged(&rc, WARPS * sizeof(int)));
  args a = {d, (uint8_t *)(uintptr_t)dp(src), (uint64_t)(uintptr_t)dst,
            (uint64_t)(uintptr_t)words, skey, dkey, wkey, rc};
  /* the WQEs name src by the model's (host) address: the same here */
  CHECK((uint64_t)(uintptr_t)a.src == (uint64_t)(uintptr_t)src,
        "this GPU maps host memory at other addresses; the test assumes "
        "UVA host pointers");
  post<<<WARPS / 8, 256>>>(a);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  for (int w = 0; w < WARPS; w++) CHECK(rc[w] == 0, "warp %d: %d", w, rc[w]);
  /* the host runs the same queue-pair code to wait for the rest */
  mep_dev_mlx5_peer_t hv = h;
  hv.sq = (uint64_t)(uintptr_t)qp->sq;
  hv.dbrec = (uint64_t)(uintptr_t)qp->dbrec;
  hv.db = (uint64_t)(uintptr_t)qp->db;
  hv.pi = (uint64_t)(uintptr_t)&ctr[0];
  hv.ready = (uint64_t)(uintptr_t)&ctr[1];
  hv.ci = (uint64_t)(uintptr_t)&ctr[2];
  hv.cq = (uint64_t)(uintptr_t)qp->cq;
  hv.cq_dbrec = (uint64_t)(uintptr_t)qp->cq_dbrec;
  hv.cq_ci = (uint64_t)(uintptr_t)&ctr[3];
  hv.cq_lock = (uint64_t)(uintptr_t)&ctr[4];
  mep_mlx5_qp_t q = mep_mlx5_qp_view(&hv);
  CHECK(mep_mlx5_qp_quiet(&q, mep_mlx5_now_ns() + 10000000000ull) == 0,
        "quiet");
  CHECK(ctr[0] == ctr[1] && ctr[1] == ctr[2], "pi %llu ready %llu ci %llu",
        (unsigned long long)ctr[0], (unsigned long long)ctr[1],
        (unsigned long long)ctr[2]);
  uint64_t total = 0;
  for (unsigned w = 0; w < WARPS; w++) {
    for (int i = 0; i < OPS; i++) {
      uint64_t seed = mix(w * 100003ull + i);
      uint32_t len = 1 + (uint32_t)(seed % SLOT);
      if (!(seed & (1ull << 40)) && len > MEP_MLX5_MAX_INLINE)
        len = MEP_MLX5_MAX_INLINE;
      const uint8_t *p = dst + ((uint64_t)w * OPS + i) * SLOT;
      for (uint32_t b = 0; b < len; b++)
        CHECK(p[b] == byte_of(seed, b), "warp %u op %d byte %u of %u", w, i,
              b, len);
      total += seed & 0xffff;
    }
    CHECK(words[w] == OPS, "warp %u's SET word %llu", w,
          (unsigned long long)words[w]);
  }
  CHECK(words[WARPS] == total, "ADD word %llu, want %llu",
        (unsigned long long)words[WARPS], (unsigned long long)total);
  printf("%d warps x %d ops: %llu building blocks through a ring of %u, "
         "every byte and word as the reference\n", WARPS, OPS,
         (unsigned long long)ctr[0], qp->sq_bbs);
  /* an error CQE (a wrong rkey) fails the queue pair for the kernel */
  a.dkey ^= 0x80;
  post<<<1, 32>>>(a);
  CK(cudaDeviceSynchronize());
  a.dkey ^= 0x80;
  post<<<1, 32>>>(a);
  CK(cudaDeviceSynchronize());
  CHECK(rc[0] == -2, "after an error CQE the kernel got %d, want -2", rc[0]);
  printf("ok\n");
  return 0;
}
