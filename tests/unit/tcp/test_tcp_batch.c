/*
 * test_tcp_batch - the tcp plugin's batching paths, with 1 and 3 sockets
 * per peer, two processes writing to each other at once:
 *  - rounds of 1..8 small writes of random odd sizes (0, 1, up to 16 KiB
 *    and just past it) followed by one signal SET, back to back, without
 *    waiting; the receiver checks every round's bytes the moment its
 *    signal is visible (coalesced sends, greedy parsing of many messages);
 *  - a small write with no signal after it: it must still arrive and
 *    complete while both sides only poll;
 *  - small writes, then a 5 MiB+3 write, then small ones and a signal: the
 *    large payload starts in the read-ahead buffer and continues straight
 *    into the region;
 *  - rank 0 writes a few bytes and closes at once without polling: rank 1
 *    must get the bytes and then see an orderly close, not a failure.
 * Plans come from a seed both sides share; data streams are deterministic
 * per sender (tt_fill), so the receiver checks against its own copy.
 */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcp_test.h"

#define MiB (1024ull * 1024ull)
#define SRC_LEN (8 * MiB + 13)
#define DST_LEN (40 * MiB + 5)
#define W_A 0  /* rounds of phase A seen */
#define W_C 8  /* phase C signalled */
#define DATA0 64
#define ROUNDS 400
#define MAXW 8
#define BIG (5 * MiB + 3)

typedef struct side {
  tt_host_t h;
  int rank, peer, cfd;
  mep_tp_ep_t *ep;
  uint8_t *src, *dst;
  mep_tp_mr_t *smr, *dmr;
  mep_tp_rmr_t *rmr;
  uint64_t seed;
  long issued, completed; /* write tokens (nonzero lengths too) */
  int peer_closed;
} side_t;

typedef struct wr {
  uint64_t soff, doff, len;
} wr_t;

static uint64_t src_seed(const side_t *s, int rank) {
  return s->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1));
}

