/* config.c - the [shm] section: ring_bytes, the size of each receive ring. */
#include "shm.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>

/* "4194304", "4096k", "4M", "1G" (binary multiples). */
static int parse_bytes(const char *s, uint64_t *out) {
  const char *p = s;
  while (isspace((unsigned char)*p)) p++;
  if (!isdigit((unsigned char)*p)) return -1;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(p, &end, 10);
  if (errno) return -1;
  unsigned shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  default: break;
  }
  while (isspace((unsigned char)*end)) end++;
  if (*end != '\0' || v > (UINT64_MAX >> shift)) return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

/* The keys of [shm], which the core checks the user's configuration
 * against (mep_transport_t.config_keys) and mep-info documents. */
const mep_tp_cfg_key_t shm_config_keys[SHM_NKEYS] = {
    {"ring_bytes", MEP_TP_CFG_INT, SHM_RING_MIN, SHM_RING_MAX, "4194304", NULL,
     "The example shared-memory plugin: bytes of the ring each peer writes "
     "into (a multiple of 64); messages larger than the ring stream through "
     "it."},
};

/* A core of transport ABI 1.3 reads the key for us, with its declared
 * bounds and default (*core_rc: its error, with its message); an older
 * one hands over the raw text. 1: *v read; 0: unset; -1: not a number. */
static int read_key(const mep_tp_env_t *env, uint64_t *v, const char **s,
                    int *core_rc) {
  int typed = MEP_TP_HAS(env, mep_tp_env_t, cfg_str) && env->cfg_int &&
              env->cfg_keys;
  *core_rc = 0;
  if (typed) {
    int64_t x = 0;
    *core_rc = env->cfg_int(env, "ring_bytes", &x);
    *s = env->cfg_str(env, "ring_bytes");
    *v = (uint64_t)x;
    return 1;
  }
  *s = env->cfg_get ? env->cfg_get(env->cfg, "ring_bytes") : NULL;
  if (!*s) return 0;
  return parse_bytes(*s, v) == 0 ? 1 : -1;
}

int shm_config_ring_bytes(const mep_tp_env_t *env, uint64_t *out, char *err,
                          size_t err_len) {
  *out = SHM_RING_DEFAULT;
  const char *s = NULL;
  uint64_t v = 0;
  int core_rc, got = read_key(env, &v, &s, &core_rc);
  if (core_rc) return core_rc; /* err stays empty: the core's message */
  if (got == 0) return 0;
  if (got < 0 || v < SHM_RING_MIN || v > SHM_RING_MAX || v % 64 != 0) {
    snprintf(err, err_len,
             "shm: ring_bytes = '%s' is not a byte count from %u to %u that "
             "is a multiple of 64 (e.g. 4194304 or 4M)",
             s, SHM_RING_MIN, SHM_RING_MAX);
    return MEP_ERR_CONFIG;
  }
  *out = v;
  return 0;
}
