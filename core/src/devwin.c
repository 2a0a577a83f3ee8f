/* devwin.c - the device window (mep/device.h): creation, destruction and
 * accessors. The proxy thread that serves MEP_DEV_PROXY peers is in
 * devwin_proxy.c; the transport that serves kernels for a peer is its
 * device route (devroute.c), and sharing the device part with MEP_DEV_PTR
 * peers, and the host part with MEP_DEV_MLX5 ones, is devshare.c's.
 *
 * Creation is collective and goes in three steps, each ended by a host
 * all-reduce so that every rank learns whether another failed and all
 * fail together (nobody is left waiting for a key that never comes):
 *  1. local: the device part, the kind of each peer (from its device
 *     route); agree on a serial for the store keys, on `bytes` and on
 *     whether any pair of the group needs the host part;
 *  2. share the device part (register, publish the keys); allocate the
 *     host part and the ring, and share the host part;
 *  3. register the host part (collective in order: every rank does it or
 *     none), import the peers' parts with their descriptors, start the
 *     proxy, copy the descriptor to the device. The last all-reduce is also
 *     the barrier after which a peer may write into parts their owners
 *     have zeroed. */
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
#include "cudapath.h"
#include "devroute.h"
#include "devshare.h"
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
  int32_t *kind;             /* [size] */
  int nkind[MEP_DEV_PROXY + 1]; /* peers (this rank aside) of each kind */
  uint8_t **peer;            /* [size]: mapped device parts, own: dev_base */
  const mep__devroute_t **routes; /* [size]: of the MEP_DEV_PTR peers */
  const mep__devroute_t **mroutes; /* [size]: of the MEP_DEV_MLX5 peers */
  uint8_t *pdesc, *rdesc, *ldesc; /* [size][MEP_DEV_DESC_MAX]: descriptor
                                   * parts (peer, region, local) */
  mep__devshare_t *share;    /* the device part, shared with PTR peers */
  mep__devshare_t *hshare;   /* the host part, shared with MLX5 peers */
  void *dev_base;
  void *host_base;           /* NULL when the group needs no proxy */
  mep_region_t *region;
  mep_dev_cmd_t *ring;
  uint32_t ring_len;
  uint64_t *done;            /* pinned, mapped */
  uint32_t *failed;          /* pinned, mapped */
  unsigned long long *tail;  /* device */
  int32_t *dkind;            /* device [size] */
  uint8_t **dpeer;           /* device [size] */
  uint8_t *dpdesc, *drdesc, *dldesc; /* device [size][MEP_DEV_DESC_MAX] */
  mep_dev_win_t *ddesc;      /* device */
  mep__proxy_t *proxy;
};

/* Windows this process created, for store keys; the ranks agree on the
 * largest of theirs (a process may hold windows of other communicators). */
static uint64_t next_serial;

