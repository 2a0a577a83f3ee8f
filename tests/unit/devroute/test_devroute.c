/* test_devroute.c - how the core picks the transport that serves GPU
 * kernels for each peer (devroute.c) and shares an allocation through it
 * (devshare.c), on a CPU: forked ranks over tcp, with the fake device
 * transports of devfake.c.
 *
 *   test_devroute NRANKS SCENARIO
 *
 * SCENARIO:
 *   first   transports devfake,devfake2,tcp: every peer's device route is
 *           devfake (the first that declares a kind), the descriptor's
 *           peer part names the peer, and an allocation shared through it
 *           arrives as the peer's own address and length
 *   order   devfake2,devfake,tcp: devfake2 (names do not matter, order does)
 *   forced  devfake,devfake2,tcp and [core] device_transport = devfake2
 *   nodesc  ranks 0 and 1 say their pair is unreachable from kernels: that
 *           pair has no device route (the reason names both transports),
 *           every other pair has one
 *   none    both fakes declare no device kind: no route, and why
 *   notdev  [core] device_transport = tcp, which declares no device kind
 *   kinds   devfake,devfake2,tcp with devfake declaring MEP_DEV_MLX5: the
 *           mapped kind wins (devfake2) though listed second, the MLX5
 *           route is devfake's and asking for it leaves the PTR route as
 *           it was; host memory shared through the MLX5 routes arrives
 *           with the peer's key, and the local part names this rank's */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "devroute.h"
#include "devshare.h"
#include "launch.h"

typedef struct scen {
  const char *name;
  const char *transports;
  const char *device_transport; /* NULL: auto */
  const char *kind;             /* DEVFAKE_KIND */
  const char *want;             /* expected route for reachable pairs */
  int nodesc01;                 /* ranks 0 and 1 refuse their pair */
  const char *why;              /* for pairs without a route: in the reason */
  const char *mlx5;             /* DEVFAKE_MLX5 */
} scen_t;

static const scen_t scens[] = {
    {"first", "devfake,devfake2,tcp", NULL, NULL, "devfake", 0, NULL, NULL},
    {"order", "devfake2,devfake,tcp", NULL, NULL, "devfake2", 0, NULL, NULL},
    {"forced", "devfake,devfake2,tcp", "devfake2", NULL, "devfake2", 0, NULL,
     NULL},
    {"nodesc", "devfake,devfake2,tcp", NULL, NULL, "devfake", 1,
     "devfake: devfake: rank", NULL},
    {"none", "devfake,devfake2,tcp", NULL, "none", NULL, 0,
     "no transport of this communicator declares a device kind", NULL},
    {"notdev", "devfake,devfake2,tcp", "tcp", NULL, NULL, 0,
     "devfake: not [core] device_transport (tcp)", NULL},
    {"kinds", "devfake,devfake2,tcp", NULL, NULL, "devfake2", 0, NULL,
     "devfake"},
};

static const scen_t *scen;

static void before_comm(int rank, void *arg) {
  (void)arg;
  /* each side of the pair (0, 1) names the other */
  if (scen->nodesc01 && rank <= 1) setenv("DEVFAKE_NODESC", rank ? "0" : "1",
                                          1);
}

static int routed(int rank, int peer) {
  if (!scen->want) return 0;
  return !(scen->nodesc01 && ((rank == 0 && peer == 1) ||
                              (rank == 1 && peer == 0)));
}

/* A fake "device" address per rank, as its devfake registers it. */
static void *fake_base(int rank) {
  return (void *)(uintptr_t)(0x100000u * (unsigned)(rank + 1));
}

static size_t fake_len(int rank) { return 4096u + 64u * (unsigned)rank; }

