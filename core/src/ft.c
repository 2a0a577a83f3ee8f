/* ft.c - the control channel, failure detection and agreement (ft.h).
 * Runs as a pass of the request engine after the request lists (it
 * registers itself, req.h); asks the collective engine, which sits above
 * it, only through the callback the engine registers
 * (comm->coll_done_from); claims decisions through ft_claim.c and adopts
 * what they settle on. */
#include "ft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "error.h"
#include "ft_state.h"
#include "log.h"
#include "region.h"
#include "req.h"

#define CTL_MAGIC 0x4c544346u /* "FCTL" */
#define CTL_AGREE 1u

/* ------------------------------------------------------------ geometry */

static size_t slot_bytes(int n) {
  return (sizeof(mep__ctl_hdr_t) + 2 * (size_t)n + 63) & ~(size_t)63;
}

static uint8_t *in_slot(const mep__ft_t *ft, int from, uint64_t seq) {
  return ft->in + ((size_t)from * 2 + (seq & 1)) * ft->slot;
}

static size_t slot_off(const mep__ft_t *ft, int peer, uint64_t seq) {
  return ((size_t)peer * 2 + (seq & 1)) * ft->slot;
}

static uint64_t checksum(const uint8_t *p, size_t len) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* ---------------------------------------------------------- set-up */

static void publish_active(mep__ft_t *ft, int n) {
  pthread_mutex_lock(&ft->mu);
  for (int p = 0; p < n; p++)
    __atomic_store_n(&ft->arr[p], (int32_t)ft->act[p], __ATOMIC_RELEASE);
  ft->pub_epoch = ft->epoch;
  pthread_mutex_unlock(&ft->mu);
}

int mep__ft_init(mep_comm_t *comm) {
  int n = comm->max_size;
  mep__ft_t *ft = calloc(1, sizeof *ft);
  if (!ft) return mep__err(MEP_ERR_NOMEM, "out of memory");
  comm->ft = ft;
  pthread_mutex_init(&ft->mu, NULL);
  int64_t probe;
  int rc = mep__engine_add_hook(comm, MEP__ENGINE_AFTER, mep__ft_progress,
                                mep__ft_busy);
  if (rc == MEP_OK)
    rc = mep__config_known_int(comm->cfg, "core", "probe_ms", &probe);
  int agree = 0;
  if (rc == MEP_OK)
    rc = mep__config_choice(comm->cfg, "core", "agreement", &agree);
  if (rc) return rc;
  ft->probe_ms = (uint64_t)probe;
  ft->agreement = agree == 0;
  ft->slot = slot_bytes(n);
  size_t nn = (size_t)n, page = (size_t)sysconf(_SC_PAGESIZE);
  size_t arr_bytes = (nn * sizeof(int32_t) + page - 1) / page * page;
  if (posix_memalign((void **)&ft->arr, page, arr_bytes)) ft->arr = NULL;
  ft->act = calloc(nn, 1);
  ft->last = calloc(nn, 1);
  ft->suspect = calloc(nn, 1);
  ft->dirty = calloc(nn, 1);
  ft->ps = calloc(nn, sizeof *ft->ps);
  ft->views = calloc(nn, nn);
  ft->dropped = calloc(nn, sizeof *ft->dropped);
  ft->in = calloc(nn * 2, ft->slot);
  ft->out = calloc(nn * 2, ft->slot);
  ft->sig = calloc(nn, sizeof *ft->sig);
  ft->scratch = malloc(ft->slot);
  ft->cl.set = malloc(nn);
  ft->cl.mine = malloc(nn);
  if (!ft->arr || !ft->act || !ft->last || !ft->suspect || !ft->dirty ||
      !ft->ps || !ft->views || !ft->dropped || !ft->in || !ft->out || !ft->sig ||
      !ft->scratch || !ft->cl.set || !ft->cl.mine)
    return mep__err(MEP_ERR_NOMEM, "out of memory for the control channel");
  memset(ft->arr, 0, arr_bytes);
  for (size_t p = 0; p < nn; p++) ft->ps[p].view = ft->views + p * nn;
  for (int p = 0; p < comm->size; p++) ft->act[p] = ft->last[p] = 1;
  publish_active(ft, n);
  rc = mep_region_register(comm, ft->in, nn * 2 * ft->slot, MEP_MEM_HOST,
                           &ft->rin);
  if (rc == MEP_OK)
    rc = mep_region_register(comm, ft->sig, nn * sizeof *ft->sig,
                             MEP_MEM_HOST, &ft->rsig);
  if (rc == MEP_OK)
    rc = mep_region_register(comm, ft->out, nn * 2 * ft->slot, MEP_MEM_HOST,
                             &ft->rout);
  return rc ? mep__err_wrap(rc, "control channel") : MEP_OK;
}

