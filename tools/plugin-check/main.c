/* main.c - mep-plugin-check: the conformance suite and micro-benchmark
 * for mep transport plugins. Options, loading the plugin, and the run. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checks.h"
#include "supervise.h"

#define PROG "mep-plugin-check"

#ifdef MEP_PC_HAVE_CUDA
#define PC_CUDA_BUILT 1
#else
#define PC_CUDA_BUILT 0
#endif

static void usage(FILE *f) {
  fprintf(f,
          "Usage: " PROG " [options] PLUGIN.so\n"
          "\n"
          "Runs the conformance suite of mep transport plugins on PLUGIN.so:\n"
          "two processes (ranks 0 and 1) drive the plugin through the ABI of\n"
          "<mep/transport.h> and check each result. One line per check\n"
          "(PASS name / FAIL name: why / SKIP name: why), then a summary.\n"
          "Exit status: 0 if nothing failed, 1 otherwise, 2 on bad usage.\n"
          "\n"
          "Options:\n"
          "  -h, --help          this text\n"
          "  -l, --list          list the checks and exit\n"
          "  -c, --check NAME    run only this check (repeatable)\n"
          "  -t, --timeout-ms N  deadline of every wait, and the plugin's\n"
          "                      env->timeout_ms (default 10000)\n"
          "  -q, --quick         cap transfer sizes at 4 MiB (slow machines)\n"
          "  -v, --verbose       details of each check, and the plugin's\n"
          "                      configuration keys\n"
          "  -m, --memory KIND   what the regions the suite registers are\n"
          "                      made of: host, cuda (on the current GPU), or\n"
          "                      auto (the default): host memory where the\n"
          "                      plugin carries it (props.mem_kinds), else\n"
          "                      CUDA memory. A check needing memory the\n"
          "                      plugin does not carry, or CUDA memory where\n"
          "                      this program was built without CUDA or no\n"
          "                      GPU is found, is skipped, saying so\n"
          "      --seed N        the random seed (default: new each run)\n"
          "  -b, --bench         run the micro-benchmark instead of the suite:\n"
          "                      8-byte ping-pong latency and 64 MiB write\n"
          "                      bandwidth one way and both ways at once\n"
          "                      (GB/s of both directions), as a table\n"
          "      --iters N       bench: latency round trips (default 10000)\n"
          "      --iters-bw N    bench: 64 MiB writes per bandwidth point\n"
          "                      (default 20); smaller sizes move as many\n"
          "                      bytes, in at most 20000 writes\n"
          "      --sweep         bench: bandwidth from 4 KiB to 64 MiB in\n"
          "                      powers of 4\n"
          "\n"
          "The plugin's config section comes from $MEP_CONFIG and\n"
          "MEP_<NAME>_<KEY> variables, as in any mep program. Both ranks use\n"
          "the current GPU (CUDA_VISIBLE_DEVICES picks it): two processes on\n"
          "one GPU, as CUDA IPC allows. This build %s CUDA.\n",
          PC_CUDA_BUILT ? "has" : "was made without");
}

static int parse_int(const char *opt, const char *s, long lo, long hi,
                     long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (errno || *end || end == s || v < lo || v > hi) {
    fprintf(stderr, PROG ": %s wants a number in [%ld, %ld], not \"%s\"\n",
            opt, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

typedef struct cli {
  pc_opts_t opts;
  int list, bench;
  int selected[64];
  int any_selected;
  const char *path;
} cli_t;

enum { OPT_SEED = 256, OPT_ITERS, OPT_ITERS_BW, OPT_SWEEP };

static int parse_memory(const char *s, pc_memory_opt_t *out) {
  static const struct {
    const char *name;
    pc_memory_opt_t opt;
  } kinds[] = {{"auto", PC_MEMORY_AUTO},
               {"host", PC_MEMORY_HOST},
               {"cuda", PC_MEMORY_CUDA}};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (strcmp(s, kinds[i].name) == 0) {
      *out = kinds[i].opt;
      return 0;
    }
  fprintf(stderr, PROG ": --memory wants host, cuda or auto, not \"%s\"\n",
          s);
  return -1;
}

/* Returns -1 on bad usage, 1 when done (help), 0 to go on. */
static int parse_args(int argc, char **argv, cli_t *c) {
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'},
      {"list", no_argument, NULL, 'l'},
      {"check", required_argument, NULL, 'c'},
      {"timeout-ms", required_argument, NULL, 't'},
      {"quick", no_argument, NULL, 'q'},
      {"verbose", no_argument, NULL, 'v'},
      {"memory", required_argument, NULL, 'm'},
      {"bench", no_argument, NULL, 'b'},
      {"seed", required_argument, NULL, OPT_SEED},
      {"iters", required_argument, NULL, OPT_ITERS},
      {"iters-bw", required_argument, NULL, OPT_ITERS_BW},
      {"sweep", no_argument, NULL, OPT_SWEEP},
      {NULL, 0, NULL, 0},
  };
  long v;
  int o;
  while ((o = getopt_long(argc, argv, "hlc:t:qvm:b", longopts, NULL)) != -1) {
    switch (o) {
    case 'h':
      usage(stdout);
      return 1;
    case 'l':
      c->list = 1;
      break;
    case 'c': {
      const pc_check_t *k = pc_check_find(optarg);
      if (!k) {
        fprintf(stderr, PROG ": no check named \"%s\" (see --list)\n",
                optarg);
        return -1;
      }
      c->selected[k - pc_checks] = 1;
      c->any_selected = 1;
      break;
    }
    case 't':
      if (parse_int("--timeout-ms", optarg, 100, 3600000, &v)) return -1;
      c->opts.timeout_ms = (int)v;
      break;
    case 'q':
      c->opts.quick = 1;
      break;
    case 'v':
      c->opts.verbose = 1;
      break;
    case 'm':
      if (parse_memory(optarg, &c->opts.memory)) return -1;
      break;
    case 'b':
      c->bench = 1;
      break;
    case OPT_SEED: {
      char *end;
      errno = 0;
      c->opts.seed = strtoull(optarg, &end, 0);
      if (errno || *end || end == optarg) {
        fprintf(stderr, PROG ": --seed wants a number, not \"%s\"\n",
                optarg);
        return -1;
      }
      break;
    }
    case OPT_ITERS:
      if (parse_int("--iters", optarg, 1, 100000000, &v)) return -1;
      c->opts.iters = (int)v;
      break;
    case OPT_ITERS_BW:
      if (parse_int("--iters-bw", optarg, 1, 1000000, &v)) return -1;
      c->opts.iters_bw = (int)v;
      break;
    case OPT_SWEEP:
      c->opts.sweep = 1;
      break;
    default:
      fprintf(stderr, "Try '" PROG " --help'.\n");
      return -1;
    }
  }
  if (c->list) return 0;
  if (optind != argc - 1) {
    fprintf(stderr, PROG ": %s\nTry '" PROG " --help'.\n",
            optind == argc ? "which plugin? Give the path of its .so file"
                           : "give exactly one plugin file");
    return -1;
  }
  c->path = argv[optind];
  /* dlopen() looks a bare file name up in the library path, not here. */
  if (!strchr(c->path, '/')) {
    static char local[PATH_MAX];
    snprintf(local, sizeof local, "./%s", c->path);
    c->path = local;
  }
  return 0;
}

