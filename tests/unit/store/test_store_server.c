/* test_store_server.c - the built-in TCP store server and client, across
 * threads and forked processes. One case per run: argv[1] names it (see
 * cases[] at the bottom). Values are random from a seed each process can
 * regenerate, so every byte read back is checked against an independent
 * copy. MEP_TEST_SEED=<n> replays a run. Every child is reaped and every
 * wait has a deadline.
 * A process forks only while it has no thread besides its own: a server
 * thread (or any other) could hold a lock, e.g. the allocator's, at the
 * fork and leave it taken forever in the child. So servers that share a
 * process with forked clients run in a child of their own, or the clients
 * are forked before the server thread starts; fork_alone() checks it. */
#include "mep/mep.h"
#include "store.h"
#include "store_proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t seed;

#define FAIL(...)                                                         \
  do {                                                                    \
    fprintf(stderr, "[pid %d] %s:%d: ", (int)getpid(), __FILE__,          \
            __LINE__);                                                    \
    fprintf(stderr, __VA_ARGS__);                                         \
    fprintf(stderr, " (seed %" PRIu64 "; last error: %s)\n", seed,        \
            mep_last_error());                                            \
    exit(1);                                                              \
  } while (0)
#define EXPECT(c, ...)                                                    \
  do {                                                                    \
    if (!(c)) FAIL(__VA_ARGS__);                                          \
  } while (0)
#define EXPECT_OK(call)                                                   \
  do {                                                                    \
    int rc_ = (call);                                                     \
    EXPECT(rc_ == MEP_OK, "%s returned %s", #call, mep_strerror(rc_));    \
  } while (0)

/* ------------------------------------------------------------ helpers */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Deterministic bytes for (seed, who): any process can rebuild them. */
static void gen(uint8_t *out, size_t n, uint64_t who) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + who * 0xbf58476d1ce4e5b9ull + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = (uint8_t)(x >> 24);
  }
}

/* Threads of this process, from /proc/self/task. */
static int thread_count(void) {
  DIR *d = opendir("/proc/self/task");
  EXPECT(d, "opendir /proc/self/task: %s", strerror(errno));
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* fork(), refused while another thread exists (see the top of the file).
 * The child dies with its parent, so a failing test leaves no process
 * behind to hold meson's output pipe open. */
static pid_t fork_alone(void) {
  int n = thread_count();
  EXPECT(n == 1, "fork with %d threads alive: a child could inherit a "
         "lock that stays taken", n);
  fflush(NULL);
  pid_t parent = getpid();
  pid_t pid = fork();
  EXPECT(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1); /* the parent is already gone */
  }
  return pid;
}

/* Waits for `pid` until the deadline, then kills it. Its exit status, or
 * -1 when it had to be killed or did not exit normally. */
static int reap(pid_t pid, int64_t deadline) {
  int status;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return -1;
    if (now_ms() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    sleep_ms(5);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static mep_store_server_t *server(const char *host, int *port) {
  mep_store_server_t *srv = NULL;
  EXPECT_OK(mep_store_server_start(host, 0, &srv));
  *port = mep_store_server_port(srv);
  EXPECT(*port > 0 && *port < 65536, "server port %d", *port);
  return srv;
}

static mep_store_t *client(const char *host, int port, int timeout_ms) {
  mep_store_t *s = NULL;
  EXPECT_OK(mep_store_tcp_connect(host, port, timeout_ms, &s));
  EXPECT(s && s->set && s->get && s->add && s->check, "incomplete store");
  return s;
}

static void expect_value(mep_store_t *s, const char *key, const void *want,
                         size_t want_len, int timeout_ms) {
  void *v = NULL;
  size_t len = 12345;
  int rc = s->get(s->ctx, key, &v, &len, timeout_ms);
  EXPECT(rc == MEP_OK, "get %s: %s", key, mep_strerror(rc));
  EXPECT(v != NULL, "get %s gave NULL", key);
  EXPECT(len == want_len, "get %s: %zu bytes, want %zu", key, len, want_len);
  EXPECT(!memcmp(v, want, len), "get %s: the bytes differ", key);
  free(v);
}

static void expect_str(mep_store_t *s, const char *key, const char *want) {
  expect_value(s, key, want, strlen(want), 5000);
}

static int exists(mep_store_t *s, const char *key) {
  int e = -1;
  EXPECT_OK(s->check(s->ctx, key, &e));
  EXPECT(e == 0 || e == 1, "check %s gave %d", key, e);
  return e;
}

/* A port nobody listens on (the kernel's pick, released again). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  EXPECT(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &len) == 0,
         "cannot find a free port: %s", strerror(errno));
  close(fd);
  return ntohs(a.sin_port);
}

/* Reads an int from `fd` written by another process, within 10 s. */
static int read_int(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int v = -1;
  EXPECT(poll(&p, 1, 10000) == 1 && read(fd, &v, sizeof v) == sizeof v,
         "no word from the other process");
  return v;
}

/* ----------------------------------------------------- raw connections */

static int raw_connect(int port, int *local_port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  EXPECT(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0,
         "raw connect: %s", strerror(errno));
  socklen_t len = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &len);
  if (local_port) *local_port = ntohs(a.sin_port);
  return fd;
}

static void raw_send(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    EXPECT(w > 0, "raw send: %s", strerror(errno));
    p += w;
    len -= (size_t)w;
  }
}

static void raw_request(int fd, uint8_t op, uint32_t seq, const char *key,
                        const void *val, uint64_t vlen) {
  uint8_t h[MEP__STORE_HDR_LEN];
  mep__store_hdr_t hdr = {.op = op, .seq = seq,
                          .key_len = (uint32_t)strlen(key), .val_len = vlen};
  mep__store_encode_header(h, &hdr);
  raw_send(fd, h, sizeof h);
  raw_send(fd, key, strlen(key));
  if (val) raw_send(fd, val, (size_t)vlen);
}

/* 1 when n bytes arrived, 0 at end of stream or reset, -1 at the
 * deadline. */
