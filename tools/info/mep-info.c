/* mep-info - which transport plugins are found, what they can do, whether
 * they run here; with --size N, the route a local group picks per peer. */
#include <ctype.h>
#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mep/mep.h>
#include <mep/transport.h>

#include "launch.h"

static void usage(FILE *out) {
  fprintf(out,
"usage: mep-info [--size N] [--config FILE] [--transports LIST] [--timeout-ms MS]\n"
"       mep-info --ini\n"
"\n"
"Lists the transport plugins mep finds (path, ABI, capabilities, the keys of\n"
"their configuration section, and whether each can run on this machine or\n"
"why not). With --size N it also starts a local group of N ranks (forked,\n"
"with a built-in store) and prints the transport each rank picked for every\n"
"peer. With --ini it prints only each plugin's section as conf/mep.ini\n"
"documents it: every key commented out at its default, with its help.\n"
"\n"
"  -n, --size N          start N local ranks and print their routes\n"
"  -i, --ini             print the plugins' sections of mep.ini\n"
"  -c, --config FILE     use this mep.ini (default: $MEP_CONFIG)\n"
"  -t, --transports LIST set MEP_TRANSPORTS (e.g. shm,tcp or ^nvlink)\n"
"      --timeout-ms MS   deadline for the local group (default 60000)\n"
"  -V, --version         print the library version\n"
"  -h, --help            this text\n"
"\n"
"Plugins are searched in MEP_PLUGIN_PATH, then next to libmep.\n");
}

static const char *dev_kind(mep_dev_kind_t k) {
  switch (k) {
  case MEP_DEV_NONE: return "none (GPU kernels use the proxy)";
  case MEP_DEV_PTR: return "ptr";
  case MEP_DEV_MLX5: return "mlx5";
  case MEP_DEV_PROXY: return "proxy";
  }
  return "?";
}

static const char *type_name(const mep_tp_cfg_key_t *k, char *buf,
                             size_t len) {
  switch (k->type) {
  case MEP_TP_CFG_STRING: return "text";
  case MEP_TP_CFG_BOOL: return "0 or 1";
  case MEP_TP_CFG_CHOICE: return k->choices;
  case MEP_TP_CFG_INT:
    snprintf(buf, len, "integer %lld to %lld", (long long)k->min,
             (long long)k->max);
    return buf;
  case MEP_TP_CFG_RANGE:
    snprintf(buf, len, "0 or LO-HI within %lld-%lld", (long long)k->min,
             (long long)k->max);
    return buf;
  }
  return "?";
}

/* Prints `text` as lines of at most 76 columns, each led by `lead`. */
static void wrap(const char *lead, const char *text) {
  const int width = 76 - (int)strlen(lead);
  while (*text) {
    int n = (int)strlen(text);
    if (n > width) {
      n = width;
      while (n > 0 && text[n] != ' ') n--;
      if (n == 0) n = (int)strcspn(text, " ");
    }
    printf("%s%.*s\n", lead, n, text);
    text += n;
    while (*text == ' ') text++;
  }
}

/* The section as conf/mep.ini documents it: the help above each key, the
 * key commented out at its default. */
static void print_ini(const mep_plugin_t *p) {
  size_t n = 0;
  const mep_tp_cfg_key_t *keys = mep_plugin_config_keys(p, &n);
  if (!n) return;
  printf("#[%s]\n", mep_plugin_vtable(p)->name);
  for (size_t i = 0; i < n; i++) {
    wrap("# ", keys[i].help);
    printf("#%s =%s%s\n", keys[i].name, keys[i].def && *keys[i].def ? " " : "",
           keys[i].def ? keys[i].def : "");
  }
  printf("\n");
}

static void print_keys(const mep_plugin_t *p) {
  size_t n = 0;
  const mep_tp_cfg_key_t *keys = mep_plugin_config_keys(p, &n);
  const char *name = mep_plugin_vtable(p)->name;
  if (!n) {
    printf("  keys:    none declared\n");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    char buf[96];
    printf("  key:     [%s] %s = %s (%s; MEP_", name, keys[i].name,
           keys[i].def ? (*keys[i].def ? keys[i].def : "(empty)") : "(unset)",
           type_name(&keys[i], buf, sizeof buf));
    for (const char *c = name; *c; c++)
      putchar(isalnum((unsigned char)*c) ? toupper((unsigned char)*c) : '_');
    putchar('_');
    for (const char *c = keys[i].name; *c; c++)
      putchar(isalnum((unsigned char)*c) ? toupper((unsigned char)*c) : '_');
    printf(")\n");
    wrap("           ", keys[i].help);
  }
}

/* Initialises the plugin as a one-rank group to learn if it runs here. */
static void describe(const char *path, const mep_config_t *cfg, int ini) {
  mep_plugin_t *p = NULL;
  if (mep_plugin_open(path, &p)) {
    printf("%s\n  error: %s\n", path, mep_last_error());
    return;
  }
  if (ini) {
    print_ini(p);
    mep_plugin_close(p);
    return;
  }
  const mep_transport_t *vt = mep_plugin_vtable(p);
  printf("%s\n  path:    %s\n  ABI:     %u.%u (libmep speaks %d.%d)\n"
         "  version: %s\n", vt->name, path, vt->abi_major, vt->abi_minor,
         MEP_TRANSPORT_ABI_MAJOR, MEP_TRANSPORT_ABI_MINOR,
         vt->version ? vt->version : "?");
  mep_tp_env_t env;
  mep_tp_ctx_t *ctx = NULL;
  int rc = mep_plugin_env_open(&env, cfg, p);
  if (rc == MEP_OK) rc = vt->init(&env, &ctx);
  mep_tp_props_t props = {.struct_size = sizeof props, .event_fd = -1};
  if (rc == MEP_OK) rc = vt->props(ctx, &props);
  if (rc) {
    printf("  status:  unavailable: %s\n", mep_last_error());
  } else {
    printf("  status:  available\n  memory:  %s%s\n  device:  %s\n"
           "  atomics: %s\n  expected latency %.1f us, bandwidth %.1f GB/s\n",
           props.mem_kinds & MEP_TP_MEM_HOST ? "host " : "",
           props.mem_kinds & MEP_TP_MEM_CUDA ? "cuda" : "",
           dev_kind(props.dev_kind), props.atomics ? "yes" : "no",
           props.latency_us, props.bandwidth_gbps);
  }
  print_keys(p);
  if (ctx) vt->fini(ctx);
  mep_plugin_env_fini(&env);
  mep_plugin_close(p);
}

