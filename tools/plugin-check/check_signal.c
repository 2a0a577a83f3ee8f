/* check_signal.c - signal-order: a signal is visible only after every
 * earlier write on the endpoint, and ADD accumulates exactly. Both ranks
 * send and receive at once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "link.h"
#include "pattern.h"
#include "sess.h"

#define PC_ROUNDS 1000
#define PC_ROUND_MAX 4096u /* bytes per round, at most */
#define PC_SLOT (PC_ROUND_MAX + 8)
#define PC_ORDER_WINDOW 32 /* writes in flight, at most */
#define PC_ADDS 1000
#define PC_CTL_LEN 4096
#define PC_WORD_ORDER 0
#define PC_WORD_ADD 8

typedef struct so {
  pc_worker_t *w;
  pc_sess_t *s;
  pc_region_t src, dst, ctl;
  pc_remote_t rdst, rctl;
} so_t;

typedef struct round {
  uint64_t seed, off, len;
} round_t;

/* Round r (1-based) of rank `from`: its own slot, an offset that varies
 * the alignment, a random length. */
static round_t round_of(const so_t *t, int from, uint64_t r) {
  pc_rng_t g;
  pc_rng_seed(&g, pc_seed_for(t->w->seed, 0x50, (uint64_t)from, r));
  round_t x;
  x.seed = pc_rng_next(&g);
  x.len = pc_rng_range(&g, 1, PC_ROUND_MAX);
  x.off = (r - 1) * PC_SLOT + (r - 1) % 8;
  return x;
}

static void send_round(so_t *t, uint64_t r) {
  round_t x = round_of(t, t->w->rank, r);
  pc_region_fill(&t->src, x.off, x.len, x.seed, 0);
  pc_write(t->s, &t->src, x.off, &t->rdst, x.off, x.len);
  pc_signal(t->s, &t->rctl, PC_WORD_ORDER, r, MEP_SIGNAL_SET);
}

/* The signal says round v is done: so must be every round up to v. */
static void check_rounds(so_t *t, uint64_t seen, uint64_t v) {
  if (v < seen)
    pc_fail("the signal word went from round %llu back to %llu (SETs "
            "applied out of order)",
            (unsigned long long)seen, (unsigned long long)v);
  if (v > PC_ROUNDS)
    pc_fail("the signal word reads %llu; only rounds 1..%d were sent",
            (unsigned long long)v, PC_ROUNDS);
  for (uint64_t k = seen + 1; k <= v; k++) {
    round_t x = round_of(t, t->s->peer, k);
    char what[200];
    snprintf(what, sizeof what,
             "the %llu bytes of round %llu, read when the signal of round "
             "%llu was seen (the signal overtook its write)",
             (unsigned long long)x.len, (unsigned long long)k,
             (unsigned long long)v);
    pc_region_expect(&t->dst, x.off, x.len, x.seed, 0, what);
  }
}