int mep__ft_connect(mep_comm_t *comm) {
  mep__ft_t *ft = comm->ft;
  int rc = mep__region_import_active(ft->rin, ft->act);
  if (rc == MEP_OK) rc = mep__region_import_active(ft->rsig, ft->act);
  return rc ? mep__err_wrap(rc, "control channel") : MEP_OK;
}

void mep__ft_fini(mep_comm_t *comm) {
  mep__ft_t *ft = comm->ft;
  if (!ft) return;
  mep__ft_claim_cancel(ft);
  mep_region_deregister(ft->rin);
  mep_region_deregister(ft->rsig);
  mep_region_deregister(ft->rout);
  free(ft->arr);
  free(ft->act);
  free(ft->last);
  free(ft->suspect);
  free(ft->dirty);
  free(ft->ps);
  free(ft->views);
  free(ft->dropped);
  free(ft->in);
  free(ft->out);
  free(ft->sig);
  free(ft->scratch);
  free(ft->cl.set);
  free(ft->cl.mine);
  pthread_mutex_destroy(&ft->mu);
  free(ft);
  comm->ft = NULL;
}

/* ------------------------------------------------------------ queries */

uint64_t mep__ft_epoch(const mep_comm_t *comm) { return comm->ft->epoch; }
const uint8_t *mep__ft_act(const mep_comm_t *comm) { return comm->ft->act; }
int mep__ft_agreeing(const mep_comm_t *comm) { return comm->ft->agreeing; }
int mep__ft_may_commit(const mep_comm_t *comm) { return !comm->ft->proposed; }
uint64_t mep__ft_decided(const mep_comm_t *comm) {
  return comm->ft->decided;
}
int mep__ft_excluded(const mep_comm_t *comm) {
  return comm->ft && __atomic_load_n(&comm->ft->excluded, __ATOMIC_ACQUIRE);
}
uint64_t mep__ft_probe_ms(const mep_comm_t *comm) {
  return comm->ft->probe_ms;
}

int mep__ft_busy(mep_comm_t *comm) {
  mep__ft_t *ft = comm->ft;
  return ft && (ft->agreeing || mep__now_ms() < ft->probe_until);
}

void mep__ft_probe(mep_comm_t *comm) {
  comm->ft->probe_until = mep__now_ms() + 2 * comm->ft->probe_ms;
}

/* ------------------------------------------------------------ sending */

static int coordinator(const mep_comm_t *comm) {
  const mep__ft_t *ft = comm->ft;
  for (int p = 0; p < comm->size; p++)
    if (ft->act[p] && !ft->suspect[p]) return p;
  return comm->rank;
}

/* The snapshot for `peer` into its out slot, then put + signal. A peer
 * that cannot be reached is the failure detector's business. */
static void send_snapshot(mep_comm_t *comm, int peer) {
  mep__ft_t *ft = comm->ft;
  mep__ft_peer_t *ps = &ft->ps[peer];
  int n = comm->max_size;
  uint64_t seq = ++ps->tx_seq;
  uint8_t *slot = ft->out + slot_off(ft, peer, seq);
  mep__ctl_hdr_t h = {
      .seq = seq, .magic = CTL_MAGIC, .sender = (uint32_t)comm->rank,
      .n = (uint32_t)n, .epoch = ft->epoch, .decided = ft->decided,
      .committed = ft->committed, .ping = ps->ping_sent,
      .pong = ps->peer_ping};
  if (ft->agreeing) {
    ft->proposed = 1;
    h.flags = CTL_AGREE;
    h.query = coordinator(comm) == comm->rank ? ft->query : 0;
    h.answer = ps->have && ps->msg.epoch == ft->epoch ? ps->msg.query : 0;
  }
  uint8_t *act = slot + sizeof h, *view = act + n;
  memcpy(act, ft->act, (size_t)n);
  for (int p = 0; p < n; p++) view[p] = ft->act[p] && !ft->suspect[p];
  memcpy(slot, &h, sizeof h);
  h.sum = checksum(slot + 16, ft->slot - 16);
  memcpy(slot + 8, &h.sum, sizeof h.sum);
  size_t off = slot_off(ft, peer, seq), roff = slot_off(ft, comm->rank, seq);
  int rc = mep_put(comm, peer, ft->rout, off, ft->rin, roff, ft->slot);
  if (rc == MEP_OK)
    rc = mep_signal(comm, peer, ft->rsig, (size_t)comm->rank * 8, seq,
                    MEP_SIGNAL_SET);
  if (rc) mep__debug("control message to rank %d: %s", peer, mep_last_error());
}

