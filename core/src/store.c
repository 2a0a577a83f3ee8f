/* store.c - the built-in TCP store's client (mep_store_tcp_connect) and
 * mep_store_destroy.
 *
 * A request owns one connection from its first byte sent to its last byte
 * received. Connections sit in an idle pool: a thread takes one (or dials a
 * new one), and gives it back only after a complete, well-formed reply. A
 * request that times out or breaks closes its connection instead, so a
 * late reply can never be read as the answer to a later request; the seq
 * number echoed by the server checks that once more. Because threads do not
 * share a connection, a get blocked in one thread does not hold up a set
 * in another (which the get may be waiting for). */
#include "error.h"
#include "log.h"
#include "store.h"
#include "store_proto.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* The deadline of set, add and check when connect got no timeout. */
#define DEFAULT_TIMEOUT_MS 30000
#define BACKOFF_FIRST_MS 10
#define BACKOFF_MAX_MS 500
#define NO_DEADLINE INT64_MAX

typedef struct conn {
  int fd;
  uint32_t seq;
  struct conn *next;
} conn_t;

typedef struct tcp_store {
  mep_store_t pub;
  pthread_mutex_t lock; /* guards idle */
  conn_t *idle;
  char *host;
  char port[8];
  char where[300]; /* "host:port", for messages */
  int timeout_ms;  /* connect retries; deadline of set, add and check */
  /* A connection was made once: a refusal after it means the server is
   * gone, not that it is still starting, and is not retried. */
  atomic_int reached;
} tcp_store_t;

/* One request in flight, for its deadline and its messages. */
typedef struct op {
  tcp_store_t *st;
  const char *name; /* "set", "get", "add", "check" */
  const char *key;
  size_t key_len;
  int64_t deadline; /* NO_DEADLINE: wait forever */
  int budget_ms;
  const atomic_int *cancel; /* the calling thread's (store.h), or NULL */
} op_t;

static _Thread_local const atomic_int *thread_cancel;

void mep__store_cancel_on(const atomic_int *flag) { thread_cancel = flag; }

int mep_store_cancelled(void) {
  return thread_cancel ? atomic_load(thread_cancel) != 0 : -1;
}

static int cancelled(const atomic_int *cancel) {
  return cancel && atomic_load(cancel);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A wait's outcome. */
enum { WAIT_DEADLINE, WAIT_READY, WAIT_ERROR, WAIT_CANCELLED };

/* Sleeps `ms`, in slices that look at `cancel`: 1 if it was set. */
static int sleep_ms(int64_t ms, const atomic_int *cancel) {
  int64_t end = now_ms() + ms;
  for (int64_t left = ms; left > 0; left = end - now_ms()) {
    if (cancelled(cancel)) return 1;
    if (cancel && left > MEP__STORE_CANCEL_MS) left = MEP__STORE_CANCEL_MS;
    struct timespec ts = {.tv_sec = left / 1000,
                          .tv_nsec = (left % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  return cancelled(cancel);
}

/* Waits until `fd` is ready for `events` (WAIT_ERROR with errno set).
 * Looks at least once, so what is ready at the deadline still counts;
 * with a cancel flag, polls in slices and looks at it between them. */
static int wait_fd(int fd, short events, int64_t deadline,
                   const atomic_int *cancel) {
  for (;;) {
    if (cancelled(cancel)) return WAIT_CANCELLED;
    int timeout = -1;
    if (deadline != NO_DEADLINE) {
      int64_t left = deadline - now_ms();
      timeout = left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
    }
    if (cancel && (timeout < 0 || timeout > MEP__STORE_CANCEL_MS))
      timeout = MEP__STORE_CANCEL_MS;
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, timeout);
    if (n > 0) return WAIT_READY;
    if (n < 0 && errno != EINTR) return WAIT_ERROR;
    if (n == 0 && deadline != NO_DEADLINE && now_ms() >= deadline)
      return WAIT_DEADLINE;
  }
}

static void lower_strerror(int err, char *buf, size_t len) {
  snprintf(buf, len, "%s", strerror(err));
  buf[0] = (char)tolower((unsigned char)buf[0]);
}

/* ------------------------------------------------------------ dialing */

static int retryable(int err) {
  return err == ECONNREFUSED || err == ECONNRESET || err == ECONNABORTED ||
         err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH ||
         err == EAGAIN;
}

static void tune(int fd) {
  int one = 1, idle = 10, intvl = 5, cnt = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  /* A get may wait forever; keepalive notices a server host that vanished
   * without a reset. */
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

/* One non-blocking connect to one address; 0 or an errno value. */
static int connect_addr(const struct addrinfo *ai, int64_t deadline,
                        const atomic_int *cancel, int *fd_out) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK |
                                     SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) return errno;
  int err = 0;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      int w = wait_fd(fd, POLLOUT, deadline, cancel);
      socklen_t len = sizeof err;
      if (w == WAIT_DEADLINE) err = ETIMEDOUT;
      else if (w == WAIT_CANCELLED) err = ECANCELED;
      else if (w == WAIT_ERROR) err = errno;
      else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    }
  }
  if (err) {
    close(fd);
    return err;
  }
  tune(fd);
  *fd_out = fd;
  return 0;
}

