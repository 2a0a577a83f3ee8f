/* ep_cuda_test.c - the CUDA path of the EP frontend (mep/ep.h) across
 * forked ranks, against the independent host reference of tests/ep
 * (ep_ref.h): every rank regenerates every rank's inputs from the seed and
 * checks its own dispatch outputs (per expert the set of (source, token),
 * each row's data and scales, layout_range, recv_count) and its combine
 * output (the experts being ep_ref_expert_rows, applied on the host).
 *
 *   ep_cuda_test [-n ranks] [--case NAME] [--quick] [--seed S] [--help]
 *
 * Cases (all by default):
 *   sweep     hidden 128..7168 (2048, 4096, 7168, 1152, 512, 1024, ...),
 *             top-k 1..16, 1..1024 experts per rank, BF16, FP8,
 *             round_scale, UE8M0; two calls per shape (both halves);
 *             tokens per rank 0, 1, odd and max, varying by rank and call
 *   phases    dispatch and combine in two phases (SEND, another kernel,
 *             RECV)
 *   zerocopy  combine from mep_ep_combine_buffer (MEP_EP_ZERO_COPY)
 *   mixed     ranks differ within a call: one phase or two, zero-copy or
 *             not (pulling and pushing ranks meet)
 *   repeat    three dispatches back to back without a host sync, then
 *             three combines
 *   graph     dispatch and combine captured in CUDA graphs, replayed 3
 *             times with new inputs copied into the captured buffers
 *   env       MEP_EP_COMBINE_PARTIAL: bad values refused at creation
 *             (MEP_ERR_INVALID), good ones taken
 *   fault     the last rank never calls dispatch: the others return within
 *             the timeout + a margin, clear it in active_ranks, and their
 *             results over the rest are right
 *
 * Ranks use GPU rank % (GPUs), so several share one GPU or spread over
 * several. MEP_TRANSPORTS=tcp forces the proxy path. Exits 77 without a
 * usable GPU. Prints "N passed, N failed" per rank. */
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mep/ep.h>
#include <mep/mep.h>

#include "../../../tools/common/launch.h"
#include "../gpu_check.h"
#include "../gpu_probe.h"
#include "ep_ref.h"

typedef struct opts {
  int n, quick;
  const char *only;
  uint64_t seed;
} opts_t;

typedef struct rt {
  const opts_t *o;
  int rank, n;
  mep_comm_t *comm;
  cudaStream_t s;
  int passed, failed;
} rt_t;

/* One shape of buffer and the call flags to use with it. */
typedef struct shape {
  int hidden, local, topk, tokens;
  unsigned flags;
} shape_t;

#define SETS 3 /* input and output sets (back-to-back calls) */

/* A buffer and everything one call needs, on the device and on the host,
 * sized for the shape's largest call. */
typedef struct bench {
  ep_case_t c[SETS];
  int ntok[SETS];
  mep_ep_buffer_t *ep;
  size_t x_b, idx_b, w_b, rx_b, sc_b, si_b, lr_b, cnt_b, cx_b, out_b;
  void *x[SETS], *recv_x[SETS], *scales[SETS], *comb_x[SETS], *out[SETS];
  int64_t *idx[SETS], *lr[SETS];
  float *w[SETS];
  int32_t *src_info[SETS], *cnt[SETS];
  /* host */
  uint16_t *hx, *hcomb, *hout;
  int64_t *hidx, *hlr;
  float *hw;
  void *hrx, *hsc;
  int32_t *hsi, *hcnt, *hact;
} bench_t;

#define CK(e, what) GPU_CK(r->rank, -1, e, what)

#define MEPCK(e, what) GPU_MEPCK(r->rank, -1, e, what)

static void verdict(rt_t *r, int bad, const char *what, const ep_case_t *c,
                    const char *why) {
  if (!bad) {
    r->passed++;
    return;
  }
  r->failed++;
  fprintf(stderr, "FAIL rank %d: %s (ranks %d, tokens %d, hidden %d, "
          "experts %d, topk %d, flags 0x%x, seed %" PRIu64 "): %s\n",
          r->rank, what, c->ranks, c->max_tokens, c->hidden, c->experts,
          c->topk, c->flags, c->seed, why);
}

