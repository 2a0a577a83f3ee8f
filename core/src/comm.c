/* comm.c - the creation steps of a communicator: store keys, the job
 * secret, transports, cards, routes and connections; and unloading the
 * transports at the end. Creation (comm_api.c) and recovery (recover.c)
 * call these; they call only the leaves (store, plugin, route, config). */
#include "comm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "config.h"
#include "error.h"
#include "log.h"
#include "plugin.h"

#define MAX_TRANSPORTS 32

/* ------------------------------------------------------------- store keys */

static char *key(const mep_comm_t *comm, const char *fmt, int a, int b) {
  char tail[128];
  snprintf(tail, sizeof tail, fmt, a, b);
  size_t len = strlen(comm->ns) + strlen(tail) + 2;
  char *k = malloc(len);
  if (k) snprintf(k, len, "%s/%s", comm->ns, tail);
  return k;
}

/* Gets a key into malloc'ed memory, with the communicator's deadline and a
 * message that says what was awaited from whom. */
static int store_get(mep_comm_t *comm, const char *what, int from,
                     const char *k, void **val, size_t *len) {
  int rc = comm->store->get(comm->store->ctx, k, val, len, comm->timeout_ms);
  if (rc)
    return mep__err_wrap(rc, "rank %d: waiting for %s of rank %d (store key "
                             "'%s', %d ms)", comm->rank, what, from, k,
                         comm->timeout_ms);
  return MEP_OK;
}

static int exchange_secret(mep_comm_t *comm) {
  char *k = key(comm, "secret", 0, 0);
  if (!k) return mep__err(MEP_ERR_NOMEM, "out of memory");
  int rc;
  if (comm->rank == 0 && !comm->joining) {
    if (getrandom(comm->secret, sizeof comm->secret, 0) !=
        (ssize_t)sizeof comm->secret)
      rc = mep__err_errno(MEP_ERR_SYSTEM, errno, "getrandom");
    else
      rc = comm->store->set(comm->store->ctx, k, comm->secret,
                            sizeof comm->secret);
  } else {
    void *val = NULL;
    size_t len = 0;
    rc = store_get(comm, "the job secret", 0, k, &val, &len);
    if (rc == MEP_OK && len != sizeof comm->secret)
      rc = mep__err(MEP_ERR_PROTOCOL, "job secret in '%s' has %zu bytes, "
                                      "not %zu", k, len, sizeof comm->secret);
    if (rc == MEP_OK) memcpy(comm->secret, val, len);
    free(val);
  }
  free(k);
  return rc;
}

/* --------------------------------------------------------- transports */

/* Loads and initialises one transport; a transport that cannot run here is
 * recorded in the card with its reason, not an error, unless the user named
 * it and it does not even load. */
static int load_transport(mep_comm_t *comm, const char *name, int explicit_,
                          mep__tp_t *tp, mep__card_tp_t *ctp) {
  ctp->name = strdup(name);
  tp->name = strdup(name);
  if (!ctp->name || !tp->name) return mep__err(MEP_ERR_NOMEM, "out of memory");
  int rc = mep_plugin_find(name, &tp->plugin);
  if (rc == MEP_OK) {
    tp->vt = tp->plugin->vt;
    rc = mep_plugin_env_open(&tp->env, comm->cfg, tp->plugin);
    /* A bad value in the user's configuration is the user's error, not
     * a transport that cannot run here. */
    if (rc == MEP_ERR_CONFIG) return rc;
  }
  if (rc == MEP_OK) {
    tp->env.rank = comm->rank;
    tp->env.size = comm->max_size;
    tp->env.secret = comm->secret;
    tp->env.secret_len = sizeof comm->secret;
    tp->env.timeout_ms = comm->timeout_ms;
    mep__err_clear();
    rc = tp->vt->init(&tp->env, &tp->ctx);
    if (rc && !*mep_last_error()) mep__err(rc, "init failed");
    if (rc) mep__err_wrap(rc, "transport %s", name);
  }
  if (rc == MEP_OK) {
    tp->props.struct_size = sizeof tp->props;
    tp->props.event_fd = -1;
    rc = tp->vt->props(tp->ctx, &tp->props);
  }
  uint8_t addr[MEP_TP_MAX_ADDR];
  size_t alen = sizeof addr;
  if (rc == MEP_OK) rc = tp->vt->address(tp->ctx, addr, &alen);
  if (rc == MEP_OK && alen > sizeof addr)
    rc = mep__err(MEP_ERR_PROTOCOL, "transport %s: address of %zu bytes",
                  name, alen);
  if (rc == MEP_OK) {
    ctp->addr = malloc(alen ? alen : 1);
    if (!ctp->addr) return mep__err(MEP_ERR_NOMEM, "out of memory");
    memcpy(ctp->addr, addr, alen);
    ctp->addr_len = alen;
    ctp->available = 1;
    mep__debug("transport %s: loaded from %s", name, tp->plugin->path);
    return MEP_OK;
  }
  /* Not usable here: fatal only when explicitly named and not loadable. */
  int fatal = explicit_ && tp->vt == NULL;
  ctp->reason = strdup(mep_last_error());
  if (!fatal) /* a fatal error goes to the caller instead */
    mep__log(explicit_ ? MEP_LOG_WARN : MEP_LOG_DEBUG,
             "transport %s not used: %s", name, mep_last_error());
  if (tp->ctx) tp->vt->fini(tp->ctx);
  tp->ctx = NULL;
  return fatal ? rc : MEP_OK;
}

