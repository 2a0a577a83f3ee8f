/*
 * test_shm_pair.c - drives the out-of-tree shm transport plugin directly,
 * without libmep: two forked processes (ranks 0 and 1) exchange address
 * and remote-key blobs over a socketpair and check
 *  - writes of 0, 1, 7, 4095, R-1, R, R+1, 3.5R and 64 MiB bytes (R: the
 *    ring size) at odd offsets, each followed by a signal ADD, in both
 *    directions at once, every byte compared with data regenerated from a
 *    shared seed and the bytes around the target unchanged;
 *  - a batch of writes in flight followed by signals SET and ADD;
 *  - out-of-bounds writes and bad signals refused locally, nothing landing;
 *  - a killed peer reported by poll() within 1 s, in-flight writes failed;
 *  - a peer that closes its endpoint: what it sent first still lands, then
 *    it is reported; a write to a deregistered region does not land;
 *  - reachable = 0 for another host id, bad ring_bytes refused, a connect
 *    to a peer that never connects timing out, /dev/shm left clean.
 *
 * Usage: test_shm_pair [PLUGIN.so]  (default: $MEP_TEST_SHM_PLUGIN; exit 77 when
 * neither is given). MEP_TEST_SEED=N repeats a run.
 */
#include <mep/transport.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024u * 1024u)
#define BIG (64u * MIB)
#define SLACK 8192u           /* room for odd offsets around the big write */
#define DATA_BYTES (BIG + SLACK)
#define SIG_BYTES 64u
#define SPARE_BYTES 4096u
#define WAIT_MS 30000
#define KILL_REPORT_MS 1000

static const mep_transport_t *tp;

/* A plugin progresses only inside poll(), so a rank waiting on the socket
 * for the other keeps polling its context (its last signals may still sit
 * in its send queue); what that returns waits here for the next poll. */
static void *drive_ctx;
static mep_tp_completion_t pending[4096];
static int npending;

static int poll_tp(void *ctx, mep_tp_completion_t *out, int max) {
  int n = npending < max ? npending : max;
  memcpy(out, pending, (size_t)n * sizeof *out);
  memmove(pending, pending + n, (size_t)(npending - n) * sizeof *pending);
  npending -= n;
  if (n == max) return n;
  int got = tp->poll(ctx, out + n, max - n);
  return got < 0 ? got : n + got;
}

static void drive(void) {
  if (!drive_ctx || npending == (int)(sizeof pending / sizeof *pending))
    return;
  int got = tp->poll(drive_ctx, pending + npending,
                     (int)(sizeof pending / sizeof *pending) - npending);
  if (got > 0) npending += got;
}
static uint64_t seed;
static int my_rank = -1;
static char last_error[1024];
static const char *cfg_ring_bytes;

/* ------------------------------------------------------------- reporting */

#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) fail_at(__LINE__, #cond, __VA_ARGS__);                       \
  } while (0)

static _Noreturn void fail_at(int line, const char *cond, const char *fmt,
                             ...) MEP_PRINTF(3, 4);
static _Noreturn void fail_at(int line, const char *cond, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "FAIL rank %d line %d (%s): ", my_rank, line, cond);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " [last error: %s] [seed %llu]\n", last_error,
          (unsigned long long)seed);
  exit(1);
}

static void test_log(mep_log_level_t level, const char *fmt, ...)
    MEP_PRINTF(2, 3);
static void test_log(mep_log_level_t level, const char *fmt, ...) {
  if (level > MEP_LOG_WARN && !getenv("MEP_TEST_VERBOSE")) return;
  va_list ap;
  fprintf(stderr, "  [rank %d log %d] ", my_rank, (int)level);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static void test_set_error(const char *fmt, ...) MEP_PRINTF(1, 2);
static void test_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof(last_error), fmt, ap);
  va_end(ap);
}

static const char *test_cfg_get(const void *cfg, const char *key) {
  (void)cfg;
  return strcmp(key, "ring_bytes") == 0 ? cfg_ring_bytes : NULL;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ----------------------------------------------------------- reference data */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Word w of the data `sender` writes in `round`: a function of position,
 * so the receiver regenerates it independently. */
static uint64_t data_word(int round, int sender, uint64_t w) {
  return mix64(seed ^ mix64(((uint64_t)round << 40) ^
                            ((uint64_t)sender << 32) ^ w));
}

/* Bytes [base, base+len) of that data. */
static void gen_data(int round, int sender, uint64_t base, uint8_t *out,
                     uint64_t len) {
  for (uint64_t i = 0; i < len;) {
    uint64_t pos = base + i, w = data_word(round, sender, pos >> 3);
    for (unsigned k = pos & 7; k < 8 && i < len; k++, i++)
      out[i] = (uint8_t)(w >> (8 * k));
  }
}

/* What byte i of a receive region holds when nothing was written there;
 * sentinel_img is the whole region's image, made once. */
static uint8_t sentinel(uint64_t i) { return (uint8_t)(i * 131 + (i >> 9)); }
static uint8_t *sentinel_img;

static void make_sentinel_img(void) {
  sentinel_img = malloc(DATA_BYTES);
  CHECK(sentinel_img, "out of memory");
  for (uint64_t i = 0; i < DATA_BYTES; i++) sentinel_img[i] = sentinel(i);
}

/* Index of the first byte where a and b differ (n if none). */
static uint64_t first_diff(const uint8_t *a, const uint8_t *b, uint64_t n) {
  if (memcmp(a, b, n) == 0) return n;
  uint64_t i = 0;
  while (a[i] == b[i]) i++;
  return i;
}

/* A per-round draw both ranks make identically. */
static uint64_t draw(int round, int sender, int what) {
  return mix64(seed + mix64((uint64_t)round * 1000003 + (uint64_t)sender * 7 +
                            (uint64_t)what));
}

/* ---------------------------------------------------------------- socket */

static void send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    CHECK(n > 0, "send to the other rank failed: %s", strerror(errno));
    p += n;
    len -= (size_t)n;
  }
}

