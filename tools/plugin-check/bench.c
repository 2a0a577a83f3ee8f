/* bench.c - the micro-benchmark: 8-byte ping-pong latency and
 * back-to-back write bandwidth between two processes, one way and both
 * ways at once (the load of a 2-rank all-reduce), printed as a fixed
 * table (lines starting with '#' are comments; columns are separated by
 * spaces; '-' marks a value that does not apply). */
#include <stdlib.h>

#include "checks.h"
#include "link.h"
#include "pattern.h"
#include "sess.h"

#define PC_CTL_LEN 4096
#define PC_W_PING 0   /* latency: the round the peer has reached */
#define PC_W_DATA 8   /* bandwidth: writes landed here */
#define PC_W_ACK 16   /* bandwidth: batches the receiver has seen */
#define PC_W_BDATA 24 /* both ways: the peer's writes landed here */
#define PC_W_BACK 32  /* both ways: batches the peer has seen */
#define PC_BW_WINDOW 16
#define PC_BW_MAX_ITERS 20000
#define PC_WARMUP 100

typedef struct bench {
  pc_worker_t *w;
  pc_sess_t *s;
  pc_region_t ctl, small, big_src, big_dst;
  pc_remote_t rctl, rsmall, rbig;
} bench_t;

#define PC_HEAD_FMT "%-10s %10s %8s %12s %12s %12s %12s %10s"

/* Waits for the word, failing only when nothing at all moves (the word,
 * or the completions) for timeout_ms: long batches are not a hang. */
