/*
 * handshake.c - the bootstrap's sockets (handshake.h): the listener, the
 * dialler, the acceptor with its stash of early hellos, and the liveness
 * channel that stays open after set-up.
 *
 * Nothing blocks without a deadline: every socket is non-blocking and
 * every wait is a poll() of at most a few milliseconds, never past the
 * caller's deadline. The listener is not watched outside connect(): a
 * dial that comes while this side is not accepting waits in the kernel's
 * backlog (or, once read, in the stash) until connect() for that rank.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bind_source.h"
#include "handshake.h"
#include "fork_watch.h"

#define HS_WAIT_MS 5         /* one wait step */
#define HS_MAX_PENDING 256   /* accepted connections not answered yet */
#define HS_BACKOFF_MS 5      /* first backoff after a refusal */
#define HS_BACKOFF_MAX_MS 100

/* An accepted connection: its hello being read, or read and waiting for
 * connect() of its rank (stashed). */
typedef struct mep__rdma_pending {
  struct mep__rdma_pending *next;
  int fd;
  struct sockaddr_in from;
  int64_t deadline; /* for the hello to be complete */
  int stashed;      /* the hello is complete and good */
  size_t have;
  mep__rdma_hello_t hello; /* once stashed; secret points into buf */
  uint8_t buf[MEP_RDMA_MAX_MSG];
} pend_t;

#define HS_ERR(b, code, ...) ((b)->env->set_error(__VA_ARGS__), (code))
#define HS_LOG(b, lvl, ...) ((b)->env->log((lvl), __VA_ARGS__))

int64_t mep__rdma_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void mep__rdma_fmt_addr(const uint8_t ip[4], uint16_t port, char *buf,
                        size_t len) {
  snprintf(buf, len, "%u.%u.%u.%u:%u", ip[0], ip[1], ip[2], ip[3],
           (unsigned)port);
}

static void fmt_sin(const struct sockaddr_in *a, char *buf, size_t len) {
  uint8_t ip[4];
  memcpy(ip, &a->sin_addr, 4);
  mep__rdma_fmt_addr(ip, ntohs(a->sin_port), buf, len);
}

/* Keepalive probes after one idle second and a user timeout, so a peer
 * whose host vanished (no FIN, no RST) is noticed in seconds even when
 * no RDMA traffic would notice it; no Nagle for the small messages. */
static void sockopts(const mep__rdma_boot_t *b, int fd) {
  int on = 1, idle = 1, intvl = 1, cnt = 3;
  unsigned user_ms = b->timeout_ms > 1000 ? (unsigned)b->timeout_ms : 1000;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}

/* ----------------------------------------------------------- listener */

/* The configured interface's IPv4 address; without one, `prefer`, else
 * the first interface up that is not loopback, else 127.0.0.1. */