static int dial_cancelled(const tcp_store_t *st) {
  return mep__err(MEP_ERR_CLOSED, "store: connect to %s: cancelled by its "
                  "caller", st->where);
}

/* One pass over the host's addresses. MEP_OK, or *retry set and `why`
 * filled for a failure worth retrying, or an error set for one that is
 * not. */
static int dial_once(tcp_store_t *st, int64_t deadline,
                     const atomic_int *cancel, int *fd, int *retry,
                     char *why, size_t why_len) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(st->host, st->port, &hints, &res);
  if (rc == EAI_AGAIN) {
    *retry = 1;
    snprintf(why, why_len, "cannot resolve the host yet: %s",
             gai_strerror(rc));
    return MEP_ERR_UNREACHABLE;
  }
  if (rc != 0)
    return mep__err(MEP_ERR_INVALID, "store: connect to %s: cannot resolve "
                    "'%s': %s", st->where, st->host, gai_strerror(rc));
  int err = 0, refused = 1;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    err = connect_addr(ai, deadline, cancel, fd);
    if (err == 0 || err == ECANCELED) break;
    if (retryable(err)) *retry = 1;
    refused &= err == ECONNREFUSED;
  }
  freeaddrinfo(res);
  if (err == 0) return MEP_OK;
  if (err == ECANCELED) return dial_cancelled(st);
  /* Not retried: a fault-tolerance claim still asking the store of a
   * group whose store host died would hold up mep_comm_destroy for the
   * whole connect timeout. */
  if (refused && atomic_load(&st->reached)) {
    *retry = 0;
    return mep__err(MEP_ERR_PEER_FAILED, "store: connect to %s: connection "
                    "refused by the server's host; the server, reached "
                    "before, is gone", st->where);
  }
  if (!*retry)
    return mep__err_errno(MEP_ERR_UNREACHABLE, err, "store: connect to %s",
                          st->where);
  /* A try cut short by the deadline says less than the ones before. */
  if (err != ETIMEDOUT || !why[0]) lower_strerror(err, why, why_len);
  return MEP_ERR_UNREACHABLE;
}

/* Connects, retrying refused (not yet listening) servers with backoff
 * until the deadline or the cancel flag (may be NULL). */
static int dial(tcp_store_t *st, int64_t deadline, const atomic_int *cancel,
                conn_t **out) {
  int64_t start = now_ms();
  int tries = 0;
  int64_t delay = BACKOFF_FIRST_MS;
  char why[160] = "";
  int fd = -1;
  for (;;) {
    int retry = 0;
    tries++;
    int rc = dial_once(st, deadline, cancel, &fd, &retry, why, sizeof why);
    if (rc == MEP_OK) break;
    if (!retry) return rc;
    int64_t left = deadline - now_ms();
    if (left <= 0)
      return mep__err(MEP_ERR_TIMEOUT, "store: connect to %s: %s after "
                      "%.1f s (%d tries)", st->where, why,
                      (double)(now_ms() - start) / 1000.0, tries);
    if (sleep_ms(delay < left ? delay : left, cancel))
      return dial_cancelled(st);
    delay = delay * 2 < BACKOFF_MAX_MS ? delay * 2 : BACKOFF_MAX_MS;
  }
  atomic_store(&st->reached, 1);
  conn_t *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return mep__err(MEP_ERR_NOMEM, "store: connect to %s: out of memory",
                    st->where);
  }
  c->fd = fd;
  *out = c;
  return MEP_OK;
}

/* --------------------------------------------------------------- pool */

