/* plan.c - for one size: the shape of the operation on this rank, the
 * uneven split of alltoallv, and which inputs each part of this rank's
 * output must equal (the segments the checker verifies). */
#include "perf.h"

/* Sender q's split of `total` elements over n receivers: proportional to
 * weights (q + 2p + 1) mod 4, so some blocks are empty and the others
 * differ in size; the rounding remainder goes to rank q+1. For n >= 2 two
 * neighbouring weights differ, so some weight is non-zero. */
static void a2av_row(size_t total, int n, int q, size_t *counts) {
  size_t wsum = 0, given = 0;
  for (int p = 0; p < n; p++) wsum += ((size_t)q + 2 * (size_t)p + 1) % 4;
  for (int p = 0; p < n; p++) {
    size_t w = ((size_t)q + 2 * (size_t)p + 1) % 4;
    /* total * w may not fit: divide first, then spread the remainder. */
    counts[p] = wsum ? total / wsum * w + total % wsum * w / wsum : 0;
    given += counts[p];
  }
  counts[(q + 1) % n] += total - given;
}

/* This rank's sends (its own row) and receives (column `rank` of every
 * sender's row), with contiguous displacements on both sides. */
static void plan_alltoallv(perf_rank_t *r) {
  size_t total = r->sh.count, off = 0;
  a2av_row(total, r->n, r->rank, r->scounts);
  for (int p = 0; p < r->n; p++) {
    r->sdispls[p] = off;
    off += r->scounts[p];
  }
  off = 0;
  for (int q = 0; q < r->n; q++) {
    a2av_row(total, r->n, q, r->row);
    size_t before = 0;
    for (int p = 0; p < r->rank; p++) before += r->row[p];
    r->src_off[q] = before;
    r->rcounts[q] = r->row[r->rank];
    r->rdispls[q] = off;
    off += r->rcounts[q];
  }
  r->sh.recv_elems = off;
  r->sh.bytes = (total > off ? total : off) * r->dsize;
}

static void add_seg(perf_rank_t *r, size_t dst, size_t count, size_t src_idx,
                    int src) {
  r->segs[r->nsegs++] = (perf_seg_t){dst, count, src_idx, src};
}

/* One segment per sender, block q of the output. */
static void segs_per_sender(perf_rank_t *r, size_t src_idx) {
  for (int q = 0; q < r->n; q++)
    add_seg(r, (size_t)q * r->sh.count, r->sh.count, src_idx, q);
}

static void plan_segments(perf_rank_t *r) {
  size_t count = r->sh.count, mine = (size_t)r->rank * count;
  int root = r->o->root, is_root = r->rank == root;
  r->nsegs = 0;
  switch (r->o->kind) {
  case PERF_ALLREDUCE: add_seg(r, 0, count, 0, -1); break;
  case PERF_REDUCE:
    if (is_root) add_seg(r, 0, count, 0, -1);
    break;
  case PERF_REDUCE_SCATTER: add_seg(r, 0, count, mine, -1); break;
  case PERF_BROADCAST: add_seg(r, 0, count, 0, root); break;
  case PERF_ALLGATHER: segs_per_sender(r, 0); break;
  case PERF_GATHER:
    if (is_root) segs_per_sender(r, 0);
    break;
  case PERF_ALLTOALL: segs_per_sender(r, mine); break;
  case PERF_ALLTOALLV:
    for (int q = 0; q < r->n; q++)
      add_seg(r, r->rdispls[q], r->rcounts[q], r->src_off[q], q);
    break;
  case PERF_SCATTER: add_seg(r, 0, count, mine, root); break;
  case PERF_SENDRECV:
    add_seg(r, 0, count, 0, (r->rank + r->n - 1) % r->n);
    break;
  case PERF_PINGPONG:
    if (r->rank < 2) add_seg(r, 0, count, 0, 0);
    break;
  case PERF_BARRIER:
  case PERF_OP_COUNT: break;
  }
}

void perf_plan(perf_rank_t *r, size_t bytes) {
  perf_op(r->o->kind)->shape(bytes, r->dsize, r->n, &r->sh);
  if (r->o->kind == PERF_ALLTOALLV) plan_alltoallv(r);
  plan_segments(r);
}