static int barrier(rt_t *r) {
  mep_req_t *req = NULL;
  int rc = mep_barrier(r->comm, &req);
  if (rc == MEP_OK && req) rc = mep_req_wait(req, -1);
  mep_req_free(req);
  MEPCK(rc, "barrier");
  return 0;
}

static void bench_free(bench_t *b) {
  for (int i = 0; i < SETS; i++) {
    cudaFree(b->x[i]);
    cudaFree(b->idx[i]);
    cudaFree(b->w[i]);
    cudaFree(b->recv_x[i]);
    cudaFree(b->scales[i]);
    cudaFree(b->src_info[i]);
    cudaFree(b->lr[i]);
    cudaFree(b->cnt[i]);
    cudaFree(b->comb_x[i]);
    cudaFree(b->out[i]);
  }
  free(b->hx);
  free(b->hcomb);
  free(b->hout);
  free(b->hidx);
  free(b->hlr);
  free(b->hw);
  free(b->hrx);
  free(b->hsc);
  free(b->hsi);
  free(b->hcnt);
  free(b->hact);
  mep_ep_buffer_destroy(b->ep);
  memset(b, 0, sizeof *b);
}

/* Creates the buffer (collective) and the arrays of `sets` sets. */
static int bench_open(rt_t *r, bench_t *b, const shape_t *sh, int sets,
                      int64_t timeout_us) {
  memset(b, 0, sizeof *b);
  size_t T = (size_t)sh->tokens, H = (size_t)sh->hidden,
         K = (size_t)sh->topk, L = (size_t)sh->local, R = (size_t)r->n;
  size_t S = R * T, G = H / 128;
  b->x_b = T * H * 2;
  b->idx_b = T * K * 8;
  b->w_b = T * K * 4;
  b->rx_b = L * S * H * 2;
  b->sc_b = L * G * S * 4;
  b->si_b = L * S * 4;
  b->lr_b = L * R * 8;
  b->cnt_b = L * 4;
  b->cx_b = L * S * H * 2;
  b->out_b = T * H * 2;
  mep_ep_config_t cfg = {.struct_size = sizeof cfg,
                         .max_tokens_per_rank = sh->tokens,
                         .hidden = sh->hidden,
                         .num_experts = sh->local * r->n,
                         .flags = MEP_EP_CUDA,
                         .timeout_us = timeout_us};
  MEPCK(mep_ep_buffer_create(r->comm, &cfg, &b->ep), "mep_ep_buffer_create");
  for (int i = 0; i < sets; i++) {
    CK(cudaMalloc(&b->x[i], b->x_b + 16), "cudaMalloc x");
    CK(cudaMalloc((void **)&b->idx[i], b->idx_b + 16), "cudaMalloc idx");
    CK(cudaMalloc((void **)&b->w[i], b->w_b + 16), "cudaMalloc w");
    CK(cudaMalloc(&b->recv_x[i], b->rx_b + 16), "cudaMalloc recv_x");
    CK(cudaMalloc(&b->scales[i], b->sc_b + 16), "cudaMalloc scales");
    CK(cudaMalloc((void **)&b->src_info[i], b->si_b + 16), "cudaMalloc si");
    CK(cudaMalloc((void **)&b->lr[i], b->lr_b + 16), "cudaMalloc lr");
    CK(cudaMalloc((void **)&b->cnt[i], b->cnt_b + 16), "cudaMalloc cnt");
    CK(cudaMalloc(&b->comb_x[i], b->cx_b + 16), "cudaMalloc comb_x");
    CK(cudaMalloc(&b->out[i], b->out_b + 16), "cudaMalloc out");
  }
  b->hx = malloc(b->x_b + 16);
  b->hidx = malloc(b->idx_b + 16);
  b->hw = malloc(b->w_b + 16);
  b->hrx = malloc(b->rx_b + 16);
  b->hsc = malloc(b->sc_b + 16);
  b->hsi = malloc(b->si_b + 16);
  b->hlr = malloc(b->lr_b + 16);
  b->hcnt = malloc(b->cnt_b + 16);
  b->hcomb = malloc(b->cx_b + 16);
  b->hout = malloc(b->out_b + 16);
  b->hact = malloc(R * 4 + 16);
  if (!b->hx || !b->hidx || !b->hw || !b->hrx || !b->hsc || !b->hsi ||
      !b->hlr || !b->hcnt || !b->hcomb || !b->hout || !b->hact) {
    fprintf(stderr, "rank %d: out of host memory\n", r->rank);
    return -1;
  }
  return 0;
}

