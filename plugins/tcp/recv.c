/*
 * recv.c - the receive side, run by the poll thread (but for the long
 * payloads it hands to a receiver thread, receiver.c).
 *
 * Each socket reads what the kernel holds into a buffer (rb) and parses
 * the messages there in order: a 32-byte header is validated (wire.c)
 * against the live region table before any payload byte is copied into
 * the region; a long payload's rest is read straight into the region,
 * here or on a receiver thread. A signal waits in its peer's queue
 * until every message it counts has arrived on every socket, then applies
 * with an atomic release store or fetch-add, so a thread that sees the new
 * value with an acquire load also sees the data written before it.
 * A malformed message fails the peer; so does a socket that breaks, unless
 * the peer's BYE arrived on it before: then the end of the stream is an
 * orderly close, and once every socket's BYE is in (and so every message
 * the peer sent, every signal applied) the peer is reported closed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp.h"

/* Per readiness event, so one busy socket does not starve the others. */
#define TCP_RX_MSGS 64
#define TCP_RX_BYTES (16u << 20)
/* rx_lock is held across one recv() into a region; bound its length. */
#define TCP_RX_CHUNK (1u << 20)

static void bad(tcp_sock_t *s, int rc, const char *why) {
  tcp_peer_t *p = s->peer;
  if (rc == MEP_ERR_BOUNDS)
    TCP_LOG(p->ctx, MEP_LOG_ERROR, "tcp: rank %d %s; closing its connections",
            p->rank, why);
  else
    TCP_LOG(p->ctx, MEP_LOG_ERROR,
            "tcp: rank %d sent a malformed message on socket %u: %s; closing "
            "its connections", p->rank, s->index, why);
  mep__tcp_peer_fail(p, rc, 1);
}

static void lost(tcp_sock_t *s, const char *why) {
  tcp_peer_t *p = s->peer;
  pthread_mutex_lock(&p->mu);
  if (!p->dead) {
    if (s->tx_err)
      TCP_LOG(p->ctx, MEP_LOG_WARN,
              "tcp: lost rank %d: sending on socket %u failed (%s) and it "
              "did not close in order; failing its operations",
              p->rank, s->index, strerror(s->tx_err));
    else
      TCP_LOG(p->ctx, MEP_LOG_WARN,
              "tcp: lost rank %d: %s on socket %u%s; failing its operations",
              p->rank, why, s->index,
              p->closing ? " without its goodbye there" : "");
    mep__tcp_peer_fail_locked(p, MEP_ERR_PEER_FAILED, 1);
  }
  pthread_mutex_unlock(&p->mu);
}

/* The stream of a socket whose BYE arrived ended: not a failure. It is no
 * longer watched (its end would be reported again and again); its fd is
 * closed with the peer's others. */
static void ended(tcp_sock_t *s) {
  tcp_peer_t *p = s->peer;
  pthread_mutex_lock(&p->mu);
  if (!p->dead && s->fd >= 0)
    epoll_ctl(p->ctx->epfd, EPOLL_CTL_DEL, s->fd, NULL);
  pthread_mutex_unlock(&p->mu);
  s->rx_ended = 1;
}

static size_t psig_stride(const tcp_peer_t *p) {
  return 4 + (size_t)p->ctx->cfg.nsock;
}

static int psig_push(tcp_peer_t *p, const mep__tcp_msg_t *m,
                     const uint64_t *counts) {
  size_t st = psig_stride(p);
  if (p->psig_n == p->psig_cap) {
    size_t cap = p->psig_cap ? p->psig_cap * 2 : 16;
    uint64_t *q = malloc(cap * st * sizeof *q);
    if (!q) return -1;
    for (size_t i = 0; i < p->psig_n; i++)
      memcpy(q + i * st, p->psig + ((p->psig_head + i) % p->psig_cap) * st,
             st * sizeof *q);
    free(p->psig);
    p->psig = q;
    p->psig_cap = cap;
    p->psig_head = 0;
  }
  uint64_t *e = p->psig + ((p->psig_head + p->psig_n) % p->psig_cap) * st;
  e[0] = m->region;
  e[1] = m->op;
  e[2] = m->offset;
  e[3] = m->len_or_value;
  memcpy(e + 4, counts, (size_t)p->ctx->cfg.nsock * sizeof *counts);
  p->psig_n++;
  return 0;
}

