/*
 * accept.c - the acceptor's side of connection set-up.
 *
 * Every incoming connection is accepted at once, then read without
 * blocking until its hello is complete. Only a hello that passes every
 * check (wire.c) makes the socket one of a peer's sockets; the peer need
 * not be the one connect() is waiting for (the socket is stashed in its
 * peer's slot and acked at once). Anything else is closed with a warning
 * naming the remote address and the reason, and nothing else changes.
 * A good hello from a process this side does not want as that rank now
 * (the rank was closed and connect() not called again, an earlier
 * connection of it is still held, or connect() waits for another
 * incarnation) gets a refusal instead of the ack, and the dialler retries
 * until its deadline: so a replacement may dial before or after this side
 * dropped the rank it replaces.
 * Runs under ctx->mu, called from connect() and from poll().
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp.h"

static void hs_drop(tcp_ctx_t *ctx, tcp_hs_t *hs, const char *why) {
  char from[64];
  mep__tcp_fmt_addr(&hs->from, from, sizeof from);
  TCP_LOG(ctx, MEP_LOG_WARN,
          "tcp: rank %d dropped a connection from %s: %s", ctx->rank, from,
          why);
  close(hs->fd);
  hs->fd = -1;
}

static void accept_new(tcp_ctx_t *ctx) {
  for (;;) {
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    int fd = accept4(ctx->lfd, (struct sockaddr *)&from, &flen,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        TCP_LOG(ctx, MEP_LOG_WARN, "tcp: rank %d: accept failed: %s",
                ctx->rank, strerror(errno));
      return;
    }
    tcp_hs_t *hs = ctx->nhs < TCP_MAX_HANDSHAKES ? calloc(1, sizeof *hs)
                                                  : NULL;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ctx->hssrc};
    if (!hs || epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev)) {
      tcp_hs_t tmp = {.fd = fd, .from = from};
      hs_drop(ctx, &tmp, hs ? "cannot watch it (epoll_ctl failed)"
                            : "too many connections in their handshake");
      free(hs);
      continue;
    }
    hs->fd = fd;
    hs->from = from;
    hs->deadline_ms = mep__tcp_now_ms() + ctx->timeout_ms;
    hs->next = ctx->hs;
    ctx->hs = hs;
    __atomic_store_n(&ctx->nhs, ctx->nhs + 1, __ATOMIC_RELAXED);
  }
}

/* ctx->mu held: the peer a good hello from h->from may join, or NULL with
 * *nak set to why not now (or 0: out of memory). A hello that comes before
 * connect() was called for its rank makes a stash that connect() checks
 * later; once connect() named the incarnation, only that one gets in. */
static tcp_peer_t *adoptable(tcp_ctx_t *ctx, const mep__tcp_hello_t *h,
                             int *nak) {
  int q = (int)h->from;
  *nak = 0;
  if (ctx->shut[q]) {
    *nak = MEP_TCP_NAK_UNEXPECTED;
    return NULL;
  }
  tcp_peer_t *p = ctx->peers[q];
  if (!p) {
    if (!(p = mep__tcp_peer_new(ctx, q))) return NULL;
    p->inc = h->from_inc;
    return p;
  }
  pthread_mutex_lock(&p->mu);
  if (p->dead || (p->inc != h->from_inc && !p->inc_known) ||
      (p->inc != h->from_inc && p->connected))
    *nak = MEP_TCP_NAK_BUSY;
  else if (p->inc != h->from_inc)
    *nak = MEP_TCP_NAK_OTHER;
  pthread_mutex_unlock(&p->mu);
  return *nak ? NULL : p;
}

/* Answers a good hello that is not wanted now: the dialler may retry. */
static void hs_refuse(tcp_ctx_t *ctx, tcp_hs_t *hs, const mep__tcp_hello_t *h,
                      int reason) {
  uint8_t nak[MEP_TCP_ACK_LEN];
  mep__tcp_nak_encode(nak, (uint32_t)reason, (uint32_t)ctx->rank, h->index);
  ssize_t n = send(hs->fd, nak, sizeof nak, MSG_NOSIGNAL | MSG_DONTWAIT);
  char from[64];
  mep__tcp_fmt_addr(&hs->from, from, sizeof from);
  TCP_LOG(ctx, MEP_LOG_DEBUG,
          "tcp: rank %d refused socket %u of rank %u (incarnation %#llx) "
          "from %s for now%s: this side %s", ctx->rank, h->index, h->from,
          (unsigned long long)h->from_inc, from,
          n == (ssize_t)sizeof nak ? "" : " (the refusal could not be sent)",
          mep__tcp_nak_text(reason));
  close(hs->fd);
  hs->fd = -1;
}

