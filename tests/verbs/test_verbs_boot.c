/*
 * test_verbs_boot - the RDMA bootstrap (plugins/verbs/handshake.c) between
 * processes over loopback, without a device: what each side's callback
 * receives is what the other side sent, in both roles; a dial that comes
 * before the acceptor's connect(); a stranger with the wrong secret, a
 * dialler with a stale address and one of another incarnation are
 * refused while the right process still gets in; an acceptor whose
 * dialler never comes, and a failing callback, end at their deadlines or
 * at once, never hang; the liveness channel tells a goodbye from a death.
 * Every process has an alarm and is reaped.
 * usage: test_verbs_boot [SEED]
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "handshake.h"

#define TIMEOUT_MS 5000

static char last_error[512];
static int verbose;

static void set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
}

static void log_fn(mep_log_level_t lvl, const char *fmt, ...) {
  if (!verbose && lvl > MEP_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[pid %d] ", (int)getpid());
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

#define DIE(...)                                                              \
  do {                                                                        \
    fprintf(stderr, "FAIL [pid %d] %s:%d: ", (int)getpid(), __FILE__,         \
            __LINE__);                                                        \
    fprintf(stderr, __VA_ARGS__);                                             \
    fprintf(stderr, " (last error: %s)\n", last_error);                       \
    exit(1);                                                                  \
  } while (0)
#define EXPECT(cond, ...)                                                     \
  do {                                                                        \
    if (!(cond)) DIE(__VA_ARGS__);                                            \
  } while (0)

static uint64_t seed;

/* One side: its env, bootstrap and queue pair info. */
typedef struct side {
  mep_tp_env_t env;
  mep__rdma_boot_t boot;
  uint8_t secret[32];
  mep__rdma_qpinfo_t mine, theirs;
  int got_up;
  int fail_up; /* the callback fails */
} side_t;

static void fill_qpinfo(mep__rdma_qpinfo_t *q, uint64_t s) {
  memset(q, 0, sizeof *q);
  for (int i = 0; i < 16; i++) q->gid[i] = (uint8_t)(s >> (i % 8 * 8)) ^ i;
  q->lid = (uint16_t)s;
  q->port = 1;
  q->link_layer = 2;
  q->mtu = 5;
  q->nqp = (uint8_t)(1 + s % 16);
  q->scratch_addr = s * 7;
  q->scratch_rkey = (uint32_t)(s >> 7);
  for (int i = 0; i < q->nqp; i++) {
    q->qpn[i] = (uint32_t)((s + (uint64_t)i * 977) % 0xfffffe + 1);
    q->psn[i] = (uint32_t)((s >> 3) + (uint64_t)i) & 0xffffff;
  }
}

static void side_open(side_t *sd, int rank, int size, uint64_t inc,
                      uint8_t secret_byte) {
  memset(sd, 0, sizeof *sd);
  memset(sd->secret, secret_byte, sizeof sd->secret);
  sd->env = (mep_tp_env_t){.struct_size = sizeof sd->env, .rank = rank,
                           .size = size, .secret = sd->secret,
                           .secret_len = sizeof sd->secret,
                           .timeout_ms = TIMEOUT_MS, .log = log_fn,
                           .set_error = set_error};
  sd->boot.env = &sd->env;
  sd->boot.name = "verbs";
  sd->boot.timeout_ms = TIMEOUT_MS;
  sd->boot.inc = inc;
  mep__rdma_boot_opts_t o = {.ifname = "lo"};
  EXPECT(mep__rdma_boot_open(&sd->boot, &o) == 0, "boot_open");
  fill_qpinfo(&sd->mine, seed ^ inc);
}

static int up(void *arg, const mep__rdma_qpinfo_t *theirs) {
  side_t *sd = arg;
  sd->theirs = *theirs;
  sd->got_up++;
  if (sd->fail_up) {
    set_error("test: the callback refuses");
    return MEP_ERR_SYSTEM;
  }
  return 0;
}

static int64_t now_ms(void) { return mep__rdma_now_ms(); }

static int do_connect(side_t *sd, int peer, const mep__rdma_boot_addr_t *to,
                      int timeout_ms, int *fd) {
  sd->boot.timeout_ms = timeout_ms;
  return mep__rdma_boot_connect(&sd->boot, peer, to, &sd->mine, up, sd,
                                now_ms() + timeout_ms, fd);
}

/* ------------------------------------------------- the control channel */

static void xsend(int fd, const void *p, size_t n) {
  EXPECT(write(fd, p, n) == (ssize_t)n, "control write");
}
static void xrecv(int fd, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)p + got, n - got);
    EXPECT(r > 0, "control read (%zd)", r);
    got += (size_t)r;
  }
}

typedef void (*role_fn)(int ctl, int peer_ctl);

