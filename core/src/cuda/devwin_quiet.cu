/* devwin_quiet.cu - a device window's MEP_DEV_MLX5 peers quieted for the
 * host (devwin.h): one thread waits until the NIC has carried out every
 * request kernels posted, so that a drain leaves nothing in flight that
 * reads this rank's host part or writes a peer's about to be
 * deregistered. */
#include <cuda_runtime.h>

#include "mep/device/win.cuh"

#include "devwin.h"

__global__ void mep__k_devwin_quiet(const mep_dev_win_t *w,
                                    uint64_t timeout_ns, int *rc) {
  *rc = mep_dev_quiet(w, mep_dev_now_ns() + timeout_ns);
}

extern "C" int mep__devwin_quiet(const mep_dev_win_t *w, uint64_t timeout_ns,
                                 int *cuda_err) {
  *cuda_err = 0;
  int *d = NULL, rc = -3;
  cudaStream_t s = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc((void **)&d, sizeof *d);
  if (e == cudaSuccess) {
    mep__k_devwin_quiet<<<1, 1, 0, s>>>(w, timeout_ns, d);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&rc, d, sizeof rc, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (d) cudaFree(d);
  if (s) cudaStreamDestroy(s);
  if (e != cudaSuccess) {
    *cuda_err = (int)e;
    return -3;
  }
  return rc;
}
