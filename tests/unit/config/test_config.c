/* test_config.c - the INI configuration: files, environment overrides,
 * errors and warnings, typed reads, and the agreement of the table of known
 * keys with conf/mep.ini and docs/config.md.
 *
 * Usage: test_config SOURCE_ROOT. Set MEP_TEST_SEED to replay a run. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "mep/mep.h"

__extension__ typedef __int128 i128;

static const char *current = "setup";
static int checks;

#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    checks++;                                                               \
    if (!(cond)) {                                                          \
      fprintf(stderr, "FAIL [%s] %s:%d: ", current, __FILE__, __LINE__);    \
      fprintf(stderr, __VA_ARGS__);                                         \
      fprintf(stderr, "\n  last error: %s\n", mep_last_error());            \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

static int str_eq(const char *a, const char *b) {
  return a && strcmp(a, b) == 0;
}

static const char *show(const char *s) { return s ? s : "(NULL)"; }

#define CHECK_STR(got, want)                                                \
  CHECK(str_eq((got), (want)), "got '%s', want '%s'", show(got), (want))

static int has(const char *hay, const char *needle) {
  return hay && strstr(hay, needle);
}

#define CHECK_HAS(hay, needle)                                              \
  CHECK(has((hay), (needle)), "'%s' does not contain '%s'", show(hay),      \
        (needle))

/* ------------------------------------------------------------- helpers */

static uint64_t rng_state;

static uint64_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * UINT64_C(2685821657736338717);
}

static char *tmp_files[256];
static size_t n_tmp;
static char log_path[64];

static void cleanup(void) {
  for (size_t i = 0; i < n_tmp; i++) {
    unlink(tmp_files[i]);
    free(tmp_files[i]);
  }
  if (log_path[0]) unlink(log_path);
}

/* Writes `text` to a new temporary file; returns its path. */
static const char *write_tmp(const char *text) {
  char tmpl[] = "/tmp/mep-config-test-XXXXXX";
  int fd = mkstemp(tmpl);
  CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
  size_t len = strlen(text);
  CHECK(write(fd, text, len) == (ssize_t)len, "write %s", tmpl);
  close(fd);
  CHECK(n_tmp < sizeof tmp_files / sizeof tmp_files[0], "too many files");
  tmp_files[n_tmp] = strdup(tmpl);
  return tmp_files[n_tmp++];
}

static char *read_all(const char *path, long from) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long end = ftell(f);
  if (from > end) from = end;
  fseek(f, from, SEEK_SET);
  char *buf = calloc(1, (size_t)(end - from) + 1);
  size_t got = fread(buf, 1, (size_t)(end - from), f);
  buf[got] = '\0';
  fclose(f);
  return buf;
}

/* The log lines written since the last call. */
static long log_off;
static char *new_log(void) {
  char *s = read_all(log_path, log_off);
  CHECK(s, "cannot read the log file %s", log_path);
  log_off += (long)strlen(s);
  return s;
}

static int load(const char *path, mep_config_t **cfg) {
  *cfg = NULL;
  return mep_config_load(path, cfg);
}

/* Loads `text` expecting success; the warnings go to *log when non-NULL. */
static mep_config_t *load_ok(const char *text, const char **path,
                             char **log) {
  const char *p = write_tmp(text);
  free(new_log());
  mep_config_t *cfg;
  int rc = load(p, &cfg);
  CHECK(rc == 0 && cfg, "load of\n%s\nfailed with %d", text, rc);
  if (path) *path = p;
  char *l = new_log();
  if (log) *log = l; else free(l);
  return cfg;
}

/* Loads `text` expecting `code` and a message containing "<path>:<line>"
 * and `what`. */
static void load_fails(const char *text, int code, int line,
                       const char *what) {
  const char *p = write_tmp(text);
  mep_config_t *cfg;
  int rc = load(p, &cfg);
  CHECK(rc == code, "load of\n%s\nreturned %d, want %d", text, rc, code);
  CHECK(cfg == NULL, "a failed load left *out set");
  /* "file:line: what" for syntax, "(from file:line)" for values */
  char where[128], from[128];
  snprintf(where, sizeof where, "%s:%d: ", p, line);
  snprintf(from, sizeof from, "(from %s:%d)", p, line);
  CHECK(has(mep_last_error(), where) || has(mep_last_error(), from),
        "'%s' does not name %s:%d", mep_last_error(), p, line);
  CHECK_HAS(mep_last_error(), what);
}

/* A string of `n` random lines that change nothing: comments and blanks. */
static char *filler(int n) {
  static const char *const kinds[] = {"", "; a comment", "# another",
                                      "   ", "\t; indented comment"};
  char *s = calloc(1, (size_t)n * 32 + 1);
  for (int i = 0; i < n; i++) {
    strcat(s, kinds[rnd() % 5]);
    strcat(s, "\n");
  }
  return s;
}

/* --------------------------------------------------------------- cases */

