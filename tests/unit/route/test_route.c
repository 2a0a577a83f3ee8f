/* Unit tests of transport selection: list parsing, card encoding, and the
 * pick for pairs of cards, checked against the documented rules and for
 * agreement between both ends of every pair. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "error.h"
#include "route.h"

/* A reachability oracle: transport "near" reaches only same-host peers. */
static int reach(void *arg, const char *name, int peer,
                 const mep__card_tp_t *ptp, char *why, size_t len) {
  const mep__card_t *me = arg;
  (void)peer;
  if (strcmp(name, "near") != 0) return 1;
  if (ptp->addr_len == strlen(me->host_id) &&
      memcmp(ptp->addr, me->host_id, ptp->addr_len) == 0)
    return 1;
  snprintf(why, len, "other host");
  return 0;
}

static void add_tp(mep__card_t *c, const char *name, int available) {
  c->tp = realloc(c->tp, (size_t)(c->ntp + 1) * sizeof *c->tp);
  mep__card_tp_t *t = &c->tp[c->ntp++];
  memset(t, 0, sizeof *t);
  t->name = strdup(name);
  t->available = available;
  t->reason = strdup(available ? "" : "no device");
  t->addr_len = strlen(c->host_id);
  t->addr = malloc(t->addr_len);
  memcpy(t->addr, c->host_id, t->addr_len);
}

static void add_rule(mep__card_t *c, int is_peer, int peer, const char *host,
                     const char *tp) {
  c->rules = realloc(c->rules, (size_t)(c->nrules + 1) * sizeof *c->rules);
  mep__rule_t *r = &c->rules[c->nrules++];
  r->is_peer = is_peer;
  r->peer = peer;
  r->host = strdup(host ? host : "");
  r->transport = strdup(tp);
  r->origin = strdup(is_peer ? "[peer] in t.ini:1" : "[host] in t.ini:2");
}

static mep__card_t card(int rank, const char *host, const char *tps) {
  mep__card_t c = {0};
  c.rank = rank;
  c.host_id = strdup(host);
  c.hostname = strdup(host);
  char *list = strdup(tps), *save = NULL;
  for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
    add_tp(&c, t[0] == '!' ? t + 1 : t, t[0] != '!');
  free(list);
  return c;
}

/* Both ends must pick the same; returns it (or NULL) and the rc. */
static const char *pick_both(mep__card_t *a, mep__card_t *b, int *rc) {
  const char *x = NULL, *y = NULL;
  int ra = mep__route_pick(a, b, reach, a, &x);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", mep_last_error());
  int rb = mep__route_pick(b, a, reach, b, &y);
  CHECK(ra == rb, "ends disagree on the outcome: %d (%s) vs %d (%s)", ra, msg,
        rb, mep_last_error());
  CHECK(ra != MEP_OK || strcmp(x, y) == 0, "ends picked %s and %s", x, y);
  *rc = ra;
  return ra == MEP_OK ? x : NULL;
}

static void expect(mep__card_t *a, mep__card_t *b, const char *want) {
  int rc;
  const char *got = pick_both(a, b, &rc);
  CHECK(rc == MEP_OK, "pick failed: %s", mep_last_error());
  CHECK(strcmp(got, want) == 0, "picked %s, want %s", got, want);
}

static void test_priority(void) {
  mep__card_t a = card(0, "h1", "near,tcp"), b = card(1, "h1", "near,tcp");
  mep__card_t c = card(2, "h2", "near,tcp");
  expect(&a, &b, "near");
  expect(&a, &c, "tcp"); /* near does not reach another host */
  /* The lower rank's order decides. */
  mep__card_t d = card(3, "h1", "tcp,near");
  expect(&a, &d, "near");
  expect(&d, &a, "near");
  /* Unavailable on one side: skipped. */
  mep__card_t e = card(4, "h1", "!near,tcp");
  expect(&a, &e, "tcp");
  mep__card_free(&a), mep__card_free(&b), mep__card_free(&c);
  mep__card_free(&d), mep__card_free(&e);
}

static void test_unreachable(void) {
  mep__card_t a = card(0, "h1", "near"), b = card(5, "h2", "near,!rdma");
  int rc;
  pick_both(&a, &b, &rc);
  CHECK(rc == MEP_ERR_UNREACHABLE, "rc %d", rc);
  mep__route_pick(&a, &b, reach, &a, &(const char *){0});
  CHECK_MSG("rank 5");
  CHECK_MSG("near: other host");
  CHECK_MSG("rdma: not allowed on rank 0");
  mep__card_free(&a), mep__card_free(&b);
}

