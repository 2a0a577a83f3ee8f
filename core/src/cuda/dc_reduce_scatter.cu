/* dc_reduce_scatter.cu - reduce-scatter over the mapped workspaces: every
 * rank stages the pieces of all slices of a round, one barrier, then each
 * rank reduces its own slice from every active rank's staged piece. */
#include "dc_host.h"

/* send: slice r's piece at send + r * cpr elements. A round takes at most
 * `per` elements of each slice; slice r's are staged at r * stride
 * elements, stride being the first round's piece rounded up to 16 bytes
 * (every round alike, see dc_range; every staged piece 16-byte aligned). */
template <class T, int OP>
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_reduce_scatter(DcCtx c, const char *send, char *recv, size_t cpr,
                        size_t per, size_t stride) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  constexpr size_t S = sizeof(typename T::St);
  const size_t n0 = min(cpr, per);
  unsigned int live = sb.start_mask;
  for (size_t off = 0, k = 0; off < cpr; off += per, ++k) {
    dc_round(sb, k);
    size_t lo, hi;
    dc_range(n0, min(per, cpr - off), 16 / S, &lo, &hi);
    char *stage = dc_buf(c, sb, c.rank);
    for (int r = 0; r < c.nranks; ++r)
      if ((live >> r) & 1u)
        dc_copy(stage + (r * stride + lo) * S,
                send + (r * cpr + off + lo) * S, (hi - lo) * S);
    live = dc_barrier(c, sb, 0, live);
    int nsrc = dc_sources(c, sb, live, c.rank * stride * S);
    dc_reduce_range<T, OP>(sb, nsrc, recv + off * S, nullptr, lo, hi);
  }
  dc_end(c, sb);
}

template <class T, int OP> struct DcReduceScatter {
  static int run(const mep__dc_group_t *g, const DcCtx *c, const char *send,
                 char *recv, size_t cpr, cudaStream_t st) {
    constexpr size_t S = sizeof(typename T::St);
    constexpr size_t E = 16 / S;
    size_t per = c->chunk / S / (size_t)g->nranks / E * E;
    size_t n0 = cpr < per ? cpr : per;
    size_t stride = (n0 + E - 1) / E * E;
    int nb = dc_blocks(g, n0 * S * (size_t)g->nranks);
    dc_k_reduce_scatter<T, OP><<<nb, DC_THREADS, 0, st>>>(*c, send, recv, cpr,
                                                          per, stride);
    return dc_launch_result(g, "reduce_scatter");
  }
};

extern "C" int mep__dc_reduce_scatter(const mep__dc_group_t *g,
                                      const void *send, void *recv,
                                      size_t count_per_rank, mep_dtype_t dt,
                                      mep_op_t op, void *stream) {
  const char *what = "reduce_scatter";
  int rc = dc_check_reduction(what, dt, op, 0);
  if (rc) return rc;
  DcCtx c;
  rc = dc_prepare(g, what, &c);
  if (rc) return rc;
  size_t bytes;
  rc = dc_mul(what, count_per_rank, mep_dtype_size(dt) * (size_t)g->nranks,
              &bytes);
  if (rc) return rc;
  if (count_per_rank == 0) return 0;
  if (!send || !recv)
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: reduce_scatter on rank %d: %zu elements per rank "
                   "with send %p and recv %p",
                   g->rank, count_per_rank, send, recv);
  return dc_dispatch<DcReduceScatter>(dt, op, g, (const DcCtx *)&c,
                                      (const char *)send, (char *)recv,
                                      count_per_rank, (cudaStream_t)stream);
}