static void conn_drop(conn_t *c) {
  if (!c) return;
  close(c->fd);
  free(c);
}

/* An idle connection that is readable has been closed by the server (or
 * holds bytes nobody asked for): either way it is unusable. */
static int conn_stale(const conn_t *c) {
  struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
  return poll(&p, 1, 0) != 0;
}

static int checkout(op_t *op, conn_t **out) {
  tcp_store_t *st = op->st;
  for (;;) {
    pthread_mutex_lock(&st->lock);
    conn_t *c = st->idle;
    if (c) st->idle = c->next;
    pthread_mutex_unlock(&st->lock);
    if (!c) break;
    if (!conn_stale(c)) {
      *out = c;
      return MEP_OK;
    }
    conn_drop(c);
  }
  /* A get may wait long for its key, but reaching the server is bounded
   * by the connect timeout all the same. */
  int64_t limit = now_ms() + st->timeout_ms;
  return dial(st, op->deadline < limit ? op->deadline : limit, op->cancel,
              out);
}

static void checkin(tcp_store_t *st, conn_t *c) {
  pthread_mutex_lock(&st->lock);
  c->next = st->idle;
  st->idle = c;
  pthread_mutex_unlock(&st->lock);
}

/* ------------------------------------------------------------ exchange */

static int op_timeout(const op_t *op) {
  return mep__err(MEP_ERR_TIMEOUT, "store: %s of key '%.64s' at %s timed "
                  "out after %d ms", op->name, op->key, op->st->where,
                  op->budget_ms);
}

static int op_cancelled(const op_t *op) {
  return mep__err(MEP_ERR_CLOSED, "store: %s of key '%.64s' at %s: "
                  "cancelled by its caller", op->name, op->key,
                  op->st->where);
}

static int op_broken(const op_t *op, int err) {
  if (err == 0)
    return mep__err(MEP_ERR_PEER_FAILED, "store: %s of key '%.64s': the "
                    "server at %s closed the connection", op->name, op->key,
                    op->st->where);
  return mep__err_errno(MEP_ERR_PEER_FAILED, err, "store: %s of key '%.64s': "
                        "connection to the server at %s failed", op->name,
                        op->key, op->st->where);
}

/* What a wait that did not end ready means for the request. */
static int op_unready(const op_t *op, int w) {
  return w == WAIT_DEADLINE    ? op_timeout(op)
         : w == WAIT_CANCELLED ? op_cancelled(op)
                               : op_broken(op, errno);
}

static int op_protocol(const op_t *op, const char *why) {
  return mep__err(MEP_ERR_PROTOCOL, "store: %s of key '%.64s': the server "
                  "at %s sent a bad reply: %s", op->name, op->key,
                  op->st->where, why);
}

static int send_all(const op_t *op, conn_t *c, struct iovec *iov, int n) {
  while (n > 0) {
    if (iov->iov_len == 0) {
      iov++, n--;
      continue;
    }
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int r = wait_fd(c->fd, POLLOUT, op->deadline, op->cancel);
      if (r != WAIT_READY) return op_unready(op, r);
      continue;
    }
    if (w < 0) return op_broken(op, errno);
    size_t done = (size_t)w;
    while (n > 0 && done >= iov->iov_len) {
      done -= iov->iov_len;
      iov++, n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + done;
      iov->iov_len -= done;
    }
  }
  return MEP_OK;
}

static int recv_all(const op_t *op, conn_t *c, void *buf, size_t len) {
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t r = recv(c->fd, p, len, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      len -= (size_t)r;
      continue;
    }
    if (r == 0) return op_broken(op, 0);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return op_broken(op, errno);
    int w = wait_fd(c->fd, POLLIN, op->deadline, op->cancel);
    if (w != WAIT_READY) return op_unready(op, w);
  }
  return MEP_OK;
}

/* The server's ERR reply as this thread's error. */
static int server_error(const op_t *op, const uint8_t *body, size_t len) {
  int code = (int32_t)mep__store_get_u32(body);
  if (code >= 0 || code < MEP_ERR_LAST)
    return op_protocol(op, "an error reply with an unknown code");
  return mep__err(code, "store: %s of key '%.64s' at %s failed: %.*s",
                  op->name, op->key, op->st->where, (int)(len - 4),
                  (const char *)body + 4);
}

/* Reads the reply to request `seq`: *body (malloc'ed, NUL-terminated)
 * and its length. *kept: the connection may serve another request. */
