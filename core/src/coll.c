/* coll.c - executing collective plans on the progress thread (coll.h):
 * the entry points (coll_api.c) start specs here; plans come from plan.c. */
#include "coll.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "copier.h"
#include "error.h"
#include "ft.h"
#include "log.h"
#include "lreg.h"
#include "reduce.h"
#include "region.h"
#include "req.h"

#define HDR_BYTES 64
/* A chunk this long (or a whole chunk_bytes, if less) leaves from the
 * caller's buffer: below it the separate header write and the
 * registration cost more than the copy saves. */
#define ZC_MIN_BYTES 65536
#define HDR_MAGIC 0x4c4c4f43u /* "COLL" */

/* The header in front of every chunk; both ends share an architecture. */
typedef struct chdr {
  uint64_t seq;    /* collective number on this communicator */
  uint64_t digest; /* of kind, dtype, op, count, root */
  uint64_t count;
  uint64_t total;  /* bytes of this pair's message in this step */
  uint32_t epoch;  /* of the attempt (a collective runs again over the
                      survivors when ranks are lost) */
  uint16_t kind;
  uint8_t dtype, op;
  int32_t root;
  uint32_t step, chunk;
  uint32_t sender, magic;
  uint16_t landed; /* the payload went straight into the receiver's buffer
                      (landing, below), not behind this header */
  uint16_t flags;  /* CHUNK_* */
} chdr_t;
#define CHUNK_CONFIRM 1 /* of a step that only confirms (plan.h: ndata) */
#define CHUNK_ABORT 2   /* no data: its payload is the message of the
                           sender's failure of the call (flood_abort) */
_Static_assert(sizeof(chdr_t) <= HDR_BYTES, "chunk header too large");

/* Landing. At the start of a copy step a receiver tells each sender of a
 * message of at least zc_min bytes where that message goes in its own
 * buffer, registered locally (lregs) with the transport that routes to
 * the sender: this landing message goes into the sender's `land` area
 * (its slot for this rank), then the landing word sig[2n + receiver]
 * counts it. A sender that holds the landing message of the very call
 * and step (sequence number, digest, epoch, step) puts each chunk's
 * payload there instead of behind the header, and marks the header: the
 * receiver copies nothing. The header, the signal and the credits are as
 * for any chunk, and the signal lands after the payload.
 *
 * Data that may still arrive from an abandoned attempt is harmless: in a
 * copy step a sender's message is its own data at its own place (the
 * degraded plans place every rank's block where the whole group's do),
 * and a degraded all-reduce reduces each chunk only once every survivor's
 * chunk of the new attempt is in, which its earlier writes precede. A
 * collective that ends in error releases the registration of its buffer
 * (advance), so nothing lands in it once it is the caller's again. */
#define LAND_MAGIC 0x444e414cu /* "LAND" */
typedef struct land {
  uint64_t seq, digest;
  uint64_t off;  /* of the message in the registered buffer */
  uint64_t rlen; /* the registration's length */
  uint32_t epoch, step, key_len, magic;
  uint64_t sum;  /* land_sum */
  uint8_t key[MEP_TP_MAX_RKEY];
} land_t;

/* FNV-1a over the message but its sum. The receiver rewrites its slot of
 * outgoing landing messages for the next step without waiting for the
 * put of the last one to finish reading it (a transport may read a
 * source late), and the sender may read its slot while the next message
 * lands: a message torn either way fails its sum and is not used. */
