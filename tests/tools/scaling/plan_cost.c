/* plan_cost - what building a collective's plan costs as the group grows
 * (docs/scaling.md, "Building and walking the plan"): the engine builds
 * one for every call (core/src/plan.c, plan_log.c). For N = 8, 16, ... up
 * to --max-ranks (and N * 1.5 - 1, not a power of two), as rank N/3 of N
 * active ranks with the default [core] settings (agreement on): a barrier,
 * an 8-byte all-reduce (both logarithmic from 8 ranks) and the same
 * all-reduce one-shot (log_ranks = 0). Prints the mean time of a build
 * and free in µs, and checks each plan's number of steps against the
 * formulas of docs/scaling.md: a dissemination barrier ⌈log₂ N⌉;
 * recursive doubling ⌊log₂ N⌋, +2 where N is not a power of two,
 * +⌈log₂ N⌉ to confirm; one-shot 1. Exits 1 on a mismatch or a failed
 * build.
 * Links the core's internals (mep_internal_dep), not libmep.
 * usage: plan_cost [-i ITERS] [--max-ranks N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "plan.h"

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) k++;
  return k;
}

static int floor_log2(int n) {
  int k = 0;
  while ((2 << k) <= n) k++;
  return k;
}

static int usage(FILE *f, int rc) {
  fprintf(f, "usage: plan_cost [-i ITERS] [--max-ranks N]\n"
             "Times building the plans of a barrier and an 8-byte "
             "all-reduce for 8 to N ranks\n(default: 2000 iterations, "
             "N = 4096) and checks their number of steps.\n");
  return rc;
}

int main(int argc, char **argv) {
  int iters = 2000, max_ranks = 4096;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help")) return usage(stdout, 0);
    if (i + 1 < argc && !strcmp(argv[i], "-i"))
      iters = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--max-ranks"))
      max_ranks = atoi(argv[++i]);
    else
      return usage(stderr, 2);
  }
  if (iters < 1 || max_ranks < 8) return usage(stderr, 2);
  static float in[2], out[2];
  enum { BARRIER, LOG, ONE_SHOT, KINDS };
  static const char *const names[KINDS] = {"barrier", "all-reduce 8 B",
                                           "all-reduce 8 B one-shot"};
  printf("| ranks | %s (µs) | steps | %s (µs) | steps | %s (µs) |\n"
         "|---:|---:|---:|---:|---:|---:|\n",
         names[BARRIER], names[LOG], names[ONE_SHOT]);
  int bad = 0;
  for (int n = 8; n <= max_ranks; n *= 2) {
    for (int odd = 0; odd < 2; odd++) {
      int size = n + odd * (n / 2 - 1); /* and one not a power of two */
      if (size > max_ranks) break;
      mep_comm_t *comm = calloc(1, sizeof *comm);
      uint8_t *act = malloc((size_t)size);
      if (!comm || !act) return 1;
      comm->rank = size / 3;
      comm->size = comm->max_size = size;
      memset(act, 1, (size_t)size);
      double us[KINDS];
      int steps[KINDS];
      for (int k = 0; k < KINDS; k++) {
        mep__plan_opts_t o = {.two_shot = 262144, .log_ranks = 8,
                              .log_bytes = 32768, .confirm = 1};
        if (k == ONE_SHOT) o.log_ranks = 0;
        mep__coll_spec_t s = {
            .kind = k == BARRIER ? MEP__COLL_BARRIER : MEP__COLL_ALLREDUCE,
            .dtype = MEP_FLOAT32, .op = MEP_SUM, .count = k == BARRIER ? 0 : 2,
            .root = -1, .send = in, .recv = out};
        mep__plan_t p;
        double t0 = now_us();
        for (int i = 0; i < iters; i++) {
          if (mep__plan_build(comm, &s, act, &o, &p)) {
            fprintf(stderr, "%d ranks, %s: %s\n", size, names[k],
                    mep_last_error());
            return 1;
          }
          steps[k] = p.nsteps;
          mep__plan_free(&p);
        }
        us[k] = (now_us() - t0) / iters;
      }
      int want[KINDS] = {ceil_log2(size),
                         floor_log2(size) + 2 * ((size & (size - 1)) != 0) +
                             ceil_log2(size),
                         1};
      for (int k = 0; k < KINDS; k++)
        if (steps[k] != want[k]) {
          fprintf(stderr, "%d ranks, %s: %d steps, the formula says %d\n",
                  size, names[k], steps[k], want[k]);
          bad = 1;
        }
      printf("| %d | %.2f | %d | %.2f | %d | %.2f |\n", size, us[BARRIER],
             steps[BARRIER], us[LOG], steps[LOG], us[ONE_SHOT]);
      free(act);
      free(comm);
    }
  }
  return bad;
}
