/*
 * test_tcp_pair - two processes (ranks 0 and 1) move random data through
 * the tcp plugin in both directions at once, with 1 and 3 sockets per peer:
 * writes of 0, 1, 7, 4095, 65537, 3 MiB+5 and 64 MiB bytes at odd offsets,
 * each followed by a signal ADD. The receiver checks each range the moment
 * its signal is visible (the data must already be there), then that no
 * byte outside the ranges changed. Then a ping-pong and a 64 MiB stream
 * (informational numbers), rounds of write + signal SET whose receiver
 * checks each round's data on seeing its signal, and a peer killed with SIGKILL while writes to
 * it are in flight, which poll() must report within a second.
 * Address and rkey blobs travel over a socketpair.
 */
#include <dirent.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcp_test.h"

#define MiB (1024ull * 1024ull)
#define NSIZES 7
static const uint64_t sizes[NSIZES] = {0, 1, 7, 4095, 65537, 3 * MiB + 5,
                                       64 * MiB};
#define TOK0 100
#define TOK_TIMING (1ull << 32) /* tokens of the timing phases */
#define TOK_ORDER (2ull << 32)  /* + round, in the signal-order phase */
/* signal words in the receive region */
#define W_DATA 8
#define W_PING 16
#define W_BW 24
#define W_ORD 32
#define W_ACK 40
#define PING_DATA 48
#define DATA0 64
#define ORD_ROUNDS 300
#define ORD_SLOT (512 * 1024)

typedef struct side {
  tt_host_t h;
  int rank, peer, cfd;
  mep_tp_ep_t *ep;
  uint8_t *src, *dst;
  uint64_t slen, dlen, soff[NSIZES], doff[NSIZES];
  mep_tp_mr_t *smr, *dmr;
  mep_tp_rmr_t *rmr;
  uint64_t seed;
  int done[NSIZES];   /* completions seen per token */
  int ord_done[ORD_ROUNDS + 1];
  long other_tokens;  /* completions of the timing phases */
} side_t;

static uint64_t data_seed(const side_t *s, int rank) {
  return s->seed ^ (0x1000193ull * (uint64_t)(rank + 1));
}
static uint64_t guard_seed(const side_t *s, int rank) {
  return ~s->seed ^ (0x5bd1e995ull * (uint64_t)(rank + 1));
}

static uint64_t word(const side_t *s, uint64_t off) {
  return __atomic_load_n((uint64_t *)(void *)(s->dst + off),
                         __ATOMIC_ACQUIRE);
}

/* One poll; every completion must be a success of ours. */
static void pump(side_t *s) {
  mep_tp_completion_t c[32];
  int n = s->h.vt->poll(s->h.ctx, c, 32);
  TT_CHECK(n >= 0, "poll returned %d: %s", n, mep_last_error());
  for (int i = 0; i < n; i++) {
    TT_CHECK(c[i].status == 0 && c[i].peer == s->peer,
             "completion token %" PRIu64 " status %d peer %d", c[i].token,
             c[i].status, c[i].peer);
    if (c[i].token >= TOK0 && c[i].token < TOK0 + NSIZES) {
      TT_CHECK(!s->done[c[i].token - TOK0]++, "token %" PRIu64 " twice",
               c[i].token);
    } else if (c[i].token > TOK_ORDER &&
               c[i].token <= TOK_ORDER + ORD_ROUNDS) {
      TT_CHECK(!s->ord_done[c[i].token - TOK_ORDER]++,
               "token %" PRIu64 " twice", c[i].token);
    } else {
      TT_CHECK(c[i].token >= TOK_TIMING, "unknown token %" PRIu64,
               c[i].token);
      s->other_tokens++;
    }
  }
}

/* Polls until word at off reaches v. */
static void wait_word(side_t *s, uint64_t off, uint64_t v, double secs) {
  double deadline = tt_now() + secs;
  while (word(s, off) < v) {
    pump(s);
    TT_CHECK(tt_now() < deadline, "word %" PRIu64 " is %" PRIu64
             ", waited %.0f s for %" PRIu64, off, word(s, off), secs, v);
  }
}