static int raw_recv(int fd, void *buf, size_t n, int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  uint8_t *p = buf;
  while (n) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int64_t left = deadline - now_ms();
    if (left <= 0 || poll(&pfd, 1, (int)left) <= 0) return -1;
    ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return 0;
    p += r;
    n -= (size_t)r;
  }
  return 1;
}

/* Reads one reply; returns its op and fills body (up to cap bytes). */
static int raw_reply(int fd, uint32_t seq, uint8_t *body, size_t cap,
                     size_t *len) {
  uint8_t h[MEP__STORE_HDR_LEN];
  EXPECT(raw_recv(fd, h, sizeof h, 10000) == 1, "no reply header");
  mep__store_hdr_t hdr;
  EXPECT(mep__store_decode_header(h, sizeof h, MEP__STORE_REPLY, &hdr,
                                  NULL) == MEP__STORE_FRAME_OK,
         "malformed reply");
  EXPECT(hdr.seq == seq, "reply seq %u, want %u", hdr.seq, seq);
  EXPECT(hdr.val_len <= cap, "reply of %" PRIu64 " bytes", hdr.val_len);
  EXPECT(raw_recv(fd, body, (size_t)hdr.val_len, 10000) == 1,
         "no reply body");
  *len = (size_t)hdr.val_len;
  return hdr.op;
}

/* The server must close this connection within 3 s. */
static void expect_dropped(int fd) {
  uint8_t b[256];
  int64_t deadline = now_ms() + 3000;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int64_t left = deadline - now_ms();
    EXPECT(left > 0 && poll(&p, 1, (int)left) == 1,
           "the server kept a connection that sent garbage");
    ssize_t r = recv(fd, b, sizeof b, 0);
    EXPECT(r <= 0, "the server answered garbage with %zd bytes", r);
    return;
  }
}

/* ---------------------------------------------------- case: multi */

#define NCHILD 5
#define NADD 1000
static const size_t child_sizes[NCHILD] = {0, 1, 7, 4099, 65536 + 3};

static void multi_child(int me, int port_fd) {
  int port = read_int(port_fd);
  mep_store_t *s = client("127.0.0.1", port, 10000);
  char key[32];
  /* Later children set later, so earlier ones must block in get. */
  sleep_ms(60 * me);
  uint8_t *mine = malloc(child_sizes[me] + 1);
  gen(mine, child_sizes[me], (uint64_t)me);
  snprintf(key, sizeof key, "key/%d", me);
  EXPECT_OK(s->set(s->ctx, key, mine, child_sizes[me]));
  free(mine);
  for (int j = 0; j < NCHILD; j++) {
    uint8_t *want = malloc(child_sizes[j] + 1);
    gen(want, child_sizes[j], (uint64_t)j);
    snprintf(key, sizeof key, "key/%d", j);
    expect_value(s, key, want, child_sizes[j], 10000);
    EXPECT(exists(s, key) == 1, "check %s after get", key);
    free(want);
  }
  EXPECT(exists(s, "key/none") == 0, "check of an unset key");
  int64_t last = 0, r;
  for (int i = 0; i < NADD; i++) {
    EXPECT_OK(s->add(s->ctx, "counter", me + 1, &r));
    EXPECT(r > last, "add results not increasing: %" PRId64 " after %"
           PRId64, r, last);
    last = r;
  }
  mep_store_destroy(s);
  exit(0);
}

static void case_multi(void) {
  pid_t pids[NCHILD];
  int fds[NCHILD];
  /* Children are forked before the server thread exists: they learn its
   * port through a pipe. */
  for (int i = 0; i < NCHILD; i++) {
    int p[2];
    EXPECT(pipe(p) == 0, "pipe");
    pids[i] = fork_alone();
    if (pids[i] == 0) {
      close(p[1]);
      multi_child(i, p[0]);
    }
    close(p[0]);
    fds[i] = p[1];
  }
  int port;
  mep_store_server_t *srv = server("127.0.0.1", &port);
  for (int i = 0; i < NCHILD; i++) {
    EXPECT(write(fds[i], &port, sizeof port) == sizeof port, "write port");
    close(fds[i]);
  }
  int64_t deadline = now_ms() + 90000;
  int failed = 0;
  for (int i = 0; i < NCHILD; i++) {
    int st = reap(pids[i], deadline);
    if (st != 0) fprintf(stderr, "child %d exited with %d\n", i, st);
    failed |= st != 0;
  }
  EXPECT(!failed, "a child failed");
  mep_store_t *s = client("127.0.0.1", port, 5000);
  int64_t total = 0, r;
  for (int i = 0; i < NCHILD; i++) total += (int64_t)NADD * (i + 1);
  EXPECT_OK(s->add(s->ctx, "counter", 0, &r));
  EXPECT(r == total, "counter %" PRId64 ", want %" PRId64, r, total);
  char text[32];
  snprintf(text, sizeof text, "%" PRId64, total);
  expect_str(s, "counter", text); /* counters read as decimal text */
  mep_store_destroy(s);
  mep_store_server_stop(srv);
}

/* -------------------------------------------------- case: timeout */

typedef struct late_set {
  mep_store_t *s;
  const char *key, *val;
  int delay_ms;
} late_set_t;

static void *late_set_main(void *arg) {
  late_set_t *a = arg;
  sleep_ms(a->delay_ms);
  EXPECT_OK(a->s->set(a->s->ctx, a->key, a->val, strlen(a->val)));
  return NULL;
}

