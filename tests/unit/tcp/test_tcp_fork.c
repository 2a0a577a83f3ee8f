/*
 * test_tcp_fork - a child forked from a rank does not keep the rank's
 * connections alive (plugins/tcp/fork.c).
 *
 * Rank 0 is this process, rank 1 its child B; they connect (1 and 3
 * sockets per peer). B lists its inet sockets (its connections and its
 * listening socket), then forks C, which lives on as a DataLoader worker
 * would. In C, each of those numbers must still be open, close-on-exec,
 * and an unconnected AF_UNIX socket: not the connection. C may use
 * async-signal-safe calls only (B has threads), so it checks with
 * getsockopt/getpeername/fcntl and writes its findings with write().
 * After the fork, B's own connection must still work: random writes and a
 * signal both ways, verified byte for byte. Then B is SIGKILLed while C
 * sleeps: rank 0 must get the failure report of rank 1 within 5 s (the
 * context's timeout is 20 s, and the tcp plugin has no probe: without
 * fork.c the report would wait for C's end), and a new connection to B's
 * listening port must be refused. This process is a child subreaper, so
 * C, orphaned, is reaped here. Every wait has a deadline.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tcp_test.h"

#define SPAN (1u << 20)
#define MAXFD 64
#define SIG_OFF 0  /* the signal word */
#define DATA_OFF 64

typedef struct side {
  tt_host_t h;
  int rank, cfd;
  uint64_t seed;
  mep_tp_ep_t *ep;
  mep_tp_rmr_t *rmr;
  mep_tp_mr_t *smr, *dmr;
  uint8_t *src, *dst;
  uint64_t completed; /* writes completed so far */
} side_t;

/* What C found, fd by fd. */
typedef struct finding {
  int32_t fd, open, cloexec, domain, connected;
} finding_t;

static void setup(side_t *s, int nsock) {
  uint8_t secret[16];
  tt_fill(secret, s->seed, 0, sizeof secret);
  tt_open(&s->h, s->rank, 2, secret, sizeof secret, nsock, "lo", 20000);
  tt_connect(&s->h, s->cfd, 1 - s->rank, &s->ep);
  s->src = calloc(1, SPAN);
  s->dst = calloc(1, SPAN);
  TT_CHECK(s->src && s->dst, "out of memory");
  tt_regions(&s->h, s->cfd, s->ep, s->src, SPAN, s->dst, SPAN, &s->smr, &s->dmr,
             &s->rmr);
}

/* Polls; returns the status of a report of the peer, or 1 if none came. */
static int pump(side_t *s) {
  mep_tp_completion_t c[16];
  int n = s->h.vt->poll(s->h.ctx, c, 16);
  TT_CHECK(n >= 0, "poll returned %d", n);
  int report = 1;
  for (int i = 0; i < n; i++) {
    TT_CHECK(c[i].peer == 1 - s->rank, "a completion names rank %d",
             c[i].peer);
    if (c[i].token == MEP_TP_TOKEN_NONE) {
      report = c[i].status;
      continue;
    }
    TT_CHECK(c[i].status == 0, "write %" PRIu64 " completed with %d",
             c[i].token, c[i].status);
    s->completed++;
  }
  return report;
}

static void pump_any(void *s) { pump(s); }

/* Random writes of odd sizes (striped on 3 sockets from 512 KiB) with the
 * signal after them, both ways; each side checks what it received. The
 * source is filled again only once the last round's writes completed. */
