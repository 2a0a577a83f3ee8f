/* ft_verify.c - the driver's checks across ranks, from the report files:
 * every survivor saw the same (status, dropped set, result) per step, the
 * dropped sets of a cycle add up to its victims, full-group steps are
 * clean, and survivors finished in time after the fault. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ft_driver.h"
#include "ft_rank.h"
#include "ft_util.h"

typedef struct rec {
  uint64_t gid, hash, epoch;
  int rc, nd, rank, inc;
  char list[128];
  long long dur, end;
} rec_t;

typedef struct recs {
  rec_t *v;
  size_t n, cap;
  /* Per cycle sums for the printout. */
  long long *wait_ms, *recover_ms, *join_ms, *p2p_ms;
  int *nrec, *njoin, *np2p;
  /* A frozen or cut-off victim's own outcome: status, ms, destroy ms. */
  long long *victim;
} recs_t;

static int cycle_of(uint64_t gid) { return (int)(gid / 4096); }
static int phase_of(uint64_t gid) { return (int)(gid % 4096 / 1024); }

/* The cycle in which process p is a victim, or -1. */
static int victim_cycle(const ft_drv_t *d, const ft_proc_t *p) {
  for (int c = p->cycle0 + (p->join ? 1 : 0); c < d->scen->cycles; c++)
    if (ft_plan_is_lost(&d->plans[c], p->rank)) return c;
  return -1;
}

static void add_rec(recs_t *R, const rec_t *r) {
  if (R->n == R->cap) {
    R->cap = R->cap ? 2 * R->cap : 256;
    R->v = realloc(R->v, R->cap * sizeof *R->v);
    CHECK(R->v != NULL, "out of memory");
  }
  R->v[R->n++] = *r;
}

/* Reads one process's report; a victim's steps of its last cycle are left
 * out: survivors agree among themselves, not with the rank they drop. */
static int load(const ft_drv_t *d, const ft_proc_t *p, recs_t *R) {
  char path[512], line[512];
  snprintf(path, sizeof path, "%s/r%d.%d", d->dir, p->rank, p->inc);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "ft: no report %s\n", path);
    return 1;
  }
  int vc = victim_cycle(d, p);
  while (fgets(line, sizeof line, f)) {
    rec_t r;
    memset(&r, 0, sizeof r);
    int c = 0;
    long long a = 0, b = 0;
    r.rank = p->rank;
    r.inc = p->inc;
    if (sscanf(line, "S %" SCNu64 " %d %d %127s %" SCNx64 " %lld %lld %" SCNu64,
               &r.gid, &r.rc, &r.nd, r.list, &r.hash, &r.dur, &r.end,
               &r.epoch) == 8) {
      if (cycle_of(r.gid) != vc) add_rec(R, &r);
    } else if (sscanf(line, "R %d %lld %lld", &c, &a, &b) == 3 && c >= 0 &&
               c < d->scen->cycles) {
      R->wait_ms[c] += a, R->recover_ms[c] += b, R->nrec[c]++;
    } else if (sscanf(line, "J %d %lld", &c, &a) == 2 && c >= 0 &&
               c < d->scen->cycles) {
      R->join_ms[c] += a, R->njoin[c]++;
    } else if (sscanf(line, "P %d %*d %lld", &c, &a) == 2 && c >= 0 &&
               c < d->scen->cycles) {
      R->p2p_ms[c] += a, R->np2p[c]++;
    } else if (sscanf(line, "V %d %d %lld %lld", &c, &r.rc, &a, &b) == 4 &&
               c >= 0 && c < d->scen->cycles) {
      R->victim[3 * c] = r.rc, R->victim[3 * c + 1] = a;
      R->victim[3 * c + 2] = b;
    }
  }
  fclose(f);
  return 0;
}

static int by_gid(const void *x, const void *y) {
  const rec_t *a = x, *b = y;
  if (a->gid != b->gid) return a->gid < b->gid ? -1 : 1;
  return a->rank - b->rank;
}

