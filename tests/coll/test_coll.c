/* Collectives against the reference, on NRANKS forked ranks.
 * usage: test_coll NRANKS MODE[,MODE...] [KEY=VALUE...]
 *   matrix    every kind x dtype (x op) x root at counts 1 and 1001
 *   sizes     every kind and dtype at counts 0, 1, 1001 and chunk-1, chunk,
 *             chunk+1 and 3.5 chunks (in elements x element size), the
 *             reductions cycling through the ops
 *   algo      allreduce of every dtype x op and broadcast of every dtype
 *             at counts 1, 1001, chunk+1 and 3.5 chunks: for runs that
 *             force one algorithm with MEP_CORE_TWO_SHOT_BYTES
 *   big       allreduce, allgather, alltoall and broadcast of >= 64 MiB
 *   barrier   nobody leaves a barrier before everyone entered it
 *   leave     ranks that finished a barrier leave at once: no failure
 * KEY=VALUE arguments are set in the environment of the ranks
 * (e.g. MEP_CORE_CHUNK_BYTES=65536); seed=N replays a run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll_case.h"
#include "launch.h"
#include "ref.h"

static uint64_t run_seed;
static const char *modes;

/* Roots 0, a middle one and the last, without repeats. */
static int roots_of(int n, int *roots) {
  int k = 0;
  roots[k++] = 0;
  if (n / 2 != 0) roots[k++] = n / 2;
  if (n - 1 != n / 2 && n - 1 != 0) roots[k++] = n - 1;
  return k;
}

/* Varies in-place use, alignment and NULL-for-unused from case to case. */
static int flags_of(const coll_ctx_t *ctx) {
  unsigned k = ctx->cases;
  return (k % 2 ? CASE_INPLACE : 0) | (k % 3 == 1 ? CASE_UNALIGNED : 0) |
         (k % 4 == 3 ? CASE_NULL : 0);
}

/* avg on bool is refused on every rank, and nothing is left pending. */
static void bool_avg_refused(coll_ctx_t *ctx) {
  uint8_t in[3] = {1, 0, 1}, out[3] = {7, 7, 7};
  mep_req_t *req = NULL;
  CHECK_RC(mep_allreduce(ctx->comm, in, out, 3, MEP_BOOL, MEP_AVG, NULL),
           MEP_ERR_INVALID);
  CHECK_RC(mep_allreduce(ctx->comm, in, out, 3, MEP_BOOL, MEP_AVG, &req),
           MEP_ERR_INVALID);
  CHECK_RC(mep_reduce(ctx->comm, in, out, 3, MEP_BOOL, MEP_AVG, 0, NULL),
           MEP_ERR_INVALID);
  CHECK_RC(mep_reduce_scatter(ctx->comm, in, out, 1, MEP_BOOL, MEP_AVG, NULL),
           MEP_ERR_INVALID);
  CHECK(out[0] == 7 && out[1] == 7 && out[2] == 7,
        "a refused call wrote its output");
}

static void run_reductions(coll_ctx_t *ctx, mep_dtype_t dt, mep_op_t op,
                           size_t count, int root) {
  case_run(ctx, K_ALLREDUCE, dt, op, count, 0, flags_of(ctx));
  case_run(ctx, K_REDUCE, dt, op, count, root, flags_of(ctx));
  case_run(ctx, K_REDUCE_SCATTER, dt, op, count, 0, flags_of(ctx));
}

static void run_movements(coll_ctx_t *ctx, mep_dtype_t dt, size_t count,
                          int root) {
  static const coll_kind_t kinds[] = {K_BROADCAST, K_ALLGATHER, K_ALLTOALL,
                                      K_ALLTOALLV, K_GATHER, K_SCATTER};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    case_run(ctx, kinds[k], dt, MEP_SUM, count, root, flags_of(ctx));
}