static void mark_all(mep_comm_t *comm) {
  for (int p = 0; p < comm->size; p++)
    if (p != comm->rank && comm->ft->act[p]) comm->ft->dirty[p] = 1;
}

static int flush_dirty(mep_comm_t *comm) {
  mep__ft_t *ft = comm->ft;
  int sent = 0;
  for (int p = 0; p < comm->size; p++) {
    if (!ft->dirty[p]) continue;
    ft->dirty[p] = 0;
    if (p == comm->rank || atomic_load(&comm->peers[p].failed) ||
        !comm->peers[p].ep)
      continue;
    send_snapshot(comm, p);
    sent++;
  }
  return sent;
}

/* ------------------------------------------------------ epochs, drops */

/* Cuts a dropped rank off: later puts to it fail at once, its imported
 * regions and its connection are released (a frozen process that wakes
 * finds its connections gone). */
static void drop_peer(mep_comm_t *comm, int p) {
  mep__comm_fail_peer(comm, p, MEP_ERR_PEER_FAILED, "dropped from the group");
  mep__peer_t *peer = &comm->peers[p];
  if (!peer->ep) return;
  pthread_mutex_lock(&comm->lock);
  for (size_t i = 0; i < comm->nregions; i++)
    mep__region_forget(comm->regions[i], p);
  pthread_mutex_unlock(&comm->lock);
  comm->tps[peer->tp].vt->close(peer->ep);
  peer->ep = NULL;
}

/* Makes `act` the active set at `epoch` (dropping the others). */
static void adopt(mep_comm_t *comm, uint64_t epoch, const uint8_t *act,
                  uint64_t decided, const char *how) {
  mep__ft_t *ft = comm->ft;
  if (epoch <= ft->epoch) return;
  char lost[256] = "";
  size_t len = 0;
  for (int p = 0; p < comm->size; p++) {
    if (!ft->act[p] || act[p]) continue;
    if (p != comm->rank) drop_peer(comm, p);
    if (len < sizeof lost - 16)
      len += (size_t)snprintf(lost + len, sizeof lost - len, " %d", p);
  }
  memcpy(ft->act, act, (size_t)comm->max_size);
  ft->epoch = epoch;
  if (decided > ft->decided) ft->decided = decided;
  ft->agreeing = ft->proposed = 0;
  ft->query = 0;
  for (int p = 0; p < comm->max_size; p++)
    if (!act[p]) ft->suspect[p] = 0;
  if (!act[comm->rank]) {
    __atomic_store_n(&ft->excluded, 1, __ATOMIC_RELEASE);
    mep__warn("the other ranks dropped this one at epoch %llu (%s)",
              (unsigned long long)epoch, how);
  } else {
    mep__info("epoch %llu (%s): dropped ranks%s", (unsigned long long)epoch,
              how, *lost ? lost : " none");
  }
  publish_active(ft, comm->max_size);
  mark_all(comm);
}

/* A new agreement starts with no coordinator chosen, so the one chosen
 * next sends a fresh query (run_agreement). */
static void enter_agreement(mep_comm_t *comm) {
  mep__ft_t *ft = comm->ft;
  if (ft->agreeing || ft->excluded) return;
  ft->agreeing = 1;
  ft->coord = -1;
}

/* ----------------------------------------------------------- receiving */

/* Whether `act` holds a rank this side has not admitted. Only
 * mep_comm_recover_ranks (or, for the joiner, the welcome) may make a rank
 * active here: it connects to the rank first. An announcement of such an
 * epoch is left alone; once this side sets that epoch itself, its own
 * snapshots tell the announcer it is behind, and a later epoch comes again. */
static int admits(const mep__ft_t *ft, const uint8_t *act, int n) {
  for (int p = 0; p < n; p++)
    if (act[p] && !ft->act[p]) return 1;
  return 0;
}