static void test_defaults(void) {
  current = "defaults with no file";
  unsetenv("MEP_CONFIG");
  mep_config_t *cfg;
  CHECK(load(NULL, &cfg) == 0 && cfg, "load(NULL) without MEP_CONFIG");
  CHECK(mep_config_path(cfg) == NULL, "path of built-in defaults");
  CHECK(mep__config_section_count(cfg) == 0, "sections without a file");
  CHECK(mep_config_get(cfg, "core", "timeout_ms") == NULL,
        "get returns no default");
  CHECK_STR(mep__config_origin(cfg, "core", "timeout_ms"), "default");
  int64_t v = 0;
  CHECK(mep__config_int(cfg, "core", "timeout_ms", 1234, 1, 5000, &v) == 0 &&
            v == 1234, "int of an unset key gives the caller's default");
  CHECK(mep__config_known_int(cfg, "core", "timeout_ms", &v) == 0 &&
            v == 30000, "known_int gives the table's default, got %" PRId64,
        v);
  int idx = -1;
  CHECK(mep__config_choice(cfg, "core", "progress", &idx) == 0 && idx == 0,
        "progress defaults to adaptive (index 0), got %d", idx);
  mep_config_free(cfg);
  mep_config_free(NULL);

  /* Every documented default, as the brief's table gives them. */
  static const char *const want[][3] = {
      {"core", "transports", "nvlink,ibgda,verbs,tcp"},
      {"core", "timeout_ms", "30000"},
      {"core", "buffer_bytes", "16777216"},
      {"core", "chunk_bytes", "1048576"},
      {"core", "two_shot_bytes", "262144"},
      {"core", "log_ranks", "8"},
      {"core", "log_bytes", "32768"},
      {"core", "copy_thread", "auto"},
      {"core", "probe_ms", "1000"},
      {"core", "agreement", "on"},
      {"core", "progress", "adaptive"},
      {"core", "log_level", "warn"},
      {"core", "cuda_path", "auto"},
      {"core", "cuda_workspace_bytes", "134217728"},
      {"core", "device_transport", "auto"},
      {"CORE", "Timeout_MS", "30000"},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    CHECK_STR(mep_config_default(want[i][0], want[i][1]), want[i][2]);
  CHECK(mep__config_key_count() == 17, "table has %zu keys, want 17",
        mep__config_key_count());
  /* plugins declare their own keys: the core's table has none of them */
  CHECK(mep_config_default("tcp", "ifname") == NULL, "a plugin's key");
  CHECK(mep_config_default("peer 3", "transport") == NULL, "peer default");
  CHECK(mep__config_key_find("peer 3", "transport") != NULL, "peer key");
  CHECK(mep__config_key_find("host gpu-node-7", "transport") != NULL,
        "host key");
  CHECK(mep_config_default("core", "nope") == NULL, "unknown key default");
  CHECK(mep_config_default("nosuch", "x") == NULL, "unknown section");
  CHECK(mep_config_default(NULL, NULL) == NULL, "NULL default");
  /* Every table default passes its own check. */
  for (size_t i = 0; i < mep__config_key_count(); i++) {
    const mep__config_key_t *k = mep__config_key_at(i);
    CHECK(mep__config_check_value(k, k->section, k->def, "default") == 0,
          "default of %s.%s fails its own check", k->section, k->key);
  }
  CHECK(mep__config_key_at(mep__config_key_count()) == NULL, "past end");
}

static void test_mep_config_env(void) {
  current = "MEP_CONFIG picked up";
  char text[128];
  int t = (int)(rnd() % 100000) + 1;
  snprintf(text, sizeof text, "[core]\ntimeout_ms = %d\n", t);
  const char *p = write_tmp(text);
  setenv("MEP_CONFIG", p, 1);
  mep_config_t *cfg;
  CHECK(load(NULL, &cfg) == 0, "load via MEP_CONFIG");
  CHECK_STR(mep_config_path(cfg), p);
  char want[16];
  snprintf(want, sizeof want, "%d", t);
  CHECK_STR(mep_config_get(cfg, "core", "timeout_ms"), want);
  mep_config_free(cfg);

  current = "explicit path beats MEP_CONFIG";
  const char *q = write_tmp("[core]\ntimeout_ms = 7\n");
  CHECK(load(q, &cfg) == 0, "load explicit");
  CHECK_STR(mep_config_path(cfg), q);
  CHECK_STR(mep_config_get(cfg, "core", "timeout_ms"), "7");
  mep_config_free(cfg);

  current = "empty MEP_CONFIG means defaults";
  setenv("MEP_CONFIG", "", 1);
  CHECK(load(NULL, &cfg) == 0 && mep_config_path(cfg) == NULL, "empty");
  mep_config_free(cfg);
  unsetenv("MEP_CONFIG");
}

static void test_valid_file(void) {
  current = "a valid file";
  int t = (int)(rnd() % 2147483647) + 1;
  int rank = (int)(rnd() % 100000);
  char text[2048];
  snprintf(text, sizeof text,
           "\xEF\xBB\xBF; a comment with a BOM before it\r\n"
           "# another comment\n"
           "\n"
           "[core]\r\n"
           "transports = tcp , verbs\n"
           "   timeout_ms=%d   \n"
           "\tprogress = spin ; inline comment\n"
           "log_level : debug\n"
           "[ tcp ]   ; spaces inside the brackets\n"
           "ifname = lo\n"
           "port_range = 31000-31100\n"
           "[peer %d]\n"
           "transport = tcp\n"
           "[host gpu-node-7]\n"
           "transport = shm\n"
           "[myplugin]\n"
           "anything = goes here\n"
           "empty =\n",
           t, rank);
  const char *p;
  char *log;
  mep_config_t *cfg = load_ok(text, &p, &log);
  CHECK(log[0] == '\0', "a valid file logged: %s", log);
  free(log);
  char want[32], peer[32];
  snprintf(want, sizeof want, "%d", t);
  snprintf(peer, sizeof peer, "peer %d", rank);
  CHECK_STR(mep_config_get(cfg, "core", "timeout_ms"), want);
  CHECK_STR(mep_config_get(cfg, "core", "transports"), "tcp , verbs");
  CHECK_STR(mep_config_get(cfg, "core", "progress"), "spin");
  CHECK_STR(mep_config_get(cfg, "core", "log_level"), "debug");
  CHECK_STR(mep_config_get(cfg, "Core", "TIMEOUT_MS"), want);
  CHECK_STR(mep_config_get(cfg, "tcp", "ifname"), "lo");
  CHECK_STR(mep_config_get(cfg, "tcp", "port_range"), "31000-31100");
  CHECK_STR(mep_config_get(cfg, peer, "transport"), "tcp");
  CHECK_STR(mep_config_get(cfg, "host gpu-node-7", "transport"), "shm");
  CHECK_STR(mep_config_get(cfg, "myplugin", "anything"), "goes here");
  CHECK_STR(mep_config_get(cfg, "myplugin", "empty"), "");
  CHECK(mep_config_get(cfg, "tcp", "nodelay") == NULL, "unset key");
  CHECK(mep_config_get(cfg, "nosuch", "ifname") == NULL, "unset section");
  CHECK(mep_config_get(cfg, NULL, "x") == NULL, "NULL section");
  char origin[256];
  snprintf(origin, sizeof origin, "%s:6", p);
  CHECK_STR(mep__config_origin(cfg, "core", "timeout_ms"), origin);
  int64_t v;
  CHECK(mep__config_known_int(cfg, "core", "timeout_ms", &v) == 0 && v == t,
        "known_int read %" PRId64 ", want %d", v, t);
  int idx = -1;
  CHECK(mep__config_choice(cfg, "core", "progress", &idx) == 0 && idx == 1,
        "progress = spin is choice 1, got %d", idx);
  CHECK(mep__config_choice(cfg, "core", "log_level", &idx) == 0 && idx == 3,
        "log_level = debug is choice 3, got %d", idx);

  current = "section enumeration order and lines";
  static const char *const names[] = {"core", "tcp", NULL,
                                      "host gpu-node-7", "myplugin"};
  static const int lines[] = {4, 9, 12, 14, 16};
  CHECK(mep__config_section_count(cfg) == 5, "%zu sections, want 5",
        mep__config_section_count(cfg));
  for (size_t i = 0; i < 5; i++) {
    CHECK_STR(mep__config_section_name(cfg, i), names[i] ? names[i] : peer);
    CHECK(mep__config_section_line(cfg, i) == lines[i],
          "section %zu on line %d, want %d", i,
          mep__config_section_line(cfg, i), lines[i]);
  }
  CHECK(mep__config_section_name(cfg, 5) == NULL, "past the end");
  CHECK(mep__config_section_line(cfg, 5) == 0, "past the end");
  mep_config_free(cfg);

  current = "a byte-order mark before a header";
  cfg = load_ok("\xEF\xBB\xBF[tcp]\nifname = x\n", NULL, NULL);
  CHECK_STR(mep__config_section_name(cfg, 0), "tcp");
  CHECK_STR(mep_config_get(cfg, "tcp", "ifname"), "x");
  mep_config_free(cfg);

  current = "sections merge, peer numbers canonical, empty sections kept";
  cfg = load_ok("[peer 007]\n[tcp]\nifname = a\n[peer 7]\ntransport = tcp\n"
                "[TCP]\nnodelay = 0\n[Peer   12]\n",
                NULL, NULL);
  CHECK(mep__config_section_count(cfg) == 3, "%zu sections, want 3",
        mep__config_section_count(cfg));
  CHECK_STR(mep__config_section_name(cfg, 0), "peer 7");
  CHECK_STR(mep__config_section_name(cfg, 1), "tcp");
  CHECK_STR(mep__config_section_name(cfg, 2), "peer 12");
  CHECK(mep__config_section_line(cfg, 2) == 8, "peer 12 line");
  CHECK_STR(mep_config_get(cfg, "peer 7", "transport"), "tcp");
  CHECK_STR(mep_config_get(cfg, "tcp", "ifname"), "a");
  CHECK_STR(mep_config_get(cfg, "tcp", "nodelay"), "0");
  mep_config_free(cfg);

  current = "random keys in a third-party section";
  char big[16384] = "[third-party]\n";
  char keys[40][24], vals[40][24];
  int n = 1 + (int)(rnd() % 40);
  for (int i = 0; i < n; i++) {
    snprintf(keys[i], sizeof keys[i], "k%d_%u", i, (unsigned)(rnd() % 1000));
    snprintf(vals[i], sizeof vals[i], "v%" PRIu64, rnd());
    size_t at = strlen(big);
    snprintf(big + at, sizeof big - at, "%s = %s\n", keys[i], vals[i]);
  }
  cfg = load_ok(big, NULL, &log);
  CHECK(log[0] == '\0', "third-party keys logged: %s", log);
  free(log);
  for (int i = 0; i < n; i++)
    CHECK_STR(mep_config_get(cfg, "third-party", keys[i]), vals[i]);
  mep_config_free(cfg);
}

static void test_env_override(void) {
  current = "environment beats the file";
  const char *p;
  mep_config_t *cfg =
      load_ok("[core]\ntimeout_ms = 100\n[tcp]\nifname = eth0\n"
              "[peer 3]\ntransport = verbs\n[myplugin]\nkey-one = file\n",
              &p, NULL);
  int t = (int)(rnd() % 1000000) + 1;
  char tv[16];
  snprintf(tv, sizeof tv, "%d", t);
  setenv("MEP_CORE_TIMEOUT_MS", tv, 1);
  setenv("MEP_TCP_NODELAY", "0", 1);
  setenv("MEP_PEER_3_TRANSPORT", "tcp", 1);
  setenv("MEP_MYPLUGIN_KEY_ONE", "env", 1);
  CHECK_STR(mep_config_get(cfg, "core", "timeout_ms"), tv);
  CHECK_STR(mep_config_get(cfg, "tcp", "nodelay"), "0");
  CHECK_STR(mep_config_get(cfg, "tcp", "ifname"), "eth0");
  CHECK_STR(mep_config_get(cfg, "peer 3", "transport"), "tcp");
  CHECK_STR(mep_config_get(cfg, "myplugin", "key-one"), "env");
  CHECK_STR(mep__config_origin(cfg, "core", "timeout_ms"),
            "MEP_CORE_TIMEOUT_MS");
  int64_t v;
  CHECK(mep__config_int(cfg, "core", "timeout_ms", 5, 1, INT32_MAX, &v) ==
            0 && v == t, "int from env: %" PRId64, v);

  current = "get(NULL) reads the environment only";
  CHECK_STR(mep_config_get(NULL, "core", "timeout_ms"), tv);
  CHECK(mep_config_get(NULL, "tcp", "ifname") == NULL, "NULL cfg, file key");
  CHECK_STR(mep__config_origin(NULL, "tcp", "nodelay"), "MEP_TCP_NODELAY");
  CHECK_STR(mep__config_origin(NULL, "tcp", "ifname"), "default");

  current = "an empty variable counts as unset";
  setenv("MEP_CORE_TIMEOUT_MS", "", 1);
  CHECK_STR(mep_config_get(cfg, "core", "timeout_ms"), "100");
  unsetenv("MEP_CORE_TIMEOUT_MS");
  CHECK_STR(mep_config_get(cfg, "core", "timeout_ms"), "100");
  unsetenv("MEP_TCP_NODELAY");
  unsetenv("MEP_PEER_3_TRANSPORT");
  unsetenv("MEP_MYPLUGIN_KEY_ONE");
  CHECK_STR(mep_config_get(cfg, "peer 3", "transport"), "verbs");
  mep_config_free(cfg);

  current = "bad core values from the environment fail the load";
  setenv("MEP_CORE_PROGRESS", "fast", 1);
  CHECK(load(NULL, &cfg) == MEP_ERR_CONFIG, "bad progress in env");
  CHECK_HAS(mep_last_error(),
            "core.progress = 'fast' (from MEP_CORE_PROGRESS): not one of "
            "adaptive|spin|blocking");
  unsetenv("MEP_CORE_PROGRESS");
  setenv("MEP_CORE_TIMEOUT_MS", "0", 1);
  CHECK(load(NULL, &cfg) == MEP_ERR_CONFIG, "timeout 0 in env");
  CHECK_HAS(mep_last_error(), "core.timeout_ms = '0' (from "
                              "MEP_CORE_TIMEOUT_MS): not an integer in "
                              "[1, 2147483647]");
  unsetenv("MEP_CORE_TIMEOUT_MS");
  /* Plugin sections are the plugin's to check. */
  setenv("MEP_TCP_SOCKETS_PER_PEER", "999", 1);
  CHECK(load(NULL, &cfg) == 0, "plugin values are not checked at load");
  mep_config_free(cfg);
  unsetenv("MEP_TCP_SOCKETS_PER_PEER");
}

static void test_env_names(void) {
  current = "environment variable names";
  static const char *const cases[][3] = {
      {"core", "timeout_ms", "MEP_CORE_TIMEOUT_MS"},
      {"tcp", "ifname", "MEP_TCP_IFNAME"},
      {"tcp", "port_range", "MEP_TCP_PORT_RANGE"},
      {"peer 3", "transport", "MEP_PEER_3_TRANSPORT"},
      {"peer 12", "transport", "MEP_PEER_12_TRANSPORT"},
      {"host gpu-node-7", "transport", "MEP_HOST_GPU_NODE_7_TRANSPORT"},
      {"host a.b.example", "transport", "MEP_HOST_A_B_EXAMPLE_TRANSPORT"},
      {"My-Plugin", "some.key", "MEP_MY_PLUGIN_SOME_KEY"},
      {"x\xc3\xa9y", "k", "MEP_X__Y_K"},
      {"", "", "MEP__"},
  };
  char buf[128];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t n = mep__config_env_name(cases[i][0], cases[i][1], buf, sizeof buf);
    CHECK_STR(buf, cases[i][2]);
    CHECK(n == strlen(cases[i][2]), "length %zu for %s", n, cases[i][2]);
  }
  /* Truncation behaves like snprintf, for every buffer size. */
  const char *full = "MEP_HOST_GPU_NODE_7_TRANSPORT";
  for (size_t len = 0; len <= strlen(full) + 1; len++) {
    char small[64];
    memset(small, 'Z', sizeof small);
    size_t n = mep__config_env_name("host gpu-node-7", "transport", small,
                                    len);
    CHECK(n == strlen(full), "needed length with a %zu-byte buffer", len);
    if (len) {
      CHECK(strlen(small) == len - 1 && strncmp(small, full, len - 1) == 0,
            "truncated to %zu: '%s'", len, small);
    }
    CHECK(small[len] == 'Z', "wrote past a %zu-byte buffer", len);
  }
  CHECK(mep__config_env_name("core", "x", NULL, 0) == 10, "NULL buffer");
}