static void mode_matrix(coll_ctx_t *ctx) {
  static const size_t counts[] = {1, 1001};
  int roots[3], nroots = roots_of(ctx->n, roots), turn = 0;
  bool_avg_refused(ctx);
  for (int dt = 0; dt < MEP_DTYPE_COUNT; dt++)
    for (int op = 0; op < MEP_OP_COUNT; op++) {
      if (dt == MEP_BOOL && op == MEP_AVG) continue;
      for (size_t i = 0; i < 2; i++)
        run_reductions(ctx, (mep_dtype_t)dt, (mep_op_t)op, counts[i],
                       roots[turn++ % nroots]);
    }
  for (int dt = 0; dt < MEP_DTYPE_COUNT; dt++)
    for (size_t i = 0; i < 2; i++)
      for (int r = 0; r < nroots; r++)
        run_movements(ctx, (mep_dtype_t)dt, counts[i], roots[r]);
}

/* Element counts whose bytes sit on the chunk's edges. */
static size_t sizes_of(const coll_ctx_t *ctx, mep_dtype_t dt,
                       size_t *counts) {
  size_t c = ctx->chunk / ref_size(dt), k = 0;
  counts[k++] = 0;
  counts[k++] = 1;
  counts[k++] = 1001;
  counts[k++] = c - 1;
  counts[k++] = c;
  counts[k++] = c + 1;
  counts[k++] = c * 7 / 2;
  return k;
}

static void mode_sizes(coll_ctx_t *ctx) {
  int roots[3], nroots = roots_of(ctx->n, roots), turn = 0;
  for (int d = 0; d < MEP_DTYPE_COUNT; d++) {
    mep_dtype_t dt = (mep_dtype_t)d;
    size_t counts[8], k = sizes_of(ctx, dt, counts);
    for (size_t i = 0; i < k; i++) {
      int root = roots[turn % nroots];
      mep_op_t op = (mep_op_t)(turn++ % MEP_OP_COUNT);
      if (dt == MEP_BOOL && op == MEP_AVG) op = MEP_PROD;
      run_reductions(ctx, dt, op, counts[i], root);
      run_movements(ctx, dt, counts[i], root);
    }
  }
}

static void mode_algo(coll_ctx_t *ctx) {
  int roots[3], nroots = roots_of(ctx->n, roots);
  for (int dt = 0; dt < MEP_DTYPE_COUNT; dt++) {
    size_t c = ctx->chunk / ref_size((mep_dtype_t)dt);
    size_t counts[] = {1, 1001, c + 1, c * 7 / 2};
    for (size_t i = 0; i < 4; i++) {
      for (int op = 0; op < MEP_OP_COUNT; op++)
        if (dt != MEP_BOOL || op != MEP_AVG)
          case_run(ctx, K_ALLREDUCE, (mep_dtype_t)dt, (mep_op_t)op,
                   counts[i], 0, flags_of(ctx));
      case_run(ctx, K_BROADCAST, (mep_dtype_t)dt, MEP_SUM, counts[i],
               roots[i % (size_t)nroots], flags_of(ctx));
    }
  }
}

/* >= 64 MiB per buffer, odd element counts. */
static void mode_big(coll_ctx_t *ctx) {
  size_t mib64 = (size_t)64 << 20, n = (size_t)ctx->n;
  case_run(ctx, K_ALLREDUCE, MEP_FLOAT32, MEP_SUM, mib64 / 4 + 1, 0, 0);
  case_run(ctx, K_ALLGATHER, MEP_FLOAT32, MEP_SUM, mib64 / 4 / n + 3, 0, 0);
  case_run(ctx, K_ALLTOALL, MEP_INT32, MEP_SUM, mib64 / 4 / n + 5, 0,
           CASE_UNALIGNED);
  case_run(ctx, K_BROADCAST, MEP_UINT8, MEP_SUM, mib64 + 7, ctx->n - 1, 0);
}

/* A rank that arrives late holds everyone else in the barrier: each rank
 * counts itself in through the store before entering, and after the
 * barrier every rank must see the full count. */
