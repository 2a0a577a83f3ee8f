/* route.c - the pure part of transport selection: cards and the choice. */
#include "route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* ------------------------------------------------------------- cards */

void mep__card_encode(const mep__card_t *c, mep__wbuf_t *b) {
  mep__wbuf_u32(b, (uint32_t)c->rank);
  mep__wbuf_str(b, c->host_id);
  mep__wbuf_str(b, c->hostname);
  mep__wbuf_u32(b, (uint32_t)c->ntp);
  for (int i = 0; i < c->ntp; i++) {
    const mep__card_tp_t *t = &c->tp[i];
    mep__wbuf_str(b, t->name);
    mep__wbuf_u32(b, (uint32_t)t->available);
    mep__wbuf_str(b, t->reason);
    mep__wbuf_bytes(b, t->addr, t->addr_len);
  }
  mep__wbuf_u32(b, (uint32_t)c->nrules);
  for (int i = 0; i < c->nrules; i++) {
    const mep__rule_t *r = &c->rules[i];
    mep__wbuf_u32(b, (uint32_t)r->is_peer);
    mep__wbuf_u64(b, (uint64_t)r->peer);
    mep__wbuf_str(b, r->host);
    mep__wbuf_str(b, r->transport);
    mep__wbuf_str(b, r->origin);
  }
}

/* Counts in a card are bounded by what its blob could hold. */
static int count_ok(uint32_t n, const mep__rbuf_t *b) {
  return !b->bad && n <= b->len - b->pos;
}

int mep__card_decode(const void *blob, size_t len, mep__card_t *c) {
  mep__rbuf_t b = {.data = blob, .len = len};
  memset(c, 0, sizeof *c);
  c->rank = (int)mep__rbuf_u32(&b);
  c->host_id = mep__rbuf_str(&b);
  c->hostname = mep__rbuf_str(&b);
  uint32_t ntp = mep__rbuf_u32(&b);
  if (!count_ok(ntp, &b)) goto bad;
  c->tp = calloc(ntp ? ntp : 1, sizeof *c->tp);
  if (!c->tp) goto bad;
  c->ntp = (int)ntp;
  for (uint32_t i = 0; i < ntp && !b.bad; i++) {
    mep__card_tp_t *t = &c->tp[i];
    t->name = mep__rbuf_str(&b);
    t->available = mep__rbuf_u32(&b) != 0;
    t->reason = mep__rbuf_str(&b);
    const void *a = mep__rbuf_bytes(&b, &t->addr_len);
    if (a && t->addr_len) {
      t->addr = malloc(t->addr_len);
      if (!t->addr) goto bad;
      memcpy(t->addr, a, t->addr_len);
    }
  }
  uint32_t nrules = mep__rbuf_u32(&b);
  if (!count_ok(nrules, &b)) goto bad;
  c->rules = calloc(nrules ? nrules : 1, sizeof *c->rules);
  if (!c->rules) goto bad;
  c->nrules = (int)nrules;
  for (uint32_t i = 0; i < nrules && !b.bad; i++) {
    mep__rule_t *r = &c->rules[i];
    r->is_peer = mep__rbuf_u32(&b) != 0;
    r->peer = (int64_t)mep__rbuf_u64(&b);
    r->host = mep__rbuf_str(&b);
    r->transport = mep__rbuf_str(&b);
    r->origin = mep__rbuf_str(&b);
  }
  if (b.bad || b.pos != b.len || !c->host_id || !c->hostname) goto bad;
  return MEP_OK;
bad:
  mep__card_free(c);
  return mep__err(MEP_ERR_PROTOCOL, "malformed card of %zu bytes", len);
}

void mep__card_free(mep__card_t *c) {
  for (int i = 0; c->tp && i < c->ntp; i++) {
    free(c->tp[i].name);
    free(c->tp[i].reason);
    free(c->tp[i].addr);
  }
  for (int i = 0; c->rules && i < c->nrules; i++) {
    free(c->rules[i].host);
    free(c->rules[i].transport);
    free(c->rules[i].origin);
  }
  free(c->tp);
  free(c->rules);
  free(c->host_id);
  free(c->hostname);
  memset(c, 0, sizeof *c);
}

