/*
 * test_tcp_reconnect - a rank is dropped and replaced, again and again
 * (transport ABI 1.1). One "survivor" context lives through the test; a
 * sequence of replacement processes of the other rank (fork and exec;
 * each a new context: new address blob, same secret, same rank) connects
 * to it, in both roles: the survivor as rank 0 of 2 (it dials, 1 socket
 * per peer) and as rank 1 of 3 (it accepts, 3 sockets per peer; rank 2
 * never connects: env->size counts rank slots). Each of 100 cycles per role:
 * connect, random writes of odd sizes (0, 1, odd, striped) and signals
 * both ways, verified byte for byte, then one of these ends:
 *  - the replacement is SIGKILLed, and the survivor closes at once, or
 *    after poll() with no room (a failure report is queued: close must
 *    drop it), or after it saw the report;
 *  - the replacement closes and finis its context, and the survivor
 *    closes after its report or without having polled;
 *  - every 10th: the replacement is frozen (SIGSTOP) with 256 MiB of
 *    writes queued to it; close() must return within 1 s and those writes
 *    complete with a negative status in the very next poll(). As acceptor,
 *    the next replacement dials already while the frozen one's ep is open
 *    (it is refused for now and retries).
 * After close no completion may name the rank until the next connect, and
 * none but the writes' own while the healthy successor runs. Open fds and
 * allocated bytes of the survivor are equal before and after the cycles.
 * Then, as acceptor: a stale rank-0 process dials while the rank is
 * closed (refused until its deadline, "closed its endpoint"), and another
 * while the survivor's connect() waits for a different incarnation
 * (refused, "waits in connect() for another process"), after which that
 * incarnation connects. Last, a fresh survivor: a process dials it before
 * its connect() (stashed), dies with its failure report queued, and
 * connect() names another process: that one connects, and no report of the
 * dead one comes.
 * Every wait has a deadline; every child is reaped.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
/* ASan's allocator, which glibc's mallinfo2 does not see (libasan exports
 * it; gcc ships no header for it) */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#include "tcp_test.h"

#define MiB (1024ull * 1024ull)
#define BIG (256 * MiB) /* regions: more than any socket buffers take */
#define SPAN (2 * MiB)  /* where the planned writes land */
#define DATA0 64        /* after the signal words */
#define W_CNT 0         /* ADD 1 per write */
#define W_END 8         /* SET to the cycle's magic, last */
#define NW 7            /* planned writes per direction and cycle */
#define CYCLES 100
#define MAXPEND 16
#define TOK_BIG 0xb16000ull
#define CLOSE_LIMIT_S 1.0

static uint8_t g_secret[24];
static uint64_t g_seed; /* main's; the secret is made from it */

/* ----------------------------------------------------------- the plan */

typedef struct plan {
  uint64_t soff, doff, len;
} plan_t;

static uint64_t rnd64(uint64_t seed, uint64_t i) {
  uint8_t b[8];
  tt_fill(b, seed ^ 0x9a7e, 8 * i, 8);
  uint64_t v = 0;
  for (int k = 7; k >= 0; k--) v = v << 8 | b[k];
  return v;
}

/* NW writes, the same on both sides: 0, 1 and 4095 bytes, odd sizes,
 * and every 4th cycle one past striping (1 MiB + 3) for more sockets. */
static void make_plan(plan_t *pl, uint64_t seed, int cycle) {
  uint64_t sizes[NW] = {0,
                        1,
                        1 + 2 * (rnd64(seed, 0) % 40),
                        4095,
                        1 + rnd64(seed, 1) % 70000,
                        cycle % 4 == 0 ? MiB + 3 : 1 + rnd64(seed, 2) % 300000,
                        1 + rnd64(seed, 3) % 17};
  uint64_t so = 1 + rnd64(seed, 4) % 7, d = DATA0 + rnd64(seed, 5) % 5;
  for (int i = 0; i < NW; i++) {
    uint64_t r = rnd64(seed, 6 + (uint64_t)i);
    pl[i] = (plan_t){.soff = so, .doff = d, .len = sizes[i]};
    so += sizes[i] + 1 + r % 13;
    d += sizes[i] + 8 + (r >> 8) % 7;
  }
  TT_CHECK(d < SPAN && so < SPAN, "plan of %" PRIu64 " bytes", d);
}

static uint64_t word(const uint8_t *base, uint64_t off) {
  return __atomic_load_n((const uint64_t *)(const void *)(base + off),
                         __ATOMIC_ACQUIRE);
}

/* The writes of `pl` (stream `seed`) all landed in dst, and nothing else
 * of the data span changed. */