static ep_case_t make_case(const rt_t *r, const shape_t *sh, uint64_t seed) {
  ep_case_t c = {.ranks = r->n, .max_tokens = sh->tokens,
                 .hidden = sh->hidden, .experts = sh->local * r->n,
                 .topk = sh->topk, .flags = sh->flags & (MEP_EP_FP8 |
                 MEP_EP_ROUND_SCALE | MEP_EP_UE8M0), .seed = seed};
  return c;
}

/* Inputs of case c into set i, and the set's outputs poisoned (a row the
 * kernels should write and do not shows). */
static int upload(rt_t *r, bench_t *b, int i, const ep_case_t *c) {
  b->c[i] = *c;
  int n = b->ntok[i] = ep_ref_num_tokens(c, r->rank);
  ep_ref_inputs(c, r->rank, b->hx, b->hidx, b->hw);
  size_t H = (size_t)c->hidden, K = (size_t)c->topk;
  CK(cudaMemcpyAsync(b->x[i], b->hx, (size_t)n * H * 2,
                     cudaMemcpyHostToDevice, r->s), "copy x");
  CK(cudaMemcpyAsync(b->idx[i], b->hidx, (size_t)n * K * 8,
                     cudaMemcpyHostToDevice, r->s), "copy topk_idx");
  CK(cudaMemcpyAsync(b->w[i], b->hw, (size_t)n * K * 4,
                     cudaMemcpyHostToDevice, r->s), "copy weights");
  CK(cudaMemsetAsync(b->recv_x[i], 0xff, b->rx_b, r->s), "poison");
  CK(cudaMemsetAsync(b->scales[i], 0xff, b->sc_b, r->s), "poison");
  CK(cudaMemsetAsync(b->src_info[i], 0xff, b->si_b, r->s), "poison");
  CK(cudaMemsetAsync(b->lr[i], 0xff, b->lr_b, r->s), "poison");
  CK(cudaMemsetAsync(b->cnt[i], 0xff, b->cnt_b, r->s), "poison");
  CK(cudaMemsetAsync(b->out[i], 0xff, b->out_b, r->s), "poison");
  /* the host copies are read by the copies above: wait before reuse */
  CK(cudaStreamSynchronize(r->s), "upload");
  return 0;
}

static int dispatch(rt_t *r, bench_t *b, int i, unsigned phase) {
  mep_ep_dispatch_args_t a = {
      .struct_size = sizeof a, .x = b->x[i], .topk_idx = b->idx[i],
      .num_tokens = b->ntok[i], .num_topk = b->c[i].topk,
      .flags = b->c[i].flags | phase, .recv_x = b->recv_x[i],
      .recv_scales = (b->c[i].flags & MEP_EP_FP8) ? b->scales[i] : NULL,
      .recv_src_info = b->src_info[i], .recv_layout_range = b->lr[i],
      .recv_count = b->cnt[i], .stream = r->s};
  MEPCK(mep_ep_dispatch(b->ep, &a), "mep_ep_dispatch");
  return 0;
}

static int combine(rt_t *r, bench_t *b, int i, unsigned flags) {
  mep_ep_combine_args_t a = {
      .struct_size = sizeof a,
      .x = (flags & MEP_EP_ZERO_COPY) ? mep_ep_combine_buffer(b->ep)
                                      : b->comb_x[i],
      .topk_idx = b->idx[i], .topk_weights = b->w[i],
      .src_info = b->src_info[i], .layout_range = b->lr[i],
      .num_tokens = b->ntok[i], .num_topk = b->c[i].topk, .flags = flags,
      .out = b->out[i], .stream = r->s};
  MEPCK(mep_ep_combine(b->ep, &a), "mep_ep_combine");
  return 0;
}

