/* gpu.c - the kernels' queue pair as a GPU reaches it.
 *
 * A kernel posts WQEs by storing into the send queue and the doorbell
 * record and register, and keeps the producers' counters (mep/device/
 * mlx5_qp.h: pi, ready, ci, cq_ci, cq_lock), which only kernels touch.
 * The queues are host memory (the model's block; on a NIC, the buffers
 * libmlx5 allocated) and the doorbell register is host memory too for the
 * model, a page of the NIC's UAR (MMIO) on hardware. When a device
 * descriptor is first asked for with a CUDA context current, those pages
 * are page-locked and mapped into the GPU (cuMemHostRegister, PORTABLE |
 * DEVICEMAP, and IOMEMORY for the UAR page, as NVSHMEM maps it), and the
 * counters are put in that GPU's own memory: hundreds of warps spin on
 * them, which over PCIe would cost a round trip per spin and starve the
 * NIC's reads of the same lines, as ibgda keeps its bookkeeping in GPU
 * memory for the same reason. Without a context the descriptor is refused
 * with the reason (MEP_ERR_UNREACHABLE: the core then serves that peer
 * through its proxy). The CUDA driver is opened with dlopen, so the
 * plugin neither links it nor needs it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ibgda.h"

#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTREGISTER_IOMEMORY 0x04
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712

struct ibgda_cuda {
  void *lib;
  int (*current)(void **);
  int (*push)(void *);
  int (*pop)(void **);
  int (*reg)(void *, size_t, unsigned);
  int (*unreg)(void *);
  int (*dptr)(uint64_t *, void *, unsigned);
  int (*alloc)(uint64_t *, size_t);
  int (*free)(uint64_t);
  int (*memset8)(uint64_t, unsigned char, size_t);
};

#define SYM(field, name) \
  (*(void **)&c.field = dlsym(lib, name), c.field != NULL)

static struct ibgda_cuda *load(ibgda_ctx_t *ctx, char *why, size_t len) {
  if (ctx->cuda) return ctx->cuda;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(why, len, "no CUDA driver (%s)", dlerror());
    return NULL;
  }
  struct ibgda_cuda c;
  memset(&c, 0, sizeof c);
  c.lib = lib;
  int ok = SYM(current, "cuCtxGetCurrent") &&
           SYM(push, "cuCtxPushCurrent_v2") &&
           SYM(pop, "cuCtxPopCurrent_v2") &&
           SYM(reg, "cuMemHostRegister_v2") &&
           SYM(unreg, "cuMemHostUnregister") &&
           SYM(dptr, "cuMemHostGetDevicePointer_v2") &&
           SYM(alloc, "cuMemAlloc_v2") && SYM(free, "cuMemFree_v2") &&
           SYM(memset8, "cuMemsetD8_v2");
  struct ibgda_cuda *p = ok ? malloc(sizeof *p) : NULL;
  if (!p) {
    snprintf(why, len, "the CUDA driver lacks cuMemHostRegister, "
             "cuMemAlloc or their kin");
    dlclose(lib);
    return NULL;
  }
  *p = c;
  ctx->cuda = p;
  return p;
}

/* Callers hold an endpoint's lock, which comes after ctx->mu: the driver
 * is loaded, and pins are counted, under a lock of their own. */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

/* A registration of whole pages, shared by the queue pairs whose objects
 * lie in them (libmlx5 puts several doorbell records in one page, and
 * several queue pairs' doorbell registers in one UAR page): registered at
 * its first use, unregistered at its last. */
typedef struct ibgda_pin {
  uintptr_t start;
  size_t len;
  void *cu_ctx;
  uint64_t dev;
  int refs;
  struct ibgda_pin *next;
} ibgda_pin_t;

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* load_mu held: the pin of r's pages in cu_ctx, registered if new. */
static ibgda_pin_t *pin(ibgda_ctx_t *ctx, struct ibgda_cuda *c, void *cur,
                        const ibgda_range_t *r, char *why, size_t why_len) {
  size_t pg = page_size();
  uintptr_t start = (uintptr_t)r->host / pg * pg;
  size_t len = ((uintptr_t)r->host + r->len - start + pg - 1) / pg * pg;
  for (ibgda_pin_t *p = ctx->pins; p; p = p->next)
    if (p->start == start && p->len == len && p->cu_ctx == cur) {
      p->refs++;
      return p;
    }
  ibgda_pin_t *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(why, why_len, "out of memory");
    return NULL;
  }
  unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                   (r->io ? CU_MEMHOSTREGISTER_IOMEMORY : 0);
  int rc = c->reg((void *)start, len, flags);
  const char *what = "cuMemHostRegister";
  if (!rc) {
    what = "cuMemHostGetDevicePointer";
    rc = c->dptr(&p->dev, (void *)start, 0);
    if (rc) c->unreg((void *)start);
  }
  if (rc) {
    snprintf(why, why_len, "%s of %zu bytes%s at %p failed (CUDA error %d%s)",
             what, len, r->io ? " of the NIC's doorbell page" : "",
             (void *)start, rc,
             rc == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
                 ? ": registered by another part of this process"
                 : "");
    free(p);
    return NULL;
  }
  *p = (ibgda_pin_t){start, len, cur, p->dev, 1, ctx->pins};
  ctx->pins = p;
  return p;
}