static void test_malformed(void) {
  current = "malformed lines";
  static const char *const bad[] = {
      "garbage without equals", "[core", "= value", "[core] junk",
      "[core ; comment]",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int pad = (int)(rnd() % 9);
    char *fill = filler(pad);
    char text[1024];
    snprintf(text, sizeof text, "[core]\n%s%s\ntimeout_ms = 5\n", fill,
             bad[i]);
    free(fill);
    load_fails(text, MEP_ERR_CONFIG, pad + 2,
               "malformed line (expected 'key = value' or '[section]')");
  }
  current = "the first error is the one reported";
  load_fails("[core]\nx\n[peer x]\n", MEP_ERR_CONFIG, 2, "malformed line");
  load_fails("[peer x]\nx\n", MEP_ERR_CONFIG, 1, "not a rank");

  current = "key outside a section";
  load_fails("; top\ntimeout_ms = 5\n[core]\n", MEP_ERR_CONFIG, 2,
             "'timeout_ms' is set outside any [section]");

  current = "empty section name";
  load_fails("[core]\n[ ]\n", MEP_ERR_CONFIG, 2, "empty section name");

  current = "a line longer than inih's buffer";
  char text[2048] = "[myplugin]\nshort = 1\nlong = ";
  for (int i = 0; i < 600; i++) strcat(text, "x");
  strcat(text, "\n");
  load_fails(text, MEP_ERR_CONFIG, 3, "characters long; the limit is");

  current = "a NUL byte";
  char nul[] = "[core]\ntimeout_ms = 5\x01\n";
  nul[sizeof nul - 3] = '\0';
  const char *p = write_tmp("");
  FILE *f = fopen(p, "w");
  CHECK(f && fwrite(nul, 1, sizeof nul - 1, f) == sizeof nul - 1, "write");
  fclose(f);
  mep_config_t *cfg;
  CHECK(load(p, &cfg) == MEP_ERR_CONFIG, "NUL byte accepted");
  CHECK_HAS(mep_last_error(), ":2: line contains a NUL byte");

  current = "bad values of core keys name file and line";
  load_fails("[core]\n\nprogress = fast\n", MEP_ERR_CONFIG, 3,
             "core.progress = 'fast' (from ");
  load_fails("[core]\ntimeout_ms = abc\n", MEP_ERR_CONFIG, 2,
             "not an integer in [1, 2147483647]");
  load_fails("[core]\ntransports = tcp,,verbs\n", MEP_ERR_CONFIG, 2,
             "not a comma list of transport names");
  load_fails("[core]\nlog_level = loud\n", MEP_ERR_CONFIG, 2,
             "not one of error|warn|info|debug|trace");
  load_fails("[peer 2]\ntransport = no/such\n", MEP_ERR_CONFIG, 2,
             "peer 2.transport = 'no/such'");
  load_fails("[host h]\ntransport =\n", MEP_ERR_CONFIG, 2,
             "not a transport name");
  cfg = load_ok("[core]\ntransports = ^ ibgda , nvlink\n", NULL, NULL);
  mep_config_free(cfg);
}

