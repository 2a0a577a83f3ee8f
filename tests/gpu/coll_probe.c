/* coll_probe.c - times libmep's CUDA collectives through the core C API,
 * to tell the host's cost per call from the kernels' own. One process and
 * one GPU per rank (exits 77 with fewer GPUs than ranks). For each op
 * (float32 allgather, broadcast, allreduce) and size (output bytes, as
 * scripts/bench-cuda.py counts them), the median of N timings between two
 * CUDA events on the stream, as the largest over the ranks:
 *   a: one call, then the host waits for its request (like one Python call)
 *   b: B calls queued back to back, no host wait in between; time / B
 *   c: the same B calls captured in a CUDA graph and replayed; time / B
 * Outputs are then checked against a host reference. --ws sets [core]
 * cuda_workspace_bytes: a smaller one means more rounds per launch, which
 * tells a cost per launch from a cost per round. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mep/mep.h>

#include "../../tools/common/launch.h"
#include "gpu_check.h"

enum { AG, BC, AR, NOPS };
static const char *opname[NOPS] = {"allgather", "broadcast", "allreduce"};

typedef struct cfg {
  int n, iters, batch, graph, ops[NOPS];
  size_t sizes[32];
  int nsizes;
} cfg_t;

#define CK(e, what) GPU_CK(rank, 1, e, what)
#define MCK(e, what) GPU_MEPCK(rank, 1, e, what)
#define WAIT_MS 60000

/* Polls the event until it passed, an error, or ms passed. */
static cudaError_t wait_ev(cudaEvent_t e, int ms) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    cudaError_t r = cudaEventQuery(e);
    if (r != cudaErrorNotReady) return r;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((t.tv_sec - t0.tv_sec) * 1000 > ms) return cudaErrorTimeout;
  }
}

static float value(int r, size_t i) {
  return (float)((i * 7u + (size_t)r * 13u) % 1024u);
}

static int cmp_d(const void *a, const void *b) {
  return (*(const double *)a > *(const double *)b) -
         (*(const double *)a < *(const double *)b);
}

typedef struct job {
  mep_comm_t *comm;
  int op, rank, n;
  size_t count; /* elements per call: per rank for allgather */
  float *in, *out;
  cudaStream_t s;
} job_t;

static int call(const job_t *j, mep_req_t **req) {
  switch (j->op) {
  case AG:
    return mep_allgather_cuda(j->comm, j->in, j->out, j->count, MEP_FLOAT32,
                              j->s, req);
  case BC:
    return mep_broadcast_cuda(j->comm, j->out, j->count, MEP_FLOAT32, 0, j->s,
                              req);
  default:
    return mep_allreduce_cuda(j->comm, j->in, j->out, j->count, MEP_FLOAT32,
                              MEP_SUM, j->s, req);
  }
}

/* Median microseconds per call of `iters` runs of one mode (after 3 more):
 * 'a' one call with a host wait, 'b' a batch of calls, 'c' the batch
 * captured in a graph (only the kernel path can be captured). */