static void pump_any(void *s) { pump(s); }

/* Both sides get here, polling meanwhile (tt_barrier). */
static void barrier(side_t *s) { tt_barrier(s->cfd, pump_any, s); }

/* Both sides reach this point without polling: once each side's own data
 * arrived and its writes completed, before closing, so that neither sees
 * the other's close as a failure. */
static void quiet_barrier(side_t *s) {
  uint8_t b = 2;
  tt_send(s->cfd, &b, 1);
  tt_recv(s->cfd, &b, 1, 60000);
}

static void layout(side_t *s) {
  s->soff[0] = 3;
  s->doff[0] = DATA0 + 5;
  for (int i = 1; i < NSIZES; i++) {
    s->soff[i] = ((s->soff[i - 1] + sizes[i - 1] + 16) & ~7ull) + 3;
    s->doff[i] = ((s->doff[i - 1] + sizes[i - 1] + 16) & ~7ull) + 5;
  }
  s->slen = s->soff[NSIZES - 1] + sizes[NSIZES - 1] + 7;
  s->dlen = s->doff[NSIZES - 1] + sizes[NSIZES - 1] + 9;
}

static void setup(side_t *s, int nsock, const uint8_t *secret) {
  tt_open(&s->h, s->rank, 2, secret, 16, nsock, "lo", 20000);
  tt_connect(&s->h, s->cfd, s->peer, &s->ep);
  layout(s);
  s->src = malloc(s->slen);
  s->dst = malloc(s->dlen);
  TT_CHECK(s->src && s->dst, "out of memory");
  tt_fill(s->src, data_seed(s, s->rank), 0, s->slen);
  tt_fill(s->dst, guard_seed(s, s->rank), 0, s->dlen);
  memset(s->dst, 0, DATA0); /* signal words start at 0 */
  tt_regions(&s->h, s->cfd, s->ep, s->src, s->slen, s->dst, s->dlen, &s->smr,
             &s->dmr, &s->rmr);
}

/* Refused locally, nothing sent. */
static void local_refusals(side_t *s) {
  const mep_transport_t *vt = s->h.vt;
  uint64_t D = s->dlen;
  TT_CHECK(vt->write(s->ep, s->smr, s->slen - 1, s->rmr, 0, 2, 1) ==
           MEP_ERR_BOUNDS, "write past the local region");
  TT_CHECK(vt->write(s->ep, s->smr, 0, s->rmr, D, 1, 1) == MEP_ERR_BOUNDS,
           "write past the remote region");
  TT_CHECK(vt->write(s->ep, s->smr, 1, s->rmr, 1, UINT64_MAX, 1) ==
           MEP_ERR_BOUNDS, "write of UINT64_MAX bytes");
  TT_CHECK(vt->write(s->ep, s->smr, UINT64_MAX, s->rmr, 0, 1, 1) ==
           MEP_ERR_BOUNDS, "write from offset UINT64_MAX");
  TT_CHECK(vt->signal(s->ep, s->rmr, 12, 1, MEP_SIGNAL_ADD) ==
           MEP_ERR_INVALID, "unaligned signal");
  TT_CHECK(vt->signal(s->ep, s->rmr, (D + 7) & ~7ull, 1, MEP_SIGNAL_ADD) ==
           MEP_ERR_BOUNDS, "signal past the end");
  TT_CHECK(vt->signal(s->ep, s->rmr, UINT64_MAX - 7, 1, MEP_SIGNAL_SET) ==
           MEP_ERR_BOUNDS, "signal at UINT64_MAX-7");
}

static void verify_range(side_t *s, int i) {
  long long bad = tt_verify(s->dst + s->doff[i], data_seed(s, s->peer),
                            s->soff[i], sizes[i]);
  TT_CHECK(bad < 0, "size %" PRIu64 ": byte %lld differs when its signal "
           "was visible", sizes[i], bad);
}

/* Every byte outside the written ranges and the signal words still holds
 * its initial value. */