static void unload_transport(mep__tp_t *tp) {
  if (tp->ctx) tp->vt->fini(tp->ctx);
  mep_plugin_env_fini(&tp->env);
  mep_plugin_close(tp->plugin);
  free(tp->name);
  memset(tp, 0, sizeof *tp);
}

/* MEP_TRANSPORTS, else [core] transports, else the default; a list
 * starting with '^' removes names from the list that would apply without
 * it. */
static int load_transports(mep_comm_t *comm) {
  const char *env = getenv("MEP_TRANSPORTS");
  const char *cfg = mep_config_get(comm->cfg, "core", "transports");
  const char *list = env && *env ? env : cfg;
  const char *base = env && *env && cfg && *cfg != '^'
                         ? cfg
                         : mep_config_default("core", "transports");
  const char *origin = env && *env ? "MEP_TRANSPORTS"
                                   : mep__config_origin(comm->cfg, "core",
                                                        "transports");
  char *names[MAX_TRANSPORTS];
  int n = 0, explicit_ = 0;
  int rc = mep__route_parse_list(list, base, names, MAX_TRANSPORTS, &n,
                                 &explicit_);
  if (rc) return mep__err_wrap(rc, "%s", origin);
  comm->tps = calloc((size_t)n, sizeof *comm->tps);
  comm->card.tp = calloc((size_t)n, sizeof *comm->card.tp);
  if (!comm->tps || !comm->card.tp) rc = mep__err(MEP_ERR_NOMEM, "oom");
  for (int i = 0; rc == MEP_OK && i < n; i++) {
    comm->ntps = comm->card.ntp = i + 1;
    rc = load_transport(comm, names[i], explicit_, &comm->tps[i],
                        &comm->card.tp[i]);
    if (rc)
      mep__err_wrap(rc, "%s names transport '%s'", origin, names[i]);
  }
  for (int i = 0; i < n; i++) free(names[i]);
  return rc;
}

/* ---------------------------------------------------------------- cards */

static int add_rule(mep__card_t *card, int is_peer, int64_t peer,
                    const char *host, const char *transport,
                    const char *origin) {
  mep__rule_t *rules =
      realloc(card->rules, (size_t)(card->nrules + 1) * sizeof *rules);
  if (!rules) return mep__err(MEP_ERR_NOMEM, "out of memory");
  card->rules = rules;
  mep__rule_t *r = &rules[card->nrules++];
  memset(r, 0, sizeof *r);
  r->is_peer = is_peer;
  r->peer = peer;
  r->host = strdup(host ? host : "");
  r->transport = strdup(transport);
  r->origin = strdup(origin);
  if (!r->host || !r->transport || !r->origin)
    return mep__err(MEP_ERR_NOMEM, "out of memory");
  return MEP_OK;
}