static void mode_barrier(coll_ctx_t *ctx) {
  for (int round = 0; round < 2 * ctx->n; round++) {
    char key[64];
    snprintf(key, sizeof key, "colltest/barrier/%d", round);
    if (round % ctx->n == ctx->me) sleep_ms(50);
    int64_t v;
    CHECK_OK(ctx->store->add(ctx->store->ctx, key, 1, &v));
    CHECK_OK(mep_barrier(ctx->comm, NULL));
    CHECK_OK(ctx->store->add(ctx->store->ctx, key, 0, &v));
    CHECK(v == ctx->n, "rank %d: barrier %d returned with %lld of %d ranks "
          "in it", ctx->me, round, (long long)v, ctx->n);
  }
}

/* Ranks that finished a barrier destroy their communicator at once, while
 * the rank furthest down the chain from the late one may still be in it,
 * and the first to see a close start an agreement: the closes are no
 * failure of that barrier, which must end MEP_OK on every rank. A fresh
 * communicator per round, each with another late rank. */
static void mode_leave(coll_ctx_t *ctx) {
  for (int round = 0; round < 2 * ctx->n; round++) {
    char name[64];
    snprintf(name, sizeof name, "colltest-leave-%d", round);
    mep_comm_opts_t o = {.struct_size = sizeof o, .name = name};
    mep_comm_t *comm = NULL;
    CHECK_OK(mep_comm_create(ctx->store, ctx->me, ctx->n, &o, &comm));
    if (round % ctx->n == ctx->me) sleep_ms(20);
    CHECK_OK(mep_barrier(comm, NULL));
    CHECK_OK(mep_comm_destroy(comm));
  }
}

static const struct {
  const char *name;
  void (*fn)(coll_ctx_t *);
} table[] = {{"matrix", mode_matrix},       {"sizes", mode_sizes},
             {"algo", mode_algo}, {"big", mode_big},
             {"barrier", mode_barrier}, {"leave", mode_leave}};
#define NMODES (sizeof table / sizeof table[0])

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)arg;
  coll_ctx_t ctx;
  ctx_init(&ctx, comm, store, run_seed);
  char *list = strdup(modes), *save = NULL;
  for (char *m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save))
    for (size_t i = 0; i < NMODES; i++) {
      if (strcmp(m, table[i].name) != 0) continue;
      long long t0 = now_ms();
      unsigned before = ctx.cases;
      table[i].fn(&ctx);
      hashes_compare(&ctx, m);
      if (ctx.me == 0)
        printf("%s: %u cases on %d ranks in %.1f s\n", m, ctx.cases - before,
               ctx.n, (now_ms() - t0) / 1000.0);
      fflush(stdout);
    }
  free(list);
  ctx_fini(&ctx);
  return 0;
}

int main(int argc, char **argv) {
  CHECK(argc >= 3, "usage: test_coll NRANKS MODE[,MODE...] [KEY=VALUE...]");
  int n = atoi(argv[1]);
  modes = argv[2];
  char *list = strdup(modes), *save = NULL;
  for (char *m = strtok_r(list, ",", &save); m;
       m = strtok_r(NULL, ",", &save)) {
    size_t i = 0;
    while (i < NMODES && strcmp(m, table[i].name) != 0) i++;
    CHECK(i < NMODES, "unknown mode '%s'", m);
  }
  free(list);
  run_seed = harness_args(argc, argv, 3);
  const char *deadline = getenv("COLLTEST_DEADLINE_MS");
  mep_launch_opts_t o = {.size = n,
                         .timeout_ms = deadline ? atoi(deadline) : 280000,
                         .name = "colltest"};
  int failed = mep_launch(&o, body, NULL);
  CHECK(failed == 0, "%d of %d ranks failed", failed, n);
  printf("ok: %s on %d ranks\n", modes, n);
  return 0;
}
