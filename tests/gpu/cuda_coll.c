/* cuda_coll.c - the CUDA collectives of libmep across processes, against a
 * reference each rank computes on the host from every rank's inputs (all
 * inputs are a function of the seed, the case and the rank).
 *
 *   cuda_coll [-n ranks] [--path auto|kernel|staged] [--seed S] [--kill]
 *             [--graph] [--big]
 *
 * Ranks use GPU rank % (GPUs), so 2-4 processes share one GPU or spread
 * over several. --kill: the last rank leaves without a word before the
 * third all-reduce; the others must finish within the timeout, degraded,
 * with the sum over the survivors. --graph: all-reduces captured in a CUDA
 * graph and replayed with new inputs (kernel path only). Exits 77 without a
 * GPU. Prints "N passed, N failed". */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mep/mep.h>

#include "../../tools/common/launch.h"
#include "gpu_check.h"
#include "gpu_probe.h"

typedef struct cfg {
  int n, kill, graph, big;
  uint64_t seed;
  const char *path;
} cfg_t;

static int passed, failed;

#define CK(e, what) GPU_CK(rank, 1, e, what)

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Element i of rank r's input in case c, as the dtype holds it; prod
 * cases stay near 1 (floats) or tiny (integers). */
static double value(uint64_t seed, int c, int r, size_t i, mep_dtype_t dt,
                    mep_op_t op) {
  uint64_t x = mix(seed ^ mix((uint64_t)c * 1000003u + (uint64_t)r) ^
                   mix(i + 17));
  int fl = dt == MEP_FLOAT32 || dt == MEP_BFLOAT16;
  double v;
  if (op == MEP_PROD)
    v = fl ? 1.0 + (double)((int)(x % 9) - 4) / 64.0 : (double)(x % 3);
  else if (fl)
    v = (double)((int64_t)(x % 2001) - 1000) / 8.0;
  else
    v = dt == MEP_UINT8 ? (double)(x % 256)
                        : (double)((int64_t)(x % 20001) - 10000);
  /* the value the rank really holds */
  return dt == MEP_BFLOAT16 ? bf2f(f2bf((float)v)) : v;
}

static void put(void *buf, size_t i, mep_dtype_t dt, double v) {
  switch (dt) {
  case MEP_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case MEP_BFLOAT16: ((uint16_t *)buf)[i] = f2bf((float)v); break;
  case MEP_INT32: ((int32_t *)buf)[i] = (int32_t)(int64_t)v; break;
  case MEP_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case MEP_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
  default: break;
  }
}

static double get(const void *buf, size_t i, mep_dtype_t dt) {
  switch (dt) {
  case MEP_FLOAT32: return ((const float *)buf)[i];
  case MEP_BFLOAT16: return bf2f(((const uint16_t *)buf)[i]);
  case MEP_INT32: return ((const int32_t *)buf)[i];
  case MEP_INT64: return (double)((const int64_t *)buf)[i];
  case MEP_UINT8: return ((const uint8_t *)buf)[i];
  default: return 0;
  }
}

/* The reduction of the ranks in `live`, element i, in rank order; integer
 * results wrap like the dtype. */
static double reduce_ref(const cfg_t *k, int c, size_t i, mep_dtype_t dt,
                         mep_op_t op, const uint8_t *live) {
  double acc = 0;
  int first = 1, n = 0;
  for (int r = 0; r < k->n; r++) {
    if (!live[r]) continue;
    double v = value(k->seed, c, r, i, dt, op);
    n++;
    if (first) {
      acc = v;
      first = 0;
      continue;
    }
    switch (op) {
    case MEP_SUM: case MEP_AVG: acc += v; break;
    case MEP_PROD: acc *= v; break;
    case MEP_MIN: acc = v < acc ? v : acc; break;
    case MEP_MAX: acc = v > acc ? v : acc; break;
    }
  }
  int fl = dt == MEP_FLOAT32 || dt == MEP_BFLOAT16;
  if (dt == MEP_UINT8) acc = (double)((uint64_t)(int64_t)acc & 0xff);
  if (dt == MEP_INT32) acc = (double)(int32_t)(uint32_t)(int64_t)acc;
  if (op == MEP_AVG) acc = fl ? acc / n : (double)((int64_t)acc / n);
  return acc;
}

static int close_enough(double got, double want, mep_dtype_t dt) {
  if (dt == MEP_FLOAT32) return fabs(got - want) <= 1e-5 * (1 + fabs(want));
  if (dt == MEP_BFLOAT16) return fabs(got - want) <= 1e-2 * (1 + fabs(want));
  return got == want;
}

