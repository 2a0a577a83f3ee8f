/* test_devwin_proxy.c - the device window's proxy (core/src/devwin_proxy.c)
 * on plain host memory, between forked ranks over tcp.
 *
 *   test_devwin_proxy NRANKS MODE RING_LEN [SEED] [KEY=VALUE...]
 *
 * Each rank registers a host region laid out as [signal words | stage area
 * per destination | receive area per source], and a producer thread writes
 * commands into a ring the way mep/device/win.cuh does (reserve a slot,
 * wait while the ring is full, write the fields, fence, store seq with
 * release): to every peer, puts of random lengths (0, 1, odd, up to 1 MiB)
 * at odd offsets of seeded bytes, then a signal. Each piece goes as three
 * puts whose bytes continue one another, queued out of order (middle,
 * last, first), as warps queue a row's pieces; the proxy may merge them.
 * One such piece is in the ring before the proxy starts, with the empty
 * puts that fill it (so the producer must wait for ring_done): that
 * piece must go as one put (rings of 8 slots or more). Receivers
 * mep_wait the signals and compare every byte of their receive areas
 * (pieces and the gaps between them) with what the senders' seeds give.
 * A sender overwrites a piece's stage bytes as soon as the proxy hands its
 * slots back (as a kernel reuses them), so slots handed back before the
 * transport read the bytes show as wrong bytes at the receiver.
 * MODE:
 *   clean  nothing goes wrong: the proxy reports no error;
 *   bad    malformed commands (out of bounds, misaligned, bad peer or op)
 *          are mixed in: each is dropped and reported, the rest arrive;
 *   leave  the last rank exits after the set-up: commands to it are
 *          dropped, the proxy reports it, the others' data still arrives.
 * KEY=VALUE arguments go into the environment before the ranks start. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "devwin.h"
#include "launch.h"

enum { CLEAN, BAD, LEAVE };

#define AREA (2u << 20)         /* receive (and stage) bytes per peer */
#define PIECES 12               /* puts per ordered pair */
#define MAX_PIECE (1u << 20)

typedef struct cfg {
  int n, mode;
  uint32_t ring_len;
  uint64_t seed;
} cfg_t;

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The region: n signal words, then stage and receive areas. */
static size_t sig_off(int src) { return (size_t)src * 8; }
static size_t stage_off(const cfg_t *c, int dst) {
  return 64 + (size_t)c->n * 8 + (size_t)dst * AREA;
}
static size_t recv_off(const cfg_t *c, int src) {
  return stage_off(c, c->n) + (size_t)src * AREA;
}
static size_t region_bytes(const cfg_t *c) { return recv_off(c, c->n); }

static uint64_t piece_seed(const cfg_t *c, int src, int dst, int k) {
  uint64_t s = c->seed ^ ((uint64_t)src << 40) ^ ((uint64_t)dst << 20) ^
               (uint64_t)k;
  return splitmix64(&s);
}

/* The k-th piece from src to dst: an offset in the area and a length. The
 * first ones are the edge cases; the gaps between pieces stay zero. */
static void plan(const cfg_t *c, int src, int dst, size_t off[PIECES],
                 size_t len[PIECES]) {
  uint64_t s = c->seed ^ 0x5eedull ^ ((uint64_t)src << 32) ^ (uint64_t)dst;
  size_t cur = 1; /* odd */
  for (int k = 0; k < PIECES; k++) {
    uint64_t r = splitmix64(&s);
    size_t l = k == 0 ? 0 : k == 1 ? 1 : k == 2 ? 7 : k == 3 ? MAX_PIECE
                                                              : r % 40000;
    off[k] = cur;
    len[k] = l;
    cur += l + 1 + (r >> 32) % 6; /* gaps of 1..6 bytes, odd and even */
  }
}

static uint64_t magic(int src, int dst) {
  return 0xabc0000000000000ull | ((uint64_t)src << 16) | (uint64_t)dst;
}

typedef struct rank_ctx {
  const cfg_t *c;
  mep_comm_t *comm;
  uint8_t *base;
  mep_dev_cmd_t *ring;
  uint64_t done;
  uint32_t failed;
  uint64_t tail;      /* slots reserved (the producer is the only one) */
  _Atomic int full;   /* the producer found the ring full */
  int bad_sent;
  int error;          /* the producer's failure */
  /* the pieces sent, in ring order: stage bytes and the slot after their
   * last; [0, scribbled) were overwritten once their slots were done */
  size_t *st_off, *st_len;
  uint64_t *st_end;
  int nst, scribbled;
} rank_ctx_t;