static void list_checks(void) {
  for (int i = 0; i < pc_n_checks; i++)
    printf("%-13s %s\n", pc_checks[i].name, pc_checks[i].what);
}

static uint64_t random_seed(void) {
  uint64_t s = 0;
  if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
    s = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  return s;
}

/* Opens the plugin; on failure prints why and returns NULL. */
static mep_plugin_t *load(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, PROG ": cannot load %s: %s\n", path, strerror(errno));
    return NULL;
  }
  mep_plugin_t *p = NULL;
  int rc = mep_plugin_open(path, &p);
  if (rc != 0) {
    const char *why = mep_last_error();
    fprintf(stderr, PROG ": cannot load %s: %s%s%s\n", path,
            mep_strerror(rc), why[0] ? ": " : "", why);
    return NULL;
  }
  return p;
}

static int budget_ms(const pc_opts_t *o, int bench) {
  long b = 4L * o->timeout_ms + (bench ? 300000 : 30000);
  return b > INT_MAX / 2 ? INT_MAX / 2 : (int)b;
}

static int run_suite(const pc_suite_t *su, const cli_t *c) {
  int passed = 0, failed = 0, skipped = 0;
  char msg[2048];
  for (int i = 0; i < pc_n_checks; i++) {
    const pc_check_t *k = &pc_checks[i];
    if (c->any_selected && !c->selected[i]) continue;
    pc_job_t job = {k->name, k->nranks, k->kills_peer, k->registers, k->run,
                    budget_ms(&c->opts, 0),
                    c->opts.seed ^ ((uint64_t)(i + 1) << 56)};
    int64_t t0 = pc_now_ms();
    pc_status_t st = pc_supervise(su, &job, msg, sizeof msg);
    if (st == PC_PASS) {
      printf("PASS %s\n", k->name);
      passed++;
    } else if (st == PC_SKIP) {
      printf("SKIP %s: %s\n", k->name, msg);
      skipped++;
    } else {
      printf("FAIL %s: %s\n", k->name, msg);
      failed++;
    }
    if (c->opts.verbose)
      printf("  info: %s took %lld ms\n", k->name,
             (long long)(pc_now_ms() - t0));
    fflush(stdout);
  }
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}

