/* signal.cu - the one-thread kernel behind signal(): on the context's
 * stream it runs after the copies queued before it, and the system-scope
 * fence makes those bytes visible to the peer before the flag changes. */
#include <stdint.h>

#include <cuda_runtime.h>

static __global__ void nvl_signal_kernel(unsigned long long *dst,
                                         unsigned long long value, int add) {
  __threadfence_system();
  if (add)
    atomicAdd_system(dst, value);
  else
    *(volatile unsigned long long *)dst = value;
  __threadfence_system();
}

extern "C" __attribute__((visibility("hidden"))) int
mep__nvl_signal_launch(uint64_t *dst, uint64_t value, int add,
                       cudaStream_t stream) {
  nvl_signal_kernel<<<1, 1, 0, stream>>>((unsigned long long *)dst,
                                         (unsigned long long)value, add);
  return (int)cudaGetLastError();
}
