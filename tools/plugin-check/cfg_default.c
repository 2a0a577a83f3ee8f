/* cfg_default.c - declared defaults, parsed by the suite (cfg_default.h). */
#include "cfg_default.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A decimal with an optional K, M or G (times 2^10, 2^20, 2^30). */
static int decimal(const char *s, int suffixes, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s) return -1;
  int shift = 0;
  if (suffixes && *end) {
    const char *units = "KMG";
    const char *u = strchr(units, *end & ~0x20);
    if (!u) return -1;
    shift = 10 * (int)(u - units + 1);
    end++;
  }
  if (*end) return -1;
  if (shift && (v > (INT64_MAX >> shift) || v < (INT64_MIN >> shift)))
    return -1;
  *out = (int64_t)v * ((int64_t)1 << shift);
  return 0;
}

static int bool_word(const char *s, int64_t *out) {
  static const char *const words[][2] = {
      {"0", "1"}, {"false", "true"}, {"no", "yes"}, {"off", "on"}};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    for (int v = 0; v < 2; v++)
      if (!strcasecmp(s, words[i][v])) return *out = v, 0;
  return -1;
}

static int choice(const char *choices, const char *s, int64_t *out) {
  size_t n = strlen(s);
  int64_t i = 0;
  for (const char *c = choices ? choices : ""; *c; i++) {
    size_t len = strcspn(c, "|");
    if (len == n && !strncasecmp(c, s, n)) return *out = i, 0;
    c += len + (c[len] == '|');
  }
  return -1;
}

int pc_cfg_default_int(const mep_tp_cfg_key_t *k, int64_t *out, char *why,
                       size_t why_len) {
  int rc = -1;
  if (!k->def)
    snprintf(why, why_len, "it has no default");
  else if (k->type == MEP_TP_CFG_INT && (rc = decimal(k->def, 1, out)))
    snprintf(why, why_len, "its default \"%s\" is not a decimal", k->def);
  else if (k->type == MEP_TP_CFG_BOOL && (rc = bool_word(k->def, out)))
    snprintf(why, why_len, "its default \"%s\" is not a boolean", k->def);
  else if (k->type == MEP_TP_CFG_CHOICE && (rc = choice(k->choices, k->def,
                                                        out)))
    snprintf(why, why_len, "its default \"%s\" is not one of \"%s\"", k->def,
             k->choices ? k->choices : "");
  return rc;
}

int pc_cfg_default_range(const mep_tp_cfg_key_t *k, int64_t *lo, int64_t *hi,
                         char *why, size_t why_len) {
  if (!k->def) {
    snprintf(why, why_len, "it has no default");
    return -1;
  }
  if (!strcmp(k->def, "0")) {
    *lo = *hi = 0;
    return 0;
  }
  char a[32];
  const char *dash = strchr(k->def, '-');
  size_t n = dash ? (size_t)(dash - k->def) : 0;
  if (dash && n > 0 && n < sizeof a) {
    memcpy(a, k->def, n);
    a[n] = '\0';
    if (!decimal(a, 0, lo) && !decimal(dash + 1, 0, hi)) return 0;
  }
  snprintf(why, why_len, "its default \"%s\" is neither 0 nor LO-HI", k->def);
  return -1;
}
