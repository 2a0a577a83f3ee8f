/* Wrong use of collectives and point-to-point:
 *  - bad arguments (root out of range, unknown dtype or op, NULL buffers
 *    with count > 0, bad peers) fail on every rank with MEP_ERR_INVALID at
 *    once, and the communicator keeps working;
 *  - ranks that disagree (collective, dtype, count, root, reduction) all
 *    get MEP_ERR_MISMATCH within the timeout, with a message naming the
 *    other side and both values; a failed in-place all-reduce leaves its
 *    buffer as it was.
 * usage: test_coll_errors NRANKS [KEY=VALUE...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll_case.h"
#include "launch.h"
#include "ref.h"

#define TIMEOUT_MS 10000

static uint64_t run_seed;

/* A call that every rank rejects before talking to anyone. */
#define REJECTED(ctx, call)                                                   \
  do {                                                                        \
    long long t0_ = now_ms();                                                 \
    CHECK_RC(call, MEP_ERR_INVALID);                                          \
    CHECK(mep_last_error()[0] != '\0', "%s: no message", #call);              \
    CHECK(now_ms() - t0_ < 2000, "%s took %lld ms to refuse", #call,          \
          now_ms() - t0_);                                                    \
  } while (0)

static void bad_arguments(coll_ctx_t *ctx) {
  mep_comm_t *comm = ctx->comm;
  int n = ctx->n;
  float a[8] = {0}, b[64] = {0};
  size_t counts[64] = {0}, displs[64] = {0};
  CHECK(n <= 8, "the test's buffers hold 8 ranks");
  REJECTED(ctx, mep_broadcast(comm, a, 1, MEP_FLOAT32, -1, NULL));
  REJECTED(ctx, mep_broadcast(comm, a, 1, MEP_FLOAT32, n, NULL));
  REJECTED(ctx, mep_reduce(comm, a, b, 1, MEP_FLOAT32, MEP_SUM, n, NULL));
  REJECTED(ctx, mep_reduce(comm, a, b, 1, MEP_FLOAT32, MEP_SUM, -2, NULL));
  REJECTED(ctx, mep_gather(comm, a, b, 1, MEP_FLOAT32, n + 5, NULL));
  REJECTED(ctx, mep_scatter(comm, b, a, 1, MEP_FLOAT32, -1, NULL));
  REJECTED(ctx, mep_allreduce(comm, a, b, 2, (mep_dtype_t)99, MEP_SUM, NULL));
  REJECTED(ctx, mep_allreduce(comm, a, b, 2, (mep_dtype_t)-1, MEP_SUM, NULL));
  REJECTED(ctx, mep_allreduce(comm, a, b, 2, MEP_FLOAT32, (mep_op_t)99, NULL));
  REJECTED(ctx, mep_allreduce(comm, a, b, 2, MEP_FLOAT32, (mep_op_t)-1, NULL));
  REJECTED(ctx, mep_allgather(comm, a, b, 1, (mep_dtype_t)MEP_DTYPE_COUNT,
                              NULL));
  REJECTED(ctx, mep_allreduce(comm, NULL, b, 5, MEP_FLOAT32, MEP_SUM, NULL));
  REJECTED(ctx, mep_allreduce(comm, a, NULL, 5, MEP_FLOAT32, MEP_SUM, NULL));
  REJECTED(ctx, mep_broadcast(comm, NULL, 3, MEP_INT8, 0, NULL));
  REJECTED(ctx, mep_allgather(comm, a, NULL, 1, MEP_FLOAT32, NULL));
  REJECTED(ctx, mep_allgather(comm, NULL, b, 1, MEP_FLOAT32, NULL));
  REJECTED(ctx, mep_reduce_scatter(comm, b, NULL, 1, MEP_FLOAT32, MEP_SUM,
                                   NULL));
  REJECTED(ctx, mep_alltoall(comm, NULL, b, 1, MEP_FLOAT32, NULL));
  REJECTED(ctx, mep_alltoallv(comm, a, NULL, displs, b, counts, displs,
                              MEP_FLOAT32, NULL));
  REJECTED(ctx, mep_alltoallv(comm, a, counts, displs, b, counts, NULL,
                              MEP_FLOAT32, NULL));
  mep_req_t *req = NULL;
  REJECTED(ctx, mep_allreduce(comm, NULL, b, 5, MEP_FLOAT32, MEP_SUM, &req));
  REJECTED(ctx, mep_send(comm, a, 4, n, 0, NULL));
  REJECTED(ctx, mep_send(comm, a, 4, -1, 0, NULL));
  REJECTED(ctx, mep_recv(comm, a, 4, n + 3, 0, NULL));
  REJECTED(ctx, mep_send(comm, NULL, 4, (ctx->me + 1) % n, 0, NULL));
  REJECTED(ctx, mep_recv(comm, NULL, 4, (ctx->me + 1) % n, 0, NULL));
  CHECK(mep_dtype_size((mep_dtype_t)99) == 0, "size of an unknown dtype");
  CHECK(mep_dtype_name((mep_dtype_t)99) == NULL, "name of an unknown dtype");
  CHECK(mep_op_name((mep_op_t)99) == NULL, "name of an unknown op");
  /* Empty tensors may have no address (torch gives NULL): count 0 with
   * NULL buffers is a valid no-op. */
  CHECK_OK(mep_allreduce(comm, NULL, NULL, 0, MEP_FLOAT32, MEP_SUM, NULL));
  CHECK_OK(mep_broadcast(comm, NULL, 0, MEP_FLOAT32, n - 1, NULL));
  CHECK_OK(mep_allgather(comm, NULL, NULL, 0, MEP_INT64, NULL));
  /* Nothing of the refused calls is left in the communicator. */
  for (int dt = 0; dt < MEP_DTYPE_COUNT; dt++)
    case_run(ctx, K_ALLREDUCE, (mep_dtype_t)dt, MEP_MAX, 77, 0, 0);
  case_run(ctx, K_ALLTOALLV, MEP_FLOAT32, MEP_SUM, 100, 0, 0);
}

/* ------------------------------------------------------------- mismatch */

typedef struct {
  const char *what;
  int odd;                    /* the rank that disagrees */
  int (*call)(mep_comm_t *, int me_is_odd);
  const char *needles[3];     /* in every rank's message */
} mismatch_t;

static float mm_send[2048], mm_recv[2048 * 8];

static int op_kind(mep_comm_t *c, int odd) {
  return odd ? mep_allreduce(c, mm_send, mm_recv, 64, MEP_FLOAT32, MEP_SUM,
                             NULL)
             : mep_allgather(c, mm_send, mm_recv, 64, MEP_FLOAT32, NULL);
}

static int dtype(mep_comm_t *c, int odd) {
  return mep_allreduce(c, mm_send, mm_recv, 100,
                       odd ? MEP_INT32 : MEP_FLOAT32, MEP_SUM, NULL);
}

static int count(mep_comm_t *c, int odd) {
  return mep_allreduce(c, mm_send, mm_recv, odd ? 1000 : 1001, MEP_FLOAT32,
                       MEP_SUM, NULL);
}

/* Two ranks that each believe they are the root. */
static int two_roots(mep_comm_t *c, int odd) {
  return mep_broadcast(c, mm_recv, 300, MEP_FLOAT32,
                       odd ? mep_comm_rank(c) : 0, NULL);
}

/* One rank names another root than the rest. */
static int other_root(mep_comm_t *c, int odd) {
  return mep_gather(c, mm_send, mm_recv, 100, MEP_FLOAT32,
                    odd ? 0 : mep_comm_size(c) - 1, NULL);
}

static int redop(mep_comm_t *c, int odd) {
  return mep_allreduce(c, mm_send, mm_recv, 100, MEP_FLOAT32,
                       odd ? MEP_MAX : MEP_SUM, NULL);
}

/* Large enough to take several chunks, so that the ranks with the smaller
 * count cannot finish before they hear of the disagreement. */
static int big_count(mep_comm_t *c, int odd) {
  return mep_allgather(c, mm_send, mm_recv, odd ? 2048 : 2047, MEP_FLOAT32,
                       NULL);
}

/* In place, above the two-shot size: a failed all-reduce leaves the
 * buffer as it was (the core puts back its copy aside; with the copy
 * thread, once that thread is done). mm_recv holds the input on entry. */
#define INPLACE_COUNT 300001
static float ip_buf[INPLACE_COUNT], ip_in[INPLACE_COUNT];
static int inplace_count(mep_comm_t *c, int odd) {
  uint64_t x = run_seed ^ (uint64_t)(mep_comm_rank(c) + 1);
  for (size_t i = 0; i < INPLACE_COUNT; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ip_in[i] = (float)(int32_t)(x >> 40) / 1024.0f;
  }
  memcpy(ip_buf, ip_in, sizeof ip_buf);
  int rc = mep_allreduce(c, ip_buf, ip_buf,
                         odd ? INPLACE_COUNT - 1 : INPLACE_COUNT, MEP_FLOAT32,
                         MEP_SUM, NULL);
  if (rc != MEP_OK && memcmp(ip_buf, ip_in, sizeof ip_buf)) {
    fprintf(stderr, "FAIL rank %d: the failed in-place all-reduce changed "
            "its buffer\n", mep_comm_rank(c));
    return MEP_ERR_PROTOCOL; /* judged wrong: not MEP_ERR_MISMATCH */
  }
  return rc;
}

/* What is wrong with one rank's outcome of a mismatch, or "" if nothing. */
static void judge(const coll_ctx_t *ctx, const mismatch_t *m, int odd, int rc,
                  long long took, const char *msg, char *bad, size_t len) {
  bad[0] = '\0';
  if (rc != MEP_ERR_MISMATCH) {
    snprintf(bad, len, "returned %d (%s) after %lld ms, want "
             "MEP_ERR_MISMATCH; message: %s", rc, mep_strerror(rc), took,
             msg);
    return;
  }
  if (took >= TIMEOUT_MS + 5000) {
    snprintf(bad, len, "took %lld ms", took);
    return;
  }
  for (int i = 0; i < 3 && m->needles[i]; i++)
    if (!strstr(msg, m->needles[i])) {
      snprintf(bad, len, "message '%s' lacks '%s'", msg, m->needles[i]);
      return;
    }
  /* The other side by its rank: the odd one, or for the odd one, any. */
  char other[32];
  int named = 0;
  for (int r = 0; r < ctx->n && !named; r++) {
    if (r == ctx->me || (ctx->me != odd && r != odd)) continue;
    snprintf(other, sizeof other, "rank %d", r);
    named = strstr(msg, other) != NULL;
  }
  if (!named)
    snprintf(bad, len, "message '%s' names no disagreeing rank", msg);
}

/* Runs one disagreement on a communicator of its own; returns 1 if this
 * rank's outcome is wrong (described on stderr). Every rank finishes the
 * case before any closes its connections, so one rank's failure does not
 * turn into the others' MEP_ERR_PEER_FAILED. */
static int check_mismatch(coll_ctx_t *ctx, const mismatch_t *m, int k) {
  char name[64];
  snprintf(name, sizeof name, "mismatch%d", k);
  mep_comm_opts_t o = {.struct_size = sizeof o, .name = name,
                       .timeout_ms = TIMEOUT_MS};
  mep_comm_t *comm = NULL;
  CHECK_OK(mep_comm_create(ctx->store, ctx->me, ctx->n, &o, &comm));
  int odd = m->odd < ctx->n ? m->odd : ctx->n - 1;
  long long t0 = now_ms();
  int rc = m->call(comm, ctx->me == odd);
  long long took = now_ms() - t0;
  char msg[1024], bad[1400];
  snprintf(msg, sizeof msg, "%s", mep_last_error());
  judge(ctx, m, odd, rc, took, msg, bad, sizeof bad);
  if (bad[0])
    fprintf(stderr, "FAIL rank %d: %s: %s\n", ctx->me, m->what, bad);
  else if (ctx->me == 0)
    printf("  %s (%lld ms): %s\n", m->what, took, msg);
  fflush(NULL);
  store_barrier(ctx, name);
  t0 = now_ms();
  CHECK_OK(mep_comm_destroy(comm));
  CHECK(now_ms() - t0 < TIMEOUT_MS, "destroy after a mismatch took %lld ms",
        now_ms() - t0);
  return bad[0] != '\0';
}

static const mismatch_t mismatches[] = {
    {"allreduce against allgather", 0, op_kind, {"allreduce", "allgather"}},
    {"float32 against int32", 7, dtype, {"float32", "int32"}},
    {"count 1001 against 1000", 1, count, {"1001", "1000"}},
    {"broadcast with two roots", 1, two_roots, {"root"}},
    {"gather root 0 against root n-1", 1, other_root, {"root"}},
    {"sum against max", 0, redop, {"sum", "max"}},
    {"allgather count 2047 against 2048", 7, big_count, {"2047", "2048"}},
    {"in-place allreduce count 300001 against 300000", 1, inplace_count,
     {"300001", "300000"}},
};

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)arg;
  coll_ctx_t ctx;
  ctx_init(&ctx, comm, store, run_seed);
  bad_arguments(&ctx);
  if (ctx.me == 0) printf("bad arguments: refused on every rank\n");
  int wrong = 0;
  for (size_t i = 0; i < sizeof mismatches / sizeof mismatches[0]; i++)
    wrong += check_mismatch(&ctx, &mismatches[i], (int)i);
  CHECK(wrong == 0, "rank %d: %d mismatches not reported right", ctx.me,
        wrong);
  /* The first communicator was not disturbed by the others. */
  case_run(&ctx, K_ALLREDUCE, MEP_FLOAT32, MEP_SUM, 1001, 0, 0);
  hashes_compare(&ctx, "errors");
  ctx_fini(&ctx);
  fflush(NULL); /* the launcher ends ranks with _exit */
  return 0;
}

int main(int argc, char **argv) {
  CHECK(argc >= 2, "usage: test_coll_errors NRANKS [KEY=VALUE...]");
  int n = atoi(argv[1]);
  run_seed = harness_args(argc, argv, 2);
  mep_launch_opts_t o = {.size = n, .timeout_ms = 150000,
                         .name = "collerrors"};
  int failed = mep_launch(&o, body, NULL);
  CHECK(failed == 0, "%d of %d ranks failed", failed, n);
  printf("ok: errors on %d ranks\n", n);
  return 0;
}
