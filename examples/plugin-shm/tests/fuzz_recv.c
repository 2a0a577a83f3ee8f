/*
 * fuzz_recv.c - the receiving side against hostile ring contents.
 *
 * Each iteration fills a fresh receive ring, by hand (not with the plugin's
 * own ring code), with random valid WRITE and SIGNAL messages starting at a
 * random stream position, and at most one message broken in a known way
 * (bad magic, type or operation, unknown or stale region, out of bounds,
 * offset+length overflow, unaligned signal, oversized or truncated
 * payload, a head beyond the ring). After one receive pass the region must
 * equal a shadow copy to which exactly the messages before the broken one
 * were applied, the guard bytes around it must be intact, and the peer
 * must be failed with the expected status and reported once.
 *
 * Usage: fuzz_recv [ITERATIONS]; MEP_TEST_SEED=N repeats a run.
 */
#include "../src/shm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define GUARD 256
#define MAX_REGION 6000

static uint64_t rng_state;
static char last_error[512];
static int errors_logged;

static uint64_t rnd(void) {
  uint64_t x = (rng_state += 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }

#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "FAIL line %d (%s): ", __LINE__, #cond);               \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, " [seed %llu, iteration %d]\n",                         \
              (unsigned long long)seed, iter);                                \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

static uint64_t seed;
static int iter;

static void fuzz_log(mep_log_level_t level, const char *fmt, ...) {
  (void)fmt;
  if (level == MEP_LOG_ERROR) errors_logged++;
}

static void fuzz_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof(last_error), fmt, ap);
  va_end(ap);
}

/* The ways to break one message, and the status each must produce. */
enum {
  OK = 0,
  BAD_MAGIC, BAD_TYPE, BAD_OP, UNKNOWN_REGION, STALE_REGION, PAST_END,
  OVERFLOW, UNALIGNED, OVERSIZED, TRUNCATED, HEAD_BEYOND, PARTIAL_HEADER,
  NKINDS
};

static int expected_status(int kind) {
  switch (kind) {
  case UNKNOWN_REGION: case STALE_REGION: case PAST_END: case OVERFLOW:
  case UNALIGNED:
    return MEP_ERR_BOUNDS;
  default:
    return MEP_ERR_PROTOCOL;
  }
}

typedef struct target {
  uint8_t *ptr;
  uint64_t len;
  uint64_t id;
  uint64_t stale_id;
} target_t;

/* The stream being built: bytes as the ring will hold them. */
typedef struct stream {
  uint8_t *bytes;
  uint64_t len, cap;
} stream_t;

static void put(stream_t *s, const void *p, uint64_t n) {
  CHECK(s->len + n <= s->cap, "stream overflow");
  memcpy(s->bytes + s->len, p, n);
  s->len += n;
}

static void put_msg(stream_t *s, const struct shm_msg *m, const uint8_t *pay,
                    uint64_t n) {
  put(s, m, sizeof(*m));
  if (n) put(s, pay, n);
  static const uint8_t zero[8];
  put(s, zero, shm_pad8(n) - n);
}

/* A valid message for `t`, applied to `shadow` when `apply`. */
static void valid_msg(stream_t *s, const target_t *t, uint64_t room,
                      uint8_t *shadow, int apply) {
  struct shm_msg m = {.magic = SHM_MSG_MAGIC, .region = t->id};
  uint64_t first = (8 - (uintptr_t)t->ptr % 8) % 8; /* first aligned word */
  if (t->len >= first + 8 && below(3) == 0) {
    m.type = SHM_MSG_SIGNAL;
    m.op = (uint16_t)below(2);
    m.offset = first + 8 * below((t->len - first - 8) / 8 + 1);
    m.arg = rnd();
    put_msg(s, &m, NULL, 0);
    if (!apply) return;
    uint64_t w;
    memcpy(&w, shadow + m.offset, 8);
    w = m.op == MEP_SIGNAL_SET ? m.arg : w + m.arg;
    memcpy(shadow + m.offset, &w, 8);
    return;
  }
  uint64_t most = room - sizeof(m) < t->len ? room - sizeof(m) : t->len;
  uint64_t n = below(most + 1) & ~(uint64_t)(below(2) ? 0 : 7);
  uint8_t pay[MAX_REGION];
  for (uint64_t i = 0; i < n; i++) pay[i] = (uint8_t)rnd();
  m.type = SHM_MSG_WRITE;
  m.offset = below(t->len - n + 1);
  m.arg = n;
  put_msg(s, &m, pay, n);
  if (apply) memcpy(shadow + m.offset, pay, n);
}

