/* plan.h - collectives as data: a validated call (the spec) and the plan
 * the engine executes for it, steps of messages between pairs. plan.c
 * builds plans from specs and owns their memory, plan_log.c the
 * logarithmic ones (recursive doubling, dissemination); the collective
 * engine (coll.c) is their only caller, and calls again over the
 * survivors when ranks are lost. */
#ifndef MEP_SRC_PLAN_H
#define MEP_SRC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

enum {
  MEP__COLL_BROADCAST,
  MEP__COLL_REDUCE,
  MEP__COLL_ALLREDUCE,
  MEP__COLL_ALLGATHER,
  MEP__COLL_REDUCE_SCATTER,
  MEP__COLL_ALLTOALL,
  MEP__COLL_ALLTOALLV,
  MEP__COLL_GATHER,
  MEP__COLL_SCATTER,
  MEP__COLL_BARRIER,
  MEP__COLL_PEER_STATE, /* membership barriers (recover.c) */
  MEP__COLL_RECOVER,
};

/* What a rank does in one step. Arrays have one entry per rank. */
typedef struct mep__step {
  int reduce; /* 0: messages are copied; 1: reduced in rank order */
  int partial; /* reduce: the result is a partial one (an average is
                  summed here and divided in a later step) */
  uint8_t *send_to;       /* 1 if a message goes to rank p */
  const uint8_t **sptr;   /* its bytes */
  size_t *sbytes;
  uint8_t *recv_from;     /* 1 if a message comes from rank p (reduce:
                             the contributions besides this rank's) */
  uint8_t **rptr;         /* where it lands */
  size_t *rbytes;         /* its expected length */
  /* reduce: the contributions of rlen bytes, this rank's (rself) and
   * those of the ranks in recv_from, are combined in rank order into
   * rout. */
  int reduce_here;
  const uint8_t *rself;
  uint8_t *rout;
  size_t rlen;
  /* The ranks of send_to and recv_from as lists, made once the plan is
   * built, so that the engine walks a step's partners rather than every
   * rank: sends in the order the engine sends, from the rank after this
   * one around; receives in rank order, with this rank among them where
   * it reduces (its own contribution enters in rank order too). */
  int *sends, nsends;
  int *recvs, nrecvs;
} mep__step_t;

/* A collective: its identity (for the digest and messages) and steps. */
typedef struct mep__plan {
  int kind;
  mep_dtype_t dtype;
  mep_op_t op;
  size_t count;
  int root;
  const char *algo;       /* MEP__ALGO_*, or "direct" */
  int nsteps;
  /* After step ndata this rank holds all its data; the steps after it
   * (ndata < nsteps) only tell every rank that every rank does, which
   * [core] agreement otherwise learns from the credits (coll.c). */
  int ndata;
  /* Not every pair exchanges a message: a disagreement one rank finds is
   * told to the others (coll.c, flood_abort). */
  int sparse;
  mep__step_t *steps;
  uint8_t *arena;         /* the steps' per-rank arrays, owned */
  uint8_t *scratch;       /* partial results between steps, owned */
} mep__plan_t;

#define MEP__ALGO_ONE_SHOT "one-shot"
#define MEP__ALGO_TWO_SHOT "two-shot"
#define MEP__ALGO_RD "recursive-doubling"
#define MEP__ALGO_DISSEMINATION "dissemination"


/* A collective as the user called it, validated: the engine builds its
 * plan from this when it starts, and again over the survivors when ranks
 * are lost. */
typedef struct mep__coll_spec {
  int kind;
  mep_dtype_t dtype;
  mep_op_t op;
  size_t count;
  int root;        /* -1: none */
  const void *send;
  void *recv;      /* broadcast: the buffer */
  size_t *v;       /* alltoallv: send counts, displs, recv counts, displs */
  size_t copy_bytes; /* in place: bytes of send copied aside at the start */
} mep__coll_spec_t;
void mep__coll_spec_free(mep__coll_spec_t *s);

/* The engine's settings that choose among plans ([core]). */
typedef struct mep__plan_opts {
  size_t two_shot;  /* two_shot_bytes: one-shot up to it, two-shot above */
  int log_ranks;    /* log_ranks: logarithmic plans from this many active
                       ranks (0: never) ... */
  size_t log_bytes; /* ... for all-reduces up to log_bytes */
  int confirm;      /* agreement on: logarithmic plans end with steps that
                       confirm every rank holds its data */
} mep__plan_opts_t;

/* The plan of `s` for this rank over the ranks with act[r] != 0, chosen
 * by `o`. MEP_ERR_PEER_FAILED when its root is not among them. */
int mep__plan_build(mep_comm_t *comm, const mep__coll_spec_t *s,
                    const uint8_t *act, const mep__plan_opts_t *o,
                    mep__plan_t *p);

/* ------------------------------------------------ for the plan builders */

typedef struct mep__plan_args {
  int me, n;
  size_t ds;          /* dtype size */
  const uint8_t *act; /* active ranks of the attempt */
  int nact;
  const mep__plan_opts_t *opts;
} mep__plan_args_t;

/* Sets up `p` for `s` with `nsteps` empty steps, all of them data steps;
 * frees what it made on failure. */
int mep__plan_init(mep__plan_t *p, const mep__plan_args_t *a,
                   const mep__coll_spec_t *s, const char *algo, int nsteps);

/* The logarithmic plan of `s` (plan_log.c): 1 made, 0 none fits (another
 * plan is built), <0 error. */
int mep__plan_log(const mep__plan_args_t *a, const mep__coll_spec_t *s,
                  mep__plan_t *p);

/* Frees a plan's arrays and owned buffers. */
void mep__plan_free(mep__plan_t *plan);

#endif
