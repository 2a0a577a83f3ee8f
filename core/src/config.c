/* config.c - the INI configuration: the table of known keys, the file
 * (parsed with inih), environment overrides, and typed reads.
 *
 * inih hands its handler neither line numbers nor section headers (the
 * system library is built without INI_HANDLER_LINENO and
 * INI_CALL_HANDLER_ON_NEW_SECTION), so the file is fed through our own line
 * reader: it counts physical lines, recognises section headers itself and
 * strips leading blanks. The last also turns off inih's multi-line values,
 * whose rule (an indented line continues the previous value) would make an
 * indented "key = value" silently part of the key above it. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "error.h"
#include "log.h"

/* ------------------------------------------------------------ the table */

#define KIB (INT64_C(1) << 10)
#define TIB (INT64_C(1) << 40)

static const mep__config_key_t table[] = {
    {"core", "transports", "nvlink,ibgda,verbs,tcp", MEP__CFG_LIST, 0, 0,
     NULL,
     "transports to try for each peer, in priority order; a leading ^ "
     "excludes the listed ones instead"},
    {"core", "timeout_ms", "30000", MEP__CFG_INT, 1, INT32_MAX, NULL,
     "deadline of every wait (connect, flush, collectives) in milliseconds"},
    {"core", "buffer_bytes", "16777216", MEP__CFG_INT, 1, TIB, NULL,
     "receive staging of point-to-point messages per communicator, shared "
     "among the peers"},
    {"core", "chunk_bytes", "1048576", MEP__CFG_INT, 4096, TIB, NULL,
     "unit a large transfer is pipelined in (collectives double-buffer it "
     "per peer)"},
    {"core", "two_shot_bytes", "262144", MEP__CFG_INT, 0, TIB, NULL,
     "all-reduce and broadcast messages above this size use the two-shot "
     "algorithm, smaller ones the one-shot"},
    {"core", "log_ranks", "8", MEP__CFG_INT, 0, INT32_MAX, NULL,
     "barriers, and all-reduces up to log_bytes, on at least this many "
     "ranks run in ceil(log2 ranks) rounds of one message each (recursive "
     "doubling, dissemination) instead of one message to every peer; 0: "
     "never"},
    {"core", "log_bytes", "32768", MEP__CFG_INT, 0, TIB, NULL,
     "all-reduces up to this size use the logarithmic plan of log_ranks "
     "(not float16 or bfloat16)"},
    {"core", "copy_thread", "auto", MEP__CFG_CHOICE, 0, 0, "auto|off|on",
     "on: an in-place all-reduce above two_shot_bytes copies its input "
     "aside (kept for a retry after a lost rank) on a thread of its own "
     "while it runs; off: before it starts; auto: on where the process may "
     "run on 4 CPUs or more"},
    {"core", "probe_ms", "1000", MEP__CFG_INT, 1, INT32_MAX, NULL,
     "how long a probed peer has to answer before it is treated as failed "
     "(a wait past timeout_ms probes the peers it waits for)"},
    {"core", "agreement", "on", MEP__CFG_CHOICE, 0, 0, "on|off",
     "on: a collective finishes only once every rank holds its data, so "
     "survivors of a failure agree on its result; off: one round less, and "
     "a rank lost mid-collective may leave survivors with different "
     "results"},
    {"core", "progress", "adaptive", MEP__CFG_CHOICE, 0, 0,
     "adaptive|spin|blocking",
     "how the progress thread waits: spin, then sleep (adaptive), always "
     "spin, or always sleep"},
    {"core", "cuda_path", "auto", MEP__CFG_CHOICE, 0, 0,
     "auto|kernel|staged",
     "CUDA collectives: kernels on the peers' memory where a device "
     "transport maps every peer (auto, or kernel: fail otherwise), or "
     "always through pinned host memory and the routed transports "
     "(staged)"},
    {"core", "cuda_workspace_bytes", "134217728", MEP__CFG_INT, 1048576, TIB,
     NULL,
     "device memory each rank shares with its peers for the CUDA "
     "collective kernels; larger messages go in rounds of this size"},
    {"core", "device_transport", "auto", MEP__CFG_NAME, 0, 0, NULL,
     "the transport GPU kernels reach peers with (device windows, CUDA "
     "collective kernels): auto takes the first of the allowed transports "
     "that gives a device descriptor for the peer; a name allows only it"},
    {"core", "log_level", "warn", MEP__CFG_CHOICE, 0, 0,
     "error|warn|info|debug|trace", "log level when MEP_LOG is not set"},
    {"peer", "transport", NULL, MEP__CFG_NAME, 0, 0, NULL,
     "transport forced for every route touching rank N"},
    {"host", "transport", NULL, MEP__CFG_NAME, 0, 0, NULL,
     "transport forced for every route touching a rank on host NAME"},
};
#define TABLE_LEN (sizeof table / sizeof table[0])

