/*
 * send.c - write() and signal(): messages queued per socket and handed to
 * the kernel straight from registered memory (sendmsg with an iovec).
 *
 * A message is sent from the calling thread at once when its socket's
 * queue was empty; what the kernel does not take stays queued and poll()
 * finishes it on EPOLLOUT, which is armed only while a queue is non-empty.
 * A write's token completes once its last byte went to the kernel.
 * Where the plugin has a sender thread, a queue of TCP_TX_HANDOFF bytes or
 * more, or one the kernel did not take at once, is handed to it instead
 * (sender.c), and EPOLLOUT is never armed.
 *
 * A small write (TCP_LAZY_WRITE) is deferred instead: it waits in its
 * queue, marked lazy, so that the signal that usually follows leaves with
 * it in one sendmsg, one TCP segment, and the receiver reads both at once.
 * The peer goes on the context's lazy list, and the next poll() sends
 * whatever a signal did not; close() sends it before its goodbye.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "tcp.h"

static void item_done(tcp_peer_t *p, tcp_item_t *it, int status, int report) {
  if (!it->is_write) return;
  if (!it->op) {
    if (report) mep__tcp_cq_push(p->ctx, it->token, status, p->rank);
    return;
  }
  tcp_op_t *op = it->op;
  if (status < 0 && op->status == 0) op->status = status;
  if (--op->left == 0) {
    if (report) mep__tcp_cq_push(p->ctx, op->token, op->status, p->rank);
    free(op);
  }
}

static uint64_t item_total(const tcp_item_t *it) {
  return it->hdr_len + it->payload_len;
}

/* Fills iov from the queue head; returns the count. */
int mep__tcp_gather(const tcp_sock_t *s, struct iovec *iov) {
  int n = 0;
  for (const tcp_item_t *it = s->head; it && n + 2 <= TCP_MAX_IOV;
       it = it->next) {
    if (it->sent < it->hdr_len)
      iov[n++] = (struct iovec){(void *)(it->hdr + it->sent),
                                it->hdr_len - it->sent};
    uint64_t poff = it->sent > it->hdr_len ? it->sent - it->hdr_len : 0;
    if (poff < it->payload_len)
      iov[n++] = (struct iovec){(void *)(it->payload + poff),
                                (size_t)(it->payload_len - poff)};
  }
  return n;
}

/* Retires the first `n` sent bytes of the queue. */
void mep__tcp_advance(tcp_sock_t *s, uint64_t n) {
  s->queued -= n;
  while (n) {
    tcp_item_t *it = s->head;
    uint64_t take = item_total(it) - it->sent;
    if (take > n) take = n;
    it->sent += take;
    n -= take;
    if (it->sent < item_total(it)) break;
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    item_done(s->peer, it, 0, 1);
    free(it);
  }
}

/* peer->mu held. Sends until the queue is empty or the kernel is full.
 * 0, or a negative errno when the socket broke. A socket that broke
 * before sends nothing: its queue waits for the peer's fate. */
static int flush(tcp_sock_t *s) {
  struct iovec iov[TCP_MAX_IOV];
  while (s->head && !s->tx_err) {
    struct msghdr m = {.msg_iov = iov,
                       .msg_iovlen = (size_t)mep__tcp_gather(s, iov)};
    ssize_t n = sendmsg(s->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -errno;
    }
    mep__tcp_advance(s, (uint64_t)n);
  }
  return 0;
}

static void arm_out(tcp_sock_t *s) {
  int want = s->head != NULL && !s->tx_err;
  if (want == s->out_armed) return;
  s->out_armed = want;
  if (mep__tcp_sock_watch(s)) s->out_armed = !want;
}

/* peer->mu held. The connection broke, but what the peer sent before may
 * end with its BYE (it closed in order and reset the connection because
 * it had not read what we sent). So the peer is not failed here: the
 * socket stops sending and is shut down, and its receive side reads up to
 * the end and decides (recv.c). Its queue completes with the peer's fate. */
void mep__tcp_broke(tcp_sock_t *s, int err) {
  tcp_peer_t *p = s->peer;
  TCP_LOG(p->ctx, MEP_LOG_DEBUG,
          "tcp: sending to rank %d on socket %u failed: %s; reading what it "
          "sent before to tell a failure from a close", p->rank, s->index,
          strerror(err));
  s->tx_err = err ? err : EIO;
  arm_out(s);
  shutdown(s->fd, SHUT_RDWR);
}

/* peer->mu held: sends what s's queue holds now, deferred writes too, or
 * hands it to the sender thread. */