static void case_timeout(void) {
  int port;
  mep_store_server_t *srv = server("127.0.0.1", &port);
  mep_store_t *a = client("127.0.0.1", port, 5000);
  mep_store_t *b = client("127.0.0.1", port, 5000);
  void *v = NULL;
  size_t len;
  int64_t t0 = now_ms();
  int rc = a->get(a->ctx, "late", &v, &len, 300);
  int64_t took = now_ms() - t0;
  EXPECT(rc == MEP_ERR_TIMEOUT, "get of an absent key: %s",
         mep_strerror(rc));
  EXPECT(took >= 300 && took <= 500, "timeout after %" PRId64 " ms", took);
  EXPECT(strstr(mep_last_error(), "late") &&
             strstr(mep_last_error(), "timed out"),
         "timeout message: %s", mep_last_error());
  /* The server still holds the abandoned get: the client must not queue
   * behind it. */
  t0 = now_ms();
  EXPECT_OK(a->set(a->ctx, "k1", "v1", 2));
  expect_str(a, "k1", "v1");
  EXPECT(now_ms() - t0 < 1000, "requests after a timeout took %" PRId64
         " ms", now_ms() - t0);
  /* The answer to the abandoned get appears now; it must not be taken
   * for the answer to anything that follows. */
  EXPECT_OK(b->set(b->ctx, "late", "LATE-VALUE", 10));
  sleep_ms(50);
  EXPECT_OK(a->set(a->ctx, "k2", "v2", 2));
  expect_str(a, "k2", "v2");
  expect_str(a, "late", "LATE-VALUE");
  int64_t r;
  EXPECT_OK(a->add(a->ctx, "ctr", 3, &r));
  EXPECT(r == 3, "add after a timeout gave %" PRId64, r);

  /* timeout 0: no wait, but a key that is there is found. */
  t0 = now_ms();
  rc = a->get(a->ctx, "absent", &v, &len, 0);
  EXPECT(rc == MEP_ERR_TIMEOUT && now_ms() - t0 < 200,
         "get with timeout 0 of an absent key: %s", mep_strerror(rc));
  expect_value(a, "k2", "v2", 2, 0);

  /* Races: the value lands right around the deadline. Whatever the get
   * returns, the next request on the same store reads its own answer. */
  int answered = 0, timed_out = 0;
  for (int round = 0; round < 30; round++) {
    char key[32], val[32], other[32];
    snprintf(key, sizeof key, "race/%d", round);
    snprintf(val, sizeof val, "value-%d", round);
    snprintf(other, sizeof other, "other-%d", round);
    late_set_t ls = {b, key, val, 35 + (int)((seed + (uint64_t)round) % 30)};
    pthread_t t;
    pthread_create(&t, NULL, late_set_main, &ls);
    t0 = now_ms();
    rc = a->get(a->ctx, key, &v, &len, 50);
    took = now_ms() - t0;
    if (rc == MEP_OK) {
      EXPECT(len == strlen(val) && !memcmp(v, val, len), "race get wrong");
      free(v);
      answered++;
    } else {
      timed_out++;
      EXPECT(rc == MEP_ERR_TIMEOUT && took < 250, "race get: %s after %"
             PRId64 " ms", mep_strerror(rc), took);
    }
    pthread_join(t, NULL);
    EXPECT_OK(a->set(a->ctx, other, other, strlen(other)));
    expect_str(a, other, other);
    expect_str(a, key, val);
  }
  printf("race rounds: %d answered in time, %d timed out\n", answered,
         timed_out);
  mep_store_destroy(a);
  mep_store_destroy(b);
  mep_store_server_stop(srv);
}

/* -------------------------------------------------- case: threads */

typedef struct adder {
  mep_store_t *s;
  int n;
  int rc;
} adder_t;

static void *adder_main(void *arg) {
  adder_t *a = arg;
  int64_t last = 0, r;
  for (int i = 0; i < a->n && a->rc == MEP_OK; i++) {
    a->rc = a->s->add(a->s->ctx, "tctr", 1, &r);
    if (a->rc == MEP_OK && r <= last) a->rc = MEP_ERR_MISMATCH;
    last = r;
  }
  return NULL;
}

static void case_threads(void) {
  int port;
  mep_store_server_t *srv = server("127.0.0.1", &port);
  mep_store_t *s = client("127.0.0.1", port, 5000);
  /* One store, one thread blocked in get, another setting what it waits
   * for: must not deadlock. */
  late_set_t ls = {s, "gate", "open", 100};
  pthread_t t;
  pthread_create(&t, NULL, late_set_main, &ls);
  int64_t t0 = now_ms();
  expect_value(s, "gate", "open", 4, 5000);
  EXPECT(now_ms() - t0 >= 90, "get returned before the set");
  pthread_join(t, NULL);

  enum { NT = 4, PER = 500 };
  pthread_t ts[NT];
  adder_t ad[NT];
  for (int i = 0; i < NT; i++) {
    ad[i] = (adder_t){s, PER, MEP_OK};
    pthread_create(&ts[i], NULL, adder_main, &ad[i]);
  }
  for (int i = 0; i < NT; i++) {
    pthread_join(ts[i], NULL);
    EXPECT(ad[i].rc == MEP_OK, "thread %d: %s", i, mep_strerror(ad[i].rc));
  }
  int64_t r;
  EXPECT_OK(s->add(s->ctx, "tctr", 0, &r));
  EXPECT(r == NT * PER, "threads counted %" PRId64, r);
  mep_store_destroy(s);
  mep_store_server_stop(srv);
}

/* ----------------------------------------------- cases: stop, killed */

typedef struct waiter {
  mep_store_t *s;
  const char *key;
  int timeout_ms;
  int rc;
  int64_t done_ms;
  char value[64];
  char msg[1024];
} waiter_t;

/* A get in its own thread; keeps the result and the thread's message. */
static void *waiter_main(void *arg) {
  waiter_t *w = arg;
  void *v = NULL;
  size_t len;
  w->rc = w->s->get(w->s->ctx, w->key, &v, &len, w->timeout_ms);
  w->done_ms = now_ms();
  snprintf(w->msg, sizeof w->msg, "%s", mep_last_error());
  if (w->rc == MEP_OK) {
    snprintf(w->value, sizeof w->value, "%.*s",
             (int)(len < 63 ? len : 63), (const char *)v);
    free(v);
  }
  return NULL;
}

