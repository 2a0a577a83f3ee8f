/*
 * test_tcp_close - an orderly close is told from a crash. Two processes,
 * ranks 0 (stays) and 1 (leaves), with 1 and 3 sockets per peer:
 *  - live: rank 1 writes random data (odd sizes, some striped) with a
 *    signal ADD after each, then, once rank 0 saw it and has 256 MiB of
 *    writes to rank 1 in flight that rank 1 never reads, a burst of small
 *    writes and signals, and closes at once: close(ep), then fini. Rank 0,
 *    polling all along, must see every byte and signal before exactly one
 *    {NONE, MEP_ERR_CLOSED, 1}, its 256 MiB write complete with
 *    MEP_ERR_CLOSED, no PEER_FAILED, an info line and no warning, and
 *    later writes and signals refused with MEP_ERR_CLOSED;
 *  - late: the same burst, but rank 0 reads nothing until rank 1 exited,
 *    so signals, data on other sockets and every goodbye wait together in
 *    the kernel: the signals must still apply before the close is
 *    reported;
 *  - dropped: rank 1 closes with a 256 MiB write still queued to a rank 0
 *    that reads nothing: the data is lost, so rank 0 must see
 *    MEP_ERR_PEER_FAILED and a warning, never MEP_ERR_CLOSED.
 * (A peer killed with SIGKILL is test_tcp_pair's.)
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcp_test.h"

#define MiB (1024ull * 1024ull)
#define BIG (256 * MiB)  /* more than any socket buffers take */
#define DATA_SPAN (8 * MiB) /* where the planned writes land */
#define W_CNT 0          /* signal words at the start of the region */
#define W_END 8
#define DATA0 64
#define MAGIC 0x600db7e0ull
#define NBULK 10
#define NBURST 10
#define NPLAN (NBULK + NBURST)
#define TOK_BIG 999

enum { LIVE, LATE, DROPPED };
static const char *const mode_name[] = {"live", "late", "dropped"};

/* ------------------------------------------------------ captured logs */

static int n_warn, n_closed_info, n_lost_warn, n_unsent_info, n_nobye_info;
static char first_warn[512];

static void capture(mep_log_level_t lvl, const char *fmt, ...)
    MEP_PRINTF(2, 3);
static void capture(mep_log_level_t lvl, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (lvl <= MEP_LOG_WARN && !n_warn++)
    snprintf(first_warn, sizeof first_warn, "%s", line);
  if (lvl == MEP_LOG_INFO && strstr(line, "rank 1 closed its connections"))
    n_closed_info++;
  if (lvl == MEP_LOG_WARN && strstr(line, "lost rank 1")) n_lost_warn++;
  if (lvl == MEP_LOG_INFO && strstr(line, "not yet sent")) n_unsent_info++;
  if (lvl == MEP_LOG_INFO && strstr(line, "could not say goodbye"))
    n_nobye_info++;
  if (lvl <= MEP_LOG_INFO) fprintf(stderr, "[pid %d] log %d: %s\n",
                                   (int)getpid(), (int)lvl, line);
}

/* ---------------------------------------------------------- the pair */

typedef struct plan {
  uint64_t soff, doff, len;
} plan_t;

typedef struct side {
  tt_host_t h;
  int rank, cfd, nsock;
  mep_tp_ep_t *ep;
  uint8_t *src, *dst;
  mep_tp_mr_t *smr, *dmr;
  mep_tp_rmr_t *rmr;
  uint64_t seed;
  plan_t plan[NPLAN];
} side_t;

/* Rank 1's writes, the same on both sides: bulk sizes 0, 1, odd, one
 * just past striping (2 x 256 KiB + 3), 3 MiB+5, random; burst sizes
 * small enough to go to the kernel at once (16 KiB in all at most). */
