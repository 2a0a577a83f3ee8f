/* Bad arguments and a rank that never calls dispatch (test_ep_host). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mep/ep.h>

#include "check.h"
#include "ep_ref.h"

int test_args(mep_comm_t *comm);
int test_fault(mep_comm_t *comm, int exit_early);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A create that must fail with `code` and a message naming `needle`. */
static void bad_create(mep_comm_t *comm, mep_ep_config_t cfg, int code,
                       const char *needle) {
  mep_ep_buffer_t *b = (mep_ep_buffer_t *)&cfg; /* must be reset to NULL */
  CHECK_RC(mep_ep_buffer_create(comm, &cfg, &b), code);
  CHECK(b == NULL, "failed create left *out set");
  CHECK_MSG(needle);
}

enum { T = 4, H = 512, L = 2, K = 2 };

int test_args(mep_comm_t *comm) {
  int R = mep_comm_size(comm);
  mep_ep_config_t good = {sizeof good, T, H, L * R, MEP_EP_HOST, 0};
  mep_ep_config_t c;

  CHECK(mep_ep_size_hint(T, H, R, L * R) > 0, "size hint of a valid buffer");
  CHECK(mep_ep_size_hint(T, 100, R, L * R) == 0, "size hint, hidden 100");
  CHECK(mep_ep_size_hint(0, H, R, L * R) == 0, "size hint, 0 tokens");
  CHECK(mep_ep_size_hint(T, H, R, R + 1) == 0, "size hint, experts");
  /* grows with every parameter */
  CHECK(mep_ep_size_hint(2 * T, H, R, L * R) > mep_ep_size_hint(T, H, R, L * R),
        "size hint grows with tokens");

  c = good; c.hidden = 100;
  bad_create(comm, c, MEP_ERR_INVALID, "hidden 100");
  c = good; c.hidden = 0;
  bad_create(comm, c, MEP_ERR_INVALID, "hidden 0");
  c = good; c.max_tokens_per_rank = 0;
  bad_create(comm, c, MEP_ERR_INVALID, "max_tokens_per_rank 0");
  c = good; c.num_experts = R + 1;
  bad_create(comm, c, MEP_ERR_INVALID, "num_experts");
  c = good; c.num_experts = 0;
  bad_create(comm, c, MEP_ERR_INVALID, "num_experts 0");
  c = good; c.num_experts = (MEP_EP_MAX_LOCAL_EXPERTS + 1) * R;
  bad_create(comm, c, MEP_ERR_INVALID, "MEP_EP_MAX_LOCAL_EXPERTS");
  c = good; c.flags = MEP_EP_HOST | MEP_EP_CUDA;
  bad_create(comm, c, MEP_ERR_INVALID, "exactly one of MEP_EP_HOST");
  c = good; c.flags = 0;
  bad_create(comm, c, MEP_ERR_INVALID, "exactly one of MEP_EP_HOST");
  c = good; c.flags = MEP_EP_HOST | 0x100;
  bad_create(comm, c, MEP_ERR_INVALID, "unknown bits 0x100");
  c = good; c.struct_size = 8;
  bad_create(comm, c, MEP_ERR_INVALID, "struct_size 8");
#ifndef MEP_HAVE_CUDA
  c = good; c.flags = MEP_EP_CUDA;
  bad_create(comm, c, MEP_ERR_UNSUPPORTED, "MEP_EP_CUDA");
#endif
  CHECK_RC(mep_ep_buffer_create(NULL, &good, &(mep_ep_buffer_t *){0}),
           MEP_ERR_INVALID);
  CHECK_MSG("comm is NULL");
  CHECK_OK(mep_ep_buffer_destroy(NULL));

  mep_ep_buffer_t *b = NULL;
  CHECK_OK(mep_ep_buffer_create(comm, &good, &b));
  CHECK(mep_ep_active_ranks(NULL) == NULL && mep_ep_combine_buffer(NULL) == NULL,
        "NULL buffer accessors");

  size_t S = (size_t)R * T;
  uint16_t x[T * H] = {0};
  int64_t idx[T * K] = {0, 1, 1, 0, -1, 0, 1, -1};
  float w[T * K] = {1, 1, 1, 1, 1, 1, 1, 1};
  void *rx = calloc(L * S, H * 2);
  void *rs = calloc(L * S, (H / 128) * 4);
  int32_t *si = calloc(L * S, 4), cnt[L];
  int64_t *lr = calloc((size_t)L * R, 8);
  uint16_t out[T * H];
  mep_ep_dispatch_args_t d0 = {
      .struct_size = sizeof d0, .x = x, .topk_idx = idx, .num_tokens = T,
      .num_topk = K, .recv_x = rx, .recv_scales = NULL, .recv_src_info = si,
      .recv_layout_range = lr, .recv_count = cnt}, d;
#define BAD_D(field_set, needle)                                              \
  do {                                                                        \
    d = d0;                                                                   \
    field_set;                                                                \
    CHECK_RC(mep_ep_dispatch(b, &d), MEP_ERR_INVALID);                        \
    CHECK_MSG("mep_ep_dispatch: ");                                           \
    CHECK_MSG(needle);                                                        \
  } while (0)
  BAD_D(d.num_topk = 17, "num_topk 17 is more than MEP_EP_MAX_TOPK (16)");
  BAD_D(d.num_topk = 0, "num_topk 0");
  BAD_D(d.num_tokens = T + 1, "num_tokens 5");
  BAD_D(d.num_tokens = -1, "num_tokens -1");
  BAD_D(d.struct_size = 4, "struct_size 4");
  BAD_D(d.x = NULL, "x is NULL");
  BAD_D(d.topk_idx = NULL, "topk_idx is NULL");
  BAD_D(d.recv_x = NULL, "recv_x is NULL");
  BAD_D(d.recv_src_info = NULL, "recv_src_info is NULL");
  BAD_D(d.recv_layout_range = NULL, "recv_layout_range is NULL");
  BAD_D(d.recv_count = NULL, "recv_count is NULL");
  BAD_D(d.flags = MEP_EP_FP8, "recv_scales");
  BAD_D(d.flags = MEP_EP_ROUND_SCALE, "need MEP_EP_FP8");
  BAD_D((d.flags = MEP_EP_FP8 | MEP_EP_UE8M0, d.recv_scales = rs),
        "MEP_EP_UE8M0 needs MEP_EP_ROUND_SCALE");
  BAD_D(d.flags = MEP_EP_ZERO_COPY, "flags 0x8");
  BAD_D(d.flags = MEP_EP_RECV, "MEP_EP_RECV without a preceding");
  BAD_D(idx[3] = 2 * R, "topk_idx[1][1]");
  idx[3] = 0;
  CHECK_RC(mep_ep_dispatch(b, NULL), MEP_ERR_INVALID);
  CHECK_MSG("args is NULL");
  CHECK_RC(mep_ep_dispatch(NULL, &d0), MEP_ERR_INVALID);
  CHECK_MSG("buf is NULL");

  mep_ep_combine_args_t c0 = {
      .struct_size = sizeof c0, .x = rx, .topk_idx = idx, .topk_weights = w,
      .src_info = si, .layout_range = lr, .num_tokens = T, .num_topk = K,
      .out = out}, cb;
#define BAD_C(field_set, needle)                                              \
  do {                                                                        \
    cb = c0;                                                                  \
    field_set;                                                                \
    CHECK_RC(mep_ep_combine(b, &cb), MEP_ERR_INVALID);                        \
    CHECK_MSG("mep_ep_combine: ");                                            \
    CHECK_MSG(needle);                                                        \
  } while (0)
  BAD_C(cb.num_topk = 17, "num_topk 17 is more than MEP_EP_MAX_TOPK (16)");
  BAD_C(cb.num_tokens = T + 1, "num_tokens 5");
  BAD_C(cb.out = NULL, "out is NULL");
  BAD_C(cb.topk_weights = NULL, "topk_weights is NULL");
  BAD_C(cb.src_info = NULL, "src_info is NULL");
  BAD_C(cb.layout_range = NULL, "layout_range is NULL");
  BAD_C(cb.x = NULL, "x is NULL");
  BAD_C(cb.flags = MEP_EP_FP8, "flags 0x1");
  BAD_C(cb.flags = MEP_EP_RECV, "MEP_EP_RECV without a preceding");
  BAD_C(lr[0] = T + 1, "layout_range[0][0]");
  lr[0] = 0;
  BAD_C((lr[0] = 1, si[0] = T), "src_info[0][0] is 4");
  lr[0] = 0;
  si[0] = 0;

  /* the UE8M0 layout needs hidden % 512: a buffer of hidden 384 refuses */
  mep_ep_config_t c384 = good;
  c384.hidden = 384;
  mep_ep_buffer_t *b384 = NULL;
  CHECK_OK(mep_ep_buffer_create(comm, &c384, &b384));
  d = d0;
  d.flags = MEP_EP_FP8 | MEP_EP_ROUND_SCALE | MEP_EP_UE8M0;
  d.recv_scales = rs;
  CHECK_RC(mep_ep_dispatch(b384, &d), MEP_ERR_INVALID);
  CHECK_MSG("hidden % 512 == 0; hidden is 384");
  CHECK_OK(mep_ep_buffer_destroy(b384));

  /* a SEND left open refuses another SEND; RECV ends it (valid call) */
  d = d0;
  d.flags = MEP_EP_SEND;
  CHECK_OK(mep_ep_dispatch(b, &d));
  CHECK_RC(mep_ep_dispatch(b, &d), MEP_ERR_INVALID);
  CHECK_MSG("has not been received yet");
  d.flags = MEP_EP_RECV;
  CHECK_OK(mep_ep_dispatch(b, &d));
  for (int r = 0; r < R; r++)
    CHECK(mep_ep_active_ranks(b)[r] == 1, "rank %d inactive", r);
  CHECK_OK(mep_ep_buffer_destroy(b));
  free(rx);
  free(rs);
  free(si);
  free(lr);
  return 0;
}

