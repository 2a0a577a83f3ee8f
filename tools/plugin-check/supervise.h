/* supervise.h - runs one check in fresh rank processes (rank 0, and rank 1
 * connected to it by a socketpair), collects their result records under a
 * deadline, always reaps them, and turns a crash or a hang into a FAIL. */
#ifndef PC_SUPERVISE_H
#define PC_SUPERVISE_H

#include <stddef.h>
#include <stdint.h>

#include "worker.h"

typedef enum { PC_PASS, PC_FAIL, PC_SKIP } pc_status_t;

typedef struct pc_suite {
  const pc_opts_t *opts;
  const mep_transport_t *tp;
  const mep_plugin_t *plugin;
  const char *plugin_path;
  const mep_config_t *cfg;
  uint8_t secret[32];
} pc_suite_t;

typedef struct pc_job {
  const char *name;
  int nranks;
  int kills_peer; /* rank 1 dying of SIGKILL is part of the check */
  int registers;  /* pc_worker_t.registers */
  void (*run)(pc_worker_t *w);
  int budget_ms; /* the whole check, in each rank */
  uint64_t seed;
} pc_job_t;

/* Runs the job; prints INFO (with -v) and BENCH lines as they arrive; on
 * FAIL or SKIP writes the reason to msg. */
pc_status_t pc_supervise(const pc_suite_t *su, const pc_job_t *job,
                         char *msg, size_t msg_len);

#endif