static uint64_t land_sum(const land_t *m) {
  land_t t = *m;
  t.sum = 0;
  size_t len = offsetof(land_t, key) +
               (t.key_len <= MEP_TP_MAX_RKEY ? t.key_len : 0);
  const uint8_t *b = (const uint8_t *)&t;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

struct mep__coll {
  size_t chunk, slot;
  uint8_t *send_stage, *recv_stage; /* [rank][2] slots */
  uint64_t *sig;                    /* data[rank], then credit[rank] */
  mep_region_t *rs, *rr, *rg;
  uint64_t *sent, *consumed;        /* chunk sequence numbers per peer */
  uint64_t seq;                     /* collectives started */
  uint64_t failed;                  /* the last one that failed here */
  int agreement;                    /* [core] agreement = on */
  int cur_done;                     /* the running attempt holds all data */
  uint64_t *held;                   /* per sender: a credit held back */
  uint8_t *acc;
  mep__plan_opts_t opts;            /* [core] settings of the plans */
  uint8_t *aside;                   /* in-place inputs, copied at the start */
  size_t aside_cap;                 /* (collectives run one at a time) */
  mep__copier_t *copier;            /* copies them while they run */
  int copier_ok;                    /* 1 start one when needed, -1 never */
  /* Zero-copy sends: a chunk of at least zc_min bytes (ZC_MIN_BYTES, or
   * a whole chunk) leaves from the caller's buffer, registered locally
   * (lregs), instead of through send_stage; only its header is staged.
   * zc_issued[p] counts those writes to p, comm->zc_done[p] their
   * completions: a collective finishes once they match (zc_drained). */
  size_t zc_min;
  mep__lregs_t *lregs;
  uint64_t *zc_issued;
  uint64_t zc_writes;               /* all of them, for tests */
  /* Landing (above): [n] land_t from peers, then [n] to them. */
  land_t *land;
  mep_region_t *rl;
  mep_region_t *shell;              /* receivers' buffers, imported */
  uint64_t *land_sent;              /* landing messages sent per peer */
  uint64_t *land_seen;              /* per peer: its landing word, read */
  land_t *land_cur;                 /* per peer: its last landing message */
  uint64_t landed;                  /* chunks this rank landed (tests) */
};

/* ------------------------------------------------------------ set-up */

static int done_from(const mep_comm_t *comm, int p);

int mep__coll_init(mep_comm_t *comm) {
  int64_t chunk;
  int rc = mep__config_int(comm->cfg, "core", "chunk_bytes", 1 << 20, 4096,
                           (int64_t)1 << 30, &chunk);
  if (rc) return rc;
  int64_t two_shot, log_ranks, log_bytes;
  rc = mep__config_int(comm->cfg, "core", "two_shot_bytes", 262144, 0,
                       INT64_MAX, &two_shot);
  if (rc == MEP_OK)
    rc = mep__config_int(comm->cfg, "core", "log_ranks", 8, 0, INT32_MAX,
                         &log_ranks);
  if (rc == MEP_OK)
    rc = mep__config_int(comm->cfg, "core", "log_bytes", 32768, 0,
                         INT64_MAX, &log_bytes);
  if (rc) return rc;
  struct mep__coll *c = calloc(1, sizeof *c);
  if (!c) return mep__err(MEP_ERR_NOMEM, "out of memory");
  comm->coll = c;
  comm->coll_done_from = done_from;
  c->opts.two_shot = (size_t)two_shot;
  c->opts.log_ranks = (int)log_ranks;
  c->opts.log_bytes = (size_t)log_bytes;
  size_t n = (size_t)comm->max_size;
  int agree = 0, copy = 0;
  rc = mep__config_choice(comm->cfg, "core", "agreement", &agree);
  if (rc == MEP_OK)
    rc = mep__config_choice(comm->cfg, "core", "copy_thread", &copy);
  if (rc) return rc;
  /* copy_thread: auto|off|on */
  c->copier_ok = copy == 2 || (copy == 0 && mep__cpus() >= 4) ? 1 : -1;
  c->agreement = c->opts.confirm = agree == 0;
  c->chunk = (size_t)chunk & ~(size_t)63;
  c->slot = HDR_BYTES + c->chunk;
  c->zc_min = c->chunk < ZC_MIN_BYTES ? c->chunk : ZC_MIN_BYTES;
  c->send_stage = malloc(n * 2 * c->slot);
  c->recv_stage = malloc(n * 2 * c->slot);
  c->sig = calloc(3 * n, sizeof *c->sig);
  c->held = calloc(n, sizeof *c->held);
  c->sent = calloc(n, sizeof *c->sent);
  c->consumed = calloc(n, sizeof *c->consumed);
  c->acc = malloc(2 * c->chunk); /* float16 accumulates in float32 */
  c->zc_issued = calloc(n, sizeof *c->zc_issued);
  comm->zc_done = calloc(n, sizeof *comm->zc_done);
  c->lregs = mep__lregs_new(comm, 8);
  c->land = calloc(2 * n, sizeof *c->land);
  c->land_sent = calloc(n, sizeof *c->land_sent);
  c->land_seen = calloc(n, sizeof *c->land_seen);
  c->land_cur = calloc(n, sizeof *c->land_cur);
  if (!c->send_stage || !c->recv_stage || !c->sig || !c->held || !c->sent ||
      !c->consumed || !c->acc || !c->zc_issued || !comm->zc_done ||
      !c->lregs || !c->land || !c->land_sent ||
      !c->land_seen || !c->land_cur)
    return mep__err(MEP_ERR_NOMEM, "collective staging of %zu bytes",
                    n * 4 * c->slot);
  rc = mep_region_register(comm, c->send_stage, n * 2 * c->slot,
                           MEP_MEM_HOST, &c->rs);
  if (rc == MEP_OK)
    rc = mep_region_register(comm, c->recv_stage, n * 2 * c->slot,
                             MEP_MEM_HOST, &c->rr);
  if (rc == MEP_OK)
    rc = mep_region_register(comm, c->sig, 3 * n * sizeof *c->sig,
                             MEP_MEM_HOST, &c->rg);
  if (rc == MEP_OK)
    rc = mep_region_register(comm, c->land, 2 * n * sizeof *c->land,
                             MEP_MEM_HOST, &c->rl);
  if (rc == MEP_OK) rc = mep__region_shell(comm, &c->shell);
  return rc ? mep__err_wrap(rc, "collective staging") : MEP_OK;
}

int mep__coll_connect(mep_comm_t *comm) {
  struct mep__coll *c = comm->coll;
  int rc = mep__region_import_active(c->rr, mep__ft_act(comm));
  if (rc == MEP_OK) rc = mep__region_import_active(c->rg, mep__ft_act(comm));
  if (rc == MEP_OK) rc = mep__region_import_active(c->rl, mep__ft_act(comm));
  return rc ? mep__err_wrap(rc, "collective staging") : MEP_OK;
}

void mep__coll_reset_peer(mep_comm_t *comm, int p) {
  struct mep__coll *c = comm->coll;
  size_t n = (size_t)comm->max_size;
  c->sent[p] = c->consumed[p] = c->held[p] = 0;
  for (size_t i = 0; i < 3; i++)
    __atomic_store_n(&c->sig[i * n + (size_t)p], 0, __ATOMIC_RELEASE);
  c->land_sent[p] = c->land_seen[p] = 0;
  memset(&c->land[p], 0, sizeof *c->land);
  memset(&c->land_cur[p], 0, sizeof *c->land_cur);
  memset(c->recv_stage + (size_t)p * 2 * c->slot, 0, 2 * c->slot);
  /* the old process's connection was closed: its writes never complete */
  c->zc_issued[p] = 0;
  atomic_store(&comm->zc_done[p], 0);
}

void mep__coll_zc_stats(const mep_comm_t *comm, uint64_t *writes,
                        int *entries, unsigned long *made) {
  const struct mep__coll *c = comm->coll;
  *writes = c->zc_writes;
  *entries = mep__lregs_count(c->lregs);
  *made = mep__lregs_made(c->lregs);
}

uint64_t mep__coll_landed(const mep_comm_t *comm) {
  return comm->coll->landed;
}

void mep__coll_aside(const mep_comm_t *comm, const uint8_t **p, size_t *cap) {
  *p = comm->coll->aside;
  *cap = comm->coll->aside_cap;
}

uint64_t mep__coll_ops(const mep_comm_t *comm) { return comm->coll->seq; }
void mep__coll_set_ops(mep_comm_t *comm, uint64_t ops) {
  comm->coll->seq = ops;
  if (comm->coll->failed > ops) comm->coll->failed = 0;
}

void mep__coll_fini(mep_comm_t *comm) {
  struct mep__coll *c = comm->coll;
  if (!c) return;
  mep_region_deregister(c->rs);
  mep_region_deregister(c->rr);
  mep_region_deregister(c->rg);
  mep_region_deregister(c->rl);
  mep_region_deregister(c->shell);
  mep__copier_free(c->copier);
  free(c->send_stage);
  free(c->recv_stage);
  free(c->sig);
  free(c->held);
  free(c->sent);
  free(c->consumed);
  free(c->acc);
  free(c->aside);
  mep__lregs_free(c->lregs);
  free(c->zc_issued);
  free(c->land);
  free(c->land_sent);
  free(c->land_seen);
  free(c->land_cur);
  free((void *)comm->zc_done);
  comm->zc_done = NULL;
  free(c);
  comm->coll = NULL;
  comm->coll_done_from = NULL;
}

/* -------------------------------------------------------------- plans */

static const char *const kind_names[] = {
    "broadcast", "reduce",    "allreduce", "allgather",  "reduce_scatter",
    "alltoall",  "alltoallv", "gather",    "scatter",    "barrier",
    "peer_state", "recover_ranks"};

static uint64_t digest_of(const mep__plan_t *p) {
  uint64_t h = 1469598103934665603ull, v[5] = {
      (uint64_t)p->kind, (uint64_t)p->dtype, (uint64_t)p->op, p->count,
      (uint64_t)(int64_t)p->root};
  for (int i = 0; i < 5; i++) h = (h ^ v[i]) * 1099511628211ull;
  return h;
}

/* "allreduce(float32, sum, count 100)" */
static void describe(char *buf, size_t len, uint32_t kind, uint32_t dtype,
                     uint32_t op, uint64_t count, int32_t root) {
  const char *k = kind < sizeof kind_names / sizeof *kind_names
                      ? kind_names[kind] : "?";
  const char *d = mep_dtype_name((mep_dtype_t)dtype);
  int n = snprintf(buf, len, "%s(%s", k, d ? d : "?");
  if (kind == MEP__COLL_REDUCE || kind == MEP__COLL_ALLREDUCE ||
      kind == MEP__COLL_REDUCE_SCATTER)
    n += snprintf(buf + n, len - (size_t)n, ", %s",
                  mep_op_name((mep_op_t)op) ? mep_op_name((mep_op_t)op) : "?");
  if (kind < MEP__COLL_PEER_STATE) /* membership barriers: a digest */
    n += snprintf(buf + n, len - (size_t)n, ", count %llu",
                  (unsigned long long)count);
  if (root >= 0) n += snprintf(buf + n, len - (size_t)n, ", root %d", root);
  snprintf(buf + n, len - (size_t)n, ")");
}

/* ------------------------------------------------------------ execution */

typedef struct op {
  mep__coll_spec_t spec;
  mep__plan_t plan;
  uint8_t *act;      /* the attempt's active set */
  int *last_step;    /* per sender: its last data step and chunk to this
                        rank */
  size_t *last_chunk;
  int nact;          /* active ranks */
  int first, last;   /* reduce step: the lowest and highest contributor */
  /* Reduce mode: the first contribution to the running chunk, kept until
   * the second comes so that both enter the accumulator in one pass (a
   * peer's stays unconsumed until then); NULL: none held. */
  const uint8_t *pend;
  int step, started;
  size_t sj, rj;   /* send and receive cursors: chunk index ... */
  int sk, rs;      /* ... and index in the step's sends or recvs */
  size_t smax, rmax; /* chunks of the longest message of the step */
  uint64_t seq, epoch, digest, deadline, probe_end;
  /* Agreement off: the epoch at which this rank went on with the attempt
   * that other survivors had finished (run). */
  uint64_t kept;
  int data_done, probed;
  mep_region_t *zreg[2]; /* the send and receive buffers, registered for
                            zero-copy sends and landing (NULL: staged;
                            lregs owns) */
  int finishing;         /* ended, but the transports may still read them */
  /* In place, late copy (aside_start): the first attempt reads the
   * caller's buffer; aside_busy: the copier still copies it aside. */
  int aside_late, aside_busy;
  uint8_t *restore; /* an in-place all-reduce's buffer, once its copy
                       aside is made or under way: put back from there if
                       the call fails */
  uint64_t fin_deadline;
  uint64_t abort_seen;   /* when abort_waiting last looked (ms) */
  char waiting[160];
} op_t;

static size_t nchunks(const struct mep__coll *c, size_t bytes) {
  return bytes ? (bytes + c->chunk - 1) / c->chunk : 1;
}

static size_t chunk_len(const struct mep__coll *c, size_t total, size_t j) {
  size_t off = j * c->chunk;
  return total - off < c->chunk ? total - off : c->chunk;
}

static uint8_t *stage(const struct mep__coll *c, uint8_t *base, int peer,
                      uint64_t seq) {
  return base + ((size_t)peer * 2 + (seq & 1)) * c->slot;
}

static size_t stage_off(const struct mep__coll *c, int peer, uint64_t seq) {
  return ((size_t)peer * 2 + (seq & 1)) * c->slot;
}

static uint64_t load(const uint64_t *w) {
  return __atomic_load_n(w, __ATOMIC_ACQUIRE);
}

static void release_held(mep_comm_t *comm);
/* Ends the request with `code` and a message naming the collective;
 * returns MEP__ADV_DONE, for advance to return. */
static int fail(mep_req_t *req, int code, const char *fmt, ...)
    MEP_PRINTF(3, 4);
static int fail(mep_req_t *req, int code, const char *fmt, ...) {
  op_t *o = req->impl;
  req->comm->coll->cur_done = 0;
  req->comm->coll->failed = o->seq;
  release_held(req->comm);
  char what[96], msg[400];
  describe(what, sizeof what, (uint32_t)o->spec.kind, (uint32_t)o->spec.dtype,
           (uint32_t)o->spec.op, o->plan.count, o->spec.root);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  mep__req_set(req, code, "rank %d: %s: %s", req->comm->rank, what, msg);
  return MEP__ADV_DONE;
}

/* A peer that failed is not an error of the collective: the survivors
 * agree on who is left (ft.c) and the attempt starts again over them. */
static int peer_dead(mep_comm_t *comm, int p) {
  return atomic_load(&comm->peers[p].failed);
}

static int lost(int rc) {
  return rc == MEP_ERR_PEER_FAILED || rc == MEP_ERR_CLOSED;
}

static int release(mep_comm_t *comm, int s);
static int mismatch(mep_req_t *req, int s, const chdr_t *h);

/* The registration of the caller's buffer holding [src, src + len), usable
 * towards p, and the offset of src in it; NULL: stage the chunk. */
static const mep_region_t *zc_source(const mep_comm_t *comm, const op_t *o,
                                     int p, const uint8_t *src, size_t len,
                                     size_t *off) {
  if (len < comm->coll->zc_min) return NULL;
  for (int k = 0; k < 2; k++) {
    const mep_region_t *r = o->zreg[k];
    if (!r || !r->mrs[comm->peers[p].tp]) continue;
    uintptr_t a = (uintptr_t)src, base = (uintptr_t)r->ptr;
    if (a >= base && len <= r->len && a - base <= r->len - len) {
      *off = (size_t)(a - base);
      return r;
    }
  }
  return NULL;
}

/* Puts the staged header of the chunk in `seq`'s slot to p, alone. */
static int put_header(mep_comm_t *comm, int p, uint64_t seq) {
  struct mep__coll *c = comm->coll;
  return mep_put(comm, p, c->rs, stage_off(c, p, seq), c->rr,
                 stage_off(c, comm->rank, seq), HDR_BYTES);
}

/* Puts the staged header of the chunk in `seq`'s slot and its payload to
 * p: from the slot behind the header, or straight from the caller's
 * buffer `z` (zero-copy: no copy in; the payload lands behind the header
 * all the same, so the receiver cannot tell). */
static int put_chunk(mep_comm_t *comm, int p, uint64_t seq, const uint8_t *src,
                     size_t len, const mep_region_t *z, size_t zoff) {
  struct mep__coll *c = comm->coll;
  size_t off = stage_off(c, p, seq), roff = stage_off(c, comm->rank, seq);
  if (!z) {
    if (len) memcpy(c->send_stage + off + HDR_BYTES, src, len);
    return mep_put(comm, p, c->rs, off, c->rr, roff, HDR_BYTES + len);
  }
  int rc = put_header(comm, p, seq);
  if (rc == MEP_OK)
    rc = mep__put_tagged(comm, p, z, zoff, c->rr, roff + HDR_BYTES, len,
                         MEP__TOKEN_ZC);
  if (rc == MEP_OK) c->zc_issued[p]++, c->zc_writes++;
  return rc;
}

/* p's landing message for the running call and step, or NULL. A new one
 * is read once its landing word moved: p writes the next only after it
 * received every chunk this rank sends it in this step. */
static const land_t *landing_from(mep_req_t *req, int p) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  uint64_t w = load(&c->sig[2 * (size_t)comm->max_size + p]);
  if (w != c->land_seen[p]) {
    land_t m;
    memcpy(&m, &c->land[p], sizeof m);
    if (m.key_len <= MEP_TP_MAX_RKEY && m.sum == land_sum(&m)) {
      c->land_cur[p] = m;
      c->land_seen[p] = w;
    }
  }
  const land_t *l = &c->land_cur[p];
  if (l->magic != LAND_MAGIC || l->seq != o->seq || l->digest != o->digest ||
      l->epoch != (uint32_t)o->epoch || l->step != (uint32_t)o->step)
    return NULL;
  return l;
}