/* The hello is good: make the socket peer h->from's socket h->index. */
static void hs_adopt(tcp_ctx_t *ctx, tcp_hs_t *hs, const mep__tcp_hello_t *h) {
  char why[160];
  int nak;
  tcp_peer_t *p = adoptable(ctx, h, &nak);
  if (!p) {
    if (nak)
      hs_refuse(ctx, hs, h, nak);
    else
      hs_drop(ctx, hs, "out of memory");
    return;
  }
  uint8_t ack[MEP_TCP_ACK_LEN];
  mep__tcp_ack_encode(ack, h->nsock, (uint32_t)ctx->rank, h->index);
  /* The ack goes first: once installed, the socket belongs to the peer
   * and its data may be read by poll() at once. 16 bytes always fit in a
   * fresh socket's buffer. */
  pthread_mutex_lock(&p->mu);
  int taken = p->socks[h->index].used;
  pthread_mutex_unlock(&p->mu);
  int rc = 0;
  if (taken) {
    snprintf(why, sizeof why, "socket %u of rank %u (incarnation %#llx) is "
             "already connected (a duplicate)", h->index, h->from,
             (unsigned long long)h->from_inc);
  } else if (send(hs->fd, ack, sizeof ack, MSG_NOSIGNAL | MSG_DONTWAIT) !=
             (ssize_t)sizeof ack) {
    snprintf(why, sizeof why, "sending the ack to rank %u failed: %s",
             h->from, strerror(errno));
    rc = -1;
  } else if ((rc = mep__tcp_peer_install(p, h->index, hs->fd, 0))) {
    snprintf(why, sizeof why, "rank %u's socket %u cannot be adopted (%s)",
             h->from, h->index,
             rc == MEP_ERR_SYSTEM ? "epoll_ctl failed" : "slot taken meanwhile");
  }
  if (taken || rc) {
    hs_drop(ctx, hs, why);
    return;
  }
  char from[64];
  mep__tcp_fmt_addr(&hs->from, from, sizeof from);
  TCP_LOG(ctx, MEP_LOG_DEBUG, "tcp: rank %d accepted socket %u of rank %u "
          "from %s", ctx->rank, h->index, h->from, from);
  hs->fd = -1;
}

/* Reads what the hello has so far; returns 1 when hs is finished (adopted
 * or dropped), 0 when it needs more bytes. */
static int hs_step(tcp_ctx_t *ctx, tcp_hs_t *hs, int64_t now) {
  mep__tcp_hello_expect_t exp = {
      .rank = (uint32_t)ctx->rank,
      .size = (uint32_t)ctx->size,
      .nsock = (uint32_t)ctx->cfg.nsock,
      .incarnation = ctx->inc,
      .secret = ctx->env->secret,
      .secret_len = (uint32_t)ctx->env->secret_len,
  };
  char why[160];
  for (;;) {
    mep__tcp_hello_t h;
    int rc = mep__tcp_hello_check(hs->buf, hs->have, &exp, &h, why,
                                  sizeof why);
    if (rc < 0) return hs_drop(ctx, hs, why), 1;
    if (rc == 0) return hs_adopt(ctx, hs, &h), 1;
    size_t need = (size_t)rc;
    ssize_t n = recv(hs->fd, hs->buf + hs->have, need - hs->have,
                     MSG_DONTWAIT);
    if (n > 0) {
      hs->have += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (now < hs->deadline_ms) return 0;
      snprintf(why, sizeof why, "no complete hello within %d ms (%zu of %zu "
               "bytes)", ctx->timeout_ms, hs->have, need);
    } else if (n == 0) {
      snprintf(why, sizeof why, "closed after %zu of %zu bytes of its hello",
               hs->have, need);
    } else {
      snprintf(why, sizeof why, "reading its hello failed: %s",
               strerror(errno));
    }
    return hs_drop(ctx, hs, why), 1;
  }
}

void mep__tcp_accept_pump(tcp_ctx_t *ctx) {
  pthread_mutex_lock(&ctx->mu);
  accept_new(ctx);
  int64_t now = mep__tcp_now_ms(), next = INT64_MAX;
  for (tcp_hs_t **pp = &ctx->hs; *pp;) {
    tcp_hs_t *hs = *pp;
    if (hs_step(ctx, hs, now)) {
      *pp = hs->next;
      free(hs);
      __atomic_store_n(&ctx->nhs, ctx->nhs - 1, __ATOMIC_RELAXED);
    } else {
      if (hs->deadline_ms < next) next = hs->deadline_ms;
      pp = &hs->next;
    }
  }
  __atomic_store_n(&ctx->hs_next_deadline, next, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&ctx->mu);
}

void mep__tcp_hs_free_all(tcp_ctx_t *ctx) {
  while (ctx->hs) {
    tcp_hs_t *hs = ctx->hs;
    ctx->hs = hs->next;
    if (hs->fd >= 0) close(hs->fd);
    free(hs);
  }
  ctx->nhs = 0;
}
