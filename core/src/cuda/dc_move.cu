/* dc_move.cu - the collectives that only move bytes: allgather, alltoall
 * and broadcast. Each rank stages what its peers need in its own
 * workspace, one barrier, then every rank copies what it needs from the
 * peers' workspaces (alltoall overlaps that with staging its next round;
 * a large broadcast among 3 ranks or more has the others pull pieces of
 * the root's data, then each other's).
 * Blocks of ranks that are inactive or time out are left untouched in the
 * output. */
#include "dc_host.h"

/* Each kernel goes through the message in rounds of at most `per` bytes
 * (of each rank's block for allgather and alltoall); the ranks waited for
 * in a round are those that answered the one before. Our own block never
 * goes through a peer: allgather copies it to the output in the staging
 * pass, alltoall copies it directly.
 *
 * allgather pipelines as alltoall does (see there why a buffer is free
 * when it is staged): round 0 is staged before the loop, and iteration k
 * pulls round k from the peers while it stages round k + 1, a slice of
 * it with each peer's pull in one fused copy, then one barrier. In place
 * (send is our block of recv) our block needs no copy. */
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_allgather(DcCtx c, const char *send, char *recv, size_t bpr,
                   size_t per) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  const size_t n0 = min(bpr, per);
  const size_t rounds = bpr / per + (bpr % per != 0);
  char *mine = recv + c.rank * bpr;
  const bool in_place = send == mine;
  const int slices = c.nranks > 1 ? c.nranks - 1 : 1;
  unsigned int live = sb.start_mask;
  size_t lo, hi;
  dc_round(sb, 0);
  dc_range(n0, n0, 16, &lo, &hi);
  dc_copy2(dc_buf(c, sb, c.rank) + lo, in_place ? nullptr : mine + lo,
           send + lo, hi - lo);
  live = dc_barrier(c, sb, 0, live);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t off = k * per, next = off + per;
    const bool more = k + 1 < rounds;
    size_t nlo = 0, nhi = 0;
    if (more) dc_range(n0, min(per, bpr - next), 16, &nlo, &nhi);
    char *stage = dc_buf_seq(c, sb, c.rank, sb.seq + 1);
    for (int j = 1; j <= slices; ++j) {
      int r = dc_peer(c, j);
      size_t slo = 0, shi = 0;
      if (more) dc_split(nlo, nhi, 16, slices, j - 1, &slo, &shi);
      const char *from = send + (more ? next + slo : 0);
      const DcSpan st = {stage + slo, from, shi - slo},
                   own = {mine + (more ? next + slo : 0), from, shi - slo};
      if (r == c.rank || !((live >> r) & 1u)) {
        dc_copy2(st.dst, in_place ? nullptr : own.dst, from, st.n);
        continue;
      }
      const DcSpan pull = {recv + r * bpr + off + lo, dc_buf(c, sb, r) + lo,
                           hi - lo};
      if (in_place) {
        const DcSpan s2[2] = {pull, st};
        dc_copy_spans(s2);
      } else {
        const DcSpan s3[3] = {pull, st, own};
        dc_copy_spans(s3);
      }
    }
    if (more) {
      dc_round(sb, k + 1);
      live = dc_barrier(c, sb, 0, live);
      lo = nlo, hi = nhi;
    }
  }
  dc_end(c, sb);
}

/* This block's share [off + lo, off + hi) of every rank's block in round
 * k of an alltoall. */
struct DcA2aRound {
  size_t off, lo, hi;
};

__device__ __forceinline__ DcA2aRound dc_a2a_round(size_t bpr, size_t per,
                                                   size_t k) {
  DcA2aRound q;
  q.off = k * per;
  dc_range(min(bpr, per), min(per, bpr - q.off), 16, &q.lo, &q.hi);
  return q;
}

