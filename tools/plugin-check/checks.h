/* checks.h - the conformance checks, each run by one or two fresh rank
 * processes (see supervise.h). A check's function returns normally when
 * it passes and ends its process through pc_fail/pc_skip otherwise. */
#ifndef PC_CHECKS_H
#define PC_CHECKS_H

#include <stddef.h>

#include "worker.h"

typedef struct pc_check {
  const char *name;
  const char *what; /* one line, for --list */
  int nranks;       /* 1: rank 0 alone; 2: ranks 0 and 1 */
  int kills_peer;   /* rank 0 SIGKILLs rank 1 on purpose */
  int registers;    /* registers memory (see pc_worker_t.registers) */
  void (*run)(pc_worker_t *w);
} pc_check_t;

extern const pc_check_t pc_checks[];
extern const int pc_n_checks;

const pc_check_t *pc_check_find(const char *name);

void pc_check_abi(pc_worker_t *w);
void pc_check_init_fini(pc_worker_t *w);
void pc_check_address(pc_worker_t *w);
void pc_check_reachable(pc_worker_t *w);
void pc_check_connect(pc_worker_t *w);
void pc_check_register(pc_worker_t *w);
void pc_check_write_sizes(pc_worker_t *w);
void pc_check_signal_order(pc_worker_t *w);
void pc_check_completions(pc_worker_t *w);
void pc_check_bounds(pc_worker_t *w);
void pc_check_dereg(pc_worker_t *w);
void pc_check_peer_killed(pc_worker_t *w);
void pc_check_reconnect(pc_worker_t *w);
void pc_check_descriptors(pc_worker_t *w);
void pc_check_config_keys(pc_worker_t *w);

/* The benchmark, run as a two-rank "check" that emits table lines. */
void pc_bench(pc_worker_t *w);

/* The largest transfer of the suite: 64 MiB, or 4 MiB with --quick. */
uint64_t pc_big_size(const pc_worker_t *w);

#endif
