/* check_bounds.c - writes and signals outside the registrations are
 * refused by the caller's plugin with MEP_ERR_BOUNDS or MEP_ERR_INVALID,
 * nothing of them reaches the peer, and the connection still works. */
#include <stdio.h>

#include "checks.h"
#include "link.h"
#include "pattern.h"
#include "sess.h"

#define PC_BLEN 10001u /* both ranks' data regions: odd on purpose */
#define PC_CTL_LEN 4096u

typedef struct bad {
  const char *what;
  int is_signal;
  uint64_t loff, roff, len;
} bad_t;

static void expect_refused(int rc, const char *what) {
  if (rc == 0)
    pc_fail("%s was accepted (returned 0); want MEP_ERR_BOUNDS or "
            "MEP_ERR_INVALID",
            what);
  if (rc != MEP_ERR_BOUNDS && rc != MEP_ERR_INVALID)
    pc_fail("%s returned %s; want MEP_ERR_BOUNDS or MEP_ERR_INVALID", what,
            pc_err(rc));
}

static void try_bad(pc_sess_t *s, const pc_region_t *src,
                    const pc_remote_t *rdst, const pc_remote_t *rctl) {
  const uint64_t L = src->len, R = rdst->len, C = rctl->len;
  const bad_t bad[] = {
      {"a write 1 byte past the end of the local registration", 0, L - 10, 0,
       11},
      {"a write starting at the end of the local registration", 0, L, 0, 1},
      {"a write 1 byte past the end of the remote region", 0, 0, R - 10, 11},
      {"a write starting past the end of the remote region", 0, 0, R + 1, 1},
      {"a write whose local offset + length overflows", 0, UINT64_MAX - 3, 0,
       8},
      {"a write whose remote offset + length overflows", 0, 0,
       UINT64_MAX - 3, 8},
      {"a write of UINT64_MAX bytes", 0, 1, 1, UINT64_MAX},
      {"a write longer than both regions", 0, 0, 0, L + R},
      {"a signal at an unaligned offset (4)", 1, 0, 4, 0},
      {"a signal at an odd offset (83)", 1, 0, 83, 0},
      {"a signal at the end of the region", 1, 0, C, 0},
      {"a signal past the end of the region", 1, 0, C + 8, 0},
      {"a signal at an offset that overflows (2^64-8)", 1, 0, UINT64_MAX - 7,
       0},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const bad_t *b = &bad[i];
    int rc;
    if (b->is_signal)
      rc = pc_try_signal(s, rctl, b->roff, 1, MEP_SIGNAL_ADD);
    else
      rc = pc_try_write(s, src, b->loff, rdst, b->roff, b->len,
                        s->next_token++);
    char what[200];
    snprintf(what, sizeof what, "%s (local %llu bytes, remote %llu)",
             b->what, (unsigned long long)L,
             (unsigned long long)(b->is_signal ? C : R));
    expect_refused(rc, what);
  }
}

void pc_check_bounds(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_open(&s, w);
  pc_region_t src, dst, ctl;
  pc_remote_t rdst, rctl;
  pc_region_reg(&s, &src, PC_BLEN);
  pc_region_reg(&s, &dst, PC_BLEN);
  pc_region_reg(&s, &ctl, PC_CTL_LEN);
  uint64_t data = pc_seed_for(w->seed, 0xda, (uint64_t)w->rank, 0);
  uint64_t peer_data = pc_seed_for(w->seed, 0xda, (uint64_t)s.peer, 0);
  uint64_t bg = pc_seed_for(w->seed, 0xbb, (uint64_t)w->rank, 0);
  pc_region_fill(&src, 0, src.len, data, 0);
  pc_region_fill(&dst, 0, dst.len, bg, 0);
  pc_region_share(&s, &dst, &rdst);
  pc_region_share(&s, &ctl, &rctl);

  try_bad(&s, &src, &rdst, &rctl);

  /* The exact edges are fine: the last byte, and the last word. */
  pc_write(&s, &src, PC_BLEN - 1, &rdst, PC_BLEN - 1, 1);
  pc_signal(&s, &rctl, PC_CTL_LEN - 8, 1, MEP_SIGNAL_ADD);
  pc_wait_word(&s, &ctl, PC_CTL_LEN - 8, 1,
               "the signal at the last word of the region");
  pc_region_expect(&dst, 0, PC_BLEN - 1, bg, 0,
                   "the peer's region after refused out-of-bounds writes");
  pc_region_expect(&dst, PC_BLEN - 1, 1, peer_data, PC_BLEN - 1,
                   "the last byte of the region, written at its exact end");
  unsigned char words[PC_CTL_LEN - 8];
  pc_region_read(&ctl, 0, words, sizeof words);
  for (size_t off = 0; off < sizeof words; off++)
    if (words[off] != 0)
      pc_fail("byte %zu of the signal region changed to 0x%02x after "
              "refused out-of-bounds signals",
              off, words[off]);
  pc_wait_all(&s, "the write at the end of the region");
  pc_link_barrier(1, "the barrier after the edge checks");

  /* And the whole region in one write. */
  pc_write(&s, &src, 0, &rdst, 0, PC_BLEN);
  pc_signal(&s, &rctl, PC_CTL_LEN - 8, 1, MEP_SIGNAL_ADD);
  pc_wait_word(&s, &ctl, PC_CTL_LEN - 8, 2,
               "the signal after a write of the whole region");
  pc_region_expect(&dst, 0, PC_BLEN, peer_data, 0,
                   "a write of the whole region after the refused ones");
  pc_wait_all(&s, "the write of the whole region");

  pc_link_barrier(1, "the barrier before dereg");
  pc_remote_release(&s, &rdst);
  pc_remote_release(&s, &rctl);
  pc_region_dereg(&s, &src);
  pc_region_dereg(&s, &dst);
  pc_region_dereg(&s, &ctl);
  pc_sess_close(&s);
}
