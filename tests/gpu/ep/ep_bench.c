/* ep_bench.c - latency of the EP CUDA path's dispatch and combine, in
 * DeepEP's low-latency setting by default: 128 tokens per rank, hidden
 * 7168, top-8, 256 experts, FP8 dispatch, BF16 combine.
 *
 *   ep_bench [-n ranks] [--tokens T] [--hidden H] [--experts E]
 *            [--topk K] [--iters N] [--bf16] [--split] [--burst N]
 *            [--zero-copy]
 *
 * Each rank times every call with CUDA events on its stream (after 20
 * warm-up calls) and prints the median and the 90th percentile of
 * dispatch and combine, with the bytes each call moved from this rank
 * (messages of the tokens' top-k experts) over the median. Ranks use GPU
 * rank % (GPUs). Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mep/ep.h>
#include <mep/mep.h>

#include "../../../tools/common/launch.h"
#include "../gpu_check.h"
#include "../gpu_probe.h"

typedef struct opts {
  int n, tokens, hidden, experts, topk, iters, bf16, split, burst, zcopy;
} opts_t;

#define WARMUP 20

#define CK(e, what) GPU_CK(rank, 1, e, what)

#define MEPCK(e, what) GPU_MEPCK(rank, 1, e, what)

static uint64_t next(uint64_t *s) {
  uint64_t x = (*s += 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

static float pct(float *v, int n, double p) {
  qsort(v, (size_t)n, sizeof *v, cmp_float);
  int i = (int)(p * (n - 1) + 0.5);
  return v[i];
}

/* Queues one iteration (dispatch, then combine; as their two phases
 * each with --split) with events ev[0..4] around and between them. */
static int queue_one(int rank, mep_ep_buffer_t *ep, int split,
                     cudaStream_t s, cudaEvent_t *ev,
                     const mep_ep_dispatch_args_t *da,
                     const mep_ep_dispatch_args_t *dp,
                     const mep_ep_combine_args_t *ca,
                     const mep_ep_combine_args_t *cp) {
  CK(cudaEventRecord(ev[0], s), "record");
  if (split) {
    MEPCK(mep_ep_dispatch(ep, &dp[0]), "mep_ep_dispatch send");
    CK(cudaEventRecord(ev[3], s), "record");
    MEPCK(mep_ep_dispatch(ep, &dp[1]), "mep_ep_dispatch recv");
  } else {
    MEPCK(mep_ep_dispatch(ep, da), "mep_ep_dispatch");
  }
  CK(cudaEventRecord(ev[1], s), "record");
  if (split) {
    MEPCK(mep_ep_combine(ep, &cp[0]), "mep_ep_combine send");
    CK(cudaEventRecord(ev[4], s), "record");
    MEPCK(mep_ep_combine(ep, &cp[1]), "mep_ep_combine recv");
  } else {
    MEPCK(mep_ep_combine(ep, ca), "mep_ep_combine");
  }
  CK(cudaEventRecord(ev[2], s), "record");
  return 0;
}