static void kick(tcp_sock_t *s) {
  s->lazy = 0;
  if (mep__tcp_pool_owned(&s->peer->ctx->tx, s))
    return; /* the sender thread sends it all */
  if (mep__tcp_tx_wants(s) && s->queued >= TCP_TX_HANDOFF) {
    mep__tcp_pool_handoff(&s->peer->ctx->tx, s);
    return;
  }
  int rc = flush(s);
  if (rc < 0)
    mep__tcp_broke(s, -rc);
  else if (mep__tcp_tx_wants(s))
    mep__tcp_pool_handoff(&s->peer->ctx->tx, s);
  else
    arm_out(s);
}

/* peer->mu held: puts p on the list of peers poll() must flush. */
static void list_lazy(tcp_peer_t *p) {
  if (p->lazy_listed) return;
  tcp_ctx_t *ctx = p->ctx;
  p->lazy_listed = 1;
  pthread_mutex_lock(&ctx->lazy_mu);
  p->lazy_next = ctx->lazy_head;
  __atomic_store_n(&ctx->lazy_head, p, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&ctx->lazy_mu);
}

void mep__tcp_flush_lazy_peer(tcp_peer_t *p) {
  for (int i = 0; i < p->ctx->cfg.nsock; i++) {
    tcp_sock_t *s = &p->socks[i];
    if (!s->lazy) continue;
    if (p->dead)
      s->lazy = 0;
    else
      kick(s);
  }
}