size_t mep__config_key_count(void) { return TABLE_LEN; }

const mep__config_key_t *mep__config_key_at(size_t i) {
  return i < TABLE_LEN ? &table[i] : NULL;
}

/* 1 if `name` is `word` alone or `word` followed by blanks and more. */
static int starts_with_word(const char *name, const char *word) {
  size_t n = strlen(word);
  return strncasecmp(name, word, n) == 0 &&
         (name[n] == '\0' || isspace((unsigned char)name[n]));
}

/* The table section a section name belongs to, or NULL if none. */
static const char *table_section(const char *name) {
  if (!name) return NULL;
  if (starts_with_word(name, "peer")) return "peer";
  if (starts_with_word(name, "host")) return "host";
  for (size_t i = 0; i < TABLE_LEN; i++)
    if (strcasecmp(name, table[i].section) == 0) return table[i].section;
  return NULL;
}

const mep__config_key_t *mep__config_key_find(const char *section,
                                              const char *key) {
  const char *ts = table_section(section);
  if (!ts || !key) return NULL;
  for (size_t i = 0; i < TABLE_LEN; i++)
    if (strcmp(table[i].section, ts) == 0 &&
        strcasecmp(table[i].key, key) == 0)
      return &table[i];
  return NULL;
}

const char *mep_config_default(const char *section, const char *key) {
  const mep__config_key_t *k = mep__config_key_find(section, key);
  return k ? k->def : NULL;
}

/* --------------------------------------------------------------- storage */

typedef struct entry {
  char *key;
  char *value;
  int line;
} entry_t;

typedef struct section {
  char *name; /* canonical: "core", "peer 3", "host gpu-node-7" */
  int line;   /* of its first header */
  const char *table; /* its table section, or NULL */
  entry_t *entries;
  size_t n, cap;
} section_t;

struct mep_config {
  char *path;
  section_t *sections;
  size_t n, cap;
};

static int grow(void **arr, size_t *cap, size_t n, size_t size) {
  if (n < *cap) return 0;
  size_t ncap = *cap ? *cap * 2 : 8;
  void *p = realloc(*arr, ncap * size);
  if (!p) return -1;
  *arr = p;
  *cap = ncap;
  return 0;
}

static section_t *find_section(const mep_config_t *cfg, const char *name) {
  for (size_t i = 0; cfg && i < cfg->n; i++)
    if (strcasecmp(cfg->sections[i].name, name) == 0)
      return &cfg->sections[i];
  return NULL;
}

static entry_t *find_entry(const section_t *s, const char *key) {
  for (size_t i = 0; s && i < s->n; i++)
    if (strcasecmp(s->entries[i].key, key) == 0) return &s->entries[i];
  return NULL;
}

static const entry_t *file_entry(const mep_config_t *cfg, const char *section,
                                 const char *key) {
  return find_entry(find_section(cfg, section), key);
}

void mep_config_free(mep_config_t *cfg) {
  if (!cfg) return;
  for (size_t i = 0; i < cfg->n; i++) {
    section_t *s = &cfg->sections[i];
    for (size_t j = 0; j < s->n; j++) {
      free(s->entries[j].key);
      free(s->entries[j].value);
    }
    free(s->entries);
    free(s->name);
  }
  free(cfg->sections);
  free(cfg->path);
  free(cfg);
}

const char *mep_config_path(const mep_config_t *cfg) {
  return cfg ? cfg->path : NULL;
}

size_t mep__config_section_count(const mep_config_t *cfg) {
  return cfg ? cfg->n : 0;
}

const char *mep__config_section_name(const mep_config_t *cfg, size_t i) {
  return cfg && i < cfg->n ? cfg->sections[i].name : NULL;
}

int mep__config_section_line(const mep_config_t *cfg, size_t i) {
  return cfg && i < cfg->n ? cfg->sections[i].line : 0;
}

/* ----------------------------------------------------------- environment */

static void mangle(const char *s, char *buf, size_t len, size_t *at) {
  for (; s && *s; s++, (*at)++) {
    unsigned char c = (unsigned char)*s;
    char o = (char)(isalnum(c) && c < 128 ? toupper(c) : '_');
    if (*at + 1 < len) buf[*at] = o;
  }
}