/* A message broken as `kind` says (HEAD_BEYOND and PARTIAL_HEADER are made
 * by the caller through the head). */
static void broken_msg(stream_t *s, const target_t *t, int kind,
                       uint64_t cap) {
  struct shm_msg m = {.type = SHM_MSG_WRITE, .magic = SHM_MSG_MAGIC,
                      .region = t->id, .offset = 0, .arg = 8};
  uint8_t pay[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint64_t misalign = (uintptr_t)t->ptr % 8;
  switch (kind) {
  case BAD_MAGIC: m.magic ^= 1u << below(32); break;
  case BAD_TYPE: m.type = (uint16_t)(3 + below(1000)); break;
  case BAD_OP:
    m.type = SHM_MSG_SIGNAL;
    m.op = (uint16_t)(2 + below(100));
    m.offset = (8 - misalign) % 8;
    put_msg(s, &m, NULL, 0);
    return;
  case UNKNOWN_REGION:
    m.region = below(2) ? rnd() : (t->id & 0xffffffff00000000ull) | 999;
    break;
  case STALE_REGION: m.region = t->stale_id; break;
  case PAST_END:
    m.offset = t->len - 8 + 1 + below(16);
    break;
  case OVERFLOW:
    m.offset = UINT64_MAX - below(8);
    break;
  case UNALIGNED:
    m.type = SHM_MSG_SIGNAL;
    m.offset = (8 - misalign) % 8 + 1 + below(7);
    m.arg = 5;
    put_msg(s, &m, NULL, 0);
    return;
  case OVERSIZED:
    m.arg = cap - sizeof(m) + 1 + below(1u << 20);
    put(s, &m, sizeof(m));
    return;
  case TRUNCATED: /* claims more payload than the head covers */
    m.arg = 64;
    put(s, &m, sizeof(m));
    put(s, pay, 8);
    return;
  default: break;
  }
  put_msg(s, &m, pay, 8);
}

/* Copies the stream into the ring at `start`, wrapping, by hand. */
static void load_ring(shm_ring_t *r, uint64_t start, const stream_t *s) {
  for (uint64_t i = 0; i < s->len; i++) r->data[(start + i) % r->cap] = s->bytes[i];
}

static shm_ep_t *make_ep(shm_ctx_t *ctx, uint64_t cap, uint64_t start) {
  shm_ep_t *ep = calloc(1, sizeof(*ep));
  shm_op_t *report = calloc(1, sizeof(*report));
  CHECK(ep && report, "out of memory");
  *ep = (shm_ep_t){.tag = SHM_TAG_EP, .ctx = ctx, .peer = 1, .pidfd = -1,
                   .report = report};
  char name[SHM_NAME_MAX], err[256];
  snprintf(name, sizeof(name), "/mep-shm-fuzz-%d", (int)getpid());
  uint8_t nonce[SHM_NONCE_BYTES] = {0};
  CHECK(shm_ring_create(&ep->rx, name, cap, 1, 0, nonce, nonce, err,
                        sizeof(err)) == 0, "ring: %s", err);
  shm_ring_unlink(&ep->rx);
  ep->rx.pos = start;
  atomic_store(&ep->rx.hdr->tail, start);
  return ep;
}

static void run_one(shm_ctx_t *ctx, target_t *t, uint8_t *guarded) {
  static const uint64_t caps[] = {4096, 4160, 8192, 65536};
  uint64_t cap = caps[below(4)];
  uint64_t start = 8 * below(cap * 4);
  shm_ep_t *ep = make_ep(ctx, cap, start);
  uint8_t *shadow = malloc(t->len);
  CHECK(shadow, "out of memory");
  memcpy(shadow, t->ptr, t->len);
  int kind = below(3) == 0 ? 1 + (int)below(NKINDS - 1) : OK;
  int nmsg = 1 + (int)below(12), bad_at = (int)below((uint64_t)nmsg);
  stream_t s = {.bytes = malloc(cap + 64), .cap = cap + 64};
  CHECK(s.bytes, "out of memory");
  int applying = kind != HEAD_BEYOND;
  int in_stream = kind != OK && kind != HEAD_BEYOND && kind != PARTIAL_HEADER;
  /* 96 bytes stay free for the broken message, whatever came before. */
  for (int j = 0; j < nmsg && cap - s.len >= 128; j++) {
    if (j == bad_at && in_stream) break;
    valid_msg(&s, t, cap - s.len - 96, shadow, applying);
  }
  if (in_stream) {
    broken_msg(&s, t, kind, cap);
    /* Valid messages after it must not be applied. */
    if (kind != TRUNCATED && kind != OVERSIZED && cap - s.len >= 128)
      valid_msg(&s, t, cap - s.len - 96, shadow, 0);
  }
  uint64_t head = start + s.len;
  if (kind == PARTIAL_HEADER) {
    struct shm_msg m = {.type = SHM_MSG_SIGNAL, .magic = SHM_MSG_MAGIC};
    uint64_t part = 8 * (1 + below(3));
    put(&s, &m, part);
    head += part;
  }
  if (kind == HEAD_BEYOND) head = start + cap + 8 * (1 + below(1000));
  load_ring(&ep->rx, start, &s);
  atomic_store(&ep->rx.hdr->head, head);
  int rc = shm_recv_progress(ep);
  int want = kind == OK ? 0 : expected_status(kind);
  CHECK(rc == want, "kind %d: receive returned %d, want %d", kind, rc, want);
  CHECK(memcmp(t->ptr, shadow, t->len) == 0,
        "kind %d: the region differs from what the valid messages make", kind);
  for (int i = 0; i < GUARD; i++)
    CHECK(guarded[i] == 0xa5 && t->ptr[t->len + (uint64_t)i] == 0xa5,
          "kind %d: a guard byte changed", kind);
  shm_op_t *rep = shm_queue_pop(&ctx->done);
  if (kind == OK) {
    CHECK(!rep && ep->state == SHM_EP_OPEN, "kind 0: peer failed: %d",
          rep ? rep->status : 0);
    CHECK(atomic_load(&ep->rx.hdr->tail) == head, "tail not at the head");
  } else {
    CHECK(ep->state == SHM_EP_FAILED && rep &&
          rep->token == MEP_TP_TOKEN_NONE && rep->status == want &&
          rep->peer == 1, "kind %d: no failure report", kind);
    CHECK(atomic_load(&ep->rx.hdr->rx_closed) == 1,
          "kind %d: the peer was not told", kind);
    free(rep);
    CHECK(!shm_queue_pop(&ctx->done), "kind %d: reported twice", kind);
  }
  shm_ep_release(ep);
  shm_ep_free(ep);
  free(shadow);
  free(s.bytes);
}

int main(int argc, char **argv) {
  int iterations = argc > 1 ? atoi(argv[1]) : 3000;
  const char *s = getenv("MEP_TEST_SEED");
  if (s) seed = strtoull(s, NULL, 10);
  else if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed)) return 1;
  rng_state = seed;
  printf("seed %llu (MEP_TEST_SEED repeats it)\n", (unsigned long long)seed);
  mep_tp_env_t env = {.struct_size = sizeof(env), .rank = 0, .size = 2,
                      .host_id = "fuzz", .timeout_ms = 1000,
                      .log = fuzz_log, .set_error = fuzz_set_error};
  void *p;
  CHECK(shm_init(&env, &p) == 0, "init: %s", last_error);
  shm_ctx_t *ctx = p;
  uint8_t *arena = malloc(GUARD + MAX_REGION + 8 + GUARD);
  void *stale_mr, *mr;
  uint8_t rkey[MEP_TP_MAX_RKEY];
  size_t rlen = sizeof(rkey);
  CHECK(shm_reg(p, arena, 16, MEP_MEM_HOST, &stale_mr, rkey, &rlen) == 0,
        "reg");
  uint64_t stale_id = ((shm_mr_t *)stale_mr)->id;
  CHECK(shm_dereg(p, stale_mr) == 0, "dereg");
  for (iter = 0; iter < iterations; iter++) {
    /* A region of random length and alignment, between guard bytes. */
    uint64_t len = 8 + below(MAX_REGION - 8);
    uint64_t shift = below(8);
    memset(arena, 0xa5, GUARD + MAX_REGION + 8 + GUARD);
    uint8_t *ptr = arena + GUARD + shift;
    for (uint64_t i = 0; i < len; i++) ptr[i] = (uint8_t)rnd();
    memset(arena, 0xa5, GUARD + shift);
    rlen = sizeof(rkey);
    CHECK(shm_reg(p, ptr, len, MEP_MEM_HOST, &mr, rkey, &rlen) == 0, "reg");
    target_t t = {.ptr = ptr, .len = len, .id = ((shm_mr_t *)mr)->id,
                  .stale_id = stale_id};
    run_one(ctx, &t, ptr - GUARD);
    /* Its slot is reused next time, with a newer generation. */
    stale_id = t.id;
    CHECK(shm_dereg(p, mr) == 0, "dereg");
  }
  CHECK(shm_fini(p) == 0, "fini");
  free(arena);
  printf("PASS: %d iterations, %d bad messages logged\n", iterations,
         errors_logged);
  return 0;
}
