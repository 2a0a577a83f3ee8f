/* plan-walks.c - the collective engine's walks of a plan's steps, the way
 * core/src/coll.c made them before 3b67b58 (every rank, several times a
 * step: start_step, the send and receive cursors, last_chunks) and the
 * way it makes them now (each step's partner lists), timed over the same
 * plans with every message one chunk and nothing to wait for. A copy of
 * the loops, not the engine: for docs/scaling.md, "Building and walking
 * the plan". Build against a build directory's libmep_internal.a:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Icore/src -Icore/include -Ibuild \
 *     scripts/dev/plan-walks.c build/core/libmep_internal.a \
 *     $(pkg-config --libs inih) -lpthread -ldl -lm -o /tmp/plan-walks
 * usage: plan-walks (prints a markdown table; no arguments) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "plan.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static volatile long sink; /* keeps the loops from being optimised away */
static size_t nch(size_t b) { return b ? (b + 1048575) / 1048576 : 1; }
static int red(const mep__step_t *st) { return st->reduce && st->reduce_here; }

/* coll.c before 3b67b58: every rank, in each loop */
static void old_walk(const mep__plan_t *p, int me, int n) {
  int ls[8192];
  for (int s = 0; s < n; s++)
    ls[s] = -1;
  for (int k = 0; k < p->ndata; k++) {
    const mep__step_t *st = &p->steps[k];
    for (int s = 0; s < n; s++) {
      if (s == me || !st->recv_from[s])
        continue;
      ls[s] = k;
    }
  }
  for (int k = 0; k < p->nsteps; k++) {
    const mep__step_t *st = &p->steps[k];
    size_t smax = 0, rmax = 0;
    int first = me, last = me;
    for (int q = 0; q < n; q++) {
      if (q != me && st->send_to[q] && nch(st->sbytes[q]) > smax)
        smax = nch(st->sbytes[q]);
      if (!red(st) && q != me && st->recv_from[q] && nch(st->rbytes[q]) > rmax)
        rmax = nch(st->rbytes[q]);
    }
    if (red(st)) {
      rmax = 1;
      for (int q = 0; q < n; q++) {
        if (!st->recv_from[q] && q != me)
          continue;
        if (q < first)
          first = q;
        if (q > last)
          last = q;
      }
    }
    for (int q = 0; !red(st) && q < n; q++)
      if (q != me && st->recv_from[q] && st->rbytes[q] >= 65536)
        sink++;
    for (size_t j = 0; j < smax; j++)
      for (int sk = 1; sk < n; sk++) {
        int q = (me + sk) % n;
        if (st->send_to[q] && j < nch(st->sbytes[q]))
          sink++;
      }
    for (size_t j = 0; j < rmax; j++)
      for (int s = 0; s < n; s++) {
        int w = red(st)
                    ? (s == me || st->recv_from[s])
                    : (s != me && st->recv_from[s] && j < nch(st->rbytes[s]));
        if (w)
          sink++;
      }
    sink += first + last;
  }
  sink += ls[0];
}

/* coll.c now: the step's sends and recvs */
static void list_walk(const mep__plan_t *p, int me, int n) {
  int ls[8192];
  for (int s = 0; s < n; s++)
    ls[s] = -1;
  for (int k = 0; k < p->ndata; k++) {
    const mep__step_t *st = &p->steps[k];
    for (int i = 0; i < st->nrecvs; i++)
      if (st->recvs[i] != me)
        ls[st->recvs[i]] = k;
  }
  for (int k = 0; k < p->nsteps; k++) {
    const mep__step_t *st = &p->steps[k];
    size_t smax = 0, rmax = 0;
    int first = me, last = me;
    for (int i = 0; i < st->nsends; i++)
      if (nch(st->sbytes[st->sends[i]]) > smax)
        smax = nch(st->sbytes[st->sends[i]]);
    if (red(st)) {
      rmax = 1;
      first = st->recvs[0];
      last = st->recvs[st->nrecvs - 1];
    } else {
      for (int i = 0; i < st->nrecvs; i++)
        if (nch(st->rbytes[st->recvs[i]]) > rmax)
          rmax = nch(st->rbytes[st->recvs[i]]);
      for (int i = 0; i < st->nrecvs; i++)
        if (st->rbytes[st->recvs[i]] >= 65536)
          sink++;
    }
    for (size_t j = 0; j < smax; j++)
      for (int i = 0; i < st->nsends; i++)
        if (j < nch(st->sbytes[st->sends[i]]))
          sink++;
    for (size_t j = 0; j < rmax; j++)
      for (int i = 0; i < st->nrecvs; i++)
        if (red(st) || j < nch(st->rbytes[st->recvs[i]]))
          sink++;
    sink += first + last;
  }
  sink += ls[0];
}

int main(void) {
  static float a[4], b[4];
  printf("| ranks | kind | walk every rank (µs) | walk the lists (µs) "
         "|\n|---:|---|---:|---:|\n");
  for (int n = 64; n <= 4096; n *= 4) {
    mep_comm_t *comm = calloc(1, sizeof *comm);
    comm->rank = n / 3;
    comm->size = comm->max_size = n;
    uint8_t *act = malloc(n);
    memset(act, 1, n);
    for (int k = 0; k < 3; k++) {
      mep__plan_opts_t o = {.two_shot = 262144,
                            .log_ranks = k == 2 ? 0 : 8,
                            .log_bytes = 32768,
                            .confirm = 1};
      mep__coll_spec_t s = {.kind = k == 0 ? MEP__COLL_BARRIER
                                           : MEP__COLL_ALLREDUCE,
                            .dtype = MEP_FLOAT32,
                            .op = MEP_SUM,
                            .count = k ? 2 : 0,
                            .root = -1,
                            .send = a,
                            .recv = b};
      mep__plan_t p;
      if (mep__plan_build(comm, &s, act, &o, &p))
        return 1;
      int it = 2000;
      double t0 = now();
      for (int i = 0; i < it; i++)
        old_walk(&p, n / 3, n);
      double t1 = now();
      for (int i = 0; i < it; i++)
        list_walk(&p, n / 3, n);
      double t2 = now();
      const char *nm[] = {"barrier", "all-reduce 8 B",
                          "all-reduce 8 B one-shot"};
      printf("| %d | %s | %.2f | %.2f |\n", n, nm[k], (t1 - t0) / it,
             (t2 - t1) / it);
      mep__plan_free(&p);
    }
    free(act);
    free(comm);
  }
}