/* Applies the waiting signals whose messages have all arrived, in order.
 * Returns -1 when the peer was failed. */
static int apply_pending(tcp_sock_t *s) {
  tcp_peer_t *p = s->peer;
  tcp_ctx_t *ctx = p->ctx;
  int k = ctx->cfg.nsock;
  char why[160];
  while (p->psig_n) {
    const uint64_t *e = p->psig + p->psig_head * psig_stride(p);
    for (int i = 0; i < k; i++)
      if (p->socks[i].rx_seq < e[4 + i]) return 0;
    pthread_rwlock_rdlock(&ctx->rx_lock);
    tcp_mr_t *mr = mep__tcp_region_find(ctx, (uint32_t)e[0]);
    uint8_t *word = mr ? mr->base + e[2] : NULL;
    if (word && ((uintptr_t)word & 7) == 0) {
      if (e[1] == MEP_TCP_OP_ADD)
        __atomic_fetch_add((uint64_t *)(void *)word, e[3], __ATOMIC_RELEASE);
      else
        __atomic_store_n((uint64_t *)(void *)word, e[3], __ATOMIC_RELEASE);
    }
    pthread_rwlock_unlock(&ctx->rx_lock);
    if (!word || ((uintptr_t)word & 7)) {
      snprintf(why, sizeof why,
               mr ? "signalled offset %" PRIu64 " of region %" PRIu64
                    ", whose base address is not 8-byte aligned"
                  : "signalled offset %" PRIu64 " of region %" PRIu64
                    ", which was deregistered before the signal applied",
               e[2], e[0]);
      bad(s, MEP_ERR_PROTOCOL, why);
      return -1;
    }
    p->psig_head = (p->psig_head + 1) % p->psig_cap;
    p->psig_n--;
  }
  return 0;
}

static int msg_done(tcp_sock_t *s) {
  s->rx_seq++;
  s->rx_state = TCP_RX_HDR;
  s->rx_have = 0;
  s->rx_need = MEP_TCP_HDR_LEN;
  return apply_pending(s);
}

/* A BYE arrived on s. When it was the last socket's, every message the
 * peer sent has arrived (it says goodbye only once all were handed to its
 * kernel) and apply_pending applied every signal it could: one still
 * waiting counts messages that were never sent. The BYE itself is not
 * one of the messages a signal counts. Returns -1 when the peer is dead
 * now (closed, or failed). */
static int on_bye(tcp_sock_t *s) {
  tcp_peer_t *p = s->peer;
  tcp_ctx_t *ctx = p->ctx;
  s->rx_bye = 1;
  s->rx_have = 0;
  if (p->nbye++ == 0) {
    pthread_mutex_lock(&p->mu);
    p->closing = 1;
    pthread_mutex_unlock(&p->mu);
  }
  if (p->nbye < ctx->cfg.nsock) return 0;
  if (p->psig_n) {
    char why[160];
    snprintf(why, sizeof why,
             "its last goodbye came while %zu of its signals still waited "
             "for messages it never sent", p->psig_n);
    bad(s, MEP_ERR_PROTOCOL, why);
    return -1;
  }
  pthread_mutex_lock(&p->mu);
  if (!p->dead) {
    TCP_LOG(ctx, MEP_LOG_INFO, "tcp: rank %d closed its connections",
            p->rank);
    mep__tcp_peer_fail_locked(p, MEP_ERR_CLOSED, 1);
  }
  pthread_mutex_unlock(&p->mu);
  return -1;
}