static void verify_guards(side_t *s) {
  uint64_t g = guard_seed(s, s->rank), at = DATA0;
  for (int i = 0; i <= NSIZES; i++) {
    uint64_t end = i < NSIZES ? s->doff[i] : s->dlen;
    long long bad = tt_verify(s->dst + at, g, at, end - at);
    TT_CHECK(bad < 0, "byte %llu outside the written ranges changed",
             (unsigned long long)at + (unsigned long long)bad);
    if (i < NSIZES) at = s->doff[i] + sizes[i];
  }
  for (uint64_t w = 0; w < DATA0; w += 8)
    if (w != W_DATA)
      TT_CHECK(word(s, w) == 0, "word %" PRIu64 " changed", w);
}

static void transfer(side_t *s) {
  const mep_transport_t *vt = s->h.vt;
  for (int i = 0; i < NSIZES; i++) {
    TT_OK(vt->write(s->ep, s->smr, s->soff[i], s->rmr, s->doff[i], sizes[i],
                    TOK0 + (uint64_t)i));
    TT_OK(vt->signal(s->ep, s->rmr, W_DATA, 1, MEP_SIGNAL_ADD));
  }
  double deadline = tt_now() + 120;
  int checked = 0, completed = 0;
  while (checked < NSIZES || completed < NSIZES) {
    pump(s);
    uint64_t v = word(s, W_DATA);
    TT_CHECK(v <= NSIZES, "signal word reached %" PRIu64, v);
    for (; checked < (int)v; checked++) verify_range(s, checked);
    completed = 0;
    for (int i = 0; i < NSIZES; i++) completed += s->done[i];
    TT_CHECK(tt_now() < deadline, "transfer: %d of %d ranges signalled, %d "
             "of %d writes completed after 120 s", checked, NSIZES, completed,
             NSIZES);
  }
  /* all of the peer's writes landed (its signals did), and it writes
   * nothing more before the barrier */
  verify_guards(s);
  barrier(s);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* 8-byte ping-pong; rank 0 prints the median round trip. */
static void pingpong(side_t *s, int iters) {
  const mep_transport_t *vt = s->h.vt;
  double *rtt = calloc((size_t)iters, sizeof *rtt);
  TT_CHECK(rtt, "out of memory");
  for (int it = 1; it <= iters; it++) {
    double t0 = tt_now();
    if (s->rank == 1) wait_word(s, W_PING, (uint64_t)it, 30);
    TT_OK(vt->write(s->ep, s->smr, s->soff[2], s->rmr, PING_DATA, 8,
                    TOK_TIMING + (uint64_t)it));
    TT_OK(vt->signal(s->ep, s->rmr, W_PING, (uint64_t)it, MEP_SIGNAL_SET));
    if (s->rank == 0) wait_word(s, W_PING, (uint64_t)it, 30);
    rtt[it - 1] = tt_now() - t0;
  }
  qsort(rtt, (size_t)iters, sizeof *rtt, cmp_double);
  if (s->rank == 0)
    printf("nsock %s: 8-byte round trip: median %.1f us, p99 %.1f us (%d "
           "iterations)\n", s->h.nsock, rtt[iters / 2] * 1e6,
           rtt[iters * 99 / 100] * 1e6, iters);
  free(rtt);
  barrier(s);
}

/* 64 MiB writes from rank 0, each acknowledged by a signal back. */
static void bandwidth(side_t *s, int iters) {
  const mep_transport_t *vt = s->h.vt;
  int big = NSIZES - 1;
  double best = 0, sum = 0;
  for (int it = 1; it <= iters; it++) {
    if (s->rank == 0) {
      double t0 = tt_now();
      TT_OK(vt->write(s->ep, s->smr, s->soff[big], s->rmr, s->doff[big],
                      sizes[big], TOK_TIMING));
      TT_OK(vt->signal(s->ep, s->rmr, W_BW, 1, MEP_SIGNAL_ADD));
      wait_word(s, W_BW, (uint64_t)it, 60);
      double gbps = (double)sizes[big] / (tt_now() - t0) / 1e9;
      sum += gbps;
      if (gbps > best) best = gbps;
    } else {
      wait_word(s, W_BW, (uint64_t)it, 60);
      TT_OK(vt->signal(s->ep, s->rmr, W_BW, 1, MEP_SIGNAL_ADD));
    }
  }
  if (s->rank == 0)
    printf("nsock %s: one 64 MiB write: %.2f GB/s mean, %.2f GB/s best (%d "
           "writes)\n", s->h.nsock, sum / iters, best, iters);
  if (s->rank == 1) /* the data is still the same after the stream */
    verify_range(s, big);
  barrier(s);
}

/* Round r of the signal-order phase: its length and data stream. */
static uint64_t ord_len(const side_t *s, int rank, int r) {
  uint8_t b[8];
  tt_fill(b, data_seed(s, rank) ^ 0xabcdef, (uint64_t)r * 8, 8);
  return 1 + (b[0] | b[1] << 8 | (uint64_t)b[2] << 16) % (400 * 1024);
}
static uint64_t ord_seed(const side_t *s, int rank, int r) {
  return data_seed(s, rank) ^ ((uint64_t)r * 0x9e3779b97f4a7c15ull);
}

/* Rounds of (write up to 400 KiB, signal SET round) in both directions;
 * the receiver, on seeing round r, checks round r's data is all there,
 * then acknowledges. Writes this small are not striped, so the data often
 * travels on another socket than the signal (which uses socket 0): the
 * signal must wait for it. Two rounds in flight, alternating slots. */
static void signal_order(side_t *s) {
  const mep_transport_t *vt = s->h.vt;
  int big = NSIZES - 1, sent = 0;
  uint64_t seen = 0;
  double deadline = tt_now() + 120;
  for (;;) {
    pump(s);
    uint64_t v = word(s, W_ORD);
    if (v > seen) {
      TT_CHECK(v <= ORD_ROUNDS, "round %" PRIu64, v);
      uint64_t off = s->doff[big] + (v % 2) * ORD_SLOT;
      long long bad = tt_verify(s->dst + off, ord_seed(s, s->peer, (int)v),
                                0, ord_len(s, s->peer, (int)v));
      TT_CHECK(bad < 0, "round %" PRIu64 ": byte %lld of %" PRIu64 " not "
               "there when its signal was", v, bad,
               ord_len(s, s->peer, (int)v));
      seen = v;
      TT_OK(vt->signal(s->ep, s->rmr, W_ACK, v, MEP_SIGNAL_SET));
    }
    int r = sent + 1;
    if (r <= ORD_ROUNDS && (int64_t)word(s, W_ACK) >= r - 2 &&
        (r <= 2 || s->ord_done[r - 2])) {
      uint64_t so = s->soff[big] + (uint64_t)(r % 2) * ORD_SLOT;
      uint64_t len = ord_len(s, s->rank, r);
      tt_fill(s->src + so, ord_seed(s, s->rank, r), 0, len);
      TT_OK(vt->write(s->ep, s->smr, so, s->rmr,
                      s->doff[big] + (uint64_t)(r % 2) * ORD_SLOT, len,
                      TOK_ORDER + (uint64_t)r));
      TT_OK(vt->signal(s->ep, s->rmr, W_ORD, (uint64_t)r, MEP_SIGNAL_SET));
      sent = r;
    }
    if (seen == ORD_ROUNDS && word(s, W_ACK) == ORD_ROUNDS &&
        s->ord_done[ORD_ROUNDS] && s->ord_done[ORD_ROUNDS - 1])
      break;
    TT_CHECK(tt_now() < deadline, "signal order: sent %d, seen %" PRIu64
             ", acked %" PRIu64 " after 120 s", sent, seen, word(s, W_ACK));
  }
  for (int r = 1; r <= ORD_ROUNDS; r++)
    TT_CHECK(s->ord_done[r] == 1, "round %d completed %d times", r,
             s->ord_done[r]);
  barrier(s);
}

static void teardown(side_t *s) {
  const mep_transport_t *vt = s->h.vt;
  TT_OK(vt->unimport(s->ep, s->rmr));
  TT_OK(vt->close(s->ep));
  TT_OK(vt->close(s->ep)); /* idempotent */
  TT_OK(vt->dereg(s->h.ctx, s->smr));
  TT_OK(vt->dereg(s->h.ctx, s->dmr));
  tt_close(&s->h);
  free(s->src);
  free(s->dst);
}

/* Sockets this process holds. */
static int count_sockets(void) {
  DIR *d = opendir("/proc/self/fd");
  TT_CHECK(d, "opendir /proc/self/fd");
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    char path[300], link[64];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t l = readlink(path, link, sizeof link - 1);
    n += l > 7 && !strncmp(link, "socket:", 7);
  }
  closedir(d);
  return n;
}

