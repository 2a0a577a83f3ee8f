/* check_reconnect.c - reconnect (ABI 1.1): a rank is dropped and replaced.
 * After data moved both ways, rank 1 closes its endpoint and finis its
 * context, and rank 0 (the survivor) closes its endpoint of rank 1, then
 * connects to a new context of rank 1 (a new address blob, the same rank
 * and secret), and data moves again; then the same with the roles
 * swapped, so the new connection is made once by each side of the
 * plugin's set-up. After its close() the survivor's poll() must report
 * nothing more about the old connection: a late failure report would be
 * taken for one of the replacement. Every byte is compared, and the bytes
 * around the writes must stay as they were. Plugins of ABI 1.0 skip it. */
#include <stdio.h>

#include "checks.h"
#include "link.h"
#include "pattern.h"
#include "sess.h"

#define PC_DATA0 64        /* words before: one ADD counter per round */
#define PC_ROUNDS 3        /* before, after rank 1's, after rank 0's */
#define PC_QUIET_MS 100    /* how long poll must stay silent after close */
#define PC_GAP_MAX 63

static const uint64_t k_sizes[] = {1, 7, 4097, 65537, (1u << 20) + 3};
#define PC_NSIZES (sizeof k_sizes / sizeof k_sizes[0])

typedef struct rc_state {
  pc_worker_t *w;
  pc_sess_t s;
  pc_region_t src, dst;
  pc_remote_t rdst;
  uint64_t sizes[PC_NSIZES];
  size_t n_sizes;
  uint64_t len; /* of each region */
} rc_state_t;

/* Sizes above the cap (--quick) or the plugin's max_message are left out;
 * both ranks get the same list, from the same props. */
static void pick_sizes(rc_state_t *t) {
  uint64_t cap = pc_big_size(t->w), max_msg = t->s.props.max_message;
  t->n_sizes = 0;
  for (size_t i = 0; i < PC_NSIZES; i++)
    if (k_sizes[i] <= cap && (!max_msg || k_sizes[i] <= max_msg))
      t->sizes[t->n_sizes++] = k_sizes[i];
  if (t->n_sizes == 0) pc_skip("max_message is below every size tested");
  t->len = PC_DATA0 + 4096;
  for (size_t i = 0; i < t->n_sizes; i++)
    t->len += t->sizes[i] + PC_GAP_MAX + 1;
}

/* A fresh context's regions, shared with the peer. */
static void setup(rc_state_t *t) {
  pc_region_reg(&t->s, &t->src, t->len);
  pc_region_reg(&t->s, &t->dst, t->len);
  pc_region_share(&t->s, &t->dst, &t->rdst);
}

/* Where the i-th write of `from` lands in round r, with which stream. */
typedef struct place {
  uint64_t off, len, seed;
} place_t;

static place_t place(const rc_state_t *t, int round, int from, size_t i) {
  pc_rng_t r;
  pc_rng_seed(&r, pc_seed_for(t->w->seed, 0x7c00u + (uint64_t)round,
                              (uint64_t)from, 0));
  uint64_t off = PC_DATA0;
  place_t p = {0};
  for (size_t k = 0; k <= i; k++) {
    off += 1 + pc_rng_range(&r, 0, PC_GAP_MAX);
    p.off = off;
    p.len = t->sizes[k];
    p.seed = pc_rng_next(&r);
    off += p.len;
  }
  return p;
}

static uint64_t background(const rc_state_t *t, int round) {
  return pc_seed_for(t->w->seed, 0xb6, (uint64_t)t->w->rank,
                     (uint64_t)round);
}

/* Each rank writes every size into the peer's region with an ADD after
 * each, and checks what the peer wrote into its own. */
