/*
 * gpu.c - whether CUDA memory can be registered with the device, decided
 * once when the plugin starts, and its registration.
 *
 * Two ways exist. A peer-memory module (nvidia_peermem, or the older
 * nv_peer_mem) lets ibv_reg_mr take a device pointer as it is. Without
 * one, a GPU driver that exports dma-buf (CUDA 11.7+, open kernel module)
 * gives an fd for a range of device memory, and ibv_reg_dmabuf_mr
 * registers it where the RDMA driver supports dma-buf (mlx5 does; rxe
 * and siw do not). The probe tries that on a small allocation. The CUDA
 * driver is loaded with dlopen, so the plugin neither links it nor needs
 * it: without a driver or a GPU it registers host memory only, props
 * say so (no MEP_TP_MEM_CUDA), and reg() of CUDA memory answers why;
 * the core then carries GPU data through host memory (its proxy and
 * staging), as it does over tcp.
 *
 * Apart from that, whether a GPU may read a range of host memory directly
 * (CUDA knows it: cudaHostAlloc'ed and mapped, or cudaHostRegister'ed):
 * kernels poll signal words in such memory without the host (the device
 * window's host part, core/src/devwin.c), so signals to it must land
 * without the receiver's poll() (inband.c). That needs the driver whatever
 * gpu_memory says.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "verbs.h"

#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1
#define PROBE_BYTES (2u << 20)
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CUDA_ERROR_INVALID_VALUE 1

typedef struct cu {
  int (*init)(unsigned);
  int (*count)(int *);
  int (*get)(int *, int);
  int (*attr)(int *, int, int);
  int (*retain)(void **, int);
  int (*release)(int);
  int (*push)(void *);
  int (*pop)(void **);
  int (*alloc)(uint64_t *, size_t);
  int (*free)(uint64_t);
  int (*current)(void **);
  int (*current_dev)(int *);
} cu_t;

static int load(verbs_gpu_t *g, cu_t *cu) {
  struct {
    const char *name;
    void **fn;
  } syms[] = {
      {"cuInit", (void **)&cu->init},
      {"cuDeviceGetCount", (void **)&cu->count},
      {"cuDeviceGet", (void **)&cu->get},
      {"cuDeviceGetAttribute", (void **)&cu->attr},
      {"cuDevicePrimaryCtxRetain", (void **)&cu->retain},
      {"cuDevicePrimaryCtxRelease_v2", (void **)&cu->release},
      {"cuCtxPushCurrent_v2", (void **)&cu->push},
      {"cuCtxPopCurrent_v2", (void **)&cu->pop},
      {"cuMemAlloc_v2", (void **)&cu->alloc},
      {"cuMemFree_v2", (void **)&cu->free},
      {"cuCtxGetCurrent", (void **)&cu->current},
      {"cuCtxGetDevice", (void **)&cu->current_dev},
      {"cuMemGetHandleForAddressRange", (void **)&g->mem_handle},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].fn = dlsym(g->lib, syms[i].name);
    if (!*syms[i].fn && i + 1 < sizeof syms / sizeof syms[0]) {
      snprintf(g->why, sizeof g->why, "the CUDA driver lacks %s",
               syms[i].name);
      return -1;
    }
  }
  return 0;
}

static int peermem_loaded(void) {
  return access("/sys/module/nvidia_peermem", F_OK) == 0 ||
         access("/sys/module/nv_peer_mem", F_OK) == 0;
}

/* Registers a small allocation through dma-buf: 0 when the device takes
 * it, else why not in g->why. */
static int try_dmabuf(verbs_ctx_t *ctx, cu_t *cu, int dev) {
  verbs_gpu_t *g = &ctx->gpu;
  void *cuctx = NULL, *prev = NULL;
  uint64_t ptr = 0;
  int fd = -1, rc = -1;
  if (cu->retain(&cuctx, dev) || cu->push(cuctx)) {
    snprintf(g->why, sizeof g->why, "no CUDA context could be made on GPU "
             "%d", dev);
    return -1;
  }
  if (cu->alloc(&ptr, PROBE_BYTES) ||
      g->mem_handle(&fd, ptr, PROBE_BYTES,
                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)) {
    snprintf(g->why, sizeof g->why, "the GPU driver exports no dma-buf "
             "(cuMemGetHandleForAddressRange failed) and no peer-memory "
             "module (nvidia_peermem) is loaded");
  } else {
    struct ibv_mr *mr = ibv_reg_dmabuf_mr(ctx->dev.pd, 0, PROBE_BYTES, ptr,
                                          fd, IBV_ACCESS_LOCAL_WRITE |
                                                  IBV_ACCESS_REMOTE_WRITE);
    if (mr) {
      ibv_dereg_mr(mr);
      rc = 0;
    } else {
      snprintf(g->why, sizeof g->why, "%s cannot register dma-buf memory "
               "(ibv_reg_dmabuf_mr: %s) and no peer-memory module "
               "(nvidia_peermem) is loaded", ctx->dev.name, strerror(errno));
    }
  }
  if (fd >= 0) close(fd);
  if (ptr) cu->free(ptr);
  cu->pop(&prev);
  cu->release(dev);
  return rc;
}