static int is_plugin_file(const char *name) {
  size_t n = strlen(name);
  return strncmp(name, "libmep-transport-", 17) == 0 && n > 20 &&
         strcmp(name + n - 3, ".so") == 0;
}

/* Lists each plugin once: the first directory that has it wins, as in
 * mep_plugin_find. */
static int list_plugins(const mep_config_t *cfg, int ini) {
  char *search = mep_plugin_search_path();
  if (!search) return 1;
  if (!ini) printf("search path: %s\n\n", search);
  char seen[4096] = ":";
  int found = 0;
  for (char *dir = strtok(search, ":"); dir; dir = strtok(NULL, ":")) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (!is_plugin_file(e->d_name)) continue;
      char tag[300];
      snprintf(tag, sizeof tag, ":%s:", e->d_name);
      if (strstr(seen, tag)) continue;
      strncat(seen, tag + 1, sizeof seen - strlen(seen) - 1);
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      describe(path, cfg, ini);
      found++;
    }
    if (d) closedir(d);
  }
  if (!found && !ini) printf("no plugins found\n");
  /* The transports mep tries by default, when their plugin is absent. */
  char *defaults = strdup(mep_config_default("core", "transports"));
  for (char *t = defaults && !ini ? strtok(defaults, ",") : NULL; t;
       t = strtok(NULL, ",")) {
    char tag[128];
    snprintf(tag, sizeof tag, ":libmep-transport-%s.so:", t);
    if (!strstr(seen, tag))
      printf("%s\n  status:  not installed (no libmep-transport-%s.so in "
             "the search path)\n", t, t);
  }
  free(defaults);
  free(search);
  return found ? 0 : 1;
}

/* Each rank prints its line; ranks print in order through the store,
 * then meet, so that no rank leaves (and is dropped from the group, which
 * empties its routes) before the last one printed. */
static int print_routes(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)arg;
  int rank = mep_comm_rank(comm), size = mep_comm_size(comm);
  char key[64];
  if (rank > 0) {
    void *v;
    size_t l;
    snprintf(key, sizeof key, "mep-info/turn/%d", rank);
    if (store->get(store->ctx, key, &v, &l, 30000)) return 1;
    free(v);
  }
  printf("rank %d:", rank);
  for (int p = 0; p < size; p++) printf(" %d=%s", p, mep_comm_route(comm, p));
  printf("\n");
  fflush(stdout);
  snprintf(key, sizeof key, "mep-info/turn/%d", rank + 1);
  if (store->set(store->ctx, key, "1", 1)) return 1;
  mep_req_t *req = NULL;
  int rc = mep_barrier(comm, &req);
  if (rc == MEP_OK && req) rc = mep_req_wait(req, mep_comm_timeout_ms(comm));
  mep_req_free(req);
  return rc < 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"size", required_argument, 0, 'n'},
      {"ini", no_argument, 0, 'i'},
      {"config", required_argument, 0, 'c'},
      {"transports", required_argument, 0, 't'},
      {"timeout-ms", required_argument, 0, 'T'},
      {"version", no_argument, 0, 'V'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  int size = 0, timeout_ms = 60000, ini = 0, c;
  while ((c = getopt_long(argc, argv, "n:ic:t:Vh", opts, NULL)) != -1) {
    switch (c) {
    case 'n': size = atoi(optarg); break;
    case 'i': ini = 1; break;
    case 'c': setenv("MEP_CONFIG", optarg, 1); break;
    case 't': setenv("MEP_TRANSPORTS", optarg, 1); break;
    case 'T': timeout_ms = atoi(optarg); break;
    case 'V': printf("mep %s\n", mep_version()); return 0;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc || size < 0 || (size == 0 && argc > 1 &&
                                    strcmp(argv[1], "--size") == 0)) {
    fprintf(stderr, "mep-info: unexpected argument '%s'\n",
            optind < argc ? argv[optind] : "--size");
    usage(stderr);
    return 2;
  }
  mep_config_t *cfg = NULL;
  if (mep_config_load(NULL, &cfg)) {
    fprintf(stderr, "mep-info: %s\n", mep_last_error());
    return 1;
  }
  if (ini) {
    int rc = list_plugins(cfg, 1);
    mep_config_free(cfg);
    return rc;
  }
  printf("mep %s, host id %s\n", mep_version(), mep_host_id());
  int rc = list_plugins(cfg, 0);
  mep_config_free(cfg);
  if (size > 0) {
    printf("\nroutes of a local group of %d ranks:\n", size);
    fflush(stdout);
    mep_launch_opts_t lo = {.size = size, .timeout_ms = timeout_ms,
                            .name = "mep-info"};
    int failed = mep_launch(&lo, print_routes, NULL);
    if (failed) {
      fprintf(stderr, "mep-info: %d of %d ranks failed\n", failed, size);
      rc = 1;
    }
  }
  return rc;
}
