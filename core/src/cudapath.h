/* cudapath.h - CUDA collectives inside the core: the kernel path over peers'
 * mapped memory (cuda_kpath.c), the staged path through pinned host memory
 * (cuda_stage.c), and what both share (cuda_util.c). Only built with
 * MEP_HAVE_CUDA; cuda_api.c holds the public entry points either way and
 * calls down to the two paths, which call cuda_util.c and the host
 * collectives (coll_api.c), never back up. */
#ifndef MEP_SRC_CUDAPATH_H
#define MEP_SRC_CUDAPATH_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"

/* One CUDA collective as called: the public entry points fill it. */
typedef struct mep__cuda_op {
  int kind;        /* MEP__COLL_* of coll.h */
  const void *send;
  void *recv;      /* broadcast: the buffer */
  size_t count;    /* as the user gave it (per rank where the API says) */
  mep_dtype_t dtype;
  mep_op_t op;
  int root;
  void *stream;
} mep__cuda_op_t;

#ifdef MEP_HAVE_CUDA
#include <cuda_runtime_api.h>

/* Bytes of the op's input and output on this rank. */
size_t mep__cuda_in_bytes(const mep_comm_t *comm, const mep__cuda_op_t *op);
size_t mep__cuda_out_bytes(const mep_comm_t *comm, const mep__cuda_op_t *op);

struct mep__kpath;
struct mep__stage;

/* Per communicator, made at its first CUDA collective. */
typedef struct mep__cuda {
  pthread_mutex_t mu; /* one CUDA collective enqueued at a time */
  int device;
  int path;           /* [core] cuda_path: 0 auto, 1 kernel, 2 staged */
  int kernel_ok;      /* the kernel path is set up and in use */
  char why[256];      /* why not, for mep_cuda_path and logs */
  struct mep__kpath *kp, *retired;
  struct mep__stage *st;
} mep__cuda_t;

/* MEP_ERR_SYSTEM describing a CUDA runtime error: "what: cudaXxx: text". */
int mep__cuda_err(cudaError_t e, const char *fmt, ...) MEP_PRINTF(2, 3);
/* 1 while `stream` captures a graph. */
int mep__cuda_capturing(void *stream);
/* MEP_ERR_INVALID unless ptr is device (or managed) memory. */
int mep__cuda_check_ptr(const void *ptr, const char *what);

/* The kernel path: set up (collective over the active ranks), run one op,
 * release. kpath_setup returns 1 when every rank can take it, 0 when
 * not (why in cu->why), negative on error. */
int mep__kpath_setup(mep_comm_t *comm, mep__cuda_t *cu);
int mep__kpath_stale(mep_comm_t *comm, mep__cuda_t *cu);
int mep__kpath_run(mep_comm_t *comm, mep__cuda_t *cu,
                   const mep__cuda_op_t *op, mep_req_t **req);
/* Retires the group (freed with the communicator); frees every group. */
void mep__kpath_retire(mep_comm_t *comm, mep__cuda_t *cu);
void mep__kpath_free(mep_comm_t *comm, mep__cuda_t *cu);

/* The staged path. */
int mep__stage_run(mep_comm_t *comm, mep__cuda_t *cu,
                   const mep__cuda_op_t *op, mep_req_t **req);
void mep__stage_free(mep__cuda_t *cu);
#endif

/* At destroy, before the transports close: releases what the CUDA
 * collectives hold and lets any stream still waiting go on. */
void mep__cuda_fini(mep_comm_t *comm);

#endif