/* A header or a signal trailer is complete. -1 when the peer was failed. */
static int on_head(tcp_sock_t *s) {
  tcp_peer_t *p = s->peer;
  tcp_ctx_t *ctx = p->ctx;
  char why[200];
  if (s->rx_state == TCP_RX_TRAILER) {
    uint64_t counts[MEP_TCP_MAX_SOCKS];
    int rc = mep__tcp_counts_check(s->rx_buf + MEP_TCP_HDR_LEN,
                                   s->rx_have - MEP_TCP_HDR_LEN, &s->rx_msg,
                                   s->index, counts, why, sizeof why);
    if (!rc && psig_push(p, &s->rx_msg, counts)) {
      snprintf(why, sizeof why, "out of memory for its waiting signals");
      rc = MEP_ERR_NOMEM;
    }
    if (rc) return bad(s, MEP_ERR_PROTOCOL, why), -1;
    return msg_done(s);
  }
  mep__tcp_msg_expect_t exp = {.seq = s->rx_seq,
                               .nsock = (uint32_t)ctx->cfg.nsock,
                               .region_len = mep__tcp_region_len,
                               .arg = ctx};
  pthread_rwlock_rdlock(&ctx->rx_lock);
  int rc = mep__tcp_msg_check(s->rx_buf, s->rx_have, &exp, &s->rx_msg, why,
                              sizeof why);
  pthread_rwlock_unlock(&ctx->rx_lock);
  if (!rc && s->rx_msg.type == MEP_TCP_MSG_SIGNAL && s->index != 0) {
    snprintf(why, sizeof why, "signal on socket %u (signals travel on 0)",
             s->index);
    rc = MEP_ERR_PROTOCOL;
  }
  if (rc) return bad(s, rc, why), -1;
  if (s->rx_msg.type == MEP_TCP_MSG_BYE) return on_bye(s);
  if (s->rx_msg.type == MEP_TCP_MSG_SIGNAL) {
    s->rx_state = TCP_RX_TRAILER;
    s->rx_need = MEP_TCP_HDR_LEN + 8u * s->rx_msg.count;
    return 0;
  }
  if (s->rx_msg.len_or_value == 0) return msg_done(s);
  s->rx_state = TCP_RX_PAYLOAD;
  s->rx_left = s->rx_msg.len_or_value;
  return 0;
}

/* Payload bytes come from rb first, else, for a long rest, straight from
 * the socket. The region is looked up again under rx_lock for every
 * chunk: dereg may have removed it. */
ssize_t mep__tcp_read_payload(tcp_sock_t *s, int fd) {
  tcp_ctx_t *ctx = s->peer->ctx;
  const mep__tcp_msg_t *m = &s->rx_msg;
  pthread_rwlock_rdlock(&ctx->rx_lock);
  tcp_mr_t *mr = mep__tcp_region_find(ctx, m->region);
  ssize_t n = -2;
  if (mr) {
    uint8_t *dst = mr->base + m->offset + (m->len_or_value - s->rx_left);
    size_t want = s->rx_left < TCP_RX_CHUNK ? (size_t)s->rx_left
                                            : TCP_RX_CHUNK;
    if (s->rb_len) {
      n = (ssize_t)(want < s->rb_len ? want : s->rb_len);
      memcpy(dst, s->rb + s->rb_off, (size_t)n);
      s->rb_off += (size_t)n;
      s->rb_len -= (size_t)n;
    } else {
      n = recv(fd, dst, want, MSG_DONTWAIT);
    }
  }
  pthread_rwlock_unlock(&ctx->rx_lock);
  return n;
}

/* Reads what the socket holds into the empty rb. recv's answer; -1 with
 * ENOMEM when rb cannot be made. */
static ssize_t fill(tcp_sock_t *s, int fd) {
  if (!s->rb && !(s->rb = malloc(TCP_RXBUF_LEN))) {
    errno = ENOMEM;
    return -1;
  }
  s->rb_off = 0;
  ssize_t n = recv(fd, s->rb, TCP_RXBUF_LEN, MSG_DONTWAIT);
  if (n > 0) s->rb_len = (size_t)n;
  return n;
}

/* Reading s failed: res is TCP_RX_EOF, TCP_RX_GONE (the payload's region
 * was deregistered) or an errno. */
static void read_failed(tcp_sock_t *s, int res) {
  char why[160];
  if (res == TCP_RX_GONE) {
    snprintf(why, sizeof why,
             "region %" PRIu32 " was deregistered while a write into it "
             "was arriving", s->rx_msg.region);
    bad(s, MEP_ERR_PROTOCOL, why);
    return;
  }
  /* after its BYE, a reset too only says the peer closed without reading
   * what we sent: our queue completes with MEP_ERR_CLOSED */
  if (s->rx_bye) {
    ended(s);
    return;
  }
  snprintf(why, sizeof why, "%s",
           res == TCP_RX_EOF ? "it closed the connection" : strerror(res));
  lost(s, why);
}