/* Forks one process per role, each with an alarm; 0 when all exit 0. */
static int run(const char *name, role_fn *roles, int n) {
  int fds[8][2];
  for (int i = 0; i < n; i++)
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds[i])) return 1;
  pid_t pids[8];
  fflush(stdout); /* or each child prints what is buffered again */
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      alarm(30);
      roles[i](fds[i][1], fds[(i + 1) % n][0]);
      exit(0);
    }
  }
  /* role i writes to role i-1 and reads what role i+1 wrote */
  int bad = 0;
  for (int i = 0; i < n; i++) {
    int st = 0;
    if (waitpid(pids[i], &st, 0) != pids[i] || !WIFEXITED(st) ||
        WEXITSTATUS(st) != 0) {
      fprintf(stderr, "%s: role %d failed (status %#x)\n", name, i, st);
      bad = 1;
    }
  }
  for (int i = 0; i < n; i++) close(fds[i][0]), close(fds[i][1]);
  printf("%s %s\n", bad ? "FAIL" : "PASS", name);
  return bad;
}

/* Publishes this side's address on ctl and reads the peer's on pctl. */
static void swap_addr(side_t *sd, int ctl, int pctl,
                      mep__rdma_boot_addr_t *peer) {
  mep__rdma_boot_addr_t me;
  mep__rdma_boot_self(&sd->boot, &me);
  xsend(ctl, &me, sizeof me);
  xrecv(pctl, peer, sizeof *peer);
}

static void expect_theirs(side_t *sd, int ctl, int pctl) {
  xsend(ctl, &sd->mine, sizeof sd->mine);
  mep__rdma_qpinfo_t want;
  xrecv(pctl, &want, sizeof want);
  EXPECT(sd->got_up == 1, "the callback ran %d times", sd->got_up);
  EXPECT(memcmp(&want, &sd->theirs, sizeof want) == 0,
         "the callback got other queue pair info than the peer sent");
}

