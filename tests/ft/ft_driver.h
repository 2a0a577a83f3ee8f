/* ft_driver.h - the driver's state, shared by the run loop (ft_driver.c)
 * and the checks of the ranks' reports (ft_verify.c). */
#ifndef MEP_TESTS_FT_DRIVER_H
#define MEP_TESTS_FT_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ft_proc.h"
#include "launch.h"
#include "ft_scen.h"

typedef struct ft_proc {
  pid_t pid;
  int rank, inc, cycle0, join;
  int running, stopped;
  int dying;      /* it said it raises SIGKILL */
  int status;     /* from waitpid, once reaped */
} ft_proc_t;

/* What happened in one cycle, as the driver saw it. */
typedef struct ft_cyc {
  int lost;       /* survivors that dropped every victim */
  int ready;      /* survivors at the recovery point */
  int joined;
  int spawned, cont_sent;
  long long t_fault; /* death, freeze or cut (ms, CLOCK_MONOTONIC) */
} ft_cyc_t;

typedef struct ft_drv {
  const ft_scen_t *scen;
  int n, max_size;
  uint64_t seed;
  int timeout_ms, probe_ms;
  ft_plan_t *plans;  /* per cycle */
  ft_cyc_t *cyc;
  ft_proc_t *procs;
  size_t nprocs, cap;
  int *cur;          /* max_size: index of each rank's latest process */
  int *next_inc;     /* max_size */
  int ctl_rd, ctl_wr;
  char line[4096];
  size_t linelen;
  const char *netns; /* namespace prefix (netns.sh), or NULL */
  char self[4096], dir[256];
  mep_launch_store_t store;
  long long deadline;
  int failed;
} ft_drv_t;

/* Cross-checks the reports of every process after a run that went
 * through, and prints what happened per cycle. Returns the number of
 * failed checks. */
int ft_verify(ft_drv_t *d);

#endif
