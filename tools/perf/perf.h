/* perf.h - mep-perf's options, operations and per-rank state. */
#ifndef MEP_PERF_H
#define MEP_PERF_H

#include <stddef.h>
#include <stdint.h>

#include <mep/mep.h>

typedef enum {
  PERF_ALLREDUCE,
  PERF_BROADCAST,
  PERF_REDUCE,
  PERF_ALLGATHER,
  PERF_REDUCE_SCATTER,
  PERF_ALLTOALL,
  PERF_ALLTOALLV,
  PERF_GATHER,
  PERF_SCATTER,
  PERF_BARRIER,
  PERF_SENDRECV,
  PERF_PINGPONG,
  PERF_OP_COUNT
} perf_kind_t;

typedef struct perf_opts {
  int nlocal;             /* -n: local ranks to fork (0 with --store) */
  const char *store_host; /* --store HOST:PORT; NULL for -n */
  int store_port;
  int rank, size;         /* --rank, --size with --store */
  perf_kind_t kind;
  mep_dtype_t dtype;
  mep_op_t redop;
  size_t min_bytes, max_bytes;
  size_t factor;
  int warmup, iters;
  int check;
  int root;
  int timeout_ms;
  int csv;
  int inject; /* --inject-error: spoil one output element per call */
  int inplace; /* --in-place: allreduce's output buffer is its input */
  uint64_t seed;
} perf_opts_t;

/* Parses argv into *o. Returns 0, 1 after --help (printed), or 2 after a
 * bad argument (described on stderr). */
int perf_parse_args(int argc, char **argv, perf_opts_t *o);
/* Steps *s to the next size of the sweep (after 0 comes 1); 0 when the
 * sweep is over. */
int perf_next_size(const perf_opts_t *o, size_t *s);

/* How one operation of a given size uses buffers and counts bandwidth,
 * following nccl-tests' definitions. */
typedef struct perf_shape {
  size_t count;      /* the count column (elements per call's argument) */
  size_t send_elems; /* this rank's send buffer */
  size_t recv_elems; /* this rank's receive buffer */
  size_t bytes;      /* the size column: max of send and recv bytes */
  double alg_bytes;  /* numerator of algbw */
} perf_shape_t;

/* An expected part of a rank's output: `count` elements at dst (elements)
 * equal to elements [src_idx, src_idx + count) of rank src's input, or,
 * with src == -1, to the reduction over every rank of those elements. */
typedef struct perf_seg {
  size_t dst, count, src_idx;
  int src;
} perf_seg_t;

/* One rank's state for a sweep. */
typedef struct perf_rank {
  const perf_opts_t *o;
  mep_comm_t *comm;
  mep_store_t *store;
  int rank, n;
  size_t dsize;
  perf_shape_t sh;
  void *send, *recv;   /* recv == send for broadcast */
  size_t cap_send, cap_recv; /* allocated bytes */
  /* alltoallv: this rank's counts and displacements, and for each sender
   * q the offset of this rank's block in q's send buffer. */
  size_t *scounts, *sdispls, *rcounts, *rdispls, *src_off;
  size_t *row; /* scratch, n entries */
  perf_seg_t *segs;    /* expected output, n + 1 entries at most */
  size_t nsegs;
  uint64_t *keys;      /* per rank stream keys of the checked iteration */
  /* A request was left running past its deadline: its buffers and counts
   * must never be freed (the process exits soon after). */
  int detached;
} perf_rank_t;

typedef struct perf_opdesc {
  const char *name;
  int reduces;  /* takes -r */
  int rooted;   /* takes --root */
  int min_ranks;
  /* Sets the shape for `bytes` on n ranks of dsize-byte elements. */
  void (*shape)(size_t bytes, size_t dsize, int n, perf_shape_t *sh);
  /* The bus-bandwidth factor on n ranks. */
  double (*bus_factor)(int n);
} perf_opdesc_t;

const perf_opdesc_t *perf_op(perf_kind_t kind);
/* Looks an operation up by name; -1 when unknown. */
int perf_op_find(const char *name);

/* Sets r->sh and the alltoallv tables for `bytes`, then r->segs. */
void perf_plan(perf_rank_t *r, size_t bytes);
/* Runs the operation once on r's buffers, every wait bounded by -t.
 * Returns 0 or the failing MEP_ERR_*, described on stderr. */
int perf_run(perf_rank_t *r);

/* Fills this rank's input for iteration `iter` and poisons its output so
 * that an element the operation does not write is counted wrong. */
void perf_prepare(perf_rank_t *r, int iter);
/* For testing the checker: replaces this rank's first output element (if
 * it has output) with its complement, which is never right. */
void perf_spoil(perf_rank_t *r);
/* Counts the wrong elements of this rank's output for iteration `iter`. */
uint64_t perf_check(perf_rank_t *r, int iter);

/* Runs the whole sweep on one rank; rank 0 prints. Returns 0 when every
 * operation succeeded and (with -c) every result was right. */
int perf_sweep(mep_comm_t *comm, mep_store_t *store, const perf_opts_t *o);

#endif
