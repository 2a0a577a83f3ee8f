/* gpu.c - mapping the model's queue pairs for GPU kernels.
 *
 * A kernel posts WQEs by storing into the send queue, the doorbell record
 * and register and the counters, which the model keeps in host memory.
 * Where a CUDA context is current when a queue pair is made, its block is
 * page-locked and mapped into the GPU (cuMemHostRegister, DEVICEMAP) and
 * the descriptor gives kernels the mapped addresses; elsewhere the
 * descriptor is refused with the reason (MEP_ERR_UNREACHABLE: the core
 * then serves that peer through its proxy). The CUDA driver is opened
 * with dlopen, so the plugin neither links it nor needs it. WQEs still
 * name memory by the model's (host) addresses: the model is the NIC. */
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
  int (*reg)(void *, size_t, unsigned);
  int (*unreg)(void *);
  int (*dptr)(uint64_t *, void *, unsigned);
};

static struct ibgda_cuda *load(ibgda_ctx_t *ctx, char *why, size_t len) {
  if (ctx->cuda) return ctx->cuda;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(why, len, "no CUDA driver (%s)", dlerror());
    return NULL;
  }
  struct ibgda_cuda c = {lib, NULL, NULL, NULL, NULL};
  c.current = (int (*)(void **))(uintptr_t)dlsym(lib, "cuCtxGetCurrent");
  c.reg = (int (*)(void *, size_t, unsigned))(uintptr_t)dlsym(
      lib, "cuMemHostRegister_v2");
  c.unreg = (int (*)(void *))(uintptr_t)dlsym(lib, "cuMemHostUnregister");
  c.dptr = (int (*)(uint64_t *, void *, unsigned))(uintptr_t)dlsym(
      lib, "cuMemHostGetDevicePointer_v2");
  struct ibgda_cuda *p = malloc(sizeof *p);
  if (!c.current || !c.reg || !c.unreg || !c.dptr || !p) {
    snprintf(why, len, "the CUDA driver lacks cuMemHostRegister and its "
             "kin");
    free(p);
    dlclose(lib);
    return NULL;
  }
  *p = c;
  ctx->cuda = p;
  return p;
}

int mep__ibgda_gpu_map(ibgda_ctx_t *ctx, void *mem, size_t len,
                       uint64_t *dev, char *why, size_t why_len) {
  pthread_mutex_lock(&ctx->mu);
  struct ibgda_cuda *c = load(ctx, why, why_len);
  pthread_mutex_unlock(&ctx->mu);
  if (!c) return -1;
  void *cur = NULL;
  if (c->current(&cur) != 0 || !cur) {
    snprintf(why, why_len, "no CUDA context was current on the thread "
             "that connected");
    return -1;
  }
  int rc = c->reg(mem, len,
                  CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (rc) {
    snprintf(why, why_len, "cuMemHostRegister of %zu bytes failed (CUDA "
             "error %d)", len, rc);
    return -1;
  }
  rc = c->dptr(dev, mem, 0);
  if (rc) {
    c->unreg(mem);
    snprintf(why, why_len, "cuMemHostGetDevicePointer failed (CUDA error "
             "%d)", rc);
    return -1;
  }
  return 0;
}

void mep__ibgda_gpu_unmap(ibgda_ctx_t *ctx, void *mem) {
  if (ctx->cuda) ctx->cuda->unreg(mem);
}

void mep__ibgda_gpu_close(ibgda_ctx_t *ctx) {
  if (!ctx->cuda) return;
  dlclose(ctx->cuda->lib);
  free(ctx->cuda);
  ctx->cuda = NULL;
}