enum { AR, AG, RS, A2A, BC, NKIND };
static const char *kname[] = {"allreduce", "allgather", "reduce_scatter",
                              "alltoall", "broadcast"};

typedef struct rank_ctx {
  const cfg_t *k;
  int rank, n;
  cudaStream_t s;
} rank_ctx_t;

static int call(mep_comm_t *comm, int kind, const void *in, void *out,
                size_t count, mep_dtype_t dt, mep_op_t op, int root,
                cudaStream_t s, mep_req_t **req) {
  switch (kind) {
  case AR: return mep_allreduce_cuda(comm, in, out, count, dt, op, s, req);
  case AG: return mep_allgather_cuda(comm, in, out, count, dt, s, req);
  case RS:
    return mep_reduce_scatter_cuda(comm, in, out, count, dt, op, s, req);
  case A2A: return mep_alltoall_cuda(comm, in, out, count, dt, s, req);
  default: return mep_broadcast_cuda(comm, out, count, dt, root, s, req);
  }
}

/* One case: fills the inputs, runs, checks on every element. */
static int one_case(rank_ctx_t *x, mep_comm_t *comm, int c, int kind,
                    mep_dtype_t dt, mep_op_t op, size_t count) {
  const cfg_t *k = x->k;
  int rank = x->rank, n = x->n;
  size_t es = mep_dtype_size(dt);
  size_t in_n = kind == RS || kind == A2A ? count * n : count;
  size_t out_n = kind == AG || kind == A2A ? count * n : count;
  int root = c % n;
  uint8_t *live = malloc((size_t)n);
  memset(live, 1, (size_t)n);
  void *hin = calloc(in_n + 1, es), *hout = calloc(out_n + 1, es);
  for (size_t i = 0; i < in_n; i++)
    put(hin, i, dt, value(k->seed, c, rank, i, dt, op));
  void *din = NULL, *dout = NULL;
  CK(cudaMalloc(&din, (in_n + 1) * es), "cudaMalloc");
  CK(cudaMalloc(&dout, (out_n + 1) * es), "cudaMalloc");
  /* on the collective's stream: a pageable cudaMemcpy may return before
   * its data is in place, and a non-blocking stream does not wait for it */
  CK(cudaMemcpyAsync(din, hin, in_n * es, cudaMemcpyHostToDevice, x->s),
     "copy in");
  if (kind == BC)
    CK(cudaMemcpyAsync(dout, hin, in_n * es, cudaMemcpyHostToDevice, x->s),
       "copy in");
  mep_req_t *req = NULL;
  int rc = call(comm, kind, din, dout, count, dt, op, root, x->s, &req);
  if (rc == MEP_OK && req) rc = mep_req_wait(req, 60000);
  mep_req_free(req);
  CK(cudaStreamSynchronize(x->s), "the stream");
  CK(cudaMemcpy(hout, dout, out_n * es, cudaMemcpyDeviceToHost), "copy out");
  int bad = rc != MEP_OK;
  size_t where = 0;
  double got = 0, want = 0;
  for (size_t i = 0; !bad && i < out_n; i++) {
    got = get(hout, i, dt);
    switch (kind) {
    case AR: want = reduce_ref(k, c, i, dt, op, live); break;
    case RS: want = reduce_ref(k, c, (size_t)rank * count + i, dt, op, live);
      break;
    case AG: want = value(k->seed, c, (int)(i / (count ? count : 1)),
                          i % (count ? count : 1), dt, op);
      break;
    case A2A: want = value(k->seed, c, (int)(i / count),
                           (size_t)rank * count + i % count, dt, op);
      break;
    default: want = value(k->seed, c, root, i, dt, op); break;
    }
    if (dt == MEP_BFLOAT16 && kind != AR && kind != RS)
      want = bf2f(f2bf((float)want));
    if (!close_enough(got, want, dt)) {
      bad = 1;
      where = i;
    }
  }
  if (bad) {
    failed++;
    fprintf(stderr, "FAIL rank %d: %s %s %s count %zu: %s", rank, kname[kind],
            mep_dtype_name(dt), mep_op_name(op), count,
            rc ? mep_last_error() : "");
    if (!rc)
      fprintf(stderr, "element %zu is %.9g, want %.9g", where, got, want);
    fprintf(stderr, "\n");
  } else {
    passed++;
  }
  cudaFree(din);
  cudaFree(dout);
  free(hin);
  free(hout);
  free(live);
  return 0;
}