/* Overwrites the stage bytes of every piece whose slots are all done. */
static void scribble(rank_ctx_t *x) {
  uint64_t done = __atomic_load_n(&x->done, __ATOMIC_ACQUIRE);
  for (; x->scribbled < x->nst && x->st_end[x->scribbled] <= done;
       x->scribbled++)
    memset(x->base + x->st_off[x->scribbled], 0xee,
           x->st_len[x->scribbled]);
}

/* As mep__dev_enqueue in win.cuh: reserve, wait for room, fields, fence,
 * seq. */
static int enqueue(rank_ctx_t *x, uint32_t op, int peer, uint64_t src,
                   uint64_t dst, uint64_t arg) {
  uint64_t pos = __atomic_fetch_add(&x->tail, 1, __ATOMIC_RELAXED);
  uint64_t deadline = now_ms() + 30000;
  while (pos - __atomic_load_n(&x->done, __ATOMIC_ACQUIRE) >=
         x->c->ring_len) {
    atomic_store(&x->full, 1);
    if (now_ms() > deadline) return -1;
    sleep_ms(1);
  }
  mep_dev_cmd_t *cmd = &x->ring[pos & (x->c->ring_len - 1)];
  cmd->op = op;
  cmd->peer = peer;
  cmd->src_off = src;
  cmd->dst_off = dst;
  cmd->arg = arg;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&cmd->seq, pos + 1, __ATOMIC_RELEASE);
  return 0;
}

/* Malformed commands, each of which the proxy must drop. */
static int send_bad(rank_ctx_t *x, int peer) {
  const cfg_t *c = x->c;
  uint64_t b = region_bytes(c);
  int rc = 0;
  rc |= enqueue(x, MEP_DEV_CMD_PUT, peer, 0, b - 3, 8);       /* dst end */
  rc |= enqueue(x, MEP_DEV_CMD_PUT, peer, b - 3, 0, 8);       /* src end */
  rc |= enqueue(x, MEP_DEV_CMD_PUT, peer, 0, UINT64_MAX - 2, 8); /* wraps */
  rc |= enqueue(x, MEP_DEV_CMD_SIGNAL, peer, 0, 4, 1);        /* misaligned */
  rc |= enqueue(x, MEP_DEV_CMD_SIGNAL, peer, 0, b, 1);        /* past end */
  rc |= enqueue(x, MEP_DEV_CMD_PUT, mep_comm_rank(x->comm), 0, 0, 8);
  rc |= enqueue(x, MEP_DEV_CMD_PUT, -1, 0, 0, 8);
  rc |= enqueue(x, MEP_DEV_CMD_SIGNAL, c->n + 5, 0, 0, 1);
  rc |= enqueue(x, 77, peer, 0, 0, 8);
  x->bad_sent += 9;
  return rc;
}

/* Piece k to d, staged, then queued as three puts (middle, last, first;
 * fewer for pieces under 3 bytes). */
static int send_piece(rank_ctx_t *x, int d, int k) {
  const cfg_t *c = x->c;
  int me = mep_comm_rank(x->comm);
  size_t off[PIECES], len[PIECES];
  plan(c, me, d, off, len);
  size_t so = stage_off(c, d) + off[k], ro = recv_off(c, me) + off[k];
  fill_random(x->base + so, len[k], piece_seed(c, me, d, k));
  size_t a = len[k] / 3, b = len[k] / 3 + len[k] % 3; /* first, middle */
  size_t part[3][2] = {{a, b}, {a + b, len[k] - a - b}, {0, a}};
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++)
    if (part[i][1] || (i == 0 && len[k] == 0))
      rc = enqueue(x, MEP_DEV_CMD_PUT, d, so + part[i][0], ro + part[i][0],
                   part[i][1]);
  x->st_off[x->nst] = so;
  x->st_len[x->nst] = len[k];
  x->st_end[x->nst++] = __atomic_load_n(&x->tail, __ATOMIC_RELAXED);
  scribble(x);
  return rc;
}

/* The piece queued before the ring fills: rank me's to its successor. */
#define EARLY_PIECE 3

static void *producer(void *arg) {
  rank_ctx_t *x = arg;
  const cfg_t *c = x->c;
  int me = mep_comm_rank(x->comm);
  int first = (me + 1) % c->n;
  x->error = send_piece(x, first, EARLY_PIECE);
  /* more than a ring's worth of empty puts then: the ring fills up
   * before the proxy runs */
  for (uint32_t i = 0; i < c->ring_len + 5 && !x->error; i++)
    x->error = enqueue(x, MEP_DEV_CMD_PUT, first, 0, recv_off(c, me), 0);
  for (int k = 0; k < PIECES && !x->error; k++) {
    for (int d = 0; d < c->n && !x->error; d++) {
      if (d == me || (d == first && k == EARLY_PIECE)) continue;
      x->error = send_piece(x, d, k);
      if (!x->error && c->mode == BAD && k == PIECES / 2)
        x->error = send_bad(x, d);
    }
  }
  for (int d = 0; d < c->n && !x->error; d++)
    if (d != me)
      x->error = enqueue(x, MEP_DEV_CMD_SIGNAL, d, 0, sig_off(me),
                         magic(me, d));
  return NULL;
}