/* Same status, dropped set and result hash for one step everywhere. */
static int agree(const ft_drv_t *d, const recs_t *R) {
  int bad = 0;
  for (size_t i = 0; i < R->n;) {
    size_t j = i + 1;
    while (j < R->n && R->v[j].gid == R->v[i].gid) {
      const rec_t *a = &R->v[i], *b = &R->v[j];
      /* In a whole group every member, joiners too, is at one epoch. */
      int full = phase_of(a->gid) == FT_PH_FULL;
      if (a->rc != b->rc || a->nd != b->nd || strcmp(a->list, b->list) ||
          a->hash != b->hash || (full && a->epoch != b->epoch)) {
        fprintf(stderr, "ft: step %" PRIu64 ": rank %d saw (status %d, "
                "dropped %s, hash %016" PRIx64 ", epoch %" PRIu64 "), rank %d "
                "(%d, %s, %016" PRIx64 ", %" PRIu64 ")\n", a->gid, a->rank,
                a->rc, a->list, a->hash, a->epoch, b->rank, b->rc, b->list,
                b->hash, b->epoch);
        bad++;
      }
      j++;
    }
    const rec_t *a = &R->v[i];
    int c = cycle_of(a->gid);
    if (phase_of(a->gid) == FT_PH_FULL &&
        (j - i != (size_t)d->plans[c].size_after || a->rc != 0)) {
      fprintf(stderr, "ft: full-group step %" PRIu64 ": %zu ranks reported "
              "it (want %d), status %d\n", a->gid, j - i,
              d->plans[c].size_after, a->rc);
      bad++;
    }
    i = j;
  }
  return bad;
}

/* The ranks dropped in a cycle, as a bit per rank. */
static void cycle_union(const recs_t *R, int c, uint8_t *dropped, int max,
                        long long *t_done, uint64_t *first_gid) {
  memset(dropped, 0, (size_t)max);
  *t_done = 0;
  *first_gid = UINT64_MAX;
  for (size_t i = 0; i < R->n; i++) {
    const rec_t *r = &R->v[i];
    if (cycle_of(r->gid) != c || r->nd == 0) continue;
    if (r->end > *t_done) *t_done = r->end;
    if (r->gid < *first_gid) *first_gid = r->gid;
    const char *s = r->list;
    while (*s) {
      int v = atoi(s);
      if (v >= 0 && v < max) dropped[v] = 1;
      while (*s && *s != ',') s++;
      if (*s == ',') s++;
    }
  }
}

static void print_cycle(const ft_drv_t *d, const recs_t *R, int c,
                        long long delta, uint64_t first_gid) {
  const ft_plan_t *p = &d->plans[c];
  size_t n = 0;
  int large = 0;
  const ft_step_t *steps = ft_steps(d->scen->short_list, &n, &large);
  char name[96];
  ft_step_name(&steps[p->step], name, sizeof name);
  char who[64] = "";
  for (int i = 0; i < p->nlost; i++)
    snprintf(who + strlen(who), sizeof who - strlen(who), "%s%d",
             i ? "," : "", p->lost[i]);
  static const char *const kinds[] = {"none", "SIGKILL", "SIGSTOP",
                                      "link cut"};
  if (p->kind == FT_NONE)
    printf("ft: cycle %d: grow %d -> %d ranks", c, p->size_before,
           p->size_after);
  else
    printf("ft: cycle %d: %s of rank(s) %s %s step %d (%s)%s; first "
           "degraded step %" PRIu64 ", survivors done %lld ms after the "
           "fault; p2p with it failed in %lld ms", c, kinds[p->kind], who,
           ft_when_name(p->when), p->step, name,
           p->when == FT_DURING ? " a few ms in" : "", first_gid, delta,
           R->np2p[c] ? R->p2p_ms[c] / R->np2p[c] : -1);
  if (p->kind == FT_STOP || p->kind == FT_CUT)
    printf("; the victim's own call: %s after %lld ms, its destroy %lld ms",
           mep_strerror((int)R->victim[3 * c]), R->victim[3 * c + 1],
           R->victim[3 * c + 2]);
  printf("; recovery: %lld ms until joining + %lld ms recover_ranks, join "
         "%lld ms\n", R->nrec[c] ? R->wait_ms[c] / R->nrec[c] : -1,
         R->nrec[c] ? R->recover_ms[c] / R->nrec[c] : -1,
         R->njoin[c] ? R->join_ms[c] / R->njoin[c] : -1);
}

