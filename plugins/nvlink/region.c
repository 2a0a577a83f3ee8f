/*
 * region.c - local registrations (an IPC handle of the allocation and the
 * region's place in it) and imported regions (the peer's allocation
 * mapped here).
 *
 * CUDA refuses to open one IPC handle twice in a process, and several
 * regions (of one communicator or several) may lie in one allocation, so
 * the opened handles live in one process-wide table with a reference count
 * per (handle, device). A mapping is closed when its last importer lets go,
 * after the copies queued before that ran.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvlink.h"

struct nvl_map {
  nvl_map_t *next;
  uint8_t handle[NVL_HANDLE_LEN];
  int dev;
  uint64_t refs;
  uint8_t *base;
};

static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static nvl_map_t *maps;

/* Driver functions reached through the runtime, so that the plugin does not
 * link libcuda (it loads on machines without a driver). */
typedef int (*addr_range_fn)(unsigned long long *base, size_t *size,
                             unsigned long long ptr);
typedef int (*ptr_attr_fn)(void *data, int attribute, unsigned long long ptr);
#define NVL_ATTR_LEGACY_IPC_CAPABLE 10 /* CU_POINTER_ATTRIBUTE_... */

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static addr_range_fn drv_addr_range;
static ptr_attr_fn drv_ptr_attr;

static void *entry(const char *sym) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return fn;
}

/* ISO C has no cast from void * to a function pointer; the bytes are the
 * same on every platform CUDA runs on. */
static void drv_load(void) {
  void *p = entry("cuMemGetAddressRange");
  if (p) memcpy(&drv_addr_range, &p, sizeof p);
  p = entry("cuPointerGetAttribute");
  if (p) memcpy(&drv_ptr_attr, &p, sizeof p);
}

/* The allocation holding ptr: its base and size. Without the driver entry
 * point (an old driver) ptr is taken as the base of an allocation of len
 * bytes, which holds for a region registered at its allocation's start. */
static int alloc_range(nvl_ctx_t *ctx, uint8_t *ptr, uint64_t len,
                       uint8_t **base, uint64_t *size) {
  if (!drv_addr_range) {
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
      NVL_LOG(ctx, MEP_LOG_WARN, "nvlink: the driver has no "
              "cuMemGetAddressRange entry point: regions are assumed to "
              "start their allocations");
    *base = ptr;
    *size = len;
    return 0;
  }
  unsigned long long b = 0;
  size_t s = 0;
  int r = drv_addr_range(&b, &s, (unsigned long long)(uintptr_t)ptr);
  if (r)
    return NVL_ERR(ctx, MEP_ERR_UNSUPPORTED, "nvlink: register %" PRIu64
                   " bytes at %p: cuMemGetAddressRange failed with CUDA "
                   "driver error %d (not memory of this context?)", len,
                   (void *)ptr, r);
  *base = (uint8_t *)(uintptr_t)b;
  *size = s;
  return 0;
}

/* MEP_ERR_UNSUPPORTED unless ptr is device memory of the context's GPU
 * that legacy CUDA IPC can share (cudaMalloc, not pools or bare VMM). */
