/* config.c - the [tcp] keys, read through env->cfg_get and checked. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tcp.h"

/* A whole decimal integer in [lo, hi], nothing before or after it. */
static int parse_int(const char *s, long lo, long hi, int *out) {
  if (!s || !*s) return -1;
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

static int parse_bool(const char *s, int *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  for (size_t i = 0; i < 4; i++) {
    if (!strcasecmp(s, yes[i])) return *out = 1, 0;
    if (!strcasecmp(s, no[i])) return *out = 0, 0;
  }
  return -1;
}

/* "0" (ephemeral) or "LO-HI" with 1 <= LO <= HI <= 65535. */
static int parse_range(const char *s, int *lo, int *hi) {
  if (!strcmp(s, "0")) return *lo = *hi = 0, 0;
  const char *dash = strchr(s, '-');
  if (!dash || dash == s) return -1;
  char first[16];
  size_t n = (size_t)(dash - s);
  if (n >= sizeof first) return -1;
  memcpy(first, s, n);
  first[n] = '\0';
  if (parse_int(first, 1, 65535, lo) || parse_int(dash + 1, 1, 65535, hi))
    return -1;
  return *lo <= *hi ? 0 : -1;
}

static const char *get(const mep_tp_env_t *env, const char *key) {
  const char *v = env->cfg_get ? env->cfg_get(env->cfg, key) : NULL;
  return v && *v ? v : NULL;
}

static int bad(const mep_tp_env_t *env, const char *key, const char *val,
               const char *want) {
  env->set_error("tcp: bad value '%s' for [tcp] %s: expected %s", val, key,
                 want);
  return MEP_ERR_CONFIG;
}

int mep__tcp_cfg_read(const mep_tp_env_t *env, tcp_cfg_t *cfg) {
  *cfg = (tcp_cfg_t){.nsock = 1, .retries = 10, .nodelay = 1};
  const char *v;
  if ((v = get(env, "ifname"))) {
    if (strlen(v) >= sizeof cfg->ifname)
      return bad(env, "ifname", v, "an interface name");
    strcpy(cfg->ifname, v);
  }
  if ((v = get(env, "port_range")) &&
      parse_range(v, &cfg->port_lo, &cfg->port_hi))
    return bad(env, "port_range", v,
               "0 (ephemeral) or LO-HI with 1 <= LO <= HI <= 65535");
  if ((v = get(env, "sockets_per_peer")) &&
      parse_int(v, 1, MEP_TCP_MAX_SOCKS, &cfg->nsock))
    return bad(env, "sockets_per_peer", v, "an integer from 1 to 16");
  if ((v = get(env, "connect_retries")) &&
      parse_int(v, 0, 1000000, &cfg->retries))
    return bad(env, "connect_retries", v, "an integer from 0 to 1000000");
  if ((v = get(env, "nodelay")) && parse_bool(v, &cfg->nodelay))
    return bad(env, "nodelay", v, "0 or 1");
  return 0;
}
