/*
 * dial.c - the dialler's side of connection set-up (the lower rank).
 *
 * Each of the k sockets: a non-blocking connect from the configured
 * interface, retried with backoff while refused (the peer may not listen
 * yet), then the hello and the wait for the acceptor's ack. An acceptor
 * that does not want this process as its rank yet (it has not dropped the
 * process we replace, or not called connect() for us) answers with a
 * refusal: the socket is dialled again, with a short backoff, until the
 * deadline. While waiting, incoming connections keep being served
 * (mep__tcp_wait), which is what keeps set-up free of deadlocks (see
 * connect() in plugin.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bind_source.h"
#include "tcp.h"

typedef struct dial {
  tcp_ctx_t *ctx;
  tcp_peer_t *p;
  tcp_dialing_t rec; /* on ctx->dialing while mep__tcp_dial runs */
  struct sockaddr_in to;
  uint64_t to_inc;
  char where[64];
  int64_t deadline;
  int refusals, last_refusal;
} dial_t;

static int is_transient(int e) {
  return e == ECONNREFUSED || e == ECONNRESET || e == ETIMEDOUT ||
         e == EHOSTUNREACH || e == ENETUNREACH || e == EAGAIN;
}

/* The socket is made, closed and handed over under ctx->mu, a lock the
 * fork handlers hold: a child forked meanwhile finds it in d->rec. */
static int dial_socket(dial_t *d) {
  pthread_mutex_lock(&d->ctx->mu);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  d->rec.fd = fd;
  pthread_mutex_unlock(&d->ctx->mu);
  return fd;
}

/* Closes the socket being dialled, if any. */
static void dial_drop(dial_t *d) {
  pthread_mutex_lock(&d->ctx->mu);
  if (d->rec.fd >= 0) close(d->rec.fd);
  d->rec.fd = -1;
  pthread_mutex_unlock(&d->ctx->mu);
}

static void dial_list(dial_t *d, int on) {
  tcp_ctx_t *ctx = d->ctx;
  pthread_mutex_lock(&ctx->mu);
  if (on) {
    d->rec = (tcp_dialing_t){.fd = -1, .next = ctx->dialing};
    ctx->dialing = &d->rec;
  } else {
    for (tcp_dialing_t **pp = &ctx->dialing; *pp; pp = &(*pp)->next)
      if (*pp == &d->rec) {
        *pp = d->rec.next;
        break;
      }
  }
  pthread_mutex_unlock(&ctx->mu);
}

/* One TCP connect attempt: the connected fd, or -1 with errno. */
static int try_connect(dial_t *d) {
  int fd = dial_socket(d);
  if (fd < 0) return -1;
  if (mep__bind_source(fd, &d->ctx->addr) ||
      (connect(fd, (struct sockaddr *)&d->to, sizeof d->to) &&
       errno != EINPROGRESS)) {
    int e = errno;
    dial_drop(d);
    errno = e;
    return -1;
  }
  int ready;
  while ((ready = mep__tcp_wait(d->ctx, fd, POLLOUT, d->deadline)) == 0) {
  }
  int err = ETIMEDOUT;
  socklen_t elen = sizeof err;
  if (ready > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
  if (err) {
    dial_drop(d);
    errno = err;
    return -1;
  }
  return fd;
}

static int connect_retrying(dial_t *d, int *fd_out) {
  tcp_ctx_t *ctx = d->ctx;
  int tries = 0, max = ctx->cfg.retries > 0 ? ctx->cfg.retries : 1;
  int64_t backoff = 10;
  for (;;) {
    int fd = try_connect(d);
    tries++;
    if (fd >= 0) return *fd_out = fd, 0;
    int e = errno;
    int64_t now = mep__tcp_now_ms();
    if (now >= d->deadline)
      return TCP_ERR(ctx, MEP_ERR_TIMEOUT,
                     "tcp: connect to rank %d at %s: no connection within %d "
                     "ms (%d tries, last: %s)",
                     d->p->rank, d->where, ctx->timeout_ms, tries,
                     strerror(e));
    if (!is_transient(e) || tries >= max)
      return TCP_ERR(ctx, MEP_ERR_UNREACHABLE,
                     "tcp: connect to rank %d at %s: %s after %d tries",
                     d->p->rank, d->where, strerror(e), tries);
    int64_t until = now + backoff < d->deadline ? now + backoff : d->deadline;
    while (mep__tcp_now_ms() < until) mep__tcp_wait(ctx, -1, 0, until);
    backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
  }
}

/* Moves exactly len bytes in the direction `out` says, by the deadline. */
static int xfer(dial_t *d, int fd, uint8_t *buf, size_t len, int out,
                const char *what) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = out ? send(fd, buf + done, len - done,
                           MSG_NOSIGNAL | MSG_DONTWAIT)
                    : recv(fd, buf + done, len - done, MSG_DONTWAIT);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return TCP_ERR(d->ctx, MEP_ERR_PEER_FAILED,
                     "tcp: connect to rank %d at %s: %s failed: %s",
                     d->p->rank, d->where, what, strerror(errno));
    if (n == 0)
      return TCP_ERR(d->ctx, MEP_ERR_AUTH,
                     "tcp: connect to rank %d at %s: the peer closed the "
                     "connection instead of acknowledging our hello (it "
                     "refused it: wrong secret, rank or sockets_per_peer, a "
                     "stale address blob, or a duplicate; its log names the "
                     "reason)",
                     d->p->rank, d->where);
    if (mep__tcp_wait(d->ctx, fd, out ? POLLOUT : POLLIN, d->deadline) < 0)
      return TCP_ERR(d->ctx, MEP_ERR_TIMEOUT,
                     "tcp: connect to rank %d at %s: %s took longer than %d "
                     "ms",
                     d->p->rank, d->where, what, d->ctx->timeout_ms);
  }
  return 0;
}

