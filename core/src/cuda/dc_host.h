/* dc_host.h - host-side helpers shared by the device collectives:
 * the thread-local error message, argument checks, the workspace geometry
 * and the (dtype, op) -> kernel template dispatch. C++ (nvcc) only. */
#ifndef MEP_SRC_CUDA_DC_HOST_H
#define MEP_SRC_CUDA_DC_HOST_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "dc_reduce.cuh"
#include "devcoll.h"

/* Stores the message (printf style) and returns code. */
int dc_fail(int code, const char *fmt, ...) MEP_PRINTF(2, 3);

/* MEP_ERR_SYSTEM naming `what` if the last launch failed, else 0. */
int dc_launch_result(const mep__dc_group_t *g, const char *what);

/* Checks the group (and that g's own rank is active where the host can
 * tell); fills the kernel context. `what` names the call in messages. */
int dc_prepare(const mep__dc_group_t *g, const char *what, DcCtx *ctx);

/* MEP_ERR_INVALID unless (dt, op) is a reduction the kernels do;
 * allow_bool_avg for reduce_local, where avg means sum. */
int dc_check_reduction(const char *what, mep_dtype_t dt, mep_op_t op,
                       int allow_bool_avg);

/* Blocks for a launch that moves `bytes` (same on every rank). */
int dc_blocks(const mep__dc_group_t *g, size_t bytes);

/* a * b, or MEP_ERR_INVALID on overflow. */
int dc_mul(const char *what, size_t a, size_t b, size_t *out);

/* Calls F<T, OP>::run(args...) for the element type of dt. */
template <template <class, int> class F, class T, typename... Args>
int dc_dispatch_op(mep_op_t op, Args... args) {
  switch (op) {
  case MEP_SUM: return F<T, MEP_SUM>::run(args...);
  case MEP_PROD: return F<T, MEP_PROD>::run(args...);
  case MEP_MIN: return F<T, MEP_MIN>::run(args...);
  case MEP_MAX: return F<T, MEP_MAX>::run(args...);
  case MEP_AVG: return F<T, MEP_AVG>::run(args...);
  }
  return dc_fail(MEP_ERR_INVALID, "devcoll: unknown op %d", (int)op);
}

template <template <class, int> class F, typename... Args>
int dc_dispatch(mep_dtype_t dt, mep_op_t op, Args... args) {
  switch (dt) {
  case MEP_FLOAT16: return dc_dispatch_op<F, DcF16>(op, args...);
  case MEP_BFLOAT16: return dc_dispatch_op<F, DcBF16>(op, args...);
  case MEP_FLOAT32: return dc_dispatch_op<F, DcF32>(op, args...);
  case MEP_FLOAT64: return dc_dispatch_op<F, DcF64>(op, args...);
  case MEP_INT8: return dc_dispatch_op<F, DcI8>(op, args...);
  case MEP_UINT8: return dc_dispatch_op<F, DcU8>(op, args...);
  case MEP_INT32: return dc_dispatch_op<F, DcI32>(op, args...);
  case MEP_INT64: return dc_dispatch_op<F, DcI64>(op, args...);
  case MEP_BOOL: return dc_dispatch_op<F, DcBool>(op, args...);
  }
  return dc_fail(MEP_ERR_INVALID, "devcoll: unknown dtype %d", (int)dt);
}

#endif