/* nsock 0 is [tcp] sockets_per_peer's auto: 2 sockets on 2 ranks. */
static void run_side(int rank, int cfd, int nsock, uint64_t seed,
                     const uint8_t *secret) {
  side_t s = {.rank = rank, .peer = 1 - rank, .cfd = cfd, .seed = seed};
  int fds = tt_count_fds(), socks = count_sockets();
  setup(&s, nsock, secret);
  int want = (nsock ? nsock : 2) + 1; /* and the listener */
  TT_CHECK(count_sockets() - socks == want, "sockets_per_peer = %d: %d "
           "sockets opened, not %d", nsock, count_sockets() - socks, want);
  local_refusals(&s);
  transfer(&s);
  pingpong(&s, 2000);
  bandwidth(&s, 5);
  signal_order(&s);
  quiet_barrier(&s);
  teardown(&s);
  TT_CHECK(tt_count_fds() == fds, "%d fds open after fini, %d before",
           tt_count_fds(), fds);
}

static void run_pair(int nsock, uint64_t seed) {
  uint8_t secret[16];
  tt_fill(secret, seed, 0, sizeof secret);
  int sv[2];
  TT_CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv), "socketpair");
  fflush(stdout);
  pid_t pid = fork();
  TT_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    close(sv[0]);
    alarm(240);
    run_side(1, sv[1], nsock, seed, secret);
    exit(0);
  }
  close(sv[1]);
  run_side(0, sv[0], nsock, seed, secret);
  close(sv[0]);
  int st = tt_reap(pid, 30000);
  TT_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
           "rank 1 (nsock %d) failed (status %#x)", nsock, st);
  printf("nsock %d: both directions correct\n", nsock);
}