/* [peer N] and [host NAME] sections with a transport key. */
static int collect_rules(mep_comm_t *comm) {
  size_t ns = mep__config_section_count(comm->cfg);
  for (size_t i = 0; i < ns; i++) {
    const char *sec = mep__config_section_name(comm->cfg, i);
    int is_peer = strncmp(sec, "peer ", 5) == 0;
    if (!is_peer && strncmp(sec, "host ", 5) != 0) continue;
    const char *tname = mep_config_get(comm->cfg, sec, "transport");
    if (!tname) continue;
    char origin[512];
    snprintf(origin, sizeof origin, "[%s] in %s", sec,
             mep__config_origin(comm->cfg, sec, "transport"));
    int rc = add_rule(&comm->card, is_peer,
                      is_peer ? strtoll(sec + 5, NULL, 10) : -1,
                      is_peer ? NULL : sec + 5, tname, origin);
    if (rc) return rc;
  }
  return MEP_OK;
}

static int publish_card(mep_comm_t *comm) {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  comm->card.rank = comm->rank;
  comm->card.host_id = strdup(mep_host_id());
  comm->card.hostname = strdup(host);
  if (!comm->card.host_id || !comm->card.hostname)
    return mep__err(MEP_ERR_NOMEM, "out of memory");
  int rc = collect_rules(comm);
  if (rc) return rc;
  mep__wbuf_t b = {0};
  mep__card_encode(&comm->card, &b);
  char *k = key(comm, "card/%d", comm->rank, 0);
  rc = b.oom || !k ? mep__err(MEP_ERR_NOMEM, "out of memory")
                   : comm->store->set(comm->store->ctx, k, b.data, b.len);
  free(k);
  mep__wbuf_free(&b);
  return rc;
}

int mep__comm_fetch_card(mep_comm_t *comm, int peer, mep__card_t *card) {
  char *k = key(comm, "card/%d", peer, 0);
  void *val = NULL;
  size_t len = 0;
  int rc = k ? store_get(comm, "the transport card", peer, k, &val, &len)
             : mep__err(MEP_ERR_NOMEM, "out of memory");
  if (rc == MEP_OK) rc = mep__card_decode(val, len, card);
  if (rc == MEP_OK && card->rank != peer)
    rc = mep__err(MEP_ERR_PROTOCOL, "store key '%s' holds the card of rank "
                                    "%d", k, card->rank);
  free(val);
  free(k);
  return rc;
}

/* ---------------------------------------------------------------- routes */

static int tp_index(const mep_comm_t *comm, const char *name) {
  for (int i = 0; i < comm->ntps; i++) /* an unloaded one has no name */
    if (comm->tps[i].name && strcmp(comm->tps[i].name, name) == 0) return i;
  return -1;
}

static int reach_cb(void *arg, const char *name, int peer,
                    const mep__card_tp_t *peer_tp, char *why, size_t why_len) {
  mep_comm_t *comm = arg;
  int t = tp_index(comm, name);
  if (t < 0 || !comm->tps[t].ctx) { /* closed: no peer used it */
    snprintf(why, why_len, "%s is not running on this rank", name);
    return 0;
  }
  mep__tp_t *tp = &comm->tps[t];
  /* A route carries the core's own host memory (staging, rings, the
   * control channel); a transport of device memory only serves the CUDA
   * kernel path (cuda_kpath.c). Both sides load the same plugin, so both
   * see the same props. */
  if (!(tp->props.mem_kinds & MEP_TP_MEM_HOST)) {
    snprintf(why, why_len, "%s carries CUDA memory only (it serves the "
             "CUDA collectives, not the route)", name);
    return 0;
  }
  return tp->vt->reachable(tp->ctx, peer, peer_tp->addr, peer_tp->addr_len,
                           why, why_len);
}

static int choose_route(mep_comm_t *comm, int p, const mep__card_t *card) {
  const char *name;
  int rc = mep__route_pick(&comm->card, card, reach_cb, comm, &name);
  if (rc) return rc;
  int t = tp_index(comm, name);
  comm->peers[p].tp = t;
  mep__info("route to rank %d: %s", p, name);
  return MEP_OK;
}