static int recv_reply(const op_t *op, conn_t *c, uint32_t seq,
                      uint8_t **body, size_t *len, int *kept) {
  uint8_t raw[MEP__STORE_HDR_LEN];
  int rc = recv_all(op, c, raw, sizeof raw);
  if (rc != MEP_OK) return rc;
  mep__store_hdr_t h;
  const char *why = "";
  if (mep__store_decode_header(raw, sizeof raw, MEP__STORE_REPLY, &h,
                               &why) != MEP__STORE_FRAME_OK)
    return op_protocol(op, why);
  if (h.seq != seq) return op_protocol(op, "the answer to another request");
  uint8_t *b = malloc((size_t)h.val_len + 1);
  if (!b)
    return mep__err(MEP_ERR_NOMEM, "store: %s of key '%.64s': no memory for "
                    "a %llu-byte value", op->name, op->key,
                    (unsigned long long)h.val_len);
  rc = recv_all(op, c, b, (size_t)h.val_len);
  if (rc != MEP_OK) {
    free(b);
    return rc;
  }
  b[h.val_len] = '\0';
  *kept = 1;
  if (h.op == MEP__STORE_ERR) {
    rc = server_error(op, b, (size_t)h.val_len);
    free(b);
    return rc;
  }
  *body = b;
  *len = (size_t)h.val_len;
  return MEP_OK;
}

/* Sends one request and waits for its reply. */
static int request(op_t *op, uint8_t code, uint16_t flags, const void *val,
                   size_t val_len, uint8_t **body, size_t *body_len) {
  if (cancelled(op->cancel)) return op_cancelled(op);
  conn_t *c;
  int rc = checkout(op, &c);
  if (rc != MEP_OK) return rc;
  mep__store_hdr_t h = {.op = code, .flags = flags, .seq = ++c->seq,
                        .key_len = (uint32_t)op->key_len,
                        .val_len = val_len};
  uint8_t raw[MEP__STORE_HDR_LEN];
  mep__store_encode_header(raw, &h);
  struct iovec iov[3] = {{raw, sizeof raw},
                         {(void *)op->key, op->key_len},
                         {(void *)val, val_len}};
  int kept = 0;
  rc = send_all(op, c, iov, 3);
  if (rc == MEP_OK) rc = recv_reply(op, c, h.seq, body, body_len, &kept);
  if (kept) checkin(op->st, c);
  else conn_drop(c);
  return rc;
}

/* ----------------------------------------------------------- callbacks */

static int op_begin(op_t *op, tcp_store_t *st, const char *name,
                    const char *key, int timeout_ms) {
  *op = (op_t){.st = st, .name = name, .key = key ? key : "(null)",
               .budget_ms = timeout_ms, .cancel = thread_cancel};
  op->deadline = timeout_ms < 0 ? NO_DEADLINE : now_ms() + timeout_ms;
  if (!st || !key || !*key)
    return mep__err(MEP_ERR_INVALID, "store: %s: the key is %s", name,
                    key ? "empty" : "NULL");
  op->key_len = strnlen(key, MEP__STORE_KEY_MAX + 1);
  if (op->key_len > MEP__STORE_KEY_MAX)
    return mep__err(MEP_ERR_INVALID, "store: %s of key '%.64s...': the key "
                    "is longer than %d bytes", name, key, MEP__STORE_KEY_MAX);
  return MEP_OK;
}

static int tcp_set(void *ctx, const char *key, const void *val, size_t len) {
  op_t op;
  tcp_store_t *st = ctx;
  int rc = op_begin(&op, st, "set", key, st ? st->timeout_ms : 0);
  if (rc != MEP_OK) return rc;
  if ((!val && len) || (uint64_t)len > MEP__STORE_VAL_MAX)
    return mep__err(MEP_ERR_INVALID, "store: set of key '%.64s': %s", key,
                    val ? "the value is over the 1 GiB limit"
                        : "the value is NULL");
  uint8_t *body = NULL;
  size_t body_len = 0;
  rc = request(&op, MEP__STORE_SET, 0, val, len, &body, &body_len);
  free(body);
  if (rc == MEP_OK && body_len != 0)
    return op_protocol(&op, "a value in the answer to a set");
  return rc;
}