static int sweep(rank_ctx_t *x, mep_comm_t *comm) {
  static const mep_dtype_t dts[] = {MEP_FLOAT32, MEP_BFLOAT16, MEP_INT32,
                                    MEP_INT64, MEP_UINT8};
  static const mep_op_t ops[] = {MEP_SUM, MEP_MAX, MEP_MIN, MEP_PROD,
                                 MEP_AVG};
  size_t sizes[] = {0, 1, 7, 1000, 4099, (1u << 20) + 3,
                    x->k->big ? (size_t)64 << 20 : 0};
  int nsizes = x->k->big ? 7 : 6, c = 0;
  for (int kind = 0; kind < NKIND; kind++)
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
      for (int s = 0; s < nsizes; s++) {
        int reduces = kind == AR || kind == RS;
        for (size_t o = 0; o < (reduces ? sizeof ops / sizeof *ops : 1); o++) {
          mep_op_t op = reduces ? ops[o] : MEP_SUM;
          if (sizes[s] > 100000 && (op != MEP_SUM || dts[d] == MEP_INT64))
            continue; /* big sizes: one op per dtype is enough */
          if (one_case(x, comm, ++c, kind, dts[d], op, sizes[s])) return 1;
        }
      }
  return 0;
}

/* Captures 3 all-reduces on the stream and replays the graph 5 times
 * with new inputs copied in between. */