static void verify_plan(const uint8_t *dst, const plan_t *pl, uint64_t seed,
                        const char *who, int cycle) {
  uint64_t at = DATA0;
  for (int i = 0; i < NW; i++) {
    for (uint64_t b = at; b < pl[i].doff; b++)
      TT_CHECK(dst[b] == 0, "%s, cycle %d: byte %" PRIu64 " outside the "
               "writes changed", who, cycle, b);
    long long bad = tt_verify(dst + pl[i].doff, seed, pl[i].soff, pl[i].len);
    TT_CHECK(bad < 0, "%s, cycle %d: write %d (%" PRIu64 " bytes): byte %lld "
             "differs", who, cycle, i, pl[i].len, bad);
    at = pl[i].doff + pl[i].len;
  }
  for (uint64_t b = at; b < at + 4096 && b < SPAN; b++)
    TT_CHECK(dst[b] == 0, "%s, cycle %d: byte %" PRIu64 " after the writes "
             "changed", who, cycle, b);
}

static uint64_t magic_of(uint64_t seed) { return seed | 1; }

/* --------------------------------------------------------- one side */

/* A context with a source and a destination region, and its accounting
 * of completions. */
typedef struct side {
  tt_host_t h;
  const char *who;
  int peer;
  mep_tp_ep_t *ep;
  mep_tp_rmr_t *rmr;
  uint8_t *src, *dst;
  mep_tp_mr_t *smr, *dmr;
  uint8_t rkey[MEP_TP_MAX_RKEY];
  size_t rkey_len;
  uint64_t pend[MAXPEND]; /* tokens of writes in flight */
  int npend;
  uint64_t done_tok[MAXPEND];
  int done_st[MAXPEND], ndone;
  int reports, report_status; /* {NONE, status, peer} seen */
  int may_report;             /* such a report is allowed now */
} side_t;

/* Zeroed pages that cost nothing until touched (calloc would write them
 * all under MALLOC_PERTURB_, as meson sets it). */