/* Iteration it's times from its (completed) events. */
static int record_one(int rank, int split, cudaEvent_t *ev, int it,
                      float *td, float *tc, float *const *tp) {
  CK(cudaEventElapsedTime(&td[it], ev[0], ev[1]), "elapsed");
  CK(cudaEventElapsedTime(&tc[it], ev[1], ev[2]), "elapsed");
  if (!split) return 0;
  CK(cudaEventElapsedTime(&tp[0][it], ev[0], ev[3]), "elapsed");
  CK(cudaEventElapsedTime(&tp[1][it], ev[3], ev[1]), "elapsed");
  CK(cudaEventElapsedTime(&tp[2][it], ev[1], ev[4]), "elapsed");
  CK(cudaEventElapsedTime(&tp[3][it], ev[4], ev[2]), "elapsed");
  return 0;
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  const opts_t *o = arg;
  int rank = mep_comm_rank(comm), n = mep_comm_size(comm);
  int T = o->tokens, H = o->hidden, E = o->experts, K = o->topk;
  int L = E / n;
  size_t S = (size_t)n * T;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  mep_ep_config_t cfg = {.struct_size = sizeof cfg, .max_tokens_per_rank = T,
                         .hidden = H, .num_experts = E, .flags = MEP_EP_CUDA};
  mep_ep_buffer_t *ep = NULL;
  MEPCK(mep_ep_buffer_create(comm, &cfg, &ep), "mep_ep_buffer_create");

  /* inputs: random bf16 rows, distinct random experts per token */
  uint64_t seed = 12345u + (uint64_t)rank * 7919u;
  uint16_t *hx = malloc((size_t)T * H * 2);
  int64_t *hidx = malloc((size_t)T * K * 8);
  float *hw = malloc((size_t)T * K * 4);
  int *perm = malloc(sizeof(int) * (size_t)E);
  for (size_t i = 0; i < (size_t)T * H; i++)
    hx[i] = (uint16_t)(0x3c00u + next(&seed) % 0x0400u); /* 2^-7 .. 2^-6 */
  for (int t = 0; t < T; t++) {
    for (int e = 0; e < E; e++) perm[e] = e;
    for (int k = 0; k < K; k++) {
      int j = k + (int)(next(&seed) % (uint64_t)(E - k));
      int tmp = perm[k];
      perm[k] = perm[j];
      perm[j] = tmp;
      hidx[(size_t)t * K + k] = perm[k];
      hw[(size_t)t * K + k] = 1.0f / (float)K;
    }
  }
  void *x, *recv_x, *scales, *comb_x, *out;
  int64_t *idx, *lr;
  float *w;
  int32_t *si, *cnt;
  CK(cudaMalloc(&x, (size_t)T * H * 2), "cudaMalloc");
  CK(cudaMalloc((void **)&idx, (size_t)T * K * 8), "cudaMalloc");
  CK(cudaMalloc((void **)&w, (size_t)T * K * 4), "cudaMalloc");
  CK(cudaMalloc(&recv_x, (size_t)L * S * H * 2), "cudaMalloc");
  CK(cudaMalloc(&scales, (size_t)L * S * (H / 128) * 4), "cudaMalloc");
  CK(cudaMalloc((void **)&si, (size_t)L * S * 4), "cudaMalloc");
  CK(cudaMalloc((void **)&lr, (size_t)L * n * 8), "cudaMalloc");
  CK(cudaMalloc((void **)&cnt, (size_t)L * 4), "cudaMalloc");
  CK(cudaMalloc(&comb_x, (size_t)L * S * H * 2), "cudaMalloc");
  CK(cudaMalloc(&out, (size_t)T * H * 2), "cudaMalloc");
  CK(cudaMemcpyAsync(x, hx, (size_t)T * H * 2, cudaMemcpyHostToDevice, s),
     "copy");
  CK(cudaMemcpyAsync(idx, hidx, (size_t)T * K * 8, cudaMemcpyHostToDevice,
                     s), "copy");
  CK(cudaMemcpyAsync(w, hw, (size_t)T * K * 4, cudaMemcpyHostToDevice, s),
     "copy");
  CK(cudaMemsetAsync(comb_x, 0x3c, (size_t)L * S * H * 2, s), "memset");
  CK(cudaStreamSynchronize(s), "sync");

  unsigned dflags = o->bf16 ? 0 : MEP_EP_FP8;
  mep_ep_dispatch_args_t da = {
      .struct_size = sizeof da, .x = x, .topk_idx = idx, .num_tokens = T,
      .num_topk = K, .flags = dflags, .recv_x = recv_x,
      .recv_scales = o->bf16 ? NULL : scales, .recv_src_info = si,
      .recv_layout_range = lr, .recv_count = cnt, .stream = s};
  /* --zero-copy: the experts' outputs are already in the combine
   * buffer (what they hold does not matter to the timing) */
  mep_ep_combine_args_t ca = {
      .struct_size = sizeof ca,
      .x = o->zcopy ? mep_ep_combine_buffer(ep) : comb_x, .topk_idx = idx,
      .topk_weights = w, .src_info = si, .layout_range = lr,
      .num_tokens = T, .num_topk = K,
      .flags = o->zcopy ? MEP_EP_ZERO_COPY : 0, .out = out, .stream = s};
  /* --split: each call as its send and receive phases, timed apart
   * (events between them), to see where the time goes */
  /* --burst N: N iterations queued before the host waits, events
   * between the calls: after the first, the ranks wait for each other
   * only through the data (no skew of the hosts' start times) */
  const int B = o->burst;
  cudaEvent_t *evs = malloc(sizeof(cudaEvent_t) * 5 * (size_t)B);
  for (int i = 0; i < 5 * B; i++) CK(cudaEventCreate(&evs[i]), "event");
  float *td = malloc(sizeof(float) * (size_t)o->iters);
  float *tc = malloc(sizeof(float) * (size_t)o->iters);
  float *tp[4];
  for (int i = 0; i < 4; i++) tp[i] = malloc(sizeof(float) * (size_t)o->iters);
  mep_ep_dispatch_args_t dp[2] = {da, da};
  mep_ep_combine_args_t cp[2] = {ca, ca};
  dp[0].flags |= MEP_EP_SEND;
  dp[1].flags |= MEP_EP_RECV;
  cp[0].flags |= MEP_EP_SEND;
  cp[1].flags |= MEP_EP_RECV;
  for (int it0 = -WARMUP; it0 < o->iters; it0 += B) {
    for (int j = 0; j < B; j++)
      if (queue_one(rank, ep, o->split, s, evs + 5 * j, &da, dp, &ca, cp))
        return 1;
    CK(cudaEventSynchronize(evs[5 * B - 3]), "sync");
    for (int j = 0; j < B; j++) {
      int it = it0 + j;
      if (it >= 0 && it < o->iters &&
          record_one(rank, o->split, evs + 5 * j, it, td, tc, tp))
        return 1;
    }
  }
  if (o->split)
    printf("rank %d: phases (median us): dispatch send %.1f, receive %.1f; "
           "combine send %.1f, receive %.1f\n", rank,
           pct(tp[0], o->iters, 0.5) * 1e3, pct(tp[1], o->iters, 0.5) * 1e3,
           pct(tp[2], o->iters, 0.5) * 1e3, pct(tp[3], o->iters, 0.5) * 1e3);
  int32_t *act = malloc(sizeof(int32_t) * (size_t)n);
  CK(cudaMemcpy(act, mep_ep_active_ranks(ep), sizeof(int32_t) * (size_t)n,
                cudaMemcpyDeviceToHost), "copy active");
  int lost = 0;
  for (int p = 0; p < n; p++) lost += !act[p];
  /* bytes this rank sent per call: one message per (token, expert) */
  double msg = o->bf16 ? 2.0 * H : H + H / 128 * 4.0;
  double dbytes = (double)T * K * msg, cbytes = (double)T * K * 2.0 * H;
  float dmed = pct(td, o->iters, 0.5), d90 = pct(td, o->iters, 0.9);
  float cmed = pct(tc, o->iters, 0.5), c90 = pct(tc, o->iters, 0.9);
  printf("rank %d: dispatch (%s) median %.1f us (p90 %.1f), %.1f GB/s; "
         "combine (bf16%s) median %.1f us (p90 %.1f), %.1f GB/s%s%s\n", rank,
         o->bf16 ? "bf16" : "fp8", dmed * 1e3, d90 * 1e3,
         dbytes / (dmed * 1e-3) / 1e9, o->zcopy ? ", zero-copy" : "",
         cmed * 1e3, c90 * 1e3,
         cbytes / (cmed * 1e-3) / 1e9,
         B > 1 ? " (calls in a row)" : "",
         lost ? " (RANKS WERE CLEARED: a timeout)" : "");
  /* a rank is a forked child that ends with _exit (launch.c): stdout
   * into a file or pipe is fully buffered and would be dropped */
  fflush(stdout);
  mep_req_t *req = NULL;
  int rc = mep_barrier(comm, &req);
  if (rc == MEP_OK && req) rc = mep_req_wait(req, -1);
  mep_req_free(req);
  mep_ep_buffer_destroy(ep);
  cudaFree(x);
  cudaFree(idx);
  cudaFree(w);
  cudaFree(recv_x);
  cudaFree(scales);
  cudaFree(si);
  cudaFree(lr);
  cudaFree(cnt);
  cudaFree(comb_x);
  cudaFree(out);
  free(hx);
  free(hidx);
  free(hw);
  free(perm);
  free(td);
  free(tc);
  for (int i = 0; i < 4; i++) free(tp[i]);
  free(act);
  for (int i = 0; i < 5 * B; i++) cudaEventDestroy(evs[i]);
  free(evs);
  cudaStreamDestroy(s);
  return lost != 0 || rc < 0;
}

