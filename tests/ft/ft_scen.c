/* ft_scen.c - the scenario table and the per-cycle fault plans. */
#include "ft_scen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ft_ref.h"
#include "ft_util.h"

/* Deadlines: a cycle costs a few timeouts at most (3 s each in the
 * suite); the 100 cycles take about 10 s (15 s under ASan) when kills are
 * seen by the transport, and may not take more than 2.4 s each. */
static const ft_scen_t scenarios[] = {
    {"kill-before", "SIGKILL one rank before a collective", FT_KILL,
     FT_BEFORE, 1, 0, 1, 0, 0, 60},
    {"kill-during", "SIGKILL one rank mid-chunk of a large all-reduce",
     FT_KILL, FT_DURING, 1, 0, 1, 0, 0, 60},
    {"kill-after", "SIGKILL one rank after a collective", FT_KILL, FT_AFTER,
     1, 0, 1, 0, 0, 60},
    {"kill-two", "SIGKILL two ranks at once", FT_KILL, FT_RANDOM, 2, 0, 1, 0,
     0, 60},
    {"kill-rank0", "SIGKILL rank 0", FT_KILL, FT_RANDOM, 1, 1, 1, 0, 0, 60},
    {"stop", "SIGSTOP one rank past the deadline, then SIGCONT", FT_STOP,
     FT_BEFORE, 1, 0, 1, 0, 0, 90},
    {"cut", "take one rank's link down mid-collective", FT_CUT, FT_DURING, 1,
     0, 1, 0, 0, 90},
    {"cycles", "100 kill/recover cycles", FT_KILL, FT_RANDOM, 1, 0, 100, 0, 1,
     240},
    {"grow", "grow the group by two ranks", FT_NONE, FT_BEFORE, 0, 0, 1, 2, 0,
     60},
};

const ft_scen_t *ft_scen_find(const char *name) {
  for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++)
    if (strcmp(scenarios[i].name, name) == 0) return &scenarios[i];
  return NULL;
}

void ft_scen_list(void) {
  for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++)
    fprintf(stderr, "  %-12s %s\n", scenarios[i].name, scenarios[i].what);
}

int ft_scen_max_size(const ft_scen_t *s, int n) { return n + s->grow; }

const char *ft_when_name(ft_when_t w) {
  static const char *const names[] = {"before", "during", "after", "random"};
  return names[w];
}

int ft_plan_is_lost(const ft_plan_t *p, int r) {
  for (int i = 0; i < p->nlost; i++)
    if (p->lost[i] == r) return 1;
  return 0;
}

/* Victims: rank 0 when the scenario says so, the others distinct and
 * drawn from 1..n-1. */
static void pick_victims(const ft_scen_t *s, int n, uint64_t seed, int cycle,
                         ft_plan_t *p) {
  CHECK(s->nlost <= FT_MAX_LOST && n >= 2 + s->nlost,
        "%s needs at least %d ranks, got %d", s->name, 2 + s->nlost, n);
  p->nlost = 0;
  if (s->rank0 && s->nlost > 0) p->lost[p->nlost++] = 0;
  for (uint64_t k = 0; p->nlost < s->nlost; k++) {
    int r = 1 + (int)(ft_rand3(seed, 1000 + (uint64_t)cycle, k) %
                      (uint64_t)(n - 1));
    if (!ft_plan_is_lost(p, r)) p->lost[p->nlost++] = r;
  }
  if (p->nlost == 2 && p->lost[0] > p->lost[1]) {
    int t = p->lost[0];
    p->lost[0] = p->lost[1];
    p->lost[1] = t;
  }
}

void ft_plan_make(const ft_scen_t *s, int n, uint64_t seed, int cycle,
                  ft_plan_t *p) {
  memset(p, 0, sizeof *p);
  p->kind = s->kind;
  p->size_before = n;
  p->size_after = n + s->grow;
  size_t nsteps = 0;
  int large = 0;
  ft_steps(s->short_list, &nsteps, &large);
  uint64_t c = (uint64_t)cycle;
  p->when = s->when;
  if (p->when == FT_RANDOM) p->when = (ft_when_t)(ft_rand3(seed, c, 1) % 3);
  p->step = p->when == FT_DURING ? large
                                 : (int)(ft_rand3(seed, c, 2) % nsteps);
  p->delay_ms = 1 + (int)(ft_rand3(seed, c, 3) % 15);
  if (s->kind == FT_NONE) {
    p->nadd = s->grow;
    p->add = ft_xcalloc((size_t)s->grow, sizeof *p->add);
    for (int i = 0; i < s->grow; i++) p->add[i] = n + i;
    return;
  }
  pick_victims(s, n, seed, cycle, p);
  p->nadd = p->nlost;
  p->add = ft_xcalloc((size_t)p->nlost, sizeof *p->add);
  memcpy(p->add, p->lost, (size_t)p->nlost * sizeof *p->add);
}

void ft_plan_free(ft_plan_t *p) {
  free(p->add);
  p->add = NULL;
}