static void wait_moving(bench_t *b, size_t off, uint64_t target,
                        const char *what) {
  pc_sess_t *s = b->s;
  uint64_t seen = pc_word(&b->ctl, off), done = s->n_completed;
  int64_t last = pc_now_ms();
  while (seen < target) {
    pc_progress(s);
    uint64_t v = pc_word(&b->ctl, off);
    if (v != seen || s->n_completed != done) {
      seen = v;
      done = s->n_completed;
      last = pc_now_ms();
    } else if (pc_now_ms() - last > s->w->opts->timeout_ms) {
      pc_fail("timed out after %d ms without progress waiting for %s",
              s->w->opts->timeout_ms, what);
    }
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static void ping(bench_t *b, uint64_t round) {
  pc_sess_t *s = b->s;
  if (s->n_inflight > 64) pc_wait_inflight_below(s, 32, "8-byte writes");
  pc_write(s, &b->small, 0, &b->rsmall, 0, 8);
  pc_signal(s, &b->rctl, PC_W_PING, round, MEP_SIGNAL_SET);
}

/* Rank 0 stamps each round once, right after its ping, as ib_write_lat
 * stamps each iteration: a round trip is the time from one stamp to the
 * next, the whole loop included, and the clock is read while the ping
 * travels, not between an answer and the next ping. Rank 1 reads no
 * clock. */
static void latency(bench_t *b) {
  int iters = b->w->opts->iters;
  int64_t *rtt = malloc((size_t)iters * sizeof *rtt);
  if (!rtt) pc_fail("out of memory for %d samples", iters);
  int64_t start = 0;
  for (uint64_t i = 1; i <= (uint64_t)(PC_WARMUP + iters); i++) {
    if (b->w->rank == 0) {
      ping(b, i);
      int64_t now = pc_now_ns();
      if (i > PC_WARMUP + 1) rtt[i - PC_WARMUP - 2] = now - start;
      start = now;
    }
    pc_wait_word(b->s, &b->ctl, PC_W_PING, i, "the ping-pong's answer");
    if (b->w->rank == 1) ping(b, i);
  }
  /* the last round ends with its answer */
  if (b->w->rank == 0) rtt[iters - 1] = pc_now_ns() - start;
  pc_wait_all(b->s, "the ping-pong's writes");
  if (b->w->rank == 0) {
    qsort(rtt, (size_t)iters, sizeof *rtt, cmp_i64);
    double med = (double)rtt[iters / 2] / 1e3;
    size_t k99 = (size_t)iters * 99 / 100;
    double p99 = (double)rtt[k99 < (size_t)iters ? k99 : (size_t)iters - 1] /
                 1e3;
    pc_bench_line("%-10s %10d %8d %12.3f %12.3f %12.3f %12.3f %10s",
                  "latency", 8, iters, med, p99, med / 2, p99 / 2, "-");
  }
  free(rtt);
}

/* `count` writes of `size` bytes to the peer back to back, each followed
 * by an add of 1 to its signal word `word`. */
static void send_batch(bench_t *b, uint64_t size, int count, size_t word,
                       const char *what) {
  pc_sess_t *s = b->s;
  for (int j = 0; j < count; j++) {
    if (s->n_inflight >= PC_BW_WINDOW)
      pc_wait_inflight_below(s, PC_BW_WINDOW, what);
    pc_write(s, &b->big_src, 0, &b->rbig, 0, size);
    pc_signal(s, &b->rctl, word, 1, MEP_SIGNAL_ADD);
  }
}

/* Rank 0's table row for a batch (a warm-up of one write prints none). */
static void rate_row(const bench_t *b, const char *test, uint64_t size,
                     int count, double bytes, int64_t t0) {
  double ns = (double)(pc_now_ns() - t0);
  if (b->w->rank == 0 && count > 1)
    pc_bench_line("%-10s %10llu %8d %12s %12s %12s %12s %10.3f", test,
                  (unsigned long long)size, count, "-", "-", "-", "-",
                  bytes / ns);
}

/* One way: rank 0 sends the batch; the receiver acknowledges once it has
 * seen it all. */
static void bandwidth(bench_t *b, uint64_t size, int count, uint64_t *data,
                      uint64_t *acks) {
  pc_sess_t *s = b->s;
  int64_t t0 = pc_now_ns();
  if (b->w->rank == 0) {
    send_batch(b, size, count, PC_W_DATA, "bandwidth writes");
    wait_moving(b, PC_W_ACK, ++*acks, "the receiver's acknowledgement");
    pc_wait_all(s, "bandwidth writes");
  } else {
    *data += (uint64_t)count;
    wait_moving(b, PC_W_DATA, *data, "the bandwidth writes");
    pc_signal(s, &b->rctl, PC_W_ACK, 1, MEP_SIGNAL_ADD);
  }
  rate_row(b, "bandwidth", size, count, (double)size * count, t0);
}

/* Both ways at once: each rank sends the batch and acknowledges the
 * peer's once it has landed. GB/s counts the bytes of both directions. */
static void both_ways(bench_t *b, uint64_t size, int count, uint64_t *data,
                      uint64_t *acks) {
  pc_sess_t *s = b->s;
  *data += (uint64_t)count;
  int64_t t0 = pc_now_ns();
  send_batch(b, size, count, PC_W_BDATA, "both-ways writes");
  wait_moving(b, PC_W_BDATA, *data, "the peer's writes");
  pc_signal(s, &b->rctl, PC_W_BACK, 1, MEP_SIGNAL_ADD);
  wait_moving(b, PC_W_BACK, ++*acks, "the peer's acknowledgement");
  pc_wait_all(s, "both-ways writes");
  rate_row(b, "both_ways", size, count, 2.0 * (double)size * count, t0);
}

static int count_for(const pc_worker_t *w, uint64_t size) {
  uint64_t n = (uint64_t)w->opts->iters_bw * (PC_BIG / size);
  if (n > PC_BW_MAX_ITERS) n = PC_BW_MAX_ITERS;
  if (n < (uint64_t)w->opts->iters_bw) n = (uint64_t)w->opts->iters_bw;
  return (int)n;
}

typedef void point_fn(bench_t *b, uint64_t size, int count, uint64_t *data,
                      uint64_t *acks);

/* A warm-up write, then a point per size (64 MiB only, unless --sweep). */
static void sweep(bench_t *b, point_fn *point, uint64_t big) {
  uint64_t data = 0, acks = 0;
  point(b, big, 1, &data, &acks);
  pc_link_barrier(1, "the barrier after a warm-up");
  for (uint64_t size = b->w->opts->sweep ? 4096 : big; size <= big; size *= 4) {
    point(b, size, count_for(b->w, size), &data, &acks);
    pc_link_barrier(1, "the barrier after a bandwidth point");
  }
}

void pc_bench(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_open(&s, w);
  s.spin = 1;
  bench_t b = {.w = w, .s = &s};
  uint64_t big = pc_big_size(w);
  pc_region_reg(&s, &b.ctl, PC_CTL_LEN);
  pc_region_reg(&s, &b.small, 4096);
  pc_region_reg(&s, &b.big_src, big);
  pc_region_reg(&s, &b.big_dst, big);
  pc_region_fill(&b.big_src, 0, big, w->seed, 0);
  pc_region_fill(&b.small, 0, 4096, w->seed, 0);
  pc_region_share(&s, &b.ctl, &b.rctl);
  pc_region_share(&s, &b.small, &b.rsmall);
  pc_region_share(&s, &b.big_dst, &b.rbig);

  if (w->rank == 0) {
    pc_bench_line("# mep-plugin-check --bench: transport %s %s, 2 processes "
                  "on this host",
                  w->tp->name, w->tp->version);
    pc_bench_line(PC_HEAD_FMT, "#test", "bytes", "iters", "rtt_med_us",
                  "rtt_p99_us", "lat_med_us", "lat_p99_us", "GB/s");
  }
  latency(&b);
  pc_link_barrier(1, "the barrier after the latency test");

  sweep(&b, bandwidth, big);
  sweep(&b, both_ways, big);

  pc_remote_release(&s, &b.rctl);
  pc_remote_release(&s, &b.rsmall);
  pc_remote_release(&s, &b.rbig);
  pc_region_dereg(&s, &b.ctl);
  pc_region_dereg(&s, &b.small);
  pc_region_dereg(&s, &b.big_src);
  pc_region_dereg(&s, &b.big_dst);
  pc_sess_close(&s);
}