/* Rank 1 connects, then stops reading and is killed while rank 0 has
 * 64 MiB of writes to it in flight. */
static void run_kill(uint64_t seed) {
  uint8_t secret[16];
  tt_fill(secret, ~seed, 0, sizeof secret);
  int sv[2];
  TT_CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv), "socketpair");
  const uint64_t len = 16 * MiB;
  fflush(stdout);
  pid_t pid = fork();
  TT_CHECK(pid >= 0, "fork");
  side_t s = {.rank = pid ? 0 : 1, .peer = pid ? 1 : 0,
              .cfd = pid ? sv[0] : sv[1], .seed = seed};
  close(pid ? sv[1] : sv[0]);
  if (pid == 0) alarm(60);
  tt_open(&s.h, s.rank, 2, secret, 16, 2, "lo", 20000);
  const mep_transport_t *vt = s.h.vt;
  uint8_t rkey[MEP_TP_MAX_RKEY];
  size_t rl = sizeof rkey;
  tt_connect(&s.h, s.cfd, s.peer, &s.ep);
  uint8_t *mem = calloc(1, len);
  TT_CHECK(mem, "out of memory");
  mep_tp_mr_t *mr;
  TT_OK(vt->reg(s.h.ctx, mem, len, MEP_MEM_HOST, &mr, rkey, &rl));
  if (s.rank == 1) {
    tt_send(s.cfd, rkey, rl);
    for (;;) pause(); /* never polls again; killed by rank 0 */
  }
  rl = tt_recv(s.cfd, rkey, sizeof rkey, 30000);
  mep_tp_rmr_t *rmr;
  TT_OK(vt->import(s.ep, rkey, rl, &rmr));
  for (uint64_t t = 1; t <= 4; t++)
    TT_OK(vt->write(s.ep, mr, 0, rmr, 0, len, t));
  double until = tt_now() + 0.2; /* let the kernel buffers fill */
  while (tt_now() < until) {
    mep_tp_completion_t c[8];
    int k = vt->poll(s.h.ctx, c, 8);
    TT_CHECK(k >= 0, "poll");
    for (int i = 0; i < k; i++)
      TT_FAIL("completion of token %" PRIu64 " (status %d) while the peer "
              "reads nothing", c[i].token, c[i].status);
  }
  kill(pid, SIGKILL);
  double t0 = tt_now(), seen_at = 0;
  int tokens[5] = {0}, failed = 0, reported = 0;
  while (tt_now() - t0 < 3.0 && !(reported && tokens[1] && tokens[2] &&
                                  tokens[3] && tokens[4])) {
    mep_tp_completion_t c[8];
    int k = vt->poll(s.h.ctx, c, 8);
    TT_CHECK(k >= 0, "poll");
    for (int i = 0; i < k; i++) {
      TT_CHECK(c[i].peer == 1, "completion names peer %d", c[i].peer);
      if (c[i].token == MEP_TP_TOKEN_NONE) {
        TT_CHECK(c[i].status == MEP_ERR_PEER_FAILED && !reported,
                 "peer report status %d (reported before: %d)", c[i].status,
                 reported);
        reported = 1;
        seen_at = tt_now() - t0;
        continue;
      }
      TT_CHECK(c[i].token >= 1 && c[i].token <= 4 && !tokens[c[i].token]++,
               "token %" PRIu64 " unknown or twice", c[i].token);
      TT_CHECK(c[i].status == 0 || c[i].status == MEP_ERR_PEER_FAILED,
               "token %" PRIu64 " status %d", c[i].token, c[i].status);
      failed += c[i].status == MEP_ERR_PEER_FAILED;
    }
  }
  TT_CHECK(reported, "the killed peer was not reported within 3 s");
  TT_CHECK(seen_at < 1.0, "the killed peer was reported after %.3f s",
           seen_at);
  for (int t = 1; t <= 4; t++)
    TT_CHECK(tokens[t] == 1, "token %d completed %d times", t, tokens[t]);
  TT_CHECK(failed >= 1, "64 MiB to a peer that read nothing all succeeded");
  TT_CHECK(vt->write(s.ep, mr, 0, rmr, 0, 1, 9) == MEP_ERR_PEER_FAILED,
           "write to a dead peer");
  TT_CHECK(vt->signal(s.ep, rmr, 0, 1, MEP_SIGNAL_ADD) == MEP_ERR_PEER_FAILED,
           "signal to a dead peer");
  printf("killed peer reported after %.1f ms; %d of 4 writes failed\n",
         seen_at * 1e3, failed);
  int st = tt_reap(pid, 10000);
  TT_CHECK(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
           "rank 1 status %#x", st);
  TT_OK(vt->unimport(s.ep, rmr));
  TT_OK(vt->close(s.ep));
  TT_OK(vt->close(s.ep));
  TT_OK(vt->dereg(s.h.ctx, mr));
  tt_close(&s.h);
  free(mem);
  close(s.cfd);
}

