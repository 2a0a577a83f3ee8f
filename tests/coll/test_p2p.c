/* Point-to-point against regenerated data: ping-pong of sizes from 0 to
 * beyond the slot ring, many messages in flight per peer arriving in
 * order, tags received in another order than sent, all pairs at once, and
 * a receive buffer too small for its message.
 * usage: test_p2p NRANKS [KEY=VALUE...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "harness.h"
#include "launch.h"

#define WAIT_MS 60000
#define BIG ((size_t)5 << 20) /* beyond the ring of slots */

static uint64_t run_seed;

/* Content of message k from src to dst on tag. */
static uint64_t msg_seed(int src, int dst, int tag, int k) {
  uint64_t s = run_seed ^ ((uint64_t)(unsigned)src << 48) ^
               ((uint64_t)(unsigned)dst << 32) ^
               ((uint64_t)(unsigned)tag << 16) ^ (uint64_t)(unsigned)k;
  return splitmix64(&s);
}

typedef struct {
  tbuf_t buf;
  size_t want; /* bytes the message has */
  int peer, tag, k;
  mep_req_t *req;
} msg_t;

static void post_send(coll_ctx_t *ctx, msg_t *m, int peer, int tag, int k,
                      size_t len) {
  memset(m, 0, sizeof *m);
  m->peer = peer, m->tag = tag, m->k = k, m->want = len;
  tbuf_alloc(&m->buf, len, (size_t)k % 4, (uint64_t)k);
  fill_random(tbuf_data(&m->buf), len, msg_seed(ctx->me, peer, tag, k));
  int rc = mep_send(ctx->comm, tbuf_data(&m->buf), len, peer, tag, &m->req);
  CHECK(rc == 0, "rank %d: send of %zu bytes to %d tag %d: %d (%s): %s",
        ctx->me, len, peer, tag, rc, mep_strerror(rc), mep_last_error());
}

/* A receive into a buffer of `room` bytes for a message of `len`. */
static void post_recv(coll_ctx_t *ctx, msg_t *m, int peer, int tag, int k,
                      size_t len, size_t room) {
  memset(m, 0, sizeof *m);
  m->peer = peer, m->tag = tag, m->k = k, m->want = len;
  tbuf_alloc(&m->buf, room, (size_t)(k + 1) % 4, ~(uint64_t)k);
  int rc = mep_recv(ctx->comm, tbuf_data(&m->buf), room, peer, tag, &m->req);
  CHECK(rc == 0, "rank %d: recv of %zu bytes from %d tag %d: %d (%s): %s",
        ctx->me, room, peer, tag, rc, mep_strerror(rc), mep_last_error());
}

static void wait_ok(coll_ctx_t *ctx, msg_t *m, const char *what) {
  int rc = mep_req_wait(m->req, WAIT_MS);
  CHECK(rc == 0, "rank %d: %s: peer %d tag %d message %d (%zu bytes): %d "
        "(%s): %s", ctx->me, what, m->peer, m->tag, m->k, m->want, rc,
        mep_strerror(rc), mep_last_error());
}

/* Waits for a receive and checks size, bytes and canaries; frees it. */
static void finish_recv(coll_ctx_t *ctx, msg_t *m, const char *what) {
  wait_ok(ctx, m, what);
  size_t got = mep_req_bytes(m->req);
  CHECK(got == m->want, "rank %d: %s: message %d from %d tag %d has %zu "
        "bytes, want %zu (out of order?)", ctx->me, what, m->k, m->peer,
        m->tag, got, m->want);
  uint8_t *exp = tbuf_pristine(&m->buf);
  fill_random(exp + m->buf.off, m->want, msg_seed(m->peer, ctx->me, m->tag,
                                                  m->k));
  long long at = tbuf_diff(&m->buf, exp);
  CHECK(at == TBUF_SAME, "rank %d: %s: message %d (%zu bytes) from %d tag "
        "%d: byte %lld differs (negative: before the buffer; >= size: "
        "after)", ctx->me, what, m->k, m->want, m->peer, m->tag, at);
  free(exp);
  mep_req_free(m->req);
  tbuf_free(&m->buf);
}

static void finish_send(coll_ctx_t *ctx, msg_t *m, const char *what) {
  wait_ok(ctx, m, what);
  mep_req_free(m->req);
  tbuf_free(&m->buf);
}

