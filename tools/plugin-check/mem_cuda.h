/* mem_cuda.h - CUDA memory of the current GPU, for mem.c and the
 * descriptor checks. Built for real only where meson found CUDA
 * (MEP_PC_HAVE_CUDA); otherwise pc_cuda_open says so and nothing else may
 * be called. Every function except pc_cuda_open ends the check (pc_fail)
 * naming the CUDA call and its error when one fails. */
#ifndef PC_MEM_CUDA_H
#define PC_MEM_CUDA_H

#include <stddef.h>

/* 0 when CUDA memory can be used in this process; else -1 with the reason
 * in why ("this mep-plugin-check was built without CUDA", "no CUDA device
 * (...)"). The first call opens CUDA on the current device; later calls
 * give the same answer. Never call it in the supervising process: a
 * process that forks must not have touched CUDA. */
int pc_cuda_open(char *why, size_t why_len);

/* Zeroed device memory (cudaMalloc: shareable with CUDA IPC). */
void *pc_cuda_alloc(size_t len);
void pc_cuda_free(void *p);

/* Copies, each complete when the function returns. */
void pc_cuda_put(void *dst, const void *src, size_t len); /* host -> GPU */
void pc_cuda_get(void *dst, const void *src, size_t len); /* GPU -> host */

/* len bytes from src to dst by the threads of a kernel on the current GPU
 * (plain loads and stores, then a system-wide fence), complete when it
 * returns: what a GPU kernel reaching a peer's mapped memory does. */
void pc_cuda_kernel_copy(void *dst, const void *src, size_t len);

#endif