/* Puts chunk j's payload (len bytes at src, from z when zero-copy, else
 * copied behind the staged header first) where p's landing message `l`
 * says: MEP_OK, 1 when it does not fit there (stage it), or an error. */
static int put_landed(mep_comm_t *comm, int p, uint64_t seq, const land_t *l,
                      size_t j, const uint8_t *src, size_t len,
                      const mep_region_t *z, size_t zoff) {
  struct mep__coll *c = comm->coll;
  uint64_t at = (uint64_t)j * c->chunk;
  if (l->off > l->rlen || at > l->rlen - l->off ||
      len > l->rlen - l->off - at ||
      mep__region_adopt(c->shell, p, l->key, l->key_len, l->rlen) != MEP_OK) {
    mep__err_clear();
    return 1;
  }
  size_t off = stage_off(c, p, seq);
  int rc;
  if (z) {
    rc = mep__put_tagged(comm, p, z, zoff, c->shell, l->off + at, len,
                         MEP__TOKEN_ZC);
    if (rc == MEP_OK) c->zc_issued[p]++, c->zc_writes++;
  } else {
    memcpy(c->send_stage + off + HDR_BYTES, src, len);
    rc = mep_put(comm, p, c->rs, off + HDR_BYTES, c->shell, l->off + at,
                 len);
  }
  if (rc == MEP_OK) c->landed++;
  return rc;
}

/* The header of chunk j of the running step, of a message of `total`
 * bytes. */
static chdr_t header_of(const mep_comm_t *comm, const op_t *o, size_t j,
                       size_t total, uint16_t flags) {
  return (chdr_t){.seq = o->seq, .digest = o->digest,
                  .count = o->plan.count, .total = total,
                  .epoch = (uint32_t)o->epoch, .kind = (uint16_t)o->plan.kind,
                  .dtype = (uint8_t)o->plan.dtype, .op = (uint8_t)o->plan.op,
                  .root = o->plan.root, .step = (uint32_t)o->step,
                  .chunk = (uint32_t)j, .sender = (uint32_t)comm->rank,
                  .magic = HDR_MAGIC, .flags = flags};
}

/* Whether p has a staging slot free for this rank's next chunk. */
static int slot_free(mep_comm_t *comm, int p) {
  const struct mep__coll *c = comm->coll;
  return !peer_dead(comm, p) &&
         load(&c->sig[comm->max_size + p]) + 2 >= c->sent[p] + 1;
}

