/* plugin.c - finding, opening and checking transport plugins, and the env
 * a plugin host hands to them. */
#include "plugin.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config.h"
#include "error.h"
#include "log.h"

#ifndef MEP_BUILD_PLUGIN_DIRS
#define MEP_BUILD_PLUGIN_DIRS ""
#endif
#ifndef MEP_BUILD_LIB_DIR
#define MEP_BUILD_LIB_DIR ""
#endif

/* ------------------------------------------------------------- opening */

static int is_key_name(const char *s) {
  if (!s || !*s) return 0;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_') return 0;
  return 1;
}

/* A declared key table is well formed: names, types, and each default
 * passes its own declaration, so a plugin author learns of a mistake when
 * the plugin is loaded, not when a user sets the key. */
static int check_keys(const char *path, const mep_transport_t *vt) {
  size_t n = 0;
  const mep_tp_cfg_key_t *keys = mep__plugin_keys(vt, &n);
  for (size_t i = 0; i < n; i++) {
    const mep_tp_cfg_key_t *k = &keys[i];
    if (!is_key_name(k->name))
      return mep__err(MEP_ERR_ABI, "plugin %s (%s): config key %zu has the "
                      "name '%s' (letters, digits and '_')", path, vt->name,
                      i, k->name ? k->name : "(null)");
    for (size_t j = 0; j < i; j++)
      if (!strcasecmp(keys[j].name, k->name))
        return mep__err(MEP_ERR_ABI, "plugin %s (%s): config key '%s' is "
                        "declared twice", path, vt->name, k->name);
    int bad_type = k->type < MEP_TP_CFG_STRING || k->type > MEP_TP_CFG_RANGE;
    if (bad_type || (k->type == MEP_TP_CFG_CHOICE && !k->choices) ||
        ((k->type == MEP_TP_CFG_INT || k->type == MEP_TP_CFG_RANGE) &&
         k->min > k->max) || !k->help)
      return mep__err(MEP_ERR_ABI, "plugin %s (%s): config key '%s': %s",
                      path, vt->name, k->name,
                      bad_type ? "unknown type"
                      : !k->help ? "no help text"
                      : k->type == MEP_TP_CFG_CHOICE ? "no choices"
                                                     : "min > max");
    mep__config_key_t ck = mep__config_key_of(vt->name, k);
    if (k->def && mep__config_check_value(&ck, vt->name, k->def, "its "
                                          "declared default"))
      return mep__err_wrap(MEP_ERR_ABI, "plugin %s", path);
  }
  return MEP_OK;
}

static int check_vtable(const char *path, const mep_transport_t *vt) {
  if (vt->abi_major != MEP_TRANSPORT_ABI_MAJOR)
    return mep__err(MEP_ERR_ABI,
                    "plugin %s: built for transport ABI %u.%u, this libmep "
                    "speaks %d.%d; rebuild the plugin against this mep",
                    path, vt->abi_major, vt->abi_minor,
                    MEP_TRANSPORT_ABI_MAJOR, MEP_TRANSPORT_ABI_MINOR);
  if (!MEP_TP_HAS(vt, mep_transport_t, fini))
    return mep__err(MEP_ERR_ABI,
                    "plugin %s: struct_size %u is smaller than ABI %d's "
                    "%zu bytes", path, vt->struct_size,
                    MEP_TRANSPORT_ABI_MAJOR,
                    offsetof(mep_transport_t, fini) + sizeof(vt->fini));
  if (!vt->name || !*vt->name)
    return mep__err(MEP_ERR_ABI, "plugin %s: has no name", path);
  const char *missing =
      !vt->init ? "init" : !vt->props ? "props" : !vt->address ? "address"
      : !vt->reachable ? "reachable" : !vt->connect ? "connect"
      : !vt->reg ? "reg" : !vt->dereg ? "dereg" : !vt->import ? "import"
      : !vt->unimport ? "unimport" : !vt->write ? "write"
      : !vt->signal ? "signal" : !vt->poll ? "poll" : !vt->close ? "close"
      : !vt->fini ? "fini" : NULL;
  if (missing)
    return mep__err(MEP_ERR_ABI, "plugin %s (%s): function '%s' is NULL",
                    path, vt->name, missing);
  return check_keys(path, vt);
}

