/* ep.c - connect() and close(): two queue pairs per peer (the host's and
 * the kernels'), on the model or the NIC, their numbers exchanged through
 * the verbs plugin's bootstrap (handshake.h), whose socket stays open as
 * the liveness channel. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ibgda.h"

/* Once the peer's numbers are known: a NIC's queue pairs go to RTS; the
 * model's need nothing more than the target (set before). */
static int up_cb(void *arg, const mep__rdma_qpinfo_t *theirs) {
  ibgda_ep_t *ep = arg;
  ibgda_ctx_t *ctx = ep->ctx;
  if (theirs->nqp != 2)
    return IBGDA_ERR(ctx, MEP_ERR_PROTOCOL, "ibgda: rank %d: rank %d "
                     "offers %u queue pairs (this version pairs 2: the "
                     "host's and the kernels')", ctx->rank, ep->rank,
                     theirs->nqp);
  ep->peer_qpn = theirs->qpn[0];
  ep->peer_kqpn = theirs->qpn[1];
  for (int i = 0; ctx->hw && i < 2; i++) {
    int rc = mep__ibgda_hw_qp_up(ctx, ep->hw[i], ep->rank, theirs, i);
    if (rc) return rc;
  }
  return 0;
}

static void info(const ibgda_ep_t *ep, mep__rdma_qpinfo_t *q) {
  const ibgda_ctx_t *ctx = ep->ctx;
  memset(q, 0, sizeof *q);
  q->nqp = 2;
  q->qpn[0] = ep->qp->qpn;
  q->qpn[1] = ep->kqp->qpn;
  if (!ctx->hw) {
    q->port = 1;
    q->link_layer = 2; /* the model has no fabric; the fields are valid */
    q->mtu = 5;
    return;
  }
  const mep__rdma_dev_t *d = &ctx->dev;
  memcpy(q->gid, d->gid, 16);
  q->lid = d->lid;
  q->port = d->port;
  q->link_layer = d->link_layer;
  q->mtu = d->mtu;
  q->psn[0] = ep->hw[0]->psn;
  q->psn[1] = ep->hw[1]->psn;
}

/* Releases the host's queue pair. */
static void host_qp_release(ibgda_ep_t *ep) {
  mep__ibgda_hw_qp_destroy(ep->hw[0]);
  ep->hw[0] = NULL;
  if (!ep->ctx->hw && ep->qp) mep__m5_qp_destroy(&ep->ctx->model, ep->qp);
  ep->qp = NULL;
  ep->ctr = NULL;
}

/* Releases both queue pairs (the kernels' GPU mapping first). */
static void qp_release(ibgda_ep_t *ep) {
  mep__ibgda_gpu_detach(ep->ctx, &ep->kgpu);
  mep__ibgda_hw_qp_destroy(ep->hw[1]);
  ep->hw[1] = NULL;
  if (!ep->ctx->hw && ep->kqp) mep__m5_qp_destroy(&ep->ctx->model, ep->kqp);
  ep->kqp = NULL;
  host_qp_release(ep);
}

/* The two queue pairs: the NIC's, or the model's aimed at the peer. */
static int qp_make(ibgda_ctx_t *ctx, ibgda_ep_t *ep, const ibgda_addr_t *a) {
  if (ctx->hw) {
    int rc = mep__ibgda_hw_qp_create(ctx, &ep->hw[0]);
    if (!rc) rc = mep__ibgda_hw_qp_create(ctx, &ep->hw[1]);
    if (rc) return rc;
    ep->qp = &ep->hw[0]->view;
    ep->kqp = &ep->hw[1]->view;
    return 0;
  }
  uint32_t n = ctx->cfg.sq_bbs;
  int rc = mep__m5_qp_create(&ctx->model, n, n, &ep->qp);
  if (!rc) rc = mep__m5_qp_create(&ctx->model, n, n, &ep->kqp);
  if (rc)
    return IBGDA_ERR(ctx, rc, "ibgda: rank %d: no memory for the queue "
                     "pairs to rank %d", ctx->rank, ep->rank);
  mep__m5_qp_target(&ctx->model, ep->qp, ep->rank, (pid_t)a->pid, a->keys);
  mep__m5_qp_target(&ctx->model, ep->kqp, ep->rank, (pid_t)a->pid, a->keys);
  return 0;
}

void mep__ibgda_ep_free(ibgda_ep_t *ep) {
  if (!ep) return;
  qp_release(ep);
  if (ep->link_fd >= 0) close(ep->link_fd);
  free(ep->recs);
  pthread_mutex_destroy(&ep->mu);
  free(ep);
}

static int ep_new(ibgda_ctx_t *ctx, int rank, const ibgda_addr_t *a,
                  ibgda_ep_t **out) {
  ibgda_ep_t *ep = calloc(1, sizeof *ep);
  if (!ep) return MEP_ERR_NOMEM;
  ep->ctx = ctx;
  ep->rank = rank;
  ep->inc = a->boot.incarnation;
  ep->link_fd = -1;
  pthread_mutex_init(&ep->mu, NULL);
  int rc = qp_make(ctx, ep, a);
  /* a record per building block of the ring the host's queue pair got */
  if (!rc && !(ep->recs = calloc(ep->qp->sq_bbs, sizeof *ep->recs)))
    rc = IBGDA_ERR(ctx, MEP_ERR_NOMEM, "ibgda: rank %d: out of memory",
                   ctx->rank);
  if (rc) {
    mep__ibgda_ep_free(ep);
    return rc;
  }
  ep->ctr = ep->qp->user;
  *out = ep;
  return 0;
}