static const size_t pp_sizes[] = {0,     1,     7,     1001,          65535,
                                  65536, 65537, (1u << 20) + 3, BIG + 1};
#define NPP (sizeof pp_sizes / sizeof pp_sizes[0])

/* Rank 0 and each peer in turn: there and back, blocking on each side. */
static void ping_pong(coll_ctx_t *ctx) {
  int k = 0;
  for (int p = 1; p < ctx->n; p++)
    for (size_t i = 0; i < NPP; i++, k++) {
      size_t len = pp_sizes[i], room = len + (i % 2) * 100;
      msg_t s, r;
      if (ctx->me == 0) {
        post_send(ctx, &s, p, 3, k, len);
        finish_send(ctx, &s, "ping");
        post_recv(ctx, &r, p, 3, k, len, room);
        finish_recv(ctx, &r, "pong");
      } else if (ctx->me == p) {
        post_recv(ctx, &r, 0, 3, k, len, room);
        finish_recv(ctx, &r, "ping");
        post_send(ctx, &s, 0, 3, k, len);
        finish_send(ctx, &s, "pong");
      }
    }
}

/* Size of message k of many: 0 and 1 first, then up to ~190 KB, every
 * one different, so a message taken out of order is seen by its size. */
static size_t many_size(int k) {
  if (k < 2) return (size_t)k;
  uint64_t s = run_seed + (uint64_t)k;
  return (size_t)k * 3001 + (size_t)(splitmix64(&s) % 3000);
}

#define MANY 64

/* 64 sends to the next rank, then 64 receives from the previous one, all
 * into buffers of the largest size. */
static void many_in_flight(coll_ctx_t *ctx) {
  int next = (ctx->me + 1) % ctx->n, prev = (ctx->me + ctx->n - 1) % ctx->n;
  msg_t *s = xmalloc(MANY * sizeof *s), *r = xmalloc(MANY * sizeof *r);
  size_t room = MANY * 3001 + 3000;
  for (int k = 0; k < MANY; k++)
    post_send(ctx, &s[k], next, 5, k, many_size(k));
  for (int k = 0; k < MANY; k++)
    post_recv(ctx, &r[k], prev, 5, k, many_size(k), room);
  for (int k = MANY; k-- > 0;) finish_recv(ctx, &r[k], "many in flight");
  for (int k = 0; k < MANY; k++) finish_send(ctx, &s[k], "many in flight");
  free(s);
  free(r);
}

/* Tag 1 then tag 2 sent; tag 2 received first, blocking. With a tag-1
 * message larger than the ring, the receiver must set it aside. */
static void tags_reordered(coll_ctx_t *ctx, size_t len1) {
  int next = (ctx->me + 1) % ctx->n, prev = (ctx->me + ctx->n - 1) % ctx->n;
  msg_t s1, s2, r1, r2;
  post_send(ctx, &s1, next, 1, 0, len1);
  post_send(ctx, &s2, next, 2, 0, 999);
  post_recv(ctx, &r2, prev, 2, 0, 999, 999);
  finish_recv(ctx, &r2, "tag 2 before tag 1");
  post_recv(ctx, &r1, prev, 1, 0, len1, len1 + 1);
  finish_recv(ctx, &r1, "tag 1 after tag 2");
  finish_send(ctx, &s1, "tag 1");
  finish_send(ctx, &s2, "tag 2");
}

/* Every rank to every other rank at once, a small and a large message. */
static void all_pairs(coll_ctx_t *ctx) {
  size_t n = (size_t)ctx->n;
  msg_t *s = xmalloc(2 * n * sizeof *s), *r = xmalloc(2 * n * sizeof *r);
  for (int p = 0; p < ctx->n; p++) {
    if (p == ctx->me) continue;
    size_t big = ((size_t)1 << 20) + (size_t)(ctx->me * 7 + p);
    post_send(ctx, &s[2 * p], p, 11, 0, 100 + (size_t)ctx->me);
    post_send(ctx, &s[2 * p + 1], p, 11, 1, big);
  }
  for (int p = 0; p < ctx->n; p++) {
    if (p == ctx->me) continue;
    size_t big = ((size_t)1 << 20) + (size_t)(p * 7 + ctx->me);
    post_recv(ctx, &r[2 * p], p, 11, 0, 100 + (size_t)p, 200);
    post_recv(ctx, &r[2 * p + 1], p, 11, 1, big, big);
  }
  for (int p = 0; p < ctx->n; p++) {
    if (p == ctx->me) continue;
    finish_recv(ctx, &r[2 * p + 1], "all pairs");
    finish_recv(ctx, &r[2 * p], "all pairs");
    finish_send(ctx, &s[2 * p], "all pairs");
    finish_send(ctx, &s[2 * p + 1], "all pairs");
  }
  free(s);
  free(r);
}