static uint8_t *big_zeroed(void) {
  void *p = mmap(NULL, BIG, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  TT_CHECK(p != MAP_FAILED, "mmap of %llu bytes: %s",
           (unsigned long long)BIG, strerror(errno));
  return p;
}

static void side_regions(side_t *s) {
  s->src = big_zeroed();
  s->dst = big_zeroed();
  uint8_t k[MEP_TP_MAX_RKEY];
  size_t kl = sizeof k;
  TT_OK(s->h.vt->reg(s->h.ctx, s->src, BIG, MEP_MEM_HOST, &s->smr, k, &kl));
  s->rkey_len = sizeof s->rkey;
  TT_OK(s->h.vt->reg(s->h.ctx, s->dst, BIG, MEP_MEM_HOST, &s->dmr, s->rkey,
                     &s->rkey_len));
}

static void side_unregions(side_t *s) {
  TT_OK(s->h.vt->dereg(s->h.ctx, s->smr));
  TT_OK(s->h.vt->dereg(s->h.ctx, s->dmr));
  munmap(s->src, BIG);
  munmap(s->dst, BIG);
}

/* One poll of at most max completions (0: progress only). Every
 * completion must name the peer; a token must be one in flight; a report
 * of the peer only while may_report. */
static int side_poll(side_t *s, int max, int cycle) {
  mep_tp_completion_t c[32];
  int n = s->h.vt->poll(s->h.ctx, max ? c : NULL, max);
  TT_CHECK(n >= 0 && n <= max, "%s: poll returned %d", s->who, n);
  for (int i = 0; i < n; i++) {
    TT_CHECK(c[i].peer == s->peer, "%s, cycle %d: a completion (token %#"
             PRIx64 ", status %d) names rank %d", s->who, cycle, c[i].token,
             c[i].status, c[i].peer);
    if (c[i].token == MEP_TP_TOKEN_NONE) {
      TT_CHECK(s->may_report, "%s, cycle %d: a report {NONE, %d, rank %d} "
               "came when none may (after close, or from a healthy "
               "successor)", s->who, cycle, c[i].status, c[i].peer);
      TT_CHECK(c[i].status < 0, "%s: a report with status %d", s->who,
               c[i].status);
      s->reports++;
      s->report_status = c[i].status;
      continue;
    }
    int k = 0;
    while (k < s->npend && s->pend[k] != c[i].token) k++;
    TT_CHECK(k < s->npend, "%s, cycle %d: token %#" PRIx64 " (status %d) "
             "is not in flight", s->who, cycle, c[i].token, c[i].status);
    s->pend[k] = s->pend[--s->npend];
    TT_CHECK(s->ndone < MAXPEND, "too many completions");
    s->done_tok[s->ndone] = c[i].token;
    s->done_st[s->ndone++] = c[i].status;
  }
  return n;
}

static void side_write(side_t *s, uint64_t loff, uint64_t roff, uint64_t len,
                       uint64_t token) {
  TT_CHECK(s->npend < MAXPEND, "too many writes in flight");
  TT_OK(s->h.vt->write(s->ep, s->smr, loff, s->rmr, roff, len, token));
  s->pend[s->npend++] = token;
}

/* The status a completed token had, or 1 if it did not complete. */
static int done_status(const side_t *s, uint64_t token) {
  for (int i = 0; i < s->ndone; i++)
    if (s->done_tok[i] == token) return s->done_st[i];
  return 1;
}

/* Writes plan pl (stream seed, written into src) with a signal ADD after
 * each, then the SET of the magic. */
static void send_plan(side_t *s, const plan_t *pl, uint64_t seed) {
  tt_fill(s->src, seed, 0, SPAN);
  for (int i = 0; i < NW; i++) {
    side_write(s, pl[i].soff, pl[i].doff, pl[i].len, 1 + (uint64_t)i);
    TT_OK(s->h.vt->signal(s->ep, s->rmr, W_CNT, 1, MEP_SIGNAL_ADD));
  }
  TT_OK(s->h.vt->signal(s->ep, s->rmr, W_END, magic_of(seed),
                        MEP_SIGNAL_SET));
}

/* Polls until our writes completed (status 0) and the peer's arrived. */
static void await_traffic(side_t *s, uint64_t in_seed, int cycle) {
  double deadline = tt_now() + 30;
  while (s->npend || word(s->dst, W_CNT) < NW ||
         word(s->dst, W_END) != magic_of(in_seed)) {
    side_poll(s, 32, cycle);
    TT_CHECK(tt_now() < deadline, "%s, cycle %d: traffic incomplete after "
             "30 s (%d writes in flight, %" PRIu64 " of %d signals in)",
             s->who, cycle, s->npend, word(s->dst, W_CNT), NW);
  }
  TT_CHECK(word(s->dst, W_CNT) == NW, "%s, cycle %d: %" PRIu64 " signals",
           s->who, cycle, word(s->dst, W_CNT));
  for (int i = 0; i < s->ndone; i++)
    TT_CHECK(s->done_st[i] == 0, "%s, cycle %d: write token %" PRIu64
             " completed with %d", s->who, cycle, s->done_tok[i],
             s->done_st[i]);
  s->ndone = 0;
}

/* Is the control socket readable now? */
static int readable(int fd) {
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  return poll(&pf, 1, 0) > 0;
}

/* ------------------------------------------------- the replacement */

typedef struct child_cfg {
  int rank, size, nsock, timeout_ms;
  int gate;     /* wait for 'G' before connect() */
  uint64_t seed; /* the cycle's */
  int cycle;
} child_cfg_t;

/* No fd but cfd may stay open here: one the survivor closes would keep
 * its connection up. Those of the plugin and of this test are all
 * close-on-exec; what the test's own parent passed on may not be. */
static void close_inherited(int keep) {
  int fds[1024], n = 0;
  DIR *d = opendir("/proc/self/fd");
  TT_CHECK(d, "opendir /proc/self/fd");
  for (struct dirent *e; (e = readdir(d)) && n < 1024;) {
    if (e->d_name[0] == '.') continue;
    int fd = atoi(e->d_name);
    if (fd > 2 && fd != keep && fd != dirfd(d)) fds[n++] = fd;
  }
  closedir(d);
  for (int i = 0; i < n; i++) close(fds[i]);
}

/* Sends connect's result: the code, then the message. */
static void send_result(int cfd, int rc) {
  int32_t v = rc;
  tt_send(cfd, &v, sizeof v);
  const char *m = rc ? mep_last_error() : "";
  tt_send(cfd, m, strlen(m) + 1);
}

static int recv_result(int cfd, char *msg, size_t cap, int timeout_ms) {
  int32_t v = 0;
  tt_recv(cfd, &v, sizeof v, timeout_ms);
  size_t n = tt_recv(cfd, msg, cap, timeout_ms);
  msg[n ? n - 1 : 0] = '\0';
  return v;
}

static _Noreturn void child_main(int cfd, const child_cfg_t *c) {
  close_inherited(cfd);
  alarm(90);
  side_t s = {.who = "replacement", .peer = 1 - c->rank};
  tt_open(&s.h, c->rank, c->size, g_secret, sizeof g_secret, c->nsock, "lo",
          c->timeout_ms);
  const mep_transport_t *vt = s.h.vt;
  uint8_t blob[MEP_TP_MAX_ADDR];
  size_t n = sizeof blob;
  TT_OK(vt->address(s.h.ctx, blob, &n));
  tt_send(cfd, blob, n);
  n = tt_recv(cfd, blob, sizeof blob, 30000);
  if (c->gate) {
    uint8_t g = 0;
    tt_recv(cfd, &g, 1, 30000);
    TT_CHECK(g == 'G', "gate: %c", g);
  }
  int rc = vt->connect(s.h.ctx, s.peer, blob, n, &s.ep);
  send_result(cfd, rc);
  if (rc) {
    tt_close(&s.h);
    exit(0);
  }
  side_regions(&s);
  tt_send(cfd, s.rkey, s.rkey_len);
  uint8_t rk[MEP_TP_MAX_RKEY];
  size_t rkl = tt_recv(cfd, rk, sizeof rk, 30000);
  TT_OK(vt->import(s.ep, rk, rkl, &s.rmr));
  plan_t out[NW], in[NW];
  uint64_t out_seed = c->seed ^ 0x2222, in_seed = c->seed ^ 0x1111;
  make_plan(out, out_seed, c->cycle);
  make_plan(in, in_seed, c->cycle);
  send_plan(&s, out, out_seed);
  await_traffic(&s, in_seed, c->cycle);
  verify_plan(s.dst, in, in_seed, "replacement", c->cycle);
  uint8_t v = 'V';
  tt_send(cfd, &v, 1);
  /* Until told to leave (or killed): keep polling; the survivor's writes
   * and its close may come. */
  s.may_report = 1;
  double deadline = tt_now() + 60;
  for (;;) {
    side_poll(&s, 32, c->cycle);
    if (readable(cfd)) break;
    TT_CHECK(tt_now() < deadline, "replacement: never told to leave");
    usleep(200);
  }
  uint8_t cmd = 0;
  tt_recv(cfd, &cmd, 1, 1000);
  TT_CHECK(cmd == 'F', "replacement: command %c", cmd);
  TT_OK(vt->unimport(s.ep, s.rmr));
  TT_OK(vt->close(s.ep));
  side_unregions(&s);
  tt_close(&s.h);
  uint8_t bye = 'B';
  tt_send(cfd, &bye, 1);
  exit(0);
}

typedef struct child {
  pid_t pid;
  int cfd;
  uint64_t seed;
  int cycle;
} child_t;

/* The replacement is a new program, not a copy of this one: fork() and
 * exec. A forked copy of a process with more threads than its own (the
 * survivor's context may run a sender thread) inherits every lock another
 * thread held at the fork, taken for good; an allocator's among them
 * (ASan's, whose runtime here takes no lock around fork()) leaves the
 * copy's own threads stuck at their first malloc. */
static child_t spawn(const child_cfg_t *cfg, const uint8_t *sblob,
                     size_t sblob_len) {
  int sv[2];
  TT_CHECK(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv),
           "socketpair");
  char a[9][32];
  snprintf(a[0], sizeof a[0], "%d", sv[1]);
  snprintf(a[1], sizeof a[1], "%#" PRIx64, g_seed);
  snprintf(a[2], sizeof a[2], "%d", cfg->rank);
  snprintf(a[3], sizeof a[3], "%d", cfg->size);
  snprintf(a[4], sizeof a[4], "%d", cfg->nsock);
  snprintf(a[5], sizeof a[5], "%d", cfg->timeout_ms);
  snprintf(a[6], sizeof a[6], "%d", cfg->gate);
  snprintf(a[7], sizeof a[7], "%#" PRIx64, cfg->seed);
  snprintf(a[8], sizeof a[8], "%d", cfg->cycle);
  char *argv[] = {"test_tcp_reconnect", "--child", a[0], a[1], a[2], a[3],
                  a[4], a[5], a[6], a[7], a[8], NULL};
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  TT_CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) { /* async-signal-safe calls only until exec */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    fcntl(sv[1], F_SETFD, 0);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(sv[1]);
  tt_send(sv[0], sblob, sblob_len);
  return (child_t){.pid = pid, .cfd = sv[0], .seed = cfg->seed,
                   .cycle = cfg->cycle};
}

