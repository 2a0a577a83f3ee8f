/* mem_cuda.c - CUDA memory of the current GPU (mem_cuda.h). Every copy
 * goes on one non-blocking stream of this process and is waited for, so a
 * plugin's own streams never wait behind the suite's copies, and a copy
 * is complete (not merely staged) when its function returns. */
#include "mem_cuda.h"

#include <stdio.h>

#include "worker.h"

#ifdef MEP_PC_HAVE_CUDA

#include <cuda_runtime.h>

#include "cuda_copy.h"

static int g_state; /* 0: not opened yet; 1: usable; -1: not (g_why) */
static char g_why[256];
static int g_dev = -1;
static cudaStream_t g_stream;

static int open_once(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    (void)cudaGetLastError();
    snprintf(g_why, sizeof g_why, "no CUDA device (cudaGetDeviceCount: %s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return -1;
  }
  if ((e = cudaGetDevice(&g_dev)) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(g_why, sizeof g_why, "no usable CUDA device (cudaGetDevice: %s)",
             cudaGetErrorString(e));
    return -1;
  }
  e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(g_why, sizeof g_why,
             "CUDA on GPU %d does not work (cudaStreamCreateWithFlags: %s)",
             g_dev, cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

int pc_cuda_open(char *why, size_t why_len) {
  if (g_state == 0) g_state = open_once() == 0 ? 1 : -1;
  if (g_state < 0) snprintf(why, why_len, "%s", g_why);
  return g_state > 0 ? 0 : -1;
}

/* Fails the check unless `e` is success: `call` names what was done. */
static void ok(cudaError_t e, const char *call, size_t len) {
  if (e == cudaSuccess) return;
  pc_fail("%s of %zu bytes on GPU %d failed: %s (%s)", call, len, g_dev,
          cudaGetErrorName(e), cudaGetErrorString(e));
}

static void opened(const char *call) {
  if (g_state != 1)
    pc_fail("internal: %s before CUDA was opened (pc_cuda_open)", call);
}

static void wait_stream(const char *call, size_t len) {
  ok(cudaStreamSynchronize(g_stream), call, len);
}

void *pc_cuda_alloc(size_t len) {
  opened("cudaMalloc");
  size_t n = len ? len : 1;
  void *p = NULL;
  ok(cudaMalloc(&p, n), "cudaMalloc", n);
  ok(cudaMemsetAsync(p, 0, n, g_stream), "cudaMemsetAsync", n);
  wait_stream("cudaMemsetAsync", n);
  return p;
}

void pc_cuda_free(void *p) {
  opened("cudaFree");
  ok(cudaFree(p), "cudaFree", 0);
}

/* cudaMemcpyDefault: the addresses tell the direction (unified
 * addressing), for a mapped peer address as for the own memory. */
static void copy(void *dst, const void *src, size_t len, const char *what) {
  if (len == 0) return;
  opened(what);
  ok(cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, g_stream), what, len);
  wait_stream(what, len);
}

void pc_cuda_put(void *dst, const void *src, size_t len) {
  copy(dst, src, len, "cudaMemcpyAsync to the GPU");
}

void pc_cuda_get(void *dst, const void *src, size_t len) {
  copy(dst, src, len, "cudaMemcpyAsync from the GPU");
}

void pc_cuda_kernel_copy(void *dst, const void *src, size_t len) {
  opened("a kernel launch");
  ok((cudaError_t)pc_cuda_launch_copy(dst, src, len, g_stream),
     "the launch of a copy kernel", len);
  wait_stream("a copy kernel", len);
}

#else /* !MEP_PC_HAVE_CUDA */

int pc_cuda_open(char *why, size_t why_len) {
  snprintf(why, why_len, "this mep-plugin-check was built without CUDA");
  return -1;
}

static _Noreturn void unbuilt(const char *fn) {
  pc_fail("internal: %s in a mep-plugin-check built without CUDA", fn);
}

void *pc_cuda_alloc(size_t len) { (void)len; unbuilt("pc_cuda_alloc"); }
void pc_cuda_free(void *p) { (void)p; unbuilt("pc_cuda_free"); }

void pc_cuda_put(void *dst, const void *src, size_t len) {
  (void)dst, (void)src, (void)len;
  unbuilt("pc_cuda_put");
}

void pc_cuda_get(void *dst, const void *src, size_t len) {
  (void)dst, (void)src, (void)len;
  unbuilt("pc_cuda_get");
}

void pc_cuda_kernel_copy(void *dst, const void *src, size_t len) {
  (void)dst, (void)src, (void)len;
  unbuilt("pc_cuda_kernel_copy");
}

#endif