static void make_plan(side_t *s) {
  static const uint64_t bulk[NBULK] = {0, 1, 7, 4095, 65537, 512 * 1024 + 3,
                                       3 * MiB + 5, 0, 0, 0};
  uint8_t r[4 * NPLAN];
  tt_fill(r, s->seed ^ 0x5eed, 0, sizeof r);
  uint64_t so = 3, d = DATA0 + 5;
  for (int i = 0; i < NPLAN; i++) {
    uint64_t rv = r[4 * i] | (uint64_t)r[4 * i + 1] << 8 |
                  (uint64_t)r[4 * i + 2] << 16;
    uint64_t len = i < 7 ? bulk[i]
                   : i < NBULK ? 1 + rv % 200000
                   : i == NBULK ? 1 : i == NBULK + 1 ? 0 : 1 + rv % 1500;
    s->plan[i] = (plan_t){.soff = so, .doff = d, .len = len};
    so += len + 1 + r[4 * i + 3] % 13;
    d += len + 8 + r[4 * i + 3] % 7;
  }
  TT_CHECK(d < DATA_SPAN && so < DATA_SPAN, "plan of %" PRIu64 " bytes", d);
}

static void setup(side_t *s, int nsock) {
  uint8_t secret[16];
  tt_fill(secret, s->seed, 0, sizeof secret);
  tt_open(&s->h, s->rank, 2, secret, sizeof secret, nsock, "lo", 20000);
  s->h.env.log = capture; /* the plugin logs through the env it was given */
  s->nsock = nsock;
  tt_connect(&s->h, s->cfd, 1 - s->rank, &s->ep);
  /* untouched pages of calloc'ed memory cost nothing */
  s->src = calloc(1, BIG);
  s->dst = calloc(1, BIG);
  TT_CHECK(s->src && s->dst, "out of memory");
  if (s->rank == 1) tt_fill(s->src, s->seed, 0, DATA_SPAN);
  tt_regions(&s->h, s->cfd, s->ep, s->src, BIG, s->dst, BIG, &s->smr, &s->dmr,
             &s->rmr);
  make_plan(s);
}

static void teardown(side_t *s) {
  const mep_transport_t *vt = s->h.vt;
  TT_OK(vt->close(s->ep));
  TT_OK(vt->close(s->ep)); /* idempotent */
  TT_OK(vt->unimport(s->ep, s->rmr));
  TT_OK(vt->dereg(s->h.ctx, s->smr));
  TT_OK(vt->dereg(s->h.ctx, s->dmr));
  tt_close(&s->h);
  free(s->src);
  free(s->dst);
}

static uint64_t word(const side_t *s, uint64_t off) {
  return __atomic_load_n((uint64_t *)(void *)(s->dst + off),
                         __ATOMIC_ACQUIRE);
}

/* Rank 1 writes plan[from..to) with a signal ADD after each. */
static void send_plan(side_t *s, int from, int to) {
  for (int i = from; i < to; i++) {
    const plan_t *p = &s->plan[i];
    TT_OK(s->h.vt->write(s->ep, s->smr, p->soff, s->rmr, p->doff, p->len,
                         1 + (uint64_t)i));
    TT_OK(s->h.vt->signal(s->ep, s->rmr, W_CNT, 1, MEP_SIGNAL_ADD));
  }
}

/* Rank 0: write i is all there, and the gap before it still zero. */
static void verify_write(const side_t *s, int i) {
  const plan_t *p = &s->plan[i];
  long long bad = tt_verify(s->dst + p->doff, s->seed, p->soff, p->len);
  TT_CHECK(bad < 0, "write %d (%" PRIu64 " bytes): byte %lld differs when "
           "its signal was visible", i, p->len, bad);
  uint64_t gap = i ? s->plan[i - 1].doff + s->plan[i - 1].len : DATA0;
  for (uint64_t b = gap; b < p->doff; b++)
    TT_CHECK(s->dst[b] == 0, "byte %" PRIu64 " outside the writes changed",
             b);
}

/* ------------------------------------------------------ rank 1 leaves */

