/* Collectives with requests: several issued back to back, then waited in
 * reverse order, or polled with mep_req_test, or freed while running
 * (detached); every result is checked against the reference.
 * usage: test_coll_async NRANKS [KEY=VALUE...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll_case.h"
#include "launch.h"
#include "ref.h"

static uint64_t run_seed;

typedef struct {
  coll_kind_t kind;
  mep_dtype_t dt;
  mep_op_t op;
  int size_code; /* >= 0: that many elements; < 0: -size_code/2 chunks */
  int root_code; /* 0: rank 0, 1: middle, 2: last */
  int flags;
} spec_t;

static const spec_t specs[] = {
    {K_ALLREDUCE, MEP_FLOAT32, MEP_SUM, -3, 0, CASE_INPLACE},
    {K_BROADCAST, MEP_BFLOAT16, MEP_SUM, 1001, 2, 0},
    {K_ALLGATHER, MEP_INT32, MEP_SUM, -7, 0, CASE_UNALIGNED},
    {K_REDUCE_SCATTER, MEP_FLOAT64, MEP_MAX, 1001, 0, 0},
    {K_ALLTOALL, MEP_UINT8, MEP_SUM, -3, 0, CASE_INPLACE},
    {K_ALLTOALLV, MEP_FLOAT16, MEP_SUM, 777, 0, 0},
    {K_REDUCE, MEP_INT8, MEP_PROD, 5000, 1, CASE_NULL},
    {K_GATHER, MEP_BOOL, MEP_SUM, 1001, 0, 0},
    {K_SCATTER, MEP_INT64, MEP_SUM, 333, 2, CASE_UNALIGNED},
    {K_ALLREDUCE, MEP_BFLOAT16, MEP_AVG, -7, 0, 0},
    {K_ALLREDUCE, MEP_INT32, MEP_MIN, 0, 0, 0},
};
#define NSPECS (sizeof specs / sizeof specs[0])

static void init_spec(coll_ctx_t *ctx, coll_case_t *c, const spec_t *s) {
  size_t count = s->size_code >= 0
                     ? (size_t)s->size_code
                     : ctx->chunk / ref_size(s->dt) * (size_t)-s->size_code /
                               2 + 1;
  int roots[3] = {0, ctx->n / 2, ctx->n - 1};
  case_init(ctx, c, s->kind, s->dt, s->op, count, roots[s->root_code],
            s->flags);
  case_prepare(ctx, c);
}

static void issue_all(coll_ctx_t *ctx, coll_case_t *cs, mep_req_t **reqs) {
  for (size_t i = 0; i < NSPECS; i++) init_spec(ctx, &cs[i], &specs[i]);
  for (size_t i = 0; i < NSPECS; i++) {
    reqs[i] = NULL;
    int rc = case_issue(ctx, &cs[i], &reqs[i]);
    CHECK(rc == 0 && reqs[i] != NULL, "rank %d: %s: issue returned %d: %s",
          ctx->me, cs[i].desc, rc, mep_last_error());
  }
}

static void check_all(coll_ctx_t *ctx, coll_case_t *cs) {
  for (size_t i = 0; i < NSPECS; i++) {
    case_check(ctx, &cs[i]);
    case_release(&cs[i]);
  }
}

static void reverse_waits(coll_ctx_t *ctx) {
  coll_case_t cs[NSPECS];
  mep_req_t *reqs[NSPECS];
  issue_all(ctx, cs, reqs);
  for (size_t i = NSPECS; i-- > 0;) {
    int rc = mep_req_wait(reqs[i], 60000);
    CHECK(rc == 0, "rank %d: %s: wait returned %d (%s): %s", ctx->me,
          cs[i].desc, rc, mep_strerror(rc), mep_last_error());
    CHECK(mep_req_status(reqs[i]) == 0, "rank %d: %s: status %d after wait",
          ctx->me, cs[i].desc, mep_req_status(reqs[i]));
    /* a finished request answers the same again */
    CHECK_OK(mep_req_wait(reqs[i], 0));
  }
  for (size_t i = 0; i < NSPECS; i++) mep_req_free(reqs[i]);
  check_all(ctx, cs);
}