/* Sends chunk j of the current step to p: 1 sent, 0 blocked, <0 error. */
static int send_chunk(mep_req_t *req, int p, size_t j) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  const mep__step_t *st = &o->plan.steps[o->step];
  uint64_t seq = c->sent[p] + 1;
  if (!slot_free(comm, p)) {
    snprintf(o->waiting, sizeof o->waiting, "waiting for rank %d to free "
             "a staging slot (chunk %zu of step %d)", p, j, o->step);
    return 0;
  }
  size_t total = st->sbytes[p], len = chunk_len(c, total, j);
  uint8_t *slot = stage(c, c->send_stage, p, seq);
  chdr_t h = header_of(comm, o, j, total,
                       o->step >= o->plan.ndata ? CHUNK_CONFIRM : 0);
  const uint8_t *src = len ? st->sptr[p] + j * c->chunk : NULL;
  size_t zoff = 0;
  const mep_region_t *z = zc_source(comm, o, p, src, len, &zoff);
  const land_t *l = len ? landing_from(req, p) : NULL;
  int rc = l ? put_landed(comm, p, seq, l, j, src, len, z, zoff) : 1;
  h.landed = rc == MEP_OK;
  memcpy(slot, &h, sizeof h);
  if (rc == MEP_OK)
    rc = put_header(comm, p, seq);
  else if (rc == 1)
    rc = put_chunk(comm, p, seq, src, len, z, zoff);
  if (rc == MEP_OK)
    rc = mep_signal(comm, p, c->rg, (size_t)comm->rank * 8, seq,
                    MEP_SIGNAL_SET);
  if (lost(rc)) return 0;
  if (rc) return rc;
  c->sent[p] = seq;
  return 1;
}

/* A chunk nobody wants: of an attempt abandoned when ranks were lost; of
 * a collective that failed here; an abort of an earlier one; or a
 * confirmation of an earlier collective that this rank finished on
 * another rank's word (run: the survivors decided it had finished) before
 * the confirmation came. */
static int stale(const mep_comm_t *comm, const op_t *o, const chdr_t *h) {
  if (h->magic != HDR_MAGIC || h->seq > o->seq) return 0;
  if (h->epoch < (uint32_t)o->epoch) return 1;
  return h->seq < o->seq &&
         (h->seq <= comm->coll->failed || (h->flags & CHUNK_ABORT) ||
          (h->flags & CHUNK_CONFIRM));
}

/* Sparse plans (plan.h): most ranks never hear from the one that called
 * something else, so the rank that finds a disagreement tells every other
 * rank, in a chunk of its own (CHUNK_ABORT) whose payload is its message;
 * they fail the call with it instead of waiting out the deadline. To
 * every peer with a free staging slot: one without is busy with this
 * call and hears it from another rank, or meets its deadline. */
static void flood_abort(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  if (!o->plan.sparse) return;
  size_t len = strnlen(req->msg, sizeof req->msg - 1) + 1;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank || !o->act[p] || !slot_free(comm, p)) continue;
    uint64_t seq = c->sent[p] + 1;
    chdr_t h = header_of(comm, o, 0, len, CHUNK_ABORT);
    memcpy(stage(c, c->send_stage, p, seq), &h, sizeof h);
    int rc = put_chunk(comm, p, seq, (const uint8_t *)req->msg, len, NULL, 0);
    if (rc == MEP_OK)
      rc = mep_signal(comm, p, c->rg, (size_t)comm->rank * 8, seq,
                      MEP_SIGNAL_SET);
    if (rc == MEP_OK) c->sent[p] = seq;
  }
  mep__err_clear();
}

/* Fails the call with the message of s's abort chunk at `payload`. */
static int aborted(mep_req_t *req, int s, const chdr_t *h,
                   const uint8_t *payload) {
  int n = h->total < 400 ? (int)h->total : 400;
  fail(req, MEP_ERR_MISMATCH, "rank %d failed this call: %.*s", s, n,
       (const char *)payload);
  return MEP_ERR_MISMATCH;
}

/* While waiting: an abort of the running call that s sent behind chunks
 * this rank has not come to yet (at most two are staged). */
static int abort_waiting(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  for (int s = 0; o->plan.sparse && s < comm->size; s++) {
    if (s == comm->rank || !o->act[s]) continue;
    for (uint64_t seq = c->consumed[s] + 1;
         seq <= c->consumed[s] + 2 && load(&c->sig[s]) >= seq; seq++) {
      const uint8_t *slot = stage(c, c->recv_stage, s, seq);
      chdr_t h;
      memcpy(&h, slot, sizeof h);
      if (h.magic == HDR_MAGIC && (h.flags & CHUNK_ABORT) &&
          h.seq == o->seq && h.epoch == (uint32_t)o->epoch)
        return aborted(req, s, &h, slot + HDR_BYTES);
    }
  }
  return MEP_OK;
}

/* The header of the next chunk from s, once it is there: 1 ready
 * (*payload and *landed set), 0 not yet, <0 error (request failed). */
static int chunk_from(mep_req_t *req, int s, size_t j, size_t expect,
                      const uint8_t **payload, int *landed) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  chdr_t h;
  const uint8_t *slot;
  for (;;) {
    uint64_t seq = c->consumed[s] + 1;
    if (load(&c->sig[s]) < seq) {
      snprintf(o->waiting, sizeof o->waiting, "waiting for chunk %zu of "
               "step %d from rank %d", j, o->step, s);
      return 0;
    }
    slot = stage(c, c->recv_stage, s, seq);
    memcpy(&h, slot, sizeof h);
    if (!stale(comm, o, &h)) break;
    int rc = release(comm, s);
    if (rc) return rc;
  }
  if (h.magic != HDR_MAGIC || h.sender != (uint32_t)s) {
    fail(req, MEP_ERR_PROTOCOL, "chunk from rank %d has a bad header "
         "(magic %#x, sender %u)", s, h.magic, h.sender);
    return MEP_ERR_PROTOCOL;
  }
  if (h.seq == o->seq && h.epoch > (uint32_t)o->epoch)
    return 0; /* it adopted a newer epoch; so will this rank */
  if ((h.flags & CHUNK_ABORT) && h.seq == o->seq) {
    int rc = aborted(req, s, &h, slot + HDR_BYTES); /* read before release */
    release(comm, s);
    return rc;
  }
  if (h.seq != o->seq || h.digest != o->digest) {
    /* A chunk of an earlier collective was never expected here: take it
     * out of the way, so the next collective starts clean. */
    if (h.seq < o->seq) release(comm, s);
    return mismatch(req, s, &h);
  }
  if (h.total != expect || h.step != (uint32_t)o->step ||
      h.chunk != (uint32_t)j) {
    fail(req, MEP_ERR_MISMATCH, "rank %d sends %llu bytes in step %u but "
         "this rank expects %zu bytes from it in step %d", s,
         (unsigned long long)h.total, h.step, expect, o->step);
    flood_abort(req);
    return MEP_ERR_MISMATCH;
  }
  *payload = slot + HDR_BYTES;
  *landed = h.landed != 0;
  return 1;
}

/* A collective whose ranks disagree: names both calls. */
static int mismatch(mep_req_t *req, int s, const chdr_t *h) {
  op_t *o = req->impl;
  char mine[96], theirs[96];
  describe(mine, sizeof mine, (uint32_t)o->plan.kind, (uint32_t)o->plan.dtype,
           (uint32_t)o->plan.op, o->plan.count, o->plan.root);
  describe(theirs, sizeof theirs, h->kind, h->dtype, h->op, h->count,
           h->root);
  if (h->seq == o->seq) {
    mep__req_set(req, MEP_ERR_MISMATCH, "rank %d called %s but rank %d "
                 "called %s", req->comm->rank, mine, s, theirs);
    flood_abort(req);
  } else {
    mep__req_set(req, MEP_ERR_MISMATCH, "rank %d, in collective #%llu %s, "
                 "holds data rank %d sent in its collective #%llu %s, which "
                 "rank %d did not expect", req->comm->rank,
                 (unsigned long long)o->seq, mine, s,
                 (unsigned long long)h->seq, theirs, req->comm->rank);
  }
  req->comm->coll->failed = o->seq;
  return MEP_ERR_MISMATCH;
}

/* After the last step: data that arrived from a rank this one expected
 * nothing from, in this collective or an earlier one, means the ranks
 * disagreed (a different root, say). Chunks of abandoned attempts are
 * only cleared away. */