void mep__tcp_flush_lazy(tcp_ctx_t *ctx) {
  if (!__atomic_load_n(&ctx->lazy_head, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&ctx->lazy_mu);
  tcp_peer_t *p = ctx->lazy_head;
  __atomic_store_n(&ctx->lazy_head, NULL, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&ctx->lazy_mu);
  /* lazy_next is written only by list_lazy, under the peer's mu, and
   * only while the peer is not listed: read it before unlisting */
  while (p) {
    pthread_mutex_lock(&p->mu);
    tcp_peer_t *next = p->lazy_next;
    p->lazy_next = NULL;
    p->lazy_listed = 0;
    mep__tcp_flush_lazy_peer(p);
    pthread_mutex_unlock(&p->mu);
    p = next;
  }
}

/* peer->mu held: appends, and sends at once (with whatever was deferred
 * before it) unless the queue waits for room in the kernel. */
static void submit(tcp_sock_t *s, tcp_item_t *it) {
  int go = s->head == NULL || s->lazy;
  it->next = NULL;
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  s->queued += item_total(it);
  s->tx_seq++;
  if (go) kick(s);
}

void mep__tcp_on_writable(tcp_sock_t *s) {
  tcp_peer_t *p = s->peer;
  pthread_mutex_lock(&p->mu);
  if (!p->dead && !mep__tcp_pool_owned(&p->ctx->tx, s)) {
    int rc = flush(s);
    if (rc < 0)
      mep__tcp_broke(s, -rc);
    else
      arm_out(s);
  }
  pthread_mutex_unlock(&p->mu);
}

void mep__tcp_drop_sock(tcp_sock_t *s, int status, int report) {
  while (s->head) {
    tcp_item_t *it = s->head;
    s->head = it->next;
    item_done(s->peer, it, status, report);
    free(it);
  }
  s->tail = NULL;
  s->queued = 0;
  s->lazy = 0;
}

void mep__tcp_drop_queues(tcp_peer_t *p, int status, int report) {
  for (int i = 0; i < p->ctx->cfg.nsock; i++)
    if (!mep__tcp_pool_detach(&p->ctx->tx, &p->socks[i]))
      mep__tcp_drop_sock(&p->socks[i], status, report);
}

/* peer->mu held: 0 if messages may be sent to p. */
static int usable(tcp_peer_t *p) {
  tcp_ctx_t *ctx = p->ctx;
  if (p->dead && p->dead_status != MEP_ERR_CLOSED)
    return TCP_ERR(ctx, MEP_ERR_PEER_FAILED,
                   "tcp: rank %d has failed; nothing more is sent to it",
                   p->rank);
  if (p->dead && !p->closing)
    return TCP_ERR(ctx, MEP_ERR_CLOSED,
                   "tcp: the endpoint of rank %d is closed", p->rank);
  if (p->closing)
    return TCP_ERR(ctx, MEP_ERR_CLOSED,
                   "tcp: rank %d %s its connections in order; nothing more "
                   "is sent to it",
                   p->rank, p->dead ? "closed" : "is closing");
  if (p->nup < ctx->cfg.nsock)
    return TCP_ERR(ctx, MEP_ERR_INVALID,
                   "tcp: rank %d is not connected yet", p->rank);
  return 0;
}

static int check_args(tcp_peer_t *p, tcp_rmr_t *r, const char *what) {
  if (!r)
    return TCP_ERR(p->ctx, MEP_ERR_INVALID,
                   "tcp: %s to rank %d: NULL remote region", what, p->rank);
  if (r->peer != p)
    return TCP_ERR(p->ctx, MEP_ERR_INVALID,
                   "tcp: %s to rank %d names a region imported from rank %d",
                   what, p->rank, r->peer->rank);
  return 0;
}

/* The socket of an unstriped write of len bytes: a short one goes on
 * socket 0, where the signal that usually follows it travels (and would
 * wait for it anyway), so both leave in one segment (TCP_LAZY_WRITE);
 * a longer one on the socket with the least queued, ties taken in turn. */
static tcp_sock_t *pick(tcp_peer_t *p, uint64_t len) {
  if (len <= TCP_LAZY_WRITE) return &p->socks[0];
  int k = p->ctx->cfg.nsock, best = (int)(p->rr++ % (uint32_t)k);
  for (int i = 0; i < k; i++)
    if (p->socks[i].queued < p->socks[best].queued) best = i;
  return &p->socks[best];
}

static tcp_item_t *new_write(const tcp_mr_t *mr, uint64_t loff,
                             const tcp_rmr_t *r, uint64_t roff, uint64_t len,
                             uint64_t token, tcp_op_t *op) {
  tcp_item_t *it = malloc(sizeof *it);
  if (!it) return NULL;
  *it = (tcp_item_t){.payload = len ? mr->base + loff : NULL,
                     .payload_len = len,
                     .op = op, .token = token, .is_write = 1,
                     .hdr_len = MEP_TCP_HDR_LEN};
  mep__tcp_msg_t m = {.type = MEP_TCP_MSG_WRITE, .region = r->region,
                      .offset = roff, .len_or_value = len};
  mep__tcp_msg_encode(it->hdr, &m);
  return it;
}

static void set_seq(tcp_item_t *it, uint64_t seq) {
  mep__tcp_put64(it->hdr + 24, seq);
}

int mep__tcp_write(mep_tp_ep_t *ep, mep_tp_mr_t *mrp, uint64_t loff,
                   mep_tp_rmr_t *rmrp, uint64_t roff, uint64_t len,
                   uint64_t token) {
  tcp_peer_t *p = ep;
  tcp_mr_t *mr = mrp;
  tcp_rmr_t *r = rmrp;
  if (!p) return MEP_ERR_INVALID;
  tcp_ctx_t *ctx = p->ctx;
  int rc = check_args(p, r, "write");
  if (rc) return rc;
  if (!mr || mr->ctx != ctx)
    return TCP_ERR(ctx, MEP_ERR_INVALID,
                   "tcp: write to rank %d: the local region is not one of "
                   "this context", p->rank);
  if (loff > mr->len || len > mr->len - loff)
    return TCP_ERR(ctx, MEP_ERR_BOUNDS,
                   "tcp: write of %" PRIu64 " bytes from offset %" PRIu64
                   " of local region %" PRIu32 " (%" PRIu64
                   " bytes): out of bounds", len, loff, mr->id, mr->len);
  if (roff > r->len || len > r->len - roff)
    return TCP_ERR(ctx, MEP_ERR_BOUNDS,
                   "tcp: write of %" PRIu64 " bytes to offset %" PRIu64
                   " of rank %d's region %" PRIu32 " (%" PRIu64
                   " bytes): out of bounds", len, roff, p->rank, r->region,
                   r->len);

  uint32_t k = (uint32_t)ctx->cfg.nsock, n = 1;
  if (k > 1 && len >= 2ull * TCP_STRIPE_MIN)
    n = len / TCP_STRIPE_MIN < k ? (uint32_t)(len / TCP_STRIPE_MIN) : k;
  tcp_op_t *op = NULL;
  tcp_item_t *items[MEP_TCP_MAX_SOCKS] = {0};
  if (n > 1 && !(op = malloc(sizeof *op))) goto nomem;
  if (op) *op = (tcp_op_t){.token = token, .left = (int)n};
  uint64_t stripe = len / n;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t off = i * stripe, sl = i + 1 == n ? len - off : stripe;
    if (!(items[i] = new_write(mr, loff + off, r, roff + off, sl, token, op)))
      goto nomem;
  }

  pthread_mutex_lock(&p->mu);
  if ((rc = usable(p))) {
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < n; i++) free(items[i]);
    free(op);
    return rc;
  }
  if (len == 0) {
    /* nothing to move; complete in order with nothing, after what was
     * deferred before */
    free(items[0]);
    mep__tcp_flush_lazy_peer(p);
    mep__tcp_cq_push(ctx, token, 0, p->rank);
  } else {
    uint32_t start = n == 1 ? pick(p, len)->index : p->rr++ % k;
    /* Queue every stripe before sending any: should the socket break
     * while sending, every stripe is then failed through the queues and
     * the token completes exactly once. */
    int was_empty[MEP_TCP_MAX_SOCKS];
    for (uint32_t i = 0; i < n; i++) {
      tcp_sock_t *s = &p->socks[(start + i) % k];
      was_empty[i] = s->head == NULL || s->lazy;
      set_seq(items[i], s->tx_seq++);
      items[i]->next = NULL;
      if (s->tail)
        s->tail->next = items[i];
      else
        s->head = items[i];
      s->tail = items[i];
      s->queued += item_total(items[i]);
    }
    for (uint32_t i = 0; i < n && !p->dead; i++) {
      tcp_sock_t *s = &p->socks[(start + i) % k];
      if (!was_empty[i]) continue;
      if (n == 1 && len <= TCP_LAZY_WRITE && !s->tx_err &&
          s->queued <= TCP_LAZY_MAX) {
        s->lazy = 1;
        list_lazy(p);
        continue;
      }
      kick(s);
    }
  }
  pthread_mutex_unlock(&p->mu);
  return 0;

