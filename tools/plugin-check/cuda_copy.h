/* cuda_copy.h - the one kernel of mep-plugin-check (cuda_copy.cu), for
 * mem_cuda.c: a byte copy by the threads of a kernel, the way GPU kernels
 * reach a peer's memory through a mapped address. */
#ifndef PC_CUDA_COPY_H
#define PC_CUDA_COPY_H

#include <stddef.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues the copy of n bytes from src to dst on `stream`; returns the
 * launch's cudaError_t (cudaSuccess for n == 0, which launches nothing). */
int pc_cuda_launch_copy(void *dst, const void *src, size_t n,
                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