int mep_plugin_open(const char *path, mep_plugin_t **out) {
  if (!path || !out) return mep__err(MEP_ERR_INVALID, "plugin: NULL path");
  if (access(path, F_OK) != 0)
    return mep__err_errno(MEP_ERR_NOT_FOUND, errno, "plugin %s", path);
  dlerror();
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    return mep__err(MEP_ERR_SYSTEM, "plugin %s: dlopen failed: %s", path,
                    dlerror());
  const mep_transport_t *vt = dlsym(handle, MEP_TRANSPORT_SYMBOL);
  if (!vt) {
    mep__err(MEP_ERR_ABI,
             "plugin %s: no symbol %s; it is not a mep transport plugin "
             "(or was built for another ABI)", path, MEP_TRANSPORT_SYMBOL);
    dlclose(handle);
    return MEP_ERR_ABI;
  }
  int rc = check_vtable(path, vt);
  mep_plugin_t *p = rc ? NULL : calloc(1, sizeof *p);
  char *copy = p ? strdup(path) : NULL;
  if (rc || !copy) {
    free(p);
    dlclose(handle);
    return rc ? rc : mep__err(MEP_ERR_NOMEM, "plugin %s: out of memory", path);
  }
  p->handle = handle;
  p->vt = vt;
  p->path = copy;
  *out = p;
  return MEP_OK;
}

void mep_plugin_close(mep_plugin_t *p) {
  if (!p) return;
  if (p->handle) dlclose(p->handle);
  free(p->path);
  free(p);
}

const mep_transport_t *mep_plugin_vtable(const mep_plugin_t *p) {
  return p ? p->vt : NULL;
}

const char *mep_plugin_path(const mep_plugin_t *p) {
  return p ? p->path : NULL;
}

/* ------------------------------------------------------------- finding */

static char lib_dir[PATH_MAX];
static char install_dir[PATH_MAX + 16];
static const char anchor; /* any object of libmep, for dladdr */
static pthread_once_t dir_once = PTHREAD_ONCE_INIT;

/* Plugins are installed in <libdir>/mep/plugins and libmep in <libdir>, so
 * the directory is found from libmep's own location and a relocated
 * install keeps working. */
static void find_dirs(void) {
  Dl_info info;
  if (!dladdr(&anchor, &info) || !info.dli_fname) return;
  char buf[PATH_MAX];
  if (!realpath(info.dli_fname, buf))
    snprintf(buf, sizeof buf, "%s", info.dli_fname);
  snprintf(lib_dir, sizeof lib_dir, "%s", dirname(buf));
  snprintf(install_dir, sizeof install_dir, "%s/mep/plugins", lib_dir);
}

const char *mep_plugin_dir(void) {
  pthread_once(&dir_once, find_dirs);
  return install_dir;
}

static int running_uninstalled(void) {
  mep_plugin_dir();
  return lib_dir[0] && strcmp(lib_dir, MEP_BUILD_LIB_DIR) == 0;
}

char *mep_plugin_search_path(void) {
  const char *env = getenv("MEP_PLUGIN_PATH");
  const char *dir = mep_plugin_dir();
  const char *build = running_uninstalled() ? MEP_BUILD_PLUGIN_DIRS : "";
  size_t len = (env ? strlen(env) : 0) + strlen(dir) + strlen(build) + 3;
  char *s = malloc(len);
  if (!s) return NULL;
  snprintf(s, len, "%s%s%s%s%s", env && *env ? env : "", env && *env ? ":" : "",
           dir, *build ? ":" : "", build);
  return s;
}

/* Appends "dir/libmep-transport-<name>.so" to the list of tried paths and
 * returns 1 if the file exists. */
static int try_dir(const char *dir, size_t dir_len, const char *name,
                   char *path, size_t path_len, char *tried,
                   size_t tried_len) {
  if (dir_len == 0) return 0;
  snprintf(path, path_len, "%.*s/libmep-transport-%s.so", (int)dir_len, dir,
           name);
  size_t plen = strlen(path);
  for (const char *t = tried; *t;) { /* a directory listed twice */
    size_t n = strcspn(t, ",");
    if (n == plen && memcmp(t, path, n) == 0) return 0;
    t += n + (t[n] ? 2 : 0);
  }
  size_t used = strlen(tried);
  if (used + plen + 3 < tried_len) {
    memcpy(tried + used, used ? ", " : "", used ? 2 : 0);
    memcpy(tried + used + (used ? 2 : 0), path, plen + 1);
  }
  return access(path, F_OK) == 0;
}