static uint64_t rng(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

/* The writes `rank` makes: phase A's rounds (nw[r] writes each), then
 * phase B's one, then phase C's: 5 small, BIG, 3 small. Destination
 * ranges never overlap. */
typedef struct plan {
  int nw[ROUNDS];
  wr_t a[ROUNDS][MAXW];
  wr_t b, c[9];
  wr_t d;
} plan_t;

static void make_plan(plan_t *pl, uint64_t seed) {
  uint64_t x = seed | 1, cur = DATA0;
  static const uint64_t odd[] = {0, 1, 7, 4095, 16384, 16385, 12289};
  wr_t *w;
#define PICK(len_)                                                          \
  do {                                                                      \
    w->len = (len_);                                                        \
    w->soff = rng(&x) % (SRC_LEN - w->len + 1);                             \
    w->doff = cur + rng(&x) % 8;                                            \
    cur = w->doff + w->len + 1;                                             \
  } while (0)
  for (int r = 0; r < ROUNDS; r++) {
    pl->nw[r] = 1 + (int)(rng(&x) % MAXW);
    for (int i = 0; i < pl->nw[r]; i++) {
      w = &pl->a[r][i];
      uint64_t v = rng(&x);
      PICK(v % 4 == 0 ? odd[(v >> 8) % 7] : (v >> 8) % 3001);
    }
  }
  w = &pl->b;
  PICK(13 + rng(&x) % 40);
  for (int i = 0; i < 9; i++) {
    w = &pl->c[i];
    PICK(i == 5 ? BIG : 1 + rng(&x) % 100);
  }
  w = &pl->d;
  PICK(1 + rng(&x) % 60);
#undef PICK
  TT_CHECK(cur <= DST_LEN, "plan needs %" PRIu64 " bytes", cur);
}

static uint64_t word(const side_t *s, uint64_t off) {
  return __atomic_load_n((uint64_t *)(void *)(s->dst + off),
                         __ATOMIC_ACQUIRE);
}

static void pump(side_t *s) {
  mep_tp_completion_t c[32];
  int n = s->h.vt->poll(s->h.ctx, c, 32);
  TT_CHECK(n >= 0, "poll returned %d: %s", n, mep_last_error());
  for (int i = 0; i < n; i++) {
    TT_CHECK(c[i].peer == s->peer, "completion names peer %d", c[i].peer);
    if (c[i].token == MEP_TP_TOKEN_NONE) {
      TT_CHECK(c[i].status == MEP_ERR_CLOSED && !s->peer_closed,
               "peer event with status %d", c[i].status);
      s->peer_closed = 1;
      continue;
    }
    TT_CHECK(c[i].status == 0, "token %" PRIu64 " failed: %d", c[i].token,
             c[i].status);
    TT_CHECK(c[i].token >= 1 && c[i].token <= (uint64_t)s->issued,
             "unknown token %" PRIu64, c[i].token);
    s->completed++;
  }
}

static void put(side_t *s, const wr_t *w) {
  TT_OK(s->h.vt->write(s->ep, s->smr, w->soff, s->rmr, w->doff, w->len,
                       (uint64_t)++s->issued));
}

static void check(const side_t *s, const wr_t *w, const char *what) {
  long long bad = tt_verify(s->dst + w->doff, src_seed(s, s->peer), w->soff,
                            w->len);
  TT_CHECK(bad < 0, "%s: %" PRIu64 " bytes at %" PRIu64 ": byte %lld "
           "differs", what, w->len, w->doff, bad);
}

static void all_done(side_t *s) {
  double deadline = tt_now() + 60;
  while (s->completed < s->issued) {
    pump(s);
    TT_CHECK(tt_now() < deadline, "%ld of %ld writes completed",
             s->completed, s->issued);
  }
}

static void pump_any(void *s) { pump(s); }

/* Both sides get here, polling meanwhile (tt_barrier). */
static void barrier(side_t *s) { tt_barrier(s->cfd, pump_any, s); }

static void setup(side_t *s, int nsock) {
  tt_open(&s->h, s->rank, 2, NULL, 0, nsock, "lo", 20000);
  tt_connect(&s->h, s->cfd, s->peer, &s->ep);
  s->src = malloc(SRC_LEN);
  s->dst = calloc(1, DST_LEN);
  TT_CHECK(s->src && s->dst, "out of memory");
  tt_fill(s->src, src_seed(s, s->rank), 0, SRC_LEN);
  tt_regions(&s->h, s->cfd, s->ep, s->src, SRC_LEN, s->dst, DST_LEN, &s->smr,
             &s->dmr, &s->rmr);
}

/* Phase A: every round's writes then its signal, back to back. */
static void rounds(side_t *s, const plan_t *mine, const plan_t *theirs) {
  const mep_transport_t *vt = s->h.vt;
  int checked = 0;
  double deadline = tt_now() + 120;
  for (int r = 0; r < ROUNDS || checked < ROUNDS;) {
    if (r < ROUNDS) {
      for (int i = 0; i < mine->nw[r]; i++) put(s, &mine->a[r][i]);
      TT_OK(vt->signal(s->ep, s->rmr, W_A, (uint64_t)r + 1,
                       MEP_SIGNAL_SET));
      r++;
    }
    if (r % 4 == 0 || r == ROUNDS) pump(s);
    uint64_t v = word(s, W_A);
    TT_CHECK(v <= ROUNDS, "round word is %" PRIu64, v);
    for (; checked < (int)v; checked++)
      for (int i = 0; i < theirs->nw[checked]; i++)
        check(s, &theirs->a[checked][i], "a round's write");
    TT_CHECK(tt_now() < deadline, "%d of %d rounds arrived", checked,
             ROUNDS);
  }
  all_done(s);
  barrier(s);
}

/* Phase B: a write nobody signals still arrives and completes. */
static void unsignalled(side_t *s, const plan_t *mine, const plan_t *theirs) {
  put(s, &mine->b);
  double deadline = tt_now() + 10;
  while (tt_verify(s->dst + theirs->b.doff, src_seed(s, s->peer),
                   theirs->b.soff, theirs->b.len) >= 0 ||
         s->completed < s->issued) {
    pump(s);
    TT_CHECK(tt_now() < deadline, "an unsignalled write of %" PRIu64
             " bytes: %s after 10 s", mine->b.len,
             s->completed < s->issued ? "ours did not complete"
                                      : "the peer's did not arrive");
  }
  barrier(s);
}

/* Phase C: a large write between small ones. */
static void mixed(side_t *s, const plan_t *mine, const plan_t *theirs) {
  for (int i = 0; i < 9; i++) put(s, &mine->c[i]);
  TT_OK(s->h.vt->signal(s->ep, s->rmr, W_C, 1, MEP_SIGNAL_SET));
  double deadline = tt_now() + 60;
  while (word(s, W_C) != 1) {
    pump(s);
    TT_CHECK(tt_now() < deadline, "phase C's signal never came");
  }
  for (int i = 0; i < 9; i++) check(s, &theirs->c[i], "a mixed write");
  all_done(s);
  barrier(s);
}

/* Phase D: rank 0 writes and closes at once; rank 1 gets the bytes, then
 * the orderly close. */
static void write_close(side_t *s, const plan_t *theirs, const plan_t *mine) {
  uint8_t b = 2;
  tt_send(s->cfd, &b, 1); /* both idle: nothing in flight either way */
  tt_recv(s->cfd, &b, 1, 60000);
  if (s->rank == 0) {
    put(s, &mine->d);
    TT_OK(s->h.vt->close(s->ep));
    return;
  }
  double deadline = tt_now() + 10;
  while (!s->peer_closed) {
    pump(s);
    TT_CHECK(tt_now() < deadline, "rank 0's close not seen in 10 s");
  }
  check(s, &theirs->d, "a write right before close");
}

static void run_side(int rank, int cfd, int nsock, uint64_t seed) {
  side_t s = {.rank = rank, .peer = 1 - rank, .cfd = cfd, .seed = seed};
  plan_t *mine = malloc(sizeof *mine), *theirs = malloc(sizeof *theirs);
  TT_CHECK(mine && theirs, "out of memory");
  make_plan(mine, src_seed(&s, rank) ^ 0x5555);
  make_plan(theirs, src_seed(&s, 1 - rank) ^ 0x5555);
  setup(&s, nsock);
  rounds(&s, mine, theirs);
  unsignalled(&s, mine, theirs);
  mixed(&s, mine, theirs);
  write_close(&s, theirs, mine);
  const mep_transport_t *vt = s.h.vt;
  TT_OK(vt->unimport(s.ep, s.rmr));
  TT_OK(vt->close(s.ep));
  TT_OK(vt->dereg(s.h.ctx, s.smr));
  TT_OK(vt->dereg(s.h.ctx, s.dmr));
  tt_close(&s.h);
  free(s.src);
  free(s.dst);
  free(mine);
  free(theirs);
}

static void run_pair(int nsock, uint64_t seed) {
  int sv[2];
  TT_CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv), "socketpair");
  fflush(stdout);
  pid_t pid = fork();
  TT_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    close(sv[0]);
    alarm(200);
    run_side(1, sv[1], nsock, seed);
    exit(0);
  }
  close(sv[1]);
  run_side(0, sv[0], nsock, seed);
  close(sv[0]);
  int st = tt_reap(pid, 30000);
  TT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
           "rank 1 (nsock %d) failed (status %#x)", nsock, st);
  printf("nsock %d: batched writes, unsignalled write, mixed sizes and "
         "write-then-close correct\n", nsock);
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : tt_seed();
  printf("seed %#" PRIx64 "\n", seed);
  alarm(280);
  run_pair(1, seed);
  run_pair(3, seed + 1);
  printf("all batch checks passed\n");
  return 0;
}
