/* dc_move.cu - the collectives that only move bytes: allgather, alltoall
 * and broadcast. Each rank stages what its peers need in its own
 * workspace, one barrier, then every rank copies what it needs from the
 * peers' workspaces. Blocks of ranks that are inactive or time out are
 * left untouched in the output. */
#include "dc_host.h"

__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_allgather(DcCtx c, const char *send, char *recv, size_t piece,
                   size_t bpr) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  size_t lo, hi;
  dc_part(piece, 16, &lo, &hi);
  dc_copy(dc_buf(c, sb, c.rank) + lo, send + lo, hi - lo);
  unsigned int m = dc_barrier(c, sb, 0, sb.start_mask);
  for (int r = 0; r < c.nranks; ++r)
    if ((m >> r) & 1u)
      dc_copy(recv + r * bpr + lo, dc_buf(c, sb, r) + lo, hi - lo);
  dc_end(c, sb);
}

/* Block r of send (at r * bpr) is staged at r * stride. */
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_alltoall(DcCtx c, const char *send, char *recv, size_t piece,
                  size_t stride, size_t bpr) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  size_t lo, hi;
  dc_part(piece, 16, &lo, &hi);
  char *stage = dc_buf(c, sb, c.rank);
  for (int r = 0; r < c.nranks; ++r)
    if ((sb.start_mask >> r) & 1u)
      dc_copy(stage + r * stride + lo, send + r * bpr + lo, hi - lo);
  unsigned int m = dc_barrier(c, sb, 0, sb.start_mask);
  for (int r = 0; r < c.nranks; ++r)
    if ((m >> r) & 1u)
      dc_copy(recv + r * bpr + lo, dc_buf(c, sb, r) + c.rank * stride + lo,
              hi - lo);
  dc_end(c, sb);
}

/* Everyone waits for everyone (not only for the root) so that no rank runs
 * two launches ahead and overwrites a buffer still being read. */
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_broadcast(DcCtx c, char *buf, size_t n, int root) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  size_t lo, hi;
  dc_part(n, 16, &lo, &hi);
  if (c.rank == root) dc_copy(dc_buf(c, sb, c.rank) + lo, buf + lo, hi - lo);
  unsigned int m = dc_barrier(c, sb, 0, sb.start_mask);
  if (c.rank != root && ((m >> root) & 1u))
    dc_copy(buf + lo, dc_buf(c, sb, root) + lo, hi - lo);
  dc_end(c, sb);
}

static int dc_need(const mep__dc_group_t *g, const char *what, size_t bytes,
                   const void *a, const void *b) {
  if (bytes && (!a || !b))
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: %s on rank %d: %zu bytes with buffers %p and %p",
                   what, g->rank, bytes, a, b);
  return 0;
}

/* The checks of a collective that moves bytes_per_rank to or from every
 * rank (nranks blocks of it must be addressable). */
static int dc_per_rank(const mep__dc_group_t *g, const char *what,
                       size_t bytes_per_rank, const void *send, void *recv,
                       DcCtx *c) {
  int rc = dc_prepare(g, what, c);
  size_t total;
  if (!rc) rc = dc_mul(what, bytes_per_rank, (size_t)g->nranks, &total);
  if (!rc) rc = dc_need(g, what, bytes_per_rank, send, recv);
  return rc;
}

extern "C" int mep__dc_allgather(const mep__dc_group_t *g, const void *send,
                                 void *recv, size_t bytes_per_rank,
                                 void *stream) {
  const char *what = "allgather";
  DcCtx c;
  int rc = dc_per_rank(g, what, bytes_per_rank, send, recv, &c);
  if (rc) return rc;
  cudaStream_t st = (cudaStream_t)stream;
  for (size_t off = 0; off < bytes_per_rank; off += c.chunk) {
    size_t n = bytes_per_rank - off < c.chunk ? bytes_per_rank - off : c.chunk;
    dc_k_allgather<<<dc_blocks(g, n * (size_t)g->nranks), DC_THREADS, 0, st>>>(
        c, (const char *)send + off, (char *)recv + off, n, bytes_per_rank);
    if ((rc = dc_launch_result(g, what))) return rc;
  }
  return 0;
}

extern "C" int mep__dc_alltoall(const mep__dc_group_t *g, const void *send,
                                void *recv, size_t bytes_per_rank,
                                void *stream) {
  const char *what = "alltoall";
  DcCtx c;
  int rc = dc_per_rank(g, what, bytes_per_rank, send, recv, &c);
  if (rc) return rc;
  cudaStream_t st = (cudaStream_t)stream;
  size_t per = c.chunk / (size_t)g->nranks & ~(size_t)15;
  for (size_t off = 0; off < bytes_per_rank; off += per) {
    size_t n = bytes_per_rank - off < per ? bytes_per_rank - off : per;
    size_t stride = (n + 15) & ~(size_t)15;
    dc_k_alltoall<<<dc_blocks(g, n * (size_t)g->nranks), DC_THREADS, 0, st>>>(
        c, (const char *)send + off, (char *)recv + off, n, stride,
        bytes_per_rank);
    if ((rc = dc_launch_result(g, what))) return rc;
  }
  return 0;
}

extern "C" int mep__dc_broadcast(const mep__dc_group_t *g, void *buf,
                                 size_t bytes, int root, void *stream) {
  const char *what = "broadcast";
  DcCtx c;
  int rc = dc_prepare(g, what, &c);
  if (!rc) rc = dc_need(g, what, bytes, buf, buf);
  if (rc) return rc;
  if (root < 0 || root >= g->nranks)
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: broadcast on rank %d: root %d is not in 0..%d",
                   g->rank, root, g->nranks - 1);
  cudaStream_t st = (cudaStream_t)stream;
  for (size_t off = 0; off < bytes; off += c.chunk) {
    size_t n = bytes - off < c.chunk ? bytes - off : c.chunk;
    dc_k_broadcast<<<dc_blocks(g, n), DC_THREADS, 0, st>>>(
        c, (char *)buf + off, n, root);
    if ((rc = dc_launch_result(g, what))) return rc;
  }
  return 0;
}
