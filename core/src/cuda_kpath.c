/* cuda_kpath.c - CUDA collectives as kernels on the peers' memory.
 *
 * Set-up (collective, at the first CUDA collective and after ranks
 * joined): every rank checks that each active peer has a device route
 * that maps its memory (devroute.h: a transport declaring MEP_DEV_PTR),
 * and all agree (a host all-reduce) or all take the staged path. Then
 * each rank allocates a workspace, shares it through those routes
 * (devshare.h: registers it, publishes the keys, imports every peer's
 * with its descriptor), and puts the peers' mapped addresses in a device
 * table the kernels read (core/src/cuda/devcoll.h). A host barrier ends the set-up, so no kernel
 * raises a flag in a workspace its owner has not cleared yet.
 *
 * Faults: the kernels see the active set in pinned mapped memory; the host
 * only ever clears entries there (the core dropped a rank), never sets
 * them, so a rank a kernel gave up on stays out. A kernel that times out
 * on a peer sets its bit in a status word; the request of that launch reads
 * it when the stream passed the launch and reports the peer to the core,
 * whose agreement then drops it for the host side too. */
#ifdef MEP_HAVE_CUDA
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "config.h"
#include "cudapath.h"
#include "cuda/devcoll.h"
#include "devroute.h"
#include "devshare.h"
#include "error.h"
#include "ft.h"
#include "log.h"
#include "req.h"
#include "route.h"

#ifndef MEP__DC_MAX_RANKS
#define MEP__DC_MAX_RANKS 16
#endif

struct mep__kpath {
  int n;                 /* ranks of the group when it was set up */
  uint8_t *member;       /* [n] */
  const mep__devroute_t **routes; /* [n] */
  mep__devshare_t *share; /* the workspace, shared with the peers */
  void *ws;
  size_t ws_bytes;       /* the same on every rank (mep__kpath_setup) */
  int blocks;            /* per launch, the same on every rank */
  void **table;          /* device: [n] mapped workspaces */
  int32_t *active;       /* pinned, mapped: [n] */
  uint32_t *status;      /* pinned, mapped */
  uint32_t reported;     /* status bits already handed to the core */
  int launched;
  struct mep__kpath *older; /* retired groups (mep__kpath_retire) */
  mep__dc_group_t g;
};

static uint64_t generation; /* set-ups of this process, for store keys */

/* Whether every active peer has a device route that maps its memory
 * (why if not); the routes go to kp->routes. */
static int reaches_all(mep_comm_t *comm, mep__cuda_t *cu, const uint8_t *act,
                       const mep__devroute_t **routes) {
  if (comm->size > MEP__DC_MAX_RANKS) {
    snprintf(cu->why, sizeof cu->why, "the kernels take at most %d ranks, "
             "the group has %d", MEP__DC_MAX_RANKS, comm->size);
    return 0;
  }
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank || !act[p]) continue;
    char why[512];
    int rc = mep__devroute_get(comm, p, MEP__DEV_KINDS(MEP_DEV_PTR),
                               &routes[p], why, sizeof why);
    if (rc == MEP_ERR_UNREACHABLE)
      snprintf(cu->why, sizeof cu->why, "no transport maps rank %d's "
               "memory for kernels: %.190s", p, why);
    else if (rc)
      snprintf(cu->why, sizeof cu->why, "rank %d's device route: %.200s", p,
               mep_last_error());
    if (rc) return 0;
  }
  return 1;
}

static int alloc_kp(mep_comm_t *comm, struct mep__kpath *kp) {
  kp->n = comm->size;
  size_t n = (size_t)kp->n;
  kp->member = calloc(n, 1);
  if (!kp->member) return mep__err(MEP_ERR_NOMEM, "out of memory");
  int rc;
  cudaError_t e = cudaMalloc(&kp->ws, kp->ws_bytes);
  if (e == cudaSuccess) e = cudaMalloc((void **)&kp->table, n * sizeof(void *));
  if (e == cudaSuccess)
    e = cudaHostAlloc((void **)&kp->active, n * sizeof *kp->active,
                      cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaSuccess)
    e = cudaHostAlloc((void **)&kp->status, sizeof *kp->status,
                      cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess)
    return mep__cuda_err(e, "the CUDA kernel path: %zu bytes of workspace",
                         kp->ws_bytes);
  *kp->status = 0;
  rc = mep__dc_init_ws(kp->ws, kp->ws_bytes, NULL);
  if (rc == MEP_OK && (e = cudaStreamSynchronize(NULL)) != cudaSuccess)
    rc = mep__cuda_err(e, "clearing the workspace");
  return rc;
}

