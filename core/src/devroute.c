/* devroute.c - the transport that serves GPU kernels for each peer
 * (devroute.h). */
#include "devroute.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "error.h"
#include "log.h"
#include "plugin.h"
#include "route.h"

/* The choice among the transports of one kind for one peer. */
typedef struct entry {
  int state;       /* 0: not chosen yet, 1: chosen, -1: none serves it */
  int64_t inc;     /* the peer's incarnation it was chosen for */
  int own_ep;      /* the route opened its connection (close it) */
  mep__devroute_t r;
  char why[512];
} entry_t;

#define NKINDS (MEP_DEV_PROXY + 1)

struct mep__devroutes {
  pthread_mutex_t mu;
  uint64_t gen; /* of the last choice */
  entry_t *e;   /* [max_size][NKINDS] */
};

/* Appends "; <fmt>" to why. */
static void note(char *why, size_t len, const char *fmt, ...)
    MEP_PRINTF(3, 4);
static void note(char *why, size_t len, const char *fmt, ...) {
  size_t at = strlen(why);
  if (at + 3 >= len) return;
  if (at) at += (size_t)snprintf(why + at, len - at, "; ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why + at, len - at, fmt, ap);
  va_end(ap);
}

/* The descriptor functions its kind needs: the peer and region parts,
 * and for kinds whose kernels name their own memory (MEP_DEV_MLX5) the
 * local part too. */
static int has_descriptors(const mep_transport_t *vt, mep_dev_kind_t kind) {
  if (!MEP_TP_HAS(vt, mep_transport_t, device_region) ||
      !vt->device_descriptor || !vt->device_region)
    return 0;
  return kind != MEP_DEV_MLX5 ||
         (MEP_TP_HAS(vt, mep_transport_t, device_local) && vt->device_local);
}

/* A transport may serve kernels of `kind` for peers at all: it runs, the
 * user did not rule it out, and it declares that kind. */
static int eligible(const mep__tp_t *tp, const char *only, int kind,
                    char *why, size_t len) {
  if (!tp->ctx) return 0; /* not running here: the card says why */
  if ((int)tp->props.dev_kind != kind) return 0;
  if (strcmp(only, "auto") != 0 && strcmp(only, tp->name) != 0) {
    note(why, len, "%s: not [core] device_transport (%s)", tp->name, only);
    return 0;
  }
  if (!has_descriptors(tp->vt, tp->props.dev_kind)) {
    note(why, len, "%s: declares device kind %d but not the descriptors it "
         "needs (a plugin older than transport ABI %s)", tp->name,
         (int)tp->props.dev_kind,
         tp->props.dev_kind == MEP_DEV_MLX5 ? "1.6" : "1.3");
    return 0;
  }
  return 1;
}

/* The peer part of tp's descriptor for p, checked: 1, 0 when the
 * transport does not reach p from kernels (why noted), or an error. */
static int describe(mep__tp_t *tp, int p, mep__devroute_t *r, char *why,
                    size_t len) {
  r->desc_len = sizeof r->desc;
  mep__err_clear();
  int rc = tp->vt->device_descriptor(tp->ctx, p, r->desc, &r->desc_len);
  if (rc == MEP_ERR_UNREACHABLE) {
    note(why, len, "%s: %s", tp->name, mep_last_error());
    return 0;
  }
  if (rc) return mep__err_wrap(rc, "%s: device descriptor of rank %d",
                               tp->name, p);
  const mep_dev_desc_t *h = (const mep_dev_desc_t *)r->desc;
  if (r->desc_len < sizeof *h || r->desc_len > sizeof r->desc ||
      h->size != r->desc_len || h->kind != (uint16_t)tp->props.dev_kind)
    return mep__err(MEP_ERR_PROTOCOL, "%s: device descriptor of rank %d: "
                    "%zu bytes, header says kind %u and %u bytes (the "
                    "transport declares kind %d)", tp->name, p, r->desc_len,
                    h->kind, h->size, (int)tp->props.dev_kind);
  r->kind = tp->props.dev_kind;
  return 1;
}

/* Tries transport t for peer p (card: p's): 1 chosen, 0 not (why noted),
 * or an error. */
static int try_tp(mep_comm_t *comm, int t, int p, const mep__card_t *card,
                  entry_t *e, char *why, size_t len) {
  mep__tp_t *tp = &comm->tps[t];
  const mep__card_tp_t *ptp = mep__card_find(card, tp->name);
  if (!ptp || !ptp->available) {
    note(why, len, "%s: not running on rank %d", tp->name, p);
    return 0;
  }
  char r[256] = "";
  int ok = tp->vt->reachable(tp->ctx, p, ptp->addr, ptp->addr_len, r,
                             sizeof r);
  if (ok < 0) return mep__err_wrap(ok, "%s: reachable(rank %d)", tp->name, p);
  if (!ok) {
    note(why, len, "%s: %s", tp->name, r);
    return 0;
  }
  /* The route's own connection when the same transport carries it. */
  const mep__peer_t *peer = &comm->peers[p];
  e->own_ep = !(peer->tp == t && peer->ep);
  e->r.ep = e->own_ep ? NULL : peer->ep;
  if (e->own_ep) {
    mep__err_clear();
    int rc = tp->vt->connect(tp->ctx, p, ptp->addr, ptp->addr_len, &e->r.ep);
    if (rc) return mep__err_wrap(rc, "%s: connect to rank %d for GPU "
                                 "kernels", tp->name, p);
  }
  ok = describe(tp, p, &e->r, why, len);
  if (ok != 1 && e->own_ep) tp->vt->close(e->r.ep);
  if (ok != 1) e->r.ep = NULL;
  e->r.tp = t;
  return ok;
}

/* Chooses among the transports of `kind`, in the communicator's order. */
static int choose(mep_comm_t *comm, int p, int kind, entry_t *e,
                  uint64_t gen) {
  const char *only = mep_config_get(comm->cfg, "core", "device_transport");
  if (!only) only = mep_config_default("core", "device_transport");
  mep__card_t card;
  memset(&card, 0, sizeof card);
  int rc = mep__comm_fetch_card(comm, p, &card);
  e->why[0] = '\0';
  for (int t = 0; rc == MEP_OK && t < comm->ntps; t++) {
    if (!eligible(&comm->tps[t], only, kind, e->why, sizeof e->why))
      continue;
    int ok = try_tp(comm, t, p, &card, e, e->why, sizeof e->why);
    if (ok < 0) rc = ok;
    if (ok == 1) break;
  }
  mep__card_free(&card);
  if (rc) return rc;
  e->state = e->r.ep ? 1 : -1;
  e->r.gen = gen;
  e->inc = comm->incarnation[p];
  if (!e->why[0])
    snprintf(e->why, sizeof e->why, "no transport of this communicator "
             "declares a device kind (%d asked for)", kind);
  if (e->state == 1)
    mep__info("GPU kernels reach rank %d through %s (device kind %d)", p,
              comm->tps[e->r.tp].name, kind);
  else
    mep__debug("GPU kernels reach rank %d through no transport of device "
               "kind %d: %s", p, kind, e->why);
  return MEP_OK;
}

static void forget(mep_comm_t *comm, entry_t *e) {
  if (e->state == 1 && e->own_ep) comm->tps[e->r.tp].vt->close(e->r.ep);
  memset(e, 0, sizeof *e);
}

static int table(mep_comm_t *comm, struct mep__devroutes **out) {
  if (!comm->devroutes) {
    struct mep__devroutes *d = calloc(1, sizeof *d);
    if (d) d->e = calloc((size_t)comm->max_size * NKINDS, sizeof *d->e);
    if (!d || !d->e) {
      free(d);
      return mep__err(MEP_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&d->mu, NULL);
    comm->devroutes = d;
  }
  *out = comm->devroutes;
  return MEP_OK;
}

int mep__devroute_get(mep_comm_t *comm, int peer, unsigned kinds,
                      const mep__devroute_t **out, char *why,
                      size_t why_len) {
  *out = NULL;
  if (peer < 0 || peer >= comm->max_size || peer == comm->rank)
    return mep__err(MEP_ERR_INVALID, "device route to rank %d", peer);
  struct mep__devroutes *d = NULL;
  int rc = table(comm, &d);
  if (rc) return rc;
  char all[1024] = "";
  pthread_mutex_lock(&d->mu);
  /* kinds in the order of their values: a mapped pointer before requests
   * that kernels post */
  for (int k = MEP_DEV_PTR; rc == MEP_OK && k < NKINDS; k++) {
    if (!(kinds & MEP__DEV_KINDS(k))) continue;
    entry_t *e = &d->e[(size_t)peer * NKINDS + (size_t)k];
    if (e->state && e->inc != comm->incarnation[peer]) forget(comm, e);
    if (!e->state) rc = choose(comm, peer, k, e, ++d->gen);
    if (rc == MEP_OK && e->state == 1) {
      *out = &e->r;
      break;
    }
    if (rc == MEP_OK) note(all, sizeof all, "%s", e->why);
  }
  if (rc == MEP_OK && !*out) {
    if (!all[0]) snprintf(all, sizeof all, "no device kind asked for");
    if (why && why_len) snprintf(why, why_len, "%s", all);
    rc = mep__err(MEP_ERR_UNREACHABLE, "no transport serves GPU kernels "
                  "for rank %d: %s", peer, all);
  }
  pthread_mutex_unlock(&d->mu);
  return rc;
}

int mep__devroute_current(mep_comm_t *comm, int peer, uint64_t gen) {
  struct mep__devroutes *d = comm->devroutes;
  if (!d || peer < 0 || peer >= comm->max_size) return 0;
  pthread_mutex_lock(&d->mu);
  int cur = 0;
  for (int k = 0; k < NKINDS; k++) {
    const entry_t *e = &d->e[(size_t)peer * NKINDS + (size_t)k];
    cur |= e->state == 1 && e->r.gen == gen;
  }
  pthread_mutex_unlock(&d->mu);
  return cur;
}

void mep__devroute_fini(mep_comm_t *comm) {
  struct mep__devroutes *d = comm->devroutes;
  if (!d) return;
  for (size_t i = 0; i < (size_t)comm->max_size * NKINDS; i++)
    forget(comm, &d->e[i]);
  pthread_mutex_destroy(&d->mu);
  free(d->e);
  free(d);
  comm->devroutes = NULL;
}