static int run_bench(const pc_suite_t *su, const cli_t *c) {
  pc_job_t job = {"bench", 2, 0, 1, pc_bench, budget_ms(&c->opts, 1),
                  c->opts.seed};
  char msg[2048];
  pc_status_t st = pc_supervise(su, &job, msg, sizeof msg);
  fflush(stdout);
  if (st == PC_PASS) return 0;
  fprintf(stderr, PROG ": bench %s: %s\n",
          st == PC_SKIP ? "skipped" : "failed", msg);
  return st == PC_SKIP ? 0 : 1;
}

int main(int argc, char **argv) {
  cli_t c;
  memset(&c, 0, sizeof c);
  c.opts.timeout_ms = 10000;
  c.opts.iters = 10000;
  c.opts.iters_bw = 20;
  c.opts.seed = random_seed();
  int r = parse_args(argc, argv, &c);
  if (r < 0) return 2;
  if (r > 0) return 0;
  if (c.list) {
    list_checks();
    return 0;
  }
  mep_plugin_t *plugin = load(c.path);
  if (!plugin) return 1;
  mep_config_t *cfg = NULL;
  int rc = mep_config_load(NULL, &cfg);
  if (rc != 0) {
    fprintf(stderr, PROG ": configuration: %s\n", pc_err(rc));
    mep_plugin_close(plugin);
    return 1;
  }
  pc_suite_t su;
  memset(&su, 0, sizeof su);
  su.opts = &c.opts;
  su.tp = mep_plugin_vtable(plugin);
  su.plugin = plugin;
  su.plugin_path = c.path;
  su.cfg = cfg;
  if (getrandom(su.secret, sizeof su.secret, 0) != (ssize_t)sizeof su.secret)
    for (size_t i = 0; i < sizeof su.secret; i++)
      su.secret[i] = (uint8_t)(random_seed() >> 8);
  /* A dead peer's socket must not kill a rank process. */
  signal(SIGPIPE, SIG_IGN);

  const mep_transport_t *tp = su.tp;
  printf("# " PROG ": %s %s (ABI %u.%u) from %s; seed 0x%llx; timeout %d "
         "ms%s%s\n",
         tp->name ? tp->name : "(no name)",
         tp->version ? tp->version : "(no version)", tp->abi_major,
         tp->abi_minor, c.path, (unsigned long long)c.opts.seed,
         c.opts.timeout_ms, c.opts.quick ? "; quick" : "",
         c.opts.memory == PC_MEMORY_HOST   ? "; host memory"
         : c.opts.memory == PC_MEMORY_CUDA ? "; CUDA memory"
                                           : "");
  fflush(stdout);
  r = c.bench ? run_bench(&su, &c) : run_suite(&su, &c);
  mep_config_free(cfg);
  mep_plugin_close(plugin);
  return r;
}
