/* devwin_test.c - the device window (mep/device.h) on GPUs, across forked
 * ranks: each creates windows, and in each round a kernel sends seeded
 * pieces (0, 1, 7, large and random lengths at odd offsets) to every peer
 * with mep_dev_dst / mep_dev_put and signals it; a second kernel waits for
 * every source's signal and checks every byte of its receive area,
 * pieces and the gaps between them (devwin_kernels.cu).
 *
 *   devwin_test [-n ranks] [--expect ptr|proxy|mlx5|any] [--seed S]
 *
 * --expect: the kind every peer must have (MEP_TRANSPORTS=tcp gives proxy;
 * ranks whose GPUs nvlink reaches, ptr; ranks on two "hosts" joined by
 * ibgda, mlx5: kernels post the RDMA writes themselves). Ranks use GPU rank % (GPUs).
 * Two windows (one of an odd size), two rounds on the first, so the ring
 * and the signals are reused; each rank zeroes its receive areas between
 * rounds (the check expects zeros between and after the pieces). Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mep/device.h>
#include <mep/mep.h>

#include "../../../tools/common/launch.h"
#include "../gpu_probe.h"
#include "devwin_test.h"

typedef struct cfg {
  int n;
  const char *expect;
  uint64_t seed;
} cfg_t;

#define FAILF(...)                                                         \
  do {                                                                     \
    fprintf(stderr, "rank %d: ", rank);                                    \
    fprintf(stderr, __VA_ARGS__);                                          \
    fprintf(stderr, "\n");                                                 \
    return 1;                                                              \
  } while (0)

static void set_device(int rank, void *arg) {
  (void)arg;
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) cudaSetDevice(rank % n);
}

static const char *kind_name(int kind) {
  switch (kind) {
  case MEP_DEV_PTR: return "ptr";
  case MEP_DEV_MLX5: return "mlx5";
  case MEP_DEV_PROXY: return "proxy";
  default: return "?";
  }
}

static int check_kinds(const cfg_t *k, mep_devwin_t *w, int rank, int n) {
  int host = 0;
  for (int p = 0; p < n; p++) {
    int kind = mep_devwin_kind(w, p);
    if (p == rank && kind != MEP_DEV_PTR)
      FAILF("own kind is %d, not MEP_DEV_PTR", kind);
    if (p == rank) continue;
    if (kind != MEP_DEV_PTR && kind != MEP_DEV_PROXY && kind != MEP_DEV_MLX5)
      FAILF("kind of rank %d is %d", p, kind);
    host |= kind != MEP_DEV_PTR;
    if (strcmp(k->expect, "any") && strcmp(k->expect, kind_name(kind)))
      FAILF("rank %d is reached as %s, expected %s (MEP_LOG=debug tells "
            "why)", p, kind_name(kind), k->expect);
  }
  if (mep_devwin_kind(w, n) != MEP_ERR_INVALID ||
      mep_devwin_kind(w, -1) != MEP_ERR_INVALID)
    FAILF("mep_devwin_kind accepts ranks outside the group");
  /* a proxy or mlx5 peer anywhere in the group gives every rank a host
   * part */
  if (host && !mep_devwin_host_base(w))
    FAILF("a peer needs the host part but there is none");
  if (!mep_devwin_dev_base(w) || !mep_devwin_device(w))
    FAILF("no device part or descriptor");
  return 0;
}

/* Zeroes this rank's receive areas (device part and, where there is one,
 * host part): a round checks the gaps between its pieces and the area past the
 * last one for zeros, and the pieces of the round before lie elsewhere
 * (their offsets and lengths follow the seed). Done before the barrier
 * that ends the round, so no peer writes into an area while it clears. */
static int clear_recv(mep_devwin_t *w, const dw_params_t *p, int rank) {
  uint64_t off = dw_recv(p, 0), len = dw_bytes(p) - off;
  cudaError_t e =
      cudaMemset((uint8_t *)mep_devwin_dev_base(w) + off, 0, (size_t)len);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    FAILF("clearing the receive areas: %s", cudaGetErrorString(e));
  uint8_t *host = mep_devwin_host_base(w);
  if (host) memset(host + off, 0, (size_t)len);
  return 0;
}

