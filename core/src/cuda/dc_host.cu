/* dc_host.cu - host-side helpers of the device collectives (see
 * dc_host.h) and the workspace geometry of devcoll.h. */
#include <stdarg.h>
#include <stdio.h>

#include "dc_host.h"

/* Smallest result area (half a data buffer) that mep__dc_ws_min grants. */
#define DC_MIN_CHUNK (64u * 1024u)
/* A launch gets one block per this many bytes, up to the group's limit. */
#define DC_BLOCK_BYTES (32u * 1024u)
/* Blocks when the group leaves the choice to us. */
#define DC_DEFAULT_BLOCKS 32

static thread_local char dc_msg[512];

int dc_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dc_msg, sizeof dc_msg, fmt, ap);
  va_end(ap);
  return code;
}

extern "C" const char *mep__dc_last_error(void) { return dc_msg; }

int dc_launch_result(const mep__dc_group_t *g, const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  return dc_fail(MEP_ERR_SYSTEM, "devcoll: %s on rank %d: kernel launch failed: %s",
                 what, g->rank, cudaGetErrorString(e));
}

/* Bytes of each data buffer; chunk (result area offset) is half of it. */
static size_t dc_buf_bytes(size_t ws_bytes) {
  if (ws_bytes < DC_FLAGS_BYTES) return 0;
  return ((ws_bytes - DC_FLAGS_BYTES) / 2) & ~(size_t)255;
}

extern "C" size_t mep__dc_ws_min(int nranks) {
  (void)nranks; /* alltoall pieces stay >= 4 KiB up to MEP__DC_MAX_RANKS */
  return DC_FLAGS_BYTES + 4 * (size_t)DC_MIN_CHUNK;
}

static int dc_group_ok(const mep__dc_group_t *g) {
  return g && g->nranks >= 1 && g->nranks <= MEP__DC_MAX_RANKS &&
         g->rank >= 0 && g->rank < g->nranks && g->peer_ws && g->active &&
         g->status && g->ws_bytes >= mep__dc_ws_min(g->nranks) &&
         g->sms >= 0;
}

extern "C" size_t mep__dc_chunk_max(const mep__dc_group_t *g) {
  if (!dc_group_ok(g)) return 0;
  return (dc_buf_bytes(g->ws_bytes) / 2) & ~(size_t)255;
}

extern "C" int mep__dc_init_ws(void *ws, size_t ws_bytes, void *stream) {
  if (!ws || ws_bytes < mep__dc_ws_min(1))
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: init_ws: workspace %p of %zu bytes is invalid "
                   "(need a pointer and at least %zu bytes)",
                   ws, ws_bytes, mep__dc_ws_min(1));
  cudaError_t e =
      cudaMemsetAsync(ws, 0, DC_FLAGS_BYTES, (cudaStream_t)stream);
  if (e != cudaSuccess)
    return dc_fail(MEP_ERR_SYSTEM, "devcoll: init_ws: zeroing the flags of %p: %s",
                   ws, cudaGetErrorString(e));
  return 0;
}

/* 1 and *val when the host can read our active entry without a sync
 * (mapped host or managed memory), else 0 (the kernel checks it then).
 * The group's host view saves a driver call per launch. */
static int dc_host_active(const mep__dc_group_t *g, int32_t *val) {
  if (g->host_active) {
    *val = g->host_active[g->rank];
    return 1;
  }
  const volatile int32_t *p = g->active + g->rank;
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, (const void *)p) != cudaSuccess) {
    (void)cudaGetLastError(); /* not a CUDA pointer: not ours to judge */
    return 0;
  }
  if (a.type == cudaMemoryTypeHost && a.hostPointer) {
    *val = *(const volatile int32_t *)a.hostPointer;
    return 1;
  }
  if (a.type == cudaMemoryTypeManaged) {
    *val = *p;
    return 1;
  }
  return 0;
}

int dc_prepare(const mep__dc_group_t *g, const char *what, DcCtx *ctx) {
  if (!dc_group_ok(g)) {
    if (!g) return dc_fail(MEP_ERR_INVALID, "devcoll: %s: group is NULL", what);
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: %s: invalid group (rank %d of %d ranks, at most "
                   "%d; peer_ws %p, active %p, status %p; workspace %zu bytes, "
                   "at least %zu; sms %d)",
                   what, g->rank, g->nranks, MEP__DC_MAX_RANKS,
                   (const void *)g->peer_ws, (const void *)g->active,
                   (const void *)g->status, g->ws_bytes,
                   mep__dc_ws_min(g->nranks), g->sms);
  }
  int32_t own;
  if (dc_host_active(g, &own) && own == 0)
    return dc_fail(MEP_ERR_EXCLUDED,
                   "devcoll: %s on rank %d: this rank is marked inactive",
                   what, g->rank);
  ctx->peer_ws = g->peer_ws;
  ctx->active = g->active;
  ctx->status = g->status;
  ctx->timeout_ns = g->timeout_ns ? g->timeout_ns : DC_DEFAULT_TIMEOUT_NS;
  ctx->buf_bytes = dc_buf_bytes(g->ws_bytes);
  ctx->chunk = mep__dc_chunk_max(g);
  ctx->rank = g->rank;
  ctx->nranks = g->nranks;
  return 0;
}

int dc_check_reduction(const char *what, mep_dtype_t dt, mep_op_t op,
                       int allow_bool_avg) {
  if ((unsigned)dt >= MEP_DTYPE_COUNT)
    return dc_fail(MEP_ERR_INVALID, "devcoll: %s: unknown dtype %d", what,
                   (int)dt);
  if ((unsigned)op >= MEP_OP_COUNT)
    return dc_fail(MEP_ERR_INVALID, "devcoll: %s: unknown op %d", what,
                   (int)op);
  if (dt == MEP_BOOL && op == MEP_AVG && !allow_bool_avg)
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: %s: avg on bool is not defined; use sum (or) "
                   "or prod (and)",
                   what);
  return 0;
}

int dc_blocks(const mep__dc_group_t *g, size_t bytes) {
  int limit = g->sms > 0 ? g->sms : DC_DEFAULT_BLOCKS;
  if (limit > DC_MAX_BLOCKS) limit = DC_MAX_BLOCKS;
  size_t want = (bytes + DC_BLOCK_BYTES - 1) / DC_BLOCK_BYTES;
  if (want < 1) want = 1;
  return want < (size_t)limit ? (int)want : limit;
}

int dc_mul(const char *what, size_t a, size_t b, size_t *out) {
  if (b != 0 && a > (size_t)-1 / b)
    return dc_fail(MEP_ERR_INVALID, "devcoll: %s: size %zu x %zu overflows",
                   what, a, b);
  *out = a * b;
  return 0;
}

