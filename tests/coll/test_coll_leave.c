/* A rank that finished a collective and destroys its communicator while
 * others still run it is no failure of that collective, with [core]
 * agreement on or off. The collective is an all-to-all-v in which rank 0
 * sends the last rank BIG bytes (the run sets chunks of 4 KiB, two staged
 * per peer: that takes a while) and every other pair a few bytes:
 *  - rank 1 has its few bytes at once, returns, and the launcher destroys
 *    its communicator;
 *  - with 4 ranks, rank 2 too finishes at once, and then does nothing:
 *    it takes rank 1's close for a loss at once, and the survivors agree
 *    on it while ranks 0 and 3 still exchange, so those two learn that
 *    others finished the collective;
 *  - with 3 ranks, ranks 0 and 2 alone are left running it.
 * (That is with agreement off. With it on, no rank returns before every
 * rank holds its data, so they leave together: those runs check that
 * nothing changed there.)
 * Every rank must get MEP_OK and exactly the bytes sent to it. The
 * survivors' next all-reduce then drops rank 1: MEP_OK_DEGRADED, [1]
 * dropped, the sum of the survivors' inputs.
 * usage: test_coll_leave NRANKS(3|4) [KEY=VALUE...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "harness.h"
#include "launch.h"

#define LEAVER 1
#define IDLE 2
#define BIG (16u << 20)
#define COUNT 1001 /* of the all-reduce after */

static uint64_t run_seed;

static size_t pair_bytes(int n, int from, int to) {
  if (from == 0 && to == n - 1) return BIG;
  return 1 + (size_t)(7 * from + 3 * to) % 5;
}

/* What `from` sends `to`. */
static void pair_fill(uint8_t *buf, int n, int from, int to) {
  fill_random(buf, pair_bytes(n, from, to),
              run_seed ^ ((uint64_t)from << 32) ^ (uint64_t)(to + 1) * 977);
}

static void alltoallv_last(coll_ctx_t *ctx) {
  int n = ctx->n, me = ctx->me;
  size_t sc[4], sd[4], rc[4], rd[4], stot = 0, rtot = 0;
  for (int q = 0; q < n; q++) {
    sc[q] = pair_bytes(n, me, q), sd[q] = stot, stot += sc[q];
    rc[q] = pair_bytes(n, q, me), rd[q] = rtot, rtot += rc[q];
  }
  uint8_t *send = xmalloc(stot), *recv = xmalloc(rtot), *want = xmalloc(rtot);
  for (int q = 0; q < n; q++) {
    pair_fill(send + sd[q], n, me, q);
    pair_fill(want + rd[q], n, q, me);
  }
  memset(recv, 0xa5, rtot);
  long long t0 = now_ms();
  CHECK_RC(mep_alltoallv(ctx->comm, send, sc, sd, recv, rc, rd, MEP_UINT8,
                         NULL), MEP_OK);
  if (me == n - 1)
    printf("rank %d: the all-to-all-v took %lld ms\n", me, now_ms() - t0);
  CHECK(memcmp(recv, want, rtot) == 0, "rank %d: the bytes received differ "
        "from those sent", me);
  free(send);
  free(recv);
  free(want);
}

/* Rank r's input to the all-reduce: small integers, so that any order of
 * the float sum is exact. */
static void allreduce_input(float *x, int r) {
  uint64_t s = run_seed ^ (0x9e37u * (uint64_t)(r + 1));
  for (int i = 0; i < COUNT; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((s >> 40) % 1000) - 500.0f;
  }
}

static void allreduce_after(coll_ctx_t *ctx) {
  float x[COUNT], y[COUNT], want[COUNT] = {0};
  for (int r = 0; r < ctx->n; r++) {
    if (r == LEAVER) continue;
    allreduce_input(x, r);
    for (int i = 0; i < COUNT; i++) want[i] += x[i];
  }
  allreduce_input(x, ctx->me);
  mep_req_t *req;
  CHECK_RC(mep_allreduce(ctx->comm, x, y, COUNT, MEP_FLOAT32, MEP_SUM, &req),
           MEP_OK);
  CHECK_RC(mep_req_wait(req, 20000), MEP_OK_DEGRADED);
  int dropped[4];
  CHECK(mep_req_dropped(req, dropped, 4) == 1 && dropped[0] == LEAVER,
        "rank %d: the all-reduce after does not report rank %d dropped",
        ctx->me, LEAVER);
  mep_req_free(req);
  CHECK(memcmp(y, want, sizeof y) == 0, "rank %d: the survivors' sum is "
        "wrong", ctx->me);
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)arg;
  coll_ctx_t ctx;
  ctx_init(&ctx, comm, store, run_seed);
  CHECK_RC(mep_barrier(comm, NULL), MEP_OK); /* every connection is up */
  alltoallv_last(&ctx);
  if (ctx.me != LEAVER) {
    /* long enough for rank 1's close, the agreement and the big message */
    if (ctx.me == IDLE && ctx.n > 3) sleep_ms(3000);
    allreduce_after(&ctx);
  }
  ctx_fini(&ctx);
  fflush(NULL); /* the launcher ends ranks with _exit */
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help")) {
    printf("usage: test_coll_leave NRANKS(3|4) [KEY=VALUE...]\n");
    return argc < 2;
  }
  int n = atoi(argv[1]);
  CHECK(n == 3 || n == 4, "NRANKS is 3 or 4, not %s", argv[1]);
  run_seed = harness_args(argc, argv, 2);
  mep_launch_opts_t o = {.size = n, .timeout_ms = 60000, .name = "leave"};
  int failed = mep_launch(&o, body, NULL);
  CHECK(failed == 0, "%d of %d ranks failed", failed, n);
  printf("ok: a rank left after the collective on %d ranks\n", n);
  return 0;
}