/* ------------------------------------------------------------ choosing */

static int host_matches(const char *name, const mep__card_t *c) {
  return strcmp(name, c->hostname) == 0 || strcmp(name, c->host_id) == 0;
}

/* The first rule of `owner` that touches the pair (a, b): [peer] rules
 * before [host] rules, each in file order. */
static const mep__rule_t *first_rule(const mep__card_t *owner,
                                     const mep__card_t *a,
                                     const mep__card_t *b) {
  for (int pass = 1; pass >= 0; pass--) {
    for (int i = 0; i < owner->nrules; i++) {
      const mep__rule_t *r = &owner->rules[i];
      if (r->is_peer != pass) continue;
      if (r->is_peer ? (r->peer == a->rank || r->peer == b->rank)
                     : (host_matches(r->host, a) || host_matches(r->host, b)))
        return r;
    }
  }
  return NULL;
}

static const mep__card_tp_t *find_tp(const mep__card_t *c, const char *name) {
  for (int i = 0; i < c->ntp; i++)
    if (strcmp(c->tp[i].name, name) == 0) return &c->tp[i];
  return NULL;
}

/* Whether `name` works for the pair; on 0 writes why into `why`. */
static int usable(const mep__card_t *me, const mep__card_t *peer,
                  const char *name, mep__reach_fn reach, void *arg,
                  char *why, size_t why_len) {
  const mep__card_t *sides[2] = {me, peer};
  for (int s = 0; s < 2; s++) {
    const mep__card_tp_t *t = find_tp(sides[s], name);
    if (!t) {
      snprintf(why, why_len, "not allowed on rank %d", sides[s]->rank);
      return 0;
    }
    if (!t->available) {
      snprintf(why, why_len, "unavailable on rank %d (%s)", sides[s]->rank,
               t->reason && *t->reason ? t->reason : "no reason given");
      return 0;
    }
  }
  why[0] = '\0';
  int r = reach(arg, name, peer->rank, find_tp(peer, name), why, why_len);
  if (r <= 0 && !why[0])
    snprintf(why, why_len, r < 0 ? "reachability check failed: %s"
                                  : "unreachable%s", r < 0 ? mep_last_error()
                                                           : "");
  return r > 0;
}

static int pick_forced(const mep__card_t *me, const mep__card_t *peer,
                       const mep__rule_t *rule, mep__reach_fn reach,
                       void *arg, const char **name) {
  char why[512];
  if (!usable(me, peer, rule->transport, reach, arg, why, sizeof why))
    return mep__err(MEP_ERR_UNREACHABLE,
                    "route from rank %d to rank %d: override %s forces "
                    "transport '%s', which is %s", me->rank, peer->rank,
                    rule->origin, rule->transport, why);
  *name = find_tp(me, rule->transport)->name;
  return MEP_OK;
}