/* Moves header or trailer bytes from rb to rx_buf. */
static void take_head(tcp_sock_t *s) {
  size_t n = s->rx_need - s->rx_have;
  if (n > s->rb_len) n = s->rb_len;
  memcpy(s->rx_buf + s->rx_have, s->rb + s->rb_off, n);
  s->rx_have += n;
  s->rb_off += n;
  s->rb_len -= n;
}

/* Reads and handles what socket s holds. Bytes are read ahead into rb and
 * every message there is handled before the socket is read again; the
 * per-event limits only stop further reads, since bytes left in rb would
 * raise no event. */
static void read_sock(tcp_sock_t *s) {
  tcp_peer_t *p = s->peer;
  pthread_mutex_lock(&p->mu);
  int fd = p->dead ? -1 : s->fd, broken = s->tx_err != 0;
  int away = mep__tcp_pool_owned(&p->ctx->rx, s);
  pthread_mutex_unlock(&p->mu);
  if (fd < 0 || s->rx_ended || away) return;
  s->rx_stalled = 0;
  char why[160];
  uint64_t bytes = 0;
  for (int msgs = 0;;) {
    if (s->rx_bye && s->rb_len) {
      snprintf(why, sizeof why, "%zu bytes after its goodbye", s->rb_len);
      bad(s, MEP_ERR_PROTOCOL, why);
      return;
    }
    if (!s->rb_len && (msgs >= TCP_RX_MSGS || bytes >= TCP_RX_BYTES)) return;
    /* back-pressure: see TCP_MAX_PENDING_SIGNALS; a broken socket is read
     * to its end regardless, which decides the peer's fate. What rb still
     * holds is handled once a signal applied (mep__tcp_on_readable). */
    if (s->rx_state == TCP_RX_HDR && s->rx_have == 0 && s->index == 0 &&
        p->psig_n >= TCP_MAX_PENDING_SIGNALS && !broken) {
      s->rx_stalled = s->rb_len != 0;
      return;
    }
    ssize_t n;
    if (mep__tcp_rx_handoff(s)) return;
    if (s->rx_state == TCP_RX_PAYLOAD &&
        (s->rb_len || s->rx_left >= TCP_RX_DIRECT)) {
      int direct = !s->rb_len;
      n = mep__tcp_read_payload(s, fd);
      if (n == -2) {
        read_failed(s, TCP_RX_GONE);
        return;
      }
      if (n > 0) {
        if (direct) bytes += (uint64_t)n;
        s->rx_left -= (uint64_t)n;
        if (!s->rx_left) {
          msgs++;
          if (msg_done(s)) return;
        }
        continue;
      }
    } else if (s->rb_len) {
      take_head(s);
      if (s->rx_have < s->rx_need) continue;
      uint64_t before = s->rx_seq;
      if (on_head(s)) return;
      msgs += s->rx_seq != before;
      continue;
    } else {
      n = fill(s, fd);
      if (n > 0) {
        bytes += (uint64_t)n;
        continue;
      }
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    read_failed(s, n == 0 ? TCP_RX_EOF : errno);
    return;
  }
}

void mep__tcp_on_rx_done(tcp_ctx_t *ctx) {
  uint64_t v;
  (void)!read(ctx->rx.donefd, &v, sizeof v);
  tcp_sock_t *s;
  while ((s = mep__tcp_rx_take_back(ctx))) {
    if (s->rx_res != TCP_RX_OK) {
      read_failed(s, s->rx_res);
      continue;
    }
    if (msg_done(s)) continue;
    mep__tcp_on_readable(s);
  }
}

void mep__tcp_on_readable(tcp_sock_t *s) {
  read_sock(s);
  /* socket 0 stopped for back-pressure with messages in its rb raises no
   * event for them: resume it once signals applied */
  tcp_sock_t *s0 = &s->peer->socks[0];
  if (s != s0 && s0->rx_stalled &&
      s->peer->psig_n < TCP_MAX_PENDING_SIGNALS)
    read_sock(s0);
}