static void test_loops(coll_ctx_t *ctx) {
  coll_case_t cs[NSPECS];
  mep_req_t *reqs[NSPECS];
  issue_all(ctx, cs, reqs);
  size_t left = NSPECS;
  long long deadline = now_ms() + 60000;
  long long polls = 0;
  while (left > 0) {
    CHECK(now_ms() < deadline, "rank %d: %zu requests unfinished after 60 s",
          ctx->me, left);
    left = 0;
    for (size_t i = 0; i < NSPECS; i++) {
      int done = -1;
      CHECK_OK(mep_req_test(reqs[i], &done));
      CHECK(done == 0 || done == 1, "mep_req_test set done=%d", done);
      int st = mep_req_status(reqs[i]);
      if (!done) {
        left++;
        CHECK(st == MEP_RUNNING || st == 0, "rank %d: %s: status %d while running",
              ctx->me, cs[i].desc, st);
      } else {
        CHECK(st == 0, "rank %d: %s: finished with %d (%s): %s", ctx->me,
              cs[i].desc, st, mep_strerror(st), mep_last_error());
      }
    }
    polls++;
  }
  for (size_t i = 0; i < NSPECS; i++) mep_req_free(reqs[i]);
  check_all(ctx, cs);
  if (ctx->me == 0) printf("test loops: %lld polls\n", polls);
}

/* A request freed while running still completes, before any collective
 * issued after it. */
static void detached(coll_ctx_t *ctx) {
  coll_case_t a, b;
  mep_req_t *req = NULL;
  init_spec(ctx, &a, &specs[0]);
  CHECK_OK(case_issue(ctx, &a, &req));
  mep_req_free(req);
  init_spec(ctx, &b, &specs[2]);
  CHECK_OK(case_issue(ctx, &b, NULL));
  case_check(ctx, &a);
  case_check(ctx, &b);
  case_release(&a);
  case_release(&b);
}

/* Asynchronous barriers among other collectives keep their places. */
static void barrier_requests(coll_ctx_t *ctx) {
  coll_case_t c;
  mep_req_t *r1 = NULL, *r2 = NULL, *r3 = NULL;
  init_spec(ctx, &c, &specs[1]);
  CHECK_OK(mep_barrier(ctx->comm, &r1));
  CHECK_OK(case_issue(ctx, &c, &r2));
  CHECK_OK(mep_barrier(ctx->comm, &r3));
  CHECK_OK(mep_req_wait(r3, 60000));
  int done = 0;
  CHECK_OK(mep_req_test(r1, &done));
  CHECK(done == 1, "rank %d: an earlier barrier is unfinished after a later "
        "one finished", ctx->me);
  CHECK_OK(mep_req_test(r2, &done));
  CHECK(done == 1, "rank %d: a broadcast is unfinished after a later barrier "
        "finished", ctx->me);
  CHECK_OK(mep_req_wait(r1, 0));
  CHECK_OK(mep_req_wait(r2, 0));
  mep_req_free(r1);
  mep_req_free(r2);
  mep_req_free(r3);
  case_check(ctx, &c);
  case_release(&c);
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)arg;
  coll_ctx_t ctx;
  ctx_init(&ctx, comm, store, run_seed);
  for (int round = 0; round < 2; round++) {
    reverse_waits(&ctx);
    test_loops(&ctx);
    detached(&ctx);
    barrier_requests(&ctx);
  }
  hashes_compare(&ctx, "async");
  ctx_fini(&ctx);
  fflush(NULL); /* the launcher ends ranks with _exit */
  return 0;
}

int main(int argc, char **argv) {
  CHECK(argc >= 2, "usage: test_coll_async NRANKS [KEY=VALUE...]");
  int n = atoi(argv[1]);
  run_seed = harness_args(argc, argv, 2);
  mep_launch_opts_t o = {.size = n, .timeout_ms = 200000,
                         .name = "collasync"};
  int failed = mep_launch(&o, body, NULL);
  CHECK(failed == 0, "%d of %d ranks failed", failed, n);
  printf("ok: asynchronous collectives on %d ranks\n", n);
  return 0;
}