static void recv_all(int fd, void *buf, size_t len) {
  char *p = buf;
  int64_t deadline = now_ms() + WAIT_MS;
  while (len) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int left = (int)(deadline - now_ms());
    CHECK(left > 0, "no message from the other rank within %d ms", WAIT_MS);
    drive();
    if (poll(&pfd, 1, drive_ctx ? 1 : left) <= 0) continue;
    ssize_t n = recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    CHECK(n > 0, "the other rank hung up (%s)", n ? strerror(errno) : "EOF");
    p += n;
    len -= (size_t)n;
  }
}

static void send_blob(int fd, const void *buf, uint32_t len) {
  send_all(fd, &len, sizeof(len));
  send_all(fd, buf, len);
}

static uint32_t recv_blob(int fd, void *buf, uint32_t cap) {
  uint32_t len;
  recv_all(fd, &len, sizeof(len));
  CHECK(len <= cap, "blob of %u bytes exceeds %u", len, cap);
  recv_all(fd, buf, len);
  return len;
}

static void barrier(int fd) {
  char c = 'b';
  send_all(fd, &c, 1);
  recv_all(fd, &c, 1);
  CHECK(c == 'b', "barrier got %c", c);
}

/* ------------------------------------------------------------ environment */

static void make_env(mep_tp_env_t *env, int rank, const char *host,
                     const uint8_t *secret, size_t secret_len, int timeout) {
  memset(env, 0, sizeof(*env));
  env->struct_size = sizeof(*env);
  env->rank = rank;
  env->size = 2;
  env->host_id = host;
  env->secret = secret;
  env->secret_len = secret_len;
  env->timeout_ms = timeout;
  env->cfg_get = test_cfg_get;
  env->log = test_log;
  env->set_error = test_set_error;
}

static size_t get_address(void *ctx, uint8_t *buf) {
  size_t len = MEP_TP_MAX_ADDR;
  CHECK(tp->address(ctx, buf, &len) == 0, "address failed");
  CHECK(len > 0 && len <= MEP_TP_MAX_ADDR, "address blob of %zu bytes", len);
  return len;
}

/* ------------------------------------------------------------- the pair */

typedef struct pair {
  int rank, peer, fd;
  void *ctx, *ep;
  uint8_t *src, *dst, *sig; /* sig: [8] ADD counter, [16] SET word */
  void *src_mr, *dst_mr, *sig_mr;
  void *dst_rmr, *sig_rmr; /* the peer's */
  uint8_t *spare;           /* a region the dereg ending releases */
  void *spare_mr, *spare_rmr;
  uint64_t ring;
  uint64_t added; /* what the peer has added to our counter so far */
} pair_t;

static uint64_t load_word(const uint8_t *p) {
  return atomic_load_explicit((_Atomic uint64_t *)(void *)p,
                              memory_order_acquire);
}

/* The peer's write into our region while a round waits for it. A large
 * write through a small ring completes nothing for a long time, so
 * progress is also its bytes landing: they land in order, and `next`,
 * the first sampled byte not yet seen with its data, moves as they do. A
 * byte that held its data by chance moves it early, which only hides
 * silence for one sample. */
typedef struct arrival {
  const uint8_t *at;
  uint64_t len, next;
  int round, sender;
} arrival_t;

#define ARRIVAL_STRIDE 4096

static uint8_t data_byte(int round, int sender, uint64_t pos) {
  return (uint8_t)(data_word(round, sender, pos >> 3) >> (8 * (pos & 7)));
}

/* 1 if more of it landed since the last call. */
static int arrived_more(arrival_t *a) {
  uint64_t was = a->next;
  while (a->next < a->len &&
         a->at[a->next] == data_byte(a->round, a->sender, a->next))
    a->next += ARRIVAL_STRIDE;
  return a->next != was;
}

/* Polls until every expected token completed and the word at `off` of our
 * signal region reaches `want`. Tokens are [first, first + n); `a` (or
 * NULL) is a write to watch land. The deadline is on silence: a round that
 * keeps moving on a loaded machine (sanitizers, other jobs) is slow, not
 * hung. */