size_t mep__config_env_name(const char *section, const char *key, char *buf,
                            size_t len) {
  static const char prefix[] = "MEP_";
  size_t at = 0;
  for (const char *p = prefix; *p; p++, at++)
    if (at + 1 < len) buf[at] = *p;
  mangle(section, buf, len, &at);
  if (at + 1 < len) buf[at] = '_';
  at++;
  mangle(key, buf, len, &at);
  if (len) buf[at < len ? at : len - 1] = '\0';
  return at;
}

/* The override from the environment, or NULL. An empty variable counts as
 * unset: shells export empty variables too easily for "" to mean a value. */
static const char *env_value(const char *section, const char *key,
                             char *name, size_t len) {
  size_t need = mep__config_env_name(section, key, name, len);
  if (need >= len) return NULL; /* a name that long is never set */
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

#define ENV_NAME_MAX 512

const char *mep_config_get(const mep_config_t *cfg, const char *section,
                           const char *key) {
  if (!section || !key) return NULL;
  char name[ENV_NAME_MAX];
  const char *v = env_value(section, key, name, sizeof name);
  if (v) return v;
  const entry_t *e = file_entry(cfg, section, key);
  return e ? e->value : NULL;
}

const char *mep__config_origin(const mep_config_t *cfg, const char *section,
                               const char *key) {
  static _Thread_local char buf[PATH_MAX + 32];
  if (!section || !key) return "default";
  if (env_value(section, key, buf, sizeof buf)) return buf;
  const entry_t *e = file_entry(cfg, section, key);
  if (!e) return "default";
  snprintf(buf, sizeof buf, "%s:%d", cfg->path, e->line);
  return buf;
}

/* ---------------------------------------------------------------- values */

static const char *skip_blank(const char *s) {
  while (isspace((unsigned char)*s)) s++;
  return s;
}

/* Decimal with an optional sign and K/M/G (binary) suffix, blanks around.
 * Rejects anything else and anything outside int64_t. */
static int parse_int(const char *s, int64_t *out) {
  s = skip_blank(s);
  int neg = *s == '-';
  if (*s == '-' || *s == '+') s++;
  if (!isdigit((unsigned char)*s)) return -1;
  /* |INT64_MIN| = INT64_MAX + 1 */
  uint64_t limit = (uint64_t)INT64_MAX + (uint64_t)neg, v = 0;
  for (; isdigit((unsigned char)*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (limit - d) / 10) return -1;
    v = v * 10 + d;
  }
  unsigned shift = 0;
  switch (*s) {
    case 'k': case 'K': shift = 10; s++; break;
    case 'm': case 'M': shift = 20; s++; break;
    case 'g': case 'G': shift = 30; s++; break;
    default: break;
  }
  if (*skip_blank(s) != '\0') return -1;
  if (shift && v > (limit >> shift)) return -1;
  v <<= shift;
  *out = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v)
             : (int64_t)v;
  return 0;
}

static int int_error(const char *section, const char *key, const char *value,
                     const char *origin, int64_t min, int64_t max) {
  return mep__err(MEP_ERR_CONFIG,
                  "%s.%s = '%s' (from %s): not an integer in [%" PRId64
                  ", %" PRId64 "]",
                  section, key, value, origin, min, max);
}

int mep__config_int(const mep_config_t *cfg, const char *section,
                    const char *key, int64_t def, int64_t min, int64_t max,
                    int64_t *out) {
  if (!section || !key || !out)
    return mep__err(MEP_ERR_INVALID, "config: int: NULL argument");
  const char *v = mep_config_get(cfg, section, key);
  if (!v) {
    *out = def;
    return MEP_OK;
  }
  int64_t x;
  if (parse_int(v, &x) != 0 || x < min || x > max)
    return int_error(section, key, v, mep__config_origin(cfg, section, key),
                     min, max);
  *out = x;
  return MEP_OK;
}

int mep__config_known_int(const mep_config_t *cfg, const char *section,
                          const char *key, int64_t *out) {
  const mep__config_key_t *k = mep__config_key_find(section, key);
  if (!k || k->kind != MEP__CFG_INT || !k->def)
    return mep__err(MEP_ERR_INVALID, "config: %s.%s is not a known integer "
                    "key", section ? section : "(null)", key ? key : "(null)");
  int64_t def = 0;
  parse_int(k->def, &def);
  return mep__config_int(cfg, section, key, def, k->min, k->max, out);
}