/* The workspace size and blocks per launch: every rank must use the same
 * (block b of a rank pairs with block b of each peer, and the workspace
 * layouts must match). Blocks: half the GPU's multiprocessors, at most
 * 64, so a peer's kernel on the same GPU finds room at the same time. */
static int shape(mep_comm_t *comm, int64_t *ws, int64_t *blocks) {
  int rc = mep__config_known_int(comm->cfg, "core", "cuda_workspace_bytes",
                                 ws);
  if (rc) return rc;
  if (*ws < (int64_t)mep__dc_ws_min(comm->size))
    *ws = (int64_t)mep__dc_ws_min(comm->size);
  int d = 0, sms = 0;
  cudaGetDevice(&d);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d);
  *blocks = sms / 2 > 64 ? 64 : sms / 2 < 1 ? 1 : sms / 2;
  return MEP_OK;
}

static int build(mep_comm_t *comm, struct mep__kpath *kp, const uint8_t *act) {
  int rc = alloc_kp(comm, kp);
  if (!rc) rc = mep__devshare_open(comm, "kpath", generation, kp->ws,
                                   kp->ws_bytes, MEP_MEM_CUDA, kp->routes,
                                   &kp->share);
  if (rc) return mep__err_wrap(rc, "the CUDA kernel path: its workspace");
  void **host = calloc((size_t)kp->n, sizeof *host);
  if (!host) return mep__err(MEP_ERR_NOMEM, "out of memory");
  for (int p = 0; p < kp->n; p++) {
    const mep__devpeer_t *dp;
    kp->member[p] = act[p];
    kp->active[p] = act[p];
    if (p == comm->rank) {
      host[p] = kp->ws;
    } else if (act[p]) {
      rc = mep__devshare_import(kp->share, p, &dp);
      if (rc) {
        mep__err_wrap(rc, "the CUDA kernel path: rank %d's workspace", p);
        break;
      }
      host[p] = mep__devpeer_ptr(dp);
    }
  }
  cudaError_t e = cudaSuccess;
  if (!rc) e = cudaMemcpy(kp->table, host, (size_t)kp->n * sizeof *host,
                          cudaMemcpyHostToDevice);
  free(host);
  if (e != cudaSuccess) rc = mep__cuda_err(e, "the peer table");
  if (rc) return rc;
  void *dact = NULL, *dstatus = NULL;
  cudaHostGetDevicePointer(&dact, kp->active, 0);
  cudaHostGetDevicePointer(&dstatus, kp->status, 0);
  kp->g.rank = comm->rank;
  kp->g.nranks = kp->n;
  kp->g.peer_ws = (void *const *)kp->table;
  kp->g.ws_bytes = kp->ws_bytes;
  kp->g.active = dact;
  kp->g.host_active = kp->active;
  kp->g.status = dstatus;
  kp->g.timeout_ns = (uint64_t)comm->timeout_ms * 1000000u;
  kp->g.sms = kp->blocks;
  return MEP_OK;
}

