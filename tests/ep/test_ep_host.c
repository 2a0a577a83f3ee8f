/* test_ep_host: dispatch and combine on the CPU path (MEP_EP_HOST) with
 * forked ranks over tcp, checked against ep_ref (every rank regenerates
 * every rank's inputs). Usage: test_ep_host RANKS SCENARIO, SCENARIO one
 * of basic, fp8, phases, zerocopy, args, fault, faultexit. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mep/ep.h>

#include "../../tools/common/launch.h"
#include "check.h"
#include "ep_ref.h"

typedef struct ep_run {
  int tokens, hidden, local, topk;
  unsigned fmt;   /* dispatch format flags */
  int calls;      /* back-to-back calls on one buffer */
  int two_phase;  /* SEND, other work, RECV */
  int zero_copy;
} ep_run_t;

static const char *scenario;

/* What a model does between the two phases: something that takes a while
 * and touches memory. */
static void other_work(uint64_t seed) {
  volatile double acc = 0;
  int n = (int)(seed % 200000);
  for (int i = 0; i < n; i++) acc += sqrt((double)i);
  usleep((useconds_t)(seed % 5000));
}

typedef struct outputs {
  void *x, *scales;
  int32_t *src_info, *count;
  int64_t *range;
  uint16_t *comb, *out;
} outputs_t;

static void outputs_alloc(const ep_case_t *c, outputs_t *o) {
  size_t L = (size_t)(c->experts / c->ranks), S = (size_t)c->ranks * c->max_tokens;
  size_t H = (size_t)c->hidden;
  size_t xb = L * S * H * ((c->flags & MEP_EP_FP8) ? 1 : 2);
  size_t sb = L * S * (H / 128) * 4;
  o->x = malloc(xb);
  o->scales = (c->flags & MEP_EP_FP8) ? malloc(sb) : NULL;
  o->src_info = malloc(L * S * 4);
  o->count = malloc(L * 4);
  o->range = malloc(L * (size_t)c->ranks * 8);
  o->comb = malloc(L * S * H * 2);
  o->out = malloc((size_t)c->max_tokens * H * 2 + 2);
  /* garbage where the call must write */
  memset(o->x, 0xa5, xb);
  if (o->scales) memset(o->scales, 0xa5, sb);
  memset(o->src_info, 0xa5, L * S * 4);
  memset(o->count, 0xa5, L * 4);
  memset(o->range, 0xa5, L * (size_t)c->ranks * 8);
  memset(o->out, 0xa5, (size_t)c->max_tokens * H * 2 + 2);
}

static void outputs_free(outputs_t *o) {
  free(o->x);
  free(o->scales);
  free(o->src_info);
  free(o->count);
  free(o->range);
  free(o->comb);
  free(o->out);
}

/* One dispatch + expert + combine round on buf, checked. */
static void round_trip(mep_ep_buffer_t *buf, const ep_case_t *c, int rank,
                       const ep_run_t *run, int64_t timeout_us) {
  int n = ep_ref_num_tokens(c, rank), K = c->topk, H = c->hidden;
  uint16_t *x = malloc(sizeof(uint16_t) * ((size_t)n * H + 1));
  int64_t *idx = malloc(sizeof(int64_t) * ((size_t)n * K + 1));
  float *w = malloc(sizeof(float) * ((size_t)n * K + 1));
  ep_ref_inputs(c, rank, x, idx, w);
  outputs_t o;
  outputs_alloc(c, &o);
  char why[512];

  /* the receive adds each expert's count to recv_stats; a caller built
   * before that field (struct_size up to stream; the zero-copy runs play
   * one) has it untouched */
  const int L = c->experts / c->ranks;
  int32_t stats[MEP_EP_MAX_LOCAL_EXPERTS];
  for (int el = 0; el < L; el++) stats[el] = 1000 * el + rank;
  mep_ep_dispatch_args_t d = {
      .struct_size = run->zero_copy ? offsetof(mep_ep_dispatch_args_t, recv_stats)
                                    : sizeof d,
      .x = x, .topk_idx = idx, .num_tokens = n,
      .num_topk = K, .flags = c->flags, .timeout_us = timeout_us,
      .recv_x = o.x, .recv_scales = o.scales, .recv_src_info = o.src_info,
      .recv_layout_range = o.range, .recv_count = o.count,
      .recv_stats = stats};
  if (run->two_phase) {
    d.flags = c->flags | MEP_EP_SEND;
    CHECK_OK(mep_ep_dispatch(buf, &d));
    other_work(c->seed);
    d.flags = c->flags | MEP_EP_RECV;
  }
  CHECK_OK(mep_ep_dispatch(buf, &d));
  int32_t *active = mep_ep_active_ranks(buf);
  CHECK(ep_ref_check_dispatch(c, rank, active, o.x, o.scales, o.src_info,
                              o.range, o.count, why, sizeof why) == 0,
        "%s: %s", scenario, why);
  for (int el = 0; el < L; el++)
    CHECK(stats[el] == 1000 * el + rank + (run->zero_copy ? 0 : o.count[el]),
          "%s: recv_stats[%d] is %d, not %d + %d", scenario, el, stats[el],
          1000 * el + rank, run->zero_copy ? 0 : o.count[el]);

  uint16_t *comb = run->zero_copy ? mep_ep_combine_buffer(buf) : o.comb;
  CHECK(comb != NULL, "no combine buffer");
  ep_ref_expert_rows(c, rank, o.x, o.scales, o.range, comb);
  mep_ep_combine_args_t cb = {
      .struct_size = sizeof cb, .x = comb, .topk_idx = idx, .topk_weights = w,
      .src_info = o.src_info, .layout_range = o.range, .num_tokens = n,
      .num_topk = K, .flags = run->zero_copy ? MEP_EP_ZERO_COPY : 0,
      .timeout_us = timeout_us, .out = o.out};
  if (run->two_phase) {
    cb.flags |= MEP_EP_SEND;
    CHECK_OK(mep_ep_combine(buf, &cb));
    other_work(c->seed >> 7);
    cb.flags = (cb.flags & ~MEP_EP_SEND) | MEP_EP_RECV;
  }
  CHECK_OK(mep_ep_combine(buf, &cb));
  CHECK(ep_ref_check_combine(c, rank, active, o.out, why, sizeof why) == 0,
        "%s: %s", scenario, why);
  /* nothing past the tokens is written */
  uint16_t guard;
  memset(&guard, 0xa5, 2);
  CHECK(n == c->max_tokens || o.out[(size_t)n * H] == guard,
        "combine wrote past token %d", n);
  outputs_free(&o);
  free(x);
  free(idx);
  free(w);
}

