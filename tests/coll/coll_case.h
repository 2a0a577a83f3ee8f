/* coll_case.h - one collective call with its inputs, made so that any
 * rank can tell what every rank holds, and the check of its outputs
 * against the reference (ref.h). Prepare, issue and check are separate so
 * the asynchronous tests can have several cases in flight. */
#ifndef MEP_TESTS_COLL_CASE_H
#define MEP_TESTS_COLL_CASE_H

#include "harness.h"

typedef enum {
  K_BROADCAST,
  K_REDUCE,
  K_ALLREDUCE,
  K_ALLGATHER,
  K_REDUCE_SCATTER,
  K_ALLTOALL,
  K_ALLTOALLV,
  K_GATHER,
  K_SCATTER,
  K_KINDS
} coll_kind_t;

enum {
  CASE_INPLACE = 1,   /* allreduce, alltoall: send == recv; allgather:
                         send = recv + rank * count * size */
  CASE_UNALIGNED = 2, /* buffers at an odd address */
  CASE_NULL = 4,      /* NULL for buffers the call does not use (reduce's
                         recv off the root) */
};

typedef struct coll_case {
  coll_kind_t kind;
  mep_dtype_t dt;
  mep_op_t op;
  size_t count; /* elements per rank or block; alltoallv: mean per pair */
  int root, flags;
  uint64_t seed;
  char desc[160];
  tbuf_t send, recv;    /* in place: recv only */
  uint8_t *send_copy;   /* the send buffer as filled, to see it unchanged */
  size_t *v;            /* alltoallv: send counts, send displs, recv
                           counts, recv displs, n each */
} coll_case_t;

const char *kind_name(coll_kind_t kind);
int kind_has_root(coll_kind_t kind);
int kind_reduces(coll_kind_t kind);

/* Names the case and derives its seed from the context's count of cases,
 * so every rank makes the same case. */
void case_init(coll_ctx_t *ctx, coll_case_t *c, coll_kind_t kind,
               mep_dtype_t dt, mep_op_t op, size_t count, int root,
               int flags);
/* Allocates and fills the buffers. */
void case_prepare(const coll_ctx_t *ctx, coll_case_t *c);
/* Calls the collective (req NULL: blocking); returns its result. */
int case_issue(coll_ctx_t *ctx, coll_case_t *c, mep_req_t **req);
/* Checks every output byte and the canaries and that the send buffer is
 * unchanged; records the hash of results all ranks share. Exits with the
 * case's description on a failure. */
void case_check(coll_ctx_t *ctx, coll_case_t *c);
void case_release(coll_case_t *c);

/* All of the above, blocking, expecting success. */
void case_run(coll_ctx_t *ctx, coll_kind_t kind, mep_dtype_t dt, mep_op_t op,
              size_t count, int root, int flags);

#endif
