/*
 * inband.c - signals that the receiver's poll() applies.
 *
 * Why. A one-sided put+signal is two RDMA requests, the data and the flag,
 * and on a software device each costs a packet round inside the poster's
 * system call (docs/perf.md). Here the signal rides in the 32-bit
 * immediate of the put's own last WRITE: one request. The data still lands
 * one-sidedly, checked by the peer's device against the region's rkey as
 * any write; the immediate consumes a receive the peer keeps posted, and
 * the peer's poll() applies the signal when it takes that completion. An
 * immediate names the word by an index that a SEND defined before (the
 * first signal to a word, or one whose value does not fit, goes as a
 * 32-byte message: inband_wire.c), and carries an addend or the step from
 * the last value SET through that index. A signal with no write before it
 * rides on a WRITE of no bytes.
 *
 * Order. Both the immediate and the message are requests on queue pair 0,
 * where every signal goes: the responder executes them in order, after
 * placing every earlier write's data on that queue pair, and the
 * receiver's completion queue yields their completions in that order, so
 * poll() applies a signal after the data of every earlier write on queue
 * pair 0 is in memory, and signals in the order they were sent. Writes on
 * the other queue pairs are covered by the fences of post.c, unchanged: a
 * signal (and the write it rides on) waits until they completed, that is,
 * were placed. A signal is applied as an atomic release store (SET) or
 * fetch-add (ADD), after the device's data: a reader that sees it with an
 * acquire load sees the data. Every signal to a word of such a region goes
 * this way, from every peer, so no signal applied by the device (which
 * lands at once) can overtake, or race the atomicity of, one applied by
 * poll(): a region's key says once, when it is registered, which way its
 * signals go (MEP_VERBS_RKEY_INBAND).
 *
 * Who calls poll(). A signal so carried becomes visible only when the
 * receiver's poll() runs, no longer without its CPU. The core guarantees
 * that for its own waiters: one progress thread per communicator
 * (core/src/progress.c, started with it) polls every transport, the
 * request engine that reads the core's signal words runs in that thread
 * right after poll(), and mep_wait/mep_flush poll themselves and then keep
 * the progress thread awake (it sleeps at most 1 ms while a thread waits,
 * and on the event fd, which the immediate's receive completion makes
 * readable: the same wake-up as the one-sided SET's). What the core does
 * not guarantee is a GPU kernel polling host memory: the device window's
 * host part (core/src/devwin.c, cudaHostAlloc'ed, mapped, registered as
 * host memory) is read by kernels while no host thread waits, and the
 * progress thread may then sleep up to 100 ms. So a region takes signals
 * in band only if it is host memory that CUDA does not know (gpu.c asks
 * the driver), and CUDA memory never: their signals stay RDMA WRITEs and
 * atomics. Memory pinned for a GPU after its registration is not seen:
 * fuse_signals = off then (docs/verbs.md).
 *
 * Faults. A signal naming a word outside every live registration fails
 * the sender with MEP_ERR_BOUNDS, as the device fails a write outside its
 * region; a malformed message, an index never defined or a region that
 * does not take signals so fail it with MEP_ERR_PROTOCOL. Either way the
 * word is not touched and the peer is reported once.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs.h"

/* ------------------------------------------------------------ sender */

static unsigned word_hash(uint32_t rkey, uint64_t addr) {
  uint64_t h = ((addr >> 3) ^ ((uint64_t)rkey << 32)) * 0x9e3779b97f4a7c15ull;
  return (unsigned)(h >> 32) & (VERBS_WORD_HASH - 1);
}

/* The index of the word, or -1; with `add`, a new one where there is
 * room (*fresh then set). The table is at most half full: a probe ends. */
static int word_index(verbs_tx_words_t *w, uint32_t rkey, uint64_t addr,
                      int add, int *fresh) {
  *fresh = 0;
  unsigned i = word_hash(rkey, addr);
  for (;; i = (i + 1) & (VERBS_WORD_HASH - 1)) {
    if (w->slot[i] && w->rkey[i] == rkey && w->addr[i] == addr)
      return w->slot[i] - 1;
    if (w->slot[i]) continue;
    if (!add || w->n == VERBS_WORDS) return -1;
    w->rkey[i] = rkey;
    w->addr[i] = addr;
    w->slot[i] = (uint16_t)++w->n;
    w->prev[w->n - 1] = 0;
    *fresh = 1;
    return w->n - 1;
  }
}

/* What the immediate carries for this signal, if it fits. */
static int imm_value(uint64_t prev, uint64_t value, mep_signal_op_t op,
                     uint32_t *v) {
  uint64_t d = op == MEP_SIGNAL_ADD ? value : value - prev;
  if ((op == MEP_SIGNAL_SET && value < prev) || d > VERBS_IMM_VALUE_MAX)
    return 0;
  *v = (uint32_t)d;
  return 1;
}

/* The write just queued on queue pair 0 and not yet posted, which the
 * signal may ride on. */