static void test_unknown_key(void) {
  current = "unknown key in a known section";
  int pad = (int)(rnd() % 7);
  char *fill = filler(pad);
  char text[1024];
  snprintf(text, sizeof text, "[core]\n%stimeout_msx = 5\nprogress = spin\n",
           fill);
  free(fill);
  const char *p;
  char *log;
  mep_config_t *cfg = load_ok(text, &p, &log);
  char want[256];
  snprintf(want, sizeof want, "%s:%d: unknown key 'timeout_msx' in [core]",
           p, pad + 2);
  CHECK_HAS(log, want);
  CHECK_HAS(log, "known keys: transports, timeout_ms, buffer_bytes");
  CHECK_HAS(log, "did you mean 'timeout_ms'?");
  CHECK_HAS(log, "warn");
  CHECK_STR(mep_config_get(cfg, "core", "progress"), "spin");
  free(log);
  mep_config_free(cfg);

  current = "a plugin's section is left to its declaration";
  cfg = load_ok("[tcp]\nifname = lo\nnot_a_key = 1\n", &p, &log);
  CHECK(log[0] == '\0', "a plugin section warned at load: %s", log);
  free(log);
  mep_config_free(cfg);

  current = "a near miss gets a suggestion";
  cfg = load_ok("[core]\ntimeout = 5\n[peer 1]\ntransprot = tcp\n", &p, &log);
  CHECK_HAS(log, "did you mean 'timeout_ms'?");
  snprintf(want, sizeof want, "%s:4: unknown key 'transprot' in [peer 1]", p);
  CHECK_HAS(log, want);
  CHECK_HAS(log, "(known keys: transport); did you mean 'transport'?");
  free(log);
  mep_config_free(cfg);

  current = "unknown sections are silent";
  cfg = load_ok("[peers]\nx = 1\n[hosts]\ny = 2\n[ucx]\nz = 3\n", NULL, &log);
  CHECK(log[0] == '\0', "unknown sections logged: %s", log);
  CHECK_STR(mep__config_section_name(cfg, 0), "peers");
  free(log);
  mep_config_free(cfg);
}