static void case_stop(void) {
  int port;
  mep_store_server_t *srv = server("127.0.0.1", &port);
  mep_store_t *s = client("127.0.0.1", port, 1000);
  mep_store_t *idle = client("127.0.0.1", port, 1000);
  EXPECT_OK(s->set(s->ctx, "x", "1", 1));
  EXPECT_OK(idle->set(idle->ctx, "y", "1", 1));
  waiter_t w = {.s = s, .key = "never", .timeout_ms = 10000};
  pthread_t t;
  pthread_create(&t, NULL, waiter_main, &w);
  sleep_ms(200);
  int64_t t0 = now_ms();
  mep_store_server_stop(srv);
  pthread_join(t, NULL);
  EXPECT(w.rc == MEP_ERR_PEER_FAILED || w.rc == MEP_ERR_CLOSED,
         "get during stop: %s", mep_strerror(w.rc));
  EXPECT(w.done_ms - t0 < 1000, "get noticed the stop after %" PRId64 " ms",
         w.done_ms - t0);
  EXPECT(strstr(w.msg, "closed") || strstr(w.msg, "reset"),
         "message: %s", w.msg);
  /* With the server gone, requests fail within the store's timeout and
   * name the server. */
  char where[32];
  snprintf(where, sizeof where, "127.0.0.1:%d", port);
  t0 = now_ms();
  int rc = s->set(s->ctx, "x", "2", 1);
  int64_t took = now_ms() - t0;
  EXPECT(rc != MEP_OK && took <= 1300, "set after stop: %s after %" PRId64
         " ms", mep_strerror(rc), took);
  EXPECT(strstr(mep_last_error(), where), "message without %s: %s", where,
         mep_last_error());
  /* A new server on the same port: the connection that sat idle through
   * the restart is noticed as dead and replaced. */
  EXPECT_OK(mep_store_server_start("127.0.0.1", port, &srv));
  EXPECT_OK(idle->set(idle->ctx, "y", "2", 1));
  expect_str(idle, "y", "2");
  expect_str(s, "y", "2");
  mep_store_destroy(idle);
  mep_store_destroy(s);
  mep_store_server_stop(srv);
}

/* forked: the server's process forks a child that outlives it (as a
 * DataLoader worker of rank 0 would); its death must show all the same. */
static void killed(int forked) {
  int p[2], q[2]; /* server to test, test to server */
  EXPECT(pipe(p) == 0 && pipe(q) == 0, "pipe");
  /* This process adopts the orphaned grandchild, to reap it. */
  EXPECT(!forked || prctl(PR_SET_CHILD_SUBREAPER, 1) == 0, "subreaper");
  /* The server in a child, so that it can die by SIGKILL. */
  pid_t pid = fork_alone();
  if (pid == 0) {
    close(p[0]);
    close(q[1]);
    int port;
    mep_store_server_t *srv = server("127.0.0.1", &port);
    EXPECT(write(p[1], &port, sizeof port) == sizeof port, "write");
    int child = 0;
    if (forked) {
      /* once the client is connected; not fork_alone: a thread runs,
       * which is the case, and the grandchild keeps to async-signal-safe
       * calls */
      read_int(q[0]);
      fflush(NULL);
      child = fork();
      EXPECT(child >= 0, "fork");
      if (child == 0) { /* off the test's output: a failure ends sooner */
        close(STDOUT_FILENO);
        close(STDERR_FILENO);
        struct timespec ts = {30, 0};
        nanosleep(&ts, NULL); /* killed by the test before */
        _exit(0);
      }
    }
    EXPECT(write(p[1], &child, sizeof child) == sizeof child, "write");
    sleep_ms(30000); /* killed long before */
    mep_store_server_stop(srv);
    exit(2);
  }
  close(p[1]);
  close(q[0]);
  int port = read_int(p[0]);
  mep_store_t *s = client("127.0.0.1", port, 1000);
  EXPECT_OK(s->set(s->ctx, "x", "1", 1));
  expect_str(s, "x", "1");
  int go = 1;
  EXPECT(write(q[1], &go, sizeof go) == sizeof go, "write");
  pid_t grandchild = read_int(p[0]);
  close(p[0]);
  close(q[1]);
  /* No deadline at all: the end of the stream must end it. */
  waiter_t w = {.s = s, .key = "never", .timeout_ms = -1};
  pthread_t t;
  pthread_create(&t, NULL, waiter_main, &w);
  sleep_ms(200);
  int64_t t0 = now_ms();
  kill(pid, SIGKILL);
  int st = reap(pid, now_ms() + 5000);
  EXPECT(st == -1, "server child exited by itself (%d)", st);
  pthread_join(t, NULL);
  EXPECT(w.rc == MEP_ERR_PEER_FAILED, "get while the server died: %s",
         mep_strerror(w.rc));
  EXPECT(w.done_ms - t0 < 2000, "noticed the death after %" PRId64 " ms",
         w.done_ms - t0);
  char where[32];
  snprintf(where, sizeof where, "127.0.0.1:%d", port);
  EXPECT(strstr(w.msg, where) && strstr(w.msg, "never"),
         "message without server or key: %s", w.msg);
  int e;
  t0 = now_ms();
  EXPECT(s->check(s->ctx, "x", &e) != MEP_OK && now_ms() - t0 <= 1300,
         "check after the server died");
  mep_store_destroy(s);
  if (forked) {
    EXPECT(kill(grandchild, 0) == 0, "the forked child was gone before the "
           "check: it proves nothing");
    kill(grandchild, SIGKILL);
    EXPECT(reap(grandchild, now_ms() + 5000) == -1, "the forked child");
  }
}

static void case_killed(void) { killed(0); }
static void case_killed_forked(void) { killed(1); }

/* -------------------------------------------------- case: refused */