static int check_memory(nvl_ctx_t *ctx, void *ptr, size_t len) {
  struct cudaPointerAttributes at;
  cudaError_t e = cudaPointerGetAttributes(&at, ptr);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return NVL_ERR(ctx, MEP_ERR_UNSUPPORTED, "nvlink: register %zu bytes at "
                   "%p: cudaPointerGetAttributes: %s", len, ptr,
                   cudaGetErrorString(e));
  }
  if (at.type != cudaMemoryTypeDevice)
    return NVL_ERR(ctx, MEP_ERR_UNSUPPORTED, "nvlink: register %zu bytes at "
                   "%p: it is %s memory, not device memory from cudaMalloc",
                   len, ptr, at.type == cudaMemoryTypeManaged ? "managed"
                   : at.type == cudaMemoryTypeHost ? "pinned host"
                                                   : "unregistered host");
  if (at.device != ctx->dev)
    return NVL_ERR(ctx, MEP_ERR_UNSUPPORTED, "nvlink: register %zu bytes at "
                   "%p: the memory is on GPU %d, the context uses GPU %d",
                   len, ptr, at.device, ctx->dev);
  int capable = 1;
  if (drv_ptr_attr &&
      !drv_ptr_attr(&capable, NVL_ATTR_LEGACY_IPC_CAPABLE,
                    (unsigned long long)(uintptr_t)ptr) && !capable)
    return NVL_ERR(ctx, MEP_ERR_UNSUPPORTED, "nvlink: register %zu bytes at "
                   "%p: the allocation cannot be shared with CUDA IPC "
                   "(memory from cudaMallocAsync pools or cuMemCreate is "
                   "not; use cudaMalloc)", len, ptr);
  return 0;
}

static int reg_cuda(nvl_ctx_t *ctx, void *ptr, size_t len, nvl_rkey_t *k) {
  pthread_once(&drv_once, drv_load);
  int rc = check_memory(ctx, ptr, len);
  uint8_t *base = NULL;
  uint64_t size = 0;
  if (!rc) rc = alloc_range(ctx, ptr, len, &base, &size);
  if (rc) return rc;
  uint64_t off = (uint64_t)((uint8_t *)ptr - base);
  if ((uint8_t *)ptr < base || off > size || len > size - off)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: register %zu bytes at %p: "
                   "the range runs past the end of its allocation of %" PRIu64
                   " bytes at %p", len, ptr, size, (void *)base);
  cudaIpcMemHandle_t h;
  cudaError_t e = cudaIpcGetMemHandle(&h, base);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return NVL_ERR(ctx, MEP_ERR_UNSUPPORTED, "nvlink: register %zu bytes at "
                   "%p: cudaIpcGetMemHandle: %s (memory from cudaMallocAsync "
                   "pools or cuMemCreate cannot be shared; use cudaMalloc)",
                   len, ptr, cudaGetErrorString(e));
  }
  _Static_assert(sizeof h == NVL_HANDLE_LEN, "cudaIpcMemHandle_t size");
  memcpy(k->handle, &h, NVL_HANDLE_LEN);
  k->nonce = ctx->self.nonce;
  k->off = off;
  k->len = len;
  k->size = size;
  return 0;
}

int mep__nvl_reg(mep_tp_ctx_t *ctxp, void *ptr, size_t len,
                 mep_memkind_t kind, mep_tp_mr_t **out, void *rkey,
                 size_t *rkey_len) {
  nvl_ctx_t *ctx = ctxp;
  if (!ctx || !out || !rkey || !rkey_len) return MEP_ERR_INVALID;
  if (kind != MEP_MEM_CUDA)
    return NVL_ERR(ctx, MEP_ERR_UNSUPPORTED, "nvlink: cannot register %s "
                   "memory (kind %d, %zu bytes at %p): nvlink moves CUDA "
                   "memory only; host memory goes through another transport",
                   kind == MEP_MEM_HOST ? "host" : "unknown", (int)kind, len,
                   ptr);
  if (!ptr)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: register %zu bytes at "
                   "NULL", len);
  if (*rkey_len < NVL_RKEY_LEN)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: register: the remote-key "
                   "buffer has %zu bytes, the key needs %d", *rkey_len,
                   NVL_RKEY_LEN);
  nvl_rkey_t k;
  int saved, rc = mep__nvl_enter(ctx, &saved);
  if (rc) return rc;
  rc = reg_cuda(ctx, ptr, len, &k);
  mep__nvl_leave(ctx, saved);
  if (rc) return rc;
  nvl_mr_t *mr = calloc(1, sizeof *mr);
  if (!mr) return NVL_ERR(ctx, MEP_ERR_NOMEM, "nvlink: register: out of "
                          "memory");
  mr->ctx = ctx;
  mr->ptr = ptr;
  mr->len = len;
  pthread_mutex_lock(&ctx->mu);
  mr->next = ctx->mrs;
  if (ctx->mrs) ctx->mrs->prev = mr;
  ctx->mrs = mr;
  pthread_mutex_unlock(&ctx->mu);
  mep__nvl_rkey_encode(rkey, &k);
  *rkey_len = NVL_RKEY_LEN;
  *out = mr;
  return 0;
}