int mep__kpath_setup(mep_comm_t *comm, mep__cuda_t *cu) {
  uint8_t *act = calloc((size_t)comm->max_size, 1);
  const mep__devroute_t **routes = calloc((size_t)comm->size, sizeof *routes);
  if (!act || !routes) {
    free(act);
    free(routes);
    return mep__err(MEP_ERR_NOMEM, "out of memory");
  }
  mep_comm_active(comm, act, comm->max_size, NULL);
  /* minima of: reachable, size, -size (its maximum), blocks, -blocks */
  int64_t ws = 0, blocks = 0, v[5];
  int rc = shape(comm, &ws, &blocks);
  int ok = rc == MEP_OK && reaches_all(comm, cu, act, routes);
  int64_t here[5] = {ok, ws, -ws, blocks, -blocks};
  int arc = mep_allreduce(comm, here, v, 5, MEP_INT64, MEP_MIN, NULL);
  generation++;
  if (rc || arc < 0) {
    free(act);
    free(routes);
    return rc ? rc : mep__err_wrap(arc, "agreeing on the CUDA path");
  }
  if (!v[0] || v[1] != -v[2] || v[3] != -v[4]) {
    free(routes);
    if (ok && !v[0])
      snprintf(cu->why, sizeof cu->why, "another rank has a peer whose "
               "memory no transport maps for kernels");
    else if (ok)
      snprintf(cu->why, sizeof cu->why, "the ranks differ in [core] "
               "cuda_workspace_bytes (%lld to %lld) or in their GPUs (%lld "
               "to %lld blocks per launch)", (long long)v[1],
               (long long)-v[2], (long long)v[3], (long long)-v[4]);
    free(act);
    return 0;
  }
  cu->kp = calloc(1, sizeof *cu->kp);
  if (cu->kp) {
    cu->kp->ws_bytes = (size_t)ws;
    cu->kp->blocks = (int)blocks;
    cu->kp->routes = routes;
  } else {
    free(routes);
  }
  rc = cu->kp ? build(comm, cu->kp, act)
              : mep__err(MEP_ERR_NOMEM, "out of memory");
  free(act);
  if (rc) mep__kpath_retire(comm, cu);
  /* Everyone's workspace is cleared and mapped before any kernel runs;
   * a rank that failed still comes, so nobody waits for it in vain. */
  int32_t mine = rc == MEP_OK, every = 0;
  int brc = mep_allreduce(comm, &mine, &every, 1, MEP_INT32, MEP_MIN, NULL);
  if (rc) return rc;
  if (brc < 0) return mep__err_wrap(brc, "finishing the CUDA kernel path");
  if (!every) {
    snprintf(cu->why, sizeof cu->why, "another rank failed to set the "
             "kernel path up");
    mep__kpath_retire(comm, cu);
    return 0;
  }
  return 1;
}

int mep__kpath_stale(mep_comm_t *comm, mep__cuda_t *cu) {
  struct mep__kpath *kp = cu->kp;
  if (!kp || kp->n != comm->size) return 1;
  const uint8_t *act = mep__ft_act(comm);
  for (int p = 0; p < kp->n; p++)
    if (act[p] && !kp->member[p]) return 1;
  return 0;
}

/* Clears the entries of ranks the core dropped (never sets one). */
static void refresh_active(mep_comm_t *comm, struct mep__kpath *kp) {
  pthread_mutex_lock(&comm->engine_lock);
  const uint8_t *act = mep__ft_act(comm);
  for (int p = 0; p < kp->n; p++)
    if (!act[p] && kp->active[p]) kp->active[p] = 0;
  pthread_mutex_unlock(&comm->engine_lock);
}

/* Completion events are reused: a create and a destroy per launch are two
 * driver calls on the caller's path. The pool is process-wide because a
 * finished request may be freed after its communicator; it is bounded,
 * and an event goes back only to the device it was made on. Re-recording
 * an event whose earlier record is still pending is fine: nothing else
 * waits on it once its request is gone. */
#define EV_POOL_MAX 64

static struct {
  int device;
  cudaEvent_t ev;
} ev_pool[EV_POOL_MAX];
static int ev_pool_n;
static pthread_mutex_t ev_pool_mu = PTHREAD_MUTEX_INITIALIZER;

/* An event of the current device `device`, pooled when one is free. */
static cudaError_t ev_take(int device, cudaEvent_t *ev, int *pooled) {
  pthread_mutex_lock(&ev_pool_mu);
  for (int i = ev_pool_n - 1; i >= 0; i--) {
    if (ev_pool[i].device != device) continue;
    *ev = ev_pool[i].ev;
    ev_pool[i] = ev_pool[--ev_pool_n];
    pthread_mutex_unlock(&ev_pool_mu);
    *pooled = 1;
    return cudaSuccess;
  }
  pthread_mutex_unlock(&ev_pool_mu);
  *pooled = 0;
  return cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
}

static void ev_give(int device, cudaEvent_t ev) {
  pthread_mutex_lock(&ev_pool_mu);
  if (ev_pool_n < EV_POOL_MAX) {
    ev_pool[ev_pool_n].device = device;
    ev_pool[ev_pool_n++].ev = ev;
    ev = NULL;
  }
  pthread_mutex_unlock(&ev_pool_mu);
  if (ev) cudaEventDestroy(ev);
}