/* The last rank makes the buffer and then never calls dispatch (it sleeps,
 * or exits at once); the others must return within the timeout plus a
 * margin, with it cleared, and results over the others; the next calls
 * must not wait for it at all. */
int test_fault(mep_comm_t *comm, int exit_early) {
  int R = mep_comm_size(comm), rank = mep_comm_rank(comm), dead = R - 1;
  const int64_t timeout_us = 2000000;
  /* 2 cores, up to 4 processes, maybe under ASan */
  const double margin_s = 2.0;
  mep_ep_config_t cfg = {sizeof cfg, 6, 256, 2 * R, MEP_EP_HOST, timeout_us};
  mep_ep_buffer_t *b = NULL;
  CHECK_OK(mep_ep_buffer_create(comm, &cfg, &b));
  if (rank == dead) {
    if (!exit_early) sleep(6);
    CHECK_OK(mep_ep_buffer_destroy(b));
    return 0;
  }
  for (int call = 0; call < 3; call++) {
    ep_case_t c = {R, 6, 256, 2 * R, 8, call == 1 ? MEP_EP_FP8 : 0,
                   991 + (uint64_t)call};
    int n = ep_ref_num_tokens(&c, rank), S = R * 6;
    uint16_t *x = malloc((size_t)n * 256 * 2 + 2);
    int64_t *idx = malloc((size_t)n * 8 * 8 + 8);
    float *w = malloc((size_t)n * 8 * 4 + 4);
    ep_ref_inputs(&c, rank, x, idx, w);
    void *rx = malloc((size_t)2 * S * 256 * 2);
    float *rs = malloc((size_t)2 * S * 2 * 4);
    int32_t *si = malloc((size_t)2 * S * 4), cnt[2];
    int64_t *lr = malloc((size_t)2 * R * 8);
    uint16_t *comb = malloc((size_t)2 * S * 256 * 2);
    uint16_t *out = malloc((size_t)n * 256 * 2 + 2);
    mep_ep_dispatch_args_t d = {
        .struct_size = sizeof d, .x = x, .topk_idx = idx, .num_tokens = n,
        .num_topk = 8, .flags = c.flags, .recv_x = rx, .recv_scales = rs,
        .recv_src_info = si, .recv_layout_range = lr, .recv_count = cnt};
    double t0 = now_s();
    CHECK_OK(mep_ep_dispatch(b, &d));
    double took = now_s() - t0;
    int32_t *active = mep_ep_active_ranks(b);
    CHECK(active[dead] == 0, "call %d: rank %d still active", call, dead);
    for (int r = 0; r < dead; r++)
      CHECK(active[r] == 1, "call %d: live rank %d cleared", call, r);
    if (call == 0)
      CHECK(took < timeout_us * 1e-6 + margin_s, "dispatch took %.2f s, "
            "timeout %.1f s + %.1f s margin", took, timeout_us * 1e-6,
            margin_s);
    else
      CHECK(took < timeout_us * 1e-6 / 2, "call %d waited %.2f s for an "
            "inactive rank", call, took);
    fprintf(stderr, "rank %d call %d: dispatch %.3f s\n", rank, call, took);
    char why[512];
    CHECK(ep_ref_check_dispatch(&c, rank, active, rx, rs, si, lr, cnt, why,
                                sizeof why) == 0, "%s", why);
    ep_ref_expert_rows(&c, rank, rx, rs, lr, comb);
    mep_ep_combine_args_t cb = {
        .struct_size = sizeof cb, .x = comb, .topk_idx = idx,
        .topk_weights = w, .src_info = si, .layout_range = lr,
        .num_tokens = n, .num_topk = 8, .out = out};
    t0 = now_s();
    CHECK_OK(mep_ep_combine(b, &cb));
    took = now_s() - t0;
    CHECK(took < timeout_us * 1e-6 / 2, "combine waited %.2f s", took);
    CHECK(ep_ref_check_combine(&c, rank, active, out, why, sizeof why) == 0,
          "%s", why);
    free(x);
    free(idx);
    free(w);
    free(rx);
    free(rs);
    free(si);
    free(lr);
    free(comb);
    free(out);
  }
  CHECK_OK(mep_ep_buffer_destroy(b));
  return 0;
}