int mep__nvl_dereg(mep_tp_ctx_t *ctxp, mep_tp_mr_t *mrp) {
  nvl_ctx_t *ctx = ctxp;
  nvl_mr_t *mr = mrp;
  if (!ctx || !mr) return MEP_ERR_INVALID;
  if (mr->ctx != ctx)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: dereg: the registration "
                   "belongs to another context");
  pthread_mutex_lock(&ctx->mu);
  if (mr->prev)
    mr->prev->next = mr->next;
  else
    ctx->mrs = mr->next;
  if (mr->next) mr->next->prev = mr->prev;
  pthread_mutex_unlock(&ctx->mu);
  free(mr);
  return 0;
}

void mep__nvl_mrs_free(nvl_ctx_t *ctx) {
  while (ctx->mrs) {
    nvl_mr_t *mr = ctx->mrs;
    ctx->mrs = mr->next;
    free(mr);
  }
}

/* The device current is ctx->dev. 0, or a cudaError_t. */
static int map_get(nvl_ctx_t *ctx, const uint8_t *handle, nvl_map_t **out) {
  pthread_mutex_lock(&maps_mu);
  for (nvl_map_t *m = maps; m; m = m->next)
    if (m->dev == ctx->dev && !memcmp(m->handle, handle, NVL_HANDLE_LEN)) {
      m->refs++;
      pthread_mutex_unlock(&maps_mu);
      return *out = m, 0;
    }
  nvl_map_t *m = calloc(1, sizeof *m);
  if (!m) {
    pthread_mutex_unlock(&maps_mu);
    return cudaErrorMemoryAllocation;
  }
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof h);
  void *base = NULL;
  cudaError_t e = cudaIpcOpenMemHandle(&base, h,
                                       cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    pthread_mutex_unlock(&maps_mu);
    free(m);
    return (int)e;
  }
  memcpy(m->handle, handle, NVL_HANDLE_LEN);
  m->dev = ctx->dev;
  m->refs = 1;
  m->base = base;
  m->next = maps;
  maps = m;
  pthread_mutex_unlock(&maps_mu);
  *out = m;
  return 0;
}

/* The device current is ctx->dev; `drained`: the context's stream ran
 * everything queued before. A mapping whose copies may still run (the
 * drain timed out) stays open, unused, rather than pulled from under them;
 * one that a new importer took meanwhile stays too. */
static void map_put(nvl_ctx_t *ctx, nvl_map_t *m, int drained) {
  pthread_mutex_lock(&maps_mu);
  if (--m->refs || !drained) {
    pthread_mutex_unlock(&maps_mu);
    return;
  }
  nvl_map_t **pp = &maps;
  while (*pp != m) pp = &(*pp)->next;
  *pp = m->next;
  cudaError_t e = cudaIpcCloseMemHandle(m->base);
  pthread_mutex_unlock(&maps_mu);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    NVL_LOG(ctx, MEP_LOG_DEBUG, "nvlink: rank %d: cudaIpcCloseMemHandle: %s",
            ctx->rank, cudaGetErrorString(e));
  }
  free(m);
}

void mep__nvl_rmrs_release(nvl_ctx_t *ctx, nvl_rmr_t *list) {
  int drained = !mep__nvl_drain(ctx, "releasing imported regions");
  while (list) {
    nvl_rmr_t *r = list;
    list = r->next;
    map_put(ctx, r->map, drained);
    free(r);
  }
}