static void wait_round(pair_t *p, uint64_t first, int n, size_t off,
                       uint64_t want, arrival_t *a) {
  char *seen = calloc((size_t)n + 1, 1);
  int done = 0;
  uint64_t last = load_word(p->sig + off);
  int64_t deadline = now_ms() + WAIT_MS;
  for (;;) {
    mep_tp_completion_t c[16];
    int got = poll_tp(p->ctx, c, 16);
    CHECK(got >= 0, "poll returned %d", got);
    for (int i = 0; i < got; i++) {
      uint64_t k = c[i].token - first;
      CHECK(c[i].token >= first && k < (uint64_t)n,
            "unexpected completion token %llu status %d peer %d",
            (unsigned long long)c[i].token, c[i].status, c[i].peer);
      CHECK(!seen[k], "token %llu completed twice",
            (unsigned long long)c[i].token);
      CHECK(c[i].status == 0 && c[i].peer == p->peer,
            "token %llu completed with status %d for peer %d",
            (unsigned long long)c[i].token, c[i].status, c[i].peer);
      seen[k] = 1;
      done++;
    }
    uint64_t v = load_word(p->sig + off);
    int landed = a && arrived_more(a);
    if (got > 0 || v != last || landed) deadline = now_ms() + WAIT_MS;
    last = v;
    if (done == n && v >= want) {
      CHECK(v == want, "signal word at %zu is %llu, want %llu", off,
            (unsigned long long)v, (unsigned long long)want);
      break;
    }
    CHECK(now_ms() < deadline,
          "round stalled for %d ms: %d of %d tokens, word %llu of %llu",
          WAIT_MS, done, n, (unsigned long long)v, (unsigned long long)want);
  }
  free(seen);
}

/* Checks [off, off+len) of our receive region holds the peer's data of
 * `round` (data starting at byte `base` of that round's stream), that the
 * 64 bytes on each side are untouched, then restores the sentinel. */
static void verify_range(pair_t *p, int round, uint64_t off, uint64_t len,
                         uint64_t base) {
  uint8_t *want = malloc(len ? len : 1);
  CHECK(want, "out of memory");
  gen_data(round, p->peer, base, want, len);
  uint64_t d = first_diff(p->dst + off, want, len);
  if (d < len)
    fail_at(__LINE__, "data", "round %d: byte %llu of %llu differs (got %#x, "
            "want %#x)", round, (unsigned long long)d, (unsigned long long)len,
            p->dst[off + d], want[d]);
  free(want);
  uint64_t lo = off >= 64 ? off - 64 : 0;
  uint64_t hi = off + len + 64 <= DATA_BYTES ? off + len + 64 : DATA_BYTES;
  uint64_t below = first_diff(p->dst + lo, sentinel_img + lo, off - lo);
  uint64_t above = first_diff(p->dst + off + len, sentinel_img + off + len,
                              hi - off - len);
  CHECK(below == off - lo && above == hi - off - len,
        "round %d: a byte %s the %llu-byte write changed", round,
        below < off - lo ? "before" : "after", (unsigned long long)len);
  memcpy(p->dst + off, sentinel_img + off, len);
}

static void fill_src(pair_t *p, int round, uint64_t soff, uint64_t len,
                     uint64_t base) {
  gen_data(round, p->rank, base, p->src + soff, len);
}

static uint64_t odd_offset(int round, int sender, int what) {
  return (draw(round, sender, what) % 2048) * 2 + 1;
}

/* One write of `len` bytes each way, then a signal ADD; both check. */
static void round_single(pair_t *p, int round, uint64_t len) {
  uint64_t soff = odd_offset(round, p->rank, 1);
  uint64_t doff = odd_offset(round, p->rank, 2);
  uint64_t delta = 1 + draw(round, p->rank, 3) % 1000;
  fill_src(p, round, soff, len, 0);
  uint64_t token = (uint64_t)round << 16;
  CHECK(tp->write(p->ep, p->src_mr, soff, p->dst_rmr, doff, len, token) == 0,
        "write of %llu bytes", (unsigned long long)len);
  CHECK(tp->signal(p->ep, p->sig_rmr, 8, delta, MEP_SIGNAL_ADD) == 0,
        "signal ADD after %llu bytes", (unsigned long long)len);
  p->added += 1 + draw(round, p->peer, 3) % 1000;
  uint64_t peer_off = odd_offset(round, p->peer, 2);
  arrival_t a = {p->dst + peer_off, len, 0, round, p->peer};
  wait_round(p, token, 1, 8, p->added, &a);
  verify_range(p, round, peer_off, len, 0);
  barrier(p->fd);
}

/* Many writes in flight, then SET and ADD: every byte must be there once
 * either signal is seen. */
static void round_batch(pair_t *p, int round) {
  enum { N = 32 };
  uint64_t most = p->ring * 3 / 2 < 2 * MIB ? p->ring * 3 / 2 : 2 * MIB;
  uint64_t stride = most + 128;
  uint64_t token = (uint64_t)round << 16;
  for (int j = 0; j < N; j++) {
    uint64_t len = draw(round, p->rank, 10 + j) % (most + 1);
    uint64_t off = (uint64_t)j * stride + 65;
    fill_src(p, round, off, len, (uint64_t)j << 32);
    CHECK(tp->write(p->ep, p->src_mr, off, p->dst_rmr, off, len,
                    token + (uint64_t)j) == 0, "batch write %d", j);
  }
  uint64_t set = 0xabc0000000ull + (uint64_t)round * 1000 + (uint64_t)p->rank;
  CHECK(tp->signal(p->ep, p->sig_rmr, 16, set, MEP_SIGNAL_SET) == 0, "SET");
  CHECK(tp->signal(p->ep, p->sig_rmr, 8, 5, MEP_SIGNAL_ADD) == 0, "ADD");
  p->added += 5;
  wait_round(p, token, N, 8, p->added, NULL);
  uint64_t want = 0xabc0000000ull + (uint64_t)round * 1000 + (uint64_t)p->peer;
  CHECK(load_word(p->sig + 16) == want, "SET word %llx, want %llx",
        (unsigned long long)load_word(p->sig + 16), (unsigned long long)want);
  for (int j = 0; j < N; j++) {
    uint64_t len = draw(round, p->peer, 10 + j) % (most + 1);
    verify_range(p, round, (uint64_t)j * stride + 65, len, (uint64_t)j << 32);
  }
  barrier(p->fd);
}

