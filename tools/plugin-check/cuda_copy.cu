/* cuda_copy.cu - a byte copy by the threads of a kernel (cuda_copy.h). */
#include "cuda_copy.h"

#define PC_COPY_THREADS 256
#define PC_COPY_BLOCKS_MAX 1024

/* Byte loads and stores, so that an odd length or an odd address needs
 * nothing special; the fence makes the stores visible to other processes
 * and GPUs before the kernel is seen complete. */
__global__ void pc_copy_kernel(unsigned char *dst, const unsigned char *src,
                               size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = src[i];
  __threadfence_system();
}

extern "C" int pc_cuda_launch_copy(void *dst, const void *src, size_t n,
                                   cudaStream_t stream) {
  if (n == 0) return (int)cudaSuccess;
  size_t blocks = (n + PC_COPY_THREADS - 1) / PC_COPY_THREADS;
  if (blocks > PC_COPY_BLOCKS_MAX) blocks = PC_COPY_BLOCKS_MAX;
  pc_copy_kernel<<<(unsigned)blocks, PC_COPY_THREADS, 0, stream>>>(
      (unsigned char *)dst, (const unsigned char *)src, n);
  return (int)cudaGetLastError();
}