/* The position of `value` among the '|'-separated choices, or -1. */
static int choice_index(const char *choices, const char *value) {
  size_t vlen = strlen(value);
  int i = 0;
  for (const char *c = choices; *c; i++) {
    size_t n = strcspn(c, "|");
    if (n == vlen && strncasecmp(c, value, n) == 0) return i;
    c += n;
    if (*c == '|') c++;
  }
  return -1;
}

int mep__config_choice(const mep_config_t *cfg, const char *section,
                       const char *key, int *index) {
  const mep__config_key_t *k = mep__config_key_find(section, key);
  if (!k || k->kind != MEP__CFG_CHOICE || !index)
    return mep__err(MEP_ERR_INVALID, "config: %s.%s is not a known choice "
                    "key", section ? section : "(null)", key ? key : "(null)");
  const char *v = mep_config_get(cfg, section, key);
  if (!v) v = k->def;
  int rc = mep__config_check_value(k, section, v,
                                   mep__config_origin(cfg, section, key));
  if (rc) return rc;
  *index = choice_index(k->choices, v);
  return MEP_OK;
}

static int is_name_char(char c) {
  return isalnum((unsigned char)c) || c == '_' || c == '-';
}

/* A transport name: letters, digits, '_' and '-', as in the plugin's file
 * name libmep-transport-<name>.so. */
static int is_name(const char *s, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (!is_name_char(s[i])) return 0;
  return 1;
}

static int is_name_list(const char *s) {
  s = skip_blank(s);
  if (*s == '^') s++;
  for (;;) {
    s = skip_blank(s);
    const char *start = s;
    while (is_name_char(*s)) s++;
    if (s == start) return 0;
    s = skip_blank(s);
    if (*s == '\0') return 1;
    if (*s++ != ',') return 0;
  }
}

/* "0" (both 0), or "LO-HI" with min <= LO <= HI <= max: plain decimals. */
static int parse_range(const char *s, int64_t min, int64_t max, int64_t *lo,
                       int64_t *hi) {
  int64_t v;
  if (parse_int(s, &v) == 0) {
    if (v != 0) return -1;
    *lo = *hi = 0;
    return 0;
  }
  char a[24], b[24];
  const char *dash = strchr(s, '-');
  if (!dash || (size_t)(dash - s) >= sizeof a || strlen(dash + 1) >= sizeof b)
    return -1;
  memcpy(a, s, (size_t)(dash - s));
  a[dash - s] = '\0';
  strcpy(b, dash + 1);
  int64_t x, y;
  if (strpbrk(a, "kKmMgG+-") || strpbrk(b, "kKmMgG+-")) return -1;
  if (parse_int(a, &x) || parse_int(b, &y) || x < min || x > y || y > max)
    return -1;
  *lo = x;
  *hi = y;
  return 0;
}

static int parse_bool(const char *s, int64_t *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  s = skip_blank(s);
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) n--;
  for (size_t i = 0; i < 4; i++) {
    if (n == strlen(yes[i]) && !strncasecmp(s, yes[i], n)) return *out = 1, 0;
    if (n == strlen(no[i]) && !strncasecmp(s, no[i], n)) return *out = 0, 0;
  }
  return -1;
}

int mep__config_value(const mep__config_key_t *k, const char *section,
                      const char *value, const char *origin, int64_t *a,
                      int64_t *b) {
  if (!k || !value) return MEP_OK;
  int64_t x = 0, y = 0;
  int ok = 1;
  const char *want = NULL;
  char buf[96];
  switch (k->kind) {
    case MEP__CFG_STRING:
      break;
    case MEP__CFG_INT:
      ok = parse_int(value, &x) == 0 && x >= k->min && x <= k->max;
      if (!ok) return int_error(section, k->key, value, origin, k->min, k->max);
      break;
    case MEP__CFG_BOOL:
      ok = parse_bool(value, &x) == 0;
      want = "not one of 0, 1, false, true, no, yes, off, on";
      break;
    case MEP__CFG_CHOICE:
      x = choice_index(k->choices, value);
      ok = x >= 0;
      snprintf(buf, sizeof buf, "not one of %s", k->choices);
      want = buf;
      break;
    case MEP__CFG_RANGE:
      ok = parse_range(value, k->min, k->max, &x, &y) == 0;
      snprintf(buf, sizeof buf, "not 0 or LO-HI with %" PRId64 " <= LO <= HI "
               "<= %" PRId64, k->min, k->max);
      want = buf;
      break;
    case MEP__CFG_LIST:
      ok = is_name_list(value);
      want = "not a comma list of transport names (letters, digits, '_', "
             "'-'), optionally led by '^'";
      break;
    case MEP__CFG_NAME:
      ok = is_name(value, strlen(value));
      want = "not a transport name (letters, digits, '_', '-')";
      break;
  }
  if (!ok)
    return mep__err(MEP_ERR_CONFIG, "%s.%s = '%s' (from %s): %s", section,
                    k->key, value, origin, want);
  if (a) *a = x;
  if (b) *b = y;
  return MEP_OK;
}