/* Tries each entry of a colon-separated list. */
static int try_list(const char *list, const char *name, char *path,
                    size_t path_len, char *tried, size_t tried_len) {
  for (const char *s = list; s && *s;) {
    size_t n = strcspn(s, ":");
    if (try_dir(s, n, name, path, path_len, tried, tried_len)) return 1;
    s += n + (s[n] == ':');
  }
  return 0;
}

static int valid_name(const char *name) {
  if (!name || !*name || strlen(name) > 64) return 0;
  for (const char *c = name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
          *c == '_' || *c == '-'))
      return 0;
  return 1;
}

int mep_plugin_find(const char *name, mep_plugin_t **out) {
  if (!valid_name(name))
    return mep__err(MEP_ERR_INVALID,
                    "plugin: '%s' is not a transport name (lower-case "
                    "letters, digits, '_' and '-')", name ? name : "(null)");
  char path[PATH_MAX], tried[4096] = "";
  const char *dir = mep_plugin_dir();
  int found =
      try_list(getenv("MEP_PLUGIN_PATH"), name, path, sizeof path, tried,
               sizeof tried) ||
      try_dir(dir, strlen(dir), name, path, sizeof path, tried,
              sizeof tried) ||
      /* Uninstalled: libmep still sits in its build directory. */
      (running_uninstalled() &&
       try_list(MEP_BUILD_PLUGIN_DIRS, name, path, sizeof path, tried,
                sizeof tried));
  if (!found)
    return mep__err(MEP_ERR_NOT_FOUND,
                    "transport '%s' not found; tried %s (set "
                    "MEP_PLUGIN_PATH to the directory holding "
                    "libmep-transport-%s.so)", name, tried, name);
  int rc = mep_plugin_open(path, out);
  if (rc == MEP_OK && strcmp((*out)->vt->name, name) != 0) {
    rc = mep__err(MEP_ERR_ABI, "plugin %s calls itself '%s', not '%s'", path,
                  (*out)->vt->name, name);
    mep_plugin_close(*out);
    *out = NULL;
  }
  return rc;
}

/* ------------------------------------------------------------- the env */

typedef struct cfg_section {
  const mep_config_t *cfg;
  char *name;
} cfg_section_t;

static const char *section_get(const void *cfg, const char *key) {
  const cfg_section_t *s = cfg;
  return mep_config_get(s->cfg, s->name, key);
}

static void plugin_log(mep_log_level_t level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mep__vlog(level, fmt, ap);
  va_end(ap);
}

static void plugin_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mep__verr(MEP_ERR_SYSTEM, fmt, ap);
  va_end(ap);
}

/* The declared key `key` of one of the types in `types` (a bit per
 * mep_tp_cfg_type_t), and its value and origin as the env gives them. */
static int lookup(const mep_tp_env_t *env, const char *key, unsigned types,
                  mep__config_key_t *k, const char **value,
                  const char **origin) {
  const mep_tp_cfg_key_t *d = NULL;
  for (size_t i = 0; key && i < env->cfg_nkeys && !d; i++)
    if (!strcasecmp(env->cfg_keys[i].name, key)) d = &env->cfg_keys[i];
  const cfg_section_t *s = env->cfg_get == section_get ? env->cfg : NULL;
  const char *section = s ? s->name : "plugin";
  if (!d || !(types & (1u << d->type)))
    return mep__err(MEP_ERR_INVALID, "%s: config key '%s' is not declared "
                    "%s", section, key ? key : "(null)",
                    d ? "with the type this read needs" : "by the plugin");
  *k = mep__config_key_of(section, d);
  const char *v = env->cfg_get ? env->cfg_get(env->cfg, key) : NULL;
  *origin = s ? mep__config_origin(s->cfg, s->name, key)
              : v ? "the plugin host" : "default";
  *value = v ? v : d->def;
  return MEP_OK;
}