/* load_mu held */
static void unpin(ibgda_ctx_t *ctx, struct ibgda_cuda *c, void *cu_ctx,
                  const ibgda_range_t *r) {
  size_t pg = page_size();
  uintptr_t start = (uintptr_t)r->host / pg * pg;
  for (ibgda_pin_t **pp = &ctx->pins; *pp; pp = &(*pp)->next) {
    ibgda_pin_t *p = *pp;
    if (p->start != start || p->cu_ctx != cu_ctx) continue;
    if (--p->refs == 0) {
      c->unreg((void *)p->start);
      *pp = p->next;
      free(p);
    }
    return;
  }
}

static void detach_locked(ibgda_ctx_t *ctx, struct ibgda_cuda *c,
                          ibgda_gpu_t *g) {
  for (int i = 0; i < g->n; i++) unpin(ctx, c, g->cu_ctx, &g->r[i]);
  memset(g, 0, sizeof *g);
}

int mep__ibgda_gpu_attach(ibgda_ctx_t *ctx, const ibgda_range_t *r, int n,
                          ibgda_gpu_t *g, char *why, size_t why_len) {
  if (n > IBGDA_MAX_RANGES) {
    snprintf(why, why_len, "%d ranges to map (at most %d)", n,
             IBGDA_MAX_RANGES);
    return -1;
  }
  pthread_mutex_lock(&load_mu);
  struct ibgda_cuda *c = load(ctx, why, why_len);
  void *cur = NULL;
  int rc = -1;
  if (!c) goto out;
  if (c->current(&cur) != 0 || !cur) {
    snprintf(why, why_len, "no CUDA context is current on the thread that "
             "asked for the descriptor");
    goto out;
  }
  if (g->n) {
    if (g->cu_ctx == cur) rc = 0;
    else
      snprintf(why, why_len, "it is mapped for another CUDA context (GPU) "
               "of this process, whose memory holds its counters");
    goto out;
  }
  g->cu_ctx = cur;
  for (int i = 0; i < n; i++) {
    ibgda_pin_t *p = pin(ctx, c, cur, &r[i], why, why_len);
    if (!p) {
      detach_locked(ctx, c, g);
      goto out;
    }
    g->r[i] = r[i];
    g->dev[i] = p->dev + ((uintptr_t)r[i].host - p->start);
    g->n = i + 1;
  }
  uint64_t ctr = 0;
  const char *what = "cuMemAlloc of the counters";
  int e = c->alloc(&ctr, IBGDA_KCTR * sizeof(uint64_t));
  if (!e) {
    what = "cuMemsetD8 of the counters";
    e = c->memset8(ctr, 0, IBGDA_KCTR * sizeof(uint64_t));
    if (e) c->free(ctr);
  }
  if (e) {
    detach_locked(ctx, c, g);
    snprintf(why, why_len, "%s failed (CUDA error %d)", what, e);
    goto out;
  }
  g->ctr = ctr;
  rc = 0;
out:
  pthread_mutex_unlock(&load_mu);
  return rc;
}

uint64_t mep__ibgda_gpu_addr(const ibgda_gpu_t *g, const void *host) {
  uintptr_t h = (uintptr_t)host;
  for (int i = 0; i < g->n; i++) {
    uintptr_t b = (uintptr_t)g->r[i].host;
    if (h >= b && h < b + g->r[i].len) return g->dev[i] + (h - b);
  }
  return 0;
}

void mep__ibgda_gpu_detach(ibgda_ctx_t *ctx, ibgda_gpu_t *g) {
  struct ibgda_cuda *c = ctx->cuda;
  if (!g->n || !c) return;
  pthread_mutex_lock(&load_mu);
  /* the counters belong to the context they were made in */
  if (g->ctr && c->push(g->cu_ctx) == 0) {
    c->free(g->ctr);
    void *prev;
    c->pop(&prev);
  }
  detach_locked(ctx, c, g);
  pthread_mutex_unlock(&load_mu);
}

void mep__ibgda_gpu_close(ibgda_ctx_t *ctx) {
  if (!ctx->cuda) return;
  dlclose(ctx->cuda->lib);
  free(ctx->cuda);
  ctx->cuda = NULL;
}