static void free_win(mep_devwin_t *w) {
  if (w->region) mep_region_deregister(w->region);
  mep__devshare_close(w->share);
  mep__devshare_close(w->hshare);
  if (w->dev_base) cudaFree(w->dev_base);
  if (w->tail) cudaFree(w->tail);
  if (w->dkind) cudaFree(w->dkind);
  if (w->dpeer) cudaFree(w->dpeer);
  if (w->dpdesc) cudaFree(w->dpdesc);
  if (w->drdesc) cudaFree(w->drdesc);
  if (w->dldesc) cudaFree(w->dldesc);
  if (w->ddesc) cudaFree(w->ddesc);
  if (w->host_base) cudaFreeHost(w->host_base);
  if (w->ring) cudaFreeHost(w->ring);
  if (w->done) cudaFreeHost(w->done);
  if (w->failed) cudaFreeHost(w->failed);
  cudaGetLastError();
  free(w->kind);
  free(w->peer);
  free(w->routes);
  free(w->mroutes);
  free(w->pdesc);
  free(w->rdesc);
  free(w->ldesc);
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

/* The device part (zeroed), the ring's counters and each peer's kind: a
 * peer whose device route stores into mapped memory is MEP_DEV_PTR, one
 * whose route has kernels post requests MEP_DEV_MLX5, any other the
 * proxy's. Sets *need when a peer of this rank needs the host part (the
 * proxy's peers and the MLX5 ones, whose requests go from this rank's
 * host part to the peer's: the one memory every transport registers). */
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
  *need = 0;
  for (int p = 0; p < w->size; p++) {
    char why[512];
    const mep__devroute_t *r = NULL;
    if (p == w->rank) {
      w->kind[p] = MEP_DEV_PTR;
      w->peer[p] = w->dev_base;
      continue;
    }
    /* a rank outside the active set is not sent to: it needs no proxy */
    rc = act[p] ? mep__devroute_get(comm, p,
                                    MEP__DEV_KINDS(MEP_DEV_PTR) |
                                        MEP__DEV_KINDS(MEP_DEV_MLX5),
                                    &r, why, sizeof why)
                : MEP_ERR_UNREACHABLE;
    if (rc && rc != MEP_ERR_UNREACHABLE)
      return mep__err_wrap(rc, "device window: rank %d's device route", p);
    w->kind[p] = r ? (int32_t)r->kind : MEP_DEV_PROXY;
    w->nkind[w->kind[p]]++;
    if (r && r->kind == MEP_DEV_PTR) w->routes[p] = r;
    if (r && r->kind == MEP_DEV_MLX5) w->mroutes[p] = r;
    if (act[p] && w->kind[p] != MEP_DEV_PTR) *need = 1;
    if (!r && act[p])
      mep__debug("device window: rank %d through the proxy: %s", p, why);
  }
  return MEP_OK;
}

/* The host part, mapped into the GPU, and the ring. */
static int host_part(mep_devwin_t *w) {
  w->ring_len = RING_SLOTS;
  int rc = pinned(&w->host_base, w->bytes, "its host part");
  if (!rc) rc = pinned((void **)&w->ring, w->ring_len * sizeof *w->ring,
                       "the proxy's ring");
  return rc;
}

/* A device copy of n bytes at src; *dst NULL when it failed. */
static cudaError_t to_device(void *dst, const void *src, size_t n) {
  void **d = dst;
  cudaError_t e = cudaMalloc(d, n);
  if (e != cudaSuccess) {
    *d = NULL;
    return e;
  }
  return cudaMemcpy(*d, src, n, cudaMemcpyHostToDevice);
}

/* What the kernels read: the per-peer arrays and the descriptor. */
static int descriptor(mep_devwin_t *w) {
  size_t n = (size_t)w->size, dn = n * MEP_DEV_DESC_MAX;
  mep_dev_win_t d;
  memset(&d, 0, sizeof d);
  void *host = NULL, *ring = NULL, *done = NULL, *failed = NULL;
  cudaError_t e = to_device(&w->dkind, w->kind, n * sizeof *w->dkind);
  if (e == cudaSuccess) e = to_device(&w->dpeer, w->peer, n * sizeof *w->peer);
  if (e == cudaSuccess) e = to_device(&w->dpdesc, w->pdesc, dn);
  if (e == cudaSuccess) e = to_device(&w->drdesc, w->rdesc, dn);
  if (e == cudaSuccess) e = to_device(&w->dldesc, w->ldesc, dn);
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
  d.peer_desc = w->dpdesc;
  d.region_desc = w->drdesc;
  d.local_desc = w->dldesc;
  e = to_device(&w->ddesc, &d, sizeof d);
  return e == cudaSuccess ? MEP_OK
                          : mep__cuda_err(e, "device window: its descriptor");
}

/* Imports peer p's part of the share its kind uses (the device part for
 * MEP_DEV_PTR, the host part for MEP_DEV_MLX5) and copies what kernels
 * need of it into the descriptor arrays. */
