/* devwin.c - the device window (mep/device.h): creation, destruction and
 * accessors. The proxy thread that serves MEP_DEV_PROXY peers is in
 * devwin_proxy.c; the nvlink steps shared with the kernel path are in
 * cuda_share.c.
 *
 * Creation is collective and goes in three steps, each ended by a host
 * all-reduce so that every rank learns whether another failed and all
 * fail together (nobody is left waiting for a key that never comes):
 *  1. local: the device part, the kind of each peer, the nvlink
 *     registration; agree on a serial for the store keys, on `bytes` and
 *     on whether any pair of the group needs the proxy;
 *  2. publish the nvlink key; allocate the host part and the ring;
 *  3. register the host part (collective in order: every rank does it or
 *     none), import and map the peers, start the proxy, copy the
 *     descriptor to the device. The last all-reduce is also the barrier
 *     after which a peer may write into parts their owners have zeroed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mep/device.h"

#include "error.h"

#ifndef MEP_HAVE_CUDA

static int no_cuda(const char *fn) {
  return mep__err(MEP_ERR_UNSUPPORTED, "%s: this libmep was built without "
                  "CUDA (meson -Dcuda=enabled with the CUDA toolkit)", fn);
}

int mep_devwin_create(mep_comm_t *comm, size_t bytes, mep_devwin_t **out) {
  (void)comm;
  (void)bytes;
  if (out) *out = NULL;
  return no_cuda("mep_devwin_create");
}

int mep_devwin_drain(mep_devwin_t *win) {
  return win ? no_cuda("mep_devwin_drain")
             : mep__err(MEP_ERR_INVALID, "mep_devwin_drain: NULL window");
}

int mep_devwin_destroy(mep_devwin_t *win) {
  return win ? no_cuda("mep_devwin_destroy") : MEP_OK;
}

const mep_dev_win_t *mep_devwin_device(const mep_devwin_t *win) {
  (void)win;
  no_cuda("mep_devwin_device");
  return NULL;
}

void *mep_devwin_dev_base(const mep_devwin_t *win) {
  (void)win;
  no_cuda("mep_devwin_dev_base");
  return NULL;
}

void *mep_devwin_host_base(const mep_devwin_t *win) {
  (void)win;
  no_cuda("mep_devwin_host_base");
  return NULL;
}

size_t mep_devwin_bytes(const mep_devwin_t *win) {
  (void)win;
  no_cuda("mep_devwin_bytes");
  return 0;
}

int mep_devwin_kind(const mep_devwin_t *win, int peer) {
  (void)win;
  (void)peer;
  return no_cuda("mep_devwin_kind");
}

int mep_devwin_proxy_error(const mep_devwin_t *win, char *msg, size_t len) {
  (void)win;
  int rc = no_cuda("mep_devwin_proxy_error");
  if (msg && len) snprintf(msg, len, "%s", mep_last_error());
  return rc;
}

#else

#include <cuda_runtime_api.h>

#include "comm.h"
#include "cuda_share.h"
#include "cudapath.h"
#include "devwin.h"
#include "log.h"
#include "region.h"

#define RING_SLOTS 4096u

struct mep_devwin {
  mep_comm_t *comm;
  int device;
  int rank, size;
  size_t bytes;
  uint64_t serial;           /* of the store keys, agreed by all ranks */
  int tp;                    /* nvlink in comm->tps, or -1 */
  int32_t *kind;             /* [size] */
  uint8_t **peer;            /* [size]: mapped device parts, own: dev_base */
  mep_tp_ep_t **eps;         /* [size]: nvlink's, shared with the comm */
  mep_tp_rmr_t **rmrs;       /* [size] */
  void *dev_base;
  mep_tp_mr_t *mr;
  uint8_t rkey[MEP_TP_MAX_RKEY];
  size_t rkey_len;
  void *host_base;           /* NULL when the group needs no proxy */
  mep_region_t *region;
  mep_dev_cmd_t *ring;
  uint32_t ring_len;
  uint64_t *done;            /* pinned, mapped */
  uint32_t *failed;          /* pinned, mapped */
  unsigned long long *tail;  /* device */
  int32_t *dkind;            /* device [size] */
  uint8_t **dpeer;           /* device [size] */
  mep_dev_win_t *ddesc;      /* device */
  mep__proxy_t *proxy;
};

