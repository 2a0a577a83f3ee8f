/* check_completions.c - many writes in flight with distinct random
 * tokens: each reported exactly once, with status 0 and the right peer,
 * through poll() calls of varying room; zero-length writes complete. */
#include <stdio.h>

#include "checks.h"
#include "link.h"
#include "pattern.h"
#include "sess.h"

#define PC_NWRITES 256
#define PC_CSLOT (4096u + 8)
#define PC_CTL_LEN 4096

typedef struct cw {
  uint64_t token, off, len, seed;
} cw_t;

/* Write k of rank `from`. Writes 0 and 1 are empty (at an even and an odd
 * offset); the tokens are distinct because pc_mix is a bijection. */
static cw_t write_of(const pc_worker_t *w, int from, uint64_t k) {
  pc_rng_t g;
  pc_rng_seed(&g, pc_seed_for(w->seed, 0xc0, (uint64_t)from, k));
  cw_t x;
  x.token = pc_mix(pc_seed_for(w->seed, 0x70, (uint64_t)from, 0) ^ k);
  if (x.token == MEP_TP_TOKEN_NONE) x.token ^= 1;
  x.seed = pc_rng_next(&g);
  x.len = k < 2 ? 0 : pc_rng_range(&g, 1, 4096);
  x.off = k * PC_CSLOT + (k == 1 ? 1 : k % 8);
  return x;
}

static void collect(pc_sess_t *s) {
  static const int rooms[] = {1, 2, 3, 5, 8, 64};
  int64_t last = pc_now_ms();
  size_t before = s->n_inflight;
  for (unsigned i = 0; s->n_inflight > 0; i++) {
    int n = pc_progress_max(s, rooms[i % (sizeof rooms / sizeof rooms[0])]);
    if (s->n_inflight < before) {
      before = s->n_inflight;
      last = pc_now_ms();
    }
    if (pc_now_ms() - last > s->w->opts->timeout_ms)
      pc_fail("timed out after %d ms: %zu of %d tokens never reported, e.g. "
              "0x%llx",
              s->w->opts->timeout_ms, s->n_inflight, PC_NWRITES,
              (unsigned long long)s->inflight[0]);
    pc_relax(s, n);
  }
}

void pc_check_completions(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_open(&s, w);
  pc_region_t src, dst, ctl;
  pc_remote_t rdst, rctl;
  pc_region_reg(&s, &src, PC_NWRITES * PC_CSLOT);
  pc_region_reg(&s, &dst, PC_NWRITES * PC_CSLOT);
  pc_region_reg(&s, &ctl, PC_CTL_LEN);
  pc_region_share(&s, &dst, &rdst);
  pc_region_share(&s, &ctl, &rctl);

  for (uint64_t k = 0; k < PC_NWRITES; k++) {
    cw_t x = write_of(w, w->rank, k);
    pc_region_fill(&src, x.off, x.len, x.seed, 0);
  }
  /* All issued before any poll: they are in flight together. */
  for (uint64_t k = 0; k < PC_NWRITES; k++) {
    cw_t x = write_of(w, w->rank, k);
    int rc = pc_try_write(&s, &src, x.off, &rdst, x.off, x.len, x.token);
    if (rc != 0)
      pc_fail("write %llu of %d (%llu bytes, token 0x%llx) with %zu in "
              "flight failed: %s",
              (unsigned long long)k, PC_NWRITES, (unsigned long long)x.len,
              (unsigned long long)x.token, s.n_inflight, pc_err(rc));
  }
  pc_signal(&s, &rctl, 0, 1, MEP_SIGNAL_ADD);
  collect(&s);
  if (s.n_completed != PC_NWRITES)
    pc_fail("%llu completions for %d writes",
            (unsigned long long)s.n_completed, PC_NWRITES);

  pc_wait_word(&s, &ctl, 0, 1, "the signal after 256 writes");
  for (uint64_t k = 0; k < PC_NWRITES; k++) {
    cw_t x = write_of(w, s.peer, k);
    char what[128];
    snprintf(what, sizeof what, "write %llu of %d (%llu bytes at offset %llu)",
             (unsigned long long)k, PC_NWRITES, (unsigned long long)x.len,
             (unsigned long long)x.off);
    pc_region_expect(&dst, x.off, x.len, x.seed, 0, what);
    if (x.len == 0 && (pc_region_byte(&dst, x.off) != 0 ||
                       pc_region_byte(&dst, x.off + 1) != 0))
      pc_fail("a zero-length write at offset %llu changed the bytes there",
              (unsigned long long)x.off);
  }
  /* A token reported twice would show up now. */
  int64_t until = pc_now_ms() + 20;
  while (pc_now_ms() < until) pc_relax(&s, pc_progress(&s));

  pc_link_barrier(1, "the barrier before dereg");
  pc_remote_release(&s, &rdst);
  pc_remote_release(&s, &rctl);
  pc_region_dereg(&s, &src);
  pc_region_dereg(&s, &dst);
  pc_region_dereg(&s, &ctl);
  pc_sess_close(&s);
}