static void case_refused(void) {
  int port = free_port();
  char where[32];
  snprintf(where, sizeof where, "127.0.0.1:%d", port);
  mep_store_t *s = NULL;
  int64_t t0 = now_ms();
  int rc = mep_store_tcp_connect("127.0.0.1", port, 500, &s);
  int64_t took = now_ms() - t0;
  EXPECT(rc == MEP_ERR_TIMEOUT && s == NULL, "connect to nobody: %s",
         mep_strerror(rc));
  EXPECT(took >= 450 && took <= 700, "gave up after %" PRId64 " ms", took);
  EXPECT(strstr(mep_last_error(), where) &&
             strstr(mep_last_error(), "connection refused"),
         "message: %s", mep_last_error());

  /* A server that comes up late is found by the retries. */
  int p[2];
  EXPECT(pipe(p) == 0, "pipe");
  pid_t pid = fork_alone();
  if (pid == 0) {
    close(p[1]);
    sleep_ms(300);
    mep_store_server_t *srv = NULL;
    if (mep_store_server_start("127.0.0.1", port, &srv) != MEP_OK) exit(3);
    read_int(p[0]); /* until the parent is done or 10 s */
    mep_store_server_stop(srv);
    exit(0);
  }
  close(p[0]);
  t0 = now_ms();
  rc = mep_store_tcp_connect("127.0.0.1", port, 5000, &s);
  took = now_ms() - t0;
  EXPECT(rc == MEP_OK, "connect to a late server: %s", mep_strerror(rc));
  EXPECT(took >= 250, "connected after %" PRId64 " ms, before the server",
         took);
  EXPECT_OK(s->set(s->ctx, "late-server", "yes", 3));
  expect_str(s, "late-server", "yes");
  mep_store_destroy(s);
  int one = 1;
  EXPECT(write(p[1], &one, sizeof one) == sizeof one, "write");
  close(p[1]);
  EXPECT(reap(pid, now_ms() + 10000) == 0, "late server child failed");

  /* Arguments are checked. */
  EXPECT(mep_store_tcp_connect("127.0.0.1", 0, 100, &s) == MEP_ERR_INVALID,
         "port 0 accepted");
  EXPECT(mep_store_tcp_connect(NULL, port, 100, &s) == MEP_ERR_INVALID,
         "NULL host accepted");
}

/* ---------------------------------------------------- case: names */

static int ipv6_loopback(void) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 a = {.sin6_family = AF_INET6,
                           .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

static void case_names(void) {
  int port;
  mep_store_server_t *srv = server(NULL, &port); /* every interface */
  mep_store_t *a = client("127.0.0.1", port, 5000);
  mep_store_t *b = client("localhost", port, 5000);
  EXPECT_OK(a->set(a->ctx, "via-a", "A", 1));
  expect_str(b, "via-a", "A");
  int v6 = ipv6_loopback();
  if (v6) {
    mep_store_t *c = client("::1", port, 5000);
    EXPECT_OK(c->set(c->ctx, "via-c", "C", 1));
    expect_str(a, "via-c", "C");
    expect_str(c, "via-a", "A");
    mep_store_destroy(c);
  } else {
    printf("no IPv6 loopback here: IPv6 part skipped\n");
  }
  mep_store_destroy(a);
  mep_store_destroy(b);
  mep_store_server_stop(srv);

  if (v6) {
    srv = server("::1", &port);
    a = client("::1", port, 5000);
    EXPECT_OK(a->set(a->ctx, "k", "v6", 2));
    expect_str(a, "k", "v6");
    mep_store_destroy(a);
    mep_store_server_stop(srv);
  }
  mep_store_t *s = NULL;
  int rc = mep_store_tcp_connect("no-such-host.invalid", 1, 2000, &s);
  EXPECT(rc != MEP_OK && strstr(mep_last_error(), "no-such-host.invalid"),
         "unknown host: %s / %s", mep_strerror(rc), mep_last_error());
  mep_store_server_t *bad = NULL;
  EXPECT(mep_store_server_start("127.0.0.1", 70000, &bad) ==
             MEP_ERR_INVALID && !bad, "port 70000 accepted");
}

/* -------------------------------------------------- case: garbage */

static char log_path[64];

static int log_mentions(const char *a, const char *b) {
  FILE *f = fopen(log_path, "r");
  if (!f) return 0;
  char line[2048];
  int found = 0;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, a) && strstr(line, b);
  fclose(f);
  return found;
}

