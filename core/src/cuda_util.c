/* cuda_util.c - what the entry points, the kernel and the staged path
 * share: an op's sizes, CUDA errors as mep errors, pointer and capture
 * checks. Below all three: it calls none of them. */
#ifdef MEP_HAVE_CUDA
#include <stdarg.h>
#include <stdio.h>

#include "cudapath.h"
#include "error.h"
#include "plan.h"

size_t mep__cuda_in_bytes(const mep_comm_t *comm, const mep__cuda_op_t *op) {
  size_t b = op->count * mep_dtype_size(op->dtype);
  switch (op->kind) {
  case MEP__COLL_REDUCE_SCATTER:
  case MEP__COLL_ALLTOALL:
    return b * (size_t)comm->size;
  default:
    return b;
  }
}

size_t mep__cuda_out_bytes(const mep_comm_t *comm, const mep__cuda_op_t *op) {
  size_t b = op->count * mep_dtype_size(op->dtype);
  switch (op->kind) {
  case MEP__COLL_ALLGATHER:
  case MEP__COLL_ALLTOALL:
    return b * (size_t)comm->size;
  default:
    return b;
  }
}

int mep__cuda_err(cudaError_t e, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  cudaGetLastError(); /* a non-sticky error must not fail the next call */
  return mep__err(MEP_ERR_SYSTEM, "%s: %s (%s)", what, cudaGetErrorString(e),
                  cudaGetErrorName(e));
}

int mep__cuda_capturing(void *stream) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)stream, &st) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return st != cudaStreamCaptureStatusNone;
}

int mep__cuda_check_ptr(const void *ptr, const char *what) {
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return mep__err(MEP_ERR_INVALID, "%s %p is not CUDA memory (%s)", what,
                    ptr, cudaGetErrorString(e));
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    return mep__err(MEP_ERR_INVALID, "%s %p is %s memory, not CUDA device "
                    "memory (use the host collectives for host memory)",
                    what, ptr, a.type == cudaMemoryTypeHost ? "pinned host"
                                                            : "host");
  int dev = -1;
  cudaGetDevice(&dev);
  if (a.type == cudaMemoryTypeDevice && a.device != dev)
    return mep__err(MEP_ERR_INVALID, "%s %p lives on GPU %d, the current "
                    "device is %d (cudaSetDevice first)", what, ptr,
                    a.device, dev);
  return MEP_OK;
}
#endif