static void leaver(side_t *s, int mode) {
  const mep_transport_t *vt = s->h.vt;
  if (mode == DROPPED) {
    TT_OK(vt->write(s->ep, s->smr, DATA_SPAN, s->rmr, DATA_SPAN,
                    BIG - DATA_SPAN, TOK_BIG));
    double until = tt_now() + 0.1;
    while (tt_now() < until) { /* rank 0 reads nothing: it stays queued */
      mep_tp_completion_t c[8];
      int n = vt->poll(s->h.ctx, c, 8);
      TT_CHECK(n == 0, "poll returned %d (token %" PRIu64 " status %d) "
               "while the peer reads nothing", n, n > 0 ? c[0].token : 0,
               n > 0 ? c[0].status : 0);
    }
  } else {
    if (mode == LIVE) {
      send_plan(s, 0, NBULK);
      int done = 0;
      double deadline = tt_now() + 60;
      while (done < NBULK) {
        mep_tp_completion_t c[16];
        int n = vt->poll(s->h.ctx, c, 16);
        TT_CHECK(n >= 0, "poll: %d", n);
        for (int i = 0; i < n; i++, done++)
          TT_CHECK(c[i].status == 0 && c[i].token >= 1 &&
                       c[i].token <= NBULK,
                   "completion {%" PRIu64 ", %d}", c[i].token, c[i].status);
        TT_CHECK(tt_now() < deadline, "bulk: %d of %d writes completed",
                 done, NBULK);
      }
    }
    /* From here on rank 1 polls no more, as a core whose progress thread
     * stopped: rank 0 saw the bulk, so nothing is left queued, and it has
     * its big write to us in flight (live). */
    uint8_t b;
    tt_recv(s->cfd, &b, 1, 60000);
    send_plan(s, NBULK, NPLAN);
    TT_OK(vt->signal(s->ep, s->rmr, W_END, MAGIC, MEP_SIGNAL_SET));
  }
  teardown(s); /* close right away: the goodbye follows the burst */
  TT_CHECK(n_warn == 0, "the leaving side warned: %s", first_warn);
  /* with data queued no goodbye is even tried, else it goes through */
  TT_CHECK(n_unsent_info == (mode == DROPPED) && n_nobye_info == 0,
           "%s: the leaving side said %d times that data was dropped, %d "
           "times that its goodbye failed", mode_name[mode], n_unsent_info,
           n_nobye_info);
}

/* ------------------------------------------------------- rank 0 stays */

typedef struct seen {
  int first, last; /* the planned writes rank 1 sends: [first, last) */
  int closed, failed, big, big_status, checked;
} seen_t;

/* One poll: every completion is counted; writes whose signal is visible
 * are checked. Only rank 1's close, rank 1's failure and our big write
 * may complete. */
static void observe(side_t *s, seen_t *v) {
  mep_tp_completion_t c[16];
  int n = s->h.vt->poll(s->h.ctx, c, 16);
  TT_CHECK(n >= 0, "poll: %d", n);
  for (int i = 0; i < n; i++) {
    TT_CHECK(c[i].peer == 1, "completion names peer %d", c[i].peer);
    if (c[i].token == MEP_TP_TOKEN_NONE) {
      TT_CHECK(c[i].status == MEP_ERR_CLOSED ||
                   c[i].status == MEP_ERR_PEER_FAILED,
               "peer report with status %d", c[i].status);
      if (c[i].status == MEP_ERR_CLOSED) {
        /* the close is reported after every signal before it applied */
        TT_CHECK(word(s, W_CNT) == (uint64_t)(v->last - v->first) &&
                     word(s, W_END) == MAGIC,
                 "closed reported with the signal count at %" PRIu64
                 " of %d, the last signal %s", word(s, W_CNT),
                 v->last - v->first,
                 word(s, W_END) == MAGIC ? "applied" : "missing");
        v->closed++;
      } else {
        v->failed++;
      }
      continue;
    }
    TT_CHECK(c[i].token == TOK_BIG && !v->big++, "token %" PRIu64
             " (status %d) unknown or twice", c[i].token, c[i].status);
    v->big_status = c[i].status;
  }
  uint64_t cnt = word(s, W_CNT);
  TT_CHECK(cnt <= (uint64_t)(v->last - v->first), "signal count %" PRIu64,
           cnt);
  for (; v->checked < (int)cnt; v->checked++)
    verify_write(s, v->first + v->checked);
}

