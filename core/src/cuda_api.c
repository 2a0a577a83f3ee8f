/* cuda_api.c - the public CUDA collectives: checks, then the kernel path
 * (cuda_kpath.c) where it is set up, else the staged path (cuda_stage.c).
 * Without CUDA in the build they say so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cudapath.h"
#include "error.h"
#include "log.h"
#include "plan.h"

static int check_op(const mep_comm_t *comm, const mep__cuda_op_t *op,
                    const char *name) {
  if (!comm)
    return mep__err(MEP_ERR_INVALID, "%s: NULL communicator", name);
  if (mep_dtype_size(op->dtype) == 0)
    return mep__err(MEP_ERR_INVALID, "%s: unknown dtype %d", name,
                    (int)op->dtype);
  int reduces = op->kind == MEP__COLL_ALLREDUCE ||
                op->kind == MEP__COLL_REDUCE_SCATTER;
  if (reduces && ((int)op->op < 0 || (int)op->op >= MEP_OP_COUNT))
    return mep__err(MEP_ERR_INVALID, "%s: unknown op %d", name, (int)op->op);
  if (reduces && op->op == MEP_AVG && op->dtype == MEP_BOOL)
    return mep__err(MEP_ERR_INVALID, "%s: avg of bool", name);
  if (op->kind == MEP__COLL_BROADCAST &&
      (op->root < 0 || op->root >= comm->size))
    return mep__err(MEP_ERR_INVALID, "%s: root %d in a group of %d", name,
                    op->root, comm->size);
  if (op->count && ((!op->send && op->kind != MEP__COLL_BROADCAST) ||
                    !op->recv))
    return mep__err(MEP_ERR_INVALID, "%s: NULL buffer", name);
  return MEP_OK;
}

#ifndef MEP_HAVE_CUDA

int mep_cuda_available(void) { return 0; }
const char *mep_cuda_path(mep_comm_t *comm) {
  (void)comm;
  return NULL;
}
void mep__cuda_fini(mep_comm_t *comm) { (void)comm; }

static int run(mep_comm_t *comm, mep__cuda_op_t *op, mep_req_t **req,
               const char *name) {
  if (req) *req = NULL;
  int rc = check_op(comm, op, name);
  if (rc) return rc;
  return mep__err(MEP_ERR_UNSUPPORTED, "%s: this libmep was built without "
                  "CUDA (meson -Dcuda=enabled with the CUDA toolkit)", name);
}

#else

int mep_cuda_available(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n > 0;
}

/* The first CUDA collective of comm: every rank makes its state, and the
 * kernel path when the configuration allows and every rank can take it. */
static int cuda_state(mep_comm_t *comm, mep__cuda_t **out) {
  if (comm->cuda) return *out = comm->cuda, MEP_OK;
  if (!mep_cuda_available())
    return mep__err(MEP_ERR_UNSUPPORTED, "no CUDA device is usable here");
  mep__cuda_t *cu = calloc(1, sizeof *cu);
  if (!cu) return mep__err(MEP_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&cu->mu, NULL);
  cudaGetDevice(&cu->device);
  int idx = 0;
  int rc = mep__config_choice(comm->cfg, "core", "cuda_path", &idx);
  cu->path = idx;
  comm->cuda = cu;
  if (rc) return rc;
  if (cu->path == 2) {
    snprintf(cu->why, sizeof cu->why, "[core] cuda_path = staged");
  } else {
    rc = mep__kpath_setup(comm, cu);
    if (rc < 0) return rc;
    cu->kernel_ok = rc == 1;
    if (!cu->kernel_ok && cu->path == 1)
      return mep__err(MEP_ERR_UNSUPPORTED, "[core] cuda_path = kernel, but "
                      "%s", cu->why);
  }
  if (cu->kernel_ok)
    mep__info("CUDA collectives: kernels on the peers' memory");
  else
    mep__info("CUDA collectives: staged through host memory (%s)", cu->why);
  *out = cu;
  return MEP_OK;
}

const char *mep_cuda_path(mep_comm_t *comm) {
  mep__cuda_t *cu;
  if (!comm || cuda_state(comm, &cu)) return NULL;
  return cu->kernel_ok ? "kernel" : "staged";
}

void mep__cuda_fini(mep_comm_t *comm) {
  mep__cuda_t *cu = comm->cuda;
  if (!cu) return;
  cudaSetDevice(cu->device);
  mep__stage_free(cu);
  mep__kpath_free(comm, cu);
  pthread_mutex_destroy(&cu->mu);
  free(cu);
  comm->cuda = NULL;
}