static int fetch_active(rt_t *r, bench_t *b) {
  CK(cudaMemcpyAsync(b->hact, mep_ep_active_ranks(b->ep),
                     (size_t)r->n * 4, cudaMemcpyDeviceToHost, r->s),
     "copy active");
  CK(cudaStreamSynchronize(r->s), "active");
  return 0;
}

/* Checks set i's dispatch, then prepares its combine input (the experts
 * applied on the host) in comb_x[i] or the zero-copy buffer. */
static int check_dispatch(rt_t *r, bench_t *b, int i, int zero_copy,
                          const char *what) {
  CK(cudaStreamSynchronize(r->s), "dispatch");
  CK(cudaMemcpy(b->hrx, b->recv_x[i], b->rx_b, cudaMemcpyDeviceToHost),
     "copy recv_x");
  CK(cudaMemcpy(b->hsc, b->scales[i], b->sc_b, cudaMemcpyDeviceToHost),
     "copy scales");
  CK(cudaMemcpy(b->hsi, b->src_info[i], b->si_b, cudaMemcpyDeviceToHost),
     "copy src_info");
  CK(cudaMemcpy(b->hlr, b->lr[i], b->lr_b, cudaMemcpyDeviceToHost),
     "copy layout_range");
  CK(cudaMemcpy(b->hcnt, b->cnt[i], b->cnt_b, cudaMemcpyDeviceToHost),
     "copy recv_count");
  if (fetch_active(r, b)) return -1;
  char why[512] = "";
  const ep_case_t *c = &b->c[i];
  int fp8 = (c->flags & MEP_EP_FP8) != 0;
  int bad = ep_ref_check_dispatch(c, r->rank, b->hact, b->hrx,
                                  fp8 ? b->hsc : NULL, b->hsi, b->hlr,
                                  b->hcnt, why, sizeof why);
  verdict(r, bad, what, c, why);
  memset(b->hcomb, 0, b->cx_b);
  ep_ref_expert_rows(c, r->rank, b->hrx, fp8 ? b->hsc : NULL, b->hlr,
                     b->hcomb);
  void *dst = zero_copy ? mep_ep_combine_buffer(b->ep) : b->comb_x[i];
  /* on the stream: a pageable cudaMemcpy may return before its data is
   * in place, and the non-blocking stream would not wait for it */
  CK(cudaMemcpyAsync(dst, b->hcomb, b->cx_b, cudaMemcpyHostToDevice, r->s),
     "copy expert rows");
  CK(cudaStreamSynchronize(r->s), "copy expert rows");
  return 0;
}

static int check_combine(rt_t *r, bench_t *b, int i, const char *what) {
  CK(cudaStreamSynchronize(r->s), "combine");
  CK(cudaMemcpy(b->hout, b->out[i], (size_t)b->ntok[i] * b->c[i].hidden * 2,
                cudaMemcpyDeviceToHost), "copy out");
  if (fetch_active(r, b)) return -1;
  char why[512] = "";
  int bad = ep_ref_check_combine(&b->c[i], r->rank, b->hact, b->hout, why,
                                 sizeof why);
  verdict(r, bad, what, &b->c[i], why);
  return 0;
}

/* Every rank still active: a case without faults must not lose any. */
static void check_all_active(rt_t *r, bench_t *b, const char *what) {
  for (int p = 0; p < r->n; p++)
    if (!b->hact[p]) {
      char why[128];
      snprintf(why, sizeof why, "rank %d was cleared in active_ranks "
               "(timed out) in a case without faults", p);
      verdict(r, 1, what, &b->c[0], why);
      return;
    }
}

/* One dispatch and combine, in one call each or in two phases with other
 * work between them. */