static void traffic(side_t *s, int round) {
  static const uint64_t lens[] = {1, 4095, 70001, 600003};
  uint64_t seed = s->seed ^ (uint64_t)(s->rank + 1) << 32 ^ (uint64_t)round;
  uint64_t off = DATA_OFF, want = s->completed + 4;
  tt_fill(s->src, seed, 0, SPAN);
  for (int i = 0; i < 4; i++) {
    TT_OK(s->h.vt->write(s->ep, s->smr, off, s->rmr, off, lens[i],
                         (uint64_t)i + 1));
    off += lens[i] + 3;
  }
  TT_OK(s->h.vt->signal(s->ep, s->rmr, SIG_OFF, (uint64_t)round + 1,
                        MEP_SIGNAL_SET));
  double deadline = tt_now() + 20;
  while (__atomic_load_n((uint64_t *)(void *)s->dst, __ATOMIC_ACQUIRE) !=
             (uint64_t)round + 1 ||
         s->completed < want) {
    TT_CHECK(pump(s) == 1, "rank %d: a report of the peer during traffic",
             s->rank);
    TT_CHECK(tt_now() < deadline, "rank %d, round %d: the peer's signal "
             "never came, or %" PRIu64 " of this side's 4 writes completed",
             s->rank, round, 4 - (want - s->completed));
  }
  uint64_t in = s->seed ^ (uint64_t)(2 - s->rank) << 32 ^ (uint64_t)round;
  off = DATA_OFF;
  for (int i = 0; i < 4; i++) {
    long long bad = tt_verify(s->dst + off, in, off, lens[i]);
    TT_CHECK(bad < 0, "rank %d, round %d: write %d differs at byte %lld",
             s->rank, round, i, bad);
    off += lens[i] + 3;
  }
  tt_barrier(s->cfd, pump_any, s);
}

/* B's inet sockets (domain AF_INET), and the port of its listening one. */
static int inet_fds(int *fds, int *port) {
  int n = 0;
  *port = 0;
  for (int fd = 3; fd < 1024 && n < MAXFD; fd++) {
    int dom = 0, acc = 0;
    socklen_t l = sizeof dom;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l) || dom != AF_INET)
      continue;
    fds[n++] = fd;
    l = sizeof acc;
    if (!getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) && acc) {
      struct sockaddr_in a;
      socklen_t al = sizeof a;
      TT_CHECK(!getsockname(fd, (struct sockaddr *)&a, &al), "getsockname");
      *port = ntohs(a.sin_port);
    }
  }
  return n;
}

/* C: async-signal-safe calls only. It leaves the test's output, so that
 * a failing run ends when rank 0 does, not when C does. */
static _Noreturn void worker(int cfd, const int *fds, int n) {
  close(STDOUT_FILENO);
  close(STDERR_FILENO);
  finding_t f[MAXFD];
  for (int i = 0; i < n; i++) {
    int fl = fcntl(fds[i], F_GETFD), dom = -1;
    socklen_t l = sizeof dom;
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    getsockopt(fds[i], SOL_SOCKET, SO_DOMAIN, &dom, &l);
    f[i] = (finding_t){.fd = fds[i], .open = fl >= 0,
                       .cloexec = fl >= 0 && (fl & FD_CLOEXEC),
                       .domain = dom,
                       .connected = !getpeername(fds[i], (void *)&a, &al)};
  }
  int32_t pid = (int32_t)getpid();
  if (write(cfd, &pid, sizeof pid) != sizeof pid ||
      write(cfd, f, (size_t)n * sizeof f[0]) != (ssize_t)(n * sizeof f[0]))
    _exit(2);
  struct timespec ts = {60, 0};
  nanosleep(&ts, NULL); /* killed by rank 0 long before */
  _exit(0);
}

static void rank1(side_t *s, int wfd) {
  int fds[MAXFD], port;
  int n = inet_fds(fds, &port);
  TT_CHECK(port > 0 && n >= 2, "rank 1: %d inet sockets, listening port %d",
           n, port);
  int32_t hdr[2] = {n, port};
  TT_CHECK(write(wfd, hdr, sizeof hdr) == sizeof hdr, "write");
  fflush(stdout);
  fflush(stderr);
  pid_t c = fork();
  TT_CHECK(c >= 0, "fork: %s", strerror(errno));
  if (c == 0) worker(wfd, fds, n);
  traffic(s, 1); /* the parent's connection is untouched */
  uint8_t wait_kill;
  tt_recv(s->cfd, &wait_kill, 1, 30000); /* rank 0 kills us meanwhile */
  TT_FAIL("rank 1 was not killed");
}

static void read_all(int fd, void *buf, size_t len) {
  uint8_t *p = buf;
  double deadline = tt_now() + 20;
  while (len) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
      TT_CHECK(tt_now() < deadline, "C's findings never came");
      usleep(1000);
      continue;
    }
    TT_CHECK(n > 0, "reading C's findings: %s", n ? strerror(errno) : "EOF");
    p += n;
    len -= (size_t)n;
  }
}