int mep__config_check_value(const mep__config_key_t *k, const char *section,
                            const char *value, const char *origin) {
  return mep__config_value(k, section, value, origin, NULL, NULL);
}

mep__config_key_t mep__config_key_of(const char *section,
                                     const mep_tp_cfg_key_t *k) {
  mep__config_key_t c = {section, k->name, k->def, (mep__config_kind_t)k->type,
                         k->min,  k->max,  k->choices, k->help};
  return c;
}

/* --------------------------------------------------------------- parsing */

typedef struct parse {
  mep_config_t *cfg;
  FILE *f;
  char *buf; /* getline's */
  size_t cap;
  int line;
  section_t *cur;  /* where keys go; NULL before the first header */
  int skip;        /* the current header was bad: ignore its keys */
  int err_line;    /* first error found by us (0: none) */
  int err_code;
  char err_msg[1024];
} parse_t;

static void fail(parse_t *p, int code, const char *fmt, ...)
    MEP_PRINTF(3, 4);
static void fail(parse_t *p, int code, const char *fmt, ...) {
  if (p->err_line) return; /* lines come in order: keep the first */
  p->err_line = p->line;
  p->err_code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->err_msg, sizeof p->err_msg, fmt, ap);
  va_end(ap);
}

static void fail_malformed(parse_t *p, int line) {
  fail(p, MEP_ERR_CONFIG, "%s:%d: malformed line (expected 'key = value' "
       "or '[section]')", p->cfg->path, line);
}

static char *dup_trimmed(const char *s, size_t n) {
  while (n && isspace((unsigned char)*s)) s++, n--;
  while (n && isspace((unsigned char)s[n - 1])) n--;
  return strndup(s, n);
}

/* The canonical name of a section header's text, or NULL after fail()
 * for [peer X] with X not a rank and [host] without a name. */
static char *canonical_section(parse_t *p, const char *text) {
  if (*text == '\0') {
    fail(p, MEP_ERR_CONFIG, "%s:%d: empty section name []", p->cfg->path,
         p->line);
    return NULL;
  }
  const char *ts = table_section(text);
  char *out = NULL;
  if (ts && strcmp(ts, "peer") == 0) {
    const char *arg = skip_blank(text + 4);
    char *end;
    errno = 0;
    long r = strtol(arg, &end, 10);
    if (!isdigit((unsigned char)*arg) || *end != '\0' || errno ||
        r > INT_MAX) {
      fail(p, MEP_ERR_CONFIG, "%s:%d: [%s]: '%s' is not a rank (a "
           "non-negative integer), as in [peer 3]", p->cfg->path, p->line,
           text, arg);
      return NULL;
    }
    if (asprintf(&out, "peer %ld", r) < 0) out = NULL;
  } else if (ts && strcmp(ts, "host") == 0) {
    const char *arg = skip_blank(text + 4);
    if (*arg == '\0') {
      fail(p, MEP_ERR_CONFIG, "%s:%d: [%s]: a host section needs a host "
           "name, as in [host gpu-node-7]", p->cfg->path, p->line, text);
      return NULL;
    }
    if (asprintf(&out, "host %s", arg) < 0) out = NULL;
  } else {
    out = strdup(ts ? ts : text);
  }
  if (!out) fail(p, MEP_ERR_NOMEM, "config: out of memory");
  return out;
}

static void open_section(parse_t *p, const char *text) {
  p->cur = NULL;
  p->skip = 1;
  char *name = canonical_section(p, text);
  if (!name) return;
  section_t *s = find_section(p->cfg, name);
  if (s) {
    free(name);
  } else {
    mep_config_t *cfg = p->cfg;
    if (grow((void **)&cfg->sections, &cfg->cap, cfg->n,
             sizeof *cfg->sections)) {
      free(name);
      fail(p, MEP_ERR_NOMEM, "config: out of memory");
      return;
    }
    s = &cfg->sections[cfg->n++];
    memset(s, 0, sizeof *s);
    s->name = name;
    s->line = p->line;
    s->table = table_section(name);
  }
  p->cur = s;
  p->skip = 0;
}

