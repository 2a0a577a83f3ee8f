/*
 * test_tcp_fork_dial - a child forked while another thread's connect()
 * dials a peer does not keep the dialled socket (tcp: plugins/tcp/dial.c;
 * verbs and ibgda, MEP_TT_PLUGIN: the set-ups of
 * plugins/verbs/handshake.c).
 *
 * The acceptor never answers, so the dialler waits for the answer until
 * its deadline (20 s): for tcp (its address blob made here with wire.c),
 * a plain socket this process (M) listens on; for the other plugins, a
 * real context of rank 1 (process A) that never calls connect(), so its
 * hello sits unread. D opens a context as rank 0 and calls connect() for
 * rank 1 on a second thread; once D has a connected inet socket (the
 * dial), its main thread forks C. In C (async-signal-safe calls only), no
 * inet socket may be left: the listener and the dialled socket are
 * unconnected AF_UNIX sockets. For tcp, D is then SIGKILLed while C
 * sleeps, and M's end of the dialled connection must see its end within
 * 5 s (a child holding the socket would keep it open for its life).
 * Every wait has a deadline; this process is a child subreaper, so the
 * orphaned C is reaped here.
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
  uint8_t blob[MEP_TP_MAX_ADDR];
  size_t len;
} dialler_t;

static void *dial_thread(void *arg) {
  dialler_t *d = arg;
  mep_tp_ep_t *ep = NULL;
  d->h.vt->connect(d->h.ctx, 1, d->blob, d->len, &ep);
  return NULL;
}

/* This process's inet sockets: how many, and how many are connected. */
static void inet_census(int32_t found[2]) {
  found[0] = found[1] = 0;
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
}

/* C: writes its census and sleeps until killed. */
static _Noreturn void child(int wfd) {
  close(STDOUT_FILENO);
  close(STDERR_FILENO);
  int32_t found[2];
  inet_census(found);
  if (write(wfd, found, sizeof found) != sizeof found) _exit(2);
  struct timespec ts = {60, 0};
  nanosleep(&ts, NULL);
  _exit(0);
}

static int g_lfd = -1; /* M's listener (tcp), not D's to hold */

/* D: dials rank 1 on a thread; forks C once the dial is connected. */
static _Noreturn void dialler(int cfd, int wfd) {
  if (g_lfd >= 0) close(g_lfd);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  alarm(60);
  static dialler_t d;
  tt_open(&d.h, 0, 2, NULL, 0, 1, "lo", 20000);
  d.len = tt_recv(cfd, d.blob, sizeof d.blob, 20000);
  pthread_t t;
  TT_CHECK(!pthread_create(&t, NULL, dial_thread, &d), "pthread_create");
  int32_t found[2];
  double deadline = tt_now() + 10;
  do {
    TT_CHECK(tt_now() < deadline, "connect() has no connected socket "
             "after 10 s");
    usleep(1000);
    inet_census(found);
  } while (found[1] == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t c = fork();
  TT_CHECK(c >= 0, "fork: %s", strerror(errno));
  if (c == 0) child(wfd);
  int32_t pid = (int32_t)c;
  tt_send(cfd, &pid, sizeof pid);
  uint8_t end;
  tt_recv(cfd, &end, 1, 30000); /* M kills us meanwhile */
  TT_FAIL("the dialler was not killed");
}

/* A (other plugins): rank 1, listening, silent. */
static _Noreturn void acceptor(int cfd, int wfd) {
  (void)wfd;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  alarm(60);
  tt_host_t h;
  tt_open(&h, 1, 2, NULL, 0, 1, "lo", 20000);
  uint8_t blob[MEP_TP_MAX_ADDR];
  size_t n = sizeof blob;
  TT_OK(h.vt->address(h.ctx, blob, &n));
  tt_send(cfd, blob, n);
  uint8_t end;
  tt_recv(cfd, &end, 1, 30000); /* killed meanwhile */
  TT_FAIL("the acceptor was not killed");
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

static int accept_dial(int lfd) {
  struct pollfd pf = {.fd = lfd, .events = POLLIN};
  TT_CHECK(poll(&pf, 1, 10000) == 1, "the dialler never connected");
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  TT_CHECK(fd >= 0, "accept: %s", strerror(errno));
  return fd;
}

/* Seconds until fd reads its end (0 bytes or an error), or -1 after
 * `limit`; the hello's bytes are read past. */
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

/* Forks a process running fn (which never returns) with its end of a
 * control socket in *cfd. */
static pid_t spawn(void (*fn)(int, int), int *cfd, int wfd) {
  int sv[2];
  TT_CHECK(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv),
           "socketpair");
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork(); /* this process has no threads */
  TT_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    close(sv[0]);
    fn(sv[1], wfd);
    _exit(1);
  }
  close(sv[1]);
  *cfd = sv[0];
  return pid;
}