static void test_duplicate(void) {
  current = "duplicate key";
  int a = (int)(rnd() % 1000) + 1, b = a + 1 + (int)(rnd() % 1000);
  char text[256];
  snprintf(text, sizeof text,
           "[core]\ntimeout_ms = %d\nprogress = spin\n[tcp]\n[core]\n"
           "timeout_ms = %d\n", a, b);
  const char *p;
  char *log;
  mep_config_t *cfg = load_ok(text, &p, &log);
  char want[256];
  snprintf(want, sizeof want, "%d", b);
  CHECK_STR(mep_config_get(cfg, "core", "timeout_ms"), want);
  snprintf(want, sizeof want, "%s:6: [core] timeout_ms is set again; this "
           "value replaces the one on line 2", p);
  CHECK_HAS(log, want);
  snprintf(want, sizeof want, "%s:6", p);
  CHECK_STR(mep__config_origin(cfg, "core", "timeout_ms"), want);
  CHECK(mep__config_section_count(cfg) == 2, "repeated [core] counted once");
  CHECK(mep__config_section_line(cfg, 0) == 1, "first [core] header line");
  free(log);
  mep_config_free(cfg);
}

static void test_bad_sections(void) {
  current = "bad [peer X] and [host] sections";
  static const char *const bad_peer[] = {
      "[peer x]", "[peer -1]", "[peer]", "[peer 3x]", "[peer 1 2]",
      "[peer 99999999999]", "[PEER +4]", "[peer 2.0]",
  };
  for (size_t i = 0; i < sizeof bad_peer / sizeof bad_peer[0]; i++) {
    int pad = (int)(rnd() % 5);
    char *fill = filler(pad);
    char text[256];
    snprintf(text, sizeof text, "[core]\n%s%s\ntransport = tcp\n", fill,
             bad_peer[i]);
    free(fill);
    load_fails(text, MEP_ERR_CONFIG, pad + 2, "is not a rank");
  }
  load_fails("[host]\ntransport = tcp\n", MEP_ERR_CONFIG, 1,
             "needs a host name");
  load_fails("\n[host    ]\n", MEP_ERR_CONFIG, 2, "needs a host name");
}

static void test_missing_file(void) {
  current = "missing file";
  char path[64];
  snprintf(path, sizeof path, "/tmp/mep-config-none-%" PRIu64 ".ini", rnd());
  mep_config_t *cfg;
  CHECK(load(path, &cfg) == MEP_ERR_NOT_FOUND && !cfg, "missing file");
  CHECK_HAS(mep_last_error(), path);
  CHECK_HAS(mep_last_error(), strerror(ENOENT));
  CHECK(!strstr(mep_last_error(), "MEP_CONFIG"), "blames MEP_CONFIG");

  current = "missing file named by MEP_CONFIG";
  setenv("MEP_CONFIG", path, 1);
  CHECK(load(NULL, &cfg) == MEP_ERR_NOT_FOUND, "missing via MEP_CONFIG");
  CHECK_HAS(mep_last_error(), path);
  CHECK_HAS(mep_last_error(), "MEP_CONFIG");
  unsetenv("MEP_CONFIG");

  current = "a directory";
  CHECK(load("/tmp", &cfg) == MEP_ERR_SYSTEM, "directory");
  CHECK_HAS(mep_last_error(), "/tmp");
  CHECK_HAS(mep_last_error(), strerror(EISDIR));

  current = "an unreadable file";
  if (geteuid() != 0) { /* root reads anything */
    const char *p = write_tmp("[core]\n");
    chmod(p, 0);
    CHECK(load(p, &cfg) == MEP_ERR_SYSTEM, "unreadable");
    CHECK_HAS(mep_last_error(), strerror(EACCES));
  }
  CHECK(mep_config_load(NULL, NULL) == MEP_ERR_INVALID, "NULL out");
}

/* The reference: exact arithmetic in 128 bits. */
static int ref_int(int neg, uint64_t digits, int shift, int64_t min,
                   int64_t max, int64_t *out) {
  i128 v = (i128)digits << shift;
  if (neg) v = -v;
  if (v < (i128)INT64_MIN || v > (i128)INT64_MAX) return -1;
  if (v < min || v > max) return -1;
  *out = (int64_t)v;
  return 0;
}

static int int_of(const char *text, int64_t min, int64_t max, int64_t *v) {
  setenv("MEP_TEST_N", text, 1);
  return mep__config_int(NULL, "test", "n", -42, min, max, v);
}

