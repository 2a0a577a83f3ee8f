/* check_write.c - write-sizes: random data of 1 B to 64 MiB at odd
 * offsets, each followed by a signal ADD the receiver waits on; every byte
 * compared, and the bytes around the target range unchanged. A first pass
 * goes from rank 0 to rank 1, a second both ways at once. */
#include <stdio.h>
#include <stdlib.h>

#include "checks.h"
#include "link.h"
#include "pattern.h"
#include "sess.h"

#define PC_OFF_MAX 4095u /* offsets are odd, in [1, PC_OFF_MAX] */
#define PC_GUARD 4096u   /* bytes checked on each side of the target */
#define PC_CTL_LEN 4096

static const uint64_t k_sizes[] = {
    1, 2, 7, 8, 4095, 4096, 65537, (1u << 20) + 3, (16u << 20) - 1, 64u << 20,
};

typedef struct ws {
  pc_worker_t *w;
  pc_sess_t *s;
  pc_region_t src, dst, ctl;
  pc_remote_t rdst, rctl;
  uint64_t sizes[16];
  size_t n_sizes;
  uint64_t received; /* writes received so far = the ADDs expected */
  uint64_t bg;       /* the stream the own receive region holds */
} ws_t;

/* The sizes to test: those above the cap (--quick) become cap-1 and cap;
 * those above the plugin's max_message are left out. */
static void pick_sizes(ws_t *t) {
  uint64_t cap = pc_big_size(t->w);
  uint64_t max_msg = t->s->props.max_message;
  int capped = 0;
  for (size_t i = 0; i < sizeof k_sizes / sizeof k_sizes[0]; i++) {
    uint64_t n = k_sizes[i];
    if (n > cap) {
      if (capped++) continue;
      t->sizes[t->n_sizes++] = cap - 1;
      n = cap;
    }
    if (max_msg && n > max_msg) {
      pc_info("rank %d: %llu bytes is above the plugin's max_message (%llu); "
              "left out",
              t->w->rank, (unsigned long long)n,
              (unsigned long long)max_msg);
      continue;
    }
    t->sizes[t->n_sizes++] = n;
  }
  if (t->n_sizes == 0) pc_skip("max_message is below every size tested");
}

typedef struct wparams {
  uint64_t seed, loff, roff, len;
} wparams_t;

/* What rank `from` writes in step i of pass p: both ranks derive it. */
static wparams_t params(const ws_t *t, int pass, int from, size_t i) {
  pc_rng_t r;
  pc_rng_seed(&r, pc_seed_for(t->w->seed, 0x3a00u + (uint64_t)pass,
                              (uint64_t)from, i));
  wparams_t p;
  p.seed = pc_rng_next(&r);
  p.loff = 2 * pc_rng_range(&r, 0, PC_OFF_MAX / 2) + 1;
  p.roff = 2 * pc_rng_range(&r, 0, PC_OFF_MAX / 2) + 1;
  p.len = t->sizes[i];
  return p;
}

static void send_one(ws_t *t, int pass, size_t i) {
  wparams_t p = params(t, pass, t->w->rank, i);
  pc_region_fill(&t->src, p.loff, p.len, p.seed, 0);
  pc_write(t->s, &t->src, p.loff, &t->rdst, p.roff, p.len);
  pc_signal(t->s, &t->rctl, 0, 1, MEP_SIGNAL_ADD);
}

static void recv_one(ws_t *t, int pass, size_t i) {
  int from = t->s->peer;
  wparams_t p = params(t, pass, from, i);
  char what[256];
  snprintf(what, sizeof what,
           "a write of %llu bytes from rank %d at local offset %llu to "
           "remote offset %llu (%s)",
           (unsigned long long)p.len, from, (unsigned long long)p.loff,
           (unsigned long long)p.roff,
           pass == 1 ? "one way" : "both ways at once");
  t->received++;
  uint64_t v = pc_wait_word(t->s, &t->ctl, 0, t->received, what);
  if (v != t->received)
    pc_fail("the signal word reads %llu after %llu ADDs of 1 (a signal "
            "applied twice?) after %s",
            (unsigned long long)v, (unsigned long long)t->received, what);
  pc_region_expect(&t->dst, p.roff, p.len, p.seed, 0, what);

  char around[320];
  snprintf(around, sizeof around, "the %u bytes before %s", (unsigned)p.roff,
           what);
  pc_region_expect(&t->dst, 0, p.roff, t->bg, 0, around);
  uint64_t end = p.roff + p.len;
  uint64_t after = t->dst.len - end < PC_GUARD ? t->dst.len - end : PC_GUARD;
  snprintf(around, sizeof around, "the %llu bytes after %s",
           (unsigned long long)after, what);
  pc_region_expect(&t->dst, end, after, t->bg, end, around);
  /* Back to the background, so that every step starts alike. */
  pc_region_fill(&t->dst, p.roff, p.len, t->bg, p.roff);
}

static void run_pass(ws_t *t, int pass) {
  int sends = pass == 2 || t->w->rank == 0;
  int recvs = pass == 2 || t->w->rank == 1;
  for (size_t i = 0; i < t->n_sizes; i++) {
    if (sends) send_one(t, pass, i);
    if (recvs) recv_one(t, pass, i);
    if (sends) pc_wait_all(t->s, "a write of write-sizes");
    pc_link_barrier(1, "the barrier after a write size");
  }
}

void pc_check_write_sizes(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_open(&s, w);
  ws_t t = {.w = w, .s = &s};
  pick_sizes(&t);
  uint64_t max = 0;
  for (size_t i = 0; i < t.n_sizes; i++)
    if (t.sizes[i] > max) max = t.sizes[i];
  t.bg = pc_seed_for(w->seed, 0xb9, (uint64_t)w->rank, 0);
  pc_region_reg(&s, &t.src, max + PC_OFF_MAX);
  pc_region_reg(&s, &t.dst, max + PC_OFF_MAX + PC_GUARD);
  pc_region_reg(&s, &t.ctl, PC_CTL_LEN);
  pc_region_fill(&t.dst, 0, t.dst.len, t.bg, 0);
  pc_region_share(&s, &t.dst, &t.rdst);
  pc_region_share(&s, &t.ctl, &t.rctl);

  int64_t t0 = pc_now_ns();
  run_pass(&t, 1);
  run_pass(&t, 2);
  pc_info("rank %d: %zu sizes up to %llu bytes, two passes, in %.1f ms",
          w->rank, t.n_sizes, (unsigned long long)max,
          (double)(pc_now_ns() - t0) / 1e6);
  pc_region_expect(&t.dst, 0, t.dst.len, t.bg, 0,
                   "the receive region after all writes (a write landed "
                   "elsewhere)");

  pc_link_barrier(1, "the barrier before dereg");
  pc_remote_release(&s, &t.rdst);
  pc_remote_release(&s, &t.rctl);
  pc_region_dereg(&s, &t.src);
  pc_region_dereg(&s, &t.dst);
  pc_region_dereg(&s, &t.ctl);
  pc_sess_close(&s);
}
