/* Per-peer transport selection with two transports: tcp and the
 * out-of-tree shm example. Four ranks pretend to sit on two hosts
 * (MEP_HOST_ID): shm must carry same-host pairs and tcp the others, the
 * [peer]/[host] overrides must win, contradicting or impossible overrides
 * must fail creation with their error, and data must arrive intact over
 * the mixed routes. Needs MEP_TEST_SHM_PLUGIN (path of the built shm plugin). */
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "launch.h"

typedef struct scenario {
  const char *name;
  const char *config;      /* mep.ini text for every rank, or NULL */
  const char *config_rank1; /* rank 1's own text, when it differs */
  const char *routes[4];   /* per rank: route to ranks 0..3, space separated */
  int create_error;        /* expected MEP_ERR_* of creation, or 0 */
  const char *needle;      /* in the creation error */
  /* What rank 1, whose own routes are fine, gets instead: its peer gave
   * up creation, so connecting to it fails. */
  int rank1_error;
} scenario_t;

static char cfg_path[4][64];

static void before(int rank, void *arg) {
  const scenario_t *sc = arg;
  setenv("MEP_HOST_ID", rank < 2 ? "hostA" : "hostB", 1);
  setenv("MEP_TRANSPORTS", "shm,tcp", 1);
  const char *text = rank == 1 && sc->config_rank1 ? sc->config_rank1
                                                   : sc->config;
  if (!text) {
    unsetenv("MEP_CONFIG");
    return;
  }
  snprintf(cfg_path[rank], sizeof cfg_path[rank], "/tmp/mep-sel-%d-%d.ini",
           (int)getpid(), rank);
  FILE *f = fopen(cfg_path[rank], "w");
  CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "write config");
  setenv("MEP_CONFIG", cfg_path[rank], 1);
}

static int create_error(int rank, int rc, void *arg) {
  const scenario_t *sc = arg;
  if (cfg_path[rank][0]) unlink(cfg_path[rank]);
  if (rc == sc->create_error &&
      (!sc->needle || strstr(mep_last_error(), sc->needle)))
    return 0;
  if (rank == 1 && sc->rank1_error && rc == sc->rank1_error) return 0;
  fprintf(stderr, "rank %d: creation gave %s (%s), want %s with '%s'\n", rank,
          mep_strerror(rc), mep_last_error(), mep_strerror(sc->create_error),
          sc->needle ? sc->needle : "");
  return 1;
}

/* Checks the routes, then every rank puts a random block to every rank
 * and checks what it received. */
static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  const scenario_t *sc = arg;
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  if (cfg_path[me][0]) unlink(cfg_path[me]);
  CHECK(sc->create_error == 0, "rank %d: creation succeeded, want %s", me,
        mep_strerror(sc->create_error));
  char got[256] = "";
  for (int p = 0; p < n; p++) {
    strcat(got, p ? " " : "");
    strcat(got, mep_comm_route(comm, p));
  }
  CHECK(strcmp(got, sc->routes[me]) == 0, "%s: rank %d routes '%s', want "
        "'%s'", sc->name, me, got, sc->routes[me]);
  const size_t len = 300007;
  uint8_t *send = malloc(len), *recv = malloc(len * (size_t)n);
  uint64_t sig[4] = {0};
  mep_region_t *rs, *rr, *rg;
  CHECK_OK(mep_region_register(comm, send, len, MEP_MEM_HOST, &rs));
  CHECK_OK(mep_region_register(comm, recv, len * (size_t)n, MEP_MEM_HOST, &rr));
  CHECK_OK(mep_region_register(comm, sig, sizeof sig, MEP_MEM_HOST, &rg));
  fill_random(send, len, 1000 + (uint64_t)me);
  for (int p = 0; p < n; p++) {
    CHECK_OK(mep_put(comm, p, rs, 0, rr, len * (size_t)me, len));
    CHECK_OK(mep_signal(comm, p, rg, 8 * (size_t)me, 1, MEP_SIGNAL_ADD));
  }
  for (int p = 0; p < n; p++) {
    CHECK_OK(mep_wait(rg, 8 * (size_t)p, 1, 20000, NULL));
    long long bad = diff_random(recv + len * (size_t)p, len, 1000 + (uint64_t)p);
    CHECK(bad < 0, "%s: rank %d: byte %lld from rank %d (over %s) differs",
          sc->name, me, bad, p, mep_comm_route(comm, p));
  }
  CHECK_OK(mep_flush(comm, 20000));
  for (int p = 0; p < n; p++) /* leave together */
    CHECK_OK(mep_signal(comm, p, rg, 8 * (size_t)me, 1, MEP_SIGNAL_ADD));
  for (int p = 0; p < n; p++)
    CHECK_OK(mep_wait(rg, 8 * (size_t)p, 2, 20000, NULL));
  mep_region_deregister(rg);
  mep_region_deregister(rr);
  mep_region_deregister(rs);
  free(send);
  free(recv);
  return 0;
}

static const scenario_t scenarios[] = {
    {"by host", NULL, NULL,
     {"self shm tcp tcp", "shm self tcp tcp", "tcp tcp self shm",
      "tcp tcp shm self"}, 0, NULL, 0},
    {"peer override", "[peer 3]\ntransport = tcp\n", NULL,
     {"self shm tcp tcp", "shm self tcp tcp", "tcp tcp self tcp",
      "tcp tcp tcp self"}, 0, NULL, 0},
    {"host override", "[host hostA]\ntransport = tcp\n", NULL,
     {"self tcp tcp tcp", "tcp self tcp tcp", "tcp tcp self shm",
      "tcp tcp shm self"}, 0, NULL, 0},
    /* Were the host rule (first in the file) to win, 0-1 would be shm. */
    {"peer beats host", "[host hostA]\ntransport = shm\n[peer 0]\n"
                        "transport = tcp\n[peer 1]\ntransport = tcp\n", NULL,
     {"self tcp tcp tcp", "tcp self tcp tcp", "tcp tcp self shm",
      "tcp tcp shm self"}, 0, NULL, 0},
    {"contradicting overrides", "[peer 1]\ntransport = tcp\n",
     "[peer 1]\ntransport = shm\n", {0}, MEP_ERR_CONFIG, "says", 0},
    {"impossible override", "[peer 0]\ntransport = shm\n", NULL, {0},
     MEP_ERR_UNREACHABLE, "forces transport 'shm'", MEP_ERR_PEER_FAILED},
};

int main(void) {
  const char *shm = getenv("MEP_TEST_SHM_PLUGIN");
  if (!shm || access(shm, R_OK) != 0) {
    printf("SKIP: MEP_TEST_SHM_PLUGIN does not name the built shm example plugin "
           "(scripts/setup.sh builds it out of tree)\n");
    return 77;
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", shm);
  const char *tcp_dir = getenv("MEP_PLUGIN_PATH");
  char path[8192];
  snprintf(path, sizeof path, "%s:%s", dirname(dir), tcp_dir ? tcp_dir : "");
  setenv("MEP_PLUGIN_PATH", path, 1);
  int failed = 0, n = (int)(sizeof scenarios / sizeof *scenarios);
  for (int i = 0; i < n; i++) {
    memset(cfg_path, 0, sizeof cfg_path);
    mep_launch_opts_t o = {.size = 4, .timeout_ms = 60000, .name = "select",
                           .before_comm = before,
                           .on_create_error = create_error};
    int f = mep_launch(&o, body, (void *)&scenarios[i]);
    printf("%s %s\n", f ? "FAIL" : "PASS", scenarios[i].name);
    failed += f != 0;
  }
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed ? 1 : 0;
}