static void set_device(int rank, void *arg) {
  (void)arg;
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) cudaSetDevice(rank % n);
}

static int usage(FILE *f, int code) {
  fprintf(f, "usage: ep_bench [-n ranks] [--tokens T] [--hidden H] "
             "[--experts E] [--topk K] [--iters N] [--bf16] [--split]\n"
             "               [--burst N] [--zero-copy]\n"
             "Median latency of the EP CUDA path's dispatch (FP8, or BF16 "
             "with --bf16) and\ncombine (BF16); defaults: 2 ranks, 128 "
             "tokens, hidden 7168, 256 experts,\ntop-8, 200 iterations. "
             "--split also times each call's send and\nreceive phases "
             "apart. --burst N queues N iterations before waiting\n(events "
             "between the calls; default 1). --zero-copy: combine "
             "from the combine buffer.\n");
  return code;
}

int main(int argc, char **argv) {
  opts_t o = {.n = 2, .tokens = 128, .hidden = 7168, .experts = 256,
              .topk = 8, .iters = 200, .burst = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int more = i + 1 < argc;
    if (!strcmp(a, "-n") && more) o.n = atoi(argv[++i]);
    else if (!strcmp(a, "--tokens") && more) o.tokens = atoi(argv[++i]);
    else if (!strcmp(a, "--hidden") && more) o.hidden = atoi(argv[++i]);
    else if (!strcmp(a, "--experts") && more) o.experts = atoi(argv[++i]);
    else if (!strcmp(a, "--topk") && more) o.topk = atoi(argv[++i]);
    else if (!strcmp(a, "--iters") && more) o.iters = atoi(argv[++i]);
    else if (!strcmp(a, "--bf16")) o.bf16 = 1;
    else if (!strcmp(a, "--split")) o.split = 1;
    else if (!strcmp(a, "--zero-copy")) o.zcopy = 1;
    else if (!strcmp(a, "--burst") && more) o.burst = atoi(argv[++i]);
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, 0);
    else return usage(stderr, 2);
  }
  if (o.n < 1 || o.tokens < 1 || o.iters < 1 || o.topk < 1 || o.burst < 1 ||
      o.topk > MEP_EP_MAX_TOPK || o.experts < o.n || o.experts % o.n ||
      o.topk > o.experts || o.hidden < 128 || o.hidden % 128)
    return usage(stderr, 2);
  if (!gpu_usable()) {
    printf("ep_bench: no usable GPU (or libmep built without CUDA): "
           "skipped\n");
    return 77;
  }
  printf("ep_bench: %d ranks, %d tokens, hidden %d, %d experts, top-%d, "
         "%d iterations, transports %s\n", o.n, o.tokens, o.hidden,
         o.experts, o.topk, o.iters,
         getenv("MEP_TRANSPORTS") ? getenv("MEP_TRANSPORTS") : "default");
  fflush(stdout);
  mep_launch_opts_t lo = {.size = o.n, .timeout_ms = 570000,
                          .name = "ep_bench", .before_comm = set_device};
  return mep_launch(&lo, body, &o) ? 1 : 0;
}