static int round_on(const cfg_t *k, mep_devwin_t *w, mep_comm_t *comm,
                    dw_params_t *p, int r) {
  int rank = mep_comm_rank(comm), n = p->n;
  p->seed = k->seed ^ dw_mix((uint64_t)r + 1);
  p->value = (uint64_t)r + 1;
  dw_result_t *res = calloc((size_t)n, sizeof *res);
  char err[256] = "";
  if (!res) FAILF("out of memory");
  if (dw_round(mep_devwin_device(w), rank, p, res, err, sizeof err)) {
    free(res);
    FAILF("round %d: %s", r, err);
  }
  int bad = 0;
  for (int s = 0; s < n; s++) {
    if (s == rank && res[s].send_err)
      bad = fprintf(stderr, "rank %d: round %d: a send gave up on a full "
                    "ring (%u)\n", rank, r, res[s].send_err);
    if (s == rank) continue;
    if (res[s].timeout)
      bad = fprintf(stderr, "rank %d: round %d: no signal from rank %d\n",
                    rank, r, s);
    else if (res[s].bad)
      bad = fprintf(stderr, "rank %d: round %d: %llu bytes from rank %d "
                    "differ, the first at offset %llu of its area (%s)\n",
                    rank, r, res[s].bad, s, res[s].first,
                    kind_name(mep_devwin_kind(w, s)));
  }
  free(res);
  char msg[512];
  int perr = mep_devwin_proxy_error(w, msg, sizeof msg);
  if (perr) FAILF("round %d: the proxy failed: %s: %s", r,
                  mep_strerror(perr), msg);
  if (bad) return 1;
  if (clear_recv(w, p, rank)) return 1;
  /* nobody reuses the stage areas before every peer has its bytes, nor
   * writes into a receive area before its owner cleared it */
  int brc = mep_barrier(comm, NULL);
  if (brc) FAILF("barrier: %s", mep_last_error());
  return 0;
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  const cfg_t *k = arg;
  int rank = mep_comm_rank(comm), n = mep_comm_size(comm);
  const uint64_t areas[2] = {262144, 100003};
  for (int wi = 0; wi < 2; wi++) {
    dw_params_t p = {.n = n, .area = areas[wi],
                     .timeout_ns = 20ull * 1000000000ull};
    mep_devwin_t *w = NULL;
    int rc = mep_devwin_create(comm, dw_bytes(&p), &w);
    if (rc) FAILF("mep_devwin_create: %s", mep_last_error());
    if (mep_devwin_bytes(w) != dw_bytes(&p))
      FAILF("mep_devwin_bytes is %zu", mep_devwin_bytes(w));
    if (check_kinds(k, w, rank, n)) return 1;
    if (rank == 0)
      printf("window %d: %llu bytes, %s\n", wi,
             (unsigned long long)dw_bytes(&p),
             mep_devwin_host_base(w) ? "with a host part" : "all mapped");
    for (int r = 0; r < (wi ? 1 : 2); r++)
      if (round_on(k, w, comm, &p, r)) return 1;
    if ((rc = mep_devwin_destroy(w)))
      FAILF("mep_devwin_destroy: %s", mep_last_error());
  }
  printf("rank %d: ok\n", rank);
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  cfg_t k = {.n = 2, .expect = "any", .seed = (uint64_t)time(NULL)};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) k.n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--expect") && i + 1 < argc)
      k.expect = argv[++i];
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
      k.seed = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: devwin_test [-n ranks] "
              "[--expect ptr|proxy|mlx5|any] [--seed S]\n");
      return 2;
    }
  }
  if (k.n < 2 || (strcmp(k.expect, "ptr") && strcmp(k.expect, "proxy") &&
                  strcmp(k.expect, "mlx5") && strcmp(k.expect, "any"))) {
    fprintf(stderr, "devwin_test: bad -n or --expect\n");
    return 2;
  }
  if (!gpu_usable()) {
    printf("devwin_test: no usable GPU (or libmep built without CUDA): "
           "skipped\n");
    return 77;
  }
  printf("devwin_test: %d ranks, expect %s, seed %llu\n", k.n, k.expect,
         (unsigned long long)k.seed);
  fflush(stdout);
  mep_launch_opts_t o = {.size = k.n, .timeout_ms = 240000,
                         .name = "devwin_test", .before_comm = set_device};
  int bad = mep_launch(&o, body, &k);
  printf("%s\n", bad ? "FAILED" : "passed");
  return bad ? 1 : 0;
}
