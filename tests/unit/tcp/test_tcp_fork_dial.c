/*
 * test_tcp_fork_dial - a child forked while another thread dials a peer
 * does not keep the dialled connection (plugins/tcp/dial.c, fork.c).
 *
 * This process (M) listens on a plain socket that accepts and never
 * answers, so a dialler waits for the acceptor's ack until its deadline.
 * D, its child, opens a tcp context as rank 0 and calls connect() for
 * rank 1 at that port on a second thread; once M has accepted the
 * connection, D's main thread forks C. In C (async-signal-safe calls
 * only), no inet socket may be left: the listener and the socket being
 * dialled are unconnected AF_UNIX sockets. Then D is SIGKILLed while C
 * sleeps: M's end of the dialled connection must see its end within 5 s
 * (the dial's deadline is 20 s; a child holding the socket would keep it
 * open for its whole life). Every wait has a deadline; this process is a
 * child subreaper, so the orphaned C is reaped here.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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
#include "wire.h"

typedef struct dialler {
  tt_host_t h;
  uint8_t blob[MEP_TCP_ADDR_LEN];
  int rc;
} dialler_t;

static void *dial_thread(void *arg) {
  dialler_t *d = arg;
  mep_tp_ep_t *ep = NULL;
  d->rc = d->h.vt->connect(d->h.ctx, 1, d->blob, sizeof d->blob, &ep);
  return NULL;
}

/* C: counts its inet sockets and the connected ones, writes both. */
static _Noreturn void child(int wfd) {
  close(STDOUT_FILENO);
  close(STDERR_FILENO);
  int32_t found[2] = {0, 0};
  for (int fd = 3; fd < 1024; fd++) {
    int dom = 0;
    socklen_t l = sizeof dom;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l) || dom != AF_INET)
      continue;
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    found[0]++;
    found[1] += !getpeername(fd, (void *)&a, &al);
  }
  if (write(wfd, found, sizeof found) != sizeof found) _exit(2);
  struct timespec ts = {60, 0};
  nanosleep(&ts, NULL); /* killed by M long before */
  _exit(0);
}

/* D: dials on a thread, forks C once M says the dial was accepted. */
static _Noreturn void dialler(uint16_t port, int cfd, int wfd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  alarm(60);
  static dialler_t d;
  tt_open(&d.h, 0, 2, NULL, 0, 1, "lo", 20000);
  mep__tcp_addr_t a = {.ip = {127, 0, 0, 1}, .port = port, .incarnation = 7};
  mep__tcp_addr_encode(d.blob, &a);
  pthread_t t;
  TT_CHECK(!pthread_create(&t, NULL, dial_thread, &d), "pthread_create");
  uint8_t go;
  tt_recv(cfd, &go, 1, 20000);
  fflush(stdout);
  fflush(stderr);
  pid_t c = fork();
  TT_CHECK(c >= 0, "fork: %s", strerror(errno));
  if (c == 0) child(wfd);
  int32_t pid = (int32_t)c;
  tt_send(cfd, &pid, sizeof pid);
  tt_recv(cfd, &go, 1, 30000); /* M kills us meanwhile */
  TT_FAIL("the dialler was not killed");
}

static int listener(uint16_t *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  TT_CHECK(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
           !listen(fd, 4) && !getsockname(fd, (struct sockaddr *)&a, &al),
           "listener: %s", strerror(errno));
  *port = ntohs(a.sin_port);
  return fd;
}

/* Accepts the dialler's connection and reads its hello, within 10 s. */
static int accept_dial(int lfd) {
  struct pollfd pf = {.fd = lfd, .events = POLLIN};
  TT_CHECK(poll(&pf, 1, 10000) == 1, "the dialler never connected");
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  TT_CHECK(fd >= 0, "accept: %s", strerror(errno));
  uint8_t hello[256];
  pf = (struct pollfd){.fd = fd, .events = POLLIN};
  TT_CHECK(poll(&pf, 1, 10000) == 1 && recv(fd, hello, sizeof hello, 0) > 0,
           "no hello came");
  return fd;
}

/* Seconds until fd reads its end (0 bytes or an error), at most `limit`;
 * the hello's remaining bytes, if any, are read past. */
static double until_end(int fd, double limit) {
  double t0 = tt_now();
  for (;;) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int left = (int)((t0 + limit - tt_now()) * 1000);
    if (left <= 0 || poll(&pf, 1, left) == 0) return -1;
    uint8_t b[256];
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      return tt_now() - t0;
  }
}

int main(void) {
  alarm(120);
  signal(SIGPIPE, SIG_IGN);
  TT_CHECK(!prctl(PR_SET_CHILD_SUBREAPER, 1), "PR_SET_CHILD_SUBREAPER");
  uint16_t port;
  int lfd = listener(&port);
  int sv[2], pv[2];
  TT_CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv), "socketpair");
  TT_CHECK(!pipe2(pv, O_CLOEXEC), "pipe");
  fflush(stdout);
  fflush(stderr);
  pid_t d = fork(); /* before any thread of this process */
  TT_CHECK(d >= 0, "fork");
  if (d == 0) {
    close(lfd);
    close(sv[0]);
    close(pv[0]);
    dialler(port, sv[1], pv[1]);
  }
  close(sv[1]);
  close(pv[1]);
  int afd = accept_dial(lfd);
  uint8_t go = 1;
  tt_send(sv[0], &go, 1);
  int32_t cpid, found[2];
  tt_recv(sv[0], &cpid, sizeof cpid, 20000);
  struct pollfd pf = {.fd = pv[0], .events = POLLIN};
  TT_CHECK(poll(&pf, 1, 20000) == 1 &&
           read(pv[0], found, sizeof found) == sizeof found,
           "the forked child's findings never came");
  TT_CHECK(found[0] == 0, "the child forked while connect() dialled holds %d "
           "inet socket(s), %d of them connected", found[0], found[1]);
  TT_CHECK(!kill(d, SIGKILL), "kill");
  double took = until_end(afd, 5);
  TT_CHECK(took >= 0, "the dialler was killed 5 s ago and its connection is "
           "still open: the forked child holds it");
  int st = tt_reap(d, 10000);
  TT_CHECK(st >= 0 && WIFSIGNALED(st), "the dialler: status %#x", st);
  TT_CHECK(!kill(cpid, 0), "the forked child is gone already: the check "
           "proves nothing");
  kill(cpid, SIGKILL);
  st = tt_reap(cpid, 10000);
  TT_CHECK(st >= 0 && WIFSIGNALED(st), "the forked child: status %#x", st);
  close(afd);
  close(lfd);
  close(sv[0]);
  close(pv[0]);
  printf("ok: a child forked during a dial holds no inet socket; the dial "
         "ended %.3f s after its process\n", took);
  return 0;
}