static void case_garbage(void) {
  int port;
  mep_store_server_t *srv = server("127.0.0.1", &port);
  mep_store_t *a = client("127.0.0.1", port, 5000);
  EXPECT_OK(a->set(a->ctx, "a", "1", 1));

  /* An idle raw connection must not hold up anyone. */
  int idle = raw_connect(port, NULL);

  /* Noise from the first byte on. */
  int lp;
  int g1 = raw_connect(port, &lp);
  uint8_t noise[100];
  gen(noise, sizeof noise, 77);
  noise[0] = 'X';
  raw_send(g1, noise, sizeof noise);
  expect_dropped(g1);
  close(g1);
  char peer[32];
  snprintf(peer, sizeof peer, "127.0.0.1:%d", lp);
  EXPECT(log_mentions(peer, "malformed"),
         "no warning naming %s in the log", peer);

  /* A right magic with a broken checksum. */
  int g2 = raw_connect(port, NULL);
  uint8_t h[MEP__STORE_HDR_LEN];
  mep__store_hdr_t hdr = {.op = MEP__STORE_CHECK, .seq = 1, .key_len = 1};
  mep__store_encode_header(h, &hdr);
  h[12] ^= 0x40; /* key_len 1 -> 65 */
  raw_send(g2, h, sizeof h);
  raw_send(g2, "a", 1);
  expect_dropped(g2);
  close(g2);

  /* Half a header, then gone. */
  int g3 = raw_connect(port, NULL);
  mep__store_encode_header(h, &hdr);
  raw_send(g3, h, 10);
  close(g3);

  /* A parked get whose client leaves. */
  int g4 = raw_connect(port, NULL);
  raw_request(g4, MEP__STORE_GET, 9, "ghost", NULL, 0);
  sleep_ms(50);
  close(g4);
  sleep_ms(50);

  expect_str(a, "a", "1");
  EXPECT_OK(a->set(a->ctx, "ghost", "boo", 3));
  expect_str(a, "ghost", "boo");

  /* Refused but well-formed: an error reply, the connection stays. */
  int g5 = raw_connect(port, NULL);
  char bigkey[4098];
  memset(bigkey, 'k', 4097);
  bigkey[4097] = '\0';
  raw_request(g5, MEP__STORE_SET, 5, bigkey, "0123456789", 10);
  uint8_t body[2048];
  size_t len;
  EXPECT(raw_reply(g5, 5, body, sizeof body, &len) == MEP__STORE_ERR,
         "oversize key not refused");
  EXPECT(len >= 4 && (int32_t)mep__store_get_u32(body) == MEP_ERR_INVALID,
         "oversize key: wrong error code");
  raw_request(g5, MEP__STORE_CHECK, 6, "a", NULL, 0);
  EXPECT(raw_reply(g5, 6, body, sizeof body, &len) == MEP__STORE_OK &&
             len == 1 && body[0] == 1, "connection not kept after refusal");
  /* Two requests in one write are answered in order. */
  uint8_t two[2 * MEP__STORE_HDR_LEN + 8];
  mep__store_hdr_t s1 = {.op = MEP__STORE_SET, .seq = 7, .key_len = 1,
                         .val_len = 3};
  mep__store_hdr_t g1h = {.op = MEP__STORE_GET, .seq = 8, .key_len = 1};
  mep__store_encode_header(two, &s1);
  memcpy(two + 28, "pxyz", 4);
  mep__store_encode_header(two + 32, &g1h);
  two[60] = 'p';
  raw_send(g5, two, 61);
  EXPECT(raw_reply(g5, 7, body, sizeof body, &len) == MEP__STORE_OK &&
             len == 0, "pipelined set");
  EXPECT(raw_reply(g5, 8, body, sizeof body, &len) == MEP__STORE_OK &&
             len == 3 && !memcmp(body, "xyz", 3), "pipelined get");
  /* A request behind a parked get waits for it: replies stay in order. */
  raw_request(g5, MEP__STORE_GET, 10, "pk", NULL, 0);
  raw_request(g5, MEP__STORE_SET, 11, "pk2", "z", 1);
  sleep_ms(100);
  EXPECT(exists(a, "pk2") == 0, "a set overtook a parked get");
  EXPECT_OK(a->set(a->ctx, "pk", "y", 1));
  EXPECT(raw_reply(g5, 10, body, sizeof body, &len) == MEP__STORE_OK &&
             len == 1 && body[0] == 'y', "parked get answered wrongly");
  EXPECT(raw_reply(g5, 11, body, sizeof body, &len) == MEP__STORE_OK &&
             len == 0, "set behind a parked get");
  expect_str(a, "pk2", "z");
  close(g5);
  close(idle);

  expect_str(a, "p", "xyz");
  EXPECT_OK(a->set(a->ctx, "b", "2", 1));
  expect_str(a, "b", "2");
  mep_store_destroy(a);
  mep_store_server_stop(srv);
}

/* ------------------------------------------------- case: oversize */

static void case_oversize(void) {
  int port;
  mep_store_server_t *srv = server("127.0.0.1", &port);
  mep_store_t *s = client("127.0.0.1", port, 5000);
  /* The client refuses what the server would, before sending. */
  static char key[MEP__STORE_KEY_MAX + 2];
  memset(key, 'q', MEP__STORE_KEY_MAX + 1);
  EXPECT(s->set(s->ctx, key, "v", 1) == MEP_ERR_INVALID, "key 4097 sent");
  key[MEP__STORE_KEY_MAX] = '\0';
  EXPECT_OK(s->set(s->ctx, key, "v", 1));
  expect_str(s, key, "v");
  uint8_t byte = 0;
  EXPECT(s->set(s->ctx, "huge", &byte, (size_t)MEP__STORE_VAL_MAX + 1) ==
             MEP_ERR_INVALID, "value over 1 GiB accepted");
  EXPECT(s->set(s->ctx, "", "v", 1) == MEP_ERR_INVALID, "empty key");

  /* The server drops an oversize value's bytes, answers, and goes on. */
  int fd = raw_connect(port, NULL);
  uint64_t total = MEP__STORE_VAL_MAX + 1;
  raw_request(fd, MEP__STORE_SET, 1, "huge", NULL, total);
  size_t chunk = 1 << 20;
  uint8_t *zeros = calloc(1, chunk);
  int64_t t0 = now_ms();
  for (uint64_t sent = 0; sent < total; sent += chunk)
    raw_send(fd, zeros, total - sent < chunk ? (size_t)(total - sent) : chunk);
  free(zeros);
  uint8_t body[2048];
  size_t len;
  EXPECT(raw_reply(fd, 1, body, sizeof body, &len) == MEP__STORE_ERR &&
             (int32_t)mep__store_get_u32(body) == MEP_ERR_INVALID,
         "oversize value not refused");
  printf("1 GiB + 1 refused in %" PRId64 " ms: %.*s\n", now_ms() - t0,
         (int)len - 4, (const char *)body + 4);
  raw_request(fd, MEP__STORE_CHECK, 2, "huge", NULL, 0);
  EXPECT(raw_reply(fd, 2, body, sizeof body, &len) == MEP__STORE_OK &&
             len == 1 && body[0] == 0, "refused value was stored");
  close(fd);
  EXPECT(exists(s, "huge") == 0, "refused value visible");
  mep_store_destroy(s);
  mep_store_server_stop(srv);
}

/* ------------------------------------------------ case: badserver */

/* What a fake server does with the one request it reads. */
enum { FAKE_BADSEQ, FAKE_NOISE, FAKE_HUGE, FAKE_BADCODE, FAKE_SHORT,
       FAKE_CHECK2, FAKE_OK, FAKE_SILENT, FAKE_NSTEPS };

typedef struct fake {
  int lfd;
} fake_t;

static void fake_reply(int fd, uint8_t op, uint32_t seq, uint64_t vlen,
                       const void *body, size_t body_len) {
  uint8_t h[MEP__STORE_HDR_LEN];
  mep__store_hdr_t hdr = {.op = op, .seq = seq, .val_len = vlen};
  mep__store_encode_header(h, &hdr);
  raw_send(fd, h, sizeof h);
  if (body_len) raw_send(fd, body, body_len);
}