static int round_trip(rt_t *r, bench_t *b, const ep_case_t *c, int phases,
                      int zero_copy, const char *what) {
  char name[96];
  if (upload(r, b, 0, c)) return -1;
  if (!phases) {
    if (dispatch(r, b, 0, 0)) return -1;
  } else {
    if (dispatch(r, b, 0, MEP_EP_SEND)) return -1;
    CK(cudaMemsetAsync(b->comb_x[0], 0, b->cx_b, r->s), "other work");
    if (dispatch(r, b, 0, MEP_EP_RECV)) return -1;
  }
  snprintf(name, sizeof name, "%s dispatch", what);
  if (check_dispatch(r, b, 0, zero_copy, name)) return -1;
  check_all_active(r, b, name);
  unsigned zc = zero_copy ? MEP_EP_ZERO_COPY : 0;
  if (!phases) {
    if (combine(r, b, 0, zc)) return -1;
  } else {
    if (combine(r, b, 0, zc | MEP_EP_SEND)) return -1;
    CK(cudaMemsetAsync(b->recv_x[0], 0, b->rx_b, r->s), "other work");
    if (combine(r, b, 0, zc | MEP_EP_RECV)) return -1;
  }
  snprintf(name, sizeof name, "%s combine", what);
  if (check_combine(r, b, 0, name)) return -1;
  check_all_active(r, b, name);
  return 0;
}

static const shape_t sweep_shapes[] = {
    {2048, 4, 8, 128, 0},
    {2048, 4, 8, 128, MEP_EP_FP8},
    {7168, 8, 8, 128, MEP_EP_FP8 | MEP_EP_ROUND_SCALE | MEP_EP_UE8M0},
    {1152, 3, 5, 37, MEP_EP_FP8},
    {128, 1024, 4, 3, 0},
    /* a peer's index words over 64 KiB: a proxied source puts them per
     * expert (ep_dispatch_send.cu) */
    {256, 40, 4, 500, MEP_EP_FP8},
    /* the quick run stops here */
    {4096, 8, 8, 128, MEP_EP_FP8 | MEP_EP_ROUND_SCALE},
    {4096, 2, 4, 128, MEP_EP_FP8 | MEP_EP_ROUND_SCALE | MEP_EP_UE8M0},
    {7168, 8, 8, 128, 0},
    {1152, 3, 5, 37, 0},
    {512, 1, 1, 1, 0},
    {512, 2, 3, 2, MEP_EP_FP8 | MEP_EP_ROUND_SCALE | MEP_EP_UE8M0},
    {1024, 16, 16, 64, MEP_EP_FP8 | MEP_EP_ROUND_SCALE},
    {128, 1024, 3, 5, MEP_EP_FP8},
    {256, 2, 2, 127, MEP_EP_FP8 | MEP_EP_ROUND_SCALE},
    {384, 5, 7, 9, 0},
};
#define QUICK_SHAPES 6

static int case_sweep(rt_t *r) {
  int count = (int)(sizeof sweep_shapes / sizeof *sweep_shapes);
  if (r->o->quick) count = QUICK_SHAPES;
  for (int s = 0; s < count; s++) {
    bench_t b;
    if (bench_open(r, &b, &sweep_shapes[s], 1, 0)) return -1;
    for (int call = 0; call < 2; call++) {
      ep_case_t c = make_case(r, &sweep_shapes[s],
                              r->o->seed * 1000003u + (uint64_t)s * 101u +
                                  (uint64_t)call);
      if (round_trip(r, &b, &c, 0, 0, "sweep")) return -1;
    }
    if (barrier(r)) return -1;
    bench_free(&b);
  }
  return 0;
}

static int case_simple(rt_t *r, const shape_t *sh, int phases,
                       int zero_copy, const char *what) {
  bench_t b;
  if (bench_open(r, &b, sh, 1, 0)) return -1;
  for (int call = 0; call < 3; call++) {
    ep_case_t c = make_case(r, sh, r->o->seed * 7919u + (uint64_t)call);
    if (round_trip(r, &b, &c, phases, zero_copy, what)) return -1;
  }
  if (barrier(r)) return -1;
  bench_free(&b);
  return 0;
}

/* Ranks that call differently in the same call: with both phases in one
 * call a combine pulls from mapped peers, in two phases it pushes, and
 * with zero-copy the pulled rows stay in the combine buffer; each rank
 * changes its way from call to call, so every pairing meets. */
static int case_mixed(rt_t *r) {
  static const shape_t sh = {2048, 4, 8, 128, MEP_EP_FP8};
  bench_t b;
  if (bench_open(r, &b, &sh, 1, 0)) return -1;
  for (int call = 0; call < 4; call++) {
    ep_case_t c = make_case(r, &sh, r->o->seed * 4099u + (uint64_t)call);
    int way = (r->rank + call) & 3;
    if (round_trip(r, &b, &c, way & 1, (way >> 1) & 1, "mixed")) return -1;
  }
  if (barrier(r)) return -1;
  bench_free(&b);
  return 0;
}