static int probe(verbs_ctx_t *ctx) {
  verbs_gpu_t *g = &ctx->gpu;
  cu_t cu;
  int n = 0, dev = 0, dmabuf = 0;
  g->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!g->lib) {
    snprintf(g->why, sizeof g->why, "no CUDA driver in this process "
             "(libcuda.so.1 does not load)");
    return VERBS_GPU_NONE;
  }
  if (load(g, &cu)) return VERBS_GPU_NONE;
  /* the GPU this thread works on, so that no context is made on another */
  void *cur = NULL;
  if (cu.init(0) || cu.count(&n) || n == 0 ||
      (!(cu.current(&cur) == 0 && cur && cu.current_dev(&dev) == 0) &&
       cu.get(&dev, 0))) {
    snprintf(g->why, sizeof g->why, "the CUDA driver finds no GPU");
    return VERBS_GPU_NONE;
  }
  if (peermem_loaded()) return VERBS_GPU_PEERMEM;
  if (!g->mem_handle ||
      cu.attr(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) ||
      !dmabuf) {
    snprintf(g->why, sizeof g->why, "no peer-memory module (nvidia_peermem) "
             "is loaded and the GPU driver cannot export dma-buf");
    return VERBS_GPU_NONE;
  }
  return try_dmabuf(ctx, &cu, dev) ? VERBS_GPU_NONE : VERBS_GPU_DMABUF;
}

/* cuPointerGetAttribute, where the driver loads and finds a GPU. */
static void probe_attr(verbs_gpu_t *g) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  int (*init)(unsigned) = NULL;
  int (*count)(int *) = NULL;
  *(void **)&init = dlsym(lib, "cuInit");
  *(void **)&count = dlsym(lib, "cuDeviceGetCount");
  *(void **)&g->ptr_attr = dlsym(lib, "cuPointerGetAttribute");
  int n = 0;
  if (!init || !count || !g->ptr_attr || init(0) || count(&n) || n <= 0) {
    g->ptr_attr = NULL;
    dlclose(lib);
    return;
  }
  g->attr_lib = lib;
}

int mep__verbs_gpu_maps_host(const verbs_ctx_t *ctx, const void *ptr,
                             size_t len) {
  const verbs_gpu_t *g = &ctx->gpu;
  if (!g->ptr_attr || !len) return 0;
  /* both ends: a registration may cover CUDA-known memory in part.
   * CUDA_ERROR_INVALID_VALUE is "not CUDA's"; any other failure leaves
   * it unknown, taken as mapped. */
  const uint8_t *end[2] = {ptr, (const uint8_t *)ptr + len - 1};
  for (int i = 0; i < 2; i++) {
    unsigned type = 0;
    if (g->ptr_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    (uint64_t)(uintptr_t)end[i]) != CUDA_ERROR_INVALID_VALUE)
      return 1;
  }
  return 0;
}

void mep__verbs_gpu_probe(verbs_ctx_t *ctx) {
  verbs_gpu_t *g = &ctx->gpu;
  probe_attr(g);
  if (ctx->cfg.gpu_off) {
    g->mode = VERBS_GPU_NONE;
    snprintf(g->why, sizeof g->why, "[verbs] gpu_memory = off");
  } else {
    g->mode = probe(ctx);
  }
  if (g->mode == VERBS_GPU_NONE && g->lib) {
    dlclose(g->lib);
    g->lib = NULL;
  }
  VERBS_LOG(ctx, MEP_LOG_INFO, "verbs: rank %d: CUDA memory on %s: %s%s",
            ctx->rank, ctx->dev.name,
            g->mode == VERBS_GPU_DMABUF    ? "registered through dma-buf"
            : g->mode == VERBS_GPU_PEERMEM ? "registered through peer memory"
                                           : "no: ",
            g->mode == VERBS_GPU_NONE ? g->why : "");
}

void mep__verbs_gpu_close(verbs_gpu_t *g) {
  if (g->lib) dlclose(g->lib);
  g->lib = NULL;
  if (g->attr_lib) dlclose(g->attr_lib);
  g->attr_lib = NULL;
  g->ptr_attr = NULL;
}

struct ibv_mr *mep__verbs_gpu_reg(verbs_ctx_t *ctx, void *ptr, size_t len,
                                  int access) {
  verbs_gpu_t *g = &ctx->gpu;
  struct ibv_mr *mr = NULL;
  const char *how = "ibv_reg_mr (peer memory)";
  if (g->mode == VERBS_GPU_PEERMEM) {
    mr = ibv_reg_mr(ctx->dev.pd, ptr, len, access);
  } else {
    how = "ibv_reg_dmabuf_mr";
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t p = (uint64_t)(uintptr_t)ptr, base = p & ~(page - 1);
    uint64_t span = (p - base + len + page - 1) & ~(page - 1);
    int fd = -1;
    if (g->mem_handle(&fd, base, span, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                      0)) {
      errno = EINVAL;
      how = "cuMemGetHandleForAddressRange";
    } else {
      mr = ibv_reg_dmabuf_mr(ctx->dev.pd, p - base, len, p, fd, access);
      close(fd);
    }
  }
  if (!mr)
    ctx->env->set_error("verbs: rank %d: registering %zu bytes of CUDA "
                        "memory at %p with %s failed: %s: %s", ctx->rank,
                        len, ptr, ctx->dev.name, how, strerror(errno));
  return mr;
}
