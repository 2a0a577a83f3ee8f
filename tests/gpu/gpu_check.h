/* gpu_check.h - the GPU tests' checks of CUDA and mep calls: on failure
 * they print the rank, what failed and why, and `return fail` from the
 * calling function. Each test defines its short CK / MEPCK on them. */
#ifndef MEP_TESTS_GPU_CHECK_H
#define MEP_TESTS_GPU_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>

#include <mep/mep.h>

#define GPU_CK(rank, fail, e, what)                                        \
  do {                                                                     \
    cudaError_t e_ = (e);                                                  \
    if (e_ != cudaSuccess) {                                               \
      fprintf(stderr, "rank %d: %s: %s\n", (rank), (what),                 \
              cudaGetErrorString(e_));                                     \
      return (fail);                                                       \
    }                                                                      \
  } while (0)

#define GPU_MEPCK(rank, fail, e, what)                                     \
  do {                                                                     \
    int rc_ = (e);                                                         \
    if (rc_ < 0) {                                                         \
      fprintf(stderr, "rank %d: %s: %s (%s)\n", (rank), (what),            \
              mep_strerror(rc_), mep_last_error());                        \
      return (fail);                                                       \
    }                                                                      \
  } while (0)

#endif