/* Thousands of small writes: many messages per ring turn, wrapping at
 * every alignment. */
static void round_small(pair_t *p, int round) {
  enum { N = 20000, MOST = 61, STRIDE = 192 };
  uint64_t token = (uint64_t)round << 16;
  for (int j = 0; j < N; j++) {
    uint64_t len = 1 + draw(round, p->rank, 100 + j) % MOST;
    uint64_t off = (uint64_t)j * STRIDE + 67;
    fill_src(p, round, off, len, (uint64_t)j << 32);
    CHECK(tp->write(p->ep, p->src_mr, off, p->dst_rmr, off, len,
                    token + (uint64_t)j) == 0, "small write %d", j);
  }
  CHECK(tp->signal(p->ep, p->sig_rmr, 8, 3, MEP_SIGNAL_ADD) == 0, "ADD");
  p->added += 3;
  wait_round(p, token, N, 8, p->added, NULL);
  for (int j = 0; j < N; j++) {
    uint64_t len = 1 + draw(round, p->peer, 100 + j) % MOST;
    verify_range(p, round, (uint64_t)j * STRIDE + 67, len, (uint64_t)j << 32);
  }
  barrier(p->fd);
}

static void expect_refused(int rc, int want, const char *what) {
  CHECK(rc == want, "%s returned %d, want %d", what, rc, want);
  CHECK(last_error[0] != '\0', "%s gave no error message", what);
  last_error[0] = '\0';
}

/* Bad writes and signals are refused locally and nothing lands. */
static void round_bounds(pair_t *p) {
  uint64_t D = DATA_BYTES;
  expect_refused(tp->write(p->ep, p->src_mr, 0, p->dst_rmr, D - 10, 11, 1),
                 MEP_ERR_BOUNDS, "write past the remote end");
  expect_refused(tp->write(p->ep, p->src_mr, D - 5, p->dst_rmr, 0, 6, 1),
                 MEP_ERR_BOUNDS, "write past the local end");
  expect_refused(tp->write(p->ep, p->src_mr, 0, p->dst_rmr, UINT64_MAX, 2, 1),
                 MEP_ERR_BOUNDS, "write at remote offset UINT64_MAX");
  expect_refused(tp->write(p->ep, p->src_mr, UINT64_MAX - 1, p->dst_rmr, 0, 4,
                           1), MEP_ERR_BOUNDS, "write from UINT64_MAX-1");
  expect_refused(tp->write(p->ep, p->src_mr, 8, p->dst_rmr, 8, UINT64_MAX, 1),
                 MEP_ERR_BOUNDS, "write of UINT64_MAX bytes");
  expect_refused(tp->signal(p->ep, p->sig_rmr, SIG_BYTES - 4, 1,
                            MEP_SIGNAL_ADD), MEP_ERR_BOUNDS,
                 "signal past the end");
  expect_refused(tp->signal(p->ep, p->sig_rmr, UINT64_MAX - 3, 1,
                            MEP_SIGNAL_SET), MEP_ERR_BOUNDS,
                 "signal at UINT64_MAX-3");
  int rc = tp->signal(p->ep, p->sig_rmr, 12, 1, MEP_SIGNAL_ADD);
  CHECK(rc == MEP_ERR_INVALID || rc == MEP_ERR_BOUNDS,
        "unaligned signal returned %d", rc);
  rc = tp->signal(p->ep, p->sig_rmr, 8, 1, (mep_signal_op_t)7);
  CHECK(rc == MEP_ERR_INVALID, "signal op 7 returned %d", rc);
  /* The connection still works, and nothing refused arrived. */
  CHECK(tp->signal(p->ep, p->sig_rmr, 8, 1, MEP_SIGNAL_ADD) == 0, "fence");
  p->added += 1;
  wait_round(p, 0, 0, 8, p->added, NULL);
  uint64_t d = first_diff(p->dst, sentinel_img, DATA_BYTES);
  CHECK(d == DATA_BYTES, "byte %llu changed after refused writes",
        (unsigned long long)d);
  barrier(p->fd);
}

/* The killer streams 1 MiB and then 3 x 64 MiB to the victim, kills it
 * once the first write is through, and must see the failure within
 * KILL_REPORT_MS. (A first write of 64 MiB through the 4160-byte ring
 * took more than WAIT_MS under ASan beside other jobs.) */