static int env_cfg_int(const mep_tp_env_t *env, const char *key,
                       int64_t *out) {
  mep__config_key_t k;
  const char *v, *origin;
  unsigned types = 1u << MEP_TP_CFG_INT | 1u << MEP_TP_CFG_BOOL |
                   1u << MEP_TP_CFG_CHOICE;
  int rc = out ? lookup(env, key, types, &k, &v, &origin)
               : mep__err(MEP_ERR_INVALID, "cfg_int: NULL out");
  if (rc == MEP_OK && !v)
    rc = mep__err(MEP_ERR_CONFIG, "%s.%s is not set and has no default",
                  k.section, k.key);
  return rc ? rc : mep__config_value(&k, k.section, v, origin, out, NULL);
}

static int env_cfg_range(const mep_tp_env_t *env, const char *key,
                         int64_t *lo, int64_t *hi) {
  mep__config_key_t k;
  const char *v, *origin;
  int rc = lo && hi ? lookup(env, key, 1u << MEP_TP_CFG_RANGE, &k, &v, &origin)
                    : mep__err(MEP_ERR_INVALID, "cfg_range: NULL out");
  if (rc == MEP_OK && !v)
    rc = mep__err(MEP_ERR_CONFIG, "%s.%s is not set and has no default",
                  k.section, k.key);
  return rc ? rc : mep__config_value(&k, k.section, v, origin, lo, hi);
}

static const char *env_cfg_str(const mep_tp_env_t *env, const char *key) {
  mep__config_key_t k;
  const char *v, *origin;
  if (lookup(env, key, ~0u, &k, &v, &origin)) return NULL;
  return v ? v : "";
}

int mep_plugin_env_init(mep_tp_env_t *env, const mep_config_t *cfg,
                        const char *section) {
  if (!env || !section)
    return mep__err(MEP_ERR_INVALID, "plugin env: NULL argument");
  cfg_section_t *s = calloc(1, sizeof *s);
  char *name = s ? strdup(section) : NULL;
  if (!name) {
    free(s);
    return mep__err(MEP_ERR_NOMEM, "plugin env: out of memory");
  }
  s->cfg = cfg;
  s->name = name;
  memset(env, 0, sizeof *env);
  env->struct_size = sizeof *env;
  env->rank = 0;
  env->size = 1;
  env->host_id = mep_host_id();
  env->timeout_ms = 30000;
  env->cfg = s;
  env->cfg_get = section_get;
  env->log = plugin_log;
  env->set_error = plugin_set_error;
  env->cfg_int = env_cfg_int;
  env->cfg_range = env_cfg_range;
  env->cfg_str = env_cfg_str;
  return MEP_OK;
}

int mep_plugin_config_check(const mep_plugin_t *p, const mep_config_t *cfg) {
  if (!p) return mep__err(MEP_ERR_INVALID, "plugin config check: NULL");
  size_t n = 0;
  const mep_tp_cfg_key_t *keys = mep__plugin_keys(p->vt, &n);
  return keys ? mep__config_check_plugin(cfg, p->vt->name, keys, n) : MEP_OK;
}

int mep_plugin_env_open(mep_tp_env_t *env, const mep_config_t *cfg,
                        const mep_plugin_t *p) {
  if (!env || !p) return mep__err(MEP_ERR_INVALID, "plugin env: NULL");
  memset(env, 0, sizeof *env); /* a failed open needs no fini */
  int rc = mep_plugin_config_check(p, cfg);
  if (rc == MEP_OK) rc = mep_plugin_env_init(env, cfg, p->vt->name);
  if (rc == MEP_OK) env->cfg_keys = mep__plugin_keys(p->vt, &env->cfg_nkeys);
  return rc;
}

const mep_tp_cfg_key_t *mep_plugin_config_keys(const mep_plugin_t *p,
                                               size_t *n) {
  size_t k = 0;
  const mep_tp_cfg_key_t *keys = p ? mep__plugin_keys(p->vt, &k) : NULL;
  if (n) *n = k;
  return keys;
}

void mep_plugin_env_fini(mep_tp_env_t *env) {
  if (!env || !env->cfg) return;
  cfg_section_t *s = (cfg_section_t *)env->cfg;
  free(s->name);
  free(s);
  env->cfg = NULL;
}