/* A launch's request: finishes when the stream passed the launch. */
typedef struct launch {
  struct mep__kpath *kp;
  cudaEvent_t done;
  int device;     /* the event's */
  int failed;     /* the query failed: the event is not reused */
  uint64_t start_ns, next_ns; /* when launched; when to ask again */
} launch_t;

/* Each query takes the driver's locks, and the progress thread makes it
 * under the engine lock, both of which the calling thread needs for its
 * next launch; a launch is not over before a few microseconds anyway. So a
 * launch is first asked about QUERY_FIRST_NS after it, and after a "not
 * ready" again only after an eighth of its age (QUERY_MIN_NS to
 * QUERY_MAX_NS): a finish is seen at most that late (12%, and 20 us for
 * long ones), with a few queries per launch instead of one per round. */
#define QUERY_FIRST_NS 2000u
#define QUERY_MIN_NS 1000u
#define QUERY_MAX_NS 20000u

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* cudaEventQuery on the event's device; a thread that waits for its own
 * request (and drives progress) keeps its current device. */
static cudaError_t query(const launch_t *l) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
  if (cur != l->device) cudaSetDevice(l->device);
  cudaError_t e = cudaEventQuery(l->done);
  if (cur >= 0 && cur != l->device) cudaSetDevice(cur);
  return e;
}

static int launch_advance(mep_req_t *req) {
  launch_t *l = req->impl;
  uint64_t now = now_ns();
  if (now < l->next_ns) return 0;
  cudaError_t e = query(l);
  if (e == cudaErrorNotReady) {
    cudaGetLastError(); /* not an error: leave no trace for a launch */
    uint64_t gap = (now - l->start_ns) / 8;
    if (gap < QUERY_MIN_NS) gap = QUERY_MIN_NS;
    if (gap > QUERY_MAX_NS) gap = QUERY_MAX_NS;
    l->next_ns = now + gap;
    return 0;
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    l->failed = 1;
    mep__req_set(req, MEP_ERR_SYSTEM, "the CUDA collective kernel failed: %s",
                 cudaGetErrorString(e));
    return 1;
  }
  uint32_t bits = __atomic_load_n(l->kp->status, __ATOMIC_ACQUIRE);
  uint32_t fresh = bits & ~l->kp->reported;
  l->kp->reported |= bits;
  int n = 0;
  req->dropped = malloc((size_t)l->kp->n * sizeof *req->dropped);
  for (int p = 0; p < l->kp->n && p < 32; p++) {
    if (!(bits & (1u << p))) continue;
    if (req->dropped) req->dropped[n++] = p;
    if (fresh & (1u << p))
      mep__comm_fail_peer(req->comm, p, MEP_ERR_PEER_FAILED,
                          "it did not answer a CUDA collective kernel in "
                          "time");
  }
  req->ndropped = n;
  mep__req_set(req, n ? MEP_OK_DEGRADED : MEP_OK,
               n ? "finished over the surviving ranks" : NULL);
  return 1;
}

static void launch_cleanup(mep_req_t *req) {
  launch_t *l = req->impl;
  if (l->done && l->failed)
    cudaEventDestroy(l->done);
  else if (l->done)
    ev_give(l->device, l->done);
  free(l);
}

/* Records the launch's completion on the stream, into a pooled event when
 * one is free (a stale one, after a device reset, is replaced once). */
