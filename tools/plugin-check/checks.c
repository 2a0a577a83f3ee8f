/* checks.c - the table of checks, in the order they run. */
#include "checks.h"

#include <string.h>

/* nranks, kills_peer, registers: see pc_check_t. */
const pc_check_t pc_checks[] = {
    {"abi", "the vtable: version, size, name, mandatory functions; props, "
     "also for an older core; init with an ABI 1.2 core's env",
     1, 0, 0, pc_check_abi},
    {"config-keys", "declared config keys: defaults read back, init with "
     "them (ABI 1.3)",
     1, 0, 0, pc_check_config_keys},
    {"init-fini", "20 init/fini cycles leak no fd; close is idempotent",
     2, 0, 0, pc_check_init_fini},
    {"address", "the address blob fits MEP_TP_MAX_ADDR and is stable",
     2, 0, 0, pc_check_address},
    {"reachable", "both ranks give the same reachable answer",
     2, 0, 0, pc_check_reachable},
    {"connect", "both ranks connect within the timeout",
     2, 0, 0, pc_check_connect},
    {"register", "reg of 1 B, odd and large regions; rkeys; import",
     2, 0, 1, pc_check_register},
    {"write-sizes", "writes of 1 B..64 MiB at odd offsets, both ways",
     2, 0, 1, pc_check_write_sizes},
    {"signal-order", "a signal never overtakes its data; ADD is exact",
     2, 0, 1, pc_check_signal_order},
    {"completions", "256 writes in flight: each token reported once",
     2, 0, 1, pc_check_completions},
    {"bounds", "out-of-bounds writes and signals refused, memory intact",
     2, 0, 1, pc_check_bounds},
    {"dereg", "a write to a deregistered region does not land",
     2, 0, 1, pc_check_dereg},
    {"peer-killed", "a peer SIGKILLed mid-stream is reported within 2 s",
     2, 1, 1, pc_check_peer_killed},
    {"reconnect", "a rank's context is replaced: close, connect anew, data "
     "(ABI 1.1)",
     2, 0, 1, pc_check_reconnect},
    {"descriptors", "device descriptors (ABI 1.3): headers, room, kernels "
     "through base",
     2, 0, 1, pc_check_descriptors},
};

const int pc_n_checks = (int)(sizeof pc_checks / sizeof pc_checks[0]);

const pc_check_t *pc_check_find(const char *name) {
  for (int i = 0; i < pc_n_checks; i++)
    if (strcmp(pc_checks[i].name, name) == 0) return &pc_checks[i];
  return NULL;
}

uint64_t pc_big_size(const pc_worker_t *w) {
  return w->opts->quick ? PC_QUICK_CAP : PC_BIG;
}
