/* cuda_stage.c - CUDA collectives through pinned host memory, for routes
 * that carry no device memory (tcp, or peers on other hosts).
 *
 * On the caller's stream: the input is copied to pinned memory and an
 * event recorded; the stream then waits (cuStreamWaitValue32) until a
 * mapped flag reaches the op's sequence number, and copies the output
 * back. On the host: the host collective is submitted at once, so it takes
 * its place among the communicator's collectives in call order, but the
 * engine holds it at the head of the queue until the copy-in event passed
 * (req.h's gate); when it finishes, whatever the outcome, the flag is
 * raised. Neither the calling thread nor the progress thread ever blocks
 * on the GPU. The host collective goes through mep__coll_submit (coll.h),
 * which hands the gate to the engine with the request.
 *
 * Buffers and events belong to a job; a job is reused once the stream
 * passed its copy-out. */
#ifdef MEP_HAVE_CUDA
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "cudapath.h"
#include "error.h"
#include "log.h"
#include "req.h"

typedef CUresult (*wait_value_fn)(CUstream, CUdeviceptr, cuuint32_t,
                                  unsigned int);

typedef struct job {
  struct mep__stage *st;
  uint8_t *host;       /* pinned: in_cap bytes of input, then output */
  size_t cap;
  cudaEvent_t in_done, out_done;
  uint32_t seq;
  _Atomic int armed;   /* the copy-in is enqueued: the gate may look */
  _Atomic int settled; /* the host collective finished */
  int used;            /* handed out, its copy-out maybe still pending */
  struct job *next;
} job_t;

struct mep__stage {
  int device;              /* the progress thread queries events on it */
  volatile uint32_t *flag; /* pinned, mapped */
  uint32_t seq;            /* of the last op enqueued */
  wait_value_fn wait_value;
  job_t *jobs;
};

static int stage_init(mep__cuda_t *cu) {
  struct mep__stage *st = calloc(1, sizeof *st);
  if (!st) return mep__err(MEP_ERR_NOMEM, "out of memory");
  cu->st = st; /* freed again below if a step fails */
  st->device = cu->device;
  cudaError_t e = cudaHostAlloc((void **)&st->flag, sizeof *st->flag,
                                cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess)
    return mep__cuda_err(e, "the staged path's flag: cudaHostAlloc");
  *st->flag = 0;
  enum cudaDriverEntryPointQueryResult q;
  void *fn = NULL;
  e = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000,
                                       cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn)
    return mep__err(MEP_ERR_UNSUPPORTED, "the staged path needs "
                    "cuStreamWaitValue32, which this driver does not give "
                    "(%s)", cudaGetErrorString(e));
  memcpy(&st->wait_value, &fn, sizeof fn); /* object to function pointer */
  return MEP_OK;
}

static void job_free(job_t *j) {
  if (j->in_done) cudaEventDestroy(j->in_done);
  if (j->out_done) cudaEventDestroy(j->out_done);
  if (j->host) cudaFreeHost(j->host);
  free(j);
}

/* A job whose copy-out the stream passed (or a new one), with room for
 * `bytes`. Growing frees the old buffer: cudaFreeHost would wait for the
 * device, so only buffers no stream uses any more are freed. */
static int job_get(struct mep__stage *st, size_t bytes, job_t **out) {
  job_t *j = NULL;
  for (job_t *c = st->jobs; c && !j; c = c->next)
    if (!c->used || (atomic_load(&c->settled) &&
                     cudaEventQuery(c->out_done) == cudaSuccess))
      j = c;
  cudaGetLastError();
  if (!j) {
    j = calloc(1, sizeof *j);
    if (!j) return mep__err(MEP_ERR_NOMEM, "out of memory");
    cudaError_t e = cudaEventCreateWithFlags(&j->in_done,
                                             cudaEventDisableTiming);
    if (e == cudaSuccess)
      e = cudaEventCreateWithFlags(&j->out_done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      job_free(j);
      return mep__cuda_err(e, "the staged path: cudaEventCreate");
    }
    j->st = st;
    j->next = st->jobs;
    st->jobs = j;
  }
  if (j->cap < bytes) {
    if (j->host) cudaFreeHost(j->host);
    j->host = NULL;
    j->cap = 0;
    cudaError_t e = cudaHostAlloc((void **)&j->host, bytes,
                                  cudaHostAllocPortable);
    if (e != cudaSuccess)
      return mep__cuda_err(e, "the staged path: cudaHostAlloc of %zu bytes",
                           bytes);
    j->cap = bytes;
  }
  j->used = 1;
  atomic_store(&j->armed, 0);
  atomic_store(&j->settled, 0);
  *out = j;
  return MEP_OK;
}

/* Engine (req.h): the host collective may start once its input is in. */
static int gate(void *arg) {
  job_t *j = arg;
  if (!atomic_load_explicit(&j->armed, memory_order_acquire)) return 0;
  cudaSetDevice(j->st->device);
  cudaError_t e = cudaEventQuery(j->in_done);
  if (e == cudaErrorNotReady) return 0;
  if (e != cudaSuccess) cudaGetLastError(); /* the stream failed: go on */
  return 1;
}