/* main() of a replacement: argv as spawn() writes it. */
static int child_entry(char **argv) {
  int cfd = atoi(argv[2]);
  g_seed = strtoull(argv[3], NULL, 0);
  tt_fill(g_secret, g_seed, 0, sizeof g_secret);
  child_cfg_t c = {.rank = atoi(argv[4]), .size = atoi(argv[5]),
                   .nsock = atoi(argv[6]), .timeout_ms = atoi(argv[7]),
                   .gate = atoi(argv[8]),
                   .seed = strtoull(argv[9], NULL, 0),
                   .cycle = atoi(argv[10])};
  signal(SIGPIPE, SIG_IGN);
  child_main(cfd, &c);
}

static void reap(child_t *ch, int want_sig, const char *what) {
  int st = tt_reap(ch->pid, 20000);
  if (want_sig)
    TT_CHECK(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == want_sig,
             "%s: the replacement ended with status %#x, not signal %d",
             what, st, want_sig);
  else
    TT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
             "%s: the replacement failed (status %#x)", what, st);
  close(ch->cfd);
  ch->pid = 0;
  ch->cfd = -1;
}

/* ------------------------------------------------------ the survivor */

typedef struct surv {
  side_t s;
  int rank, size, nsock;
  int peer_rank;
  uint8_t blob[MEP_TP_MAX_ADDR];
  size_t blob_len;
} surv_t;