/* The hello and its answer: 0 (acked), 1 (refused for now: the reason is
 * in d->last_refusal) or a negative code. */
static int handshake(dial_t *d, int fd, uint32_t index) {
  tcp_ctx_t *ctx = d->ctx;
  uint8_t hello[MEP_TCP_HELLO_LEN + MEP_TCP_MAX_SECRET];
  mep__tcp_hello_t h = {
      .nsock = (uint32_t)ctx->cfg.nsock,
      .from = (uint32_t)ctx->rank,
      .to = (uint32_t)d->p->rank,
      .index = index,
      .secret_len = (uint32_t)ctx->env->secret_len,
      .from_inc = ctx->inc,
      .to_inc = d->to_inc,
      .secret = ctx->env->secret,
  };
  size_t n = mep__tcp_hello_encode(hello, sizeof hello, &h);
  int rc = xfer(d, fd, hello, n, 1, "sending the hello");
  uint8_t ack[MEP_TCP_ACK_LEN];
  if (!rc) rc = xfer(d, fd, ack, sizeof ack, 0, "waiting for the ack");
  char why[160];
  int refused = 0;
  if (!rc && mep__tcp_ack_check(ack, sizeof ack, h.nsock, h.to, index,
                                &refused, why, sizeof why))
    rc = TCP_ERR(ctx, MEP_ERR_PROTOCOL, "tcp: connect to rank %d at %s: %s",
                 d->p->rank, d->where, why);
  if (!rc && refused) {
    d->refusals++;
    d->last_refusal = refused;
    return 1;
  }
  return rc;
}

/* Waits out the backoff after the n-th refusal, serving incoming
 * connections meanwhile; MEP_ERR_TIMEOUT when the deadline comes first. */
static int after_refusal(dial_t *d, int n) {
  int64_t backoff = TCP_NAK_BACKOFF_MS;
  for (int i = 1; i < n && backoff < TCP_NAK_BACKOFF_MAX_MS; i++)
    backoff *= 2;
  if (backoff > TCP_NAK_BACKOFF_MAX_MS) backoff = TCP_NAK_BACKOFF_MAX_MS;
  int64_t until = mep__tcp_now_ms() + backoff;
  if (until >= d->deadline)
    return TCP_ERR(d->ctx, MEP_ERR_TIMEOUT,
                   "tcp: connect to rank %d at %s: it refused this process "
                   "as rank %d %d times within %d ms: it %s",
                   d->p->rank, d->where, d->ctx->rank, d->refusals,
                   d->ctx->timeout_ms, mep__tcp_nak_text(d->last_refusal));
  while (mep__tcp_now_ms() < until) mep__tcp_wait(d->ctx, -1, 0, until);
  return 0;
}

/* Makes the socket a peer's and takes it off the dialling list in one
 * step under ctx->mu: a fork never finds it in neither place, nor still
 * listed after the poll thread has closed it and the number was reused. */
static int hand_over(dial_t *d, uint32_t index, int fd) {
  pthread_mutex_lock(&d->ctx->mu);
  int rc = mep__tcp_peer_install(d->p, index, fd, 1);
  if (!rc) d->rec.fd = -1;
  pthread_mutex_unlock(&d->ctx->mu);
  return rc;
}

static int dial_all(dial_t *d) {
  tcp_ctx_t *ctx = d->ctx;
  for (int i = 0, refused = 0; i < ctx->cfg.nsock; i++) {
    int fd = -1;
    int rc = connect_retrying(d, &fd);
    if (!rc) rc = handshake(d, fd, (uint32_t)i);
    if (rc == 1) { /* refused for now: this socket again, after a while */
      dial_drop(d);
      if ((rc = after_refusal(d, ++refused))) return rc;
      i--;
      continue;
    }
    if (!rc && (rc = hand_over(d, (uint32_t)i, fd)))
      ctx->env->set_error("tcp: connect to rank %d at %s: socket %d could "
                          "not be set up (the peer failed meanwhile, or "
                          "epoll_ctl failed)", d->p->rank, d->where, i);
    if (rc) {
      dial_drop(d);
      return rc;
    }
  }
  return 0;
}

int mep__tcp_dial(tcp_ctx_t *ctx, tcp_peer_t *p, const mep__tcp_addr_t *a,
                  int64_t deadline) {
  dial_t d = {.ctx = ctx, .p = p, .deadline = deadline};
  d.to.sin_family = AF_INET;
  memcpy(&d.to.sin_addr, a->ip, 4);
  d.to.sin_port = htons(a->port);
  d.to_inc = a->incarnation;
  mep__tcp_fmt_addr(&d.to, d.where, sizeof d.where);
  dial_list(&d, 1);
  int rc = dial_all(&d); /* every way out has closed or handed over */
  dial_list(&d, 0);
  return rc;
}