/* Engine: the host collective finished; the stream may copy out. */
static void settled(mep_req_t *req, void *arg) {
  (void)req;
  job_t *j = arg;
  atomic_store(&j->settled, 1);
  __atomic_store_n(j->st->flag, j->seq, __ATOMIC_RELEASE);
}

static int host_coll(mep_comm_t *comm, const mep__cuda_op_t *op,
                     const void *in, void *out, job_t *j, mep_req_t **req) {
  switch (op->kind) {
  case MEP__COLL_ALLREDUCE:
  case MEP__COLL_ALLGATHER:
  case MEP__COLL_REDUCE_SCATTER:
  case MEP__COLL_ALLTOALL:
  case MEP__COLL_BROADCAST: /* its buffer: out */
    break;
  default:
    return mep__err(MEP_ERR_INVALID, "collective %d on CUDA memory",
                    op->kind);
  }
  mep__coll_call_t call = {.kind = op->kind, .send = in, .recv = out,
                           .count = op->count, .dtype = op->dtype,
                           .op = op->op, .root = op->root};
  mep__req_hooks_t hooks = {.gate = gate, .on_settle = settled, .arg = j};
  return mep__coll_submit(comm, &call, &hooks, req);
}

/* The stream's part: copy in, the event the gate waits for, the wait on
 * the flag, copy out. */
static int enqueue(struct mep__stage *st, job_t *j, const mep__cuda_op_t *op,
                   size_t in_b, size_t out_b, uint8_t *hout) {
  cudaStream_t s = (cudaStream_t)op->stream;
  cudaError_t e = cudaSuccess;
  const void *src = op->kind == MEP__COLL_BROADCAST ? op->recv : op->send;
  uint8_t *hin = op->kind == MEP__COLL_BROADCAST ? hout : j->host;
  if (in_b) e = cudaMemcpyAsync(hin, src, in_b, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaEventRecord(j->in_done, s);
  atomic_store_explicit(&j->armed, 1, memory_order_release);
  if (e != cudaSuccess) return mep__cuda_err(e, "the staged copy in");
  CUresult r = st->wait_value((CUstream)s, (CUdeviceptr)(uintptr_t)st->flag,
                              j->seq, CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS)
    return mep__err(MEP_ERR_SYSTEM, "cuStreamWaitValue32 on the staged "
                    "path's flag failed (CUresult %d)", (int)r);
  if (out_b) e = cudaMemcpyAsync(op->recv, hout, out_b,
                                 cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaEventRecord(j->out_done, s);
  return e == cudaSuccess ? MEP_OK : mep__cuda_err(e, "the staged copy out");
}

int mep__stage_run(mep_comm_t *comm, mep__cuda_t *cu,
                   const mep__cuda_op_t *op, mep_req_t **req) {
  int rc = cu->st ? MEP_OK : stage_init(cu);
  if (rc) {
    mep__stage_free(cu);
    return rc;
  }
  struct mep__stage *st = cu->st;
  size_t in_b = mep__cuda_in_bytes(comm, op);
  size_t out_b = mep__cuda_out_bytes(comm, op);
  size_t in_cap = (in_b + 63) & ~(size_t)63;
  job_t *j = NULL;
  if ((rc = job_get(st, in_cap + out_b + 1, &j))) return rc;
  uint8_t *hout = j->host + in_cap;
  j->seq = st->seq + 1;
  /* Submitted first, held by the gate: if it cannot be submitted nothing
   * goes on the stream, and the flag keeps counting only real ops. */
  mep_req_t *hreq = NULL;
  rc = host_coll(comm, op, op->kind == MEP__COLL_ALLREDUCE &&
                 op->send == op->recv ? hout : j->host, hout, j, &hreq);
  if (rc < 0) {
    j->used = 0;
    return rc;
  }
  st->seq = j->seq;
  /* In place: the input goes straight to the output half. */
  if (op->kind == MEP__COLL_ALLREDUCE && op->send == op->recv) {
    mep__cuda_op_t o = *op;
    o.kind = MEP__COLL_BROADCAST; /* copy in to hout */
    rc = enqueue(st, j, &o, in_b, out_b, hout);
  } else {
    rc = enqueue(st, j, op, in_b, out_b, hout);
  }
  /* Without a req (or after a failure here) it finishes, and raises the
   * flag, on its own. */
  if (req && rc == MEP_OK)
    *req = hreq;
  else
    mep_req_free(hreq);
  return rc;
}

void mep__stage_free(mep__cuda_t *cu) {
  struct mep__stage *st = cu->st;
  if (!st) return;
  /* the engine is closed: every job settled; a stream still waiting
   * anyway (a job that failed to enqueue its copy-in) goes on */
  if (st->flag) __atomic_store_n(st->flag, UINT32_MAX, __ATOMIC_RELEASE);
  while (st->jobs) {
    job_t *j = st->jobs;
    st->jobs = j->next;
    job_free(j);
  }
  if (st->flag) cudaFreeHost((void *)st->flag);
  free(st);
  cu->st = NULL;
}
#endif