enum { END_KILL_AT_ONCE, END_KILL_QUEUED, END_KILL_SEEN, END_FINI_UNPOLLED,
       END_FINI_SEEN, END_STOP };
static const char *const end_name[] = {
    "SIGKILL, close at once", "SIGKILL, close with its report queued",
    "SIGKILL, close after its report", "fini, close unpolled",
    "fini, close after its report", "SIGSTOP with 256 MiB queued"};

static int end_of(int cycle) {
  if (cycle % 10 == 9) return END_STOP;
  static const int order[] = {END_KILL_AT_ONCE, END_FINI_SEEN,
                              END_KILL_QUEUED, END_FINI_UNPOLLED,
                              END_KILL_SEEN};
  return order[cycle % 5];
}

static child_cfg_t cfg_for(const surv_t *S, int cycle, uint64_t seed) {
  return (child_cfg_t){.rank = S->peer_rank, .size = S->size,
                       .nsock = S->nsock, .timeout_ms = 20000,
                       .seed = seed ^ ((uint64_t)cycle << 20),
                       .cycle = cycle};
}

/* connect() to the child's context, and the regions both ways. */
static void meet(surv_t *S, child_t *ch) {
  side_t *s = &S->s;
  uint8_t blob[MEP_TP_MAX_ADDR];
  size_t n = tt_recv(ch->cfd, blob, sizeof blob, 30000);
  memset(s->dst, 0, SPAN);
  int mine = s->h.vt->connect(s->h.ctx, S->peer_rank, blob, n, &s->ep);
  char why[512], msg[512] = "";
  snprintf(why, sizeof why, "%s", mine ? mep_last_error() : "");
  int rc = mine && !readable(ch->cfd)
               ? 1
               : recv_result(ch->cfd, msg, sizeof msg, 30000);
  TT_CHECK(!mine && !rc, "cycle %d: connect failed: the survivor's: %d: %s; "
           "the replacement's: %d: %s", ch->cycle, mine, why, rc,
           rc == 1 ? "(no answer yet)" : msg);
  tt_send(ch->cfd, s->rkey, s->rkey_len);
  uint8_t rk[MEP_TP_MAX_RKEY];
  size_t rkl = tt_recv(ch->cfd, rk, sizeof rk, 30000);
  TT_OK(s->h.vt->import(s->ep, rk, rkl, &s->rmr));
}

static void traffic(surv_t *S, child_t *ch) {
  side_t *s = &S->s;
  plan_t out[NW], in[NW];
  uint64_t out_seed = ch->seed ^ 0x1111, in_seed = ch->seed ^ 0x2222;
  make_plan(out, out_seed, ch->cycle);
  make_plan(in, in_seed, ch->cycle);
  send_plan(s, out, out_seed);
  await_traffic(s, in_seed, ch->cycle);
  verify_plan(s->dst, in, in_seed, "survivor", ch->cycle);
  double deadline = tt_now() + 30;
  while (!readable(ch->cfd)) { /* the replacement verified its side */
    side_poll(s, 32, ch->cycle);
    TT_CHECK(tt_now() < deadline, "cycle %d: the replacement never "
             "verified", ch->cycle);
    usleep(100);
  }
  uint8_t v = 0;
  tt_recv(ch->cfd, &v, 1, 1000);
  TT_CHECK(v == 'V', "cycle %d: replacement said %c", ch->cycle, v);
}