static void order_both_ways(so_t *t) {
  uint64_t sent = 0, seen = 0;
  int64_t last = pc_now_ms();
  while (sent < PC_ROUNDS || seen < PC_ROUNDS) {
    int moved = 0;
    if (sent < PC_ROUNDS && t->s->n_inflight < PC_ORDER_WINDOW) {
      send_round(t, ++sent);
      moved = 1;
    }
    uint64_t v = pc_word(&t->ctl, PC_WORD_ORDER);
    if (v != seen) {
      check_rounds(t, seen, v);
      seen = v;
      moved = 1;
    }
    moved |= pc_progress(t->s) > 0;
    if (moved)
      last = pc_now_ms();
    else if (pc_now_ms() - last > t->w->opts->timeout_ms)
      pc_fail("timed out after %d ms: sent %llu of %d rounds, saw round "
              "%llu of the peer's (%zu writes unreported)",
              t->w->opts->timeout_ms, (unsigned long long)sent, PC_ROUNDS,
              (unsigned long long)seen, t->s->n_inflight);
    pc_relax(t->s, moved);
  }
  pc_wait_all(t->s, "the writes of signal-order");
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* The start value and the ADDs of rank `from`; prefix[k] = start + the
 * first k values (no wrap: start < 2^62, values < 2^32). */
static void adds_of(const so_t *t, int from, uint64_t *values,
                    uint64_t *prefix) {
  pc_rng_t g;
  pc_rng_seed(&g, pc_seed_for(t->w->seed, 0xadd, (uint64_t)from, 0));
  prefix[0] = pc_rng_range(&g, 1, (uint64_t)1 << 62);
  for (int k = 0; k < PC_ADDS; k++) {
    values[k] = pc_rng_range(&g, 1, 0xffffffffu);
    prefix[k + 1] = prefix[k] + values[k];
  }
}

/* Waits until the ADD word reads `want`; every value seen on the way must
 * be one of `allowed` (sorted). */
static void watch_word(so_t *t, uint64_t want, const uint64_t *allowed,
                       size_t n_allowed, const char *what) {
  int64_t deadline = pc_now_ms() + t->w->opts->timeout_ms;
  for (;;) {
    uint64_t x = pc_word(&t->ctl, PC_WORD_ADD);
    if (x == want) return;
    if (!bsearch(&x, allowed, n_allowed, sizeof x, cmp_u64))
      pc_fail("the ADD word reads %llu, which no prefix of the signals sent "
              "gives (%s: an ADD lost, doubled or torn)",
              (unsigned long long)x, what);
    int n = pc_progress(t->s);
    if (pc_now_ms() > deadline)
      pc_fail("timed out after %d ms waiting for %s (the word reads %llu, "
              "want %llu)",
              t->w->opts->timeout_ms, what, (unsigned long long)x,
              (unsigned long long)want);
    pc_relax(t->s, n);
  }
}

static void adds_both_ways(so_t *t) {
  uint64_t *mine = malloc(PC_ADDS * sizeof *mine);
  uint64_t *mine_prefix = malloc((PC_ADDS + 1) * sizeof *mine_prefix);
  uint64_t *theirs = malloc(PC_ADDS * sizeof *theirs);
  /* 0 (not yet set) and every prefix of the peer's ADDs. */
  uint64_t *allowed = malloc((PC_ADDS + 2) * sizeof *allowed);
  if (!mine || !mine_prefix || !theirs || !allowed) pc_fail("out of memory");
  adds_of(t, t->w->rank, mine, mine_prefix);
  adds_of(t, t->s->peer, theirs, allowed + 1);
  allowed[0] = 0;
  uint64_t final = allowed[PC_ADDS + 1];

  pc_signal(t->s, &t->rctl, PC_WORD_ADD, mine_prefix[0], MEP_SIGNAL_SET);
  for (int k = 0; k < PC_ADDS; k++) {
    pc_signal(t->s, &t->rctl, PC_WORD_ADD, mine[k], MEP_SIGNAL_ADD);
    if (k % 16 == 0) pc_progress(t->s);
  }
  watch_word(t, final, allowed, PC_ADDS + 2, "1000 ADDs of random values");
  pc_link_barrier(1, "the barrier after the ADDs");
  uint64_t x = pc_word(&t->ctl, PC_WORD_ADD);
  if (x != final)
    pc_fail("the ADD word changed to %llu after all ADDs had arrived (want "
            "%llu)",
            (unsigned long long)x, (unsigned long long)final);
  /* Both have read the word before either sends more to it: a transport
   * that needs no target CPU (an RDMA NIC, the ibgda model) would land
   * the peer's next SET before this rank's read otherwise. */
  pc_link_barrier(1, "the barrier after reading the ADD word");

  /* ADD wraps modulo 2^64 like an unsigned add. */
  pc_signal(t->s, &t->rctl, PC_WORD_ADD, UINT64_MAX - 1, MEP_SIGNAL_SET);
  pc_signal(t->s, &t->rctl, PC_WORD_ADD, 3, MEP_SIGNAL_ADD);
  uint64_t wrap[3] = {1, final, UINT64_MAX - 1};
  qsort(wrap, 3, sizeof wrap[0], cmp_u64);
  watch_word(t, 1, wrap, 3, "SET 2^64-2 then ADD 3 (wraps to 1)");
  pc_link_barrier(1, "the barrier after the wrapping ADD");
  free(mine);
  free(mine_prefix);
  free(theirs);
  free(allowed);
}

void pc_check_signal_order(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_open(&s, w);
  so_t t = {.w = w, .s = &s};
  pc_region_reg(&s, &t.src, (size_t)PC_ROUNDS * PC_SLOT);
  pc_region_reg(&s, &t.dst, (size_t)PC_ROUNDS * PC_SLOT);
  pc_region_reg(&s, &t.ctl, PC_CTL_LEN);
  pc_region_share(&s, &t.dst, &t.rdst);
  pc_region_share(&s, &t.ctl, &t.rctl);
  int64_t t0 = pc_now_ns();
  order_both_ways(&t);
  pc_link_barrier(1, "the barrier after the ordered rounds");
  pc_info("rank %d: %d rounds of write + signal SET both ways in %.1f ms",
          w->rank, PC_ROUNDS, (double)(pc_now_ns() - t0) / 1e6);
  adds_both_ways(&t);
  pc_remote_release(&s, &t.rdst);
  pc_remote_release(&s, &t.rctl);
  pc_region_dereg(&s, &t.src);
  pc_region_dereg(&s, &t.dst);
  pc_region_dereg(&s, &t.ctl);
  pc_sess_close(&s);
}
