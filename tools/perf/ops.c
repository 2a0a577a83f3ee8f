/* ops.c - the operations mep-perf measures: their buffer shapes and
 * bandwidth factors as nccl-tests defines them. */
#include <string.h>

#include "perf.h"

static double factor_one(int n) {
  (void)n;
  return 1.0;
}
static double factor_zero(int n) {
  (void)n;
  return 0.0;
}
static double factor_allreduce(int n) { return 2.0 * (n - 1) / n; }
static double factor_spread(int n) { return (double)(n - 1) / n; }

static void finish(perf_shape_t *sh, size_t dsize, double alg_elems) {
  size_t big = sh->send_elems > sh->recv_elems ? sh->send_elems
                                               : sh->recv_elems;
  sh->bytes = big * dsize;
  sh->alg_bytes = alg_elems * (double)dsize;
}

/* count elements in and out on every rank. */
static void shape_same(size_t bytes, size_t dsize, int n, perf_shape_t *sh) {
  (void)n;
  sh->count = bytes / dsize;
  sh->send_elems = sh->recv_elems = sh->count;
  finish(sh, dsize, (double)sh->count);
}

/* count per rank in, n * count out. */
static void shape_gather(size_t bytes, size_t dsize, int n, perf_shape_t *sh) {
  sh->count = bytes / dsize / (size_t)n;
  sh->send_elems = sh->count;
  sh->recv_elems = sh->count * (size_t)n;
  finish(sh, dsize, (double)sh->recv_elems);
}

/* n * count in, count out. */
static void shape_scatter(size_t bytes, size_t dsize, int n,
                          perf_shape_t *sh) {
  sh->count = bytes / dsize / (size_t)n;
  sh->send_elems = sh->count * (size_t)n;
  sh->recv_elems = sh->count;
  finish(sh, dsize, (double)sh->send_elems);
}

/* count to each rank, n * count in and out. */
static void shape_alltoall(size_t bytes, size_t dsize, int n,
                           perf_shape_t *sh) {
  sh->count = bytes / dsize / (size_t)n;
  sh->send_elems = sh->recv_elems = sh->count * (size_t)n;
  finish(sh, dsize, (double)sh->send_elems);
}

/* count elements sent in all, split unevenly; the receive side is sized by
 * perf_plan, which knows the split. */
static void shape_alltoallv(size_t bytes, size_t dsize, int n,
                            perf_shape_t *sh) {
  (void)n;
  sh->count = bytes / dsize;
  sh->send_elems = sh->recv_elems = sh->count;
  finish(sh, dsize, (double)sh->count);
}

static void shape_none(size_t bytes, size_t dsize, int n, perf_shape_t *sh) {
  (void)bytes, (void)dsize, (void)n;
  memset(sh, 0, sizeof *sh);
}

static const perf_opdesc_t ops[PERF_OP_COUNT] = {
    [PERF_ALLREDUCE] = {"allreduce", 1, 0, 1, shape_same, factor_allreduce},
    [PERF_BROADCAST] = {"broadcast", 0, 1, 1, shape_same, factor_one},
    [PERF_REDUCE] = {"reduce", 1, 1, 1, shape_same, factor_one},
    [PERF_ALLGATHER] = {"allgather", 0, 0, 1, shape_gather, factor_spread},
    [PERF_REDUCE_SCATTER] = {"reduce_scatter", 1, 0, 1, shape_scatter,
                             factor_spread},
    [PERF_ALLTOALL] = {"alltoall", 0, 0, 1, shape_alltoall, factor_spread},
    [PERF_ALLTOALLV] = {"alltoallv", 0, 0, 1, shape_alltoallv, factor_spread},
    [PERF_GATHER] = {"gather", 0, 1, 1, shape_gather, factor_spread},
    [PERF_SCATTER] = {"scatter", 0, 1, 1, shape_scatter, factor_spread},
    [PERF_BARRIER] = {"barrier", 0, 0, 1, shape_none, factor_zero},
    [PERF_SENDRECV] = {"sendrecv", 0, 0, 1, shape_same, factor_one},
    [PERF_PINGPONG] = {"pingpong", 0, 0, 2, shape_same, factor_one},
};

const perf_opdesc_t *perf_op(perf_kind_t kind) { return &ops[kind]; }

int perf_op_find(const char *name) {
  for (int k = 0; k < PERF_OP_COUNT; k++)
    if (strcmp(name, ops[k].name) == 0) return k;
  return -1;
}