static void test_int(void) {
  current = "mep__config_int fixed cases";
  static const struct {
    const char *text;
    int ok;
    int64_t want;
  } cases[] = {
      {"0", 1, 0},
      {"17", 1, 17},
      {"+17", 1, 17},
      {"-17", 1, -17},
      {" 5 ", 1, 5},
      {"1k", 1, 1024},
      {"1K", 1, 1024},
      {"3m", 1, 3 << 20},
      {"3M", 1, 3 << 20},
      {"2g", 1, INT64_C(2) << 30},
      {"2G", 1, INT64_C(2) << 30},
      {"-4K", 1, -4096},
      {"9223372036854775807", 1, INT64_MAX},
      {"-9223372036854775808", 1, INT64_MIN},
      {"9223372036854775808", 0, 0},
      {"-9223372036854775809", 0, 0},
      {"99999999999999999999999", 0, 0},
      {"8589934592G", 0, 0},
      {"8589934591G", 1, INT64_C(8589934591) << 30},
      {"abc", 0, 0},
      {"12x", 0, 0},
      {"12 K", 0, 0},
      {"1KB", 0, 0},
      {"1.5", 0, 0},
      {"0x10", 0, 0},
      {"-", 0, 0},
      {"K", 0, 0},
      {"--1", 0, 0},
      {"1T", 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t v = 7;
    int rc = int_of(cases[i].text, INT64_MIN, INT64_MAX, &v);
    if (cases[i].ok)
      CHECK(rc == 0 && v == cases[i].want, "'%s' gave rc %d value %" PRId64
            ", want %" PRId64, cases[i].text, rc, v, cases[i].want);
    else
      CHECK(rc == MEP_ERR_CONFIG && v == 7, "'%s' accepted (rc %d, %" PRId64
            ")", cases[i].text, rc, v);
  }

  current = "mep__config_int range and messages";
  int64_t v;
  CHECK(int_of("5", 1, 4, &v) == MEP_ERR_CONFIG, "above max");
  CHECK_STR(mep_last_error(), "test.n = '5' (from MEP_TEST_N): not an "
                              "integer in [1, 4]");
  CHECK(int_of("-1", 0, 10, &v) == MEP_ERR_CONFIG, "negative below min");
  CHECK(int_of("4", 1, 4, &v) == 0 && v == 4, "max itself");
  CHECK(int_of("1", 1, 4, &v) == 0 && v == 1, "min itself");
  setenv("MEP_CORE_TIMEOUT_MS", "abc", 1);
  CHECK(mep__config_int(NULL, "core", "timeout_ms", 1, 1, 2147483647, &v) ==
            MEP_ERR_CONFIG, "abc");
  CHECK_STR(mep_last_error(), "core.timeout_ms = 'abc' (from "
                              "MEP_CORE_TIMEOUT_MS): not an integer in "
                              "[1, 2147483647]");
  unsetenv("MEP_CORE_TIMEOUT_MS");
  const char *p;
  mep_config_t *cfg =
      load_ok("[mine]\n\n\ncount = 99\nflag = yes\n", &p, NULL);
  CHECK(mep__config_int(cfg, "mine", "count", 1, 1, 16, &v) ==
            MEP_ERR_CONFIG, "99 of at most 16");
  char want[256];
  snprintf(want, sizeof want, "mine.count = '99' (from %s:4): not an "
           "integer in [1, 16]", p);
  CHECK_STR(mep_last_error(), want);
  CHECK(mep__config_int(cfg, "mine", "flag", 1, 0, 1, &v) ==
            MEP_ERR_CONFIG, "flag = yes");
  snprintf(want, sizeof want, "(from %s:5)", p);
  CHECK_HAS(mep_last_error(), want);
  CHECK(mep__config_known_int(cfg, "core", "progress", &v) == MEP_ERR_INVALID,
        "known_int of a choice key");
  mep_config_free(cfg);

  current = "mep__config_int random values against 128-bit arithmetic";
  static const char sfx[] = {0, 'k', 'K', 'm', 'M', 'g', 'G'};
  static const int shifts[] = {0, 10, 10, 20, 20, 30, 30};
  for (int i = 0; i < 20000; i++) {
    int neg = (int)(rnd() % 2);
    int bits = (int)(rnd() % 64) + 1;
    uint64_t digits = bits == 64 ? rnd() : rnd() & ((UINT64_C(1) << bits) - 1);
    int s = (int)(rnd() % 7);
    int64_t min = (int64_t)rnd(), max = (int64_t)rnd();
    if (rnd() % 4 == 0) min = INT64_MIN;
    if (rnd() % 4 == 0) max = INT64_MAX;
    if (min > max) { int64_t t = min; min = max; max = t; }
    char text[40];
    snprintf(text, sizeof text, "%s%" PRIu64 "%.*s", neg ? "-" : "", digits,
             sfx[s] ? 1 : 0, &sfx[s]);
    int64_t want = 0, got = 12345;
    int ok = ref_int(neg, digits, shifts[s], min, max, &want) == 0;
    int rc = int_of(text, min, max, &got);
    CHECK(ok ? rc == 0 && got == want : rc == MEP_ERR_CONFIG,
          "'%s' in [%" PRId64 ", %" PRId64 "]: rc %d got %" PRId64
          ", reference says %s %" PRId64, text, min, max, rc, got,
          ok ? "ok" : "reject", want);
  }
  unsetenv("MEP_TEST_N");

  current = "port ranges";
  static const struct {
    const char *text;
    int ok;
  } ports[] = {{"0", 1},         {"1-1", 1},      {"31000-31100", 1},
               {" 1 - 65535 ", 1}, {"5", 0},      {"0-10", 0},
               {"10-5", 0},      {"1-65536", 0},  {"1k-2k", 0},
               {"-1", 0},        {"1-", 0},       {"a-b", 0},
               {"1-2-3", 0}};
  const mep__config_key_t range = {"fake", "port_range", "0", MEP__CFG_RANGE,
                                    1, 65535, NULL, "ports"};
  const mep__config_key_t *k = &range;
  for (size_t i = 0; i < sizeof ports / sizeof ports[0]; i++)
    CHECK((mep__config_check_value(k, "fake", ports[i].text, "test") == 0) ==
              ports[i].ok, "port_range '%s'", ports[i].text);
  int64_t lo = -1, hi = -1;
  CHECK(mep__config_value(k, "fake", " 17 - 4242 ", "t", &lo, &hi) == 0 &&
            lo == 17 && hi == 4242, "range 17-4242 read as %" PRId64 "-%"
        PRId64, lo, hi);
  CHECK(mep__config_value(k, "fake", "0", "t", &lo, &hi) == 0 && lo == 0 &&
            hi == 0, "range 0");
  for (int i = 0; i < 2000; i++) {
    int64_t a = (int64_t)(rnd() % 70000), b = (int64_t)(rnd() % 70000);
    char text[64];
    snprintf(text, sizeof text, "%" PRId64 "-%" PRId64, a, b);
    int ok = a >= 1 && a <= b && b <= 65535;
    int rc = mep__config_value(k, "fake", text, "t", &lo, &hi);
    CHECK(ok ? rc == 0 && lo == a && hi == b : rc == MEP_ERR_CONFIG,
          "range '%s': rc %d", text, rc);
  }

  current = "booleans and choices";
  const mep__config_key_t flag = {"fake", "nodelay", "1", MEP__CFG_BOOL, 0, 0,
                                   NULL, "nagle"};
  static const struct {
    const char *text;
    int value; /* -1: refused */
  } bools[] = {{"1", 1},     {"0", 0},    {"true", 1},  {"FALSE", 0},
               {"yes", 1},   {"No", 0},   {" on ", 1},  {"off", 0},
               {"2", -1},    {"maybe", -1}, {"", -1},   {"1x", -1},
               {"yess", -1}, {"o", -1}};
  for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
    int64_t b = -7;
    int rc = mep__config_value(&flag, "fake", bools[i].text, "t", &b, NULL);
    CHECK(bools[i].value < 0 ? rc == MEP_ERR_CONFIG
                             : rc == 0 && b == bools[i].value,
          "bool '%s': rc %d value %" PRId64, bools[i].text, rc, b);
  }
  const mep__config_key_t mode = {"fake", "mode", "fast", MEP__CFG_CHOICE, 0,
                                   0, "fast|safe|Slow", "mode"};
  int64_t ix = -1;
  CHECK(mep__config_value(&mode, "fake", "slow", "t", &ix, NULL) == 0 &&
            ix == 2, "choice 'slow' is index 2, got %" PRId64, ix);
  CHECK(mep__config_value(&mode, "fake", "slowly", "t", &ix, NULL) ==
            MEP_ERR_CONFIG, "choice 'slowly'");
  CHECK_HAS(mep_last_error(), "not one of fast|safe|Slow");
}