/* SETS dispatches queued back to back, then SETS combines. */
static int case_repeat(rt_t *r) {
  static const shape_t sh = {1152, 3, 5, 37,
                             MEP_EP_FP8 | MEP_EP_ROUND_SCALE};
  bench_t b;
  if (bench_open(r, &b, &sh, SETS, 0)) return -1;
  for (int i = 0; i < SETS; i++) {
    ep_case_t c = make_case(r, &sh, r->o->seed * 31u + (uint64_t)i);
    if (upload(r, &b, i, &c)) return -1;
  }
  for (int i = 0; i < SETS; i++)
    if (dispatch(r, &b, i, 0)) return -1;
  for (int i = 0; i < SETS; i++)
    if (check_dispatch(r, &b, i, 0, "repeat dispatch")) return -1;
  for (int i = 0; i < SETS; i++)
    if (combine(r, &b, i, 0)) return -1;
  for (int i = 0; i < SETS; i++)
    if (check_combine(r, &b, i, "repeat combine")) return -1;
  check_all_active(r, &b, "repeat");
  if (barrier(r)) return -1;
  bench_free(&b);
  return 0;
}

/* A seed after `from` that gives every rank the shape's full token count:
 * a graph keeps num_tokens as captured, so replays need the same counts.
 * Every rank finds the same one. */
static uint64_t full_seed(const rt_t *r, const shape_t *sh, uint64_t from) {
  for (uint64_t s = from + 1;; s++) {
    ep_case_t c = make_case(r, sh, s);
    int all = 1;
    for (int p = 0; p < r->n && all; p++)
      all = ep_ref_num_tokens(&c, p) == sh->tokens;
    if (all) return s;
  }
}