static void test_overrides(void) {
  mep__card_t a = card(0, "h1", "near,tcp"), b = card(1, "h1", "near,tcp");
  mep__card_t c = card(2, "h1", "near,tcp");
  add_rule(&a, 1, 1, NULL, "tcp"); /* [peer 1] on rank 0 only */
  expect(&a, &b, "tcp");
  expect(&a, &c, "near"); /* the rule touches rank 1 only */
  /* Host rule, and a peer rule beats it whichever comes first. */
  mep__card_t d = card(3, "h1", "near,tcp"), e = card(4, "h1", "near,tcp");
  add_rule(&d, 0, -1, "h1", "tcp");
  add_rule(&d, 1, 4, NULL, "near");
  expect(&d, &e, "near");
  expect(&d, &c, "tcp");
  /* Contradicting rules on the two ends. */
  add_rule(&b, 1, 1, NULL, "near");
  int rc;
  pick_both(&a, &b, &rc);
  CHECK(rc == MEP_ERR_CONFIG, "rc %d", rc);
  mep__route_pick(&a, &b, reach, &a, &(const char *){0});
  CHECK_MSG("t.ini:1");
  /* A forced transport that cannot work is an error, not a fallback. */
  mep__card_t f = card(6, "h2", "near,tcp");
  add_rule(&f, 1, 6, NULL, "near");
  pick_both(&a, &f, &rc);
  CHECK(rc == MEP_ERR_UNREACHABLE, "rc %d", rc);
  mep__card_free(&a), mep__card_free(&b), mep__card_free(&c);
  mep__card_free(&d), mep__card_free(&e), mep__card_free(&f);
}

static void test_card_codec(void) {
  mep__card_t a = card(7, "host-x", "near,!rdma,tcp");
  add_rule(&a, 1, 3, NULL, "tcp");
  add_rule(&a, 0, -1, "gpu-7", "near");
  mep__wbuf_t b = {0};
  mep__card_encode(&a, &b);
  CHECK(!b.oom, "encode");
  mep__card_t d;
  CHECK_OK(mep__card_decode(b.data, b.len, &d));
  CHECK(d.rank == 7 && d.ntp == 3 && d.nrules == 2, "fields");
  CHECK(strcmp(d.tp[1].name, "rdma") == 0 && !d.tp[1].available, "tp");
  CHECK(strcmp(d.tp[1].reason, "no device") == 0, "reason");
  CHECK(strcmp(d.rules[1].host, "gpu-7") == 0 && d.rules[0].peer == 3, "rules");
  mep__card_free(&d);
  /* Every truncation and random corruption is refused or decodes to a
   * well-formed card; never a crash (ASan watches). */
  for (size_t cut = 0; cut < b.len; cut++)
    CHECK_RC(mep__card_decode(b.data, cut, &d), MEP_ERR_PROTOCOL);
  uint64_t s = 42;
  for (int i = 0; i < 20000; i++) {
    uint8_t *m = malloc(b.len);
    memcpy(m, b.data, b.len);
    for (int k = 0; k < 3; k++)
      m[splitmix64(&s) % b.len] = (uint8_t)splitmix64(&s);
    if (mep__card_decode(m, b.len, &d) == MEP_OK) mep__card_free(&d);
    free(m);
  }
  mep__wbuf_free(&b);
  mep__card_free(&a);
}

static void parse(const char *list, const char *want, int want_explicit) {
  char *names[8];
  int n, ex;
  CHECK_OK(mep__route_parse_list(list, "nvlink,ibgda,verbs,tcp", names, 8, &n,
                                 &ex));
  char got[256] = "";
  for (int i = 0; i < n; i++) {
    strcat(got, i ? "," : "");
    strcat(got, names[i]);
    free(names[i]);
  }
  CHECK(strcmp(got, want) == 0, "'%s' parsed as '%s', want '%s'",
        list ? list : "(default)", got, want);
  CHECK(ex == want_explicit, "'%s' explicit=%d", list ? list : "", ex);
}

static void test_lists(void) {
  parse(NULL, "nvlink,ibgda,verbs,tcp", 0);
  parse("tcp", "tcp", 1);
  parse(" shm , tcp ", "shm,tcp", 1);
  parse("^verbs,ibgda", "nvlink,tcp", 0);
  parse("^nothing", "nvlink,ibgda,verbs,tcp", 0);
  char *names[8];
  int n, ex;
  const char *bad[] = {"", "^", "tcp,,shm", "tcp,", ",tcp",
                       "^nvlink,ibgda,verbs,tcp"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    CHECK_RC(mep__route_parse_list(bad[i], "nvlink,ibgda,verbs,tcp", names, 8,
                                   &n, &ex), MEP_ERR_CONFIG);
}

int main(void) {
  test_lists();
  test_card_codec();
  test_priority();
  test_unreachable();
  test_overrides();
  printf("ok\n");
  return 0;
}