static int graph_test(rank_ctx_t *x, mep_comm_t *comm) {
  int rank = x->rank, n = x->n;
  const size_t count = 12345;
  float *d[4], *h = malloc(count * sizeof *h);
  for (int i = 0; i < 4; i++) CK(cudaMalloc((void **)&d[i], count * 4), "m");
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(x->s, cudaStreamCaptureModeThreadLocal), "cap");
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++)
    rc = mep_allreduce_cuda(comm, d[i], d[i + 1], count, MEP_FLOAT32, MEP_SUM,
                            x->s, NULL);
  CK(cudaStreamEndCapture(x->s, &g), "end capture");
  if (rc) {
    fprintf(stderr, "FAIL rank %d: capture: %s\n", rank, mep_last_error());
    failed++;
    return 0;
  }
  CK(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  for (int rep = 0; rep < 5; rep++) {
    for (size_t i = 0; i < count; i++)
      h[i] = (float)((int)(mix(x->k->seed + rep * 7 + rank + i * 13) % 64));
    CK(cudaMemcpyAsync(d[0], h, count * 4, cudaMemcpyHostToDevice, x->s),
       "in");
    CK(cudaGraphLaunch(ge, x->s), "replay");
    CK(cudaMemcpyAsync(h, d[3], count * 4, cudaMemcpyDeviceToHost, x->s),
       "out");
    CK(cudaStreamSynchronize(x->s), "sync");
    int bad = 0;
    for (size_t i = 0; i < count && !bad; i++) {
      double s1 = 0;
      for (int r = 0; r < n; r++)
        s1 += (double)((int)(mix(x->k->seed + rep * 7 + r + i * 13) % 64));
      double want = s1 * n * n; /* three sums of n equal inputs */
      if (h[i] != (float)want) {
        bad = 1;
        fprintf(stderr, "FAIL rank %d: graph replay %d: element %zu is %g, "
                "want %g\n", rank, rep, i, h[i], want);
      }
    }
    bad ? failed++ : passed++;
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  for (int i = 0; i < 4; i++) cudaFree(d[i]);
  free(h);
  return 0;
}

/* The last rank leaves before the third all-reduce; survivors finish. */
static int kill_test(rank_ctx_t *x, mep_comm_t *comm) {
  int rank = x->rank, n = x->n;
  const size_t count = 4099;
  int32_t *d, *h = malloc(count * 4);
  CK(cudaMalloc((void **)&d, count * 4), "m");
  for (int it = 0; it < 6; it++) {
    if (it == 2 && rank == n - 1) _exit(0);
    for (size_t i = 0; i < count; i++) h[i] = rank + 1 + (int32_t)i;
    CK(cudaMemcpyAsync(d, h, count * 4, cudaMemcpyHostToDevice, x->s),
       "in");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    mep_req_t *req = NULL;
    int rc = mep_allreduce_cuda(comm, d, d, count, MEP_INT32, MEP_SUM, x->s,
                                &req);
    if (rc == MEP_OK) rc = mep_req_wait(req, 60000);
    mep_req_free(req);
    CK(cudaStreamSynchronize(x->s), "sync");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    CK(cudaMemcpy(h, d, count * 4, cudaMemcpyDeviceToHost), "out");
    int alive = it < 2 ? n : n - 1;
    int64_t base = (int64_t)alive * (alive + 1) / 2;
    int ok = rc >= 0 && ms < 30000;
    for (size_t i = 0; ok && i < count; i++)
      ok = h[i] == (int32_t)(base + (int64_t)alive * (int64_t)i);
    if (it == 2)
      printf("rank %d: all-reduce with rank %d gone: %s in %.0f ms\n", rank,
             n - 1, rc == MEP_OK_DEGRADED ? "MEP_OK_DEGRADED"
                     : rc == MEP_OK       ? "MEP_OK"
                                          : mep_strerror(rc), ms);
    if (!ok) {
      fprintf(stderr, "FAIL rank %d: kill test, call %d: rc %d (%s), %.0f ms,"
              " element 0 = %d\n", rank, it, rc, rc < 0 ? mep_last_error()
                                                      : "", ms, h[0]);
      failed++;
    } else {
      passed++;
    }
  }
  cudaFree(d);
  free(h);
  return 0;
}

/* A crash prints its frames as module + offset (addr2line -e module). */
static void on_crash(int sig) {
  void *frames[32];
  int n = backtrace(frames, 32);
  for (int i = 0; i < n; i++) {
    Dl_info di;
    if (dladdr(frames[i], &di) && di.dli_fname)
      fprintf(stderr, "  #%d %s+%#lx (%s)\n", i, di.dli_fname,
              (unsigned long)((char *)frames[i] - (char *)di.dli_fbase),
              di.dli_sname ? di.dli_sname : "?");
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static void set_device(int rank, void *arg) {
  (void)arg;
  signal(SIGSEGV, on_crash);
  signal(SIGBUS, on_crash);
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) cudaSetDevice(rank % n);
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  rank_ctx_t x = {.k = arg, .rank = mep_comm_rank(comm),
                  .n = mep_comm_size(comm)};
  int rank = x.rank;
  CK(cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking), "stream");
  const char *path = mep_cuda_path(comm);
  if (!path) {
    fprintf(stderr, "rank %d: no CUDA path: %s\n", rank, mep_last_error());
    return 1;
  }
  if (rank == 0) printf("CUDA path: %s\n", path);
  int rc = x.k->kill ? kill_test(&x, comm)
           : x.k->graph ? graph_test(&x, comm)
                        : sweep(&x, comm);
  printf("rank %d: %d passed, %d failed\n", rank, passed, failed);
  cudaStreamDestroy(x.s);
  return rc || failed;
}

static int usage(FILE *f, int code) {
  fprintf(f, "usage: cuda_coll [-n ranks] [--path auto|kernel|staged] "
             "[--seed S] [--kill] [--graph] [--big]\n"
             "Runs the CUDA collectives of libmep across processes and "
             "checks them against a host reference.\n");
  return code;
}

int main(int argc, char **argv) {
  cfg_t k = {.n = 2, .seed = (uint64_t)time(NULL), .path = "auto"};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) k.n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--path") && i + 1 < argc) k.path = argv[++i];
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
      k.seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--kill")) k.kill = 1;
    else if (!strcmp(argv[i], "--graph")) k.graph = 1;
    else if (!strcmp(argv[i], "--big")) k.big = 1;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
      return usage(stdout, 0);
    else return usage(stderr, 2);
  }
  if (k.n < 1) return usage(stderr, 2);
  if (!gpu_usable()) {
    printf("cuda_coll: no usable GPU (or libmep built without CUDA): "
           "skipped\n");
    return 77;
  }
  setenv("MEP_CORE_CUDA_PATH", k.path, 1);
  printf("cuda_coll: %d ranks, path %s, seed %" PRIu64 "%s%s\n", k.n, k.path,
         k.seed, k.kill ? ", kill" : "", k.graph ? ", graph" : "");
  fflush(stdout);
  mep_launch_opts_t o = {.size = k.n, .timeout_ms = 540000,
                         .name = "cuda_coll", .before_comm = set_device};
  int bad = mep_launch(&o, body, &k);
  printf("%d passed, %d failed\n", bad ? 0 : 1, bad ? 1 : 0);
  return bad ? 1 : 0;
}