/* A line starting with '[', read as inih reads it: the header ends at ']'
 * unless an inline comment (';' after a blank) comes first. Without ']'
 * inih reports the line as malformed and we leave it to do so. */
static void header_line(parse_t *p, const char *line) {
  const char *s = line + 1;
  int was_space = 0;
  while (*s && *s != ']' && !(was_space && *s == ';')) {
    was_space = isspace((unsigned char)*s);
    s++;
  }
  if (*s != ']') {
    p->cur = NULL;
    p->skip = 1;
    return;
  }
  const char *rest = skip_blank(s + 1);
  if (*rest != '\0' && *rest != ';' && *rest != '#') {
    fail_malformed(p, p->line);
    p->cur = NULL;
    p->skip = 1;
    return;
  }
  char *text = dup_trimmed(line + 1, (size_t)(s - line - 1));
  if (!text) {
    fail(p, MEP_ERR_NOMEM, "config: out of memory");
    return;
  }
  open_section(p, text);
  free(text);
}

/* inih's line source (fgets-like): one physical line per call, leading
 * blanks and the UTF-8 byte-order mark removed. A line that does not fit
 * inih's buffer of `num` bytes is reported here and handed over as blank,
 * so inih never splits it into two lines and its numbering stays right. */
static char *read_line(char *str, int num, void *stream) {
  parse_t *p = stream;
  ssize_t got = getline(&p->buf, &p->cap, p->f);
  if (got < 0) return NULL;
  p->line++;
  const char *s = p->buf;
  size_t len = (size_t)got;
  if (p->line == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
    s += 3, len -= 3;
  str[0] = '\0';
  if (memchr(s, '\0', len)) {
    fail(p, MEP_ERR_CONFIG, "%s:%d: line contains a NUL byte",
         p->cfg->path, p->line);
    return str;
  }
  while (len && isspace((unsigned char)*s)) s++, len--;
  while (len && isspace((unsigned char)s[len - 1])) len--;
  if (num < 1 || len >= (size_t)num) {
    fail(p, MEP_ERR_CONFIG, "%s:%d: line is %zu characters long; the "
         "limit is %d", p->cfg->path, p->line, len, num > 0 ? num - 1 : 0);
    return str;
  }
  memcpy(str, s, len);
  str[len] = '\0';
  if (str[0] == '[') header_line(p, str);
  return str;
}

/* The keys a section declares, as names: the core table's entries of
 * table section `ts`, or a plugin's declaration. */
typedef struct key_names {
  const char *ts;                /* core table section, or NULL */
  const mep_tp_cfg_key_t *keys;  /* plugin declaration */
  size_t nkeys;
} key_names_t;

static const char *name_at(const key_names_t *kn, size_t *i) {
  if (!kn->ts) return *i < kn->nkeys ? kn->keys[(*i)++].name : NULL;
  for (; *i < TABLE_LEN; (*i)++)
    if (strcmp(table[*i].section, kn->ts) == 0) return table[(*i)++].key;
  return NULL;
}

static const char *known_keys(const key_names_t *kn, char *buf, size_t len) {
  size_t at = 0, i = 0;
  buf[0] = '\0';
  for (const char *k; (k = name_at(kn, &i));) {
    int n = snprintf(buf + at, len - at, "%s%s", at ? ", " : "", k);
    if (n < 0 || (size_t)n >= len - at) break;
    at += (size_t)n;
  }
  return buf;
}

/* Edit distance, capped for long words (those get no suggestion). */
static size_t distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  enum { MAXW = 64 };
  if (la >= MAXW || lb >= MAXW) return SIZE_MAX;
  size_t prev[MAXW + 1], cur[MAXW + 1];
  for (size_t j = 0; j <= lb; j++) prev[j] = j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) !=
                                  tolower((unsigned char)b[j - 1]));
      size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
      cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
    memcpy(prev, cur, (lb + 1) * sizeof *prev);
  }
  return prev[lb];
}