/* Reads the link until it says something other than QUIET. */
static int link_wait(int fd, mep__rdma_link_rx_t *rx, uint32_t from,
                     uint32_t to) {
  int64_t end = now_ms() + TIMEOUT_MS;
  for (;;) {
    int st = mep__rdma_link_read(fd, rx, from, to);
    if (st != MEP_RDMA_LINK_QUIET) return st;
    EXPECT(now_ms() < end, "nothing arrived on the link");
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* ------------------------------------------------- basic and goodbye */

/* Rank 0 dials rank 1; both check the other's info; rank 0 says
 * goodbye, then closes; rank 1 sees BYE, then BYE again at the end. */
static void basic0(int ctl, int pctl) {
  side_t sd;
  mep__rdma_boot_addr_t peer;
  side_open(&sd, 0, 2, 0x1111, 7);
  swap_addr(&sd, ctl, pctl, &peer);
  int fd;
  EXPECT(do_connect(&sd, 1, &peer, TIMEOUT_MS, &fd) == 0, "dial");
  expect_theirs(&sd, ctl, pctl);
  EXPECT(mep__rdma_link_bye(fd, 0, 1, 1000) == 0, "goodbye");
  char c;
  xrecv(pctl, &c, 1);
  close(fd);
  mep__rdma_boot_close(&sd.boot);
}

static void basic1(int ctl, int pctl) {
  side_t sd;
  mep__rdma_boot_addr_t peer;
  side_open(&sd, 1, 2, 0x2222, 7);
  swap_addr(&sd, ctl, pctl, &peer);
  int fd;
  EXPECT(do_connect(&sd, 0, &peer, TIMEOUT_MS, &fd) == 0, "accept");
  expect_theirs(&sd, ctl, pctl);
  mep__rdma_link_rx_t rx = {0};
  EXPECT(link_wait(fd, &rx, 0, 1) == MEP_RDMA_LINK_BYE, "the goodbye");
  xsend(ctl, "x", 1);
  struct timespec ts = {0, 50 * 1000000};
  nanosleep(&ts, NULL);
  EXPECT(mep__rdma_link_read(fd, &rx, 0, 1) == MEP_RDMA_LINK_BYE,
         "the end after a goodbye is orderly");
  close(fd);
  mep__rdma_boot_close(&sd.boot);
}

/* Rank 1 accepts late (after the dial came) and then dies without a
 * goodbye: rank 0 sees the end of the stream. */
static void late0(int ctl, int pctl) {
  side_t sd;
  mep__rdma_boot_addr_t peer;
  side_open(&sd, 0, 3, 0x3333, 9);
  swap_addr(&sd, ctl, pctl, &peer);
  int fd;
  EXPECT(do_connect(&sd, 2, &peer, TIMEOUT_MS, &fd) == 0, "dial");
  expect_theirs(&sd, ctl, pctl);
  mep__rdma_link_rx_t rx = {0};
  EXPECT(link_wait(fd, &rx, 2, 0) == MEP_RDMA_LINK_EOF,
         "the end of a dead peer's stream");
  close(fd);
  mep__rdma_boot_close(&sd.boot);
}

static void late2(int ctl, int pctl) {
  side_t sd;
  mep__rdma_boot_addr_t peer;
  side_open(&sd, 2, 3, 0x4444, 9);
  swap_addr(&sd, ctl, pctl, &peer);
  struct timespec ts = {0, 300 * 1000000};
  nanosleep(&ts, NULL); /* the dial arrives first */
  int fd;
  EXPECT(do_connect(&sd, 0, &peer, TIMEOUT_MS, &fd) == 0, "late accept");
  expect_theirs(&sd, ctl, pctl);
  _exit(0); /* no goodbye */
}

/* ------------------------------------------- strangers and old blobs */

/* Three roles: the acceptor (rank 1), the real rank 0, and intruders (in
 * the ring of run(): the acceptor's address goes to the intruders, who
 * pass it on to the real rank 0). Intruders: a stranger claiming rank 0 with the
 * wrong secret, then one with a stale address (the acceptor's previous
 * incarnation), then one of another incarnation than the acceptor awaits;
 * each is refused, and the real rank 0 gets in. */
static void guard1(int ctl, int pctl) {
  side_t sd;
  side_open(&sd, 1, 2, 0x5555, 3);
  mep__rdma_boot_addr_t me, real0;
  mep__rdma_boot_self(&sd.boot, &me);
  xsend(ctl, &me, sizeof me);         /* to the intruders */
  xrecv(pctl, &real0, sizeof real0);  /* from the real rank 0 */
  int fd;
  int rc = do_connect(&sd, 0, &real0, TIMEOUT_MS, &fd);
  EXPECT(rc == 0, "accept the real rank 0 among intruders");
  EXPECT(sd.theirs.lid == (uint16_t)(seed ^ 0x6666),
         "accepted another process than the real rank 0");
  close(fd);
  mep__rdma_boot_close(&sd.boot);
}

static void intruders(int ctl, int pctl) {
  mep__rdma_boot_addr_t acc;
  xrecv(pctl, &acc, sizeof acc);
  xsend(ctl, &acc, sizeof acc); /* on to the real rank 0 */
  side_t bad;
  int fd;
  /* the wrong secret: dropped without an answer */
  side_open(&bad, 0, 2, 0x7777, 4);
  int64_t t0 = now_ms();
  int rc = do_connect(&bad, 1, &acc, TIMEOUT_MS, &fd);
  EXPECT(rc == MEP_ERR_AUTH, "a wrong secret: %d", rc);
  EXPECT(now_ms() - t0 < TIMEOUT_MS, "a wrong secret took the whole timeout");
  EXPECT(bad.got_up == 0, "the callback ran for a refused dial");
  mep__rdma_boot_close(&bad.boot);
  /* the right secret, a stale address: told so, at once */
  side_open(&bad, 0, 2, 0x8888, 3);
  mep__rdma_boot_addr_t old = acc;
  old.incarnation ^= 0xff;
  t0 = now_ms();
  rc = do_connect(&bad, 1, &old, TIMEOUT_MS, &fd);
  EXPECT(rc == MEP_ERR_PEER_FAILED, "a stale address: %d", rc);
  EXPECT(now_ms() - t0 < TIMEOUT_MS / 2, "a stale address took long");
  mep__rdma_boot_close(&bad.boot);
  /* another incarnation than the acceptor waits for: refused until the
   * deadline (it may be the one wanted later) */
  side_open(&bad, 0, 2, 0x9999, 3);
  rc = do_connect(&bad, 1, &acc, 600, &fd);
  EXPECT(rc == MEP_ERR_TIMEOUT && strstr(last_error, "refused"),
         "another incarnation: %d", rc);
  mep__rdma_boot_close(&bad.boot);
  xsend(ctl, "x", 1); /* now the real one */
}

static void real0(int ctl, int pctl) {
  side_t sd;
  side_open(&sd, 0, 2, 0x6666, 3);
  mep__rdma_boot_addr_t me, acc;
  mep__rdma_boot_self(&sd.boot, &me);
  xsend(ctl, &me, sizeof me);
  xrecv(pctl, &acc, sizeof acc);
  char c;
  xrecv(pctl, &c, 1);
  int fd;
  EXPECT(do_connect(&sd, 1, &acc, TIMEOUT_MS, &fd) == 0, "the real dial");
  close(fd);
  mep__rdma_boot_close(&sd.boot);
}

/* ------------------------------------------------ deadlines, refusals */

/* An acceptor whose dialler never comes ends at its deadline. */
static void nobody(int ctl, int pctl) {
  (void)ctl, (void)pctl;
  side_t sd;
  side_open(&sd, 1, 2, 0xaaaa, 1);
  mep__rdma_boot_addr_t ghost = {.ip = {127, 0, 0, 1}, .port = 9,
                                 .incarnation = 5};
  int fd;
  int64_t t0 = now_ms();
  int rc = do_connect(&sd, 0, &ghost, 400, &fd);
  int64_t ms = now_ms() - t0;
  EXPECT(rc == MEP_ERR_TIMEOUT && ms >= 390 && ms < 3000,
         "waiting for nobody: %d after %lld ms", rc, (long long)ms);
  mep__rdma_boot_close(&sd.boot);
}

/* The acceptor's callback fails: the dialler learns at once. */
static void failup0(int ctl, int pctl) {
  side_t sd;
  mep__rdma_boot_addr_t peer;
  side_open(&sd, 0, 2, 0xbbbb, 2);
  swap_addr(&sd, ctl, pctl, &peer);
  int fd;
  int64_t t0 = now_ms();
  int rc = do_connect(&sd, 1, &peer, TIMEOUT_MS, &fd);
  EXPECT(rc < 0 && now_ms() - t0 < TIMEOUT_MS / 2,
         "a failed acceptor: %d after %lld ms", rc,
         (long long)(now_ms() - t0));
  mep__rdma_boot_close(&sd.boot);
}

static void failup1(int ctl, int pctl) {
  side_t sd;
  mep__rdma_boot_addr_t peer;
  side_open(&sd, 1, 2, 0xcccc, 2);
  sd.fail_up = 1;
  swap_addr(&sd, ctl, pctl, &peer);
  int fd;
  EXPECT(do_connect(&sd, 0, &peer, TIMEOUT_MS, &fd) == MEP_ERR_SYSTEM,
         "the callback's error is connect's");
  mep__rdma_boot_close(&sd.boot);
}

/* ----------------------------------------------------- the link alone */

static void link_cases(void) {
  int sv[2];
  mep__rdma_link_rx_t rx = {0};
  /* garbage */
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv)) DIE("sp");
  xsend(sv[1], "0123456789abcdef", 16);
  EXPECT(mep__rdma_link_read(sv[0], &rx, 1, 0) == MEP_RDMA_LINK_BAD,
         "garbage on the link");
  close(sv[0]), close(sv[1]);
  /* a goodbye from the wrong rank */
  memset(&rx, 0, sizeof rx);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv)) DIE("sp");
  uint8_t h[MEP_RDMA_HDR_LEN];
  mep__rdma_hdr_encode(h, MEP_RDMA_MSG_BYE, 5, 0);
  xsend(sv[1], h, sizeof h);
  EXPECT(mep__rdma_link_read(sv[0], &rx, 1, 0) == MEP_RDMA_LINK_BAD,
         "a goodbye naming another rank");
  close(sv[0]), close(sv[1]);
  /* half a goodbye, then the end: a failure */
  memset(&rx, 0, sizeof rx);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv)) DIE("sp");
  mep__rdma_hdr_encode(h, MEP_RDMA_MSG_BYE, 1, 0);
  xsend(sv[1], h, 9);
  EXPECT(mep__rdma_link_read(sv[0], &rx, 1, 0) == MEP_RDMA_LINK_QUIET,
         "half a goodbye");
  close(sv[1]);
  EXPECT(mep__rdma_link_read(sv[0], &rx, 1, 0) == MEP_RDMA_LINK_EOF,
         "the end after half a goodbye");
  close(sv[0]);
  /* bytes after a goodbye */
  memset(&rx, 0, sizeof rx);
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv)) DIE("sp");
  xsend(sv[1], h, sizeof h);
  xsend(sv[1], "z", 1);
  EXPECT(mep__rdma_link_read(sv[0], &rx, 1, 0) == MEP_RDMA_LINK_BAD,
         "a byte after the goodbye");
  close(sv[0]), close(sv[1]);
  printf("PASS link\n");
}

int main(int argc, char **argv) {
  seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
  verbose = getenv("VERBOSE") != NULL;
  signal(SIGPIPE, SIG_IGN);
  printf("test_verbs_boot: seed %" PRIu64 "\n", seed);
  link_cases();
  int bad = 0;
  bad += run("basic", (role_fn[]){basic0, basic1}, 2);
  bad += run("early-dial", (role_fn[]){late0, late2}, 2);
  bad += run("strangers", (role_fn[]){guard1, real0, intruders}, 3);
  bad += run("deadline", (role_fn[]){nobody}, 1);
  bad += run("callback-fails", (role_fn[]){failup0, failup1}, 2);
  return bad ? 1 : 0;
}