/* Polls (with room for completions) for `secs`, or with want_report
 * until a report of the peer arrived. */
static void poll_for(surv_t *S, double secs, int want_report, int cycle) {
  double until = tt_now() + secs;
  while (tt_now() < until && !(want_report && S->s.reports)) {
    side_poll(&S->s, 32, cycle);
    usleep(100);
  }
}

/* Unimport and close (twice: idempotent); from now on no report of the
 * rank may come. *took (may be NULL): how long the first close took. */
static void close_ep(surv_t *S, double *took) {
  side_t *s = &S->s;
  TT_OK(s->h.vt->unimport(s->ep, s->rmr));
  double t0 = tt_now();
  TT_OK(s->h.vt->close(s->ep));
  if (took) *took = tt_now() - t0;
  TT_OK(s->h.vt->close(s->ep)); /* idempotent */
  s->may_report = 0;
  s->reports = 0;
}

static void end_cycle(surv_t *S, child_t *ch, int how, child_t *next,
                      uint64_t seed) {
  side_t *s = &S->s;
  const mep_transport_t *vt = s->h.vt;
  int cycle = ch->cycle;
  s->may_report = 1;
  s->reports = 0;
  switch (how) {
  case END_KILL_AT_ONCE:
  case END_KILL_QUEUED:
  case END_KILL_SEEN:
    TT_CHECK(!kill(ch->pid, SIGKILL), "kill");
    if (how == END_KILL_QUEUED) { /* progress with no room: it queues */
      double until = tt_now() + 0.03; /* the end of a killed process's
                                         connection is on loopback at once */
      while (tt_now() < until) side_poll(s, 0, cycle);
    } else if (how == END_KILL_SEEN) {
      poll_for(S, 10, 1, cycle);
      TT_CHECK(s->reports == 1 && s->report_status == MEP_ERR_PEER_FAILED,
               "cycle %d: %d reports (last %d) of the SIGKILLed rank", cycle,
               s->reports, s->report_status);
    }
    close_ep(S, NULL);
    reap(ch, SIGKILL, end_name[how]);
    break;
  case END_FINI_UNPOLLED:
  case END_FINI_SEEN: {
    uint8_t f = 'F', b = 0;
    tt_send(ch->cfd, &f, 1);
    if (how == END_FINI_SEEN) {
      poll_for(S, 10, 1, cycle);
      TT_CHECK(s->reports == 1 && s->report_status == MEP_ERR_CLOSED,
               "cycle %d: %d reports (last %d) of the rank that closed",
               cycle, s->reports, s->report_status);
    }
    tt_recv(ch->cfd, &b, 1, 30000);
    TT_CHECK(b == 'B', "cycle %d: the replacement did not finish", cycle);
    reap(ch, 0, end_name[how]);
    close_ep(S, NULL);
    break;
  }
  case END_STOP: {
    TT_CHECK(!kill(ch->pid, SIGSTOP), "SIGSTOP");
    /* as acceptor, the successor dials now: it is refused while the
     * frozen rank's ep is open, and retries */
    if (next) *next = spawn(&(child_cfg_t){.rank = S->peer_rank,
                                           .size = S->size,
                                           .nsock = S->nsock,
                                           .timeout_ms = 20000,
                                           .seed = seed, .cycle = cycle + 1},
                            S->blob, S->blob_len);
    side_write(s, 0, 0, BIG, TOK_BIG);
    TT_OK(vt->signal(s->ep, s->rmr, W_CNT, 1, MEP_SIGNAL_ADD));
    poll_for(S, 0.05, 0, cycle);
    int queued = done_status(s, TOK_BIG) == 1;
    double took = 0;
    close_ep(S, &took);
    TT_CHECK(took < CLOSE_LIMIT_S, "cycle %d: close of a frozen rank took "
             "%.3f s", cycle, took);
    /* the writes still queued complete before close returned: the very
     * next poll has them, with a negative status */
    side_poll(s, 32, cycle);
    int st = done_status(s, TOK_BIG);
    TT_CHECK(st != 1, "cycle %d: the 256 MiB write to the frozen rank was "
             "not reported by the first poll after close", cycle);
    TT_CHECK(!queued || st < 0, "cycle %d: the 256 MiB write still queued "
             "at close completed with %d", cycle, st);
    TT_CHECK(queued, "cycle %d: 256 MiB went to a frozen process's "
             "kernel: nothing was queued at close", cycle);
    s->ndone = 0;
    TT_CHECK(!kill(ch->pid, SIGKILL), "kill");
    reap(ch, SIGKILL, end_name[how]);
    break;
  }
  }
  /* nothing more about the rank, before the next connect */
  poll_for(S, 0.01, 0, cycle);
  TT_CHECK(s->npend == 0, "cycle %d: %d writes unreported after close",
           cycle, s->npend);
}