static verbs_wr_t *rides_on(verbs_ep_t *ep) {
  verbs_qp_t *p = &ep->qps[0];
  if (p->tail == p->posted) return NULL;
  verbs_wr_t *e = &p->ring[(p->tail - 1) & p->mask];
  return (e->kind == VW_WRITE || e->kind == VW_INLINE) && !e->with_imm ? e
                                                                        : NULL;
}

static int no_memory(verbs_ep_t *ep) {
  return VERBS_ERR(ep->ctx, MEP_ERR_NOMEM, "verbs: signal to rank %d: out "
                   "of memory queueing it", ep->rank);
}

int mep__verbs_inband_signal(verbs_ep_t *ep, const verbs_rmr_t *r,
                             uint64_t raddr, uint64_t value,
                             mep_signal_op_t op) {
  verbs_qp_t *p = &ep->qps[0];
  if ((!ep->tx_words && !(ep->tx_words = calloc(1, sizeof *ep->tx_words))) ||
      mep__verbs_ring_room(p, 1))
    return no_memory(ep);
  verbs_tx_words_t *w = ep->tx_words;
  int fresh, idx = word_index(w, r->rkey, raddr, 0, &fresh);
  uint32_t v;
  if (idx >= 0 && imm_value(w->prev[idx], value, op, &v)) {
    verbs_wr_t *e = rides_on(ep);
    if (mep__verbs_fence_at(ep, e ? p->tail - 1 : p->tail))
      return no_memory(ep);
    if (!e) {
      e = mep__verbs_append(p);
      e->kind = VW_IMM;
      e->raddr = raddr;
      e->rkey = r->rkey;
    } else {
      e->with_imm = 1;
    }
    e->imm = mep__verbs_imm_encode(op, (unsigned)idx, v);
    if (op == MEP_SIGNAL_SET) w->prev[idx] = value;
    return 0;
  }
  /* a message, which gives the word an index if it has none and one is
   * left */
  if (mep__verbs_fence_at(ep, p->tail)) return no_memory(ep);
  idx = word_index(w, r->rkey, raddr, 1, &fresh);
  verbs_wr_t *e = mep__verbs_append(p);
  e->kind = VW_SIG;
  e->sig_op = (uint8_t)op;
  e->index = idx >= 0 ? (uint16_t)idx : VERBS_NO_INDEX;
  e->raddr = raddr;
  e->rkey = r->rkey;
  e->value = value;
  if (idx >= 0 && op == MEP_SIGNAL_SET) w->prev[idx] = value;
  return 0;
}

void mep__verbs_inband_msg(verbs_ep_t *ep, const verbs_wr_t *e, uint64_t s,
                           struct ibv_sge *sge) {
  uint64_t depth = (uint64_t)ep->ctx->cfg.sq_depth;
  uint8_t *buf = ep->msg_slots + s % depth * VERBS_SIGMSG_LEN;
  mep__verbs_sigmsg_t m = {.op = e->sig_op, .index = e->index,
                           .rkey = e->rkey, .raddr = e->raddr,
                           .value = e->value};
  mep__verbs_sigmsg_encode(buf, &m);
  *sge = (struct ibv_sge){.addr = (uint64_t)(uintptr_t)buf,
                          .length = VERBS_SIGMSG_LEN,
                          .lkey = ep->msg_mr->lkey};
}

/* ---------------------------------------------------------- receiver */

/* mr_mu held: the live registration that holds the 8 bytes at addr under
 * that rkey, or NULL. */
static verbs_mr_t *find_word(verbs_ctx_t *ctx, uint32_t rkey, uint64_t addr) {
  for (verbs_mr_t *mr = ctx->mrs; mr; mr = mr->next) {
    if (!mr->mr || mr->mr->rkey != rkey) continue;
    uint64_t base = (uint64_t)(uintptr_t)mr->base;
    return mr->len >= 8 && addr >= base && addr - base <= mr->len - 8 ? mr
                                                                        : NULL;
  }
  return NULL;
}

static int refuse(verbs_ep_t *ep, int status, const char *fmt, ...)
    MEP_PRINTF(3, 4);