static int pick_ip(mep__rdma_boot_t *b, const mep__rdma_boot_opts_t *o,
                   struct in_addr *out) {
  const char *want = o->ifname && o->ifname[0] ? o->ifname : NULL;
  if (!want && o->prefer) {
    *out = *o->prefer;
    return 0;
  }
  struct ifaddrs *all = NULL;
  if (getifaddrs(&all))
    return HS_ERR(b, MEP_ERR_SYSTEM, "%s: listing network interfaces "
                  "failed: %s", b->name, strerror(errno));
  int found = 0;
  for (struct ifaddrs *i = all; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (want ? strcmp(i->ifa_name, want) != 0
             : !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    *out = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr;
    found = 1;
  }
  freeifaddrs(all);
  if (found) return 0;
  if (!want) {
    out->s_addr = htonl(INADDR_LOOPBACK);
    return 0;
  }
  return HS_ERR(b, MEP_ERR_CONFIG, "%s: bootstrap_ifname = %s: %s", b->name,
                want, if_nametoindex(want) ? "the interface has no IPv4 "
                "address" : "no such network interface");
}

static int bind_in_range(int fd, struct sockaddr_in *a, int lo, int hi) {
  if (!lo) {
    a->sin_port = 0;
    return bind(fd, (struct sockaddr *)a, sizeof *a);
  }
  for (int port = lo; port <= hi; port++) {
    a->sin_port = htons((uint16_t)port);
    if (!bind(fd, (struct sockaddr *)a, sizeof *a)) return 0;
    if (errno != EADDRINUSE) return -1;
  }
  errno = EADDRINUSE;
  return -1;
}

int mep__rdma_boot_open(mep__rdma_boot_t *b, const mep__rdma_boot_opts_t *o) {
  b->lfd = -1;
  b->pend = NULL;
  b->setups = NULL;
  b->npend = 0;
  pthread_mutex_init(&b->mu, NULL);
  b->live = 1;
  struct sockaddr_in a = {.sin_family = AF_INET};
  int rc = pick_ip(b, o, &a.sin_addr);
  if (rc) return rc;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return HS_ERR(b, MEP_ERR_SYSTEM, "%s: socket() failed: %s", b->name,
                  strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t alen = sizeof a;
  if (bind_in_range(fd, &a, o->port_lo, o->port_hi) ||
      listen(fd, SOMAXCONN) || getsockname(fd, (struct sockaddr *)&a, &alen)) {
    int e = errno;
    char where[64];
    a.sin_port = 0;
    fmt_sin(&a, where, sizeof where);
    close(fd);
    if (o->port_lo)
      return HS_ERR(b, MEP_ERR_SYSTEM, "%s: no port of port_range %d-%d is "
                    "free to listen on at %s: %s", b->name, o->port_lo,
                    o->port_hi, where, strerror(e));
    return HS_ERR(b, MEP_ERR_SYSTEM, "%s: listening on %s failed: %s",
                  b->name, where, strerror(e));
  }
  b->lfd = fd;
  b->addr = a;
  return 0;
}

/* A connection being set up (mep__rdma_boot_t.setups). */
typedef struct mep__rdma_setup {
  int *fd;
  struct mep__rdma_setup *next;
} setup_t;

static void pend_free(pend_t *p) {
  if (p->fd >= 0) close(p->fd);
  free(p);
}

void mep__rdma_boot_close(mep__rdma_boot_t *b) {
  if (!b->live) return;
  while (b->pend) {
    pend_t *p = b->pend;
    b->pend = p->next;
    pend_free(p);
  }
  b->npend = 0;
  while (b->setups) { /* a connect() that never ended: the caller's bug */
    setup_t *s = b->setups;
    b->setups = s->next;
    free(s);
  }
  if (b->lfd >= 0) close(b->lfd);
  b->lfd = -1;
  pthread_mutex_destroy(&b->mu);
  b->live = 0;
}

void mep__rdma_boot_let_go(mep__rdma_boot_t *b, int dead) {
  if (!b->live) return;
  mep__fork_let_go(b->lfd, dead);
  for (const pend_t *p = b->pend; p; p = p->next)
    mep__fork_let_go(p->fd, dead);
  for (const setup_t *s = b->setups; s; s = s->next)
    mep__fork_let_go(*s->fd, dead);
}

/* Closes the socket of a set-up, under b->mu (see mep__rdma_boot_let_go). */
static void setup_close(mep__rdma_boot_t *b, int *fd) {
  pthread_mutex_lock(&b->mu);
  if (*fd >= 0) close(*fd);
  *fd = -1;
  pthread_mutex_unlock(&b->mu);
}

void mep__rdma_boot_self(const mep__rdma_boot_t *b, mep__rdma_boot_addr_t *a) {
  memcpy(a->ip, &b->addr.sin_addr, 4);
  a->port = ntohs(b->addr.sin_port);
  a->incarnation = b->inc;
}

/* ---------------------------------------------------- moving bytes */

/* Sends all of buf by the deadline: 0, or a negative code (the error is
 * not set: the caller words it). */
static int send_all(int fd, const uint8_t *buf, size_t len, int64_t deadline) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = send(fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return MEP_ERR_PEER_FAILED;
    int64_t left = deadline - mep__rdma_now_ms();
    if (left <= 0) return MEP_ERR_TIMEOUT;
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    poll(&pf, 1, left < HS_WAIT_MS ? (int)left : HS_WAIT_MS);
  }
  return 0;
}

/* Reads until `check` says the message in buf is complete (0) or bad
 * (negative); check returns the total it needs while incomplete. */
typedef int (*check_fn)(const uint8_t *buf, size_t len, void *arg);

static int recv_msg(int fd, uint8_t *buf, size_t cap, size_t *have,
                    check_fn check, void *arg, int64_t deadline) {
  for (;;) {
    int need = check(buf, *have, arg);
    if (need <= 0) return need;
    if ((size_t)need > cap) return MEP_ERR_PROTOCOL;
    ssize_t n = recv(fd, buf + *have, (size_t)need - *have, MSG_DONTWAIT);
    if (n > 0) {
      *have += (size_t)n;
      continue;
    }
    if (n == 0) return MEP_ERR_CLOSED;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return MEP_ERR_PEER_FAILED;
    int64_t left = deadline - mep__rdma_now_ms();
    if (left <= 0) return MEP_ERR_TIMEOUT;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    poll(&pf, 1, left < HS_WAIT_MS ? (int)left : HS_WAIT_MS);
  }
}

/* ---------------------------------------------------------- dialler */

typedef struct dial {
  mep__rdma_boot_t *b;
  int *fd; /* the caller's: the socket being dialled, or -1 */
  int peer;
  const mep__rdma_boot_addr_t *to;
  char where[64];
  int64_t deadline;
  int refusals, last_refusal;
  /* the answer being read */
  uint8_t ans[MEP_RDMA_HDR_LEN + MEP_RDMA_QPINFO_LEN];
  int nak;
  mep__rdma_qpinfo_t theirs;
  char why[160];
} dial_t;

static int transient(int e) {
  return e == ECONNREFUSED || e == ECONNRESET || e == ETIMEDOUT ||
         e == EHOSTUNREACH || e == ENETUNREACH || e == EAGAIN;
}

/* One TCP connect attempt: the connected fd (in *d->fd), or -1 with
 * errno. */
static int try_connect(dial_t *d) {
  pthread_mutex_lock(&d->b->mu);
  int fd = *d->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                           0);
  pthread_mutex_unlock(&d->b->mu);
  if (fd < 0) return -1;
  struct sockaddr_in to = {.sin_family = AF_INET,
                           .sin_port = htons(d->to->port)};
  memcpy(&to.sin_addr, d->to->ip, 4);
  if (mep__bind_source(fd, &d->b->addr) ||
      (connect(fd, (struct sockaddr *)&to, sizeof to) &&
       errno != EINPROGRESS)) {
    int e = errno;
    setup_close(d->b, d->fd);
    errno = e;
    return -1;
  }
  int err = ETIMEDOUT;
  for (;;) {
    int64_t left = d->deadline - mep__rdma_now_ms();
    if (left <= 0) break;
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    if (poll(&pf, 1, left < HS_WAIT_MS ? (int)left : HS_WAIT_MS) > 0) {
      socklen_t elen = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
      break;
    }
  }
  if (err) {
    setup_close(d->b, d->fd);
    errno = err;
    return -1;
  }
  sockopts(d->b, fd);
  return fd;
}