static size_t allocated(void) {
#if defined(__SANITIZE_ADDRESS__)
  return __sanitizer_get_current_allocated_bytes();
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  return mallinfo2().uordblks;
#else
  return 0;
#endif
}

static void surv_open(surv_t *S, int rank, int size, int nsock) {
  memset(S, 0, sizeof *S);
  S->rank = rank;
  S->size = size;
  S->nsock = nsock;
  S->peer_rank = rank == 0 ? 1 : 0;
  S->s.who = "survivor";
  S->s.peer = S->peer_rank;
  tt_open(&S->s.h, rank, size, g_secret, sizeof g_secret, nsock, "lo",
          20000);
  side_regions(&S->s);
  S->blob_len = sizeof S->blob;
  TT_OK(S->s.h.vt->address(S->s.h.ctx, S->blob, &S->blob_len));
}

/* ------------------------------------------------- stale dialers */

typedef struct gate_arg {
  int a_cfd, b_cfd;
  int rc;
  char msg[512];
} gate_arg_t;

/* Waits for the stale dialer's verdict, then lets the real one dial. */
static void *gate_thread(void *arg) {
  gate_arg_t *g = arg;
  g->rc = recv_result(g->a_cfd, g->msg, sizeof g->msg, 30000);
  uint8_t go = 'G';
  tt_send(g->b_cfd, &go, 1);
  return NULL;
}

static void stale_dialers(surv_t *S, uint64_t seed) {
  side_t *s = &S->s;
  char msg[512];
  /* 1. the rank is closed and nobody called connect() for it */
  child_cfg_t cfg = cfg_for(S, 1000, seed);
  cfg.timeout_ms = 600;
  child_t a = spawn(&cfg, S->blob, S->blob_len);
  uint8_t blob[MEP_TP_MAX_ADDR];
  tt_recv(a.cfd, blob, sizeof blob, 30000);
  double t0 = tt_now();
  while (!readable(a.cfd)) { /* serve its hellos meanwhile */
    side_poll(s, 32, a.cycle);
    TT_CHECK(tt_now() - t0 < 20, "the stale dialer never gave up");
    usleep(200);
  }
  int rc = recv_result(a.cfd, msg, sizeof msg, 1000);
  TT_CHECK(rc == MEP_ERR_TIMEOUT && strstr(msg, "refused") &&
               strstr(msg, "closed its endpoint"),
           "a dialer of a closed rank got %d: %s", rc, msg);
  reap(&a, 0, "stale dialer");
  printf("ok: a dialer of the closed rank is refused: %s\n", msg);

  /* 2. connect() waits for incarnation B; A dials meanwhile */
  cfg = cfg_for(S, 1001, seed);
  cfg.timeout_ms = 800;
  child_t a2 = spawn(&cfg, S->blob, S->blob_len);
  cfg = cfg_for(S, 1002, seed);
  cfg.gate = 1;
  child_t b = spawn(&cfg, S->blob, S->blob_len);
  tt_recv(a2.cfd, blob, sizeof blob, 30000);
  gate_arg_t g = {.a_cfd = a2.cfd, .b_cfd = b.cfd};
  pthread_t th;
  TT_CHECK(!pthread_create(&th, NULL, gate_thread, &g), "pthread_create");
  meet(S, &b); /* connect() returns once B, let in after A gave up, dials */
  pthread_join(th, NULL);
  TT_CHECK(g.rc == MEP_ERR_TIMEOUT && strstr(g.msg, "refused") &&
               strstr(g.msg, "waits in connect() for another process"),
           "a dialer of another incarnation got %d: %s", g.rc, g.msg);
  reap(&a2, 0, "dialer of another incarnation");
  printf("ok: a dialer of another incarnation is refused: %s\n", g.msg);
  traffic(S, &b);
  end_cycle(S, &b, END_FINI_SEEN, NULL, seed);
  printf("ok: the incarnation connect() named got in and moved data\n");
}

/* A fresh survivor (rank 1 of 3): a process X of rank 0 dials it before
 * its connect(), so X's sockets are stashed and acked; X dies, its failure
 * is queued unread; then connect() names another process, Y: X's stash and
 * its report must go, and Y's connection must run without any report. */
