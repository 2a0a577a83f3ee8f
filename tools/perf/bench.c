/* bench.c - one rank's sweep: for each size, warm up, time the iterations,
 * check the results with -c, and report. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

/* Grows *buf to at least `bytes` (page-aligned, never NULL). */
static int reserve(void **buf, size_t *cap, size_t bytes) {
  if (*buf && bytes <= *cap) return 0;
  free(*buf);
  *buf = NULL;
  size_t want = bytes > 4096 ? bytes : 4096;
  if (posix_memalign(buf, 4096, want)) {
    *buf = NULL;
    *cap = 0;
    return MEP_ERR_NOMEM;
  }
  *cap = want;
  return 0;
}

static int reserve_buffers(perf_rank_t *r) {
  int one = r->o->kind == PERF_BROADCAST || r->o->inplace;
  int rc = reserve(&r->send, &r->cap_send, r->sh.send_elems * r->dsize);
  if (rc == 0 && !one)
    rc = reserve(&r->recv, &r->cap_recv, r->sh.recv_elems * r->dsize);
  if (one) r->recv = r->send;
  if (rc)
    fprintf(stderr, "mep-perf: rank %d: out of memory for buffers of %zu "
            "bytes\n", r->rank, r->sh.bytes);
  return rc;
}

static int rank_init(perf_rank_t *r, mep_comm_t *comm, mep_store_t *store,
                     const perf_opts_t *o) {
  memset(r, 0, sizeof *r);
  r->o = o;
  r->comm = comm;
  r->store = store;
  r->rank = mep_comm_rank(comm);
  r->n = mep_comm_size(comm);
  r->dsize = mep_dtype_size(o->dtype);
  size_t n = (size_t)r->n;
  r->scounts = calloc(n, sizeof(size_t));
  r->sdispls = calloc(n, sizeof(size_t));
  r->rcounts = calloc(n, sizeof(size_t));
  r->rdispls = calloc(n, sizeof(size_t));
  r->src_off = calloc(n, sizeof(size_t));
  r->row = calloc(n, sizeof(size_t));
  r->keys = calloc(n, sizeof(uint64_t));
  r->segs = calloc(n + 1, sizeof(perf_seg_t));
  if (!r->scounts || !r->sdispls || !r->rcounts || !r->rdispls ||
      !r->src_off || !r->row || !r->keys || !r->segs) {
    fprintf(stderr, "mep-perf: rank %d: out of memory for %d ranks\n",
            r->rank, r->n);
    return MEP_ERR_NOMEM;
  }
  return 0;
}

static void rank_fini(perf_rank_t *r) {
  if (!r->detached) {
    if (r->recv != r->send) free(r->recv);
    free(r->send);
    free(r->scounts);
    free(r->sdispls);
    free(r->rcounts);
    free(r->rdispls);
  }
  free(r->src_off);
  free(r->row);
  free(r->keys);
  free(r->segs);
}

static int sync_ranks(const perf_rank_t *r) {
  mep_req_t *req = NULL;
  int rc = mep_barrier(r->comm, &req);
  if (rc == 0) rc = mep_req_wait(req, r->o->timeout_ms);
  if (rc)
    fprintf(stderr, "mep-perf: rank %d: barrier before timing %zu bytes "
            "failed: %s: %s\n", r->rank, r->sh.bytes, mep_strerror(rc),
            mep_last_error());
  mep_req_free(req); /* a barrier uses no buffer of ours */
  return rc;
}

/* Times `iters` back-to-back calls on iteration 0's inputs. */
static int time_batch(perf_rank_t *r, double *seconds) {
  int rc = sync_ranks(r);
  double t0 = perf_now_s();
  for (int i = 0; rc == 0 && i < r->o->iters; i++) rc = perf_run(r);
  *seconds = perf_now_s() - t0;
  return rc;
}

/* Times each call alone, with fresh inputs, and checks its result; the
 * preparation and the check are outside the timed span. */
static int time_checked(perf_rank_t *r, double *seconds, uint64_t *wrong) {
  *seconds = 0;
  for (int i = 0; i < r->o->iters; i++) {
    perf_prepare(r, i);
    int rc = sync_ranks(r);
    if (rc) return rc;
    double t0 = perf_now_s();
    rc = perf_run(r);
    *seconds += perf_now_s() - t0;
    if (rc) return rc;
    if (r->o->inject) perf_spoil(r);
    *wrong += perf_check(r, i);
  }
  return 0;
}

/* This rank's average time per call (us) and wrong elements for a size. */
static int measure(perf_rank_t *r, double *time_us, uint64_t *wrong) {
  int rc = 0;
  double seconds = 0;
  *wrong = 0;
  perf_prepare(r, 0);
  for (int i = 0; rc == 0 && i < r->o->warmup; i++) rc = perf_run(r);
  if (rc == 0)
    rc = r->o->check ? time_checked(r, &seconds, wrong)
                     : time_batch(r, &seconds);
  *time_us = seconds * 1e6 / r->o->iters;
  /* A ping-pong iteration is a round trip; the latency is one way. */
  if (r->o->kind == PERF_PINGPONG) *time_us /= 2;
  return rc;
}

int perf_sweep(mep_comm_t *comm, mep_store_t *store, const perf_opts_t *o) {
  perf_rank_t r;
  perf_report_t rep;
  int rc = rank_init(&r, comm, store, o), row = 0;
  uint64_t mine = 0;
  size_t bytes = o->kind == PERF_BARRIER ? 0 : o->min_bytes;
  if (rc == 0) perf_report_begin(&r, &rep);
  while (rc == 0) {
    double time_us = 0;
    uint64_t wrong = 0;
    perf_plan(&r, bytes);
    rc = reserve_buffers(&r);
    if (rc == 0) rc = measure(&r, &time_us, &wrong);
    if (rc == 0) rc = perf_report_row(&r, &rep, row++, time_us, wrong);
    mine += wrong;
    if (o->kind == PERF_BARRIER || !perf_next_size(o, &bytes)) break;
  }
  if (rc == 0) {
    perf_report_end(&r, &rep);
  } else if (r.rank == 0) {
    printf("# failed at %zu bytes (see the messages above)\n", r.sh.bytes);
    fflush(stdout);
  }
  if (mine && r.rank != 0)
    fprintf(stderr, "mep-perf: rank %d: %" PRIu64 " wrong elements\n", r.rank,
            mine);
  rank_fini(&r);
  if (rc) return 1;
  return (r.rank == 0 ? rep.wrong : mine) ? 1 : 0;
}
