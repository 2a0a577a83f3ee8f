/* report.c - mep-perf's table and its collection from every rank. */
#include "report.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Namespaced apart from the communicator's own keys ("mep-perf/..."). */
#define KEY_FMT "mep-perf.results/%d/%d"

double perf_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *redop_col(const perf_opts_t *o) {
  return perf_op(o->kind)->reduces ? mep_op_name(o->redop) : "none";
}

static int root_col(const perf_opts_t *o) {
  return perf_op(o->kind)->rooted ? o->root : -1;
}

void perf_report_begin(const perf_rank_t *r, perf_report_t *rep) {
  memset(rep, 0, sizeof *rep);
  rep->start_s = perf_now_s();
  if (r->rank != 0) return;
  const perf_opts_t *o = r->o;
  if (o->csv) {
    printf("size,count,type,redop,root,time_us,algbw_gbps,busbw_gbps,"
           "wrong\n");
  } else {
    printf("# mep-perf %s: %s%s on %d ranks, %s, redop %s, root %d, "
           "warmup %d, iters %d, check %s, timeout %d ms, seed %" PRIu64
           "\n", mep_version(), perf_op(o->kind)->name,
           o->inplace ? " in place" : "", r->n,
           mep_dtype_name(o->dtype), redop_col(o), root_col(o), o->warmup,
           o->iters, o->check ? "on" : "off", o->timeout_ms, o->seed);
    printf("# routes of rank 0:");
    for (int p = 0; p < r->n && p < 16; p++) {
      const char *route = mep_comm_route(r->comm, p);
      printf(" %d=%s", p, route ? route : "?");
    }
    printf("%s\n#\n", r->n > 16 ? " ..." : "");
    printf("# %11s  %12s  %8s  %6s  %6s  %10s  %8s  %8s  %8s\n", "size",
           "count", "type", "redop", "root", "time", "algbw", "busbw",
           "#wrong");
    printf("# %11s  %12s  %8s  %6s  %6s  %10s  %8s  %8s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)");
  }
  fflush(stdout);
}

static int publish(const perf_rank_t *r, int row, double time_us,
                   uint64_t wrong) {
  char key[64], val[64];
  snprintf(key, sizeof key, KEY_FMT, row, r->rank);
  int len = snprintf(val, sizeof val, "%a %" PRIu64, time_us, wrong);
  int rc = r->store->set(r->store->ctx, key, val, (size_t)len);
  if (rc)
    fprintf(stderr, "mep-perf: rank %d: store set %s: %s\n", r->rank, key,
            mep_last_error());
  return rc;
}

/* Rank q's (time, wrong) of the row, waited for up to -t. */
static int fetch(const perf_rank_t *r, int row, int q, double *time_us,
                 uint64_t *wrong) {
  char key[64], val[64];
  snprintf(key, sizeof key, KEY_FMT, row, q);
  void *v = NULL;
  size_t len = 0;
  int rc = r->store->get(r->store->ctx, key, &v, &len, r->o->timeout_ms);
  if (rc) {
    fprintf(stderr, "mep-perf: rank 0: the result of rank %d for %zu bytes "
            "did not come: %s: %s\n", q, r->sh.bytes, mep_strerror(rc),
            mep_last_error());
    return rc;
  }
  snprintf(val, sizeof val, "%.*s", (int)(len < sizeof val ? len : 0),
           (const char *)v);
  free(v);
  if (sscanf(val, "%la %" SCNu64, time_us, wrong) != 2) {
    fprintf(stderr, "mep-perf: rank 0: rank %d's result '%s' is malformed\n",
            q, val);
    return MEP_ERR_PROTOCOL;
  }
  return 0;
}

static void print_row(const perf_rank_t *r, double time_us, uint64_t wrong,
                      double algbw, double busbw) {
  const perf_opts_t *o = r->o;
  char wrong_s[32] = "";
  if (o->check) snprintf(wrong_s, sizeof wrong_s, "%" PRIu64, wrong);
  if (o->csv)
    printf("%zu,%zu,%s,%s,%d,%.3f,%.4f,%.4f,%s\n", r->sh.bytes, r->sh.count,
           mep_dtype_name(o->dtype), redop_col(o), root_col(o), time_us,
           algbw, busbw, wrong_s);
  else
    printf("  %11zu  %12zu  %8s  %6s  %6d  %10.2f  %8.3f  %8.3f  %8s\n",
           r->sh.bytes, r->sh.count, mep_dtype_name(o->dtype), redop_col(o),
           root_col(o), time_us, algbw, busbw, o->check ? wrong_s : "N/A");
  fflush(stdout);
}

int perf_report_row(const perf_rank_t *r, perf_report_t *rep, int row,
                    double time_us, uint64_t wrong) {
  if (r->rank != 0) return publish(r, row, time_us, wrong);
  for (int q = 1; q < r->n; q++) {
    double t;
    uint64_t w;
    int rc = fetch(r, row, q, &t, &w);
    if (rc) return rc;
    if (t > time_us) time_us = t;
    wrong += w;
  }
  double algbw = time_us > 0 ? r->sh.alg_bytes / time_us / 1e3 : 0;
  double busbw = algbw * perf_op(r->o->kind)->bus_factor(r->n);
  print_row(r, time_us, wrong, algbw, busbw);
  rep->busbw_sum += busbw;
  rep->rows++;
  rep->wrong += wrong;
  double elapsed = perf_now_s() - rep->start_s;
  if (elapsed > 5.0)
    fprintf(stderr, "# mep-perf: %zu bytes done, %.1f s elapsed\n",
            r->sh.bytes, elapsed);
  return 0;
}

void perf_report_end(const perf_rank_t *r, const perf_report_t *rep) {
  if (r->rank != 0) return;
  printf("# avg busbw: %.3f GB/s\n",
         rep->rows ? rep->busbw_sum / rep->rows : 0.0);
  printf("# errors: %" PRIu64 "\n", rep->wrong);
  fflush(stdout);
}