static int check_strays(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  for (int s = 0; s < comm->size; s++) {
    if (s == comm->rank || !o->act[s]) continue;
    for (;;) {
      uint64_t seq = c->consumed[s] + 1;
      if (load(&c->sig[s]) < seq) break;
      const uint8_t *slot = stage(c, c->recv_stage, s, seq);
      chdr_t h;
      memcpy(&h, slot, sizeof h);
      int confirm = (h.flags & CHUNK_CONFIRM) && h.seq == o->seq;
      if (stale(comm, o, &h) || confirm) {
        release(comm, s); /* (a confirmation not waited for: stale) */
        continue;
      }
      if (h.magic != HDR_MAGIC || h.seq > o->seq) break; /* next one's */
      int rc = h.flags & CHUNK_ABORT ? aborted(req, s, &h, slot + HDR_BYTES)
                                     : MEP_OK;
      release(comm, s);
      if (rc) return rc;
      return mismatch(req, s, &h);
    }
  }
  return MEP_OK;
}

/* Returns the slot to s: the sender may reuse it. A sender that is gone
 * needs no credit; what it sent before is still good. */
static int release(mep_comm_t *comm, int s) {
  struct mep__coll *c = comm->coll;
  uint64_t seq = ++c->consumed[s];
  c->held[s] = 0; /* this credit covers a held one */
  int rc = mep_signal(comm, s, c->rg,
                      (size_t)(comm->max_size + comm->rank) * 8, seq,
                      MEP_SIGNAL_SET);
  return lost(rc) ? MEP_OK : rc;
}

/* With [core] agreement on, the credit for the last chunk s sends this
 * rank in a collective is held back until this rank holds all its data:
 * a sender that has every such credit back knows every rank holds its
 * data, which is what lets it finish (all_credited). No extra message. */
static int consume(mep_req_t *req, int s, size_t j) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  if (!c->agreement || o->step != o->last_step[s] || j != o->last_chunk[s])
    return release(comm, s);
  c->held[s] = ++c->consumed[s];
  return MEP_OK;
}

/* Sends the credits held back. */
static void release_held(mep_comm_t *comm) {
  struct mep__coll *c = comm->coll;
  for (int s = 0; s < comm->size; s++) {
    if (!c->held[s]) continue;
    mep_signal(comm, s, c->rg, (size_t)(comm->max_size + comm->rank) * 8,
               c->held[s], MEP_SIGNAL_SET);
    c->held[s] = 0;
  }
}

/* Copy mode: chunk j from s into place. */
static int recv_copy(mep_req_t *req, int s, size_t j) {
  struct mep__coll *c = req->comm->coll;
  op_t *o = req->impl;
  const mep__step_t *st = &o->plan.steps[o->step];
  const uint8_t *payload;
  int landed;
  int rc = chunk_from(req, s, j, st->rbytes[s], &payload, &landed);
  if (rc <= 0) return rc;
  size_t len = chunk_len(c, st->rbytes[s], j);
  if (len && !landed) memcpy(st->rptr[s] + j * c->chunk, payload, len);
  rc = consume(req, s, j);
  return rc ? rc : 1;
}

static void aside_reach(mep_req_t *req, size_t end);

/* Reduce mode: contribution of s to chunk j, in rank order over the
 * attempt's active ranks. The first is held (o->pend) and enters with the
 * second; the last leaves with the store: with two ranks one pass makes
 * the output from both, with no accumulator. */
static int recv_reduce(mep_req_t *req, int s, size_t j) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  const mep__step_t *st = &o->plan.steps[o->step];
  mep_dtype_t dt = o->plan.dtype;
  mep_op_t op = st->partial && o->plan.op == MEP_AVG ? MEP_SUM : o->plan.op;
  size_t len = chunk_len(c, st->rlen, j), n = len / mep_dtype_size(dt);
  uint8_t *out = st->rout + j * c->chunk;
  const uint8_t *src = st->rself + j * c->chunk;
  if (s != comm->rank) {
    int landed;
    int rc = chunk_from(req, s, j, st->rlen, &src, &landed);
    if (rc <= 0) return rc;
    if (landed) { /* this rank sent no landing message for a reduction */
      fail(req, MEP_ERR_PROTOCOL, "rank %d put a chunk of a reduction "
           "into this rank's buffer", s);
      return MEP_ERR_PROTOCOL;
    }
  }
  if (s == o->first && s != o->last) {
    o->pend = src;
    return 1;
  }
  aside_reach(req, j * c->chunk + len); /* the last one stores */
  if (s == o->first) { /* the only contribution */
    mep__acc_load(dt, c->acc, src, n);
    mep__acc_store(dt, op, c->acc, out, n, o->nact);
  } else if (o->pend && s == o->last) {
    mep__reduce_pair(dt, op, out, o->pend, src, n, o->nact);
  } else if (o->pend) {
    mep__acc_load_pair(dt, op, c->acc, o->pend, src, n);
  } else if (s == o->last) {
    mep__acc_combine_store(dt, op, c->acc, src, out, n, o->nact);
  } else {
    mep__acc_combine(dt, op, c->acc, src, n);
  }
  int rc = 0;
  if (o->pend && o->first != comm->rank) rc = consume(req, o->first, j);
  o->pend = NULL;
  if (!rc && s != comm->rank) rc = consume(req, s, j);
  return rc ? rc : 1;
}

/* Whether this rank combines contributions in the step; other ranks of a
 * reduce step may still receive plain messages. */
static int reducing(const mep__step_t *st) {
  return st->reduce && st->reduce_here;
}

/* Tells s where its message of this step goes in this rank's buffer
 * (landing, top), where the buffer is registered with s's transport. A
 * put that fails costs only the copy. */
static void send_landing(mep_req_t *req, int s) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  const mep__step_t *st = &o->plan.steps[o->step];
  const mep_region_t *z = o->zreg[1];
  const void *key = NULL;
  size_t klen = z ? mep__region_key(z, comm->peers[s].tp, &key) : 0;
  uintptr_t a = (uintptr_t)st->rptr[s], base = z ? (uintptr_t)z->ptr : 0;
  if (!klen || peer_dead(comm, s) || a < base || st->rbytes[s] > z->len ||
      a - base > z->len - st->rbytes[s])
    return;
  size_t n = (size_t)comm->max_size;
  land_t *m = &c->land[n + (size_t)s];
  *m = (land_t){.seq = o->seq, .digest = o->digest, .off = a - base,
                .rlen = z->len, .epoch = (uint32_t)o->epoch,
                .step = (uint32_t)o->step, .key_len = (uint32_t)klen,
                .magic = LAND_MAGIC};
  memcpy(m->key, key, klen);
  m->sum = land_sum(m);
  int rc = mep_put(comm, s, c->rl, (n + (size_t)s) * sizeof *m, c->rl,
                   (size_t)comm->rank * sizeof *m, sizeof *m);
  if (rc == MEP_OK)
    rc = mep_signal(comm, s, c->rg, (2 * n + (size_t)comm->rank) * 8,
                    ++c->land_sent[s], MEP_SIGNAL_SET);
  if (rc) mep__err_clear();
}

static void aside_wait(mep_req_t *req);

static void start_step(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  const mep__step_t *st = &o->plan.steps[o->step];
  int me = comm->rank;
  /* a late in-place copy ends before a later step writes the buffer */
  if (o->step > 0) aside_wait(req);
  o->sj = o->rj = 0;
  o->sk = o->rs = 0;
  o->pend = NULL;
  o->smax = o->rmax = 0;
  for (int i = 0; i < st->nsends; i++)
    if (nchunks(c, st->sbytes[st->sends[i]]) > o->smax)
      o->smax = nchunks(c, st->sbytes[st->sends[i]]);
  if (reducing(st)) { /* recvs holds this rank too, in rank order */
    o->rmax = nchunks(c, st->rlen);
    o->first = st->recvs[0];
    o->last = st->recvs[st->nrecvs - 1];
    o->started = 1;
    return;
  }
  for (int i = 0; i < st->nrecvs; i++)
    if (nchunks(c, st->rbytes[st->recvs[i]]) > o->rmax)
      o->rmax = nchunks(c, st->rbytes[st->recvs[i]]);
  if (st->send_to[me] && st->recv_from[me] && st->sbytes[me])
    memmove(st->rptr[me], st->sptr[me], st->sbytes[me]);
  for (int i = 0; i < st->nrecvs; i++) {
    int p = st->recvs[i];
    if (o->act[p] && st->rbytes[p] >= c->zc_min) send_landing(req, p);
  }
  o->started = 1;
}