static int case_graph(rt_t *r) {
  static const shape_t sh = {2048, 4, 8, 64,
                             MEP_EP_FP8 | MEP_EP_ROUND_SCALE};
  bench_t b;
  if (bench_open(r, &b, &sh, 1, 0)) return -1;
  uint64_t seed = full_seed(r, &sh, r->o->seed * 131u);
  ep_case_t c = make_case(r, &sh, seed);
  if (upload(r, &b, 0, &c)) return -1;
  cudaGraph_t gd, gc;
  cudaGraphExec_t ed, ec;
  CK(cudaStreamBeginCapture(r->s, cudaStreamCaptureModeThreadLocal),
     "begin capture");
  int rc = dispatch(r, &b, 0, 0);
  CK(cudaStreamEndCapture(r->s, &gd), "end capture");
  if (rc) return -1;
  CK(cudaStreamBeginCapture(r->s, cudaStreamCaptureModeThreadLocal),
     "begin capture");
  rc = combine(r, &b, 0, 0);
  CK(cudaStreamEndCapture(r->s, &gc), "end capture");
  if (rc) return -1;
  CK(cudaGraphInstantiate(&ed, gd, 0), "instantiate");
  CK(cudaGraphInstantiate(&ec, gc, 0), "instantiate");
  for (int rep = 0; rep < 3; rep++) {
    seed = full_seed(r, &sh, seed);
    c = make_case(r, &sh, seed);
    if (upload(r, &b, 0, &c)) return -1;
    CK(cudaGraphLaunch(ed, r->s), "replay dispatch");
    if (check_dispatch(r, &b, 0, 0, "graph dispatch")) return -1;
    CK(cudaGraphLaunch(ec, r->s), "replay combine");
    if (check_combine(r, &b, 0, "graph combine")) return -1;
    check_all_active(r, &b, "graph");
  }
  cudaGraphExecDestroy(ed);
  cudaGraphExecDestroy(ec);
  cudaGraphDestroy(gd);
  cudaGraphDestroy(gc);
  if (barrier(r)) return -1;
  bench_free(&b);
  return 0;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The last rank creates the buffer and then never calls dispatch. */
static int case_fault(rt_t *r) {
  static const shape_t sh = {2048, 3, 6, 32, MEP_EP_FP8};
  const int64_t timeout_us = 2000000;
  const double margin_s = 5.0; /* launch, time slices of a shared GPU */
  if (r->n < 2) {
    if (r->rank == 0) printf("fault: needs 2 ranks or more; skipped\n");
    return 0;
  }
  bench_t b;
  if (bench_open(r, &b, &sh, 1, timeout_us)) return -1;
  int dead = r->n - 1;
  if (r->rank != dead) {
    ep_case_t c = make_case(r, &sh, r->o->seed * 17u + 5u);
    if (upload(r, &b, 0, &c)) return -1;
    double t0 = now_s();
    if (dispatch(r, &b, 0, 0)) return -1;
    CK(cudaStreamSynchronize(r->s), "dispatch");
    double dt = now_s() - t0;
    char why[160];
    snprintf(why, sizeof why, "dispatch took %.2f s, more than the timeout "
             "%.1f s + %.1f s", dt, timeout_us / 1e6, margin_s);
    verdict(r, dt > timeout_us / 1e6 + margin_s, "fault timing", &c, why);
    if (check_dispatch(r, &b, 0, 0, "fault dispatch")) return -1;
    int ok = !b.hact[dead];
    for (int p = 0; p < r->n; p++)
      if (p != dead && !b.hact[p]) ok = 0;
    snprintf(why, sizeof why, "active_ranks should clear rank %d alone",
             dead);
    verdict(r, !ok, "fault active_ranks", &c, why);
    if (combine(r, &b, 0, 0)) return -1;
    if (check_combine(r, &b, 0, "fault combine")) return -1;
    printf("rank %d: dispatch with rank %d silent returned in %.2f s\n",
           r->rank, dead, dt);
  }
  /* the silent rank keeps its window until the others are done */
  if (barrier(r)) return -1;
  bench_free(&b);
  /* the silent rank checks nothing itself; reaching here (the barrier
   * after the others' checks) is its pass: with --case fault alone it
   * would otherwise end with "0 passed", which body() counts as a
   * failure */
  if (r->rank == dead) {
    r->passed++;
    printf("rank %d: stayed silent; the others finished\n", r->rank);
  }
  return 0;
}

/* Creates a buffer with MEP_EP_COMBINE_PARTIAL=value: it must be created
 * (good) or refused with MEP_ERR_INVALID and a message naming the
 * variable. */
static void env_try(rt_t *r, const mep_ep_config_t *cfg, const ep_case_t *c,
                    const char *value, int good) {
  mep_ep_buffer_t *ep = NULL;
  setenv("MEP_EP_COMBINE_PARTIAL", value, 1);
  int rc = mep_ep_buffer_create(r->comm, cfg, &ep);
  int bad = good ? rc != MEP_OK || !ep
                 : rc != MEP_ERR_INVALID || ep ||
                       !strstr(mep_last_error(), "MEP_EP_COMBINE_PARTIAL");
  char why[200];
  snprintf(why, sizeof why, "MEP_EP_COMBINE_PARTIAL=\"%s\": rc %d (%s)",
           value, rc, rc ? mep_last_error() : "created");
  verdict(r, bad, good ? "env: a good value is taken"
                       : "env: a bad value is refused", c, why);
  if (ep) mep_ep_buffer_destroy(ep);
}

/* Bad values of MEP_EP_COMBINE_PARTIAL fail the buffer's creation on
 * every rank, good ones do not; the variable is put back as it was. */
static int case_env(rt_t *r) {
  const char *was = getenv("MEP_EP_COMBINE_PARTIAL");
  char *keep = was ? strdup(was) : NULL;
  mep_ep_config_t cfg = {.struct_size = sizeof cfg,
                         .max_tokens_per_rank = 16,
                         .hidden = 256,
                         .num_experts = 4 * r->n,
                         .flags = MEP_EP_CUDA};
  ep_case_t c = {.ranks = r->n, .max_tokens = 16, .hidden = 256,
                 .experts = 4 * r->n};
  static const char *const bad[] = {"fp16", "BF16", "bf16 "};
  static const char *const good[] = {"bf16", "float", ""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    env_try(r, &cfg, &c, bad[i], 0);
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    env_try(r, &cfg, &c, good[i], 1);
  if (keep) setenv("MEP_EP_COMBINE_PARTIAL", keep, 1);
  else unsetenv("MEP_EP_COMBINE_PARTIAL");
  free(keep);
  return 0;
}

static int selected(const rt_t *r, const char *name) {
  return !r->o->only || !strcmp(r->o->only, name);
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  rt_t rt = {.o = arg, .rank = mep_comm_rank(comm), .n = mep_comm_size(comm),
             .comm = comm};
  rt_t *r = &rt;
  CK(cudaStreamCreateWithFlags(&r->s, cudaStreamNonBlocking), "stream");
  static const shape_t phases = {2048, 4, 8, 128, MEP_EP_FP8};
  static const shape_t zcopy = {4096, 4, 6, 64, 0};
  int rc = 0;
  if (!rc && selected(r, "sweep")) rc = case_sweep(r);
  if (!rc && selected(r, "phases"))
    rc = case_simple(r, &phases, 1, 0, "phases");
  if (!rc && selected(r, "zerocopy"))
    rc = case_simple(r, &zcopy, 0, 1, "zerocopy");
  if (!rc && selected(r, "mixed")) rc = case_mixed(r);
  if (!rc && selected(r, "repeat")) rc = case_repeat(r);
  if (!rc && selected(r, "graph")) rc = case_graph(r);
  if (!rc && selected(r, "env")) rc = case_env(r);
  if (!rc && selected(r, "fault")) rc = case_fault(r);
  printf("rank %d: %d passed, %d failed%s\n", r->rank, r->passed, r->failed,
         rc ? " (stopped by an error)" : "");
  /* a rank is a forked child that ends with _exit (launch.c): stdout
   * into a file or pipe is fully buffered and would be dropped */
  fflush(stdout);
  cudaStreamDestroy(r->s);
  return rc || r->failed || !r->passed;
}

static void set_device(int rank, void *arg) {
  (void)arg;
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) cudaSetDevice(rank % n);
}

static int usage(FILE *f, int code) {
  fprintf(f,
          "usage: ep_cuda_test [-n ranks] [--case NAME] [--quick] [--seed S]\n"
          "Runs the EP frontend's CUDA path (dispatch, combine) across "
          "forked ranks and\nchecks every rank's results against a host "
          "reference.\n"
          "  -n N        ranks (default 2); GPU of a rank: rank %% GPUs\n"
          "  --case NAME only one case: sweep, phases, zerocopy, mixed, repeat, "
          "graph, env, fault\n"
          "  --quick     fewer shapes in the sweep\n"
          "  --seed S    inputs' seed (default: the time)\n"
          "Exits 77 without a usable GPU; MEP_TRANSPORTS=tcp forces the "
          "proxy path.\n");
  return code;
}

int main(int argc, char **argv) {
  opts_t o = {.n = 2, .seed = (uint64_t)time(NULL)};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) o.n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--case") && i + 1 < argc) o.only = argv[++i];
    else if (!strcmp(argv[i], "--quick")) o.quick = 1;
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
      o.seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
      return usage(stdout, 0);
    else return usage(stderr, 2);
  }
  static const char *cases[] = {"sweep",  "phases", "zerocopy", "mixed",
                                "repeat", "graph",  "env",      "fault"};
  int known = !o.only;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    known |= o.only && !strcmp(o.only, cases[i]);
  if (o.n < 1 || !known) return usage(stderr, 2);
  if (!gpu_usable()) {
    printf("ep_cuda_test: no usable GPU (or libmep built without CUDA): "
           "skipped\n");
    return 77;
  }
  printf("ep_cuda_test: %d ranks, case %s%s, seed %" PRIu64 ", transports "
         "%s\n", o.n, o.only ? o.only : "all", o.quick ? " (quick)" : "",
         o.seed, getenv("MEP_TRANSPORTS") ? getenv("MEP_TRANSPORTS")
                                          : "default");
  fflush(stdout);
  mep_launch_opts_t lo = {.size = o.n, .timeout_ms = 570000,
                          .name = "ep_cuda_test", .before_comm = set_device};
  int bad = mep_launch(&lo, body, &o);
  printf("%s\n", bad ? "FAILED" : "PASSED");
  return bad ? 1 : 0;
}