static int refuse(verbs_ep_t *ep, int status, const char *fmt, ...) {
  char why[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  VERBS_LOG(ep->ctx, MEP_LOG_ERROR, "verbs: rank %d: %s from rank %d; the "
            "peer is reported failed", ep->ctx->rank, why, ep->rank);
  return status;
}

/* mr_mu held: applies op to the word at addr of mr, after the data the
 * device placed before the completion that brought it. */
static void apply(uint64_t addr, int op, uint64_t value) {
  uint64_t *word = (uint64_t *)(uintptr_t)addr;
  if (op == MEP_SIGNAL_SET)
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
  else
    __atomic_fetch_add(word, value, __ATOMIC_RELEASE);
}

/* mr_mu held: why a word cannot be written, as a status (0: it can). */
static int word_status(verbs_ep_t *ep, const verbs_mr_t *mr, uint32_t rkey,
                       uint64_t addr) {
  if (!mr)
    return refuse(ep, MEP_ERR_BOUNDS, "a signal to the word at %#" PRIx64
                  " (rkey %#x), outside every registered region", addr,
                  rkey);
  if (!mr->inband)
    return refuse(ep, MEP_ERR_PROTOCOL, "a signal in band to the word at "
                  "%#" PRIx64 ", in a region whose signals land by RDMA",
                  addr);
  return 0;
}

static int by_index(verbs_ep_t *ep, int op, unsigned i, uint32_t v) {
  verbs_ctx_t *ctx = ep->ctx;
  verbs_rx_word_t *w = ep->rx_words ? &ep->rx_words[i] : NULL;
  if (!w || !w->defined)
    return refuse(ep, MEP_ERR_PROTOCOL, "a signal to word %u, never "
                  "defined,", i);
  uint64_t value = op == MEP_SIGNAL_SET ? w->prev + v : v;
  pthread_mutex_lock(&ctx->mr_mu);
  if (!w->mr || w->gen != ctx->mr_gen) {
    w->mr = find_word(ctx, w->rkey, w->addr);
    w->gen = ctx->mr_gen;
  }
  int st = word_status(ep, w->mr, w->rkey, w->addr);
  if (!st) apply(w->addr, op, value);
  pthread_mutex_unlock(&ctx->mr_mu);
  if (op == MEP_SIGNAL_SET) w->prev = value;
  return st;
}

static int by_message(verbs_ep_t *ep, const mep__verbs_sigmsg_t *m) {
  verbs_ctx_t *ctx = ep->ctx;
  verbs_rx_word_t *w = NULL;
  if (m->index != VERBS_NO_INDEX) {
    if (!ep->rx_words &&
        !(ep->rx_words = calloc(VERBS_WORDS, sizeof *ep->rx_words)))
      return refuse(ep, MEP_ERR_NOMEM, "out of memory for the signal words");
    w = &ep->rx_words[m->index];
    if (!w->defined || w->rkey != m->rkey || w->addr != m->raddr)
      *w = (verbs_rx_word_t){.addr = m->raddr, .rkey = m->rkey,
                             .defined = 1};
  }
  pthread_mutex_lock(&ctx->mr_mu);
  verbs_mr_t *mr = find_word(ctx, m->rkey, m->raddr);
  int st = word_status(ep, mr, m->rkey, m->raddr);
  if (!st) apply(m->raddr, m->op, m->value);
  if (w) {
    w->mr = mr;
    w->gen = ctx->mr_gen;
  }
  pthread_mutex_unlock(&ctx->mr_mu);
  if (w && m->op == MEP_SIGNAL_SET) w->prev = m->value;
  return st;
}

int mep__verbs_inband_recv(verbs_ep_t *ep, const struct ibv_wc *wc) {
  if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    int op;
    unsigned i;
    uint32_t v;
    /* without the signal bit: a one-sided SET's wake-up, nothing to do */
    if (!(wc->wc_flags & IBV_WC_WITH_IMM) ||
        !mep__verbs_imm_decode(ntohl(wc->imm_data), &op, &i, &v))
      return 0;
    return by_index(ep, op, i, v);
  }
  uint64_t slot = wc->wr_id & ~VERBS_RECV_BIT;
  if (wc->opcode != IBV_WC_RECV || slot >= (uint64_t)ep->ctx->cfg.sq_depth)
    return refuse(ep, MEP_ERR_PROTOCOL, "a receive completion of opcode "
                  "%d", (int)wc->opcode);
  mep__verbs_sigmsg_t m;
  char why[160];
  if (mep__verbs_sigmsg_decode(ep->rx_bufs + slot * VERBS_SIGMSG_LEN,
                               wc->byte_len, &m, why, sizeof why))
    return refuse(ep, MEP_ERR_PROTOCOL, "%s", why);
  return by_message(ep, &m);
}

/* ------------------------------------------------------------ memory */

int mep__verbs_inband_alloc(verbs_ep_t *ep) {
  verbs_ctx_t *ctx = ep->ctx;
  size_t n = (size_t)ctx->cfg.sq_depth * VERBS_SIGMSG_LEN;
  ep->rx_bufs = calloc(1, n);
  ep->msg_slots = calloc(1, n);
  if (!ep->rx_bufs || !ep->msg_slots) return -1;
  ep->rx_mr = ibv_reg_mr(ctx->dev.pd, ep->rx_bufs, n, IBV_ACCESS_LOCAL_WRITE);
  ep->msg_mr = ibv_reg_mr(ctx->dev.pd, ep->msg_slots, n,
                          IBV_ACCESS_LOCAL_WRITE);
  return ep->rx_mr && ep->msg_mr ? 0 : -1;
}

void mep__verbs_inband_free(verbs_ep_t *ep) {
  if (ep->rx_mr) ibv_dereg_mr(ep->rx_mr);
  if (ep->msg_mr) ibv_dereg_mr(ep->msg_mr);
  ep->rx_mr = ep->msg_mr = NULL;
  free(ep->rx_bufs);
  free(ep->msg_slots);
  free(ep->tx_words);
  free(ep->rx_words);
  ep->rx_bufs = ep->msg_slots = NULL;
  ep->tx_words = NULL;
  ep->rx_words = NULL;
}