static void *fake_main(void *arg) {
  fake_t *f = arg;
  int fd = -1;
  for (int step = 0; step < FAKE_NSTEPS; step++) {
    if (fd < 0) {
      struct pollfd p = {.fd = f->lfd, .events = POLLIN};
      EXPECT(poll(&p, 1, 5000) == 1, "fake server: no client");
      fd = accept(f->lfd, NULL, NULL);
      EXPECT(fd >= 0, "fake server: accept");
    }
    uint8_t h[MEP__STORE_HDR_LEN], body[64];
    mep__store_hdr_t req;
    EXPECT(raw_recv(fd, h, sizeof h, 5000) == 1 &&
               mep__store_decode_header(h, sizeof h, MEP__STORE_REQUEST,
                                        &req, NULL) == MEP__STORE_FRAME_OK &&
               req.key_len + req.val_len <= sizeof body &&
               raw_recv(fd, body, req.key_len + req.val_len, 5000) == 1,
           "fake server: bad request at step %d", step);
    uint8_t noise[MEP__STORE_HDR_LEN], code[4];
    switch (step) {
    case FAKE_BADSEQ:
      fake_reply(fd, MEP__STORE_OK, req.seq + 1, 1, "\1", 1);
      break;
    case FAKE_NOISE:
      gen(noise, sizeof noise, 99);
      raw_send(fd, noise, sizeof noise);
      break;
    case FAKE_HUGE:
      fake_reply(fd, MEP__STORE_OK, req.seq, 1ull << 40, NULL, 0);
      break;
    case FAKE_BADCODE:
      mep__store_put_u32(code, 5);
      fake_reply(fd, MEP__STORE_ERR, req.seq, 4, code, 4);
      continue; /* a well-formed frame: the client keeps the connection */
    case FAKE_SHORT:
      fake_reply(fd, MEP__STORE_OK, req.seq, 100, "0123456789", 10);
      break;
    case FAKE_CHECK2:
      /* A well-formed frame with a bad value: the client keeps the
       * connection, so closing it here would race its next request. */
      fake_reply(fd, MEP__STORE_OK, req.seq, 2, "\1\1", 2);
      continue;
    case FAKE_OK:
      fake_reply(fd, MEP__STORE_OK, req.seq, 0, NULL, 0);
      continue; /* a good answer keeps the connection */
    case FAKE_SILENT:
      raw_recv(fd, body, 1, 5000); /* until the client leaves */
      break;
    }
    close(fd);
    fd = -1;
  }
  return NULL;
}

static void expect_fail(int rc, int want, const char *what, const char *in) {
  EXPECT(rc == want, "%s: %s, want %s", what, mep_strerror(rc),
         mep_strerror(want));
  EXPECT(strstr(mep_last_error(), in), "%s: message without '%s': %s", what,
         in, mep_last_error());
}

/* The client against a server that answers wrongly: an error, never a
 * crash, a hang or a huge allocation. */
static void case_badserver(void) {
  fake_t f;
  f.lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  EXPECT(f.lfd >= 0 && bind(f.lfd, (struct sockaddr *)&a, sizeof a) == 0 &&
             listen(f.lfd, 8) == 0 &&
             getsockname(f.lfd, (struct sockaddr *)&a, &alen) == 0,
         "fake server: %s", strerror(errno));
  pthread_t t;
  pthread_create(&t, NULL, fake_main, &f);
  mep_store_t *s = client("127.0.0.1", ntohs(a.sin_port), 2000);
  int e;
  void *v = NULL;
  size_t len;
  expect_fail(s->check(s->ctx, "a", &e), MEP_ERR_PROTOCOL, "wrong seq",
              "another request");
  expect_fail(s->check(s->ctx, "a", &e), MEP_ERR_PROTOCOL, "noise",
              "bad reply");
  expect_fail(s->get(s->ctx, "a", &v, &len, 2000), MEP_ERR_PROTOCOL,
              "1 TiB value", "bad reply");
  expect_fail(s->set(s->ctx, "a", "1", 1), MEP_ERR_PROTOCOL, "unknown code",
              "unknown code");
  expect_fail(s->get(s->ctx, "a", &v, &len, 2000), MEP_ERR_PEER_FAILED,
              "short value", "closed the connection");
  expect_fail(s->check(s->ctx, "a", &e), MEP_ERR_PROTOCOL, "check of 2",
              "not 0 or 1");
  EXPECT_OK(s->set(s->ctx, "a", "1", 1));
  int64_t t0 = now_ms();
  expect_fail(s->get(s->ctx, "a", &v, &len, 200), MEP_ERR_TIMEOUT,
              "silent server", "timed out");
  EXPECT(now_ms() - t0 < 400, "silent server: %" PRId64 " ms",
         now_ms() - t0);
  mep_store_destroy(s);
  pthread_join(t, NULL);
  close(f.lfd);
}

/* ---------------------------------------------------- case: large */

static void case_large(void) {
  int port;
  mep_store_server_t *srv = server("127.0.0.1", &port);
  mep_store_t *a = client("127.0.0.1", port, 30000);
  mep_store_t *b = client("127.0.0.1", port, 30000);
  size_t n = (size_t)64 << 20;
  uint8_t *val = malloc(n);
  gen(val, n, 4242);
  int64_t t0 = now_ms();
  EXPECT_OK(a->set(a->ctx, "big", val, n));
  expect_value(b, "big", val, n, 30000);
  printf("64 MiB set and get in %" PRId64 " ms\n", now_ms() - t0);
  /* Replaced while nothing else changes: the new bytes, all of them. */
  val[n / 2] ^= 0xff;
  val[n - 1] ^= 0x01;
  EXPECT_OK(b->set(b->ctx, "big", val, n - 1));
  expect_value(a, "big", val, n - 1, 30000);
  free(val);
  mep_store_destroy(a);
  mep_store_destroy(b);
  mep_store_server_stop(srv);
}

/* ------------------------------------------------------ case: add */