/* "; did you mean 'x'?" for the declared key closest to `key`, or "". */
static const char *suggestion(const key_names_t *kn, const char *key,
                              char *hint, size_t len) {
  size_t best = 3, i = 0;
  hint[0] = '\0';
  for (const char *k; (k = name_at(kn, &i));) {
    size_t d = distance(key, k);
    size_t kl = strlen(key), tl = strlen(k);
    if (kl >= 4 && tl >= 4 && strncasecmp(key, k, kl < tl ? kl : tl) == 0)
      d = 1; /* "timeout" for "timeout_ms" */
    if (d < best) {
      best = d;
      snprintf(hint, len, "; did you mean '%s'?", k);
    }
  }
  return hint;
}

/* `where` is "file:line" or a variable's name. */
static void warn_unknown(const key_names_t *kn, const char *where,
                         const char *key, const char *section) {
  char list[512], hint[128];
  mep__warn("%s: unknown key '%s' in [%s] is ignored (known keys: %s)%s",
            where, key, section, known_keys(kn, list, sizeof list),
            suggestion(kn, key, hint, sizeof hint));
}

static void warn_unknown_key(parse_t *p, const char *key) {
  key_names_t kn = {.ts = p->cur->table};
  char where[PATH_MAX + 16];
  snprintf(where, sizeof where, "%s:%d", p->cfg->path, p->line);
  warn_unknown(&kn, where, key, p->cur->name);
}

/* `section` is inih's, unused: ours is p->cur (inih truncates long names). */
static int on_key(void *user, const char *section, const char *name,
                  const char *value) {
  parse_t *p = user;
  if (p->skip) return 1;
  if (!p->cur) {
    fail(p, MEP_ERR_CONFIG, "%s:%d: '%s' is set outside any [section]",
         p->cfg->path, p->line, name);
    return 1;
  }
  if (*name == '\0') {
    fail_malformed(p, p->line);
    return 1;
  }
  section_t *s = p->cur;
  entry_t *e = find_entry(s, name);
  char *v = strdup(value);
  if (!v) {
    fail(p, MEP_ERR_NOMEM, "config: out of memory");
    return 1;
  }
  if (e) {
    mep__warn("%s:%d: [%s] %s is set again; this value replaces the one "
              "on line %d", p->cfg->path, p->line, s->name, name, e->line);
    free(e->value);
    e->value = v;
    e->line = p->line;
    return 1;
  }
  char *k = strdup(name);
  if (!k || grow((void **)&s->entries, &s->cap, s->n, sizeof *s->entries)) {
    free(k);
    free(v);
    fail(p, MEP_ERR_NOMEM, "config: out of memory");
    return 1;
  }
  s->entries[s->n++] = (entry_t){k, v, p->line};
  if (s->table && !mep__config_key_find(s->name, name))
    warn_unknown_key(p, name);
  return 1;
}

static int parse_file(mep_config_t *cfg, FILE *f) {
  parse_t p = {.cfg = cfg, .f = f};
  int rc = ini_parse_stream(read_line, &p, on_key, &p);
  int read_err = ferror(f) ? (errno ? errno : EIO) : 0;
  free(p.buf);
  if (rc < 0)
    return mep__err(MEP_ERR_NOMEM, "config: %s: out of memory while "
                    "parsing", cfg->path);
  if (read_err)
    return mep__err_errno(MEP_ERR_SYSTEM, read_err, "config: read %s",
                          cfg->path);
  if (rc > 0 && (!p.err_line || rc < p.err_line))
    return mep__err(MEP_ERR_CONFIG, "%s:%d: malformed line (expected "
                    "'key = value' or '[section]')", cfg->path, rc);
  if (p.err_line) return mep__err(p.err_code, "%s", p.err_msg);
  return MEP_OK;
}

static int load_file(mep_config_t *cfg, const char *path, int from_env) {
  const char *via = from_env ? " (named by MEP_CONFIG)" : "";
  cfg->path = strdup(path);
  if (!cfg->path) return mep__err(MEP_ERR_NOMEM, "config: out of memory");
  FILE *f = fopen(path, "re");
  if (!f) {
    int e = errno;
    return mep__err_errno(e == ENOENT ? MEP_ERR_NOT_FOUND : MEP_ERR_SYSTEM,
                          e, "config: cannot open %s%s", path, via);
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    return mep__err_errno(MEP_ERR_SYSTEM, EISDIR, "config: cannot read %s%s",
                          path, via);
  }
  int rc = parse_file(cfg, f);
  fclose(f);
  return rc;
}

/* The core's own keys are checked at load, from the file or the
 * environment; plugin sections are left to each plugin, whose rules the
 * core does not own (a third-party plugin's least of all). */