/* The latest snapshot of `from`, when a new complete one is there. */
static int receive(mep_comm_t *comm, int from) {
  mep__ft_t *ft = comm->ft;
  mep__ft_peer_t *ps = &ft->ps[from];
  uint64_t seq = __atomic_load_n(&ft->sig[from], __ATOMIC_ACQUIRE);
  if (seq <= ps->rx_seq) return 0;
  memcpy(ft->scratch, in_slot(ft, from, seq), ft->slot);
  mep__ctl_hdr_t h;
  memcpy(&h, ft->scratch, sizeof h);
  /* A torn copy (the sender overwrote the slot meanwhile) fails the sum;
   * the next snapshot it sends is read instead. */
  if (h.magic != CTL_MAGIC || h.seq != seq || h.sender != (uint32_t)from ||
      h.n != (uint32_t)comm->max_size ||
      h.sum != checksum(ft->scratch + 16, ft->slot - 16))
    return 0;
  ps->rx_seq = seq;
  ps->have = 1;
  ps->msg = h;
  memcpy(ps->view, ft->scratch + sizeof h + h.n, h.n);
  if (h.ping > ps->peer_ping) {
    ps->peer_ping = h.ping;
    ft->dirty[from] = 1; /* echo it */
  }
  if (h.pong > ps->pong_seen) ps->pong_seen = h.pong;
  if (h.epoch > ft->epoch) {
    if (!admits(ft, ft->scratch + sizeof h, comm->max_size))
      adopt(comm, h.epoch, ft->scratch + sizeof h, h.decided, "announced");
  } else if (h.epoch < ft->epoch) {
    ft->dirty[from] = 1; /* it is behind: tell it */
  } else if ((h.flags & CTL_AGREE) && !ft->agreeing) {
    mep__debug("rank %d started an agreement at epoch %llu", from,
               (unsigned long long)ft->epoch);
    enter_agreement(comm);
  }
  if ((h.flags & CTL_AGREE) && h.query) ft->dirty[from] = 1; /* answer */
  return 1;
}

/* --------------------------------------------------------- detection */

static void suspect(mep_comm_t *comm, int p, int closed, const char *why) {
  mep__ft_t *ft = comm->ft;
  if (ft->suspect[p]) return;
  ft->suspect[p] = 1;
  ft->coord = -1; /* views changed: query or propose again */
  /* A rank that closed its communicator in order is no fault. */
  mep__log(closed ? MEP_LOG_INFO : MEP_LOG_WARN, "suspecting rank %d: %s", p,
           why);
}

/* Probes p: a nonce it must echo within probe_ms. */
static void watch(mep_comm_t *comm, int p, uint64_t now) {
  mep__ft_t *ft = comm->ft;
  mep__ft_peer_t *ps = &ft->ps[p];
  if (ps->pong_seen >= ps->ping_sent) { /* answered: ask again later */
    if (now < ps->ping_at + ft->probe_ms / 4 + 1) return;
    ps->ping_sent = ps->pong_seen + 1;
    ps->ping_at = now;
    ft->dirty[p] = 1;
    return;
  }
  if (now >= ps->ping_at + ft->probe_ms) {
    char why[96];
    snprintf(why, sizeof why, "no answer to a probe within %llu ms",
             (unsigned long long)ft->probe_ms);
    suspect(comm, p, 0, why);
  }
}

/* -------------------------------------------------------- agreement */

/* Whether rank r, as seen by the coordinator, sees x alive. */
static int sees(const mep_comm_t *comm, int r, int x) {
  const mep__ft_t *ft = comm->ft;
  if (r == comm->rank) return !ft->suspect[x];
  return ft->ps[r].view[x];
}

static int answered(const mep_comm_t *comm, int p) {
  const mep__ft_peer_t *ps = &comm->ft->ps[p];
  return ps->have && ps->msg.epoch == comm->ft->epoch &&
         (ps->msg.flags & CTL_AGREE) && ps->msg.answer == comm->ft->query;
}

static void decide(mep_comm_t *comm) {
  mep__ft_t *ft = comm->ft;
  uint8_t *set = calloc((size_t)comm->max_size, 1);
  if (!set) return; /* tried again on the next round */
  uint64_t decided = ft->committed;
  /* Greedy in rank order: a rank joins when it and every rank already in
   * see each other, so the set is connected both ways. */
  for (int r = 0; r < comm->size; r++) {
    if (!ft->act[r] || ft->suspect[r]) continue;
    int ok = 1;
    for (int x = 0; ok && x < r; x++)
      if (set[x] && (!sees(comm, r, x) || !sees(comm, x, r))) ok = 0;
    if (!ok) continue;
    set[r] = 1;
  }
  /* What the members committed, and what each rank that closed in order
   * did: that rank returned it to its caller, so the survivors finish
   * that collective as it did (coll.c), rather than run it again without
   * it and end it otherwise. */
  for (int r = 0; r < comm->size; r++) {
    int closed = ft->act[r] && ft->ps[r].have &&
                 atomic_load(&comm->peers[r].failed) == MEP_ERR_CLOSED;
    if (r != comm->rank && (set[r] || closed) &&
        ft->ps[r].msg.committed > decided)
      decided = ft->ps[r].msg.committed;
  }
  mep__ft_claim_start(comm, ft->epoch + 1, set, decided);
  free(set);
}