static int time_mode(const job_t *j, int mode, const cfg_t *k, double *us) {
  int rank = j->rank, per = mode == 'a' ? 1 : k->batch, warm = 3, rc = 0;
  double *t = malloc(sizeof *t * (size_t)k->iters);
  cudaEvent_t e0, e1;
  cudaGraph_t g;
  cudaGraphExec_t ge = NULL;
  if (!t) return 1;
  if (mode == 'c') {
    CK(cudaStreamBeginCapture(j->s, cudaStreamCaptureModeThreadLocal),
       "cudaStreamBeginCapture");
    for (int c = 0; c < per && !rc; c++) rc = call(j, NULL);
    CK(cudaStreamEndCapture(j->s, &g), "cudaStreamEndCapture");
    MCK(rc, "capturing the batch");
    CK(cudaGraphInstantiate(&ge, g, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(g);
  }
  CK(cudaEventCreate(&e0), "cudaEventCreate");
  CK(cudaEventCreate(&e1), "cudaEventCreate");
  for (int it = -warm; it < k->iters; it++) {
    mep_req_t *req = NULL;
    CK(cudaEventRecord(e0, j->s), "cudaEventRecord");
    if (mode == 'c')
      CK(cudaGraphLaunch(ge, j->s), "cudaGraphLaunch");
    for (int c = 0; mode != 'c' && c < per; c++)
      MCK(call(j, mode == 'a' ? &req : NULL), opname[j->op]);
    CK(cudaEventRecord(e1, j->s), "cudaEventRecord");
    if (req) {
      rc = mep_req_wait(req, WAIT_MS);
      mep_req_free(req);
      MCK(rc, "waiting for the request");
    }
    CK(wait_ev(e1, WAIT_MS), "waiting for the stream");
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (it >= 0) t[it] = ms * 1e3 / per;
  }
  qsort(t, (size_t)k->iters, sizeof *t, cmp_d);
  *us = t[k->iters / 2];
  free(t);
  if (ge) cudaGraphExecDestroy(ge);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 0;
}

/* Number of elements of out that differ from the reference. */
static size_t check(const job_t *j, const float *h) {
  size_t bad = 0, n = j->op == AG ? j->count * (size_t)j->n : j->count;
  for (size_t i = 0; i < n; i++) {
    float want = j->op == AG ? value((int)(i / j->count), i % j->count)
                 : j->op == BC ? value(0, i) : 0;
    for (int r = 0; j->op == AR && r < j->n; r++) want += value(r, i);
    bad += h[i] != want;
  }
  return bad;
}

static int one(job_t *j, const cfg_t *k, size_t bytes) {
  int rank = j->rank;
  size_t elems = bytes / 4;
  j->count = j->op == AG ? elems / (size_t)j->n : elems;
  float *h = malloc(bytes);
  if (!h) return 1;
  for (size_t i = 0; i < elems; i++) h[i] = value(rank, i);
  CK(cudaMalloc((void **)&j->in, bytes), "cudaMalloc");
  CK(cudaMalloc((void **)&j->out, bytes), "cudaMalloc");
  CK(cudaMemcpy(j->in, h, bytes, cudaMemcpyHostToDevice), "upload");
  CK(cudaMemcpy(j->out, h, bytes, cudaMemcpyHostToDevice), "upload");
  double us[3] = {0, 0, 0}, worst[3];
  for (int m = 0; m < 2 + k->graph; m++) {
    MCK(mep_barrier(j->comm, NULL), "barrier");
    if (time_mode(j, "abc"[m], k, &us[m])) return 1;
  }
  CK(cudaMemcpy(h, j->out, bytes, cudaMemcpyDeviceToHost), "download");
  size_t bad = check(j, h);
  if (bad)
    fprintf(stderr, "FAIL rank %d: %s of %zu bytes: %zu elements wrong\n",
            rank, opname[j->op], bytes, bad);
  MCK(mep_allreduce(j->comm, us, worst, 3, MEP_FLOAT64, MEP_MAX, NULL),
      "gathering the timings");
  /* bus bandwidth as nccl-tests define it */
  double f = j->op == BC ? 1.0
                         : (j->op == AR ? 2.0 : 1.0) * (j->n - 1) / j->n;
  double bw = worst[2] > 0 ? (double)bytes * f / (worst[2] * 1e3) : 0;
  if (rank == 0)
    printf("| %zu KiB | %.1f | %.1f | %.1f | %.2f |\n", bytes >> 10, worst[0],
           worst[1], worst[2], bw);
  fflush(stdout);
  cudaFree(j->in);
  cudaFree(j->out);
  free(h);
  return bad != 0;
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  cfg_t kk = *(const cfg_t *)arg, *k = &kk;
  job_t j = {.comm = comm, .rank = mep_comm_rank(comm),
             .n = mep_comm_size(comm)};
  int rank = j.rank, bad = 0;
  CK(cudaStreamCreateWithFlags(&j.s, cudaStreamNonBlocking), "stream");
  const char *path = mep_cuda_path(comm);
  if (!path) MCK(MEP_ERR_UNSUPPORTED, "mep_cuda_path");
  kk.graph = strcmp(path, "kernel") == 0; /* the staged path has no c */
  for (j.op = 0; j.op < NOPS; j.op++) {
    if (!k->ops[j.op]) continue;
    if (rank == 0)
      printf("\n#### %s (%d ranks, %s path, batch %d, median of %d)\n\n"
             "| size | a us | b us | c us | busbw(c) GB/s |\n"
             "|---:|---:|---:|---:|---:|\n", opname[j.op], j.n, path,
             k->batch, k->iters);
    for (int s = 0; s < k->nsizes; s++) bad |= one(&j, k, k->sizes[s]);
  }
  cudaStreamDestroy(j.s);
  return bad;
}

static void set_device(int rank, void *arg) {
  (void)arg;
  cudaSetDevice(rank); /* before the communicator: nvlink binds to it */
}

/* Asked in a child: the parent must not touch CUDA before forking ranks. */
static int enough_gpus(int n) {
  pid_t pid = fork();
  if (pid == 0) {
    int c = 0;
    _exit(mep_cuda_available() && cudaGetDeviceCount(&c) == cudaSuccess &&
                  c >= n ? 0 : 1);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return 0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int usage(FILE *f, int code) {
  fprintf(f, "usage: coll_probe [-n ranks (2)] [--iters N (50)] [--batch B "
             "(20)] [--sizes 256K,2M,...] [--ops allgather,broadcast,"
             "allreduce] [--ws BYTES] [--path auto|kernel|staged]\n"
             "Times libmep's CUDA collectives: one call with a host wait (a), "
             "B calls back to back (b), B calls replayed from a CUDA graph "
             "(c); one GPU per rank.\n");
  return code;
}

/* "64M" -> 64 << 20; 0 when not a size. */
static size_t parse_size(const char *s) {
  static const char units[] = "KMG";
  char *end;
  size_t v = strtoull(s, &end, 0);
  const char *u = *end ? strchr(units, *end & ~0x20) : NULL;
  return !*end ? v : u && !end[1] ? v << (10 * (u - units + 1)) : 0;
}

int main(int argc, char **argv) {
  static const size_t def[] = {256 << 10, 512 << 10, 1 << 20, 2 << 20,
                               8 << 20, 64 << 20};
  cfg_t k = {.n = 2, .iters = 50, .batch = 20, .ops = {1, 1, 1}, .nsizes = 6};
  memcpy(k.sizes, def, sizeof def);
  const char *path = "kernel";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, 0);
    if (!v) return usage(stderr, 2);
    i++;
    if (!strcmp(a, "-n")) k.n = atoi(v);
    else if (!strcmp(a, "--iters")) k.iters = atoi(v);
    else if (!strcmp(a, "--batch")) k.batch = atoi(v);
    else if (!strcmp(a, "--ws")) setenv("MEP_CORE_CUDA_WORKSPACE_BYTES", v, 1);
    else if (!strcmp(a, "--path")) path = v;
    else if (!strcmp(a, "--ops"))
      for (int o = 0; o < NOPS; o++) k.ops[o] = strstr(v, opname[o]) != NULL;
    else if (!strcmp(a, "--sizes")) {
      char *dup = strdup(v), *save = NULL;
      k.nsizes = 0;
      for (char *t = strtok_r(dup, ",", &save); t && k.nsizes < 32;
           t = strtok_r(NULL, ",", &save))
        k.sizes[k.nsizes++] = parse_size(t);
      free(dup);
    } else return usage(stderr, 2);
  }
  int ok = k.n >= 1 && k.iters >= 1 && k.batch >= 1;
  for (int s = 0; ok && s < k.nsizes; s++)
    ok = k.sizes[s] && k.sizes[s] % (4 * (size_t)k.n) == 0;
  if (!ok) return usage(stderr, 2); /* sizes: multiples of 4 x ranks */
  if (!enough_gpus(k.n)) {
    printf("coll_probe: needs %d GPUs (one per rank) and libmep with CUDA: "
           "skipped\n", k.n);
    return 77;
  }
  setenv("MEP_CORE_CUDA_PATH", path, 1);
  mep_launch_opts_t o = {.size = k.n, .timeout_ms = 540000,
                         .name = "coll_probe", .before_comm = set_device};
  int bad = mep_launch(&o, body, &k);
  printf("\ncoll_probe: %s\n", bad ? "FAILED" : "passed");
  return bad ? 1 : 0;
}