/* Block r of send (at r * bpr) is staged at r * stride, stride being the
 * first round's piece rounded up to 16 bytes (every round alike, see
 * dc_range).
 *
 * Software pipeline, one barrier per round as in the other kernels: round
 * 0 is staged (and our own block copied) before the loop; iteration k
 * pulls round k from the peers' buffers of seq k while it stages round
 * k + 1 in our buffer of seq k + 1 and copies our own block's round k + 1,
 * all in one fused copy, then raises and waits for the barrier of round
 * k + 1. So the local copies overlap the NVLink reads.
 *
 * Why staging round k + 1 may overwrite the buffer of round k - 1: every
 * peer read round k - 1 from it before it raised its flag of round k, and
 * we passed that barrier. For k = 0 it is the previous launch's last
 * round, which peers pull with no barrier after it; but they raise round
 * 0's flag of this launch only after that launch ended (stream order), and
 * this launch's round 0 stages into the other buffer. Each round keeps
 * exactly one barrier, so the launch's rounds and its successor's chain.
 *
 * In place (send == recv) our own block needs no copy, and a peer's block
 * in send is overwritten by the pulls into recv; but only after the same
 * block staged those bytes (the pull of round k writes [off_k, off_k +
 * per) of each block, the stage of round k + 1 reads [off_k + per, ...)):
 * no byte is written before it was read. */
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_alltoall(DcCtx c, const char *send, char *recv, size_t bpr,
                  size_t per, size_t stride) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  const size_t rounds = bpr / per + (bpr % per != 0);
  const size_t mine = c.rank * bpr;
  const bool in_place = send == recv;
  unsigned int live = sb.start_mask;
  dc_round(sb, 0);
  DcA2aRound cur = dc_a2a_round(bpr, per, 0);
  char *stage = dc_buf_seq(c, sb, c.rank, sb.base);
  for (int r = 0; r < c.nranks; ++r)
    if (r != c.rank && ((live >> r) & 1u))
      dc_copy(stage + r * stride + cur.lo, send + r * bpr + cur.off + cur.lo,
              cur.hi - cur.lo);
  if (!in_place)
    dc_copy(recv + mine + cur.off + cur.lo, send + mine + cur.off + cur.lo,
            cur.hi - cur.lo);
  live = dc_barrier(c, sb, 0, live);
  for (size_t k = 0; k < rounds; ++k) {
    const bool more = k + 1 < rounds;
    DcA2aRound nxt = cur;
    if (more) nxt = dc_a2a_round(bpr, per, k + 1);
    stage = dc_buf_seq(c, sb, c.rank, sb.base + k + 1);
    const DcSpan own = {recv + mine + nxt.off + nxt.lo,
                        send + mine + nxt.off + nxt.lo, nxt.hi - nxt.lo};
    bool own_left = more && !in_place;
    for (int j = 1; j < c.nranks; ++j) {
      int r = dc_peer(c, j);
      if (!((live >> r) & 1u)) continue;
      const DcSpan pull = {recv + r * bpr + cur.off + cur.lo,
                           dc_buf_seq(c, sb, r, sb.base + k) +
                               c.rank * stride + cur.lo,
                           cur.hi - cur.lo};
      if (!more) {
        dc_copy(pull.dst, pull.src, pull.n);
        continue;
      }
      const DcSpan put = {stage + r * stride + nxt.lo,
                          send + r * bpr + nxt.off + nxt.lo, nxt.hi - nxt.lo};
      if (own_left) {
        const DcSpan s[3] = {pull, put, own};
        dc_copy_spans(s);
        own_left = false;
      } else {
        const DcSpan s[2] = {pull, put};
        dc_copy_spans(s);
      }
    }
    if (own_left) dc_copy(own.dst, own.src, own.n); /* no live peer */
    if (more) {
      dc_round(sb, k + 1);
      live = dc_barrier(c, sb, 0, live);
      cur = nxt;
    }
  }
  dc_end(c, sb);
}

/* Direct: every rank pulls the whole round from the root. Everyone waits
 * for everyone (not only for the root) so that no rank runs two rounds
 * ahead and overwrites a buffer still being read. The root's memory
 * serves each byte once per peer: fine for 2 ranks and small messages. */
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_broadcast(DcCtx c, char *buf, size_t bytes, size_t per, int root) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  const size_t n0 = min(bytes, per);
  unsigned int live = sb.start_mask;
  for (size_t off = 0, k = 0; off < bytes; off += per, ++k) {
    dc_round(sb, k);
    size_t lo, hi;
    dc_range(n0, min(per, bytes - off), 16, &lo, &hi);
    if (c.rank == root)
      dc_copy(dc_buf(c, sb, c.rank) + lo, buf + off + lo, hi - lo);
    live = dc_barrier(c, sb, 0, live);
    if (c.rank != root && ((live >> root) & 1u))
      dc_copy(buf + off + lo, dc_buf(c, sb, root) + lo, hi - lo);
  }
  dc_end(c, sb);
}

/* Split: the root's round is dealt in pieces among the other ranks that
 * answered the round's barrier (the takers); each pulls its piece from the
 * root into its output and its own workspace, and in the next round, while
 * it pulls its piece of that one, the other takers' pieces from them (in
 * ring order, so that no rank's memory serves two takers at once). The
 * root's memory serves each byte once (not once per peer), every taker's
 * serves its piece to the others, and one barrier per round keeps the
 * root's staging, the pieces and the exchange of the round before going
 * together. A taker that vanished leaves its piece to be pulled from the
 * root.
 *
 * Rounds use four areas (dc_area), not two buffers: the pieces of round k
 * and the root's copy are read until the pulls of iteration k + 1 end, and
 * the root stages round k + 2 during them. Area k + 4 is written only
 * after the barrier of round k + 3, which every rank raises when its pulls
 * of iteration k + 2 are done. The launch's last pulls follow its last
 * barrier; it then skips a seq, so that the next launch stages its first
 * round (before any barrier) into the other buffer, not over those pulls'
 * areas. */
