/* harness.c - settings, canary buffers and cross-rank hash comparison. */
#include "harness.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "ref.h"

void *xmalloc(size_t len) {
  void *p = malloc(len ? len : 1);
  CHECK(p != NULL, "out of memory allocating %zu bytes", len);
  return p;
}

long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

uint64_t harness_args(int argc, char **argv, int first) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t seed = (uint64_t)ts.tv_sec * 1000003u + (uint64_t)ts.tv_nsec;
  for (int i = first; i < argc; i++) {
    char *eq = strchr(argv[i], '=');
    CHECK(eq != NULL && eq != argv[i], "argument '%s' is not KEY=VALUE",
          argv[i]);
    *eq = '\0';
    if (strcmp(argv[i], "seed") == 0)
      seed = strtoull(eq + 1, NULL, 0);
    else
      CHECK(setenv(argv[i], eq + 1, 1) == 0, "setenv %s", argv[i]);
    *eq = '=';
  }
  printf("seed=%" PRIu64 " (pass it as an argument to replay this run)\n",
         seed);
  fflush(stdout);
  return seed;
}

void ctx_init(coll_ctx_t *ctx, mep_comm_t *comm, mep_store_t *store,
              uint64_t seed) {
  memset(ctx, 0, sizeof *ctx);
  ctx->comm = comm;
  ctx->store = store;
  ctx->me = mep_comm_rank(comm);
  ctx->n = mep_comm_size(comm);
  ctx->seed = seed;
  const char *chunk = getenv("MEP_CORE_CHUNK_BYTES");
  ctx->chunk = chunk ? strtoull(chunk, NULL, 0) : 1048576;
  CHECK(ctx->chunk > 0, "MEP_CORE_CHUNK_BYTES='%s'", chunk);
}

void ctx_fini(coll_ctx_t *ctx) {
  for (size_t i = 0; i < ctx->nhashes; i++) free(ctx->labels[i]);
  free(ctx->labels);
  free(ctx->hashes);
  memset(ctx, 0, sizeof *ctx);
}

void hashes_add(coll_ctx_t *ctx, const char *label, const void *buf,
                size_t len) {
  if (ctx->nhashes == ctx->cap) {
    ctx->cap = ctx->cap ? 2 * ctx->cap : 64;
    ctx->hashes = realloc(ctx->hashes, ctx->cap * sizeof *ctx->hashes);
    ctx->labels = realloc(ctx->labels, ctx->cap * sizeof *ctx->labels);
    CHECK(ctx->hashes && ctx->labels, "out of memory");
  }
  ctx->hashes[ctx->nhashes] = ref_hash(buf, len, REF_HASH_INIT);
  ctx->labels[ctx->nhashes] = strdup(label);
  CHECK(ctx->labels[ctx->nhashes] != NULL, "out of memory");
  ctx->nhashes++;
}

void hashes_compare(coll_ctx_t *ctx, const char *section) {
  char key[160];
  snprintf(key, sizeof key, "colltest/hashes/%s/%d", section, ctx->me);
  size_t bytes = ctx->nhashes * sizeof *ctx->hashes;
  CHECK_OK(ctx->store->set(ctx->store->ctx, key, ctx->hashes, bytes));
  if (ctx->me != 0) {
    snprintf(key, sizeof key, "colltest/hashes/%s/0", section);
    void *val = NULL;
    size_t len = 0;
    CHECK_OK(ctx->store->get(ctx->store->ctx, key, &val, &len, 120000));
    CHECK(len == bytes, "rank %d: %s: rank 0 recorded %zu results, I %zu",
          ctx->me, section, len / sizeof(uint64_t), ctx->nhashes);
    const uint64_t *theirs = val;
    for (size_t i = 0; i < ctx->nhashes; i++)
      CHECK(theirs[i] == ctx->hashes[i],
            "rank %d: %s: result differs from rank 0's (it must be "
            "bit-identical on every rank)", ctx->me, ctx->labels[i]);
    free(val);
  }
  for (size_t i = 0; i < ctx->nhashes; i++) free(ctx->labels[i]);
  ctx->nhashes = 0;
}

void store_barrier(coll_ctx_t *ctx, const char *name) {
  char key[160];
  snprintf(key, sizeof key, "colltest/barrier/%s", name);
  int64_t v = 0;
  CHECK_OK(ctx->store->add(ctx->store->ctx, key, 1, &v));
  long long deadline = now_ms() + 60000;
  while (v < ctx->n) {
    CHECK(now_ms() < deadline, "rank %d: store barrier %s: %lld of %d ranks "
          "after 60 s", ctx->me, name, (long long)v, ctx->n);
    sleep_ms(1);
    CHECK_OK(ctx->store->add(ctx->store->ctx, key, 0, &v));
  }
}

void tbuf_alloc(tbuf_t *b, size_t len, size_t off, uint64_t cseed) {
  b->off = off;
  b->len = len;
  b->total = off + len + TBUF_PAD;
  b->cseed = cseed;
  b->base = xmalloc(b->total);
  fill_random(b->base, b->total, cseed);
}

void tbuf_free(tbuf_t *b) {
  free(b->base);
  memset(b, 0, sizeof *b);
}

uint8_t *tbuf_pristine(const tbuf_t *b) {
  uint8_t *p = xmalloc(b->total);
  fill_random(p, b->total, b->cseed);
  return p;
}

long long tbuf_diff(const tbuf_t *b, const uint8_t *expect) {
  if (memcmp(b->base, expect, b->total) == 0) return TBUF_SAME;
  for (size_t i = 0; i < b->total; i++)
    if (b->base[i] != expect[i]) return (long long)i - (long long)b->off;
  return TBUF_SAME;
}