int main(void) {
  alarm(120);
  signal(SIGPIPE, SIG_IGN);
  TT_CHECK(!prctl(PR_SET_CHILD_SUBREAPER, 1), "PR_SET_CHILD_SUBREAPER");
  const char *plugin = getenv("MEP_TT_PLUGIN");
  int own = !plugin || !*plugin; /* tcp, with the acceptor made here */
  int pv[2], lfd = -1, acfd = -1, dcfd;
  TT_CHECK(!pipe2(pv, O_CLOEXEC), "pipe");
  uint8_t blob[MEP_TP_MAX_ADDR];
  size_t len;
  pid_t a = 0;
  if (own) {
    uint16_t port;
    g_lfd = lfd = listener(&port);
    mep__tcp_addr_t ad = {.ip = {127, 0, 0, 1}, .port = port,
                          .incarnation = 7};
    mep__tcp_addr_encode(blob, &ad);
    len = MEP_TCP_ADDR_LEN;
  } else {
    a = spawn(acceptor, &acfd, -1);
    len = tt_recv(acfd, blob, sizeof blob, 20000);
  }
  pid_t d = spawn(dialler, &dcfd, pv[1]);
  close(pv[1]);
  tt_send(dcfd, blob, len);
  int afd = own ? accept_dial(lfd) : -1;
  int32_t cpid, found[2];
  tt_recv(dcfd, &cpid, sizeof cpid, 20000);
  struct pollfd pf = {.fd = pv[0], .events = POLLIN};
  TT_CHECK(poll(&pf, 1, 20000) == 1 &&
           read(pv[0], found, sizeof found) == sizeof found,
           "the forked child's findings never came");
  TT_CHECK(found[0] == 0, "the child forked while connect() dialled holds %d "
           "inet socket(s), %d of them connected", found[0], found[1]);
  TT_CHECK(!kill(d, SIGKILL), "kill");
  double took = own ? until_end(afd, 5) : 0;
  TT_CHECK(took >= 0, "the dialler was killed 5 s ago and its connection is "
           "still open: the forked child holds it");
  int st = tt_reap(d, 10000);
  TT_CHECK(st >= 0 && WIFSIGNALED(st), "the dialler: status %#x", st);
  TT_CHECK(!kill(cpid, 0), "the forked child is gone already: the check "
           "proves nothing");
  kill(cpid, SIGKILL);
  st = tt_reap(cpid, 10000);
  TT_CHECK(st >= 0 && WIFSIGNALED(st), "the forked child: status %#x", st);
  if (a) {
    kill(a, SIGKILL);
    st = tt_reap(a, 10000);
    TT_CHECK(st >= 0 && WIFSIGNALED(st), "the acceptor: status %#x", st);
    close(acfd);
  }
  if (own) {
    close(afd);
    close(lfd);
  }
  close(dcfd);
  close(pv[0]);
  printf("ok: %s: a child forked during a dial holds no inet socket%s\n",
         own ? "tcp" : plugin, own ? "; the dialled connection ended with "
                                     "its process" : "");
  return 0;
}