/* Every byte of src's receive area: its pieces, zeros elsewhere. */
static void check_from(const rank_ctx_t *x, int src, int me) {
  const cfg_t *c = x->c;
  size_t off[PIECES], len[PIECES];
  plan(c, src, me, off, len);
  const uint8_t *area = x->base + recv_off(c, src);
  size_t cur = 0;
  for (int k = 0; k < PIECES; k++) {
    for (; cur < off[k]; cur++)
      CHECK(area[cur] == 0, "rank %d: byte %zu from rank %d (a gap before "
            "piece %d) is %u, not 0", me, cur, src, k, area[cur]);
    long long bad = diff_random(area + off[k], len[k],
                                piece_seed(c, src, me, k));
    CHECK(bad < 0, "rank %d: piece %d from rank %d (%zu bytes at %zu) "
          "differs at byte %lld", me, k, src, len[k], off[k], bad);
    cur = off[k] + len[k];
  }
  for (; cur < AREA; cur++)
    CHECK(area[cur] == 0, "rank %d: byte %zu from rank %d (after the last "
          "piece) is %u, not 0", me, cur, src, area[cur]);
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  const cfg_t *c = arg;
  int me = mep_comm_rank(comm), leaver = c->n - 1;
  size_t bytes = region_bytes(c);
  rank_ctx_t x = {.c = c, .comm = comm};
  x.base = aligned_alloc(64, (bytes + 63) / 64 * 64);
  x.ring = aligned_alloc(64, c->ring_len * sizeof *x.ring);
  size_t np = (size_t)PIECES * (size_t)c->n;
  x.st_off = calloc(np, sizeof *x.st_off);
  x.st_len = calloc(np, sizeof *x.st_len);
  x.st_end = calloc(np, sizeof *x.st_end);
  CHECK(x.base && x.ring && x.st_off && x.st_len && x.st_end,
        "out of memory");
  memset(x.base, 0, bytes);
  memset(x.ring, 0, c->ring_len * sizeof *x.ring);
  mep_region_t *r = NULL;
  CHECK_OK(mep_region_register(comm, x.base, bytes, MEP_MEM_HOST, &r));
  CHECK_OK(mep_barrier(comm, NULL)); /* every region is registered */
  if (!mep_cuda_available()) { /* the public API says why it cannot */
    mep_devwin_t *w = (mep_devwin_t *)&x;
    CHECK_RC(mep_devwin_create(comm, 4096, &w), MEP_ERR_UNSUPPORTED);
    CHECK(w == NULL && strstr(mep_last_error(), "CUDA"), "'%s'",
          mep_last_error());
    CHECK_OK(mep_devwin_destroy(NULL));
    CHECK_RC(mep_devwin_drain(NULL), MEP_ERR_INVALID);
  }
  if (c->mode == LEAVE && me == leaver) _exit(0); /* no goodbye */
  if (c->mode == LEAVE) {
    /* wait until the communicator knows, so the drops are certain */
    uint64_t deadline = now_ms() + 10000;
    while (mep_signal(comm, leaver, r, 0, 0, MEP_SIGNAL_SET) == MEP_OK) {
      CHECK(now_ms() < deadline, "rank %d: rank %d's exit went unnoticed",
            me, leaver);
      sleep_ms(20);
    }
  }

  pthread_t th;
  CHECK(pthread_create(&th, NULL, producer, &x) == 0, "pthread_create");
  uint64_t deadline = now_ms() + 10000;
  while (!atomic_load(&x.full)) {
    CHECK(now_ms() < deadline, "rank %d: the producer never found the "
          "ring full", me);
    sleep_ms(1);
  }
  sleep_ms(20);
  CHECK(__atomic_load_n(&x.tail, __ATOMIC_RELAXED) ==
            (uint64_t)c->ring_len + 1 &&
            __atomic_load_n(&x.done, __ATOMIC_ACQUIRE) == 0,
        "rank %d: a full ring: %llu slots reserved, %llu done", me,
        (unsigned long long)x.tail, (unsigned long long)x.done);
  mep__proxy_t *px = NULL;
  CHECK_OK(mep__proxy_start(comm, r, x.ring, c->ring_len, &x.done, &x.failed,
                            &px));

  for (int s = 0; s < c->n; s++) {
    if (s == me || (c->mode == LEAVE && s == leaver)) continue;
    uint64_t seen = 0;
    CHECK_OK(mep_wait(r, sig_off(s), magic(s, me), -1, &seen));
    CHECK(seen == magic(s, me), "rank %d: signal of rank %d is %llx", me, s,
          (unsigned long long)seen);
    check_from(&x, s, me);
  }
  if (c->mode == LEAVE) /* the leaver's area stayed untouched */
    for (size_t i = 0; i < AREA; i++)
      CHECK(x.base[recv_off(c, leaver) + i] == 0, "rank %d: byte %zu of "
            "the leaver's area is set", me, i);
  pthread_join(th, NULL);
  CHECK(x.error == 0, "rank %d: the producer timed out on a full ring", me);
  deadline = now_ms() + 20000;
  while (__atomic_load_n(&x.done, __ATOMIC_ACQUIRE) < x.tail) {
    CHECK(now_ms() < deadline, "rank %d: the proxy did %llu of %llu "
          "commands", me, (unsigned long long)x.done,
          (unsigned long long)x.tail);
    sleep_ms(1);
  }

  /* the early piece's three puts were in the first batch (the ring was
   * full, a batch takes up to half of it, so 8 slots or more): one
   * mep_put */
  uint64_t puts, merged;
  mep__proxy_counts(px, &puts, &merged);
  CHECK(c->ring_len < 8 || (merged >= 2 && merged < puts),
        "rank %d: %llu puts carried out, %llu merged (of %llu commands)", me,
        (unsigned long long)puts, (unsigned long long)merged,
        (unsigned long long)x.tail);

  char msg[600];
  int err = mep__proxy_error(px, msg, sizeof msg);
  switch (c->mode) {
  case CLEAN:
    CHECK(err == 0 && x.failed == 0, "rank %d: proxy error %d (%s), flag %u",
          me, err, msg, x.failed);
    break;
  case BAD:
    CHECK(err == MEP_ERR_BOUNDS || err == MEP_ERR_INVALID, "rank %d: proxy "
          "error %d (%s) after %d bad commands", me, err, msg, x.bad_sent);
    CHECK(x.failed == (uint32_t)-err, "rank %d: flag %u for error %d", me,
          x.failed, err);
    CHECK(strstr(msg, "dropped command") && strstr(msg, "out of bounds"),
          "rank %d: message '%s'", me, msg);
    break;
  case LEAVE: {
    char want[32];
    snprintf(want, sizeof want, "rank %d", leaver);
    CHECK((err == MEP_ERR_PEER_FAILED || err == MEP_ERR_CLOSED) &&
              x.failed != 0 && strstr(msg, want),
          "rank %d: proxy error %d (%s), flag %u", me, err, msg, x.failed);
    break;
  }
  }
  /* the peers have what this rank sent before anyone closes */
  int brc = mep_barrier(comm, NULL);
  CHECK(brc == MEP_OK || (c->mode == LEAVE && brc == MEP_OK_DEGRADED),
        "rank %d: barrier: %d (%s)", me, brc, mep_last_error());
  CHECK_OK(mep__proxy_stop(px, x.tail));
  CHECK_OK(mep_region_deregister(r));
  free(x.st_off);
  free(x.st_len);
  free(x.st_end);
  free(x.ring);
  free(x.base);
  printf("rank %d: ok (%llu commands)\n", me, (unsigned long long)x.tail);
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s NRANKS clean|bad|leave RING_LEN [SEED] "
            "[KEY=VALUE...]\n", argv[0]);
    return 2;
  }
  cfg_t c = {.n = atoi(argv[1]), .ring_len = (uint32_t)atoi(argv[3]),
             .seed = (uint64_t)time(NULL)};
  c.mode = !strcmp(argv[2], "clean") ? CLEAN : !strcmp(argv[2], "bad") ? BAD
           : !strcmp(argv[2], "leave") ? LEAVE : -1;
  int a = 4;
  if (argc > 4 && !strchr(argv[4], '=')) c.seed = strtoull(argv[a++], NULL, 0);
  for (; a < argc; a++) putenv(argv[a]);
  CHECK(c.n >= 2 && c.mode >= 0, "bad arguments");
  CHECK(c.ring_len && !(c.ring_len & (c.ring_len - 1)), "ring length %u is "
        "not a power of two", c.ring_len);
  CHECK(c.mode != LEAVE || c.n >= 3, "leave needs 3 ranks");
  printf("seed %llu\n", (unsigned long long)c.seed);
  fflush(stdout);
  mep_launch_opts_t o = {.size = c.n, .timeout_ms = 120000,
                         .name = "devwin_proxy"};
  int failed = mep_launch(&o, body, &c);
  printf("%s\n", failed ? "FAILED" : "passed");
  return failed ? 1 : 0;
}