/* The MLX5 route to p is the fake that declares it, with its peer part. */
static void check_mlx5_route(mep_comm_t *comm, int rank, int p) {
  const mep__devroute_t *m = NULL;
  CHECK(mep__devroute_get(comm, p, MEP__DEV_KINDS(MEP_DEV_MLX5), &m, NULL,
                          0) == 0,
        "rank %d -> %d: no MLX5 route: %s", rank, p, mep_last_error());
  /* descriptor bytes carry no alignment: copied out, as kernels' copies
   * are made */
  mep_dev_mlx5_peer_t d;
  memcpy(&d, m->desc, sizeof d);
  CHECK(!strcmp(comm->tps[m->tp].name, scen->mlx5) &&
            m->kind == MEP_DEV_MLX5 && m->desc_len == sizeof d &&
            d.qpn == (uint32_t)p,
        "rank %d -> %d: MLX5 route through %s, kind %d, %zu bytes, qpn %u",
        rank, p, comm->tps[m->tp].name, (int)m->kind, m->desc_len, d.qpn);
}

/* Host memory shared through the MLX5 routes: each peer's arrives as its
 * address and key, and the local part names this rank's own. */
static void share_host(mep_comm_t *comm, int rank, int size) {
  const mep__devroute_t **mr = calloc((size_t)size, sizeof *mr);
  CHECK(mr, "out of memory");
  for (int p = 0; p < size; p++)
    if (p != rank)
      CHECK(mep__devroute_get(comm, p, MEP__DEV_KINDS(MEP_DEV_MLX5), &mr[p],
                              NULL, 0) == 0, "MLX5 route: %s",
            mep_last_error());
  mep__devshare_t *sh = NULL;
  CHECK(mep__devshare_open(comm, "host", 8, fake_base(rank), fake_len(rank),
                           MEP_MEM_HOST, mr, &sh) == 0,
        "rank %d: share host memory: %s", rank, mep_last_error());
  CHECK(mep_barrier(comm, NULL) >= 0, "barrier: %s", mep_last_error());
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    const mep__devpeer_t *dp = NULL;
    CHECK(mep__devshare_import(sh, p, &dp) == 0, "rank %d: import rank %d: "
          "%s", rank, p, mep_last_error());
    mep_dev_mlx5_region_t g, l;
    memcpy(&g, dp->region, sizeof g);
    memcpy(&l, dp->local, sizeof l);
    CHECK(dp->region_len == sizeof g &&
              g.raddr == (uint64_t)(uintptr_t)fake_base(p) &&
              g.len == fake_len(p) && g.rkey == 1000u + (uint32_t)p,
          "rank %d: rank %d's host part arrived as 0x%llx + %llu, key %u",
          rank, p, (unsigned long long)g.raddr, (unsigned long long)g.len,
          g.rkey);
    CHECK(dp->local_len == sizeof l &&
              l.raddr == (uint64_t)(uintptr_t)fake_base(rank) &&
              l.len == fake_len(rank) && l.rkey == 1000u + (uint32_t)rank,
          "rank %d: its own part toward rank %d is 0x%llx + %llu, key %u "
          "(%zu bytes)", rank, p, (unsigned long long)l.raddr,
          (unsigned long long)l.len, l.rkey, dp->local_len);
  }
  mep__devshare_close(sh);
  free(mr);
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store, (void)arg;
  int rank = mep_comm_rank(comm), size = mep_comm_size(comm);
  const mep__devroute_t **routes = calloc((size_t)size, sizeof *routes);
  CHECK(routes, "out of memory");
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    char why[512] = "";
    const mep__devroute_t *r = NULL;
    int rc = mep__devroute_get(comm, p, MEP__DEV_KINDS(MEP_DEV_PTR), &r, why,
                               sizeof why);
    if (!routed(rank, p)) {
      CHECK(rc == MEP_ERR_UNREACHABLE, "rank %d -> %d: rc %d, want "
            "UNREACHABLE (%s)", rank, p, rc, mep_last_error());
      CHECK(strstr(why, scen->why), "rank %d -> %d: the reason '%s' lacks "
            "'%s'", rank, p, why, scen->why);
      /* asked again: the same answer, from the cache */
      CHECK(mep__devroute_get(comm, p, MEP__DEV_KINDS(MEP_DEV_PTR), &r, NULL,
                              0) == MEP_ERR_UNREACHABLE, "asked again");
      continue;
    }
    CHECK(rc == 0, "rank %d -> %d: %s", rank, p, mep_last_error());
    const char *name = comm->tps[r->tp].name;
    CHECK(!strcmp(name, scen->want), "rank %d -> %d through %s, want %s",
          rank, p, name, scen->want);
    const mep_dev_ptr_peer_t *d = (const mep_dev_ptr_peer_t *)r->desc;
    CHECK(r->kind == MEP_DEV_PTR && r->desc_len == sizeof *d &&
              d->hdr.kind == MEP_DEV_PTR && d->device == p,
          "rank %d -> %d: descriptor kind %d len %zu device %d", rank, p,
          (int)r->kind, r->desc_len, d->device);
    const mep__devroute_t *ptr = r;
    if (!scen->mlx5)
      CHECK(mep__devroute_get(comm, p, MEP__DEV_KINDS(MEP_DEV_MLX5), &r, NULL,
                              0) == MEP_ERR_UNREACHABLE,
            "rank %d -> %d: a kind nobody declares found a route", rank, p);
    else
      check_mlx5_route(comm, rank, p);
    /* asking for other kinds left the PTR route as it was */
    CHECK(mep__devroute_get(comm, p, MEP__DEV_KINDS(MEP_DEV_PTR) |
                                         MEP__DEV_KINDS(MEP_DEV_MLX5),
                            &r, NULL, 0) == 0 && r == ptr &&
              mep__devroute_current(comm, p, r->gen),
          "rank %d -> %d: the PTR route was chosen anew", rank, p);
    routes[p] = r;
  }
  /* Share a fake allocation through the routes; every peer's arrives. */
  mep__devshare_t *sh = NULL;
  CHECK(mep__devshare_open(comm, "test", 7, fake_base(rank), fake_len(rank),
                           MEP_MEM_CUDA, routes, &sh) == 0,
        "rank %d: share: %s", rank, mep_last_error());
  CHECK(mep_barrier(comm, NULL) >= 0, "barrier: %s", mep_last_error());
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    const mep__devpeer_t *dp = NULL;
    int rc = mep__devshare_import(sh, p, &dp);
    if (!routes[p]) {
      CHECK(rc == MEP_ERR_INVALID, "rank %d imported unrouted rank %d", rank,
            p);
      continue;
    }
    CHECK(rc == 0, "rank %d: import rank %d: %s", rank, p, mep_last_error());
    const mep_dev_ptr_region_t *g = (const mep_dev_ptr_region_t *)dp->region;
    CHECK(mep__devpeer_ptr(dp) == fake_base(p) && g->len == fake_len(p),
          "rank %d: rank %d's region arrived as %p + %llu, want %p + %zu",
          rank, p, mep__devpeer_ptr(dp), (unsigned long long)g->len,
          fake_base(p), fake_len(p));
  }
  mep__devshare_close(sh);
  if (scen->mlx5) share_host(comm, rank, size);
  free(routes);
  /* destroy closes the routes' connections: devfake's fini checks */
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s NRANKS SCENARIO\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  for (size_t i = 0; i < sizeof scens / sizeof scens[0]; i++)
    if (!strcmp(argv[2], scens[i].name)) scen = &scens[i];
  if (n < 2 || !scen) {
    fprintf(stderr, "test_devroute: NRANKS >= 2 and a known scenario\n");
    return 2;
  }
  setenv("MEP_TRANSPORTS", scen->transports, 1);
  if (scen->device_transport)
    setenv("MEP_CORE_DEVICE_TRANSPORT", scen->device_transport, 1);
  if (scen->kind) setenv("DEVFAKE_KIND", scen->kind, 1);
  if (scen->mlx5) setenv("DEVFAKE_MLX5", scen->mlx5, 1);
  mep_launch_opts_t lo = {.size = n, .timeout_ms = 60000, .name = "devroute",
                          .before_comm = before_comm};
  int failed = mep_launch(&lo, body, NULL);
  printf("%s, %d ranks: %s\n", scen->name, n, failed ? "FAILED" : "passed");
  return failed ? 1 : 0;
}