/* Moves the send cursor as far as credits allow: progress made, or <0. */
static int pump_sends(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  op_t *o = req->impl;
  const mep__step_t *st = &o->plan.steps[o->step];
  int moved = 0;
  while (o->sj < o->smax) {
    int p = st->sends[o->sk];
    if (o->sj < nchunks(comm->coll, st->sbytes[p])) {
      int rc = send_chunk(req, p, o->sj);
      if (rc <= 0) return rc < 0 ? rc : moved;
      moved = 1;
    }
    if (++o->sk == st->nsends) o->sk = 0, o->sj++;
  }
  return moved;
}

static int pump_recvs(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  op_t *o = req->impl;
  const mep__step_t *st = &o->plan.steps[o->step];
  int moved = 0;
  while (o->rj < o->rmax) {
    int s = st->recvs[o->rs], rc;
    if (reducing(st) || o->rj < nchunks(comm->coll, st->rbytes[s])) {
      rc = reducing(st) ? recv_reduce(req, s, o->rj)
                        : recv_copy(req, s, o->rj);
      if (rc <= 0) return rc < 0 ? rc : moved;
      moved = 1;
    }
    if (++o->rs == st->nrecvs) o->rs = 0, o->rj++;
  }
  return moved;
}

/* Per sender, the step and chunk of the last chunk it sends this rank in
 * the attempt's data steps. */
static void last_chunks(mep_comm_t *comm, op_t *o) {
  struct mep__coll *c = comm->coll;
  for (int s = 0; s < comm->size; s++) o->last_step[s] = -1;
  for (int k = 0; k < o->plan.ndata; k++) {
    const mep__step_t *st = &o->plan.steps[k];
    for (int i = 0; i < st->nrecvs; i++) {
      int s = st->recvs[i];
      if (s == comm->rank || !o->act[s]) continue;
      o->last_step[s] = k;
      o->last_chunk[s] =
          nchunks(c, reducing(st) ? st->rlen : st->rbytes[s]) - 1;
    }
  }
}

/* (Re)builds the plan over the ranks active now: a collective starts as
 * one attempt per epoch until one commits. */
static int attempt(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  op_t *o = req->impl;
  mep__plan_free(&o->plan);
  o->epoch = mep__ft_epoch(comm);
  if (o->epoch >= (1u << 24))
    return mep__err(MEP_ERR_UNSUPPORTED, "the group changed 2^24 times");
  memcpy(o->act, mep__ft_act(comm), (size_t)comm->max_size);
  o->nact = 0;
  for (int p = 0; p < comm->size; p++) o->nact += o->act[p] != 0;
  release_held(comm);
  o->step = o->started = o->data_done = o->probed = 0;
  o->deadline = mep__now_ms() + (uint64_t)comm->timeout_ms;
  int rc = mep__plan_build(comm, &o->spec, o->act, &comm->coll->opts,
                           &o->plan);
  o->digest = digest_of(&o->plan);
  comm->coll->cur_done = 0;
  if (rc == MEP_OK) last_chunks(comm, o);
  if (o->epoch)
    mep__debug("%s #%llu: attempt at epoch %llu over %d ranks",
               kind_names[o->spec.kind], (unsigned long long)o->seq,
               (unsigned long long)o->epoch, o->nact);
  return rc;
}


/* With [core] agreement on, a collective finishes only once every active
 * rank holds all its data: then a rank lost later cannot leave the
 * survivors with different results. Each rank learns it from the credits
 * it gets back for its last chunks (see consume). */
static int all_credited(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  struct mep__coll *c = comm->coll;
  op_t *o = req->impl;
  if (!c->cur_done) {
    release_held(comm);
    c->cur_done = 1;
  }
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank || !o->act[p]) continue;
    if (load(&c->sig[comm->max_size + p]) < c->sent[p]) {
      snprintf(o->waiting, sizeof o->waiting, "waiting for rank %d to hold "
               "all its data", p);
      return 0;
    }
  }
  return 1;
}

static int index_of(const int *list, int len, int p) {
  int i = 0;
  while (i < len && list[i] != p) i++;
  return i;
}

/* Chunks of the running step already sent to p (n in all): the send
 * cursor passes the step's sends in turn (pump_sends), chunk by chunk. */
static size_t sent_to(const op_t *o, const mep__step_t *st, int p,
                      size_t n) {
  size_t done = o->sj + (index_of(st->sends, st->nsends, p) < o->sk);
  return done < n ? done : n;
}

/* Chunks of the running step already taken from s (n in all): the
 * receive cursor passes the step's recvs in turn (pump_recvs). A
 * reduction's first contribution, held (o->pend), is still in its staging
 * slot. */
static size_t taken_from(const op_t *o, const mep__step_t *st, int s,
                         size_t n) {
  size_t done = o->rj + (index_of(st->recvs, st->nrecvs, s) < o->rs);
  if (reducing(st) && o->pend && s == o->first && done) done--;
  return done < n ? done : n;
}

/* Whether the running attempt still needs p: a chunk this rank has yet to
 * send it, or one from it that is neither taken nor in its staging slots.
 * A rank that closed in order sent everything before it went (the
 * transports say goodbye only behind their last byte), so a rank it owes
 * nothing to may leave without harm to the attempt. */
static int owes(const mep_comm_t *comm, const op_t *o, int p) {
  const struct mep__coll *c = comm->coll;
  if (!o->act[p]) return 0;
  uint64_t want = 0;
  for (int k = o->step; k < o->plan.nsteps; k++) {
    const mep__step_t *st = &o->plan.steps[k];
    int cur = k == o->step && o->started;
    if (st->send_to[p]) {
      size_t n = nchunks(c, st->sbytes[p]);
      if ((cur ? sent_to(o, st, p, n) : 0) < n) return 1;
    }
    if (st->recv_from[p]) {
      size_t n = nchunks(c, reducing(st) ? st->rlen : st->rbytes[p]);
      want += n - (cur ? taken_from(o, st, p, n) : 0);
    }
  }
  return want > load(&c->sig[p]) - c->consumed[p];
}

/* The collective run() works on: the head of the engine's FIFO of
 * collectives (req.c; engine_lock held), once started and until it ended;
 * or NULL. */
static const op_t *running(const mep_comm_t *comm) {
  const op_t *o = comm->coll_head ? comm->coll_head->impl : NULL;
  return o && o->seq && !o->finishing ? o : NULL;
}

/* Whether p may leave (closing in order) without failing the running
 * collective (comm->coll_done_from, for ft.c). With agreement on: p told
 * this rank it holds all data, and this rank holds its own. Off: the
 * running attempt needs nothing more of p. */
static int done_from(const mep_comm_t *comm, int p) {
  const struct mep__coll *c = comm->coll;
  if (c->agreement)
    return c->cur_done && load(&c->sig[comm->max_size + p]) >= c->sent[p];
  const op_t *o = running(comm);
  return o && !owes(comm, o, p);
}

/* Agreement off: whether the attempt can still finish over the ranks
 * active now, those dropped owing it nothing. */
static int attempt_alive(const mep_comm_t *comm, const op_t *o) {
  const uint8_t *act = mep__ft_act(comm);
  for (int p = 0; p < comm->size; p++)
    if (p != comm->rank && !act[p] && owes(comm, o, p)) return 0;
  return 1;
}

/* This rank holds all its data. A plan that confirms it to every rank in
 * steps of its own (plan.h) tells its partners now, through the credits
 * held back, rather than at the end: a partner that leaves after it
 * finished is then no failure (done_from). */
static void mark_data_done(mep_req_t *req) {
  op_t *o = req->impl;
  if (o->data_done) return;
  o->data_done = 1;
  if (o->plan.ndata < o->plan.nsteps) {
    release_held(req->comm);
    req->comm->coll->cur_done = 1;
  }
}

/* Whether this rank knows every rank holds its data, as far as [core]
 * agreement asks: from the plan's confirming steps, all passed, or from
 * the credits. */
static int all_hold(mep_req_t *req) {
  op_t *o = req->impl;
  if (!req->comm->coll->agreement) return 1;
  if (o->plan.ndata < o->plan.nsteps) return o->step == o->plan.nsteps;
  return all_credited(req);
}