nomem:
  for (uint32_t i = 0; i < n; i++) free(items[i]);
  free(op);
  return TCP_ERR(ctx, MEP_ERR_NOMEM, "tcp: write of %" PRIu64 " bytes to "
                 "rank %d: out of memory", len, p->rank);
}

int mep__tcp_signal(mep_tp_ep_t *ep, mep_tp_rmr_t *rmrp, uint64_t roff,
                    uint64_t value, mep_signal_op_t op) {
  tcp_peer_t *p = ep;
  tcp_rmr_t *r = rmrp;
  if (!p) return MEP_ERR_INVALID;
  tcp_ctx_t *ctx = p->ctx;
  int rc = check_args(p, r, "signal");
  if (rc) return rc;
  if (op != MEP_SIGNAL_SET && op != MEP_SIGNAL_ADD)
    return TCP_ERR(ctx, MEP_ERR_INVALID, "tcp: signal to rank %d: unknown "
                   "operation %d", p->rank, (int)op);
  if (roff % 8)
    return TCP_ERR(ctx, MEP_ERR_INVALID, "tcp: signal to rank %d at offset "
                   "%" PRIu64 ": not 8-byte aligned", p->rank, roff);
  if (roff > r->len || 8 > r->len - roff)
    return TCP_ERR(ctx, MEP_ERR_BOUNDS, "tcp: signal to the word at offset "
                   "%" PRIu64 " of rank %d's region %" PRIu32 " (%" PRIu64
                   " bytes): out of bounds", roff, p->rank, r->region, r->len);
  tcp_item_t *it = malloc(sizeof *it);
  if (!it)
    return TCP_ERR(ctx, MEP_ERR_NOMEM, "tcp: signal to rank %d: out of "
                   "memory", p->rank);
  uint32_t k = (uint32_t)ctx->cfg.nsock;
  *it = (tcp_item_t){.hdr_len = MEP_TCP_HDR_LEN + 8 * k};

  pthread_mutex_lock(&p->mu);
  if ((rc = usable(p))) {
    pthread_mutex_unlock(&p->mu);
    free(it);
    return rc;
  }
  /* Signals all travel on socket 0 so they arrive, and apply, in the
   * order they were issued; each carries how many messages every socket
   * had queued before it, and waits on the receiver until those arrived. */
  tcp_sock_t *s0 = &p->socks[0];
  mep__tcp_msg_t m = {.type = MEP_TCP_MSG_SIGNAL,
                      .op = op == MEP_SIGNAL_ADD ? MEP_TCP_OP_ADD
                                                 : MEP_TCP_OP_SET,
                      .count = (uint16_t)k, .region = r->region,
                      .offset = roff, .len_or_value = value,
                      .seq = s0->tx_seq};
  mep__tcp_msg_encode(it->hdr, &m);
  for (uint32_t i = 0; i < k; i++)
    mep__tcp_put64(it->hdr + MEP_TCP_HDR_LEN + 8 * i, p->socks[i].tx_seq);
  /* the writes the signal counts leave now; those deferred on socket 0
   * leave with it, in the same sendmsg */
  for (uint32_t i = 1; i < k; i++)
    if (p->socks[i].lazy) kick(&p->socks[i]);
  submit(s0, it);
  pthread_mutex_unlock(&p->mu);
  return 0;
}