__global__ void __launch_bounds__(DC_THREADS, 1)
    dc_k_broadcast_split(DcCtx c, char *buf, size_t bytes, size_t per,
                         int root) {
  __shared__ DcBlock sb;
  if (!dc_begin(c, sb)) return;
  const size_t n0 = min(bytes, per);
  const size_t rounds = bytes / per + (bytes % per != 0);
  const unsigned int rbit = 1u << root;
  const bool is_root = c.rank == root;
  const unsigned int below = (1u << c.rank) - 1;
  size_t lo, hi, plo = 0, phi = 0, slo, shi;
  unsigned int prev = 0; /* the takers of the round before */
  dc_round(sb, 0);
  dc_range(n0, n0, 16, &lo, &hi);
  if (is_root) dc_copy(dc_area(c, sb, c.rank, sb.seq) + lo, buf + lo, hi - lo);
  unsigned int m = dc_barrier(c, sb, 0, sb.start_mask);
  for (size_t k = 0;; ++k) {
    const unsigned long long seq = sb.seq;
    const unsigned int takers = k < rounds && (m & rbit) ? m & ~rbit : 0;
    /* The sources in ring order (dc_peer): at each step of the loop every
     * taker reads another rank, the root included. */
    for (int j = 1; !is_root && j < c.nranks; ++j) {
      int r = dc_peer(c, j);
      if (r == root && ((takers >> c.rank) & 1u)) {
        dc_split(lo, hi, 16, __popc(takers), __popc(takers & below), &slo,
                 &shi);
        dc_copy2(buf + k * per + slo, dc_area(c, sb, c.rank, seq) + slo,
                 dc_area(c, sb, root, seq) + slo, shi - slo);
      } else if (r != root && ((prev >> c.rank) & (prev >> r) & 1u)) {
        dc_split(plo, phi, 16, __popc(prev), __popc(prev & ((1u << r) - 1)),
                 &slo, &shi);
        const char *from = dc_area(c, sb, ((m >> r) & 1u) ? r : root, seq - 1);
        dc_copy(buf + (k - 1) * per + slo, from + slo, shi - slo);
      }
    }
    if (k == rounds) break;
    prev = takers, plo = lo, phi = hi;
    if (k + 1 < rounds) {
      dc_range(n0, min(per, bytes - (k + 1) * per), 16, &lo, &hi);
      if (is_root)
        dc_copy(dc_area(c, sb, c.rank, seq + 1) + lo, buf + (k + 1) * per + lo,
                hi - lo);
    }
    dc_round(sb, k + 1);
    m = dc_barrier(c, sb, 0, m);
  }
  dc_round(sb, rounds + 1);
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
  if (bytes_per_rank == 0) return 0;
  size_t n0 = bytes_per_rank < c.chunk ? bytes_per_rank : c.chunk;
  dc_k_allgather<<<dc_blocks(g, n0 * (size_t)g->nranks), DC_THREADS, 0,
                   (cudaStream_t)stream>>>(c, (const char *)send, (char *)recv,
                                           bytes_per_rank, c.chunk);
  return dc_launch_result(g, what);
}

extern "C" int mep__dc_alltoall(const mep__dc_group_t *g, const void *send,
                                void *recv, size_t bytes_per_rank,
                                void *stream) {
  const char *what = "alltoall";
  DcCtx c;
  int rc = dc_per_rank(g, what, bytes_per_rank, send, recv, &c);
  if (rc) return rc;
  if (bytes_per_rank == 0) return 0;
  size_t per = c.chunk / (size_t)g->nranks & ~(size_t)15;
  size_t n0 = bytes_per_rank < per ? bytes_per_rank : per;
  size_t stride = (n0 + 15) & ~(size_t)15;
  dc_k_alltoall<<<dc_blocks(g, n0 * (size_t)g->nranks), DC_THREADS, 0,
                  (cudaStream_t)stream>>>(c, (const char *)send, (char *)recv,
                                          bytes_per_rank, per, stride);
  return dc_launch_result(g, what);
}

extern "C" int mep__dc_broadcast(const mep__dc_group_t *g, void *buf,
                                 size_t bytes, int root, int algo,
                                 void *stream) {
  const char *what = "broadcast";
  DcCtx c;
  int rc = dc_prepare(g, what, &c);
  if (!rc) rc = dc_need(g, what, bytes, buf, buf);
  if (rc) return rc;
  if (root < 0 || root >= g->nranks)
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: broadcast on rank %d: root %d is not in 0..%d",
                   g->rank, root, g->nranks - 1);
  if (algo < 0 || algo > 2)
    return dc_fail(MEP_ERR_INVALID,
                   "devcoll: broadcast: unknown algorithm %d (0 auto, 1 "
                   "direct, 2 split)",
                   algo);
  if (bytes == 0) return 0;
  size_t n0 = bytes < c.chunk ? bytes : c.chunk;
  int nb = dc_blocks(g, n0);
  cudaStream_t st = (cudaStream_t)stream;
  if (algo == 2 ||
      (algo == 0 && g->nranks > 2 && bytes > MEP__DC_BCAST_DIRECT_MAX))
    dc_k_broadcast_split<<<nb, DC_THREADS, 0, st>>>(c, (char *)buf, bytes,
                                                    c.chunk, root);
  else
    dc_k_broadcast<<<nb, DC_THREADS, 0, st>>>(c, (char *)buf, bytes, c.chunk,
                                              root);
  return dc_launch_result(g, what);
}