static int commit(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  op_t *o = req->impl;
  comm->coll->cur_done = 0;
  release_held(comm);
  req->dropped = malloc((size_t)comm->max_size * sizeof *req->dropped);
  if (!req->dropped)
    return fail(req, MEP_ERR_NOMEM, "out of memory");
  mep__ft_commit(comm, o->seq, o->act, req->dropped, &req->ndropped);
  if (check_strays(req) != MEP_OK) return MEP__ADV_DONE;
  if (req->ndropped) {
    char list[256] = "";
    size_t len = 0;
    for (int i = 0; i < req->ndropped && len < sizeof list - 16; i++)
      len += (size_t)snprintf(list + len, sizeof list - len, " %d",
                              req->dropped[i]);
    mep__req_set(req, MEP_OK_DEGRADED, "finished over the survivors; "
                 "dropped ranks:%s", list);
  } else {
    mep__req_set(req, MEP_OK, NULL);
  }
  return MEP__ADV_DONE;
}

/* The whole input goes aside now, and every attempt reads it there;
 * restore: an all-reduce whose buffer is put back if the call fails. */
static void aside_now(mep_req_t *req, int restore) {
  op_t *o = req->impl;
  uint8_t *aside = req->comm->coll->aside;
  memcpy(aside, o->spec.send, o->spec.copy_bytes);
  o->spec.send = aside;
  if (restore) o->restore = o->spec.recv;
}

/* In place: the input goes aside into memory the communicator keeps (and
 * reuses: no allocation and page faults per call once it is large
 * enough), so every attempt reads it as the caller passed it.
 *
 * A two-shot all-reduce does not wait for that copy where the process
 * has CPUs to spare: the copier thread copies it while the first step
 * runs (copier.h). That step writes only this rank's block of the buffer
 * (the block's reduction), which the copier copies first, and each chunk
 * of the block is aside before its reduction is stored (aside_reach);
 * all of the buffer is aside before the second step writes the
 * buffer (it lands the other ranks' blocks there), before another attempt
 * starts (which then reads the copy: aside_switch) and before the call
 * returns. So the first attempt reads the caller's buffer: what it sends
 * in the first step is untouched, and its reduction reads each element of
 * its block before it writes it. */
static int aside_start(mep_req_t *req) {
  struct mep__coll *c = req->comm->coll;
  op_t *o = req->impl;
  size_t n = o->spec.copy_bytes;
  if (!n) return MEP_OK;
  if (n > c->aside_cap) {
    uint8_t *p = realloc(c->aside, n);
    if (!p) return mep__err(MEP_ERR_NOMEM, "out of memory for the in-place "
                            "copy of %zu bytes", n);
    c->aside = p;
    c->aside_cap = n;
  }
  int same = o->spec.kind == MEP__COLL_ALLREDUCE &&
             o->spec.send == o->spec.recv;
  o->aside_late = same && n > c->opts.two_shot;
  if (o->aside_late && !c->copier && c->copier_ok > 0 &&
      mep__copier_new(&c->copier) != MEP_OK) {
    mep__warn("in-place all-reduces copy their input before they start: "
              "%s", mep_last_error());
    mep__err_clear();
    c->copier_ok = -1;
  }
  o->aside_late = o->aside_late && c->copier;
  if (!o->aside_late) aside_now(req, same);
  return MEP_OK;
}

/* After the first attempt's plan: with a late copy, hands the copy to the
 * copier, the block the first step writes first (recv_reduce waits for
 * the part it overwrites: aside_reach); a plan
 * of another shape (a one-shot over the survivors, say) gets the whole
 * copy now and is made again. */
static int aside_plan(mep_req_t *req) {
  struct mep__coll *c = req->comm->coll;
  op_t *o = req->impl;
  if (!o->aside_late) return MEP_OK;
  const mep__step_t *st = &o->plan.steps[0];
  uintptr_t buf = (uintptr_t)o->spec.recv, out = (uintptr_t)st->rout;
  size_t n = o->spec.copy_bytes;
  if (!strcmp(o->plan.algo, MEP__ALGO_TWO_SHOT) && reducing(st) &&
      out >= buf && st->rlen <= n && out - buf <= n - st->rlen) {
    size_t lo = (size_t)(out - buf);
    mep__copier_start(c->copier, c->aside, o->spec.send, n, lo,
                      lo + st->rlen);
    o->aside_busy = 1;
    o->restore = o->spec.recv;
    return MEP_OK;
  }
  o->aside_late = 0;
  aside_now(req, 1);
  return attempt(req);
}

/* Before the first step stores bytes [0, end) of this rank's block: they
 * are aside by then. */
static void aside_reach(mep_req_t *req, size_t end) {
  op_t *o = req->impl;
  if (o->aside_busy && o->step == 0)
    mep__copier_reach(req->comm->coll->copier, end);
}

/* Returns once a late copy is done. */
static void aside_wait(mep_req_t *req) {
  op_t *o = req->impl;
  if (!o->aside_busy) return;
  mep__copier_wait(req->comm->coll->copier);
  o->aside_busy = 0;
}

/* Another attempt starts: from here on every attempt reads the copy. */
static void aside_switch(mep_req_t *req) {
  op_t *o = req->impl;
  if (!o->aside_late) return;
  aside_wait(req);
  o->spec.send = req->comm->coll->aside;
  o->aside_late = 0;
}

/* The end of the furthest of n blocks of count[p] elements at displ[p]
 * (alltoallv's), in bytes. */
static size_t v_extent(const size_t *count, const size_t *displ, size_t n,
                       size_t ds) {
  size_t e = 0;
  for (size_t p = 0; p < n; p++)
    if (count[p] && (displ[p] + count[p]) * ds > e)
      e = (displ[p] + count[p]) * ds;
  return e;
}

/* The bytes of the caller's buffers that this rank's plan uses directly:
 * of the input, what it sends from (after copy_aside); of the output,
 * what all-reduce's and broadcast's second step sends from and what copy
 * steps land in (landing, top). 0: none (a root of reduce or gather, a
 * non-root of scatter send nothing, and may pass anything; reductions
 * compute their output here). */
static void buffer_extents(const mep_comm_t *comm, const mep__coll_spec_t *s,
                           size_t *in, size_t *out) {
  size_t n = (size_t)comm->size, ds = mep_dtype_size(s->dtype);
  size_t b = s->count * ds;
  int root = s->root == comm->rank;
  *in = *out = 0;
  switch (s->kind) {
  case MEP__COLL_ALLREDUCE: *in = *out = b; break;
  case MEP__COLL_BROADCAST: *out = b; break;
  case MEP__COLL_REDUCE: *in = root ? 0 : b; break;
  case MEP__COLL_GATHER:
    *in = root ? 0 : b;
    *out = n * b;
    break;
  case MEP__COLL_ALLGATHER:
    *in = b;
    *out = n * b;
    break;
  case MEP__COLL_SCATTER:
    *in = root ? n * b : 0;
    *out = b;
    break;
  case MEP__COLL_REDUCE_SCATTER: *in = n * b; break;
  case MEP__COLL_ALLTOALL: *in = *out = n * b; break;
  case MEP__COLL_ALLTOALLV:
    *in = v_extent(s->v, s->v + n, n, ds);
    *out = v_extent(s->v + 2 * n, s->v + 3 * n, n, ds);
    break;
  default: break;
  }
  if (!s->send) *in = 0;
  if (!s->recv) *out = 0;
}

/* Registers (or finds registered) the buffers large enough for chunks to
 * leave from them, or to land in them. A registration that fails only
 * costs the copy. */
static void zc_setup(mep_req_t *req) {
  struct mep__coll *c = req->comm->coll;
  op_t *o = req->impl;
  size_t in, out;
  buffer_extents(req->comm, &o->spec, &in, &out);
  if (in >= c->zc_min &&
      mep__lregs_get(c->lregs, o->spec.send, in, &o->zreg[0]) != MEP_OK)
    o->zreg[0] = NULL;
  if (out >= c->zc_min && o->spec.recv == o->spec.send && out == in)
    o->zreg[1] = o->zreg[0]; /* in place, copied aside late */
  else if (out >= c->zc_min &&
           mep__lregs_get(c->lregs, o->spec.recv, out, &o->zreg[1]) != MEP_OK)
    o->zreg[1] = NULL;
  mep__err_clear(); /* a refusal is no error of the call */
}