static void run_agreement(mep_comm_t *comm, uint64_t now) {
  mep__ft_t *ft = comm->ft;
  int c = coordinator(comm);
  if (c != ft->coord) { /* a new coordinator: fresh query, fresh views */
    ft->coord = c;
    if (c == comm->rank) {
      ft->query = ((uint64_t)comm->rank << 40) + (++ft->queries);
      mark_all(comm);
    } else {
      ft->dirty[c] = 1;
    }
  }
  if (c != comm->rank) {
    watch(comm, c, now);
    return;
  }
  int pending = 0;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank || !ft->act[p] || ft->suspect[p]) continue;
    if (answered(comm, p)) continue;
    pending++;
    watch(comm, p, now);
    if (ft->suspect[p]) pending--;
  }
  if (!pending && !ft->cl.epoch) decide(comm);
  mep__ft_decision_t d;
  if (ft->cl.epoch && mep__ft_claim_settle(comm, now, &d))
    adopt(comm, d.epoch, d.set, d.decided, "decided");
}

/* ------------------------------------------------------------ the loop */

int mep__ft_progress(mep_comm_t *comm) {
  mep__ft_t *ft = comm->ft;
  if (!ft || ft->excluded) return 0;
  int work = 0;
  for (int p = 0; p < comm->size; p++)
    if (p != comm->rank && ft->act[p] && comm->peers[p].ep)
      work += receive(comm, p);
  if (ft->excluded) return work;
  uint64_t now = mep__now_ms();
  int any = 0;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank || !ft->act[p]) continue;
    int failed = atomic_load(&comm->peers[p].failed);
    /* A rank that finished the running collective and left is dropped
     * at the next one, not in the middle of this one; but when the others
     * agree on the group meanwhile, it is no voter to wait for. */
    if (failed == MEP_ERR_CLOSED && !ft->agreeing && comm->coll_done_from &&
        comm->coll_done_from(comm, p))
      failed = 0;
    if (failed && !ft->suspect[p]) {
      /* its last snapshot, sent before it went, may have landed since */
      work += receive(comm, p);
      if (!ft->act[p] || ft->excluded) continue; /* it announced a drop */
      suspect(comm, p, failed == MEP_ERR_CLOSED,
              failed == MEP_ERR_CLOSED ? "it closed its communicator"
                                       : "its transport reported it failed");
    }
    if (!ft->suspect[p] && now < ft->probe_until) watch(comm, p, now);
    any |= ft->suspect[p];
  }
  if (any) enter_agreement(comm);
  if (ft->agreeing) run_agreement(comm, now);
  return work + flush_dirty(comm);
}

/* ---------------------------------------------------------- commits */

void mep__ft_commit(mep_comm_t *comm, uint64_t op, const uint8_t *act,
                    int *dropped, int *ndropped) {
  mep__ft_t *ft = comm->ft;
  int k = 0;
  for (int p = 0; p < comm->max_size; p++) {
    if (ft->last[p] && !act[p]) dropped[k++] = p;
    ft->last[p] = act[p];
  }
  *ndropped = k;
  ft->committed = op;
  pthread_mutex_lock(&ft->mu);
  memcpy(ft->dropped, dropped, (size_t)k * sizeof *dropped);
  ft->ndropped = k;
  pthread_mutex_unlock(&ft->mu);
}

/* ---------------------------------------------------------- recovery */

void mep__ft_reset_peer(mep_comm_t *comm, int peer) {
  mep__ft_t *ft = comm->ft;
  uint8_t *view = ft->ps[peer].view;
  memset(&ft->ps[peer], 0, sizeof ft->ps[peer]);
  ft->ps[peer].view = view;
  __atomic_store_n(&ft->sig[peer], 0, __ATOMIC_RELEASE);
  memset(ft->in + slot_off(ft, peer, 0), 0, 2 * ft->slot);
  ft->suspect[peer] = 0;
  ft->dirty[peer] = 0;
}

void mep__ft_set_members(mep_comm_t *comm, uint64_t epoch, const uint8_t *act,
                         uint64_t committed) {
  mep__ft_t *ft = comm->ft;
  memcpy(ft->act, act, (size_t)comm->max_size);
  memcpy(ft->last, act, (size_t)comm->max_size);
  ft->epoch = epoch;
  ft->committed = committed;
  if (committed > ft->decided) ft->decided = committed;
  ft->excluded = !act[comm->rank];
  publish_active(ft, comm->max_size);
  mark_all(comm); /* a peer that announced a later epoch learns to resend */
}