static void stash_then_replace(uint64_t seed) {
  static surv_t S;
  surv_open(&S, 1, 3, 2);
  int fds0 = tt_count_fds();
  child_cfg_t cfg = cfg_for(&S, 2000, seed);
  child_t x = spawn(&cfg, S.blob, S.blob_len);
  uint8_t blob[MEP_TP_MAX_ADDR];
  tt_recv(x.cfd, blob, sizeof blob, 30000);
  double t0 = tt_now();
  while (!readable(x.cfd)) { /* its hellos are served by poll */
    side_poll(&S.s, 0, x.cycle);
    TT_CHECK(tt_now() - t0 < 20, "the early process never connected");
    usleep(200);
  }
  char msg[512];
  int rc = recv_result(x.cfd, msg, sizeof msg, 1000);
  TT_CHECK(rc == 0, "a process dialling a fresh rank before its connect() "
           "is stashed, so its connect succeeds; it got %d: %s", rc, msg);
  TT_CHECK(!kill(x.pid, SIGKILL), "kill");
  reap(&x, SIGKILL, "early process");
  t0 = tt_now();
  while (tt_now() - t0 < 0.05) side_poll(&S.s, 0, x.cycle); /* queue it */
  cfg = cfg_for(&S, 2001, seed);
  child_t y = spawn(&cfg, S.blob, S.blob_len);
  meet(&S, &y);
  traffic(&S, &y);
  end_cycle(&S, &y, END_FINI_SEEN, NULL, seed);
  TT_CHECK(tt_count_fds() == fds0, "%d fds open after, %d before",
           tt_count_fds(), fds0);
  side_unregions(&S.s);
  tt_close(&S.s.h);
  printf("ok: connections stashed from a process that died are dropped, "
         "with its report, when connect() names another\n");
}

/* ------------------------------------------------------------ a role */

static void run_role(int rank, int size, int nsock, uint64_t seed) {
  static surv_t S;
  surv_open(&S, rank, size, nsock);
  int fds0 = tt_count_fds();
  size_t mem10 = 0;
  double closes = 0;
  child_t next = {0};
  for (int cycle = 0; cycle < CYCLES; cycle++) {
    child_cfg_t cfg = cfg_for(&S, cycle, seed);
    child_t ch = next.pid ? next : spawn(&cfg, S.blob, S.blob_len);
    next = (child_t){0};
    meet(&S, &ch);
    traffic(&S, &ch);
    int how = end_of(cycle);
    /* the acceptor's successor dials early: see END_STOP */
    int early = how == END_STOP && rank > S.peer_rank && cycle + 1 < CYCLES;
    double t0 = tt_now();
    end_cycle(&S, &ch, how, early ? &next : NULL,
              cfg_for(&S, cycle + 1, seed).seed);
    closes += tt_now() - t0;
    if (cycle == 9) mem10 = allocated();
  }
  int fds1 = tt_count_fds();
  size_t mem100 = allocated();
  TT_CHECK(fds1 == fds0, "rank %d: %d fds open before %d cycles, %d after",
           rank, fds0, CYCLES, fds1);
  /* one closed ep of the rank is kept as a tombstone; nothing grows */
  TT_CHECK(mem100 <= mem10 + 2048, "rank %d: %zu bytes allocated after 10 "
           "cycles, %zu after %d", rank, mem10, mem100, CYCLES);
  printf("ok: rank %d of %d (%s, %d socket%s per peer): %d replacements, "
         "%d fds before and after, %zu / %zu bytes allocated after 10 / %d "
         "cycles, %.1f ms per end\n",
         rank, size, rank < S.peer_rank ? "dials" : "accepts", nsock,
         nsock > 1 ? "s" : "", CYCLES, fds0, mem10, mem100, CYCLES,
         closes * 1000 / CYCLES);
  if (rank > S.peer_rank) {
    stale_dialers(&S, seed);
    TT_CHECK(tt_count_fds() == fds0, "rank %d: %d fds open after the stale "
             "dialers, %d before", rank, tt_count_fds(), fds0);
  }
  side_unregions(&S.s);
  tt_close(&S.s.h);
}

int main(int argc, char **argv) {
  if (argc == 11 && !strcmp(argv[1], "--child")) return child_entry(argv);
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : tt_seed();
  g_seed = seed;
  printf("seed %#" PRIx64 "\n", seed);
  fflush(stdout);
  alarm(290);
  signal(SIGPIPE, SIG_IGN);
  tt_fill(g_secret, seed, 0, sizeof g_secret);
  run_role(0, 2, 1, seed);
  run_role(1, 3, 3, seed ^ 0x5a5a5a5a);
  stash_then_replace(seed ^ 0xa5a5);
  printf("all reconnect checks passed\n");
  return 0;
}
