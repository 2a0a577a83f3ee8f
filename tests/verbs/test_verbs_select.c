/*
 * test_verbs_select - per-peer selection with MEP_TRANSPORTS=verbs,tcp:
 * verbs carries a pair only when both ranks are on one fabric (here, one
 * RDMA device; [verbs] fabric splits them), tcp the others; then data
 * crosses the mixed routes intact: a random block from every rank to
 * every rank by put + signal, and an all-reduce of int64 compared with a
 * sum computed here. Three ranks, forked around a built-in store.
 * Needs an RDMA device (Soft-RoCE in the VM of tests/verbs/run-vm.sh):
 * without one it skips (77).
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "launch.h"

typedef struct scenario {
  const char *name;
  const char *fabric[3]; /* [verbs] fabric of each rank, NULL: unset */
  const char *routes[3]; /* per rank: the route to ranks 0..2 */
} scenario_t;

static const scenario_t scenarios[] = {
    {"one fabric", {NULL, NULL, NULL},
     {"self verbs verbs", "verbs self verbs", "verbs verbs self"}},
    {"two fabrics", {"east", "east", "west"},
     {"self verbs tcp", "verbs self tcp", "tcp tcp self"}},
    {"a name on one side", {NULL, NULL, "west"},
     {"self verbs tcp", "verbs self tcp", "tcp tcp self"}},
};

static void before(int rank, void *arg) {
  const scenario_t *sc = arg;
  setenv("MEP_TRANSPORTS", "verbs,tcp", 1);
  if (sc->fabric[rank])
    setenv("MEP_VERBS_FABRIC", sc->fabric[rank], 1);
  else
    unsetenv("MEP_VERBS_FABRIC");
}

static void check_routes(mep_comm_t *comm, const scenario_t *sc) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  char got[128] = "";
  for (int p = 0; p < n; p++) {
    strcat(got, p ? " " : "");
    strcat(got, mep_comm_route(comm, p));
  }
  CHECK(strcmp(got, sc->routes[me]) == 0, "%s: rank %d routes '%s', want "
        "'%s'", sc->name, me, got, sc->routes[me]);
}

static void blocks(mep_comm_t *comm, const scenario_t *sc) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  const size_t len = 1000003; /* odd, and over the default stripe size */
  uint8_t *send = malloc(len), *recv = malloc(len * (size_t)n);
  uint64_t sig[3] = {0};
  CHECK(send && recv, "out of memory");
  mep_region_t *rs, *rr, *rg;
  CHECK_OK(mep_region_register(comm, send, len, MEP_MEM_HOST, &rs));
  CHECK_OK(mep_region_register(comm, recv, len * (size_t)n, MEP_MEM_HOST,
                               &rr));
  CHECK_OK(mep_region_register(comm, sig, sizeof sig, MEP_MEM_HOST, &rg));
  fill_random(send, len, 7000 + (uint64_t)me);
  for (int p = 0; p < n; p++) {
    CHECK_OK(mep_put(comm, p, rs, 0, rr, len * (size_t)me, len));
    CHECK_OK(mep_signal(comm, p, rg, 8 * (size_t)me, 1, MEP_SIGNAL_ADD));
  }
  for (int p = 0; p < n; p++) {
    CHECK_OK(mep_wait(rg, 8 * (size_t)p, 1, 60000, NULL));
    long long bad = diff_random(recv + len * (size_t)p, len,
                                7000 + (uint64_t)p);
    CHECK(bad < 0, "%s: rank %d: byte %lld from rank %d (over %s) differs",
          sc->name, me, bad, p, mep_comm_route(comm, p));
  }
  CHECK_OK(mep_flush(comm, 60000));
  for (int p = 0; p < n; p++) /* nobody leaves before all have checked */
    CHECK_OK(mep_signal(comm, p, rg, 8 * (size_t)me, 1, MEP_SIGNAL_ADD));
  for (int p = 0; p < n; p++)
    CHECK_OK(mep_wait(rg, 8 * (size_t)p, 2, 60000, NULL));
  CHECK_OK(mep_region_deregister(rg));
  CHECK_OK(mep_region_deregister(rr));
  CHECK_OK(mep_region_deregister(rs));
  free(send);
  free(recv);
}

/* Rank r's element i is (r + 1) * (i * 2654435761 mod 2^20); the sum
 * over ranks is computed here, not by mep. */
static void allreduce(mep_comm_t *comm, const scenario_t *sc) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  const size_t count = 70001;
  int64_t *in = malloc(count * sizeof *in), *out = malloc(count * sizeof *out);
  CHECK(in && out, "out of memory");
  for (size_t i = 0; i < count; i++)
    in[i] = (int64_t)(me + 1) * (int64_t)((i * 2654435761u) % (1u << 20));
  mep_req_t *req = NULL;
  CHECK_OK(mep_allreduce(comm, in, out, count, MEP_INT64, MEP_SUM, &req));
  CHECK_OK(mep_req_wait(req, 60000));
  mep_req_free(req);
  int64_t ranks = (int64_t)n * (n + 1) / 2;
  for (size_t i = 0; i < count; i++)
    CHECK(out[i] == ranks * (int64_t)((i * 2654435761u) % (1u << 20)),
          "%s: rank %d: element %zu is %lld", sc->name, me, i,
          (long long)out[i]);
  free(in);
  free(out);
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  const scenario_t *sc = arg;
  check_routes(comm, sc);
  blocks(comm, sc);
  allreduce(comm, sc);
  return 0;
}

static int have_rdma_device(void) {
  DIR *d = opendir("/sys/class/infiniband");
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n > 0;
}

int main(void) {
  if (!have_rdma_device()) {
    printf("SKIP: no RDMA device here (tests/verbs/run-vm.sh runs this in a "
           "VM with Soft-RoCE)\n");
    return 77;
  }
  int failed = 0, n = (int)(sizeof scenarios / sizeof *scenarios);
  for (int i = 0; i < n; i++) {
    mep_launch_opts_t o = {.size = 3, .timeout_ms = 240000,
                           .name = scenarios[i].name, .before_comm = before};
    int bad = mep_launch(&o, body, (void *)&scenarios[i]);
    printf("%s %s\n", bad ? "FAIL" : "PASS", scenarios[i].name);
    failed += bad != 0;
  }
  return failed ? 1 : 0;
}