static void stayer(side_t *s, int mode, pid_t leaver_pid) {
  const mep_transport_t *vt = s->h.vt;
  seen_t v = {.first = mode == LIVE ? 0 : NBULK,
              .last = mode == DROPPED ? NBULK : NPLAN};
  uint8_t go = 1;
  if (mode == LIVE) {
    double deadline = tt_now() + 60;
    while (v.checked < NBULK) {
      observe(s, &v);
      TT_CHECK(tt_now() < deadline, "bulk: %d of %d writes seen", v.checked,
               NBULK);
    }
    TT_CHECK(!v.closed && !v.failed && !v.big, "completions during the bulk");
    TT_OK(vt->write(s->ep, s->smr, DATA_SPAN, s->rmr, DATA_SPAN,
                    BIG - DATA_SPAN, TOK_BIG));
    tt_send(s->cfd, &go, 1);
  } else {
    if (mode == LATE) tt_send(s->cfd, &go, 1);
    /* rank 0 reads nothing until rank 1 is gone */
    int st = tt_reap(leaver_pid, 60000);
    TT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
             "rank 1 failed (status %#x)", st);
  }
  double t0 = tt_now();
  while (!(v.closed || v.failed) || (mode == LIVE && !v.big)) {
    observe(s, &v);
    TT_CHECK(tt_now() - t0 < 20, "no report of rank 1 within 20 s (closed "
             "%d, failed %d, big write %d)", v.closed, v.failed, v.big);
  }
  double until = tt_now() + 0.3; /* and nothing more comes */
  while (tt_now() < until) observe(s, &v);
  const char *want = mode_name[mode];
  int rc_want = mode == DROPPED ? MEP_ERR_PEER_FAILED : MEP_ERR_CLOSED;
  if (mode == DROPPED) {
    TT_CHECK(v.failed == 1 && v.closed == 0, "%s: %d failure and %d close "
             "reports, want 1 failure", want, v.failed, v.closed);
    TT_CHECK(n_lost_warn == 1 && n_closed_info == 0, "%s: %d warnings of "
             "the loss, %d info lines of a close", want, n_lost_warn,
             n_closed_info);
  } else {
    TT_CHECK(v.closed == 1 && v.failed == 0, "%s: %d close and %d failure "
             "reports, want 1 close", want, v.closed, v.failed);
    TT_CHECK(v.checked == v.last - v.first, "%d of %d writes seen",
             v.checked, v.last - v.first);
    TT_CHECK(n_warn == 0, "%s: a warning: %s", want, first_warn);
    TT_CHECK(n_closed_info == 1, "%s: %d info lines of the close", want,
             n_closed_info);
  }
  if (mode == LIVE)
    TT_CHECK(v.big == 1 && v.big_status == MEP_ERR_CLOSED, "the 256 MiB "
             "write rank 1 never read completed %d times, status %d", v.big,
             v.big_status);
  TT_CHECK(vt->write(s->ep, s->smr, 0, s->rmr, 0, 8, 5) == rc_want,
           "%s: a later write", want);
  TT_CHECK(strstr(mep_last_error(), "rank 1"), "%s: the refusal says '%s'",
           want, mep_last_error());
  TT_CHECK(vt->signal(s->ep, s->rmr, 0, 1, MEP_SIGNAL_ADD) == rc_want,
           "%s: a later signal", want);
  teardown(s);
}

static void run(int mode, int nsock, uint64_t seed) {
  int sv[2];
  TT_CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv), "socketpair");
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  TT_CHECK(pid >= 0, "fork");
  side_t s = {.rank = pid ? 0 : 1, .cfd = pid ? sv[0] : sv[1], .seed = seed};
  close(pid ? sv[1] : sv[0]);
  n_warn = n_closed_info = n_lost_warn = n_unsent_info = n_nobye_info = 0;
  if (pid == 0) {
    alarm(120);
    setup(&s, nsock);
    leaver(&s, mode);
    exit(0);
  }
  setup(&s, nsock);
  stayer(&s, mode, pid);
  close(s.cfd);
  if (mode == LIVE) {
    int st = tt_reap(pid, 30000);
    TT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
             "rank 1 failed (status %#x)", st);
  }
  printf("ok: %s close, %d socket%s per peer\n", mode_name[mode], nsock,
         nsock > 1 ? "s" : "");
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : tt_seed();
  printf("seed %#" PRIx64 "\n", seed);
  alarm(280);
  static const int nsocks[] = {1, 3};
  for (int k = 0; k < 2; k++)
    for (int mode = LIVE; mode <= DROPPED; mode++)
      run(mode, nsocks[k], seed + (uint64_t)(3 * k + mode));
  printf("all close checks passed\n");
  return 0;
}