static int run(mep_comm_t *comm, mep__cuda_op_t *op, mep_req_t **req,
               const char *name) {
  if (req) *req = NULL;
  int rc = check_op(comm, op, name);
  if (rc) return rc;
  if (!comm->cuda && !mep_cuda_available())
    return mep__err(MEP_ERR_UNSUPPORTED, "%s: no CUDA device is usable here",
                    name);
  if (op->count) {
    /* in place (broadcast, mostly all-reduce): one driver call, not two */
    if (op->send && op->send != op->recv &&
        (rc = mep__cuda_check_ptr(op->send, "the send buffer")))
      return mep__err_wrap(rc, "%s", name);
    if ((rc = mep__cuda_check_ptr(op->recv, "the receive buffer")))
      return mep__err_wrap(rc, "%s", name);
  }
  mep__cuda_t *cu;
  if ((rc = cuda_state(comm, &cu))) return mep__err_wrap(rc, "%s", name);
  pthread_mutex_lock(&cu->mu);
  if (cu->kernel_ok && mep__kpath_stale(comm, cu)) {
    /* ranks joined: every rank set its group up again after the
     * recovery's barrier, so this is collective too */
    mep__kpath_retire(comm, cu);
    rc = mep__kpath_setup(comm, cu);
    cu->kernel_ok = rc == 1;
    if (rc > 0) rc = MEP_OK;
  }
  if (rc == MEP_OK) {
    if (cu->kernel_ok)
      rc = mep__kpath_run(comm, cu, op, req);
    else if (mep__cuda_capturing(op->stream))
      rc = mep__err(MEP_ERR_UNSUPPORTED, "the staged path (%s) cannot run "
                    "under CUDA graph capture", cu->why);
    else
      rc = mep__stage_run(comm, cu, op, req);
  }
  pthread_mutex_unlock(&cu->mu);
  return rc < 0 ? mep__err_wrap(rc, "%s", name) : rc;
}

#endif

int mep_allreduce_cuda(mep_comm_t *comm, const void *send, void *recv,
                       size_t count, mep_dtype_t dtype, mep_op_t op,
                       void *stream, mep_req_t **req) {
  mep__cuda_op_t o = {.kind = MEP__COLL_ALLREDUCE, .send = send, .recv = recv,
                      .count = count, .dtype = dtype, .op = op, .root = -1,
                      .stream = stream};
  return run(comm, &o, req, "mep_allreduce_cuda");
}

int mep_allgather_cuda(mep_comm_t *comm, const void *send, void *recv,
                       size_t count, mep_dtype_t dtype, void *stream,
                       mep_req_t **req) {
  mep__cuda_op_t o = {.kind = MEP__COLL_ALLGATHER, .send = send, .recv = recv,
                      .count = count, .dtype = dtype, .root = -1,
                      .stream = stream};
  return run(comm, &o, req, "mep_allgather_cuda");
}

int mep_reduce_scatter_cuda(mep_comm_t *comm, const void *send, void *recv,
                            size_t count, mep_dtype_t dtype, mep_op_t op,
                            void *stream, mep_req_t **req) {
  mep__cuda_op_t o = {.kind = MEP__COLL_REDUCE_SCATTER, .send = send,
                      .recv = recv, .count = count, .dtype = dtype, .op = op,
                      .root = -1, .stream = stream};
  return run(comm, &o, req, "mep_reduce_scatter_cuda");
}

int mep_alltoall_cuda(mep_comm_t *comm, const void *send, void *recv,
                      size_t count, mep_dtype_t dtype, void *stream,
                      mep_req_t **req) {
  mep__cuda_op_t o = {.kind = MEP__COLL_ALLTOALL, .send = send, .recv = recv,
                      .count = count, .dtype = dtype, .root = -1,
                      .stream = stream};
  return run(comm, &o, req, "mep_alltoall_cuda");
}

int mep_broadcast_cuda(mep_comm_t *comm, void *buf, size_t count,
                       mep_dtype_t dtype, int root, void *stream,
                       mep_req_t **req) {
  mep__cuda_op_t o = {.kind = MEP__COLL_BROADCAST, .send = buf, .recv = buf,
                      .count = count, .dtype = dtype, .root = root,
                      .stream = stream};
  return run(comm, &o, req, "mep_broadcast_cuda");
}