static void round_kill(pair_t *p, pid_t victim) {
  enum { N = 4 };
  const uint64_t first = 9000;
  for (int j = 0; j < N; j++)
    CHECK(tp->write(p->ep, p->src_mr, 1, p->dst_rmr, 3, j ? BIG : MIB,
                    first + j) == 0, "stream write %d", j);
  int status[N];
  for (int j = 0; j < N; j++) status[j] = 1; /* 1: not completed */
  int64_t t0 = 0, reported = -1, deadline = now_ms() + WAIT_MS;
  while (reported < 0 || t0 == 0) {
    mep_tp_completion_t c[8];
    int got = poll_tp(p->ctx, c, 8);
    CHECK(got >= 0, "poll returned %d", got);
    for (int i = 0; i < got; i++) {
      CHECK(c[i].peer == p->peer, "completion names peer %d", c[i].peer);
      if (c[i].token == MEP_TP_TOKEN_NONE) {
        CHECK(t0 != 0, "failure reported before the kill (status %d)",
              c[i].status);
        CHECK(c[i].status == MEP_ERR_PEER_FAILED, "failure status %d",
              c[i].status);
        CHECK(reported < 0, "the failure was reported twice");
        reported = now_ms();
        continue;
      }
      uint64_t k = c[i].token - first;
      CHECK(c[i].token >= first && k < N, "unexpected token %llu",
            (unsigned long long)c[i].token);
      CHECK(status[k] == 1, "token %llu completed twice",
            (unsigned long long)c[i].token);
      CHECK(c[i].status == 0 || c[i].status == MEP_ERR_PEER_FAILED,
            "stream token %llu status %d", (unsigned long long)c[i].token,
            c[i].status);
      status[k] = c[i].status;
    }
    if (t0 == 0 && status[0] != 1) {
      CHECK(kill(victim, SIGKILL) == 0, "kill %d: %s", (int)victim,
            strerror(errno));
      t0 = now_ms();
    }
    CHECK(now_ms() < deadline, "no failure report within %d ms", WAIT_MS);
  }
  int64_t took = reported - t0;
  printf("rank %d: peer killed, failure reported after %lld ms\n", p->rank,
         (long long)took);
  CHECK(took <= KILL_REPORT_MS, "failure reported after %lld ms",
        (long long)took);
  for (int j = 0; j < N; j++)
    CHECK(status[j] != 1, "stream token %d never completed", j);
  CHECK(status[N - 1] == MEP_ERR_PEER_FAILED,
        "the last 64 MiB write reported %d although the peer died",
        status[N - 1]);
  mep_tp_completion_t c[4];
  CHECK(poll_tp(p->ctx, c, 4) == 0, "completions after the failure");
  expect_refused(tp->write(p->ep, p->src_mr, 0, p->dst_rmr, 0, 8, 1),
                 MEP_ERR_PEER_FAILED, "write to the dead peer");
  expect_refused(tp->signal(p->ep, p->sig_rmr, 8, 1, MEP_SIGNAL_ADD),
                 MEP_ERR_PEER_FAILED, "signal to the dead peer");
}

/* Polls until the peer's failure report; completions of `token` may come
 * first (status 0, or failed). Returns the report's status. */
static int wait_report(pair_t *p, uint64_t token) {
  int64_t deadline = now_ms() + WAIT_MS;
  for (;;) {
    mep_tp_completion_t c[8];
    int got = poll_tp(p->ctx, c, 8);
    CHECK(got >= 0, "poll returned %d", got);
    for (int i = 0; i < got; i++) {
      CHECK(c[i].peer == p->peer, "completion names peer %d", c[i].peer);
      if (c[i].token == MEP_TP_TOKEN_NONE) {
        CHECK(poll_tp(p->ctx, c, 8) == 0, "completions after the report");
        return c[i].status;
      }
      CHECK(c[i].token == token, "unexpected token %llu",
            (unsigned long long)c[i].token);
      CHECK(c[i].status == 0 || c[i].status == MEP_ERR_PEER_FAILED,
            "token status %d", c[i].status);
    }
    CHECK(now_ms() < deadline, "no failure report within %d ms", WAIT_MS);
  }
}

/* The closer streams a last write and signal and closes as soon as they
 * are in the ring, while the other side drains it: that side must still
 * apply all of it, then report the peer gone. */
static void round_close(pair_t *p, int closer, int round) {
  uint64_t len = 2 * p->ring + 5;
  if (p->rank == closer) {
    fill_src(p, round, 11, len, 0);
    CHECK(tp->write(p->ep, p->src_mr, 11, p->dst_rmr, 13, len, 77) == 0,
          "last write");
    CHECK(tp->signal(p->ep, p->sig_rmr, 8, 1, MEP_SIGNAL_ADD) == 0, "ADD");
    for (int64_t deadline = now_ms() + WAIT_MS;;) {
      mep_tp_completion_t c[1];
      int got = poll_tp(p->ctx, c, 1);
      if (got == 1) {
        CHECK(c[0].token == 77 && c[0].status == 0, "last write: %d",
              c[0].status);
        break;
      }
      CHECK(now_ms() < deadline, "last write not complete");
    }
    CHECK(tp->close(p->ep) == 0, "close");
    mep_tp_completion_t c[1];
    CHECK(poll_tp(p->ctx, c, 1) == 0, "completions after our own close");
    expect_refused(tp->write(p->ep, p->src_mr, 0, p->dst_rmr, 0, 8, 1),
                   MEP_ERR_CLOSED, "write on a closed endpoint");
  } else {
    int st = wait_report(p, 0);
    CHECK(st == MEP_ERR_PEER_FAILED, "report status %d", st);
    CHECK(load_word(p->sig + 8) == p->added + 1,
          "the signal sent before close was lost");
    verify_range(p, round, 13, len, 0);
    expect_refused(tp->signal(p->ep, p->sig_rmr, 8, 1, MEP_SIGNAL_ADD),
                   MEP_ERR_PEER_FAILED, "signal to a peer that closed");
  }
  barrier(p->fd);
}

/* A write to a region its owner deregistered must not land: the owner
 * refuses it and reports the sender, who then sees the connection fail. */