static int choose_routes(mep_comm_t *comm, mep__card_t *cards) {
  comm->peers[comm->rank].tp = MEP_SELF_ROUTE;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank) continue;
    int rc = choose_route(comm, p, &cards[p]);
    if (rc) return rc;
    comm->tps[comm->peers[p].tp].used = 1;
  }
  return MEP_OK;
}

/* Connects to rank p over tp, at the address p's card gives for tp (the
 * route was picked from that card, so it has one). */
static int connect_over(mep_comm_t *comm, int p, mep__tp_t *tp,
                        const mep__card_t *card, mep_tp_ep_t **ep) {
  const mep__card_tp_t *ptp = mep__card_find(card, tp->name);
  mep__err_clear();
  int rc = tp->vt->connect(tp->ctx, p, ptp->addr, ptp->addr_len, ep);
  return rc ? mep__err_wrap(rc, "rank %d: connect to rank %d over %s",
                            comm->rank, p, tp->name)
            : MEP_OK;
}

int mep__comm_connect_peer(mep_comm_t *comm, int p, const mep__card_t *card,
                           mep_tp_ep_t **ep) {
  int rc = choose_route(comm, p, card);
  if (rc) return rc;
  mep__tp_t *tp = &comm->tps[comm->peers[p].tp];
  /* A running progress thread polls the transports it started with. */
  if (!tp->ctx || (comm->progress && !tp->used))
    return mep__err(MEP_ERR_UNREACHABLE, "rank %d: route to rank %d is %s, "
                    "which this rank does not run (no rank used it when the "
                    "communicator was made)", comm->rank, p, tp->name);
  tp->used = 1;
  return connect_over(comm, p, tp, card, ep);
}

/* Ranks connect to their peers in increasing rank order; for the smallest
 * unconnected pair (i, j) both ranks have finished every smaller pair and
 * stand at (i, j), so the order cannot deadlock whatever the transports. */
static int connect_all(mep_comm_t *comm, mep__card_t *cards) {
  for (int p = 0; p < comm->size; p++) {
    mep__peer_t *peer = &comm->peers[p];
    if (p == comm->rank) continue;
    int rc = connect_over(comm, p, &comm->tps[peer->tp], &cards[p],
                          &peer->ep);
    if (rc) return rc;
  }
  return MEP_OK;
}

/* Transports no peer uses are closed right away, but for one that runs
 * and declares a device kind: GPU kernels may reach peers through it
 * later (devsel.c). */
static void drop_unused(mep_comm_t *comm) {
  for (int i = 0; i < comm->ntps; i++) {
    mep__tp_t *tp = &comm->tps[i];
    int device = tp->ctx && tp->props.dev_kind != MEP_DEV_NONE;
    if (!tp->used && tp->plugin && !device) unload_transport(tp);
  }
}

/* ----------------------------------------------------------- together */

int mep__comm_secret_and_card(mep_comm_t *comm) {
  int rc = exchange_secret(comm);
  if (rc == MEP_OK) rc = load_transports(comm);
  if (rc == MEP_OK) rc = publish_card(comm);
  return rc;
}

int mep__comm_connect(mep_comm_t *comm) {
  mep__card_t *cards = calloc((size_t)comm->size, sizeof *cards);
  if (!cards) return mep__err(MEP_ERR_NOMEM, "out of memory");
  int rc = mep__comm_secret_and_card(comm);
  for (int p = 0; rc == MEP_OK && p < comm->size; p++)
    if (p != comm->rank) rc = mep__comm_fetch_card(comm, p, &cards[p]);
  if (rc == MEP_OK) rc = choose_routes(comm, cards);
  if (rc == MEP_OK) drop_unused(comm);
  if (rc == MEP_OK) rc = connect_all(comm, cards);
  for (int p = 0; p < comm->size; p++) mep__card_free(&cards[p]);
  free(cards);
  return rc;
}

void mep__comm_unload(mep_comm_t *comm) {
  for (int i = 0; i < comm->ntps; i++) unload_transport(&comm->tps[i]);
  mep__card_free(&comm->card);
}
