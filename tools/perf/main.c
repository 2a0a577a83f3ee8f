/* mep-perf - nccl-tests-style sweeps of mep's collectives and
 * point-to-point, over local forked ranks (-n) or one rank per process
 * across hosts (--store). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "perf.h"

static int rank_main(mep_comm_t *comm, mep_store_t *store, void *arg) {
  return perf_sweep(comm, store, arg);
}

/* An upper bound on a healthy sweep, for the launcher to kill ranks that
 * stopped making progress: every wait ending at its deadline, plus a
 * minute, plus generating and checking data at a pessimistic 16 MB/s per
 * local rank (they share the cores). */
static int run_deadline_ms(const perf_opts_t *o) {
  long long sizes = 1;
  double bytes = (double)o->min_bytes;
  for (size_t s = o->min_bytes; perf_next_size(o, &s);) {
    sizes++;
    bytes += (double)s;
  }
  long long waits = (long long)o->warmup + 2LL * o->iters + 8;
  double ms = (double)(sizes * waits + 8) * o->timeout_ms + 60000 +
              bytes * (o->warmup + o->iters + 1) * o->nlocal / 16e3;
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

static int run_local(const perf_opts_t *o) {
  /* The communicator's own deadline (connection, internal waits) follows
   * -t too, unless the environment sets it; the children inherit it. */
  char t[32];
  snprintf(t, sizeof t, "%d", o->timeout_ms);
  setenv("MEP_CORE_TIMEOUT_MS", t, 0);
  mep_launch_opts_t lo = {.size = o->nlocal,
                          .timeout_ms = run_deadline_ms(o),
                          .name = "mep-perf"};
  int failed = mep_launch(&lo, rank_main, (void *)o);
  return failed ? 1 : 0;
}

/* Rank 0 keeps serving the store until every rank said it is done with
 * it, so nobody loses the store mid-sweep. */
static void leave_store(mep_store_t *store, const perf_opts_t *o) {
  char key[64];
  if (o->rank != 0) {
    snprintf(key, sizeof key, "mep-perf.done/%d", o->rank);
    store->set(store->ctx, key, "1", 1);
    return;
  }
  for (int q = 1; q < o->size; q++) {
    void *v = NULL;
    size_t len;
    snprintf(key, sizeof key, "mep-perf.done/%d", q);
    if (store->get(store->ctx, key, &v, &len, o->timeout_ms))
      fprintf(stderr, "mep-perf: rank 0: rank %d did not finish in time: "
              "%s\n", q, mep_last_error());
    free(v);
  }
}

/* Rank 0 serves the store; port 0 picks a free one, which is printed for
 * the other ranks' --store. */
static int serve_store(const perf_opts_t *o, mep_store_server_t **srv,
                       int *port) {
  *port = o->store_port;
  if (o->rank != 0) return 0;
  if (mep_store_server_start(o->store_host, o->store_port, srv)) {
    fprintf(stderr, "mep-perf: rank 0: serving the store on %s:%d: %s\n",
            o->store_host, o->store_port, mep_last_error());
    return 1;
  }
  if (*port == 0) {
    *port = mep_store_server_port(*srv);
    int v6 = strchr(o->store_host, ':') != NULL;
    fprintf(stderr, "mep-perf: store at %s%s%s:%d\n", v6 ? "[" : "",
            o->store_host, v6 ? "]" : "", *port);
  }
  return 0;
}

static int run_distributed(const perf_opts_t *o) {
  mep_store_server_t *srv = NULL;
  mep_store_t *store = NULL;
  mep_comm_t *comm = NULL;
  int port;
  if (serve_store(o, &srv, &port)) return 1;
  int rc = mep_store_tcp_connect(o->store_host, port, o->timeout_ms, &store);
  if (rc) {
    fprintf(stderr, "mep-perf: rank %d: store at %s:%d: %s\n", o->rank,
            o->store_host, port, mep_last_error());
    mep_store_server_stop(srv);
    return 1;
  }
  /* As with -n: -t, unless the environment sets the core's timeout. */
  int comm_timeout = getenv("MEP_CORE_TIMEOUT_MS") ? 0 : o->timeout_ms;
  mep_comm_opts_t copts = {.struct_size = sizeof copts, .name = "mep-perf",
                           .timeout_ms = comm_timeout};
  rc = mep_comm_create(store, o->rank, o->size, &copts, &comm);
  if (rc) {
    fprintf(stderr, "mep-perf: rank %d: mep_comm_create: %s: %s\n", o->rank,
            mep_strerror(rc), mep_last_error());
  } else {
    rc = perf_sweep(comm, store, o);
    mep_comm_destroy(comm);
  }
  leave_store(store, o);
  mep_store_destroy(store);
  mep_store_server_stop(srv);
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  perf_opts_t o;
  int rc = perf_parse_args(argc, argv, &o);
  if (rc == 1) return 0; /* --help */
  if (rc) return 2;
  return o.store_host ? run_distributed(&o) : run_local(&o);
}