/* Windows this process created, for store keys; the ranks agree on the
 * largest of theirs (a process may hold windows of other communicators). */
static uint64_t next_serial;

static void free_win(mep_devwin_t *w) {
  mep_comm_t *comm = w->comm;
  if (w->region) mep_region_deregister(w->region);
  /* nvlink hands out one ep per peer process, the communicator's own
   * route among them: unimport here, close only with the communicator. */
  mep__tp_t *tp = w->tp >= 0 ? &comm->tps[w->tp] : NULL;
  for (int p = 0; tp && w->rmrs && p < w->size; p++)
    if (w->rmrs[p]) tp->vt->unimport(w->eps[p], w->rmrs[p]);
  if (tp && w->mr) tp->vt->dereg(tp->ctx, w->mr);
  if (w->dev_base) cudaFree(w->dev_base);
  if (w->tail) cudaFree(w->tail);
  if (w->dkind) cudaFree(w->dkind);
  if (w->dpeer) cudaFree(w->dpeer);
  if (w->ddesc) cudaFree(w->ddesc);
  if (w->host_base) cudaFreeHost(w->host_base);
  if (w->ring) cudaFreeHost(w->ring);
  if (w->done) cudaFreeHost(w->done);
  if (w->failed) cudaFreeHost(w->failed);
  cudaGetLastError();
  free(w->kind);
  free(w->peer);
  free(w->eps);
  free(w->rmrs);
  free(w);
}

static int pinned(void **p, size_t bytes, const char *what) {
  cudaError_t e = cudaHostAlloc(p, bytes, cudaHostAllocMapped |
                                              cudaHostAllocPortable);
  if (e != cudaSuccess) {
    *p = NULL;
    return mep__cuda_err(e, "device window: %zu bytes of pinned host memory "
                         "for %s", bytes, what);
  }
  memset(*p, 0, bytes);
  return MEP_OK;
}

/* The device part (zeroed), the ring's counters, each peer's kind and the
 * nvlink registration. Sets *need when a peer of this rank needs the
 * proxy. */
static int local_part(mep_devwin_t *w, const uint8_t *act, int *need) {
  mep_comm_t *comm = w->comm;
  cudaError_t e = cudaMalloc(&w->dev_base, w->bytes);
  if (e != cudaSuccess) {
    w->dev_base = NULL;
    return mep__cuda_err(e, "device window: %zu bytes of device memory on "
                         "GPU %d", w->bytes, w->device);
  }
  e = cudaMalloc((void **)&w->tail, sizeof *w->tail);
  if (e != cudaSuccess) w->tail = NULL;
  if (e == cudaSuccess) e = cudaMemset(w->dev_base, 0, w->bytes);
  if (e == cudaSuccess) e = cudaMemset(w->tail, 0, sizeof *w->tail);
  if (e == cudaSuccess) e = cudaStreamSynchronize(NULL);
  if (e != cudaSuccess)
    return mep__cuda_err(e, "device window: clearing its device part");
  int rc = pinned((void **)&w->done, sizeof *w->done, "the ring's counter");
  if (!rc) rc = pinned((void **)&w->failed, sizeof *w->failed, "its flag");
  if (rc) return rc;
  w->tp = mep__cu_nvlink_index(comm);
  int mapped_peers = 0;
  *need = 0;
  for (int p = 0; p < w->size; p++) {
    char why[160];
    if (p == w->rank) {
      w->kind[p] = MEP_DEV_PTR;
      w->peer[p] = w->dev_base;
    } else if (act[p] && w->tp >= 0 &&
               mep__cu_nvlink_reaches(comm, w->tp, p, why, sizeof why)) {
      w->kind[p] = MEP_DEV_PTR;
      mapped_peers++;
    } else {
      /* a rank outside the active set is not sent to: it needs no proxy */
      w->kind[p] = MEP_DEV_PROXY;
      if (act[p]) *need = 1;
      if (act[p] && w->tp >= 0)
        mep__debug("device window: rank %d through the proxy: %s", p, why);
    }
  }
  if (!mapped_peers) return MEP_OK;
  mep__tp_t *tp = &comm->tps[w->tp];
  w->rkey_len = sizeof w->rkey;
  mep__err_clear();
  rc = tp->vt->reg(tp->ctx, w->dev_base, w->bytes, MEP_MEM_CUDA, &w->mr,
                   w->rkey, &w->rkey_len);
  if (rc == MEP_OK && w->rkey_len > sizeof w->rkey)
    rc = mep__err(MEP_ERR_PROTOCOL, "remote key of %zu bytes", w->rkey_len);
  return rc ? mep__err_wrap(rc, "device window: register its device part "
                            "with nvlink")
            : MEP_OK;
}