/* Threads of this process named `name`. */
static int count_threads(const char *name) {
  DIR *d = opendir("/proc/self/task");
  TT_CHECK(d, "opendir /proc/self/task");
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[300], comm[32] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue; /* the thread ended meanwhile */
    if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
    fclose(f);
    n += !strcmp(comm, name);
  }
  closedir(d);
  return n;
}

/* [tcp] keys: bad values are MEP_ERR_CONFIG naming key and value; good
 * ones take effect. */
static void config_checks(void) {
  static const char *const bad[][2] = {
      {"sockets_per_peer", "-1"},    {"sockets_per_peer", "17"},
      {"sockets_per_peer", "two"},   {"sockets_per_peer", "3x"},
      {"port_range", "5-4"},         {"port_range", "70000-70001"},
      {"port_range", "x"},           {"port_range", "-5"},
      {"port_range", "10-"},         {"port_range", "0-10"},
      {"connect_retries", "-1"},     {"connect_retries", "ten"},
      {"nodelay", "2"},              {"nodelay", "maybe"},
      {"send_threads", "-1"},        {"send_threads", "17"},
      {"recv_thread", "maybe"},      {"send_thread", "1"},
      {"ifname", "mep-no-such-if0"},
  };
  tt_host_t h;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = tt_try_open(&h, bad[i][0], bad[i][1]);
    const char *e = mep_last_error();
    TT_CHECK(rc == MEP_ERR_CONFIG, "%s=%s: init returned %d", bad[i][0],
             bad[i][1], rc);
    TT_CHECK(strstr(e, bad[i][1]) && (strstr(e, bad[i][0]) ||
                                      !strcmp(bad[i][0], "ifname")),
             "%s=%s: the error does not name both: %s", bad[i][0],
             bad[i][1], e);
    tt_close(&h);
  }
  /* a port range is honoured: find a free port, then ask for it */
  TT_OK(tt_try_open(&h, "port_range", "0"));
  uint8_t blob[MEP_TP_MAX_ADDR];
  size_t n = sizeof blob;
  TT_OK(h.vt->address(h.ctx, blob, &n));
  tt_close(&h);
  unsigned port = blob[12] | blob[13] << 8;
  char range[32];
  snprintf(range, sizeof range, "%u-%u", port, port + 3 > 65535 ? 65535
                                                 : port + 3);
  TT_OK(tt_try_open(&h, "port_range", range));
  n = sizeof blob;
  TT_OK(h.vt->address(h.ctx, blob, &n));
  unsigned got = blob[12] | blob[13] << 8;
  TT_CHECK(got >= port && got <= port + 3, "port %u outside %s", got, range);
  /* and when all of it is taken, init says so */
  char one[16];
  snprintf(one, sizeof one, "%u-%u", got, got);
  tt_host_t h2;
  TT_CHECK(tt_try_open(&h2, "port_range", one) != 0,
           "a second context bound the same port %u", got);
  tt_close(&h2);
  tt_close(&h);
  TT_OK(tt_try_open(&h, "sockets_per_peer", "16"));
  tt_close(&h);
  /* send_threads starts that many threads where send_thread starts any
   * (this test's 2 ranks: only with send_thread = on), and fini ends them */
  const char *on = getenv("MEP_TCP_SEND_THREAD");
  int want = on && !strcmp(on, "on") ? 3 : 0;
  TT_OK(tt_try_open(&h, "send_threads", "3"));
  TT_CHECK(count_threads("mep-tcp-tx") == want, "%d sender threads running "
           "with send_threads = 3 (send_thread = %s), not %d",
           count_threads("mep-tcp-tx"), on ? on : "auto", want);
  tt_close(&h);
  TT_CHECK(count_threads("mep-tcp-tx") == 0, "%d sender threads left after "
           "fini", count_threads("mep-tcp-tx"));
  /* recv_thread = on starts one receiver thread per socket of a peer (here
   * 1), off none; fini ends them */
  for (int i = 0; i < 2; i++) {
    TT_OK(tt_try_open(&h, "recv_thread", i ? "off" : "on"));
    TT_CHECK(count_threads("mep-tcp-rx") == !i, "%d receiver threads with "
             "recv_thread = %s", count_threads("mep-tcp-rx"),
             i ? "off" : "on");
    tt_close(&h);
  }
  TT_CHECK(count_threads("mep-tcp-rx") == 0, "%d receiver threads left "
           "after fini", count_threads("mep-tcp-rx"));
  printf("config checks passed\n");
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : tt_seed();
  printf("seed %#" PRIx64 "\n", seed);
  alarm(280);
  config_checks();
  run_pair(1, seed);
  run_pair(3, seed + 1);
  run_pair(0, seed + 2);
  run_kill(seed);
  printf("all pair checks passed\n");
  return 0;
}