static int tcp_get(void *ctx, const char *key, void **val, size_t *len,
                   int timeout_ms) {
  op_t op;
  tcp_store_t *st = ctx;
  /* timeout 0 asks the server not to park the request, so a key that is
   * there is found even though no time is left to wait for one. */
  uint16_t flags = timeout_ms == 0 ? MEP__STORE_NOWAIT : 0;
  int budget = timeout_ms == 0 && st ? st->timeout_ms : timeout_ms;
  int rc = op_begin(&op, st, "get", key, budget);
  if (rc != MEP_OK) return rc;
  if (!val || !len)
    return mep__err(MEP_ERR_INVALID, "store: get of key '%.64s': val or len "
                    "is NULL", key);
  uint8_t *body = NULL;
  rc = request(&op, MEP__STORE_GET, flags, NULL, 0, &body, len);
  if (rc == MEP_OK) *val = body;
  return rc;
}

static int tcp_add(void *ctx, const char *key, int64_t delta,
                   int64_t *result) {
  op_t op;
  tcp_store_t *st = ctx;
  int rc = op_begin(&op, st, "add", key, st ? st->timeout_ms : 0);
  if (rc != MEP_OK) return rc;
  uint8_t d[8], *body = NULL;
  size_t body_len = 0;
  mep__store_put_u64(d, (uint64_t)delta);
  rc = request(&op, MEP__STORE_ADD, 0, d, sizeof d, &body, &body_len);
  if (rc == MEP_OK && body_len != 8)
    rc = op_protocol(&op, "an answer to an add that is not 8 bytes");
  if (rc == MEP_OK && result) *result = (int64_t)mep__store_get_u64(body);
  free(body);
  return rc;
}

static int tcp_check(void *ctx, const char *key, int *exists) {
  op_t op;
  tcp_store_t *st = ctx;
  int rc = op_begin(&op, st, "check", key, st ? st->timeout_ms : 0);
  if (rc != MEP_OK) return rc;
  uint8_t *body = NULL;
  size_t body_len = 0;
  rc = request(&op, MEP__STORE_CHECK, 0, NULL, 0, &body, &body_len);
  if (rc == MEP_OK && (body_len != 1 || body[0] > 1))
    rc = op_protocol(&op, "an answer to a check that is not 0 or 1");
  if (rc == MEP_OK && exists) *exists = body[0];
  free(body);
  return rc;
}

static void tcp_destroy(void *ctx) {
  tcp_store_t *st = ctx;
  if (!st) return;
  while (st->idle) {
    conn_t *c = st->idle;
    st->idle = c->next;
    conn_drop(c);
  }
  pthread_mutex_destroy(&st->lock);
  free(st->host);
  free(st);
}

/* --------------------------------------------------------------- public */

int mep_store_tcp_connect(const char *host, int port, int timeout_ms,
                          mep_store_t **out) {
  if (!out || !host || !*host || port <= 0 || port > 65535)
    return mep__err(MEP_ERR_INVALID, "store: connect to %s:%d: %s",
                    host ? host : "(null)", port,
                    !out ? "out is NULL"
                    : (!host || !*host) ? "no host given"
                                        : "the port is not in 1..65535");
  *out = NULL;
  tcp_store_t *st = calloc(1, sizeof *st);
  if (!st || !(st->host = strdup(host))) {
    free(st);
    return mep__err(MEP_ERR_NOMEM, "store: connect to %s:%d: no memory",
                    host, port);
  }
  pthread_mutex_init(&st->lock, NULL);
  snprintf(st->port, sizeof st->port, "%d", port);
  snprintf(st->where, sizeof st->where, strchr(host, ':') ? "[%.255s]:%d"
                                                          : "%.255s:%d",
           host, port);
  st->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
  st->pub = (mep_store_t){.ctx = st, .set = tcp_set, .get = tcp_get,
                          .add = tcp_add, .check = tcp_check,
                          .destroy = tcp_destroy};
  conn_t *c;
  int rc = dial(st, now_ms() + st->timeout_ms, NULL, &c);
  if (rc != MEP_OK) {
    tcp_destroy(st);
    return rc;
  }
  checkin(st, c);
  mep__debug("store: connected to %s", st->where);
  *out = &st->pub;
  return MEP_OK;
}

void mep_store_destroy(mep_store_t *store) {
  if (!store) return;
  /* A TCP store's struct lives inside its context and goes with it. */
  if (store->destroy) store->destroy(store->ctx);
}