/* ------------------------------------------------- a plugin's declared keys */

static const mep_tp_cfg_key_t fake_keys[] = {
    {"ifname", MEP_TP_CFG_STRING, 0, 0, "", NULL, "interface"},
    {"port_range", MEP_TP_CFG_RANGE, 1, 65535, "0", NULL, "ports"},
    {"sockets_per_peer", MEP_TP_CFG_INT, 1, 16, "1", NULL, "sockets"},
    {"nodelay", MEP_TP_CFG_BOOL, 0, 0, "1", NULL, "nagle"},
    {"mode", MEP_TP_CFG_CHOICE, 0, 0, "fast", "fast|safe", "mode"},
};
#define FAKE_N (sizeof fake_keys / sizeof fake_keys[0])

static void test_plugin_keys(void) {
  current = "a plugin's bad value names key, value and line";
  const char *p;
  char *log;
  int pad = (int)(rnd() % 5);
  char *fill = filler(pad);
  char text[512];
  snprintf(text, sizeof text, "[fake]\n%ssockets_per_peer = 99\n", fill);
  free(fill);
  mep_config_t *cfg = load_ok(text, &p, NULL);
  CHECK(mep__config_check_plugin(cfg, "fake", fake_keys, FAKE_N) ==
            MEP_ERR_CONFIG, "99 sockets accepted");
  char want[512];
  snprintf(want, sizeof want, "fake.sockets_per_peer = '99' (from %s:%d): "
           "not an integer in [1, 16]", p, pad + 2);
  CHECK_STR(mep_last_error(), want);
  mep_config_free(cfg);

  current = "a plugin's unknown key is a warning naming file and line";
  pad = (int)(rnd() % 5);
  fill = filler(pad);
  snprintf(text, sizeof text, "[fake]\n%ssocket_per_peer = 2\nmode = safe\n",
           fill);
  free(fill);
  cfg = load_ok(text, &p, NULL);
  free(new_log());
  CHECK(mep__config_check_plugin(cfg, "fake", fake_keys, FAKE_N) == 0,
        "an unknown key failed the check");
  log = new_log();
  snprintf(want, sizeof want, "%s:%d: unknown key 'socket_per_peer' in "
           "[fake] is ignored (known keys: ifname, port_range, "
           "sockets_per_peer, nodelay, mode); did you mean "
           "'sockets_per_peer'?", p, pad + 2);
  CHECK_HAS(log, want);
  free(log);
  mep_config_free(cfg);

  current = "a plugin's keys from the environment";
  setenv("MEP_FAKE_NODELAY", "maybe", 1);
  CHECK(mep__config_check_plugin(NULL, "fake", fake_keys, FAKE_N) ==
            MEP_ERR_CONFIG, "nodelay = maybe accepted");
  CHECK_STR(mep_last_error(), "fake.nodelay = 'maybe' (from "
                              "MEP_FAKE_NODELAY): not one of 0, 1, false, "
                              "true, no, yes, off, on");
  setenv("MEP_FAKE_NODELAY", "off", 1);
  setenv("MEP_FAKE_SOCKETS", "2", 1);
  free(new_log());
  CHECK(mep__config_check_plugin(NULL, "fake", fake_keys, FAKE_N) == 0,
        "good values refused");
  log = new_log();
  CHECK_HAS(log, "MEP_FAKE_SOCKETS: unknown key 'sockets' in [fake]");
  CHECK_HAS(log, "did you mean 'sockets_per_peer'?");
  CHECK(!has(log, "NODELAY"), "a declared variable warned: %s", log);
  free(log);
  unsetenv("MEP_FAKE_NODELAY");
  unsetenv("MEP_FAKE_SOCKETS");

  current = "a plugin without a file section and nothing set";
  free(new_log());
  CHECK(mep__config_check_plugin(NULL, "fake", fake_keys, FAKE_N) == 0,
        "defaults refused");
  log = new_log();
  CHECK(log[0] == '\0', "defaults logged: %s", log);
  free(log);
}

/* ---------------------------------------------------- concurrent readers */

typedef struct {
  const mep_config_t *cfg;
  const char *path;
  int bad;
} reader_arg_t;

static void *reader(void *arg) {
  reader_arg_t *a = arg;
  char want[300];
  snprintf(want, sizeof want, "%s:3", a->path);
  for (int i = 0; i < 20000; i++) {
    const char *v = mep_config_get(a->cfg, "tcp", "ifname");
    const char *o = mep__config_origin(a->cfg, "tcp", "ifname");
    if (!v || strcmp(v, "lo") != 0 || strcmp(o, want) != 0) a->bad++;
  }
  return NULL;
}

