/* config.c - the [shm] section: ring_bytes, the size of each receive ring. */
#include "shm.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
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

int shm_config_ring_bytes(const mep_tp_env_t *env, uint64_t *out, char *err,
                          size_t err_len) {
  *out = SHM_RING_DEFAULT;
  const char *s = env->cfg_get ? env->cfg_get(env->cfg, "ring_bytes") : NULL;
  if (!s) return 0;
  uint64_t v;
  if (parse_bytes(s, &v) != 0 || v < SHM_RING_MIN || v > SHM_RING_MAX ||
      v % 64 != 0) {
    snprintf(err, err_len,
             "shm: ring_bytes = '%s' is not a byte count from %u to %u that "
             "is a multiple of 64 (e.g. 4194304 or 4M)",
             s, SHM_RING_MIN, SHM_RING_MAX);
    return MEP_ERR_CONFIG;
  }
  *out = v;
  return 0;
}