/* Whether the transports are done with every zero-copy write: until then
 * they may still read the caller's buffers, which the caller may reuse or
 * free once the collective returns. A peer whose connection was closed
 * (dropped from the group) has nothing left to read. */
static int zc_drained(mep_comm_t *comm) {
  struct mep__coll *c = comm->coll;
  for (int p = 0; p < comm->size; p++)
    if (c->zc_issued[p] > atomic_load(&comm->zc_done[p]) &&
        comm->peers[p].ep)
      return 0;
  return 1;
}

/* The deadline passed: probe the peers before blaming them. A peer that
 * does not answer leaves the group (and the attempt starts again over the
 * others); if every peer answers, they are alive but not calling this
 * collective, and it fails (MEP__ADV_DONE). */
static int overdue(mep_req_t *req, uint64_t now) {
  mep_comm_t *comm = req->comm;
  op_t *o = req->impl;
  if (!o->probed) {
    mep__info("%s #%llu passed its deadline, %s: probing the peers",
              kind_names[o->spec.kind], (unsigned long long)o->seq,
              o->waiting);
    o->probed = 1;
    o->probe_end = now + 2 * mep__ft_probe_ms(comm) + 100;
    mep__ft_probe(comm);
    return MEP__ADV_WAIT;
  }
  if (now < o->probe_end) return MEP__ADV_WAIT;
  return fail(req, MEP_ERR_TIMEOUT, "%s: still %s, nothing moved for %d ms "
              "(every rank answers probes: it is alive but not taking part)",
              o->plan.algo, o->waiting, comm->timeout_ms);
}

static int run(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  op_t *o = req->impl;
  int moved = 0;
  if (!o->seq) { /* its turn came: collectives start in call order */
    o->seq = ++comm->coll->seq;
    int rc = aside_start(req);
    if (rc == MEP_OK) rc = attempt(req);
    if (rc == MEP_OK) rc = aside_plan(req);
    if (rc == MEP_OK) zc_setup(req);
    if (rc) return fail(req, rc, "%s", mep_last_error());
  }
  if (mep__ft_excluded(comm))
    return fail(req, MEP_ERR_EXCLUDED, "the other ranks dropped this rank "
                "from the group (it was unreachable or too slow)");
  uint64_t epoch = mep__ft_epoch(comm);
  if (o->epoch != epoch && o->kept != epoch) {
    if (mep__ft_decided(comm) >= o->seq) {
      /* another survivor finished it: with agreement on, every rank had
       * its data then; off, this rank finishes the same attempt, unless
       * it waits for a rank that is gone */
      if (o->data_done) return commit(req);
      if (comm->coll->agreement || !attempt_alive(comm, o))
        return fail(req, MEP_ERR_PEER_FAILED, "ranks were lost after some "
                    "survivors finished it and this rank lacks their data "
                    "([core] agreement is off)");
      mep__debug("%s #%llu: finishing the attempt of epoch %llu, which "
                 "others finished", kind_names[o->spec.kind],
                 (unsigned long long)o->seq, (unsigned long long)o->epoch);
      o->kept = epoch;
    } else {
      aside_switch(req);
      int rc = attempt(req);
      if (rc) return fail(req, rc, "%s", mep_last_error());
      moved = 1;
    }
  }
  if (mep__ft_agreeing(comm)) {
    if (o->data_done && mep__ft_may_commit(comm) && all_hold(req))
      return commit(req);
    return moved ? MEP__ADV_MOVED : MEP__ADV_WAIT;
  }
  while (o->step < o->plan.nsteps) {
    if (o->step >= o->plan.ndata) mark_data_done(req);
    if (!o->started) start_step(req);
    int s = pump_sends(req);
    int r = s < 0 ? 0 : pump_recvs(req);
    if (s < 0 || r < 0) {
      int rc = s < 0 ? s : r;
      if (req->status < 0) return MEP__ADV_DONE; /* already described */
      return fail(req, rc, "%s", mep_last_error());
    }
    moved |= s | r;
    if (o->sj < o->smax || o->rj < o->rmax) break;
    o->step++;
    o->started = 0;
  }
  if (o->step == o->plan.nsteps) mark_data_done(req);
  if (o->step == o->plan.nsteps && all_hold(req)) return commit(req);
  uint64_t now = mep__now_ms();
  /* The deadline is on silence, not on the whole collective: a large one
   * that keeps moving over a slow network is not cut short. */
  if (moved) {
    o->deadline = now + (uint64_t)comm->timeout_ms;
    o->probed = 0;
  }
  /* An abort is an error path and its scan is of every rank: once a ms. */
  if (!moved && now != o->abort_seen) {
    o->abort_seen = now;
    if (abort_waiting(req) != MEP_OK) return MEP__ADV_DONE;
  }
  if (now >= o->deadline && overdue(req, now) == MEP__ADV_DONE)
    return MEP__ADV_DONE;
  return moved ? MEP__ADV_MOVED : MEP__ADV_WAIT;
}

/* Runs the collective; once it ended (its outcome set), holds it until the
 * transports are done with its zero-copy writes. With agreement on they
 * nearly always are: every peer returned the credit of the last chunk.
 * A peer that keeps the bytes unread past the timeout (it stopped reading
 * yet is still connected) is waited for no longer, with an error logged. */
static int advance(mep_req_t *req) {
  mep_comm_t *comm = req->comm;
  op_t *o = req->impl;
  if (!o->finishing) {
    int rc = run(req);
    if (rc != MEP__ADV_DONE) return rc;
    aside_wait(req); /* it reads the caller's buffer */
    /* peers that had a landing message may still put into the caller's
     * buffer: not once the call returned (landing, top) */
    if (req->status < 0 && o->zreg[1]) {
      mep__lregs_drop(comm->coll->lregs, o->zreg[1]);
      if (o->zreg[0] == o->zreg[1]) o->zreg[0] = NULL;
      o->zreg[1] = NULL;
    }
    /* nothing lands in it any more: a failed in-place all-reduce leaves
     * the caller's buffer as it was */
    if (req->status < 0 && o->restore)
      memcpy(o->restore, comm->coll->aside, o->spec.copy_bytes);
    o->finishing = 1;
    o->fin_deadline = mep__now_ms() + (uint64_t)comm->timeout_ms;
  }
  if (!zc_drained(comm)) {
    if (mep__now_ms() < o->fin_deadline) return MEP__ADV_WAIT;
    mep__error("%s #%llu: a peer still holds its zero-copy sends unread "
               "after %d ms; finishing without them",
               kind_names[o->spec.kind], (unsigned long long)o->seq,
               comm->timeout_ms);
  }
  return MEP__ADV_DONE;
}

static void cleanup(mep_req_t *req) {
  op_t *o = req->impl;
  mep__plan_free(&o->plan);
  mep__coll_spec_free(&o->spec);
  free(o->act);
  free(o->last_step);
  free(o->last_chunk);
  free(o);
}

int mep__coll_start(mep_comm_t *comm, mep__coll_spec_t *spec,
                    const mep__req_hooks_t *hooks, mep_req_t **out) {
  op_t *o = calloc(1, sizeof *o);
  size_t n = (size_t)comm->max_size;
  uint8_t *act = o ? calloc(n, 1) : NULL;
  int *ls = o ? calloc(n, sizeof *ls) : NULL;
  size_t *lc = o ? calloc(n, sizeof *lc) : NULL;
  mep_req_t *req = act && ls && lc ? mep__req_new(comm, MEP__REQ_COLL,
                                                  advance, o, cleanup)
                                   : NULL;
  if (!req) {
    free(act);
    free(ls);
    free(lc);
    free(o);
    mep__coll_spec_free(spec);
    return mep__err(MEP_ERR_NOMEM, "out of memory");
  }
  if (hooks) req->hooks = *hooks;
  o->spec = *spec;
  o->act = act;
  o->last_step = ls;
  o->last_chunk = lc;
  memset(spec, 0, sizeof *spec);
  return mep__req_start(req, out);
}