static cudaError_t record_done(launch_t *l, void *stream) {
  int pooled = 0;
  cudaError_t e = ev_take(l->device, &l->done, &pooled);
  if (e == cudaSuccess) e = cudaEventRecord(l->done, (cudaStream_t)stream);
  if (e != cudaSuccess && pooled) {
    cudaGetLastError();
    cudaEventDestroy(l->done);
    l->done = NULL;
    e = cudaEventCreateWithFlags(&l->done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(l->done, (cudaStream_t)stream);
  }
  if (e != cudaSuccess && l->done) {
    cudaEventDestroy(l->done);
    l->done = NULL;
  }
  return e;
}

static int track(mep_comm_t *comm, mep__cuda_t *cu, void *stream,
                 mep_req_t **out) {
  launch_t *l = calloc(1, sizeof *l);
  if (!l) return mep__err(MEP_ERR_NOMEM, "out of memory");
  l->kp = cu->kp;
  /* The event is made on the current device, where the launch went. */
  if (cudaGetDevice(&l->device) != cudaSuccess) l->device = cu->device;
  cudaError_t e = record_done(l, stream);
  if (e != cudaSuccess) {
    free(l);
    return mep__cuda_err(e, "recording the kernel's completion");
  }
  l->start_ns = now_ns();
  l->next_ns = l->start_ns + QUERY_FIRST_NS;
  mep_req_t *req = mep__req_new(comm, MEP__REQ_P2P, launch_advance, l,
                                launch_cleanup);
  if (!req) {
    ev_give(l->device, l->done);
    free(l);
    return mep__err(MEP_ERR_NOMEM, "out of memory");
  }
  mep_req_t *r = NULL;
  int rc = mep__req_start(req, &r);
  if (rc) return rc;
  if (out)
    *out = r;
  else
    mep_req_free(r); /* reports a timed-out peer on its own */
  return MEP_OK;
}

static int launch(const mep__dc_group_t *g, const mep__cuda_op_t *op) {
  switch (op->kind) {
  case MEP__COLL_ALLREDUCE:
    return mep__dc_allreduce(g, op->send, op->recv, op->count, op->dtype,
                             op->op, 0, op->stream);
  case MEP__COLL_ALLGATHER:
    return mep__dc_allgather(g, op->send, op->recv,
                             op->count * mep_dtype_size(op->dtype),
                             op->stream);
  case MEP__COLL_REDUCE_SCATTER:
    return mep__dc_reduce_scatter(g, op->send, op->recv, op->count,
                                  op->dtype, op->op, op->stream);
  case MEP__COLL_ALLTOALL:
    return mep__dc_alltoall(g, op->send, op->recv,
                            op->count * mep_dtype_size(op->dtype),
                            op->stream);
  case MEP__COLL_BROADCAST:
    return mep__dc_broadcast(g, op->recv, op->count * mep_dtype_size(op->dtype),
                             op->root, 0, op->stream);
  default:
    return mep__err(MEP_ERR_INVALID, "collective %d on CUDA memory",
                    op->kind);
  }
}

int mep__kpath_run(mep_comm_t *comm, mep__cuda_t *cu,
                   const mep__cuda_op_t *op, mep_req_t **req) {
  struct mep__kpath *kp = cu->kp;
  if (mep__ft_excluded(comm))
    return mep__err(MEP_ERR_EXCLUDED, "the other ranks dropped this one");
  refresh_active(comm, kp);
  if (op->kind == MEP__COLL_BROADCAST && !kp->active[op->root])
    return mep__err(MEP_ERR_PEER_FAILED, "the root, rank %d, is not active",
                    op->root);
  kp->launched = 1;
  int rc = launch(&kp->g, op);
  if (rc) return mep__err(rc, "%s", mep__dc_last_error());
  /* a captured launch has no request: replays are the graph's */
  if (mep__cuda_capturing(op->stream)) return MEP_OK;
  return track(comm, cu, op->stream, req);
}

static void free_kp(struct mep__kpath *kp) {
  mep__devshare_close(kp->share);
  if (kp->ws) cudaFree(kp->ws);
  if (kp->table) cudaFree(kp->table);
  if (kp->active) cudaFreeHost(kp->active);
  if (kp->status) cudaFreeHost(kp->status);
  cudaGetLastError();
  free(kp->member);
  free(kp->routes);
  free(kp);
}

/* Requests of earlier launches may still look at a retired group's status
 * word: groups are freed only with the communicator (after its engine
 * closed), or at once when no kernel ever ran on them. */
void mep__kpath_retire(mep_comm_t *comm, mep__cuda_t *cu) {
  (void)comm;
  struct mep__kpath *kp = cu->kp;
  cu->kp = NULL;
  if (!kp) return;
  if (!kp->launched) {
    free_kp(kp);
    return;
  }
  kp->older = cu->retired;
  cu->retired = kp;
}

void mep__kpath_free(mep_comm_t *comm, mep__cuda_t *cu) {
  /* kernels may still read the peer table and workspaces */
  cudaDeviceSynchronize();
  cudaGetLastError();
  mep__kpath_retire(comm, cu);
  while (cu->retired) {
    struct mep__kpath *kp = cu->retired;
    cu->retired = kp->older;
    free_kp(kp);
  }
}
#endif