static int check_core_keys(const mep_config_t *cfg) {
  for (size_t i = 0; i < TABLE_LEN; i++) {
    const mep__config_key_t *k = &table[i];
    if (strcmp(k->section, "core") != 0) continue;
    const char *v = mep_config_get(cfg, "core", k->key);
    int rc = mep__config_check_value(k, "core", v,
                                     mep__config_origin(cfg, "core", k->key));
    if (rc) return rc;
  }
  for (size_t i = 0; i < cfg->n; i++) {
    const section_t *s = &cfg->sections[i];
    if (!s->table || (strcmp(s->table, "peer") && strcmp(s->table, "host")))
      continue;
    const mep__config_key_t *k = mep__config_key_find(s->name, "transport");
    const char *v = mep_config_get(cfg, s->name, "transport");
    int rc = mep__config_check_value(
        k, s->name, v, mep__config_origin(cfg, s->name, "transport"));
    if (rc) return rc;
  }
  return MEP_OK;
}

int mep_config_load(const char *path, mep_config_t **out) {
  if (!out) return mep__err(MEP_ERR_INVALID, "config: load: out is NULL");
  *out = NULL;
  int from_env = 0;
  if (!path || !*path) {
    path = getenv("MEP_CONFIG");
    from_env = 1;
    if (path && !*path) path = NULL;
  }
  mep_config_t *cfg = calloc(1, sizeof *cfg);
  if (!cfg) return mep__err(MEP_ERR_NOMEM, "config: out of memory");
  int rc = path ? load_file(cfg, path, from_env) : MEP_OK;
  if (rc == MEP_OK) rc = check_core_keys(cfg);
  if (rc) {
    mep_config_free(cfg);
    return rc;
  }
  *out = cfg;
  return MEP_OK;
}

/* --------------------------------------------------------- plugin sections */

static const mep_tp_cfg_key_t *declared(const mep_tp_cfg_key_t *keys,
                                        size_t n, const char *key) {
  for (size_t i = 0; i < n; i++)
    if (keys[i].name && strcasecmp(keys[i].name, key) == 0) return &keys[i];
  return NULL;
}

/* A MEP_<SECTION>_* variable that matches no declared key's name. */
static void warn_unknown_env(const char *section, const mep_tp_cfg_key_t *keys,
                             size_t n) {
  extern char **environ;
  char prefix[ENV_NAME_MAX], name[ENV_NAME_MAX];
  size_t plen = mep__config_env_name(section, "", prefix, sizeof prefix);
  if (plen >= sizeof prefix) return;
  key_names_t kn = {.keys = keys, .nkeys = n};
  for (char **e = environ; e && *e; e++) {
    const char *eq = strchr(*e, '=');
    size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
    if (len <= plen || strncmp(*e, prefix, plen) != 0 || !eq || !eq[1])
      continue;
    int known = 0;
    for (size_t i = 0; i < n && !known; i++) {
      size_t need = mep__config_env_name(section, keys[i].name, name,
                                         sizeof name);
      known = need == len && strncmp(*e, name, len) == 0;
    }
    if (known) continue;
    char var[ENV_NAME_MAX], key[ENV_NAME_MAX];
    snprintf(var, sizeof var, "%.*s", (int)len, *e);
    snprintf(key, sizeof key, "%s", var + plen);
    for (char *c = key; *c; c++) *c = (char)tolower((unsigned char)*c);
    warn_unknown(&kn, var, key, section);
  }
}

int mep__config_check_plugin(const mep_config_t *cfg, const char *section,
                             const mep_tp_cfg_key_t *keys, size_t n) {
  for (size_t i = 0; i < n; i++) {
    mep__config_key_t k = mep__config_key_of(section, &keys[i]);
    const char *v = mep_config_get(cfg, section, k.key);
    int rc = mep__config_check_value(&k, section, v,
                                     mep__config_origin(cfg, section, k.key));
    if (rc) return rc;
  }
  const section_t *s = find_section(cfg, section);
  key_names_t kn = {.keys = keys, .nkeys = n};
  for (size_t i = 0; s && i < s->n; i++) {
    if (declared(keys, n, s->entries[i].key)) continue;
    char where[PATH_MAX + 16];
    snprintf(where, sizeof where, "%s:%d", cfg->path, s->entries[i].line);
    warn_unknown(&kn, where, s->entries[i].key, s->name);
  }
  warn_unknown_env(section, keys, n);
  return MEP_OK;
}