static void run_case(mep_comm_t *comm, const ep_run_t *run, uint64_t seed) {
  int R = mep_comm_size(comm), rank = mep_comm_rank(comm);
  mep_ep_config_t cfg = {.struct_size = sizeof cfg,
                         .max_tokens_per_rank = run->tokens,
                         .hidden = run->hidden,
                         .num_experts = run->local * R,
                         .flags = MEP_EP_HOST};
  mep_ep_buffer_t *buf = NULL;
  CHECK_OK(mep_ep_buffer_create(comm, &cfg, &buf));
  CHECK(mep_ep_size_hint(run->tokens, run->hidden, R, run->local * R) > 0,
        "size hint");
  for (int i = 0; i < run->calls; i++) {
    ep_case_t c = {R, run->tokens, run->hidden, run->local * R, run->topk,
                   run->fmt, seed * 1000003u + (uint64_t)i};
    round_trip(buf, &c, rank, run, 0);
  }
  for (int r = 0; r < R; r++)
    CHECK(mep_ep_active_ranks(buf)[r] == 1, "rank %d went inactive", r);
  CHECK_OK(mep_ep_buffer_destroy(buf));
}

#define FP8 MEP_EP_FP8
#define RS MEP_EP_ROUND_SCALE
#define UE MEP_EP_UE8M0

static const ep_run_t basic_runs[] = {
    {5, 128, 1, 1, 0, 4, 0, 0},   {7, 384, 3, 2, 0, 3, 0, 0},
    {16, 128, 4, 8, 0, 3, 0, 0},  {1, 128, 2, 2, 0, 3, 0, 0},
    {3, 256, 5, 16, 0, 2, 0, 0},  {40, 2048, 2, 8, 0, 2, 0, 0},
    /* an index block over 64 KiB: one put per expert (layout.h) */
    {520, 128, 32, 8, 0, 2, 0, 0},
};
static const ep_run_t fp8_runs[] = {
    {9, 128, 2, 2, FP8, 3, 0, 0},          {6, 384, 1, 1, FP8 | RS, 3, 0, 0},
    {8, 512, 4, 8, FP8 | RS | UE, 3, 0, 0}, {4, 512, 8, 16, FP8 | RS | UE, 2, 0, 0},
    {11, 1024, 2, 8, FP8, 2, 0, 0},        {48, 1152, 3, 8, FP8, 2, 0, 0},
};
static const ep_run_t phase_runs[] = {
    {7, 128, 2, 2, 0, 4, 1, 0}, {5, 384, 3, 8, FP8, 3, 1, 0},
    {6, 512, 2, 2, FP8 | RS | UE, 3, 1, 1},
};
static const ep_run_t zc_runs[] = {
    {6, 384, 2, 8, 0, 3, 0, 1}, {9, 128, 1, 1, FP8 | RS, 3, 0, 1},
};

static int run_list(mep_comm_t *comm, const ep_run_t *runs, size_t n) {
  for (size_t i = 0; i < n; i++) run_case(comm, &runs[i], 17 + i);
  return 0;
}

int test_args(mep_comm_t *comm);
int test_fault(mep_comm_t *comm, int exit_early);

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  (void)arg;
  if (!strcmp(scenario, "basic"))
    return run_list(comm, basic_runs, sizeof basic_runs / sizeof *basic_runs);
  if (!strcmp(scenario, "fp8"))
    return run_list(comm, fp8_runs, sizeof fp8_runs / sizeof *fp8_runs);
  if (!strcmp(scenario, "phases"))
    return run_list(comm, phase_runs, sizeof phase_runs / sizeof *phase_runs);
  if (!strcmp(scenario, "zerocopy"))
    return run_list(comm, zc_runs, sizeof zc_runs / sizeof *zc_runs);
  if (!strcmp(scenario, "args")) return test_args(comm);
  if (!strcmp(scenario, "fault")) return test_fault(comm, 0);
  if (!strcmp(scenario, "faultexit")) return test_fault(comm, 1);
  fprintf(stderr, "unknown scenario %s\n", scenario);
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s RANKS SCENARIO\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  scenario = argv[2];
  /* a hang becomes a failure long before meson's deadline */
  setenv("MEP_CORE_TIMEOUT_MS", "10000", 0);
  mep_launch_opts_t o = {.size = n, .timeout_ms = 150000, .name = "ep"};
  int failed = mep_launch(&o, body, NULL);
  if (failed) fprintf(stderr, "%s: %d ranks failed\n", scenario, failed);
  else printf("ep host %s on %d ranks: passed\n", scenario, n);
  return failed ? 1 : 0;
}