int mep__ibgda_connect(mep_tp_ctx_t *ctxp, int peer, const void *blob,
                       size_t len, mep_tp_ep_t **out) {
  ibgda_ctx_t *ctx = ctxp;
  if (!ctx || !out) return MEP_ERR_INVALID;
  if (peer < 0 || peer >= ctx->size || peer == ctx->rank)
    return IBGDA_ERR(ctx, MEP_ERR_INVALID, "ibgda: connect from rank %d to "
                     "rank %d in a group of %d", ctx->rank, peer, ctx->size);
  ibgda_addr_t a;
  char why[160];
  if (mep__ibgda_addr_decode(blob, len, &a, why, sizeof why))
    return IBGDA_ERR(ctx, MEP_ERR_PROTOCOL, "ibgda: rank %d: connect to "
                     "rank %d: %s", ctx->rank, peer, why);
  pthread_mutex_lock(&ctx->mu);
  ibgda_ep_t *old = ctx->peers[peer];
  if (old && !old->retired) {
    int same = !old->dead && old->inc == a.boot.incarnation;
    pthread_mutex_unlock(&ctx->mu);
    if (same) return *out = old, 0;
    return IBGDA_ERR(ctx, old->dead ? MEP_ERR_PEER_FAILED : MEP_ERR_INVALID,
                     "ibgda: rank %d: connect to rank %d: the endpoint of "
                     "its earlier connection %s; close it first", ctx->rank,
                     peer, old->dead ? "failed and is not closed yet"
                                     : "(another process) is still open");
  }
  /* the tombstone of a closed endpoint goes now: the core never uses a
   * closed endpoint again */
  ctx->peers[peer] = NULL;
  pthread_mutex_unlock(&ctx->mu);
  mep__ibgda_ep_free(old);

  ibgda_ep_t *ep = NULL;
  int rc = ep_new(ctx, peer, &a, &ep);
  if (rc) return rc;
  mep__rdma_qpinfo_t mine;
  info(ep, &mine);
  int64_t deadline = mep__rdma_now_ms() + ctx->timeout_ms;
  rc = mep__rdma_boot_connect(&ctx->boot, peer, &a.boot, &mine, up_cb, ep,
                              deadline, &ep->link_fd);
  if (rc) {
    mep__ibgda_ep_free(ep);
    return rc;
  }
  pthread_mutex_lock(&ctx->mu);
  ctx->peers[peer] = ep;
  pthread_mutex_unlock(&ctx->mu);
  mep__rdma_boot_adopted(&ctx->boot, &ep->link_fd); /* ctx->peers has it */
  IBGDA_LOG(ctx, MEP_LOG_DEBUG, "ibgda: rank %d connected to rank %d: QPs "
            "0x%x -> 0x%x (host), 0x%x -> 0x%x (kernels; %s)", ctx->rank,
            peer, ep->qp->qpn, ep->peer_qpn, ep->kqp->qpn, ep->peer_kqpn,
            ctx->hw ? ctx->dev.name : "software model");
  *out = ep;
  return 0;
}

int mep__ibgda_close(mep_tp_ep_t *epp) {
  ibgda_ep_t *ep = epp;
  if (!ep) return 0;
  ibgda_ctx_t *ctx = ep->ctx;
  pthread_mutex_lock(&ep->mu);
  if (ep->retired) {
    pthread_mutex_unlock(&ep->mu);
    return 0;
  }
  if (!ep->dead) {
    int calm = mep__ibgda_settle(ep, IBGDA_BYE_MS);
    /* a peer that closed first said goodbye already, and its socket may
     * be gone: nothing to tell it */
    int s = mep__rdma_link_read(ep->link_fd, &ep->link_rx,
                                (uint32_t)ep->rank, (uint32_t)ctx->rank);
    if (s == MEP_RDMA_LINK_BYE)
      IBGDA_LOG(ctx, MEP_LOG_DEBUG, "ibgda: rank %d closes after rank %d "
                "did", ctx->rank, ep->rank);
    else if (!(calm && s == MEP_RDMA_LINK_QUIET &&
               mep__rdma_link_bye(ep->link_fd, (uint32_t)ctx->rank,
                                  (uint32_t)ep->rank, IBGDA_BYE_MS) == 0))
      IBGDA_LOG(ctx, MEP_LOG_INFO, "ibgda: rank %d closes its connection "
                "to rank %d %s", ctx->rank, ep->rank,
                !calm ? "with requests in flight"
                      : s != MEP_RDMA_LINK_QUIET ? "after the peer's end"
                                                 : "without a goodbye");
  }
  mep__ibgda_ep_fail(ep, MEP_ERR_CLOSED, 0);
  /* release what it holds; the struct stays as the rank's tombstone. The
   * kernels' queue pair and its GPU mapping stay with it: a device window
   * made before the close still names them, and a kernel in flight, or
   * the next one's stage gate (mep_dev_quiet), reads their counters. The
   * core closes a dropped rank's endpoint while the survivors' kernels
   * run; freeing them then is the likely cause of the illegal memory
   * accesses seen there (docs/perf.md). They go with the tombstone. */
  host_qp_release(ep);
  /* the number goes before the socket: a fork meanwhile (fork_watch.h,
   * which does not hold ep->mu) never finds one closed and reused */
  int fd = ep->link_fd;
  ep->link_fd = -1;
  if (fd >= 0) close(fd);
  ep->retired = 1;
  pthread_mutex_unlock(&ep->mu);
  return 0;
}
