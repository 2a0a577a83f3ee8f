/* check_config.c - config-keys (ABI 1.3): the plugin's table of
 * configuration keys. The loader refuses a malformed table; this checks
 * it again by transport.h's words (names, types, bounds, help), then with
 * no value given for any key reads each one back through the env's typed
 * reads, which must give its declared default (cfg_default.c parses it
 * independently); reads of undeclared keys, or of the wrong type, are
 * refused; and init succeeds with every key at its default. -v prints the
 * table. */
#include <ctype.h>
#include <inttypes.h>
#include <string.h>
#include <strings.h>

#include "cfg_default.h"
#include "checks.h"

static const char *type_name(mep_tp_cfg_type_t t) {
  switch (t) {
  case MEP_TP_CFG_STRING: return "string";
  case MEP_TP_CFG_INT: return "int";
  case MEP_TP_CFG_BOOL: return "bool";
  case MEP_TP_CFG_CHOICE: return "choice";
  case MEP_TP_CFG_RANGE: return "range";
  }
  return NULL;
}

static void print_table(const mep_tp_cfg_key_t *keys, size_t n) {
  pc_info("%zu configuration key%s", n, n == 1 ? "" : "s");
  for (size_t i = 0; i < n; i++) {
    const mep_tp_cfg_key_t *k = &keys[i];
    const char *t = type_name(k->type);
    pc_info("  %s: %s%s%s, default %s%s%s; %s", k->name, t ? t : "?",
            k->type == MEP_TP_CFG_CHOICE ? " " : "",
            k->type == MEP_TP_CFG_CHOICE && k->choices ? k->choices : "",
            k->def ? "\"" : "", k->def ? k->def : "none", k->def ? "\"" : "",
            k->help ? k->help : "");
    if (k->type == MEP_TP_CFG_INT || k->type == MEP_TP_CFG_RANGE)
      pc_info("    in [%" PRId64 ", %" PRId64 "]", k->min, k->max);
  }
}

static int is_name(const char *s) {
  if (!s || !*s) return 0;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_') return 0;
  return 1;
}

/* Key i as transport.h describes a key. */
static void check_shape(const mep_tp_cfg_key_t *keys, size_t i) {
  const mep_tp_cfg_key_t *k = &keys[i];
  if (!is_name(k->name))
    pc_fail("config key %zu is named \"%s\"; want letters, digits and '_'",
            i, k->name ? k->name : "(null)");
  for (size_t j = 0; j < i; j++)
    if (!strcasecmp(keys[j].name, k->name))
      pc_fail("config key \"%s\" is declared twice (keys %zu and %zu; names "
              "are case-insensitive)",
              k->name, j, i);
  if (!type_name(k->type))
    pc_fail("config key \"%s\" has type %d, not a mep_tp_cfg_type_t",
            k->name, (int)k->type);
  if (!k->help || !k->help[0])
    pc_fail("config key \"%s\" has no help: users read it (mep-info, "
            "conf/mep.ini)",
            k->name);
  if ((k->type == MEP_TP_CFG_INT || k->type == MEP_TP_CFG_RANGE) &&
      k->min > k->max)
    pc_fail("config key \"%s\": min %" PRId64 " > max %" PRId64, k->name,
            k->min, k->max);
  if (k->type == MEP_TP_CFG_CHOICE && (!k->choices || !k->choices[0]))
    pc_fail("config key \"%s\" is a choice without choices", k->name);
}

/* With no value given, what cfg_str says is the default's text. */
static void default_text(const mep_tp_env_t *env, const mep_tp_cfg_key_t *k) {
  const char *want = k->def ? k->def : "";
  const char *got = env->cfg_str(env, k->name);
  if (!got || strcmp(got, want))
    pc_fail("cfg_str(\"%s\") with no value given returned %s%s%s; the "
            "declared default is \"%s\"",
            k->name, got ? "\"" : "", got ? got : "NULL (an error)",
            got ? "\"" : "", want);
}

static void default_int(const mep_tp_env_t *env, const mep_tp_cfg_key_t *k) {
  int64_t want, got;
  char why[160];
  if (pc_cfg_default_int(k, &want, why, sizeof why))
    pc_fail("config key \"%s\" (%s): %s", k->name, type_name(k->type), why);
  if (k->type == MEP_TP_CFG_INT && (want < k->min || want > k->max))
    pc_fail("config key \"%s\": its default %" PRId64 " is outside [%" PRId64
            ", %" PRId64 "]",
            k->name, want, k->min, k->max);
  int rc = env->cfg_int(env, k->name, &got);
  if (rc != 0)
    pc_fail("cfg_int(\"%s\") with no value given failed: %s", k->name,
            pc_err(rc));
  if (got != want)
    pc_fail("cfg_int(\"%s\") with no value given is %" PRId64 "; the "
            "declared default \"%s\" is %" PRId64,
            k->name, got, k->def, want);
}

