/* ft_rank.h - the body of one rank process of the fault-tolerance tests:
 * what the driver forks and execs with FT_* variables in the environment.
 * Each rank checks what it sees itself (results against the reference,
 * its active set, its epoch, durations) and writes one report line per
 * step for the driver's cross-rank checks; events that the driver acts on
 * go through a pipe. */
#ifndef MEP_TESTS_FT_RANK_H
#define MEP_TESTS_FT_RANK_H

#include <stdint.h>
#include <stdio.h>

#include <mep/mep.h>

#include "ft_ref.h"
#include "ft_scen.h"

typedef struct ft_rank {
  const ft_scen_t *scen;
  int rank, n0, max_size;
  int size;            /* mep_comm_size now */
  int inc, join, start_cycle;
  uint64_t seed;
  int ctl_fd;          /* the driver's event pipe */
  mep_store_t *store;
  mep_comm_t *comm;
  uint8_t *alive;      /* max_size: the active set as this rank tracks it */
  uint8_t *scratch;    /* max_size */
  uint8_t *seen;       /* max_size: the live set at the last check */
  int *dropped;        /* max_size */
  uint64_t epoch;      /* of `seen` */
  int timeout_ms, probe_ms;
  FILE *report;
  /* The cycle running and its plan; lost_sent once every victim left. */
  int cycle;
  ft_plan_t *plan;
  int lost_sent;
  /* Open fds and threads after this process's first and latest recovery
   * as a survivor. */
  int recoveries, fds_first, threads_first;
} ft_rank_t;

/* Reads FT_* from the environment and runs the rank; returns its exit
 * code (failed checks exit on the spot). */
int ft_rank_main(void);

/* Step ids: unique per (cycle, phase, index), equal on every rank. */
enum { FT_PH_FAULT = 0, FT_PH_AFTER = 1, FT_PH_FLAG = 2, FT_PH_FULL = 3 };
uint64_t ft_gid(int cycle, int phase, int idx);

/* Tells the driver `kind` happened: "kind pid rank cycle t_ms extra". */
void ft_event(const ft_rank_t *R, const char *kind, const char *extra);

/* How long a request may take before the test calls it a hang: a lost
 * rank costs a timeout and a probe, plus room for a slow machine. */
int ft_wait_ms(const ft_rank_t *R);

/* mep_comm_active and the live array agree with the tracked set
 * (R->alive), exactly or less victims whose drop no collective reported
 * yet; the epoch moved iff the set did since the last check. */
void ft_check_active(ft_rank_t *R, int exact, const char *name);

/* The deadline of the rank's store operations. */
int ft_store_ms(const ft_rank_t *R);

/* Starts step s on b (req NULL: blocking). */
int ft_coll_start(mep_comm_t *comm, const ft_step_t *s, ft_bufs_t *b,
                  mep_req_t **req);

/* Runs step s over buffers b, blocking or through a request: checks the
 * status (MEP_OK, or MEP_OK_DEGRADED unless must_ok), the dropped set,
 * the active set and epoch that follow, the duration of a small healthy
 * step, and reports it. Returns the status. */
int ft_coll_run(ft_rank_t *R, const ft_step_t *s, uint64_t gid, int use_req,
                int must_ok, ft_bufs_t *b);
/* ft_coll_run on the step's reference inputs, then the result checked
 * against the reference over the survivors. */
int ft_run_step(ft_rank_t *R, const ft_step_t *s, uint64_t gid, int use_req,
                int must_ok);

/* The victim's part of the plan at step idx of the faulty phase: called
 * before the step; returns only when this rank has nothing to do there
 * (FT_AFTER: ft_victim_after follows the step). Never returns for the
 * other kinds: the process dies or exits. */
void ft_victim_before(ft_rank_t *R, const ft_step_t *s, uint64_t gid);
void ft_victim_after(ft_rank_t *R);

#endif
