/* devwin_kernels.cu - the kernels of the device window's GPU test: one
 * block per peer sends its pieces with mep_dev_dst / mep_dev_put and
 * signals with mep_dev_signal; one block per source waits for the signal
 * (mep_dev_src) and checks every byte of that source's receive area. */
#include <stdio.h>

#include <cuda_runtime.h>

#include <mep/device/win.cuh>

#include "devwin_test.h"

__global__ void dw_send(const mep_dev_win_t *w, dw_params_t p,
                        dw_result_t *res) {
  int d = blockIdx.x, me = w->rank;
  if (d == me || d >= w->size) return;
  uint64_t deadline = mep_dev_now_ns() + p.timeout_ns;
  for (int k = 0; k < DW_PIECES; k++) {
    uint64_t off, len;
    dw_piece(&p, me, d, k, &off, &len);
    uint64_t dst = dw_recv(&p, me) + off, stage = dw_stage(&p, d) + off;
    uint8_t *q = mep_dev_dst(w, d, dst, stage);
    for (uint64_t i = threadIdx.x; i < len; i += blockDim.x)
      q[i] = dw_byte(&p, me, d, k, i);
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0 && mep_dev_put(w, d, dst, stage, len, deadline))
      atomicOr(&res[me].send_err, 1u);
  }
  __syncthreads();
  if (threadIdx.x == 0 &&
      mep_dev_signal(w, d, dw_sig(me), p.value, deadline))
    atomicOr(&res[me].send_err, 2u);
}

__global__ void dw_check(const mep_dev_win_t *w, dw_params_t p,
                         dw_result_t *res) {
  int s = blockIdx.x, me = w->rank;
  if (s == me || s >= w->size) return;
  __shared__ int seen;
  if (threadIdx.x == 0) {
    uint64_t deadline = mep_dev_now_ns() + p.timeout_ns;
    const volatile uint64_t *sig =
        (const volatile uint64_t *)mep_dev_src(w, s, dw_sig(s));
    seen = 1;
    while (mep_dev_load_acquire(sig) < p.value) {
      if (mep_dev_now_ns() > deadline) {
        seen = 0;
        res[s].timeout = 1;
        break;
      }
      __nanosleep(256);
    }
  }
  __syncthreads();
  if (!seen) return;
  __threadfence_system();
  uint64_t offs[DW_PIECES], lens[DW_PIECES];
  for (int k = 0; k < DW_PIECES; k++)
    dw_piece(&p, s, me, k, &offs[k], &lens[k]);
  const volatile uint8_t *area = mep_dev_src(w, s, dw_recv(&p, s));
  for (uint64_t i = threadIdx.x; i < p.area; i += blockDim.x) {
    uint8_t want = 0;
    for (int k = 0; k < DW_PIECES; k++)
      if (i >= offs[k] && i - offs[k] < lens[k])
        want = dw_byte(&p, s, me, k, i - offs[k]);
    if (area[i] != want) {
      atomicAdd(&res[s].bad, 1ull);
      atomicMin(&res[s].first, (unsigned long long)i);
    }
  }
}

extern "C" int dw_round(const mep_dev_win_t *w, int rank,
                        const dw_params_t *p, dw_result_t *res, char *err,
                        size_t err_len) {
  (void)rank;
  dw_result_t *dres = NULL;
  size_t bytes = (size_t)p->n * sizeof *dres;
  cudaStream_t s = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(&dres, bytes);
  for (int i = 0; i < p->n && e == cudaSuccess; i++) {
    res[i].bad = 0;
    res[i].first = ~0ull;
    res[i].timeout = res[i].send_err = 0;
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(dres, res, bytes, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) {
    dw_send<<<p->n, 256, 0, s>>>(w, *p, dres);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) {
    dw_check<<<p->n, 256, 0, s>>>(w, *p, dres);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(res, dres, bytes, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess)
    snprintf(err, err_len, "%s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
  if (dres) cudaFree(dres);
  if (s) cudaStreamDestroy(s);
  return e == cudaSuccess ? 0 : -1;
}