static void round_dereg(pair_t *p, int owner) {
  if (p->rank == owner) {
    CHECK(tp->dereg(p->ctx, p->spare_mr) == 0, "dereg spare");
    p->spare_mr = NULL;
    barrier(p->fd);
    int st = wait_report(p, 0);
    CHECK(st == MEP_ERR_BOUNDS || st == MEP_ERR_PROTOCOL,
          "report status %d", st);
    for (uint32_t i = 0; i < SPARE_BYTES; i++)
      CHECK(p->spare[i] == 0x77, "byte %u of the deregistered region changed",
            i);
  } else {
    barrier(p->fd);
    memset(p->src, 0x11, 100);
    CHECK(tp->write(p->ep, p->src_mr, 0, p->spare_rmr, 0, 100, 55) == 0,
          "write to the deregistered region");
    int st = wait_report(p, 55);
    CHECK(st == MEP_ERR_PEER_FAILED, "report status %d", st);
  }
  barrier(p->fd);
}

static void setup_regions(pair_t *p) {
  p->src = aligned_alloc(64, DATA_BYTES);
  p->dst = aligned_alloc(64, DATA_BYTES);
  p->sig = aligned_alloc(64, SIG_BYTES);
  CHECK(p->src && p->dst && p->sig, "out of memory");
  make_sentinel_img();
  memcpy(p->dst, sentinel_img, DATA_BYTES);
  memset(p->src, 0, DATA_BYTES);
  memset(p->sig, 0, SIG_BYTES);
  uint8_t key[3][MEP_TP_MAX_RKEY], peer_key[MEP_TP_MAX_RKEY];
  size_t klen[3] = {MEP_TP_MAX_RKEY, MEP_TP_MAX_RKEY, MEP_TP_MAX_RKEY};
  void *junk;
  size_t jlen = MEP_TP_MAX_RKEY;
  CHECK(tp->reg(p->ctx, p->src, 16, MEP_MEM_CUDA, &junk, key[0], &jlen) ==
        MEP_ERR_UNSUPPORTED, "CUDA memory must be refused");
  CHECK(tp->reg(p->ctx, p->src, DATA_BYTES, MEP_MEM_HOST, &p->src_mr, key[0],
                &klen[0]) == 0, "reg src");
  CHECK(tp->reg(p->ctx, p->dst, DATA_BYTES, MEP_MEM_HOST, &p->dst_mr, key[1],
                &klen[1]) == 0, "reg dst");
  CHECK(tp->reg(p->ctx, p->sig, SIG_BYTES, MEP_MEM_HOST, &p->sig_mr, key[2],
                &klen[2]) == 0, "reg sig");
  p->spare = malloc(SPARE_BYTES);
  CHECK(p->spare, "out of memory");
  memset(p->spare, 0x77, SPARE_BYTES);
  CHECK(tp->reg(p->ctx, p->spare, SPARE_BYTES, MEP_MEM_HOST, &p->spare_mr,
                key[0], &klen[0]) == 0, "reg spare");
  send_blob(p->fd, key[0], (uint32_t)klen[0]);
  for (int i = 1; i < 3; i++) {
    CHECK(klen[i] > 0 && klen[i] <= MEP_TP_MAX_RKEY, "rkey of %zu bytes",
          klen[i]);
    send_blob(p->fd, key[i], (uint32_t)klen[i]);
  }
  uint32_t n = recv_blob(p->fd, peer_key, sizeof(peer_key));
  CHECK(tp->import(p->ep, peer_key, n, &p->spare_rmr) == 0, "import spare");
  n = recv_blob(p->fd, peer_key, sizeof(peer_key));
  CHECK(tp->import(p->ep, peer_key, n, &p->dst_rmr) == 0, "import dst");
  n = recv_blob(p->fd, peer_key, sizeof(peer_key));
  CHECK(tp->import(p->ep, peer_key, n, &p->sig_rmr) == 0, "import sig");
  void *bad;
  CHECK(tp->import(p->ep, peer_key, n - 1, &bad) < 0, "truncated rkey taken");
  last_error[0] = '\0';
}

static void teardown(pair_t *p) {
  CHECK(tp->close(p->ep) == 0, "close");
  CHECK(tp->close(p->ep) == 0, "second close");
  CHECK(tp->unimport(p->ep, p->dst_rmr) == 0, "unimport dst");
  CHECK(tp->unimport(p->ep, p->sig_rmr) == 0, "unimport sig");
  CHECK(tp->unimport(p->ep, p->spare_rmr) == 0, "unimport spare");
  if (p->spare_mr) CHECK(tp->dereg(p->ctx, p->spare_mr) == 0, "dereg spare");
  CHECK(tp->dereg(p->ctx, p->src_mr) == 0, "dereg src");
  CHECK(tp->dereg(p->ctx, p->dst_mr) == 0, "dereg dst");
  CHECK(tp->dereg(p->ctx, p->sig_mr) == 0, "dereg sig");
  drive_ctx = NULL;
  CHECK(tp->fini(p->ctx) == 0, "fini");
  CHECK(tp->fini(p->ctx) == 0, "second fini");
  free(p->src);
  free(p->dst);
  free(p->sig);
  free(p->spare);
  free(sentinel_img);
}

enum ending { END_KILL, END_CLOSE, END_DEREG };