int mep__route_pick(const mep__card_t *me, const mep__card_t *peer,
                    mep__reach_fn reach, void *arg, const char **name) {
  const mep__rule_t *mine = first_rule(me, me, peer);
  const mep__rule_t *theirs = first_rule(peer, me, peer);
  if (mine && theirs && strcmp(mine->transport, theirs->transport) != 0)
    return mep__err(MEP_ERR_CONFIG,
                    "route between rank %d and rank %d: rank %d's override "
                    "(%s) says '%s' but rank %d's (%s) says '%s'; give both "
                    "ranks the same configuration", me->rank, peer->rank,
                    me->rank, mine->origin, mine->transport, peer->rank,
                    theirs->origin, theirs->transport);
  if (mine || theirs)
    return pick_forced(me, peer, mine ? mine : theirs, reach, arg, name);

  const mep__card_t *lo = me->rank < peer->rank ? me : peer;
  const mep__card_t *hi = lo == me ? peer : me;
  char reasons[2048] = "", why[512];
  size_t used = 0;
  const mep__card_t *order[2] = {lo, hi};
  for (int s = 0; s < 2; s++) {
    for (int i = 0; i < order[s]->ntp; i++) {
      const char *tn = order[s]->tp[i].name;
      if (s == 1 && find_tp(lo, tn)) continue; /* already judged */
      if (s == 0 && usable(me, peer, tn, reach, arg, why, sizeof why)) {
        *name = find_tp(me, tn)->name;
        return MEP_OK;
      }
      if (s == 1) snprintf(why, sizeof why, "not allowed on rank %d", lo->rank);
      if (used < sizeof reasons)
        used += (size_t)snprintf(reasons + used, sizeof reasons - used,
                                 "%s%s: %s", used ? "; " : "", tn, why);
    }
  }
  return mep__err(MEP_ERR_UNREACHABLE,
                  "no transport reaches rank %d from rank %d (%s)",
                  peer->rank, me->rank, used ? reasons : "no transports");
}

/* ------------------------------------------------------------- lists */

static int split(const char *list, char **out, int max, int *n) {
  *n = 0;
  for (const char *s = list; *s;) {
    size_t len = strcspn(s, ",");
    const char *e = s + len;
    while (s < e && (*s == ' ' || *s == '\t')) s++;
    const char *t = e;
    while (t > s && (t[-1] == ' ' || t[-1] == '\t')) t--;
    if (t == s)
      return mep__err(MEP_ERR_CONFIG, "transport list '%s' has an empty "
                                      "entry", list);
    if (*n == max)
      return mep__err(MEP_ERR_CONFIG, "transport list '%s' has more than "
                                      "%d entries", list, max);
    out[*n] = strndup(s, (size_t)(t - s));
    if (!out[*n]) return mep__err(MEP_ERR_NOMEM, "out of memory");
    (*n)++;
    s = *e ? e + 1 : e;
    if (*e && !*s)
      return mep__err(MEP_ERR_CONFIG, "transport list '%s' ends with ','",
                      list);
  }
  return MEP_OK;
}

static void free_names(char **names, int n) {
  for (int i = 0; i < n; i++) free(names[i]);
}

int mep__route_parse_list(const char *list, const char *default_list,
                          char **out, int max, int *n, int *explicit_list) {
  *n = 0;
  *explicit_list = list != NULL;
  if (!list) list = default_list;
  while (*list == ' ') list++;
  if (!*list || strcmp(list, "^") == 0)
    return mep__err(MEP_ERR_CONFIG, "transport list is empty");
  if (*list != '^') {
    int rc = split(list, out, max, n);
    if (rc) free_names(out, *n), *n = 0;
    return rc;
  }
  *explicit_list = 0;
  char *excl[64], *all[64];
  int nexcl = 0, nall = 0;
  int rc = split(list + 1, excl, 64, &nexcl);
  if (rc == MEP_OK) rc = split(default_list, all, 64, &nall);
  for (int i = 0; rc == MEP_OK && i < nall; i++) {
    int skip = 0;
    for (int j = 0; j < nexcl; j++) skip |= strcmp(all[i], excl[j]) == 0;
    if (skip) continue;
    if (*n == max) {
      rc = mep__err(MEP_ERR_CONFIG, "too many transports");
      break;
    }
    out[(*n)++] = all[i];
    all[i] = NULL;
  }
  if (rc == MEP_OK && *n == 0)
    rc = mep__err(MEP_ERR_CONFIG, "transport list '%s' excludes every "
                                  "transport", list);
  free_names(excl, nexcl);
  free_names(all, nall);
  if (rc) free_names(out, *n), *n = 0;
  return rc;
}

const mep__card_tp_t *mep__card_find(const mep__card_t *card,
                                     const char *name) {
  for (int i = 0; i < card->ntp; i++)
    if (strcmp(card->tp[i].name, name) == 0) return &card->tp[i];
  return NULL;
}