static void default_range(const mep_tp_env_t *env,
                          const mep_tp_cfg_key_t *k) {
  int64_t lo, hi, got_lo, got_hi;
  char why[160];
  if (pc_cfg_default_range(k, &lo, &hi, why, sizeof why))
    pc_fail("config key \"%s\" (range): %s", k->name, why);
  if ((lo || hi) && (lo < k->min || lo > hi || hi > k->max))
    pc_fail("config key \"%s\": its default %" PRId64 "-%" PRId64 " is not "
            "within [%" PRId64 ", %" PRId64 "]",
            k->name, lo, hi, k->min, k->max);
  int rc = env->cfg_range(env, k->name, &got_lo, &got_hi);
  if (rc != 0)
    pc_fail("cfg_range(\"%s\") with no value given failed: %s", k->name,
            pc_err(rc));
  if (got_lo != lo || got_hi != hi)
    pc_fail("cfg_range(\"%s\") with no value given is %" PRId64 "-%" PRId64
            "; the declared default is \"%s\"",
            k->name, got_lo, got_hi, k->def);
}

/* A typed read of another type than the key's is refused. */
static void wrong_type(const mep_tp_env_t *env, const mep_tp_cfg_key_t *k) {
  int64_t a, b;
  int ranged = k->type == MEP_TP_CFG_RANGE;
  int rc = ranged || k->type == MEP_TP_CFG_STRING
               ? env->cfg_int(env, k->name, &a)
               : env->cfg_range(env, k->name, &a, &b);
  if (rc != MEP_ERR_INVALID)
    pc_fail("%s(\"%s\") of a %s key returned %s; want MEP_ERR_INVALID",
            ranged || k->type == MEP_TP_CFG_STRING ? "cfg_int" : "cfg_range",
            k->name, type_name(k->type), rc ? pc_err(rc) : "0");
}

static void check_default(const mep_tp_env_t *env,
                          const mep_tp_cfg_key_t *k) {
  default_text(env, k);
  if (k->type == MEP_TP_CFG_RANGE)
    default_range(env, k);
  else if (k->type != MEP_TP_CFG_STRING)
    default_int(env, k);
  wrong_type(env, k);
}

static void check_undeclared(const mep_tp_env_t *env) {
  static const char key[] = "mep_plugin_check_undeclared";
  int64_t a, b;
  int rc = env->cfg_int(env, key, &a);
  if (rc != MEP_ERR_INVALID)
    pc_fail("cfg_int(\"%s\"), a key the table does not declare, returned "
            "%s; want MEP_ERR_INVALID",
            key, rc ? pc_err(rc) : "0");
  rc = env->cfg_range(env, key, &a, &b);
  if (rc != MEP_ERR_INVALID)
    pc_fail("cfg_range(\"%s\"), a key the table does not declare, returned "
            "%s; want MEP_ERR_INVALID",
            key, rc ? pc_err(rc) : "0");
  const char *s = env->cfg_str(env, key);
  if (s)
    pc_fail("cfg_str(\"%s\"), a key the table does not declare, returned "
            "\"%s\"; want NULL",
            key, s);
}

/* The host gives no value for any key, whatever $MEP_CONFIG and the
 * MEP_<NAME>_<KEY> variables say: every read falls to the default. */
static const char *no_value(const void *cfg, const char *key) {
  (void)cfg, (void)key;
  return NULL;
}

static void init_with_defaults(pc_worker_t *w, mep_tp_env_t *env) {
  mep_tp_ctx_t *ctx = NULL;
  pc_call_begin("init");
  int rc = w->tp->init(env, &ctx);
  pc_call_end();
  if (rc == MEP_ERR_UNAVAILABLE)
    pc_skip("the table and its defaults are sound, but init with every key "
            "at its default says the transport is unavailable here: %s",
            pc_err(rc));
  if (rc != 0)
    pc_fail("init with every key at its default failed: %s", pc_err(rc));
  pc_call_begin("fini");
  rc = w->tp->fini(ctx);
  pc_call_end();
  if (rc != 0) pc_fail("fini failed: %s", pc_err(rc));
}

void pc_check_config_keys(pc_worker_t *w) {
  size_t n = 0;
  const mep_tp_cfg_key_t *keys = mep_plugin_config_keys(w->plugin, &n);
  print_table(keys, n);
  for (size_t i = 0; i < n; i++) check_shape(keys, i);
  mep_tp_env_t env;
  int rc = mep_plugin_env_init(&env, NULL, w->tp->name);
  if (rc != 0) pc_fail("mep_plugin_env_init: %s", pc_err(rc));
  env.cfg_keys = keys;
  env.cfg_nkeys = n;
  env.cfg_get = no_value;
  env.rank = 0;
  env.size = 2;
  env.secret = w->secret;
  env.secret_len = w->secret_len;
  env.timeout_ms = w->opts->timeout_ms;
  for (size_t i = 0; i < n; i++) check_default(&env, &keys[i]);
  check_undeclared(&env);
  init_with_defaults(w, &env);
  mep_plugin_env_fini(&env);
}