int mep__nvl_import(mep_tp_ep_t *epp, const void *rkey, size_t len,
                    mep_tp_rmr_t **out) {
  nvl_ep_t *ep = epp;
  if (!ep || !out) return MEP_ERR_INVALID;
  nvl_ctx_t *ctx = ep->ctx;
  nvl_rkey_t k;
  char why[160];
  if (mep__nvl_rkey_decode(rkey, len, &k, why, sizeof why))
    return NVL_ERR(ctx, MEP_ERR_PROTOCOL, "nvlink: import from rank %d: %s",
                   ep->rank, why);
  if (k.nonce != ep->nonce)
    return NVL_ERR(ctx, MEP_ERR_PROTOCOL, "nvlink: import from rank %d: the "
                   "key was made by another process than the one connected",
                   ep->rank);
  nvl_rmr_t *r = calloc(1, sizeof *r);
  if (!r) return NVL_ERR(ctx, MEP_ERR_NOMEM, "nvlink: import: out of memory");
  int saved, rc = mep__nvl_enter(ctx, &saved);
  if (rc) {
    free(r);
    return rc;
  }
  int e = map_get(ctx, k.handle, &r->map);
  mep__nvl_leave(ctx, saved);
  if (e) {
    free(r);
    return NVL_ERR(ctx, e == cudaErrorMemoryAllocation ? MEP_ERR_NOMEM
                                                       : MEP_ERR_SYSTEM,
                   "nvlink: import from rank %d: cudaIpcOpenMemHandle: %s "
                   "(the region's memory was not allocated with cudaMalloc, "
                   "or its process is gone?)", ep->rank,
                   cudaGetErrorString((cudaError_t)e));
  }
  r->ep = ep;
  r->ptr = r->map->base + k.off;
  r->len = k.len;
  pthread_mutex_lock(&ctx->mu);
  r->next = ep->rmrs;
  if (ep->rmrs) ep->rmrs->prev = r;
  ep->rmrs = r;
  pthread_mutex_unlock(&ctx->mu);
  *out = r;
  return 0;
}

int mep__nvl_unimport(mep_tp_ep_t *epp, mep_tp_rmr_t *rmrp) {
  nvl_ep_t *ep = epp;
  nvl_rmr_t *r = rmrp;
  if (!ep || !r) return MEP_ERR_INVALID;
  nvl_ctx_t *ctx = ep->ctx;
  if (r->ep != ep)
    return NVL_ERR(ctx, MEP_ERR_INVALID, "nvlink: unimport: the region was "
                   "imported from rank %d, not rank %d", r->ep->rank,
                   ep->rank);
  pthread_mutex_lock(&ctx->mu);
  if (r->prev)
    r->prev->next = r->next;
  else
    ep->rmrs = r->next;
  if (r->next) r->next->prev = r->prev;
  r->next = r->prev = NULL;
  pthread_mutex_unlock(&ctx->mu);
  int saved;
  if (mep__nvl_enter(ctx, &saved)) {
    /* cannot wait for the stream: keep the mapping, drop the region */
    free(r);
    return 0;
  }
  mep__nvl_rmrs_release(ctx, r);
  mep__nvl_leave(ctx, saved);
  return 0;
}

int mep__nvl_map(mep_tp_ep_t *epp, mep_tp_rmr_t *rmrp, void **dev_ptr) {
  nvl_ep_t *ep = epp;
  nvl_rmr_t *r = rmrp;
  if (!ep || !r || !dev_ptr) return MEP_ERR_INVALID;
  if (r->ep != ep)
    return NVL_ERR(ep->ctx, MEP_ERR_INVALID, "nvlink: map: the region was "
                   "imported from rank %d, not rank %d", r->ep->rank,
                   ep->rank);
  *dev_ptr = r->ptr;
  return 0;
}