/* The host part, mapped into the GPU, and the ring. */
static int host_part(mep_devwin_t *w) {
  w->ring_len = RING_SLOTS;
  int rc = pinned(&w->host_base, w->bytes, "its host part");
  if (!rc) rc = pinned((void **)&w->ring, w->ring_len * sizeof *w->ring,
                       "the proxy's ring");
  return rc;
}

/* What the kernels read: the per-peer arrays and the descriptor. */
static int descriptor(mep_devwin_t *w) {
  size_t n = (size_t)w->size;
  mep_dev_win_t d;
  memset(&d, 0, sizeof d);
  cudaError_t e = cudaMalloc((void **)&w->dkind, n * sizeof *w->dkind);
  if (e != cudaSuccess) w->dkind = NULL;
  if (e == cudaSuccess) e = cudaMalloc((void **)&w->dpeer, n * sizeof *w->dpeer);
  if (e != cudaSuccess) w->dpeer = NULL;
  if (e == cudaSuccess) e = cudaMalloc((void **)&w->ddesc, sizeof *w->ddesc);
  if (e != cudaSuccess) w->ddesc = NULL;
  void *host = NULL, *ring = NULL, *done = NULL, *failed = NULL;
  if (e == cudaSuccess && w->host_base)
    e = cudaHostGetDevicePointer(&host, w->host_base, 0);
  if (e == cudaSuccess && w->ring)
    e = cudaHostGetDevicePointer(&ring, w->ring, 0);
  if (e == cudaSuccess) e = cudaHostGetDevicePointer(&done, w->done, 0);
  if (e == cudaSuccess) e = cudaHostGetDevicePointer(&failed, w->failed, 0);
  if (e != cudaSuccess)
    return mep__cuda_err(e, "device window: its descriptor");
  d.version = MEP_DEV_WIN_VERSION;
  d.rank = w->rank;
  d.size = w->size;
  d.ring_len = w->host_base ? w->ring_len : 0;
  d.bytes = w->bytes;
  d.dev_base = w->dev_base;
  d.host_base = host;
  d.kind = w->dkind;
  d.peer = w->dpeer;
  d.ring = ring;
  d.ring_tail = w->tail;
  d.ring_done = done;
  d.proxy_failed = failed;
  e = cudaMemcpy(w->dkind, w->kind, n * sizeof *w->dkind,
                 cudaMemcpyHostToDevice);
  if (e == cudaSuccess)
    e = cudaMemcpy(w->dpeer, w->peer, n * sizeof *w->dpeer,
                   cudaMemcpyHostToDevice);
  if (e == cudaSuccess)
    e = cudaMemcpy(w->ddesc, &d, sizeof d, cudaMemcpyHostToDevice);
  return e == cudaSuccess ? MEP_OK
                          : mep__cuda_err(e, "device window: its descriptor");
}

/* Step 3 after the host part's registration: the peers and the proxy. */
static int connect_peers(mep_devwin_t *w, const uint8_t *act) {
  mep_comm_t *comm = w->comm;
  for (int p = 0; p < w->size; p++) {
    if (p == w->rank || !act[p]) continue;
    int rc = MEP_OK;
    if (w->kind[p] == MEP_DEV_PTR) {
      void *mapped = NULL;
      mep__err_clear();
      rc = mep__cu_import_peer(comm, w->tp, "devwin", w->serial, p,
                               &w->eps[p], &w->rmrs[p], &mapped);
      w->peer[p] = mapped;
      if (rc)
        return mep__err_wrap(rc, "device window: rank %d's device part", p);
    } else {
      /* imported now, so the proxy's first put does not wait on the store */
      mep__remote_t *rem;
      rc = mep__region_remote(w->region, p, &rem);
      if (rc)
        return mep__err_wrap(rc, "device window: rank %d's host part", p);
    }
  }
  if (!w->host_base) return MEP_OK;
  return mep__proxy_start(comm, w->region, w->ring, w->ring_len, w->done,
                          w->failed, &w->proxy);
}