static void check_findings(int rfd, int *port, pid_t *cpid) {
  int32_t hdr[2], pid;
  read_all(rfd, hdr, sizeof hdr);
  read_all(rfd, &pid, sizeof pid);
  *cpid = pid;
  *port = hdr[1];
  finding_t f[MAXFD];
  TT_CHECK(hdr[0] > 0 && hdr[0] <= MAXFD, "%d fds", hdr[0]);
  read_all(rfd, f, (size_t)hdr[0] * sizeof f[0]);
  for (int i = 0; i < hdr[0]; i++) {
    TT_CHECK(f[i].open, "in the forked child, fd %d is closed: its number "
             "is free for a file the child opens", f[i].fd);
    TT_CHECK(f[i].domain == AF_UNIX && !f[i].connected,
             "in the forked child, fd %d is still the connection (domain "
             "%d, connected %d)", f[i].fd, f[i].domain, f[i].connected);
    TT_CHECK(f[i].cloexec, "in the forked child, fd %d lost close-on-exec",
             f[i].fd);
  }
}

static void run(int nsock, uint64_t seed) {
  int sv[2], pv[2];
  TT_CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv), "socketpair");
  TT_CHECK(!pipe2(pv, O_CLOEXEC | O_NONBLOCK), "pipe");
  fflush(stdout);
  fflush(stderr);
  pid_t b = fork(); /* before any thread of this process */
  TT_CHECK(b >= 0, "fork");
  side_t s = {.rank = b ? 0 : 1, .cfd = b ? sv[0] : sv[1], .seed = seed};
  close(b ? sv[1] : sv[0]);
  if (b == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(60);
    close(pv[0]);
    fcntl(pv[1], F_SETFL, 0);
    setup(&s, nsock);
    traffic(&s, 0);
    rank1(&s, pv[1]);
  }
  close(pv[1]);
  setup(&s, nsock);
  traffic(&s, 0);
  int port;
  pid_t c;
  check_findings(pv[0], &port, &c);
  traffic(&s, 1);
  TT_CHECK(!kill(b, SIGKILL), "kill");
  double t0 = tt_now();
  int st;
  while ((st = pump(&s)) == 1) {
    TT_CHECK(tt_now() - t0 < 5, "%d socket(s) per peer: rank 1 was killed "
             "5 s ago and no report came; its forked child still holds its "
             "connections", nsock);
    usleep(200);
  }
  double took = tt_now() - t0;
  TT_CHECK(st == MEP_ERR_PEER_FAILED, "the report says %d", st);
  TT_CHECK(!kill(c, 0), "the forked child is gone already: the check "
           "proves nothing");
  /* The report may come while the dying B still closes its other files
   * (the peer socket can come before the listener); once B is reaped, no
   * file of its own is open, and only C could hold the port. */
  st = tt_reap(b, 10000);
  TT_CHECK(st >= 0 && WIFSIGNALED(st), "rank 1: status %#x", st);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
  TT_CHECK(rc < 0 && errno == ECONNREFUSED, "a connection to the dead "
           "rank's listening port %d was %s", port,
           rc ? strerror(errno) : "accepted (the forked child holds it)");
  close(fd);
  kill(c, SIGKILL);
  st = tt_reap(c, 10000);
  TT_CHECK(st >= 0 && WIFSIGNALED(st), "the forked child: status %#x", st);
  close(pv[0]);
  close(s.cfd);
  TT_OK(s.h.vt->close(s.ep));
  TT_OK(s.h.vt->unimport(s.ep, s.rmr));
  TT_OK(s.h.vt->dereg(s.h.ctx, s.smr));
  TT_OK(s.h.vt->dereg(s.h.ctx, s.dmr));
  tt_close(&s.h);
  free(s.src);
  free(s.dst);
  printf("ok: %d socket%s per peer: rank 1 killed with a forked child "
         "alive, its failure reported after %.3f s\n", nsock,
         nsock > 1 ? "s" : "", took);
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : tt_seed();
  printf("seed %#" PRIx64 "\n", seed);
  alarm(120);
  signal(SIGPIPE, SIG_IGN);
  TT_CHECK(!prctl(PR_SET_CHILD_SUBREAPER, 1), "PR_SET_CHILD_SUBREAPER");
  run(1, seed);
  run(3, seed + 1);
  printf("all fork checks passed\n");
  return 0;
}