static void rank_main(int rank, int fd, const uint8_t *secret, int ending,
                      int actor, const char *host) {
  my_rank = rank;
  alarm(240); /* a hung plugin kills us; the parent reports it */
  pair_t p = {.rank = rank, .peer = 1 - rank, .fd = fd};
  mep_tp_env_t env;
  make_env(&env, rank, host, secret, 32, 10000);
  CHECK(tp->init(&env, &p.ctx) == 0, "init");
  mep_tp_props_t props = {.struct_size = sizeof(props)};
  CHECK(tp->props(p.ctx, &props) == 0, "props");
  CHECK(props.mem_kinds == MEP_TP_MEM_HOST && props.dev_kind == MEP_DEV_NONE &&
        props.event_fd == -1, "props %u %d %d", props.mem_kinds,
        (int)props.dev_kind, props.event_fd);
  uint8_t blob[MEP_TP_MAX_ADDR], peer_blob[MEP_TP_MAX_ADDR];
  send_blob(fd, blob, (uint32_t)get_address(p.ctx, blob));
  pid_t me = getpid(), peer_pid;
  send_all(fd, &me, sizeof(me));
  uint32_t n = recv_blob(fd, peer_blob, sizeof(peer_blob));
  recv_all(fd, &peer_pid, sizeof(peer_pid));
  char why[128] = "";
  CHECK(tp->reachable(p.ctx, p.peer, peer_blob, n, why, sizeof(why)) == 1,
        "peer not reachable: %s", why);
  CHECK(tp->connect(p.ctx, p.peer, peer_blob, n, &p.ep) == 0, "connect");
  drive_ctx = p.ctx;
  void *dup;
  CHECK(tp->connect(p.ctx, p.peer, peer_blob, n, &dup) == MEP_ERR_INVALID,
        "second connect to a connected peer");
  setup_regions(&p);
  const char *rb = cfg_ring_bytes;
  p.ring = rb ? strtoull(rb, NULL, 10) : 4 * MIB;
  uint64_t R = p.ring;
  const uint64_t sizes[] = {0, 1, 7, 4095, R - 1, R, R + 1, R * 7 / 2, BIG};
  int round = 1;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    round_single(&p, round++, sizes[i]);
  round_batch(&p, round++);
  round_small(&p, round++);
  round_bounds(&p);
  if (ending == END_CLOSE) {
    round_close(&p, actor, round++);
  } else if (ending == END_DEREG) {
    round_dereg(&p, actor);
  } else if (rank == actor) {
    round_kill(&p, peer_pid);
  } else {
    /* The victim keeps draining its ring until it is killed. */
    for (;;) {
      mep_tp_completion_t c[8];
      tp->poll(p.ctx, c, 8);
    }
  }
  teardown(&p);
}

/* ------------------------------------------------------- in-process checks */

static void check_config(void) {
  const char *bad[] = {"12abc", "100", "4097", "0", "2G", "-4096", ""};
  mep_tp_env_t env;
  void *ctx;
  make_env(&env, 0, "cfg-host", NULL, 0, 1000);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    cfg_ring_bytes = bad[i];
    last_error[0] = '\0';
    CHECK(tp->init(&env, &ctx) == MEP_ERR_CONFIG, "ring_bytes '%s' taken",
          bad[i]);
    CHECK(strstr(last_error, "ring_bytes"), "error for '%s' says: %s", bad[i],
          last_error);
  }
  cfg_ring_bytes = "64k";
  CHECK(tp->init(&env, &ctx) == 0, "ring_bytes 64k refused");
  CHECK(tp->fini(ctx) == 0 && tp->fini(ctx) == 0, "fini twice");
  cfg_ring_bytes = NULL;
}

static void check_reachable(void) {
  mep_tp_env_t ea, eb, ec;
  void *a, *b, *c, *ep;
  make_env(&ea, 0, "host-a", NULL, 0, 300);
  make_env(&eb, 1, "host-b", NULL, 0, 300);
  make_env(&ec, 1, "host-a", NULL, 0, 300);
  CHECK(tp->init(&ea, &a) == 0 && tp->init(&eb, &b) == 0 &&
        tp->init(&ec, &c) == 0, "init");
  uint8_t ba[MEP_TP_MAX_ADDR], bb[MEP_TP_MAX_ADDR], bc[MEP_TP_MAX_ADDR];
  size_t la = get_address(a, ba), lb = get_address(b, bb),
         lc = get_address(c, bc);
  char why[128] = "";
  CHECK(tp->reachable(a, 1, bb, lb, why, sizeof(why)) == 0,
        "another host reachable");
  CHECK(strstr(why, "other host (host-b)"), "why: %s", why);
  CHECK(tp->reachable(b, 0, ba, la, why, sizeof(why)) == 0,
        "another host reachable (other side)");
  CHECK(tp->reachable(a, 1, bc, lc, why, sizeof(why)) == 1, "same host: %s",
        why);
  CHECK(tp->reachable(c, 0, ba, la, why, sizeof(why)) == 1, "same host: %s",
        why);
  CHECK(tp->reachable(a, 1, ba, la, why, sizeof(why)) < 0,
        "rank 0's blob taken as rank 1's");
  CHECK(tp->reachable(a, 1, bc, lc - 1, why, sizeof(why)) < 0,
        "truncated blob taken");
  uint8_t junk[64];
  memset(junk, 0x5a, sizeof(junk));
  CHECK(tp->reachable(a, 1, junk, sizeof(junk), why, sizeof(why)) < 0,
        "junk blob taken");
  CHECK(tp->connect(a, 1, bb, lb, &ep) == MEP_ERR_UNREACHABLE,
        "connect to another host");
  /* c never connects: a must give up at its 300 ms deadline. */
  int64_t t0 = now_ms();
  int rc = tp->connect(a, 1, bc, lc, &ep);
  int64_t took = now_ms() - t0;
  CHECK(rc == MEP_ERR_TIMEOUT, "connect to a silent peer returned %d", rc);
  CHECK(took >= 250 && took < 3000, "the 300 ms connect took %lld ms",
        (long long)took);
  CHECK(strstr(last_error, "300 ms"), "timeout message: %s", last_error);
  CHECK(tp->fini(a) == 0 && tp->fini(b) == 0 && tp->fini(c) == 0, "fini");
}