static void exchange(rc_state_t *t, int round, const char *when) {
  pc_sess_t *s = &t->s;
  int me = t->w->rank, peer = s->peer;
  uint64_t bg = background(t, round);
  pc_region_fill(&t->dst, PC_DATA0, t->dst.len - PC_DATA0, bg, PC_DATA0);
  pc_link_barrier(1, "the barrier before a round of writes");
  for (size_t i = 0; i < t->n_sizes; i++) {
    place_t p = place(t, round, me, i);
    pc_region_fill(&t->src, p.off, p.len, p.seed, 0);
    pc_write(s, &t->src, p.off, &t->rdst, p.off, p.len);
    pc_signal(s, &t->rdst, 8 * (uint64_t)round, 1, MEP_SIGNAL_ADD);
  }
  char what[256];
  snprintf(what, sizeof what, "rank %d's %zu writes %s", peer, t->n_sizes,
           when);
  uint64_t v = pc_wait_word(s, &t->dst, 8 * (size_t)round, t->n_sizes, what);
  if (v != t->n_sizes)
    pc_fail("the signal word reads %llu after %zu ADDs of 1 %s",
            (unsigned long long)v, t->n_sizes, when);
  pc_wait_all(s, what);
  uint64_t at = PC_DATA0;
  for (size_t i = 0; i < t->n_sizes; i++) {
    place_t p = place(t, round, peer, i);
    snprintf(what, sizeof what, "a write of %llu bytes from rank %d %s",
             (unsigned long long)p.len, peer, when);
    pc_region_expect(&t->dst, at, p.off - at, bg, at,
                     "the bytes before a write (a write landed elsewhere)");
    pc_region_expect(&t->dst, p.off, p.len, p.seed, 0, what);
    at = p.off + p.len;
  }
  pc_region_expect(&t->dst, at, t->dst.len - at, bg, at,
                   "the bytes after the writes (a write landed elsewhere)");
  pc_link_barrier(1, "the barrier after a round of writes");
}

/* The rank being replaced: everything of its context goes, then a new
 * context of the same rank connects. */
static void replace_self(rc_state_t *t) {
  pc_remote_release(&t->s, &t->rdst);
  pc_region_dereg(&t->s, &t->src);
  pc_region_dereg(&t->s, &t->dst);
  pc_sess_close_alone(&t->s, 0);
  pc_link_send_u64(PC_TAG_VALUE, 1);
  pc_sess_init(&t->s, t->w);
  pc_sess_connect(&t->s);
  setup(t);
  pc_info("rank %d: a new context of this rank connected", t->w->rank);
}

/* The survivor: closes its endpoint of the rank that left, checks that
 * nothing more is reported about it, and connects to the new context. */
static void drop_and_reconnect(rc_state_t *t) {
  pc_sess_t *s = &t->s;
  s->allow_failures = 1; /* the close of the leaving rank may be reported */
  pc_link_recv_u64(PC_TAG_VALUE, "word that the other rank's context is "
                   "gone");
  pc_remote_release(s, &t->rdst);
  int64_t t0 = pc_now_ns();
  pc_call_begin("close");
  int rc = s->tp->close(s->ep);
  pc_call_end();
  if (rc != 0)
    pc_fail("close of the endpoint of rank %d, whose context was finalised, "
            "failed: %s", s->peer, pc_err(rc));
  int64_t ms = (pc_now_ns() - t0) / 1000000;
  size_t reported = s->n_fails;
  int64_t until = pc_now_ms() + PC_QUIET_MS;
  while (pc_now_ms() < until) pc_relax(s, pc_progress(s));
  if (s->n_fails != reported)
    pc_fail("after close of its endpoint, poll reported %s about rank %d "
            "(status %s); the ABI says nothing more comes, or it would be "
            "taken for news of the rank's replacement",
            s->fails[reported].token == MEP_TP_TOKEN_NONE ? "a failure"
                                                          : "a write",
            s->peer, mep_strerror(s->fails[reported].status));
  pc_info("rank %d: closed the endpoint of the finalised rank %d in %lld ms "
          "(%zu failure reports before)",
          t->w->rank, s->peer, (long long)ms, reported);
  pc_sess_connect(s);
  /* From now on a failure report ends the check: the new connection is
   * healthy, and the old one was closed. */
  s->allow_failures = 0;
  pc_region_share(s, &t->dst, &t->rdst);
}

void pc_check_reconnect(pc_worker_t *w) {
  if (w->tp->abi_minor < 1)
    pc_skip("the plugin implements ABI %u.%u; connecting to a replaced rank "
            "is ABI 1.1",
            w->tp->abi_major, w->tp->abi_minor);
  rc_state_t t = {.w = w};
  pc_sess_open(&t.s, w);
  pick_sizes(&t);
  setup(&t);
  exchange(&t, 0, "before any rank was replaced");
  static const char *const when[] = {"", "after rank 1 was replaced",
                                     "after rank 0 was replaced"};
  for (int round = 1; round < PC_ROUNDS; round++) {
    int leaving = round == 1 ? 1 : 0;
    pc_link_barrier(0, "the barrier before a rank leaves");
    if (w->rank == leaving)
      replace_self(&t);
    else
      drop_and_reconnect(&t);
    pc_link_barrier(1, "the barrier after the reconnect");
    exchange(&t, round, when[round]);
  }
  pc_remote_release(&t.s, &t.rdst);
  pc_region_dereg(&t.s, &t.src);
  pc_region_dereg(&t.s, &t.dst);
  pc_sess_close(&t.s);
}