/* A receive buffer one byte short fails naming both sizes; the bytes
 * after the buffer stay untouched and the next message on the same tag
 * arrives whole. */
static void too_small(coll_ctx_t *ctx, size_t len, size_t room, int tag) {
  if (ctx->me > 1) return;
  int peer = 1 - ctx->me;
  msg_t m, next;
  if (ctx->me == 0) {
    post_send(ctx, &m, peer, tag, 0, len);
    int rc = mep_req_wait(m.req, WAIT_MS);
    CHECK(rc == 0 || rc == MEP_ERR_INVALID, "rank 0: send of %zu bytes "
          "into a smaller buffer: %d (%s): %s", len, rc, mep_strerror(rc),
          mep_last_error());
    mep_req_free(m.req);
    tbuf_free(&m.buf);
    post_send(ctx, &next, peer, tag, 1, 4321);
    finish_send(ctx, &next, "after a too small buffer");
    return;
  }
  post_recv(ctx, &m, peer, tag, 0, len, room);
  int rc = mep_req_wait(m.req, WAIT_MS);
  char msg[512], a[32], b[32];
  snprintf(msg, sizeof msg, "%s", mep_last_error());
  CHECK(rc == MEP_ERR_INVALID, "rank 1: %zu bytes into %zu: %d (%s), want "
        "MEP_ERR_INVALID: %s", len, room, rc, mep_strerror(rc), msg);
  snprintf(a, sizeof a, "%zu", len);
  snprintf(b, sizeof b, "%zu", room);
  CHECK(strstr(msg, a) && strstr(msg, b), "rank 1: message '%s' lacks the "
        "sizes %s and %s", msg, a, b);
  uint8_t *exp = tbuf_pristine(&m.buf);
  CHECK(memcmp(m.buf.base + m.buf.off + room, exp + m.buf.off + room,
               TBUF_PAD) == 0, "rank 1: bytes after a too small buffer "
        "were overwritten");
  CHECK(memcmp(m.buf.base, exp, m.buf.off) == 0,
        "rank 1: bytes before a too small buffer were overwritten");
  free(exp);
  mep_req_free(m.req);
  tbuf_free(&m.buf);
  post_recv(ctx, &next, peer, tag, 1, 4321, 5000);
  finish_recv(ctx, &next, "after a too small buffer");
  if (len < 10000) printf("  too small: %s\n", msg);
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)arg;
  coll_ctx_t ctx;
  ctx_init(&ctx, comm, store, run_seed);
  long long t0 = now_ms();
  ping_pong(&ctx);
  many_in_flight(&ctx);
  tags_reordered(&ctx, 1000);
  tags_reordered(&ctx, BIG + 3);
  all_pairs(&ctx);
  too_small(&ctx, 1000, 999, 21);
  too_small(&ctx, BIG + 1, (size_t)1 << 20, 22);
  /* Nobody leaves before everyone is done with the messages. */
  CHECK_OK(mep_barrier(comm, NULL));
  if (ctx.me == 0)
    printf("p2p on %d ranks: %.1f s\n", ctx.n, (now_ms() - t0) / 1000.0);
  ctx_fini(&ctx);
  fflush(NULL); /* the launcher ends ranks with _exit */
  return 0;
}

int main(int argc, char **argv) {
  CHECK(argc >= 2, "usage: test_p2p NRANKS [KEY=VALUE...]");
  int n = atoi(argv[1]);
  CHECK(n >= 2, "needs 2 ranks or more");
  run_seed = harness_args(argc, argv, 2);
  mep_launch_opts_t o = {.size = n, .timeout_ms = 200000, .name = "p2p"};
  int failed = mep_launch(&o, body, NULL);
  CHECK(failed == 0, "%d of %d ranks failed", failed, n);
  printf("ok: point-to-point on %d ranks\n", n);
  return 0;
}