static void case_add(void) {
  int port;
  mep_store_server_t *srv = server("127.0.0.1", &port);
  mep_store_t *s = client("127.0.0.1", port, 5000);
  int64_t r = 0;
  EXPECT_OK(s->add(s->ctx, "n", -3, &r));
  EXPECT(r == -3, "add to an absent key gave %" PRId64, r);
  expect_str(s, "n", "-3");
  EXPECT_OK(s->set(s->ctx, "n", "40", 2));
  EXPECT_OK(s->add(s->ctx, "n", 2, &r));
  EXPECT(r == 42, "add to a set decimal gave %" PRId64, r);
  EXPECT_OK(s->set(s->ctx, "word", "hello", 5));
  EXPECT(s->add(s->ctx, "word", 1, &r) == MEP_ERR_INVALID,
         "add to a non-integer accepted");
  EXPECT(strstr(mep_last_error(), "not a decimal integer") &&
             strstr(mep_last_error(), "word"),
         "message: %s", mep_last_error());
  expect_str(s, "word", "hello");
  EXPECT_OK(s->set(s->ctx, "max", "9223372036854775807", 19));
  EXPECT(s->add(s->ctx, "max", 1, &r) == MEP_ERR_INVALID, "overflow");
  EXPECT_OK(s->add(s->ctx, "max", -1, &r));
  EXPECT(r == INT64_MAX - 1, "add -1 to max");
  EXPECT_OK(s->set(s->ctx, "empty", "", 0));
  EXPECT(s->add(s->ctx, "empty", 1, &r) == MEP_ERR_INVALID,
         "add to an empty value accepted");
  /* A get waiting on a counter is woken by an add. */
  mep_store_t *t = client("127.0.0.1", port, 5000);
  waiter_t w = {.s = t, .key = "fresh", .timeout_ms = 5000};
  pthread_t th;
  pthread_create(&th, NULL, waiter_main, &w);
  sleep_ms(100);
  EXPECT_OK(s->add(s->ctx, "fresh", 7, &r));
  pthread_join(th, NULL);
  EXPECT(w.rc == MEP_OK && !strcmp(w.value, "7"), "parked get of a counter:"
         " %s '%s'", mep_strerror(w.rc), w.value);
  int e = 0;
  EXPECT(s->check(s->ctx, "fresh", &e) == MEP_OK && e == 1, "check");
  mep_store_destroy(t);
  mep_store_destroy(s);
  mep_store_server_stop(srv);
}

/* ---------------------------------------------------- case: cancel */

typedef struct canceller {
  waiter_t w;
  atomic_int flag;
  int again_rc;
  int64_t again_ms;
} canceller_t;

/* A get that would wait 5 s, under a cancel flag (store.h); then one more
 * request of the same thread after the flag was set. */
static void *cancelled_main(void *arg) {
  canceller_t *c = arg;
  mep__store_cancel_on(&c->flag);
  waiter_main(&c->w);
  int64_t t0 = now_ms(), r;
  c->again_rc = c->w.s->add(c->w.s->ctx, "n", 1, &r);
  c->again_ms = now_ms() - t0;
  mep__store_cancel_on(NULL);
  return NULL;
}

/* What mep_comm_destroy does to a fault-tolerance claim that waits for a
 * store that stopped answering: the flag ends the wait within
 * MEP__STORE_CANCEL_MS, and the store still serves other threads. */
static void case_cancel(void) {
  int port;
  mep_store_server_t *srv = server("127.0.0.1", &port);
  mep_store_t *s = client("127.0.0.1", port, 30000);
  canceller_t c = {.w = {.s = s, .key = "never", .timeout_ms = 5000}};
  pthread_t t;
  pthread_create(&t, NULL, cancelled_main, &c);
  sleep_ms(300);
  int64_t t0 = now_ms();
  atomic_store(&c.flag, 1);
  pthread_join(t, NULL);
  EXPECT(c.w.rc == MEP_ERR_CLOSED, "cancelled get: %s: %s",
         mep_strerror(c.w.rc), c.w.msg);
  EXPECT(strstr(c.w.msg, "cancelled") && strstr(c.w.msg, "never"),
         "message: %s", c.w.msg);
  EXPECT(c.w.done_ms - t0 < 10 * MEP__STORE_CANCEL_MS,
         "the get ended %" PRId64 " ms after the flag", c.w.done_ms - t0);
  EXPECT(c.again_rc == MEP_ERR_CLOSED && c.again_ms < MEP__STORE_CANCEL_MS,
         "a request after the flag: %s in %" PRId64 " ms",
         mep_strerror(c.again_rc), c.again_ms);
  /* The flag belongs to that thread: this one's requests go on, and the
   * add above never reached the server. */
  int e = 1;
  EXPECT_OK(s->check(s->ctx, "n", &e));
  EXPECT(e == 0, "the cancelled add was carried out");
  EXPECT_OK(s->set(s->ctx, "never", "late", 4));
  expect_str(s, "never", "late");
  mep_store_destroy(s);
  mep_store_server_stop(srv);
}

/* ------------------------------------------------------------- main */

static const struct {
  const char *name;
  void (*run)(void);
} cases[] = {
    {"multi", case_multi},     {"timeout", case_timeout},
    {"threads", case_threads}, {"stop", case_stop},
    {"killed", case_killed},   {"killed_forked", case_killed_forked},
    {"refused", case_refused},
    {"names", case_names},     {"garbage", case_garbage},
    {"oversize", case_oversize}, {"large", case_large},
    {"add", case_add},         {"badserver", case_badserver},
    {"cancel", case_cancel},
};

int main(int argc, char **argv) {
  const char *env = getenv("MEP_TEST_SEED");
  seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
  printf("seed %" PRIu64 "\n", seed);
  if (argc != 2) {
    fprintf(stderr, "usage: %s CASE\n", argv[0]);
    return 2;
  }
  if (!strcmp(argv[1], "garbage")) {
    /* Before the first log line: the logger opens its file once. */
    snprintf(log_path, sizeof log_path, "/tmp/mep-store-log-XXXXXX");
    int fd = mkstemp(log_path);
    EXPECT(fd >= 0, "mkstemp");
    close(fd);
    setenv("MEP_LOG_FILE", log_path, 1);
  }
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    if (!strcmp(argv[1], cases[i].name)) {
      cases[i].run();
      if (log_path[0]) unlink(log_path);
      printf("ok\n");
      return 0;
    }
  }
  fprintf(stderr, "unknown case %s\n", argv[1]);
  return 2;
}