static void pause_until(int64_t until) {
  int64_t left;
  while ((left = until - mep__rdma_now_ms()) > 0) {
    struct timespec ts = {0, (long)(left > 5 ? 5 : left) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* A connected socket to the acceptor, retrying while it is refused (it
 * may not listen yet only in theory: the blob is published after listen;
 * a full backlog or a lost SYN are the real cases). */
static int dial_socket(dial_t *d) {
  mep__rdma_boot_t *b = d->b;
  int64_t backoff = 10;
  for (int tries = 1;; tries++) {
    if (try_connect(d) >= 0) return 0;
    int e = errno;
    int64_t now = mep__rdma_now_ms();
    if (now >= d->deadline)
      return HS_ERR(b, MEP_ERR_TIMEOUT, "%s: rank %d: connect to rank %d at "
                    "%s: no TCP connection within %d ms (%d tries, last: %s)",
                    b->name, b->env->rank, d->peer, d->where, b->timeout_ms,
                    tries, strerror(e));
    if (!transient(e))
      return HS_ERR(b, MEP_ERR_UNREACHABLE, "%s: rank %d: connect to rank "
                    "%d at %s: %s", b->name, b->env->rank, d->peer, d->where,
                    strerror(e));
    pause_until(now + backoff < d->deadline ? now + backoff : d->deadline);
    backoff = backoff * 2 > 500 ? 500 : backoff * 2;
  }
}

static int answer_need(const uint8_t *buf, size_t len, void *arg) {
  dial_t *d = arg;
  return mep__rdma_answer_check(buf, len, (uint32_t)d->peer,
                                (uint32_t)d->b->env->rank, &d->nak,
                                &d->theirs, d->why, sizeof d->why);
}

/* Words a failed step of the dialler. */
static int dial_fail(dial_t *d, int rc, const char *step) {
  mep__rdma_boot_t *b = d->b;
  const char *what = rc == MEP_ERR_TIMEOUT ? "no progress before the deadline"
                     : rc == MEP_ERR_CLOSED
                         ? "the peer closed the connection (it refused this "
                           "process: a wrong secret, rank or address, or it "
                           "failed; its log says which)"
                     : rc == MEP_ERR_PROTOCOL ? d->why
                                              : "the connection broke";
  if (rc == MEP_ERR_CLOSED) rc = MEP_ERR_AUTH;
  return HS_ERR(b, rc, "%s: rank %d: connect to rank %d at %s: %s: %s",
                b->name, b->env->rank, d->peer, d->where, step, what);
}

/* One attempt: 0 (up, *d->fd set), 1 (refused for now) or an error. */
static int dial_once(dial_t *d, const mep__rdma_qpinfo_t *mine,
                     mep__rdma_up_fn up, void *arg) {
  mep__rdma_boot_t *b = d->b;
  int rc = dial_socket(d);
  if (rc) return rc;
  int fd = *d->fd;
  uint8_t hello[MEP_RDMA_MAX_MSG];
  mep__rdma_hello_t h = {
      .from = (uint32_t)b->env->rank, .to = (uint32_t)d->peer,
      .from_inc = b->inc, .to_inc = d->to->incarnation,
      .secret_len = (uint32_t)b->env->secret_len, .secret = b->env->secret,
      .qp = *mine};
  size_t n = mep__rdma_hello_encode(hello, sizeof hello, &h);
  size_t have = 0;
  rc = send_all(fd, hello, n, d->deadline);
  if (rc) rc = dial_fail(d, rc, "sending the hello");
  if (!rc && (rc = recv_msg(fd, d->ans, sizeof d->ans, &have, answer_need, d,
                            d->deadline)))
    rc = dial_fail(d, rc, "waiting for its answer");
  if (!rc && d->nak) {
    setup_close(b, d->fd);
    d->refusals++;
    d->last_refusal = d->nak;
    if (d->nak == MEP_RDMA_NAK_STALE)
      return HS_ERR(b, MEP_ERR_PEER_FAILED, "%s: rank %d: connect to rank %d "
                    "at %s: it %s", b->name, b->env->rank, d->peer, d->where,
                    mep__rdma_nak_text(d->nak));
    return 1;
  }
  if (!rc) rc = up(arg, &d->theirs);
  uint8_t ready[MEP_RDMA_HDR_LEN];
  mep__rdma_hdr_encode(ready, MEP_RDMA_MSG_READY, (uint32_t)b->env->rank,
                       (uint32_t)d->peer);
  if (!rc && (rc = send_all(fd, ready, sizeof ready, d->deadline)))
    rc = dial_fail(d, rc, "sending ready");
  if (rc) setup_close(b, d->fd);
  return rc;
}

static int dial(mep__rdma_boot_t *b, int peer, const mep__rdma_boot_addr_t *to,
                const mep__rdma_qpinfo_t *mine, mep__rdma_up_fn up, void *arg,
                int64_t deadline, int *fd) {
  dial_t d = {.b = b, .fd = fd, .peer = peer, .to = to,
             .deadline = deadline};
  mep__rdma_fmt_addr(to->ip, to->port, d.where, sizeof d.where);
  int64_t backoff = HS_BACKOFF_MS;
  for (;;) {
    int rc = dial_once(&d, mine, up, arg);
    if (rc <= 0) return rc;
    int64_t until = mep__rdma_now_ms() + backoff;
    if (until >= deadline)
      return HS_ERR(b, MEP_ERR_TIMEOUT, "%s: rank %d: connect to rank %d at "
                    "%s: it refused this process %d times within %d ms: it "
                    "%s", b->name, b->env->rank, peer, d.where, d.refusals,
                    b->timeout_ms, mep__rdma_nak_text(d.last_refusal));
    pause_until(until);
    backoff = backoff * 2 > HS_BACKOFF_MAX_MS ? HS_BACKOFF_MAX_MS
                                              : backoff * 2;
  }
}

/* --------------------------------------------------------- acceptor */

static void pend_drop(mep__rdma_boot_t *b, pend_t *p, const char *why) {
  char from[64];
  fmt_sin(&p->from, from, sizeof from);
  HS_LOG(b, MEP_LOG_WARN, "%s: rank %d dropped a bootstrap connection from "
         "%s: %s", b->name, b->env->rank, from, why);
  close(p->fd);
  p->fd = -1;
}

/* b->mu held: takes every connection waiting in the backlog. */
static void accept_new(mep__rdma_boot_t *b) {
  for (;;) {
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    int fd = accept4(b->lfd, (struct sockaddr *)&from, &flen,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        HS_LOG(b, MEP_LOG_WARN, "%s: rank %d: accept failed: %s", b->name,
               b->env->rank, strerror(errno));
      return;
    }
    pend_t *p = b->npend < HS_MAX_PENDING ? calloc(1, sizeof *p) : NULL;
    if (!p) {
      pend_t tmp = {.fd = fd, .from = from};
      pend_drop(b, &tmp, "too many bootstrap connections pending");
      continue;
    }
    sockopts(b, fd);
    p->fd = fd;
    p->from = from;
    p->deadline = mep__rdma_now_ms() + b->timeout_ms;
    p->next = b->pend;
    b->pend = p;
    b->npend++;
  }
}

/* b->mu held: reads what p's hello has so far. 1 when p is finished with
 * (dropped: its fd is -1), 0 otherwise (still reading, or stashed). */
static int pend_step(mep__rdma_boot_t *b, pend_t *p, int64_t now) {
  const mep_tp_env_t *env = b->env;
  mep__rdma_hello_expect_t exp = {
      .rank = (uint32_t)env->rank, .size = (uint32_t)env->size,
      .incarnation = b->inc, .secret = env->secret,
      .secret_len = (uint32_t)env->secret_len};
  char why[200];
  while (!p->stashed) {
    int rc = mep__rdma_hello_check(p->buf, p->have, &exp, &p->hello, why,
                                   sizeof why);
    if (rc == MEP_ERR_UNREACHABLE) { /* an old address of ours: say so */
      uint8_t nak[MEP_RDMA_HDR_LEN + MEP_RDMA_NAK_LEN];
      size_t n = mep__rdma_nak_encode(nak, sizeof nak, (uint32_t)env->rank,
                                      p->hello.from, MEP_RDMA_NAK_STALE);
      send(p->fd, nak, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      return pend_drop(b, p, why), 1;
    }
    if (rc < 0) return pend_drop(b, p, why), 1;
    if (rc == 0) {
      p->stashed = 1;
      return 0;
    }
    ssize_t n = recv(p->fd, p->buf + p->have, (size_t)rc - p->have,
                     MSG_DONTWAIT);
    if (n > 0) {
      p->have += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (now < p->deadline) return 0;
      snprintf(why, sizeof why, "no complete hello within %d ms (%zu of "
               "%d bytes)", b->timeout_ms, p->have, rc);
    } else if (n == 0) {
      snprintf(why, sizeof why, "closed after %zu bytes of its hello",
               p->have);
    } else {
      snprintf(why, sizeof why, "reading its hello failed: %s",
               strerror(errno));
    }
    return pend_drop(b, p, why), 1;
  }
  return 0;
}

/* Whether a stashed connection's dialler is still there (it may have
 * given up and closed, then dialled again). */
static int alive(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

/* b->mu held: one pass over the backlog and the pending connections.
 * Returns the stashed hello of `peer` at incarnation `inc` (taken off the
 * list), or NULL; refuses that rank's hellos of other incarnations. */
static pend_t *pump(mep__rdma_boot_t *b, int peer, uint64_t inc) {
  accept_new(b);
  int64_t now = mep__rdma_now_ms();
  pend_t *found = NULL;
  for (pend_t **pp = &b->pend; *pp;) {
    pend_t *p = *pp;
    int done = pend_step(b, p, now);
    if (!done && p->stashed && (int)p->hello.from == peer) {
      if (p->hello.from_inc != inc) {
        uint8_t nak[MEP_RDMA_HDR_LEN + MEP_RDMA_NAK_LEN];
        size_t n = mep__rdma_nak_encode(nak, sizeof nak,
                                        (uint32_t)b->env->rank,
                                        (uint32_t)peer, MEP_RDMA_NAK_OTHER);
        send(p->fd, nak, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        HS_LOG(b, MEP_LOG_DEBUG, "%s: rank %d refused rank %d's incarnation "
               "%#llx for now: it waits for %#llx", b->name, b->env->rank,
               peer, (unsigned long long)p->hello.from_inc,
               (unsigned long long)inc);
        close(p->fd);
        p->fd = -1;
        done = 1;
      } else if (!alive(p->fd)) {
        close(p->fd);
        p->fd = -1;
        done = 1;
      } else if (!found) {
        *pp = p->next;
        b->npend--;
        found = p;
        continue;
      }
    }
    if (done) {
      *pp = p->next;
      b->npend--;
      pend_free(p);
    } else {
      pp = &p->next;
    }
  }
  return found;
}

/* Waits a step for the listener or a pending connection to have bytes. */
static void wait_step(mep__rdma_boot_t *b, int64_t deadline) {
  struct pollfd pf[1 + 16];
  int n = 0;
  pf[n++] = (struct pollfd){.fd = b->lfd, .events = POLLIN};
  pthread_mutex_lock(&b->mu);
  for (pend_t *p = b->pend; p && n < 17; p = p->next)
    if (!p->stashed) pf[n++] = (struct pollfd){.fd = p->fd, .events = POLLIN};
  pthread_mutex_unlock(&b->mu);
  int64_t left = deadline - mep__rdma_now_ms();
  if (left > 0) poll(pf, (nfds_t)n, left < HS_WAIT_MS ? (int)left : HS_WAIT_MS);
}

static int ready_need(const uint8_t *buf, size_t len, void *arg) {
  const uint32_t *ft = arg;
  if (len < MEP_RDMA_HDR_LEN) return MEP_RDMA_HDR_LEN;
  mep__rdma_hdr_t h;
  if (mep__rdma_hdr_decode(buf, len, &h, NULL, 0) ||
      h.type != MEP_RDMA_MSG_READY || h.from != ft[0] || h.to != ft[1])
    return MEP_ERR_PROTOCOL;
  return 0;
}

static int accept_peer(mep__rdma_boot_t *b, int peer,
                       const mep__rdma_boot_addr_t *to,
                       const mep__rdma_qpinfo_t *mine, mep__rdma_up_fn up,
                       void *arg, int64_t deadline, int *fd) {
  pend_t *p = NULL;
  while (!p) {
    pthread_mutex_lock(&b->mu);
    p = pump(b, peer, to->incarnation);
    if (p) *fd = p->fd; /* off b->pend: the set-up covers it now */
    pthread_mutex_unlock(&b->mu);
    if (p) break;
    if (mep__rdma_now_ms() >= deadline) {
      char where[64];
      mep__rdma_fmt_addr(to->ip, to->port, where, sizeof where);
      return HS_ERR(b, MEP_ERR_TIMEOUT, "%s: rank %d waited %d ms for rank "
                    "%d (listening at %s) to connect; did it call connect?",
                    b->name, b->env->rank, b->timeout_ms, peer, where);
    }
    wait_step(b, deadline);
  }
  char from[64];
  fmt_sin(&p->from, from, sizeof from);
  int rc = up(arg, &p->hello.qp);
  uint8_t msg[MEP_RDMA_HDR_LEN + MEP_RDMA_QPINFO_LEN];
  size_t n = mep__rdma_accept_encode(msg, sizeof msg, (uint32_t)b->env->rank,
                                     (uint32_t)peer, mine);
  if (!rc && (rc = send_all(p->fd, msg, n, deadline)))
    rc = HS_ERR(b, rc, "%s: rank %d: accepting rank %d from %s: sending "
                "the answer %s", b->name, b->env->rank, peer, from,
                rc == MEP_ERR_TIMEOUT ? "did not finish before the deadline"
                                      : "failed: the connection broke");
  uint32_t ft[2] = {(uint32_t)peer, (uint32_t)b->env->rank};
  size_t have = 0;
  if (!rc && (rc = recv_msg(p->fd, msg, sizeof msg, &have, ready_need, ft,
                            deadline)))
    rc = HS_ERR(b, rc == MEP_ERR_CLOSED ? MEP_ERR_PEER_FAILED : rc,
                "%s: rank %d: accepting rank %d from %s: waiting for it to "
                "be ready: %s", b->name, b->env->rank, peer, from,
                rc == MEP_ERR_PROTOCOL ? "garbage instead"
                : rc == MEP_ERR_TIMEOUT ? "no answer before the deadline"
                                        : "it went away");
  p->fd = -1;
  pend_free(p);
  if (rc) setup_close(b, fd);
  return rc;
}

int mep__rdma_boot_connect(mep__rdma_boot_t *b, int peer,
                           const mep__rdma_boot_addr_t *to,
                           const mep__rdma_qpinfo_t *mine, mep__rdma_up_fn up,
                           void *arg, int64_t deadline, int *fd) {
  setup_t *s = malloc(sizeof *s);
  if (!s)
    return HS_ERR(b, MEP_ERR_NOMEM, "%s: rank %d: connect to rank %d: out "
                  "of memory", b->name, b->env->rank, peer);
  pthread_mutex_lock(&b->mu);
  *fd = -1;
  *s = (setup_t){.fd = fd, .next = b->setups};
  b->setups = s;
  pthread_mutex_unlock(&b->mu);
  int rc = b->env->rank < peer
               ? dial(b, peer, to, mine, up, arg, deadline, fd)
               : accept_peer(b, peer, to, mine, up, arg, deadline, fd);
  if (rc) mep__rdma_boot_adopted(b, fd);
  return rc;
}

void mep__rdma_boot_adopted(mep__rdma_boot_t *b, int *fd) {
  pthread_mutex_lock(&b->mu);
  for (setup_t **pp = &b->setups; *pp; pp = &(*pp)->next)
    if ((*pp)->fd == fd) {
      setup_t *s = *pp;
      *pp = s->next;
      free(s);
      break;
    }
  pthread_mutex_unlock(&b->mu);
}

/* ------------------------------------------------ the liveness channel */

int mep__rdma_link_read(int fd, mep__rdma_link_rx_t *rx, uint32_t from,
                        uint32_t to) {
  for (;;) {
    if (rx->have == MEP_RDMA_HDR_LEN) {
      mep__rdma_hdr_t h;
      if (mep__rdma_hdr_decode(rx->buf, rx->have, &h, NULL, 0) ||
          h.type != MEP_RDMA_MSG_BYE || h.from != from || h.to != to)
        return MEP_RDMA_LINK_BAD;
      rx->bye = 1;
      rx->have = 0;
    }
    ssize_t n = recv(fd, rx->buf + rx->have, MEP_RDMA_HDR_LEN - rx->have,
                     MSG_DONTWAIT);
    if (n > 0) {
      if (rx->bye) return MEP_RDMA_LINK_BAD; /* nothing follows a BYE */
      rx->have += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return rx->bye ? MEP_RDMA_LINK_BYE : MEP_RDMA_LINK_QUIET;
    if (rx->bye && rx->have == 0) return MEP_RDMA_LINK_BYE;
    return n == 0 ? MEP_RDMA_LINK_EOF : MEP_RDMA_LINK_BAD;
  }
}

int mep__rdma_link_bye(int fd, uint32_t from, uint32_t to, int wait_ms) {
  uint8_t hdr[MEP_RDMA_HDR_LEN];
  mep__rdma_hdr_encode(hdr, MEP_RDMA_MSG_BYE, from, to);
  int64_t deadline = mep__rdma_now_ms() + wait_ms;
  if (send_all(fd, hdr, sizeof hdr, deadline)) return -1;
  /* A socket closed with unread data is reset, and a reset throws away
   * what the kernel had not sent yet: wait until the peer acknowledged. */
  for (;;) {
    int unacked = 0;
    if (ioctl(fd, SIOCOUTQ, &unacked) || unacked == 0) return 0;
    struct pollfd pf = {.fd = fd, .events = 0};
    if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLERR | POLLHUP))) return -1;
    if (mep__rdma_now_ms() >= deadline) return -1;
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, NULL);
  }
}
