/* ft_scen.h - the scenarios of the fault-tolerance tests and the fault
 * plan of each cycle. The plan is a pure function of (scenario, ranks,
 * seed, cycle), so the driver and every rank derive the same one without
 * telling each other. */
#ifndef MEP_TESTS_FT_SCEN_H
#define MEP_TESTS_FT_SCEN_H

#include <stdint.h>

typedef enum {
  FT_NONE, /* no fault: the group only grows */
  FT_KILL, /* the victims raise SIGKILL */
  FT_STOP, /* the victim raises SIGSTOP; the driver continues it later */
  FT_CUT,  /* the driver takes the victim's link down (network namespaces) */
} ft_kind_t;

typedef enum {
  FT_BEFORE, /* before the victim calls the step */
  FT_DURING, /* a few ms after it started the step (a large all-reduce) */
  FT_AFTER,  /* once the step finished on the victim */
  FT_RANDOM, /* in the table: one of the three, drawn per cycle */
} ft_when_t;

#define FT_MAX_LOST 2

typedef struct ft_scen {
  const char *name;
  const char *what;    /* for the log */
  ft_kind_t kind;
  ft_when_t when;
  int nlost;           /* victims per cycle (<= FT_MAX_LOST) */
  int rank0;           /* rank 0 is a victim */
  int cycles;
  int grow;            /* ranks added at the recovery point (FT_NONE) */
  int short_list;      /* the short step list, for many cycles */
  int deadline_s;      /* the driver's deadline for the whole run */
} ft_scen_t;

typedef struct ft_plan {
  ft_kind_t kind;
  ft_when_t when;
  int nlost;
  int lost[FT_MAX_LOST];   /* increasing */
  int nadd;                /* ranks admitted at the recovery point */
  int *add;                /* the victims, or the new ranks when growing */
  int step;                /* index into the cycle's step list */
  int delay_ms;            /* FT_DURING / FT_CUT: into the step */
  int size_before, size_after; /* mep_comm_size before and after */
} ft_plan_t;

/* The scenario called `name`, or NULL. */
const ft_scen_t *ft_scen_find(const char *name);
/* Prints the scenario names to stderr (for usage messages). */
void ft_scen_list(void);

/* The plan of `cycle` for a run of `n` initial ranks; ft_plan_free
 * releases it. n must be >= 2 + the victims. */
void ft_plan_make(const ft_scen_t *s, int n, uint64_t seed, int cycle,
                  ft_plan_t *p);
void ft_plan_free(ft_plan_t *p);
/* 1 if rank r is a victim of the plan. */
int ft_plan_is_lost(const ft_plan_t *p, int r);
/* The group's max_size: what it may grow to. */
int ft_scen_max_size(const ft_scen_t *s, int n);

const char *ft_when_name(ft_when_t w);

#endif