/* ---------------------------------------------------------------- driver */

typedef struct names {
  char **v;
  size_t n;
} names_t;

static names_t shm_names(void) {
  names_t s = {0};
  DIR *d = opendir("/dev/shm");
  for (struct dirent *e; d && (e = readdir(d));) {
    if (strncmp(e->d_name, "mep-shm-", 8) != 0) continue;
    s.v = realloc(s.v, (s.n + 1) * sizeof(*s.v));
    CHECK(s.v, "out of memory");
    s.v[s.n++] = strdup(e->d_name);
  }
  if (d) closedir(d);
  return s;
}

static void free_names(names_t *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
}

/* Names left in /dev/shm that were not there before. Other jobs may hold
 * names briefly while they connect, so a leftover gets two seconds. */
static void check_shm_clean(const names_t *before) {
  for (int tries = 0;; tries++) {
    names_t now = shm_names();
    size_t fresh = 0;
    for (size_t i = 0; i < now.n; i++) {
      int old = 0;
      for (size_t j = 0; j < before->n && !old; j++)
        old = strcmp(now.v[i], before->v[j]) == 0;
      if (!old) {
        fresh++;
        if (tries == 20) fprintf(stderr, "left behind: /dev/shm/%s\n", now.v[i]);
      }
    }
    free_names(&now);
    if (!fresh) return;
    CHECK(tries < 20, "%zu shared-memory objects left in /dev/shm", fresh);
    usleep(100 * 1000);
  }
}

static int wait_child(pid_t pid, int64_t deadline) {
  int status;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (now_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fprintf(stderr, "process %d did not finish in time\n", (int)pid);
      return -1;
    }
    usleep(10 * 1000);
  }
}

/* Runs ranks 0 and 1 in two processes; `actor` kills the other, closes
 * its endpoint or deregisters a region, as `ending` says. */
static void run_pair(const char *ring, int ending, int actor) {
  static const char *const what[] = {"kills", "closes on", "deregisters under"};
  cfg_ring_bytes = ring;
  printf("pair: ring_bytes %s, rank %d %s rank %d\n", ring ? ring : "default",
         actor, what[ending], 1 - actor);
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
  uint8_t secret[32];
  for (int i = 0; i < 32; i++) secret[i] = (uint8_t)(mix64(seed + (uint64_t)i));
  char host[64];
  snprintf(host, sizeof(host), "test-host-%d", (int)getpid());
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    CHECK(pids[r] >= 0, "fork: %s", strerror(errno));
    if (pids[r] == 0) {
      close(sv[1 - r]);
      rank_main(r, sv[r], secret, ending, actor, host);
      exit(0);
    }
  }
  close(sv[0]);
  close(sv[1]);
  int64_t deadline = now_ms() + 250 * 1000;
  int st_actor = wait_child(pids[actor], deadline);
  int st_other = wait_child(pids[1 - actor], deadline);
  CHECK(st_actor != -1 && WIFEXITED(st_actor) && WEXITSTATUS(st_actor) == 0,
        "rank %d ended with status %#x", actor, st_actor);
  if (ending == END_KILL)
    CHECK(st_other != -1 && WIFSIGNALED(st_other) &&
          WTERMSIG(st_other) == SIGKILL,
          "rank %d ended with status %#x instead of being killed", 1 - actor,
          st_other);
  else
    CHECK(st_other != -1 && WIFEXITED(st_other) && WEXITSTATUS(st_other) == 0,
          "rank %d ended with status %#x", 1 - actor, st_other);
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : getenv("MEP_TEST_SHM_PLUGIN");
  if (!path || !*path) {
    printf("SKIP: no plugin to test; set MEP_TEST_SHM_PLUGIN to the out-of-tree "
           "build of libmep-transport-shm.so (or pass it as argument)\n");
    return 77;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(h, "dlopen %s: %s", path, dlerror());
  tp = dlsym(h, MEP_TRANSPORT_SYMBOL);
  CHECK(tp, "%s exports no %s", path, MEP_TRANSPORT_SYMBOL);
  CHECK(tp->abi_major == MEP_TRANSPORT_ABI_MAJOR &&
        tp->struct_size >= sizeof(mep_transport_t) &&
        strcmp(tp->name, "shm") == 0, "plugin %s: abi %u, size %u",
        tp->name, tp->abi_major, tp->struct_size);
  const char *s = getenv("MEP_TEST_SEED");
  if (s) seed = strtoull(s, NULL, 10);
  else CHECK(getrandom(&seed, sizeof(seed), 0) == sizeof(seed), "getrandom");
  printf("seed %llu (MEP_TEST_SEED repeats it)\n", (unsigned long long)seed);
  names_t before = shm_names();
  check_config();
  check_reachable();
  run_pair("4160", END_KILL, 0);
  run_pair(NULL, END_KILL, 1);
  run_pair("65536", END_CLOSE, 1);
  run_pair("8192", END_DEREG, 0);
  check_shm_clean(&before);
  free_names(&before);
  dlclose(h);
  printf("PASS\n");
  return 0;
}