static int import_shared(mep_devwin_t *w, int p) {
  int ptr = w->kind[p] == MEP_DEV_PTR;
  const mep__devpeer_t *dp = NULL;
  int rc = mep__devshare_import(ptr ? w->share : w->hshare, p, &dp);
  if (rc)
    return mep__err_wrap(rc, "device window: rank %d's %s part", p,
                         ptr ? "device" : "host");
  if (ptr) w->peer[p] = mep__devpeer_ptr(dp);
  size_t at = (size_t)p * MEP_DEV_DESC_MAX;
  memcpy(w->pdesc + at, dp->route.desc, dp->route.desc_len);
  memcpy(w->rdesc + at, dp->region, dp->region_len);
  memcpy(w->ldesc + at, dp->local, dp->local_len);
  return MEP_OK;
}

/* Step 3 after the host part's registration: the peers and the proxy. */
static int connect_peers(mep_devwin_t *w, const uint8_t *act) {
  mep_comm_t *comm = w->comm;
  for (int p = 0; p < w->size; p++) {
    if (p == w->rank || !act[p]) continue;
    int rc = MEP_OK;
    if (w->kind[p] == MEP_DEV_PTR || w->kind[p] == MEP_DEV_MLX5) {
      rc = import_shared(w, p);
      if (rc) return rc;
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

/* Ends a failed creation, keeping the message that says why. */
static int fail(mep_devwin_t *w, int rc) {
  mep__errsave_t why;
  mep__err_save(&why);
  if (w->proxy) mep__proxy_stop(w->proxy, 0);
  free_win(w);
  return mep__err_restore(&why, rc);
}

/* A step's end: every rank says whether it failed (MAX of v, whose last
 * entry is this rank's failure flag). The step fails with this rank's
 * own error (rc, its message saved before the agreement ran), else the
 * agreement's, else because another rank failed. */
static int agree(mep_devwin_t *w, int rc, int64_t *v, int n,
                 const char *step) {
  mep__errsave_t mine;
  mep__err_save(&mine);
  v[n - 1] = rc != 0;
  int arc = mep_allreduce(w->comm, v, v, (size_t)n, MEP_INT64, MEP_MAX,
                          NULL);
  if (rc) return fail(w, mep__err_restore(&mine, rc));
  if (arc < 0) return fail(w, mep__err_wrap(arc, "device window: %s", step));
  if (v[n - 1])
    return fail(w, mep__err(MEP_ERR_SYSTEM, "device window: another rank "
                            "failed %s (its mep_last_error says why)", step));
  return MEP_OK;
}

static int create(mep_devwin_t *w, const uint8_t *act) {
  mep_comm_t *comm = w->comm;
  int need = 0;
  int rc = local_part(w, act, &need);
  uint64_t mine = __atomic_load_n(&next_serial, __ATOMIC_RELAXED);
  int64_t v[5] = {(int64_t)mine, (int64_t)w->bytes, -(int64_t)w->bytes, need,
                  0};
  if ((rc = agree(w, rc, v, 5, "creating its part"))) return rc;
  if (v[1] != -v[2])
    return fail(w, mep__err(MEP_ERR_MISMATCH, "mep_devwin_create: the ranks "
                            "asked for different sizes (%lld to %lld bytes; "
                            "this rank %zu)", (long long)-v[2],
                            (long long)v[1], w->bytes));
  w->serial = (uint64_t)v[0];
  /* later windows of this process get a larger serial on every rank */
  uint64_t cur = mine;
  while (cur <= w->serial &&
         !__atomic_compare_exchange_n(&next_serial, &cur, w->serial + 1, 0,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }

  rc = mep__devshare_open(comm, "devwin", w->serial, w->dev_base, w->bytes,
                          MEP_MEM_CUDA, w->routes, &w->share);
  if (rc) mep__err_wrap(rc, "device window: sharing its device part");
  if (!rc && v[3]) rc = host_part(w);
  if (!rc && w->host_base) {
    rc = mep__devshare_open(comm, "devwin-host", w->serial, w->host_base,
                            w->bytes, MEP_MEM_HOST, w->mroutes, &w->hshare);
    if (rc) mep__err_wrap(rc, "device window: sharing its host part");
  }
  int64_t f[1];
  if ((rc = agree(w, rc, f, 1, "allocating its parts"))) return rc;

  /* every rank registers (or none, above): region ids stay in step */
  if (w->host_base)
    rc = mep_region_register(comm, w->host_base, w->bytes, MEP_MEM_HOST,
                             &w->region);
  if (rc) mep__err_wrap(rc, "device window: registering its host part");
  if (!rc) rc = connect_peers(w, act);
  if (!rc) rc = descriptor(w);
  return agree(w, rc, f, 1, "connecting the peers");
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
    w->rank = comm->rank;
    w->size = comm->size;
    w->bytes = bytes;
    w->kind = calloc(n, sizeof *w->kind);
    w->peer = calloc(n, sizeof *w->peer);
    w->routes = calloc(n, sizeof *w->routes);
    w->mroutes = calloc(n, sizeof *w->mroutes);
    w->pdesc = calloc(n, MEP_DEV_DESC_MAX);
    w->rdesc = calloc(n, MEP_DEV_DESC_MAX);
    w->ldesc = calloc(n, MEP_DEV_DESC_MAX);
  }
  if (!w || !act || !w->kind || !w->peer || !w->routes || !w->mroutes ||
      !w->pdesc || !w->rdesc || !w->ldesc) {
    free(act);
    if (w) free_win(w);
    /* the first step's agreement, so the others fail at once too */
    int64_t v[5] = {0, 0, 0, 0, 1};
    mep_allreduce(comm, v, v, 5, MEP_INT64, MEP_MAX, NULL);
    return mep__err(MEP_ERR_NOMEM, "mep_devwin_create: out of memory");
  }
  cudaGetDevice(&w->device);
  mep_comm_active(comm, act, comm->max_size, NULL);
  int rc = create(w, act);
  free(act);
  if (rc) return mep__err_wrap(rc, "mep_devwin_create");
  mep__info("device window of %zu bytes on GPU %d: peers mapped %d, posted "
            "by kernels (mlx5) %d, through the proxy %d%s", bytes, w->device,
            w->nkind[MEP_DEV_PTR], w->nkind[MEP_DEV_MLX5],
            w->nkind[MEP_DEV_PROXY], w->host_base ? "; with a host part" : "");
  *out = w;
  return MEP_OK;
}

/* Waits until the NIC carried out what kernels posted to MEP_DEV_MLX5
 * peers. A peer whose queue pair failed is left to the receivers'
 * deadlines, as the proxy's dropped commands are. */
static int quiet_nic(mep_devwin_t *w, const char *fn) {
  if (!w->nkind[MEP_DEV_MLX5] || !w->ddesc) return MEP_OK;
  int ce = 0;
  int q = mep__devwin_quiet(w->ddesc, (uint64_t)w->comm->timeout_ms * 1000000u,
                            &ce);
  if (q == -1)
    return mep__err(MEP_ERR_TIMEOUT, "%s: requests GPU kernels posted to "
                    "MLX5 peers were not carried out within %d ms", fn,
                    w->comm->timeout_ms);
  if (q == -3)
    return mep__cuda_err((cudaError_t)ce, "%s: waiting for the requests "
                         "kernels posted to MLX5 peers", fn);
  if (q == -2)
    mep__info("%s: a queue pair kernels post on failed (a peer failed); "
              "its requests were dropped", fn);
  return MEP_OK;
}

/* Stops the proxy after the commands kernels reserved so far (they
 * finished, or the caller would not drain the window), once the NIC has
 * carried out what they posted. */
static int drain(mep_devwin_t *w, const char *fn) {
  int qrc = quiet_nic(w, fn);
  if (!w->proxy) return qrc;
  int rc = qrc;
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