static void test_threads(void) {
  current = "concurrent readers";
  const char *p;
  mep_config_t *cfg = load_ok("[tcp]\n\nifname = lo\n", &p, NULL);
  pthread_t t[4];
  reader_arg_t args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (reader_arg_t){cfg, p, 0};
    CHECK(pthread_create(&t[i], NULL, reader, &args[i]) == 0, "thread");
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    CHECK(args[i].bad == 0, "reader %d saw %d wrong values", i, args[i].bad);
  }
  mep_config_free(cfg);
}

/* ------------------------------------ conf/mep.ini and docs/config.md */

static char *read_source(const char *root, const char *rel) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  char *s = read_all(path, 0);
  CHECK(s, "cannot read %s", path);
  return s;
}

/* The text of `doc` from the line holding `start` to the next line that
 * begins with `next_prefix` (or the end). */
static char *part_of(const char *doc, const char *start,
                     const char *next_prefix) {
  const char *a = strstr(doc, start);
  if (!a) return NULL;
  const char *b = a + strlen(start);
  size_t plen = strlen(next_prefix);
  for (;;) {
    b = strchr(b, '\n');
    if (!b || strncmp(b + 1, next_prefix, plen) == 0) break;
    b++;
  }
  size_t n = b ? (size_t)(b - a) : strlen(a);
  return strndup(a, n);
}

static void test_example_ini(const char *root) {
  current = "conf/mep.ini documents every key and changes nothing";
  char path[4096];
  snprintf(path, sizeof path, "%s/conf/mep.ini", root);
  free(new_log());
  mep_config_t *cfg;
  CHECK(load(path, &cfg) == 0, "conf/mep.ini does not load");
  CHECK(mep__config_section_count(cfg) == 0,
        "conf/mep.ini sets section [%s]", mep__config_section_name(cfg, 0));
  char *log = new_log();
  CHECK(log[0] == '\0', "conf/mep.ini logged: %s", log);
  free(log);
  mep_config_free(cfg);

  char *ini = read_source(root, "conf/mep.ini");
  for (size_t i = 0; i < mep__config_key_count(); i++) {
    const mep__config_key_t *k = mep__config_key_at(i);
    char head[64], line[256];
    int route = !strcmp(k->section, "peer") || !strcmp(k->section, "host");
    snprintf(head, sizeof head, "#[%s%s", k->section, route ? " " : "]");
    char *part = part_of(ini, head, "#[");
    CHECK(part, "conf/mep.ini has no commented '%s' header", head);
    if (route)
      snprintf(line, sizeof line, "\n#%s = ", k->key);
    else if (*k->def)
      snprintf(line, sizeof line, "\n#%s = %s\n", k->key, k->def);
    else
      snprintf(line, sizeof line, "\n#%s =\n", k->key);
    CHECK(strstr(part, line), "conf/mep.ini section %s lacks '%s'", head,
          line + 1);
    free(part);
  }
  CHECK_HAS(ini, "\n#[peer 3]\n");
  CHECK_HAS(ini, "\n#[host gpu-node-7]\n");
  free(ini);

  current = "docs/config.md gives every key with its default";
  char *doc = read_source(root, "docs/config.md");
  for (size_t i = 0; i < mep__config_key_count(); i++) {
    const mep__config_key_t *k = mep__config_key_at(i);
    char head[64], row[256];
    int route = !strcmp(k->section, "peer") || !strcmp(k->section, "host");
    snprintf(head, sizeof head, "### `[%s%s", k->section,
             route ? " " : "]`");
    char *part = part_of(doc, head, "#");
    CHECK(part, "docs/config.md has no heading '%s'", head);
    const char *def = !k->def ? "(none)" : *k->def ? k->def : "(empty)";
    snprintf(row, sizeof row, "\n| `%s` | `%s` |", k->key, def);
    if (!k->def || !*k->def)
      snprintf(row, sizeof row, "\n| `%s` | %s |", k->key, def);
    CHECK(strstr(part, row), "docs/config.md under '%s' lacks the row '%s'",
          head, row + 1);
    free(part);
  }
  static const char *const terms[] = {
      "MEP_CONFIG", "MEP_TRANSPORTS", "MEP_HOST_ID", "MEP_PLUGIN_PATH",
      "MEP_LOG", "MEP_LOG_FILE", "MEP_PEER_12_TRANSPORT",
      "MEP_HOST_GPU_NODE_7_TRANSPORT", "[peer] rules beat [host] rules",
      "the first in the file wins"};
  for (size_t i = 0; i < sizeof terms / sizeof terms[0]; i++)
    CHECK_HAS(doc, terms[i]);
  free(doc);
}

/* The cases set the overrides they test; any MEP_* variable inherited
 * from the caller (the test runner sets MEP_TCP_IFNAME, for one) would
 * change what the files say. */
static void clear_mep_environment(void) {
  extern char **environ;
  for (int again = 1; again;) {
    again = 0;
    for (char **e = environ; *e; e++) {
      if (strncmp(*e, "MEP_", 4) != 0) continue;
      char name[256];
      snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
      unsetenv(name);
      again = 1;
      break;
    }
  }
}

int main(int argc, char **argv) {
  clear_mep_environment();
  /* The log module reads these once, at its first line. */
  snprintf(log_path, sizeof log_path, "/tmp/mep-config-log-XXXXXX");
  int fd = mkstemp(log_path);
  if (fd < 0) {
    perror("mkstemp");
    return 1;
  }
  close(fd);
  setenv("MEP_LOG_FILE", log_path, 1);
  setenv("MEP_LOG", "warn", 1);
  atexit(cleanup);
  if (argc < 2) {
    fprintf(stderr, "usage: %s SOURCE_ROOT\n", argv[0]);
    return 1;
  }
  const char *seed = getenv("MEP_TEST_SEED");
  rng_state = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) ^
                                                  ((uint64_t)getpid() << 20);
  if (!rng_state) rng_state = 1;
  printf("seed %" PRIu64 " (MEP_TEST_SEED replays it)\n", rng_state);
  fflush(stdout);
  unsetenv("MEP_CONFIG");

  test_defaults();
  test_mep_config_env();
  test_valid_file();
  test_env_override();
  test_env_names();
  test_malformed();
  test_unknown_key();
  test_duplicate();
  test_bad_sections();
  test_missing_file();
  test_int();
  test_plugin_keys();
  test_threads();
  test_example_ini(argv[1]);
  printf("config: %d checks passed\n", checks);
  return 0;
}