/* A step's end: every rank says whether it failed (MAX of the flags). */
static int agree(mep_comm_t *comm, int64_t *v, int n, const char *step) {
  int rc = mep_allreduce(comm, v, v, (size_t)n, MEP_INT64, MEP_MAX, NULL);
  return rc < 0 ? mep__err_wrap(rc, "device window: %s", step) : MEP_OK;
}

/* Ends a failed creation: this rank's own error, else the group's. */
static int fail(mep_devwin_t *w, int rc, const char *msg) {
  char m[1024];
  snprintf(m, sizeof m, "%s", msg);
  if (w->proxy) mep__proxy_stop(w->proxy, 0);
  free_win(w);
  return mep__err(rc, "%s", m);
}

static int create(mep_devwin_t *w, const uint8_t *act) {
  mep_comm_t *comm = w->comm;
  char msg[1024] = "";
  int need = 0;
  int rc = local_part(w, act, &need);
  if (rc) snprintf(msg, sizeof msg, "%s", mep_last_error());
  uint64_t mine = __atomic_load_n(&next_serial, __ATOMIC_RELAXED);
  int64_t v[5] = {(int64_t)mine, (int64_t)w->bytes, -(int64_t)w->bytes, need,
                  rc != 0};
  int arc = agree(comm, v, 5, "agreeing on its size");
  if (rc) return fail(w, rc, msg);
  if (arc) return fail(w, arc, mep_last_error());
  if (v[4])
    return fail(w, MEP_ERR_SYSTEM, "device window: another rank failed to "
                "create its part (its mep_last_error says why)");
  if (v[1] != -v[2]) {
    snprintf(msg, sizeof msg, "mep_devwin_create: the ranks asked for "
             "different sizes (%lld to %lld bytes; this rank %zu)",
             (long long)-v[2], (long long)v[1], w->bytes);
    return fail(w, MEP_ERR_MISMATCH, msg);
  }
  w->serial = (uint64_t)v[0];
  /* later windows of this process get a larger serial on every rank */
  uint64_t cur = mine;
  while (cur <= w->serial &&
         !__atomic_compare_exchange_n(&next_serial, &cur, w->serial + 1, 0,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }

  if (w->mr)
    rc = mep__cu_publish_key(comm, "devwin", w->serial, w->rkey, w->rkey_len);
  if (rc) mep__err_wrap(rc, "device window: publishing its nvlink key");
  if (!rc && v[3]) rc = host_part(w);
  if (rc) snprintf(msg, sizeof msg, "%s", mep_last_error());
  int64_t f = rc != 0;
  arc = agree(comm, &f, 1, "allocating its parts");
  if (rc) return fail(w, rc, msg);
  if (arc) return fail(w, arc, mep_last_error());
  if (f)
    return fail(w, MEP_ERR_SYSTEM, "device window: another rank failed to "
                "allocate its parts (its mep_last_error says why)");

  /* every rank registers (or none, above): region ids stay in step */
  if (w->host_base)
    rc = mep_region_register(comm, w->host_base, w->bytes, MEP_MEM_HOST,
                             &w->region);
  if (rc) mep__err_wrap(rc, "device window: registering its host part");
  if (!rc) rc = connect_peers(w, act);
  if (!rc) rc = descriptor(w);
  if (rc) snprintf(msg, sizeof msg, "%s", mep_last_error());
  f = rc != 0;
  arc = agree(comm, &f, 1, "connecting the peers");
  if (rc) return fail(w, rc, msg);
  if (arc) return fail(w, arc, mep_last_error());
  if (f)
    return fail(w, MEP_ERR_SYSTEM, "device window: another rank failed to "
                "connect its peers (its mep_last_error says why)");
  return MEP_OK;
}

int mep_devwin_create(mep_comm_t *comm, size_t bytes, mep_devwin_t **out) {
  if (out) *out = NULL;
  if (!comm || !out)
    return mep__err(MEP_ERR_INVALID, "mep_devwin_create: NULL argument");
  if (!bytes)
    return mep__err(MEP_ERR_INVALID, "mep_devwin_create: a window of 0 "
                    "bytes");
  if (!mep_cuda_available())
    return mep__err(MEP_ERR_UNSUPPORTED, "mep_devwin_create: no CUDA device "
                    "is usable here");
  mep_devwin_t *w = calloc(1, sizeof *w);
  uint8_t *act = calloc((size_t)comm->max_size, 1);
  size_t n = (size_t)comm->size;
  if (w) {
    w->comm = comm;
    w->tp = -1;
    w->rank = comm->rank;
    w->size = comm->size;
    w->bytes = bytes;
    w->kind = calloc(n, sizeof *w->kind);
    w->peer = calloc(n, sizeof *w->peer);
    w->eps = calloc(n, sizeof *w->eps);
    w->rmrs = calloc(n, sizeof *w->rmrs);
  }
  if (!w || !act || !w->kind || !w->peer || !w->eps || !w->rmrs) {
    free(act);
    if (w) free_win(w);
    /* the first step's agreement, so the others fail at once too */
    int64_t v[5] = {0, 0, 0, 0, 1};
    agree(comm, v, 5, "agreeing on its size");
    return mep__err(MEP_ERR_NOMEM, "mep_devwin_create: out of memory");
  }
  cudaGetDevice(&w->device);
  mep_comm_active(comm, act, comm->max_size, NULL);
  int rc = create(w, act);
  free(act);
  if (rc) return mep__err_wrap(rc, "mep_devwin_create");
  mep__info("device window of %zu bytes on GPU %d: %s", bytes, w->device,
            w->host_base ? "with the proxy" : "every peer mapped");
  *out = w;
  return MEP_OK;
}

/* Stops the proxy after the commands kernels reserved so far (they
 * finished, or the caller would not drain the window). */
static int drain(mep_devwin_t *w, const char *fn) {
  if (!w->proxy) return MEP_OK;
  int rc = MEP_OK;
  unsigned long long tail = 0;
  cudaError_t e = cudaMemcpy(&tail, w->tail, sizeof tail,
                             cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    rc = mep__cuda_err(e, "%s: reading the ring's tail", fn);
    tail = 0;
  }
  int src = mep__proxy_stop(w->proxy, tail);
  w->proxy = NULL;
  if (!rc && src) rc = mep__err_wrap(src, "%s", fn);
  return rc;
}

int mep_devwin_drain(mep_devwin_t *w) {
  if (!w) return mep__err(MEP_ERR_INVALID, "mep_devwin_drain: NULL window");
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(w->device);
  int rc = drain(w, "mep_devwin_drain");
  if (prev >= 0) cudaSetDevice(prev);
  cudaGetLastError();
  return rc;
}

int mep_devwin_destroy(mep_devwin_t *w) {
  if (!w) return MEP_OK;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(w->device);
  int rc = drain(w, "mep_devwin_destroy");
  free_win(w);
  if (prev >= 0) cudaSetDevice(prev);
  cudaGetLastError();
  return rc;
}

const mep_dev_win_t *mep_devwin_device(const mep_devwin_t *w) {
  return w ? w->ddesc : NULL;
}

void *mep_devwin_dev_base(const mep_devwin_t *w) {
  return w ? w->dev_base : NULL;
}

void *mep_devwin_host_base(const mep_devwin_t *w) {
  return w ? w->host_base : NULL;
}

size_t mep_devwin_bytes(const mep_devwin_t *w) { return w ? w->bytes : 0; }

int mep_devwin_kind(const mep_devwin_t *w, int peer) {
  if (!w) return mep__err(MEP_ERR_INVALID, "mep_devwin_kind: NULL window");
  if (peer < 0 || peer >= w->size)
    return mep__err(MEP_ERR_INVALID, "mep_devwin_kind: rank %d is not in "
                    "[0, %d)", peer, w->size);
  return w->kind[peer];
}

int mep_devwin_proxy_error(const mep_devwin_t *w, char *msg, size_t len) {
  if (msg && len) msg[0] = '\0';
  if (!w)
    return mep__err(MEP_ERR_INVALID, "mep_devwin_proxy_error: NULL window");
  return mep__proxy_error(w->proxy, msg, len);
}

#endif
