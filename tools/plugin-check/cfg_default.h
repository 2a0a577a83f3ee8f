/* cfg_default.h - what a declared configuration key's default stands for,
 * read as transport.h defines the types, by the suite's own small parser:
 * the independent answer the config-keys check holds the env's typed
 * reads (libmep's parser) to. */
#ifndef PC_CFG_DEFAULT_H
#define PC_CFG_DEFAULT_H

#include <stddef.h>
#include <stdint.h>

#include "mep/transport.h"

/* The default of an INT (K, M, G binary suffixes), BOOL (0 or 1) or
 * CHOICE (the index of the choice) key. 0, or -1 with the reason in why. */
int pc_cfg_default_int(const mep_tp_cfg_key_t *k, int64_t *out, char *why,
                       size_t why_len);
/* The default of a RANGE key: "0" is 0-0, else "LO-HI". */
int pc_cfg_default_range(const mep_tp_cfg_key_t *k, int64_t *lo, int64_t *hi,
                         char *why, size_t why_len);

#endif