static int cmp_ll(const void *x, const void *y) {
  long long a = *(const long long *)x, b = *(const long long *)y;
  return (a > b) - (a < b);
}

/* Prints min/median/mean/max of v (sorted in place); returns the median. */
static long long print_stats(const char *what, long long *v, int n) {
  if (n == 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_ll);
  long long sum = 0;
  for (int i = 0; i < n; i++) sum += v[i];
  printf("ft: %s over %d cycles: min %lld, median %lld, mean %lld, max %lld "
         "ms\n", what, n, v[0], v[n / 2], sum / n, v[n - 1]);
  return v[n / 2];
}

int ft_verify(ft_drv_t *d) {
  int cycles = d->scen->cycles, bad = 0;
  recs_t R;
  memset(&R, 0, sizeof R);
  R.wait_ms = ft_xcalloc((size_t)cycles, sizeof(long long));
  R.recover_ms = ft_xcalloc((size_t)cycles, sizeof(long long));
  R.join_ms = ft_xcalloc((size_t)cycles, sizeof(long long));
  R.p2p_ms = ft_xcalloc((size_t)cycles, sizeof(long long));
  R.nrec = ft_xcalloc((size_t)cycles, sizeof(int));
  R.njoin = ft_xcalloc((size_t)cycles, sizeof(int));
  R.np2p = ft_xcalloc((size_t)cycles, sizeof(int));
  R.victim = ft_xcalloc(3 * (size_t)cycles, sizeof(long long));
  for (size_t i = 0; i < d->nprocs; i++) bad += load(d, &d->procs[i], &R);
  qsort(R.v, R.n, sizeof *R.v, by_gid);
  bad += agree(d, &R);
  uint8_t *dropped = ft_xcalloc((size_t)d->max_size, 1);
  long long *delta = ft_xcalloc((size_t)cycles, sizeof *delta);
  long long *recov = ft_xcalloc((size_t)cycles, sizeof *recov);
  int ndelta = 0;
  /* The bound: the fault costs at most a timeout and a probe; 3 s more
   * cover the healthy part of the step (a few MiB on 7 ranks sharing two
   * cores) and the scheduling of a loaded machine. */
  long long bound = d->timeout_ms + d->probe_ms + 3000;
  for (int c = 0; c < cycles; c++) {
    const ft_plan_t *p = &d->plans[c];
    long long t_done = 0;
    uint64_t first = 0;
    cycle_union(&R, c, dropped, d->max_size, &t_done, &first);
    for (int r = 0; r < d->max_size; r++)
      if (dropped[r] != ft_plan_is_lost(p, r)) {
        fprintf(stderr, "ft: cycle %d: rank %d was %s by the survivors but "
                "%s a victim\n", c, r, dropped[r] ? "dropped" : "not dropped",
                ft_plan_is_lost(p, r) ? "was" : "was not");
        bad++;
      }
    long long dt = p->nlost ? t_done - d->cyc[c].t_fault : 0;
    if (p->nlost && (dt > bound || !d->cyc[c].t_fault)) {
      fprintf(stderr, "ft: cycle %d: survivors finished %lld ms after the "
              "fault, bound %lld ms\n", c, dt, bound);
      bad++;
    }
    if (p->nlost) delta[ndelta++] = dt;
    if (R.nrec[c])
      recov[c] = (R.wait_ms[c] + R.recover_ms[c]) / R.nrec[c];
    if (cycles <= 3) print_cycle(d, &R, c, dt, first);
  }
  if (cycles > 3) {
    long long median = print_stats("fault -> survivors done", delta, ndelta);
    /* A SIGKILL is seen by the transport (the connection breaks), not at
     * a deadline: most cycles must not wait for one. */
    if (d->scen->kind == FT_KILL && median >= d->timeout_ms / 2) {
      fprintf(stderr, "ft: the median cycle took %lld ms from the kill to "
              "the survivors' completion: kills wait for the deadline\n",
              median);
      bad++;
    }
    print_stats("recovery (waiting for JOINING + recover_ranks)", recov,
                cycles);
  }
  free(dropped), free(delta), free(recov), free(R.v);
  free(R.wait_ms), free(R.recover_ms), free(R.join_ms), free(R.p2p_ms);
  free(R.nrec), free(R.njoin), free(R.np2p), free(R.victim);
  return bad;
}
