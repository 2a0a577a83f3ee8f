/* gpu.c - the kernels' queue pair as a GPU reaches it.
 *
 * A kernel posts WQEs by storing into the send queue and the doorbell
 * record and register, which the model keeps in host memory, and keeps
 * the producers' counters (mep/device/mlx5_qp.h: pi, ready, ci, cq_ci,
 * cq_lock), which only kernels touch. When a device descriptor is first
 * asked for with a CUDA context current, the queue pair's block is
 * page-locked and mapped into the GPU (cuMemHostRegister, PORTABLE |
 * DEVICEMAP), and the counters are put in that GPU's own memory: hundreds
 * of warps spin on them, which over PCIe would cost a round trip per
 * spin and starve the NIC's (the model's) reads of the same lines, as
 * ibgda keeps its bookkeeping in GPU memory for the same reason. Without
 * a context the descriptor is refused with the reason
 * (MEP_ERR_UNREACHABLE: the core then serves that peer through its
 * proxy). The CUDA driver is opened with dlopen, so the plugin neither
 * links it nor needs it. WQEs still name memory by the model's (host)
 * addresses: the model is the NIC. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ibgda.h"

#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02

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
 * is loaded under a lock of its own. */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

int mep__ibgda_gpu_attach(ibgda_ctx_t *ctx, void *mem, size_t len,
                          ibgda_gpu_t *g, char *why, size_t why_len) {
  pthread_mutex_lock(&load_mu);
  struct ibgda_cuda *c = load(ctx, why, why_len);
  pthread_mutex_unlock(&load_mu);
  if (!c) return -1;
  void *cur = NULL;
  if (c->current(&cur) != 0 || !cur) {
    snprintf(why, why_len, "no CUDA context is current on the thread that "
             "asked for the descriptor");
    return -1;
  }
  if (g->mem) {
    if (g->cu_ctx == cur) return 0;
    snprintf(why, why_len, "it is mapped for another CUDA context (GPU) of "
             "this process, whose memory holds its counters");
    return -1;
  }
  int rc = c->reg(mem, len,
                  CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (rc) {
    snprintf(why, why_len, "cuMemHostRegister of %zu bytes failed (CUDA "
             "error %d)", len, rc);
    return -1;
  }
  uint64_t dev = 0, ctr = 0;
  rc = c->dptr(&dev, mem, 0);
  const char *what = "cuMemHostGetDevicePointer";
  if (!rc) {
    what = "cuMemAlloc of the counters";
    rc = c->alloc(&ctr, IBGDA_KCTR * sizeof(uint64_t));
  }
  if (!rc) {
    what = "cuMemsetD8 of the counters";
    rc = c->memset8(ctr, 0, IBGDA_KCTR * sizeof(uint64_t));
  }
  if (rc) {
    if (ctr) c->free(ctr);
    c->unreg(mem);
    snprintf(why, why_len, "%s failed (CUDA error %d)", what, rc);
    return -1;
  }
  *g = (ibgda_gpu_t){dev, ctr, cur, mem};
  return 0;
}

void mep__ibgda_gpu_detach(ibgda_ctx_t *ctx, ibgda_gpu_t *g) {
  struct ibgda_cuda *c = ctx->cuda;
  if (!g->mem || !c) return;
  /* the counters belong to the context they were made in */
  if (c->push(g->cu_ctx) == 0) {
    c->free(g->ctr);
    void *prev;
    c->pop(&prev);
  }
  c->unreg(g->host);
  memset(g, 0, sizeof *g);
}

void mep__ibgda_gpu_close(ibgda_ctx_t *ctx) {
  if (!ctx->cuda) return;
  dlclose(ctx->cuda->lib);
  free(ctx->cuda);
  ctx->cuda = NULL;
}
