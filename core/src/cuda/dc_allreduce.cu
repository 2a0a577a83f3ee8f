/* dc_allreduce.cu - all-reduce over the mapped workspaces.
 *
 * One-shot: every rank stages its input in its own workspace, one barrier,
 * then every rank reduces all ranks' staged data itself (n x the reads,
 * one barrier: for small sizes). Two-shot: after the staging barrier each
 * rank reduces only its share, publishes it in its workspace's result
 * area, a second barrier, then every rank gathers the others' shares (each
 * byte read about twice: for large sizes). Shares are dealt among the
 * ranks that passed the first barrier; a share whose owner vanished
 * before the second barrier is reduced by every rank itself, in the same
 * rank order, so the results stay identical. Push (two ranks, large):
 * each rank writes its input into the other's result area, one barrier,
 * then each reduces both locally. The bytes cross NVLink once, as writes,
 * and nothing is staged (docs/perf.md: 0.91-0.94 of NCCL's bus bandwidth
 * at 1 GiB with the two-shot, 0.98-0.99 with this); with two ranks every
 * rank holds every input, so a rank that vanishes leaves nothing to
 * recover. */
#include "dc_host.h"

/* Both kernels go through count elements in rounds of at most `per`
 * (the result area, c.chunk); the ranks waited for in a round are those
 * that answered the one before. */
template <class T, int OP>
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_oneshot(DcCtx c, const char *send, char *recv, size_t count,
                 size_t per) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  constexpr size_t S = sizeof(typename T::St);
  const size_t n0 = min(count, per);
  unsigned int live = sb.start_mask;
  for (size_t off = 0, k = 0; off < count; off += per, ++k) {
    dc_round(sb, k);
    size_t lo, hi;
    dc_range(n0, min(per, count - off), 16 / S, &lo, &hi);
    dc_copy(dc_buf(c, sb, c.rank) + lo * S, send + (off + lo) * S,
            (hi - lo) * S);
    live = dc_barrier(c, sb, 0, live);
    int nsrc = dc_sources(c, sb, live, 0);
    dc_reduce_range<T, OP>(sb, nsrc, recv + off * S, nullptr, lo, hi);
  }
  dc_end(c, sb);
}

template <class T, int OP>
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_twoshot(DcCtx c, const char *send, char *recv, size_t count,
                 size_t per) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  constexpr size_t S = sizeof(typename T::St);
  constexpr size_t E = 16 / S;
  const size_t n0 = min(count, per);
  unsigned int live = sb.start_mask;
  for (size_t off = 0, rd = 0; off < count; off += per, ++rd) {
    dc_round(sb, rd);
    const char *in = send + off * S;
    char *out = recv + off * S;
    char *own = dc_buf(c, sb, c.rank);
    size_t lo, hi;
    dc_range(n0, min(per, count - off), E, &lo, &hi);
    dc_copy(own + lo * S, in + lo * S, (hi - lo) * S);
    unsigned int m0 = dc_barrier(c, sb, 0, live);
    int k = dc_sources(c, sb, m0, 0);
    int me = __popc(m0 & ((1u << c.rank) - 1));
    size_t slo, shi;
    dc_split(lo, hi, E, k, me, &slo, &shi);
    dc_reduce_range<T, OP>(sb, k, out, own + c.chunk, slo, shi);
    unsigned int m1 = dc_barrier(c, sb, 1, m0);
    for (int j = 1; j < c.nranks; ++j) {
      int r = dc_peer(c, j);
      if (!((m0 >> r) & 1u)) continue;
      dc_split(lo, hi, E, k, __popc(m0 & ((1u << r) - 1)), &slo, &shi);
      if ((m1 >> r) & 1u)
        dc_copy(out + slo * S, dc_buf(c, sb, r) + c.chunk + slo * S,
                (shi - slo) * S);
      else
        dc_reduce_range<T, OP>(sb, k, out, nullptr, slo, shi);
    }
    live = m1;
  }
  dc_end(c, sb);
}

/* send must be 16-byte aligned: it is a source of dc_reduce_range. */
template <class T, int OP>
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_push(DcCtx c, const char *send, char *recv, size_t count,
              size_t per) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  constexpr size_t S = sizeof(typename T::St);
  const size_t n0 = min(count, per);
  const int peer = 1 - c.rank;
  unsigned int live = sb.start_mask;
  for (size_t off = 0, k = 0; off < count; off += per, ++k) {
    dc_round(sb, k);
    const char *in = send + off * S;
    char *theirs = dc_buf(c, sb, c.rank) + c.chunk; /* the peer's input */
    size_t lo, hi;
    dc_range(n0, min(per, count - off), 16 / S, &lo, &hi);
    if ((live >> peer) & 1u)
      dc_copy(dc_buf(c, sb, peer) + c.chunk + lo * S, in + lo * S,
              (hi - lo) * S);
    live = dc_barrier(c, sb, 0, live);
    if (threadIdx.x == 0) {
      int j = 0;
      for (int r = 0; r < 2; ++r)
        if ((live >> r) & 1u) sb.src[j++] = r == c.rank ? in : theirs;
    }
    __syncthreads();
    dc_reduce_range<T, OP>(sb, __popc(live), recv + off * S, nullptr, lo, hi);
  }
  dc_end(c, sb);
}

/* One launch for the whole message: its rounds run back to back in every
 * block, without a grid-wide stop between them. */
template <class T, int OP> struct DcAllreduce {
  static int run(const mep__dc_group_t *g, const DcCtx *c, const char *send,
                 char *recv, size_t count, int kind, cudaStream_t st) {
    constexpr size_t S = sizeof(typename T::St);
    size_t per = c->chunk / S;
    size_t n0 = count < per ? count : per;
    int nb = dc_blocks(g, n0 * S);
    if (kind == 3)
      dc_k_push<T, OP><<<nb, DC_THREADS, 0, st>>>(*c, send, recv, count, per);
    else if (kind == 2)
      dc_k_twoshot<T, OP><<<nb, DC_THREADS, 0, st>>>(*c, send, recv, count,
                                                    per);
    else
      dc_k_oneshot<T, OP><<<nb, DC_THREADS, 0, st>>>(*c, send, recv, count,
                                                    per);
    return dc_launch_result(g, "allreduce");
  }
};

extern "C" int mep__dc_allreduce(const mep__dc_group_t *g, const void *send,
                                 void *recv, size_t count, mep_dtype_t dt,
                                 mep_op_t op, int algo, void *stream) {
  const char *what = "allreduce";
  int rc = dc_check_reduction(what, dt, op, 0);
  if (rc) return rc;
  if (algo < 0 || algo > 3)
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: allreduce: unknown algorithm %d (0 auto, 1 "
                   "one-shot, 2 two-shot, 3 push)",
                   algo);
  DcCtx c;
  rc = dc_prepare(g, what, &c);
  if (rc) return rc;
  size_t bytes;
  rc = dc_mul(what, count, mep_dtype_size(dt), &bytes);
  if (rc) return rc;
  if (count == 0) return 0;
  if (!send || !recv)
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: allreduce on rank %d: %zu elements with send %p "
                   "and recv %p",
                   g->rank, count, send, recv);
  int kind = algo ? algo : bytes > MEP__DC_ONESHOT_MAX ? 3 : 1;
  /* push where it applies (two ranks, an input it can reduce from) */
  if (kind == 3 && (g->nranks != 2 || ((uintptr_t)send & 15))) kind = 2;
  return dc_dispatch<DcAllreduce>(dt, op, g, (const DcCtx *)&c,
                                  (const char *)send, (char *)recv, count,
                                  kind, (cudaStream_t)stream);
}
