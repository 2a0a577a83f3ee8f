/* ep_normal.c - the high-throughput ("normal") mode of ep.h: the buffer,
 * get_dispatch_layout, the count exchange (notify, on the host for both
 * paths), the checks of every call, and the CPU path's dispatch (also
 * cached) and combine over a host region registered with every transport.
 * A CUDA buffer's dispatch and combine go to cuda/ep_normal_cuda.c after
 * the checks.
 *
 * A rank's region (num_bytes, cut as below; R ranks, P = pair bytes):
 *   signal words  nsig [2][R], dsig [2][R], csig [2][R]: (seq << 32) | n
 *                 from source s, after its counts / tokens / rows landed
 *   counts        [2][R] slots of CW int32 from each source: status,
 *                 num_tokens, num_experts, dispatch and combine message
 *                 bytes, its num_tokens_per_rank row [R], then the counts
 *                 of this rank's experts [L]
 *   count stage   [R] slots: what this rank sends each rank
 *   device counts [2][R] slots as counts, for the CUDA path's exchange
 *                 kernel (the window's counts hold its agreement words)
 *   dispatch recv [2][R][P]: source s's messages, in its token order
 *   combine recv  [2][R][P]: the rows rank r sends back, in the order this
 *                 rank sent r its tokens
 *   dispatch stage [R][P]: the messages for each rank, in slot order, so
 *                 that one put per rank sends them; combine stage [R * P]:
 *                 the rows going back, in received order (one put per
 *                 source). Stages are rewritten only after mep_flush.
 * [2]: calls alternate between halves by their sequence number (counted
 * per kind from 1), so back-to-back calls need no cleaning; a peer can be
 * at most one call ahead, since each call needs every peer's part.
 * After its waits, each step agrees with the other survivors on the ranks
 * it lost (agree(): an all-reduce of the active flags).
 * A dispatch message: [int32 source token | 12 pad | x (hidden * elem
 * bytes, a multiple of 16) | scales (4 bytes each) | pad to 8 | topk_idx
 * int64 [K] | topk_weights float [K]], padded to 16 bytes. A combine
 * message: [bf16 row | float weights [K]], padded to 16 bytes. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ep_fp8.h"
#include "ep_util.h"
#include "ep_normal.h"
#include "layout.h"
#include "mep/ep.h"

#define INVALID(...) mep_set_error(MEP_ERR_INVALID, 0, __VA_ARGS__)
#define NALIGN MEP__EPN_ALIGN
#define PAGE MEP__EPN_PAGE
#define CW_HDR MEP__EPN_CW_HDR

typedef mep__epn_lay_t nlay_t;

static uint64_t al(uint64_t v, uint64_t a) { return mep__epn_al(v, a); }

static void layout_head(nlay_t *l, int R) {
  uint64_t r = (uint64_t)R, off = 0;
  l->R = R;
  l->cw = al((uint64_t)(CW_HDR + R + MEP_EP_MAX_LOCAL_EXPERTS) * 4, NALIGN);
  l->nsig = off;
  off += 2 * r * 8;
  l->dsig = off;
  off += 2 * r * 8;
  l->csig = off;
  off = al(off + 2 * r * 8, NALIGN);
  l->cnt = off;
  off += 2 * r * l->cw;
  l->cnt_stage = off;
  off += r * l->cw;
  l->ncnt = off;
  off += 2 * r * l->cw;
  l->head = al(off, PAGE);
}

/* The data areas for pair bytes P. */
static void layout_data(nlay_t *l, uint64_t P) {
  uint64_t r = (uint64_t)l->R;
  l->pair = P;
  l->drecv = l->head;
  l->crecv = l->drecv + 2 * r * P;
  l->dstage = l->crecv + 2 * r * P;
  l->cstage = l->dstage + r * P;
  l->total = l->cstage + r * P;
}

/* num_bytes for pairs of P bytes with R ranks. */
static uint64_t need_bytes(int R, uint64_t P) {
  nlay_t l;
  layout_head(&l, R);
  layout_data(&l, al(P, NALIGN));
  return l.total;
}

size_t mep_ep_normal_size_hint(int num_ranks, int tokens_per_pair, int hidden,
                               int num_topk) {
  if (num_ranks < 1 || tokens_per_pair < 0 || hidden < 1 || num_topk < 0 ||
      num_topk > MEP_EP_NORMAL_MAX_TOPK)
    return 0;
  uint64_t m = mep__epn_dmsg_bytes(hidden, 2, 0, num_topk);
  uint64_t f = mep__epn_dmsg_bytes(hidden, 1, (hidden + 127) / 128, num_topk);
  uint64_t c = mep__epn_cmsg_bytes(hidden, num_topk);
  if (f > m) m = f;
  if (c > m) m = c;
  double d = (double)m * tokens_per_pair * 6.0 * num_ranks;
  if (d > (double)((uint64_t)1 << 50)) return 0;
  return (size_t)need_bytes(num_ranks, m * (uint64_t)tokens_per_pair);
}

/* Frees what create made (any part may be missing). */
static void free_normal(mep_ep_normal_t *b) {
#ifdef MEP_HAVE_CUDA
  mep__epn_cuda_destroy(b);
#endif
  if (b->region) (void)mep_region_deregister(b->region);
  free(b->mem);
  free(b->active);
  free(b->counts);
  free(b->src_tokens);
  free(b->itr_count);
  free(b->work);
  free(b->agreed);
  free(b);
}

int mep_ep_normal_create(mep_comm_t *comm, const mep_ep_normal_config_t *cfg,
                         mep_ep_normal_t **out) {
  const char *fn = "mep_ep_normal_create";
  if (!comm || !cfg || !out)
    return INVALID("%s: %s is NULL", fn,
                   !comm ? "comm" : !cfg ? "cfg" : "out");
  *out = NULL;
  if (cfg->struct_size < sizeof(mep_ep_normal_config_t))
    return INVALID("%s: cfg->struct_size %zu is less than "
                   "sizeof(mep_ep_normal_config_t) (%zu)", fn,
                   cfg->struct_size, sizeof(mep_ep_normal_config_t));
  if (cfg->flags & ~(MEP_EP_HOST | MEP_EP_CUDA))
    return INVALID("%s: flags 0x%x has unknown bits 0x%x", fn, cfg->flags,
                   cfg->flags & ~(MEP_EP_HOST | MEP_EP_CUDA));
  if (cfg->flags != MEP_EP_HOST && cfg->flags != MEP_EP_CUDA)
    return INVALID("%s: flags 0x%x must be MEP_EP_HOST or MEP_EP_CUDA", fn,
                   cfg->flags);
#ifndef MEP_HAVE_CUDA
  if (cfg->flags == MEP_EP_CUDA)
    return mep_set_error(MEP_ERR_UNSUPPORTED, 0, "%s: MEP_EP_CUDA: this "
                         "libmep_ep was built without CUDA", fn);
#endif
  int R = mep_comm_size(comm);
  mep_ep_normal_t *b = calloc(1, sizeof *b);
  if (!b)
    return mep_set_error(MEP_ERR_NOMEM, 0, "%s: no memory", fn);
  b->comm = comm;
  b->cfg = *cfg;
  b->cfg.struct_size = sizeof *cfg;
  b->rank = mep_comm_rank(comm);
  b->size = R;
  b->timeout_us = cfg->timeout_us > 0
                      ? cfg->timeout_us
                      : (int64_t)mep_comm_timeout_ms(comm) * 1000;
  layout_head(&b->lay, R);
  uint64_t least = need_bytes(R, NALIGN);
  if (cfg->num_bytes < least) {
    free(b);
    return INVALID("%s: num_bytes %zu is too small for %d ranks: at least "
                   "%llu (mep_ep_normal_size_hint gives what a number of "
                   "tokens needs)", fn, cfg->num_bytes, R,
                   (unsigned long long)least);
  }
  uint64_t P = (cfg->num_bytes - b->lay.head) / (6 * (uint64_t)R);
  layout_data(&b->lay, P / NALIGN * NALIGN);
  size_t rr = (size_t)R;
  /* the CUDA path's data areas are in its device window; the host region
   * carries the count exchange only */
  int cuda = cfg->flags == MEP_EP_CUDA;
  size_t host_bytes = (size_t)al(cuda ? b->lay.head : b->lay.total, PAGE);
  b->mem = aligned_alloc(PAGE, host_bytes);
  b->active = malloc(rr * sizeof(int32_t));
  b->counts = malloc(rr * rr * sizeof(int32_t));
  b->src_tokens = malloc(rr * sizeof(int32_t));
  b->itr_count = malloc(rr * sizeof(int32_t));
  b->work = malloc(rr * rr * sizeof(int32_t));
  b->agreed = malloc(rr * sizeof(int32_t));
  int rc = 0;
  if (!b->mem || !b->active || !b->counts || !b->src_tokens ||
      !b->itr_count || !b->work || !b->agreed)
    rc = mep_set_error(MEP_ERR_NOMEM, 0, "%s: no memory for the %zu bytes "
                       "of the buffer", fn, host_bytes);
  if (!rc) {
    memset(b->mem, 0, (size_t)b->lay.head); /* signal words: "nothing yet" */
    uint8_t *act = malloc((size_t)mep_comm_max_size(comm) + 1);
    if (!act) {
      rc = mep_set_error(MEP_ERR_NOMEM, 0, "%s: no memory", fn);
    } else {
      int n = mep_comm_active(comm, act, mep_comm_max_size(comm), NULL);
      for (int r = 0; r < R; r++) b->active[r] = n < 0 || act[r];
      free(act);
    }
  }
  if (!rc) {
    rc = mep_region_register(comm, b->mem, host_bytes, MEP_MEM_HOST,
                             &b->region);
    if (rc && rc != MEP_ERR_NOMEM)
      rc = mep_set_error(rc, 1, "%s: registering the %zu-byte buffer", fn,
                         host_bytes);
  }
#ifdef MEP_HAVE_CUDA
  if (!rc && cuda) rc = mep__epn_cuda_create(b);
#endif
  if (rc) {
    free_normal(b);
    return rc;
  }
  *out = b;
  return 0;
}

int mep_ep_normal_destroy(mep_ep_normal_t *b) {
  if (!b) return 0;
  (void)mep_flush(b->comm, (int)(b->timeout_us / 1000) + 1);
  free_normal(b);
  return 0;
}

int32_t *mep_ep_normal_active_ranks(mep_ep_normal_t *b) {
  if (!b) return NULL;
#ifdef MEP_HAVE_CUDA
  if (b->cuda) return mep__epn_cuda_active(b);
#endif
  return b->active;
}

size_t mep_ep_normal_pair_bytes(const mep_ep_normal_t *b) {
  return b ? (size_t)b->lay.pair : 0;
}

/* ------------------------------------------------------------- layout */

int mep_ep_get_dispatch_layout(const mep_ep_layout_args_t *a) {
  const char *fn = "mep_ep_get_dispatch_layout";
  if (!a) return INVALID("%s: args is NULL", fn);
  size_t least = offsetof(mep_ep_layout_args_t, flags);
  if (a->struct_size < least)
    return INVALID("%s: args->struct_size %zu is less than %zu", fn,
                   a->struct_size, least);
  unsigned flags = a->struct_size >= sizeof(mep_ep_layout_args_t)
                       ? a->flags
                       : MEP_EP_HOST;
  if (flags != 0 && flags != MEP_EP_HOST && flags != MEP_EP_CUDA)
    return INVALID("%s: flags 0x%x must be 0, MEP_EP_HOST or MEP_EP_CUDA",
                   fn, flags);
  int N = a->num_tokens, K = a->num_topk, E = a->num_experts,
      R = a->num_ranks;
  if (N < 0) return INVALID("%s: num_tokens %d is negative", fn, N);
  if (K < 0 || K > MEP_EP_NORMAL_MAX_TOPK)
    return INVALID("%s: num_topk %d is outside 0..%d", fn, K,
                   MEP_EP_NORMAL_MAX_TOPK);
  if (R < 1 || E < R || E % R)
    return INVALID("%s: num_experts %d is not a positive multiple of "
                   "num_ranks %d", fn, E, R);
  if (a->num_tokens_per_rdma_rank &&
      (a->ranks_per_host < 1 || R % a->ranks_per_host))
    return INVALID("%s: ranks_per_host %d does not divide num_ranks %d", fn,
                   a->ranks_per_host, R);
  if (!a->num_tokens_per_rank || !a->num_tokens_per_expert ||
      (N > 0 && (!a->is_token_in_rank || (K > 0 && !a->topk_idx))))
    return INVALID("%s: %s is NULL", fn,
                   !a->num_tokens_per_rank     ? "num_tokens_per_rank"
                   : !a->num_tokens_per_expert ? "num_tokens_per_expert"
                   : !a->is_token_in_rank      ? "is_token_in_rank"
                                               : "topk_idx");
  if (flags == MEP_EP_CUDA) {
#ifdef MEP_HAVE_CUDA
    return mep__epn_cuda_layout(a);
#else
    return mep_set_error(MEP_ERR_UNSUPPORTED, 0, "%s: MEP_EP_CUDA: this "
                         "libmep_ep was built without CUDA", fn);
#endif
  }
  int L = E / R;
  for (int t = 0; t < N; t++)
    for (int k = 0; k < K; k++) {
      int64_t e = a->topk_idx[(size_t)t * K + k];
      if (e < -1 || e >= E)
        return INVALID("%s: topk_idx[%d][%d] is %lld; experts are 0..%d, "
                       "or -1 for none", fn, t, k, (long long)e, E - 1);
    }
  int H = a->num_tokens_per_rdma_rank ? R / a->ranks_per_host : 0;
  memset(a->num_tokens_per_rank, 0, sizeof(int32_t) * (size_t)R);
  memset(a->num_tokens_per_expert, 0, sizeof(int32_t) * (size_t)E);
  if (H) memset(a->num_tokens_per_rdma_rank, 0, sizeof(int32_t) * (size_t)H);
  uint8_t *hostmark = H ? calloc((size_t)H, 1) : NULL;
  if (H && !hostmark) return mep_set_error(MEP_ERR_NOMEM, 0, "%s: no memory", fn);
  for (int t = 0; t < N; t++) {
    uint8_t *in = a->is_token_in_rank + (size_t)t * R;
    memset(in, 0, (size_t)R);
    if (H) memset(hostmark, 0, (size_t)H);
    for (int k = 0; k < K; k++) {
      int64_t e = a->topk_idx[(size_t)t * K + k];
      if (e < 0) continue;
      a->num_tokens_per_expert[e]++;
      int r = (int)(e / L);
      if (!in[r]) {
        in[r] = 1;
        a->num_tokens_per_rank[r]++;
      }
      if (H && !hostmark[r / a->ranks_per_host]) {
        hostmark[r / a->ranks_per_host] = 1;
        a->num_tokens_per_rdma_rank[r / a->ranks_per_host]++;
      }
    }
  }
  free(hostmark);
  return 0;
}

/* ------------------------------------------------------------ helpers */

/* Waits for source s's word at off to reach seq; 1: arrived (*n its
 * count), 0: timed out (s cleared), < 0 an error. */
static int wait_word(mep_ep_normal_t *b, int32_t *active, uint64_t off,
                     uint64_t seq, uint64_t deadline, int s, uint32_t *n,
                     const char *fn, const char *what) {
  uint64_t seen = 0;
  const volatile int32_t *live = mep_comm_active_array(b->comm);
  int rc;
  /* in slices, so that a peer the core has dropped (its transport saw it
   * die) costs no more than a slice */
  for (;;) {
    int left = mep__ep_left_ms(deadline);
    rc = mep_wait(b->region, off, seq << 32, left < 20 ? left : 20, &seen);
    if (rc != MEP_ERR_TIMEOUT) break;
    if (left <= 20 || (live && !live[s])) {
      active[s] = 0;
      return 0;
    }
  }
  if (rc) return mep_set_error(rc, 1, "%s: waiting for rank %d's %s", fn, s,
                               what);
  if (seen >> 32 != seq)
    return mep_set_error(MEP_ERR_PROTOCOL, 0, "%s: rank %d's %s word is of "
                         "call %llu, this is call %llu (the ranks' calls "
                         "differ)", fn, s, what,
                         (unsigned long long)(seen >> 32),
                         (unsigned long long)seq);
  *n = (uint32_t)seen;
  return 1;
}

/* The survivors agree on whom they heard from: an all-reduce (min) of the
 * active flags over the communicator, whose collectives complete over the
 * survivors with the same result on each (a dead rank is dropped by the
 * core; a stalled one after the communicator's timeout). A rank cleared
 * by any survivor is cleared by all; one the core dropped too. A rank the
 * others cleared gets MEP_ERR_EXCLUDED. A rank that has no other active
 * rank left in its own view has nobody to agree with: when the all-reduce
 * fails for it (the core cannot arbitrate a group of one, e.g. the store
 * died with rank 0), it goes on alone. */
static int agree(mep_ep_normal_t *b, int32_t *active, const char *fn,
                 const char *what) {
  int R = b->size, me = b->rank;
  const volatile int32_t *live = mep_comm_active_array(b->comm);
  for (int r = 0; r < R; r++) {
    if (r != me && live && !live[r]) active[r] = 0;
    b->agreed[r] = !!active[r];
  }
  int rc = mep_allreduce(b->comm, b->agreed, b->agreed, (size_t)R, MEP_INT32,
                         MEP_MIN, NULL);
  if (rc < 0) {
    int others = 0;
    for (int r = 0; r < R; r++) others += r != me && active[r];
    if (!others && (rc == MEP_ERR_EXCLUDED || rc == MEP_ERR_PEER_FAILED ||
                    rc == MEP_ERR_TIMEOUT || rc == MEP_ERR_CLOSED))
      return 0;
    return mep_set_error(rc, 1, "%s: agreeing with the other ranks on the "
                         "ranks lost in the %s", fn, what);
  }
  for (int r = 0; r < R; r++)
    if (!b->agreed[r]) active[r] = 0;
  if (!active[me])
    return mep_set_error(MEP_ERR_EXCLUDED, 0, "%s: the other ranks dropped "
                         "this rank in the %s (it missed their deadline)",
                         fn, what);
  return 0;
}

/* Pair (s, r) carries n messages of msg bytes: 0 if they fit a pair's
 * bytes, else MEP_ERR_INVALID naming the num_bytes needed. */
int mep__epn_pair_error(const mep_ep_normal_t *b, int s, int r, int32_t n,
                        uint64_t msg, const char *fn, const char *what) {
  uint64_t v = (uint64_t)(uint32_t)n * msg;
  if (v <= b->lay.pair) return 0;
  return INVALID("%s: rank %d sends rank %d %d %s of %llu bytes (%llu "
                 "bytes); a buffer of num_bytes %zu carries %llu bytes per "
                 "pair of ranks: num_bytes must be at least %llu", fn, s, r,
                 n, what, (unsigned long long)msg, (unsigned long long)v,
                 b->cfg.num_bytes, (unsigned long long)b->lay.pair,
                 (unsigned long long)need_bytes(b->size, v));
}

/* The pair (*ws, *wr) of the largest count (the first of equals). */
static void worst_pair(const mep_ep_normal_t *b, const int32_t *counts,
                       int *ws, int *wr) {
  int R = b->size;
  *ws = *wr = 0;
  for (int s = 0; s < R; s++)
    for (int r = 0; r < R; r++)
      if ((uint32_t)counts[s * R + r] > (uint32_t)counts[*ws * R + *wr])
        *ws = s, *wr = r;
}

/* The largest pair of counts[s][r] * msg over every pair, against P. */
static int check_pairs(const mep_ep_normal_t *b, const int32_t *counts,
                       uint64_t msg, const char *fn, const char *what) {
  int ws, wr;
  worst_pair(b, counts, &ws, &wr);
  return mep__epn_pair_error(b, ws, wr, counts[ws * b->size + wr], msg, fn,
                             what);
}

int mep__epn_shape_error(int s, const int32_t shape[3], int E, int dmsg,
                         int cmsg, const char *fn) {
  return mep_set_error(MEP_ERR_MISMATCH, 0, "%s: rank %d dispatches %d "
                       "experts with %d-byte messages (combine %d), this "
                       "rank %d experts with %d-byte messages (combine %d)",
                       fn, s, shape[0], shape[1], shape[2], E, dmsg, cmsg);
}

int mep__epn_status_error(const mep_ep_normal_t *b, int s, const char *fn) {
  return INVALID("%s: rank %d's is_token_in_rank does not agree with its "
                 "num_tokens_per_rank%s", fn, s,
                 s == b->rank ? "" : " (see that rank's error)");
}

/* The tokens this rank receives by counts. */
static int64_t recv_of(const mep_ep_normal_t *b, const int32_t *counts) {
  int64_t nrecv = 0;
  for (int s = 0; s < b->size; s++) nrecv += counts[s * b->size + b->rank];
  return nrecv;
}

/* nrecv tokens fit the outputs' capacity: 0, or MEP_ERR_INVALID. */
static int check_capacity(int64_t nrecv, int capacity, const char *fn) {
  if (nrecv <= capacity) return 0;
  return INVALID("%s: this rank receives %lld tokens; the outputs have room "
                 "for recv_capacity %d", fn, (long long)nrecv, capacity);
}

#define NEED(p, what)                                                         \
  do {                                                                        \
    if (!(p)) return INVALID("%s: %s is NULL", fn, what);                     \
  } while (0)

static int32_t *call_active(mep_ep_normal_t *b, int32_t *a) {
  return a ? a : b->active;
}
static int64_t call_timeout(mep_ep_normal_t *b, int64_t t) {
  return t > 0 ? t : b->timeout_us;
}
#ifdef MEP_HAVE_CUDA
static int32_t *call_active_dev(mep_ep_normal_t *b, int32_t *a) {
  return a ? a : mep__epn_cuda_active(b);
}
#endif

/* ------------------------------------------------------------- notify */

/* The checks of a notify's arguments, on either path. */
static int check_notify(mep_ep_normal_t *b, const mep_ep_notify_args_t *a,
                        const char *fn) {
  int R = b->size, N = a->num_tokens, E = a->num_experts;
  if (N < 0) return INVALID("%s: num_tokens %d is negative", fn, N);
  if (E < R || E % R)
    return INVALID("%s: num_experts %d is not a positive multiple of the %d "
                   "ranks", fn, E, R);
  int L = E / R;
  if (L > MEP_EP_MAX_LOCAL_EXPERTS)
    return INVALID("%s: num_experts %d gives %d experts per rank, more than "
                   "MEP_EP_MAX_LOCAL_EXPERTS (%d)", fn, E, L,
                   MEP_EP_MAX_LOCAL_EXPERTS);
  if (a->expert_alignment < 1)
    return INVALID("%s: expert_alignment %d is less than 1", fn,
                   a->expert_alignment);
  if (a->num_channels < 0)
    return INVALID("%s: num_channels %d is negative", fn, a->num_channels);
  if (a->hidden < 1 || (a->x_elem_size != 1 && a->x_elem_size != 2) ||
      a->num_scales < 0 || a->num_topk < 0 ||
      a->num_topk > MEP_EP_NORMAL_MAX_TOPK)
    return INVALID("%s: message shape hidden %d, x_elem_size %d, num_scales "
                   "%d, num_topk %d: need hidden >= 1, x_elem_size 1 or 2, "
                   "num_scales >= 0, num_topk 0..%d", fn, a->hidden,
                   a->x_elem_size, a->num_scales, a->num_topk,
                   MEP_EP_NORMAL_MAX_TOPK);
  NEED(a->num_tokens_per_rank, "num_tokens_per_rank");
  NEED(a->num_tokens_per_expert, "num_tokens_per_expert");
  if (N > 0) NEED(a->is_token_in_rank, "is_token_in_rank");
  NEED(a->num_recv_tokens, "num_recv_tokens");
  NEED(a->num_recv_tokens_per_expert, "num_recv_tokens_per_expert");
  NEED(a->rank_prefix_matrix, "rank_prefix_matrix");
  if (a->num_channels > 0) NEED(a->channel_prefix_matrix,
                                "channel_prefix_matrix");
  return 0;
}

/* The count exchange over the host region (the CPU path, and host arrays
 * on a CUDA buffer). */
static int notify(mep_ep_normal_t *b, const mep_ep_notify_args_t *a) {
  const char *fn = "mep_ep_notify_dispatch";
  int R = b->size, me = b->rank, N = a->num_tokens, E = a->num_experts;
  int L = E / R;
  int32_t *act = call_active(b, a->active_ranks);
  int64_t tmo = call_timeout(b, a->timeout_us);
  int rc = mep__ep_flush(b->comm, tmo, fn);
  if (rc) return rc;

  /* this rank's status: is_token_in_rank agrees with num_tokens_per_rank */
  int32_t *cnt = b->itr_count;
  memset(cnt, 0, sizeof(int32_t) * (size_t)R);
  for (int t = 0; t < N; t++)
    for (int r = 0; r < R; r++) cnt[r] += !!a->is_token_in_rank[(size_t)t * R + r];
  int status = 0;
  for (int r = 0; r < R; r++)
    if (cnt[r] != a->num_tokens_per_rank[r] || cnt[r] < 0) status = 1;
  int32_t dmsg = (int32_t)mep__epn_dmsg_bytes(a->hidden, a->x_elem_size,
                                              a->num_scales, a->num_topk);
  int32_t cmsg = (int32_t)mep__epn_cmsg_bytes(a->hidden, a->num_topk);

  uint64_t seq = ++b->nseq;
  int half = (int)(seq & 1);
  char *mem = b->mem;
  for (int dst = 0; dst < R; dst++) {
    int32_t *slot = (int32_t *)(mem + b->lay.cnt_stage + (uint64_t)dst * b->lay.cw);
    slot[0] = status;
    slot[1] = N;
    slot[2] = E;
    slot[3] = dmsg;
    slot[4] = cmsg;
    memcpy(slot + CW_HDR, a->num_tokens_per_rank, sizeof(int32_t) * (size_t)R);
    memcpy(slot + CW_HDR + R, a->num_tokens_per_expert + (size_t)dst * L,
           sizeof(int32_t) * (size_t)L);
  }
  size_t slot_bytes = sizeof(int32_t) * (size_t)(CW_HDR + R + L);
  for (int dst = 0; dst < R; dst++) {
    if (!act[dst]) continue;
    uint64_t roff = b->lay.cnt + ((uint64_t)half * R + me) * b->lay.cw;
    rc = mep_put(b->comm, dst, b->region,
                 b->lay.cnt_stage + (uint64_t)dst * b->lay.cw, b->region, roff,
                 slot_bytes);
    if (!rc)
      rc = mep_signal(b->comm, dst, b->region,
                      b->lay.nsig + ((uint64_t)half * R + me) * 8,
                      mep__ep_word(seq, 1), MEP_SIGNAL_SET);
    if (rc && (rc = mep__ep_peer_error(act, dst, rc)))
      return mep_set_error(rc, 1, "%s: sending the counts to rank %d", fn,
                           dst);
  }

  /* every active source's counts, under one deadline */
  uint64_t deadline = mep__ep_now_us() + (uint64_t)tmo;
  int bad = -1;
  int32_t *counts = b->counts;
  memset(counts, 0, sizeof(int32_t) * (size_t)R * R);
  memset(b->src_tokens, 0, sizeof(int32_t) * (size_t)R);
  for (int l = 0; l < L; l++) a->num_recv_tokens_per_expert[l] = 0;
  for (int s = 0; s < R; s++) {
    if (!act[s]) continue;
    uint32_t one;
    rc = wait_word(b, act, b->lay.nsig + ((uint64_t)half * R + s) * 8, seq,
                   deadline, s, &one, fn, "counts");
    if (rc < 0) return rc;
  }
  if ((rc = agree(b, act, fn, "count exchange"))) return rc;
  /* the counts of the sources every survivor heard from */
  for (int s = 0; s < R; s++) {
    if (!act[s]) continue;
    const int32_t *slot =
        (const int32_t *)(mem + b->lay.cnt + ((uint64_t)half * R + s) * b->lay.cw);
    if (slot[2] != E || slot[3] != dmsg || slot[4] != cmsg)
      return mep__epn_shape_error(s, slot + 2, E, dmsg, cmsg, fn);
    if (slot[0] && bad < 0) bad = s;
    b->src_tokens[s] = slot[1];
    memcpy(counts + (size_t)s * R, slot + CW_HDR, sizeof(int32_t) * (size_t)R);
    for (int l = 0; l < L; l++)
      a->num_recv_tokens_per_expert[l] += slot[CW_HDR + R + l];
  }
  if (bad >= 0) return mep__epn_status_error(b, bad, fn);
  uint64_t big = (uint64_t)dmsg > (uint64_t)cmsg ? (uint64_t)dmsg
                                                 : (uint64_t)cmsg;
  rc = check_pairs(b, counts, big, fn, "tokens");
  if (rc) return rc;

  for (int r = 0; r < R; r++) {
    int32_t run = 0;
    for (int s = 0; s < R; s++) {
      run += counts[s * R + r];
      a->rank_prefix_matrix[s * R + r] = run;
    }
  }
  *a->num_recv_tokens = a->rank_prefix_matrix[(R - 1) * R + me];
  int al_ = a->expert_alignment;
  for (int l = 0; l < L; l++)
    a->num_recv_tokens_per_expert[l] =
        (a->num_recv_tokens_per_expert[l] + al_ - 1) / al_ * al_;
  int C = a->num_channels;
  if (C > 0) {
    int per = (N + C - 1) / C;
    for (int r = 0; r < R; r++) {
      int32_t run = 0;
      for (int c = 0; c < C; c++) {
        int lo = per * c < N ? per * c : N, hi = lo + per < N ? lo + per : N;
        for (int t = lo; t < hi; t++) run += !!a->is_token_in_rank[(size_t)t * R + r];
        a->channel_prefix_matrix[r * C + c] = run;
      }
    }
  }
  b->nrecv = *a->num_recv_tokens;
  worst_pair(b, counts, &b->worst_s, &b->worst_r);
  b->worst = counts[b->worst_s * R + b->worst_r];
  b->notified = 1;
  return 0;
}

int mep_ep_notify_dispatch(mep_ep_normal_t *b, const mep_ep_notify_args_t *a) {
  const char *fn = "mep_ep_notify_dispatch";
  if (!b || !a) return INVALID("%s: %s is NULL", fn, !b ? "buf" : "args");
  size_t least = offsetof(mep_ep_notify_args_t, flags);
  if (a->struct_size < least)
    return INVALID("%s: args->struct_size %zu is less than %zu", fn,
                   a->struct_size, least);
  unsigned flags = a->struct_size >= sizeof(mep_ep_notify_args_t) ? a->flags
                                                                  : 0;
  if (flags != 0 && flags != MEP_EP_HOST && flags != MEP_EP_CUDA)
    return INVALID("%s: flags 0x%x must be 0, MEP_EP_HOST or MEP_EP_CUDA",
                   fn, flags);
  int rc = check_notify(b, a, fn);
  if (rc) return rc;
  b->notified = 0; /* a failed notify leaves no counts behind */
  if (flags == MEP_EP_CUDA) {
#ifdef MEP_HAVE_CUDA
    if (b->cuda)
      return mep__epn_cuda_notify(b, a, call_active_dev(b, a->active_ranks),
                                  call_timeout(b, a->timeout_us));
#endif
    return INVALID("%s: flags MEP_EP_CUDA (device arrays) needs a buffer "
                   "made with MEP_EP_CUDA", fn);
  }
#ifdef MEP_HAVE_CUDA
  /* a CUDA buffer's own active ranks live on the device, where its
   * kernels clear them; the exchange runs on the host */
  if (b->cuda && !a->active_ranks) {
    int rc = mep__epn_cuda_sync_active(b, b->active, 1);
    if (!rc) rc = notify(b, a);
    int rc2 = mep__epn_cuda_sync_active(b, b->active, 0);
    return rc ? rc : rc2;
  }
#endif
  return notify(b, a);
}

/* ----------------------------------------------------------- dispatch */

/* Builds token t's message at m. */
static void build_dmsg(const mep_ep_normal_dispatch_args_t *a, int t,
                       char *m) {
  size_t xb = (size_t)a->hidden * (size_t)a->x_elem_size;
  int32_t t32 = t;
  memset(m, 0, 16);
  memcpy(m, &t32, 4);
  memcpy(m + 16, (const char *)a->x + (size_t)t * xb, xb);
  char *p = m + 16 + al(xb, 16);
  for (int i = 0; i < a->num_scales; i++)
    memcpy(p + 4 * (size_t)i,
           (const char *)a->x_scales +
               4 * ((size_t)t * (size_t)a->scale_token_stride +
                    (size_t)i * (size_t)a->scale_hidden_stride),
           4);
  if (a->num_topk > 0) {
    char *q =
        m + mep__epn_dmsg_idx_off(a->hidden, a->x_elem_size, a->num_scales);
    memcpy(q, a->topk_idx + (size_t)t * a->num_topk, 8 * (size_t)a->num_topk);
    memcpy(q + 8 * (size_t)a->num_topk, a->topk_weights + (size_t)t * a->num_topk,
           4 * (size_t)a->num_topk);
  }
}

/* Writes received row j from message m (NULL: a lost source's row). */
static void unpack_dmsg(const mep_ep_normal_dispatch_args_t *a, int me, int L,
                        size_t j, const char *m) {
  size_t xb = (size_t)a->hidden * (size_t)a->x_elem_size;
  int K = a->num_topk, S = a->num_scales;
  char *rx = (char *)a->recv_x + j * xb;
  if (!m) {
    memset(rx, 0, xb);
    if (S) memset((char *)a->recv_x_scales + j * 4 * (size_t)S, 0, 4 * (size_t)S);
    if (a->recv_src_idx) a->recv_src_idx[j] = -1;
    for (int k = 0; k < K; k++) {
      if (a->recv_topk_idx) a->recv_topk_idx[j * K + k] = -1;
      if (a->recv_topk_weights) a->recv_topk_weights[j * K + k] = 0.0f;
    }
    return;
  }
  int32_t t;
  memcpy(&t, m, 4);
  if (a->recv_src_idx) a->recv_src_idx[j] = t;
  memcpy(rx, m + 16, xb);
  if (S)
    memcpy((char *)a->recv_x_scales + j * 4 * (size_t)S, m + 16 + al(xb, 16),
           4 * (size_t)S);
  if (K > 0 && a->recv_topk_idx) {
    const char *q = m + mep__epn_dmsg_idx_off(a->hidden, a->x_elem_size, S);
    int64_t lo = (int64_t)me * L, hi = lo + L;
    for (int k = 0; k < K; k++) {
      int64_t e;
      float w;
      memcpy(&e, q + 8 * (size_t)k, 8);
      memcpy(&w, q + 8 * (size_t)K + 4 * (size_t)k, 4);
      int in = e >= lo && e < hi;
      a->recv_topk_idx[j * K + k] = in ? e - lo : -1;
      if (a->recv_topk_weights) a->recv_topk_weights[j * K + k] = in ? w : 0.0f;
    }
  }
}

#ifdef MEP_HAVE_CUDA

/* The CUDA path's dispatch, after the common checks: the counts the host
 * has (the notify's; a cached matrix is device memory the kernels read)
 * size the outputs and the pairs. */
static int cuda_dispatch(mep_ep_normal_t *b,
                         const mep_ep_normal_dispatch_args_t *a,
                         const char *fn) {
  if (a->num_tokens > 0) NEED(a->send_head, "send_head (the CUDA path's "
                                            "positions)");
  if (!a->cached_rank_prefix_matrix) {
    if (!b->notified)
      return INVALID("%s: no mep_ep_notify_dispatch before this dispatch, "
                     "and no cached_rank_prefix_matrix", fn);
    uint64_t dmsg = mep__epn_dmsg_bytes(a->hidden, a->x_elem_size,
                                        a->num_scales, a->num_topk);
    int rc = check_capacity(b->nrecv, a->recv_capacity, fn);
    if (!rc)
      rc = mep__epn_pair_error(b, b->worst_s, b->worst_r, b->worst, dmsg, fn,
                               "tokens");
    if (rc) return rc;
  }
  /* the host notify's counts go to the device with the dispatch */
  const int32_t *counts = !a->cached_rank_prefix_matrix && b->notified == 1
                              ? b->counts
                              : NULL;
  b->notified = 0;
  return mep__epn_cuda_dispatch(b, a, counts,
                                call_active_dev(b, a->active_ranks),
                                call_timeout(b, a->timeout_us));
}
#endif

int mep_ep_normal_dispatch(mep_ep_normal_t *b,
                           const mep_ep_normal_dispatch_args_t *a) {
  const char *fn = "mep_ep_normal_dispatch";
  if (!b || !a) return INVALID("%s: %s is NULL", fn, !b ? "buf" : "args");
  if (a->struct_size < sizeof(mep_ep_normal_dispatch_args_t))
    return INVALID("%s: args->struct_size %zu is less than "
                   "sizeof(mep_ep_normal_dispatch_args_t) (%zu)", fn,
                   a->struct_size, sizeof(mep_ep_normal_dispatch_args_t));
  int R = b->size, me = b->rank, N = a->num_tokens, K = a->num_topk;
  int E = a->num_experts;
  if (N < 0) return INVALID("%s: num_tokens %d is negative", fn, N);
  if (a->x_elem_size != 1 && a->x_elem_size != 2)
    return INVALID("%s: x_elem_size %d is neither 1 (fp8) nor 2 (bf16)", fn,
                   a->x_elem_size);
  if (a->hidden < 1 || ((int64_t)a->hidden * a->x_elem_size) % 16)
    return INVALID("%s: hidden %d of %d-byte values is not a positive "
                   "multiple of 16 bytes", fn, a->hidden, a->x_elem_size);
  if (a->num_scales < 0 || (a->num_scales > 0) != (a->x_elem_size == 1))
    return INVALID("%s: num_scales %d: FP8 x (x_elem_size 1) needs scales, "
                   "bf16 x none", fn, a->num_scales);
  if (K < 0 || K > MEP_EP_NORMAL_MAX_TOPK)
    return INVALID("%s: num_topk %d is outside 0..%d", fn, K,
                   MEP_EP_NORMAL_MAX_TOPK);
  if (K > 0 && (E < R || E % R))
    return INVALID("%s: num_experts %d is not a positive multiple of the %d "
                   "ranks", fn, E, R);
  if (a->num_channels < 0)
    return INVALID("%s: num_channels %d is negative", fn, a->num_channels);
  if (N > 0) {
    NEED(a->x, "x");
    NEED(a->is_token_in_rank, "is_token_in_rank");
    if (a->num_scales) NEED(a->x_scales, "x_scales");
    if (K) NEED(a->topk_idx, "topk_idx");
    if (K) NEED(a->topk_weights, "topk_weights");
  }
  if (a->recv_capacity < 0)
    return INVALID("%s: recv_capacity %d is negative", fn, a->recv_capacity);
  if (a->recv_capacity > 0) {
    NEED(a->recv_x, "recv_x");
    if (a->num_scales) NEED(a->recv_x_scales, "recv_x_scales");
    if (K) NEED(a->recv_topk_idx, "recv_topk_idx");
    if (K) NEED(a->recv_topk_weights, "recv_topk_weights");
  }
#ifdef MEP_HAVE_CUDA
  if (b->cuda) return cuda_dispatch(b, a, fn);
#endif
  const int32_t *rpm = a->cached_rank_prefix_matrix;
  int32_t *counts = rpm ? b->work : b->counts;
  if (rpm) {
    for (int r = 0; r < R; r++)
      for (int s = 0; s < R; s++) {
        int32_t v = rpm[s * R + r] - (s ? rpm[(s - 1) * R + r] : 0);
        if (v < 0)
          return INVALID("%s: cached_rank_prefix_matrix column %d falls at "
                         "row %d: not a dispatch's matrix", fn, r, s);
        counts[s * R + r] = v;
      }
  } else if (!b->notified) {
    return INVALID("%s: no mep_ep_notify_dispatch before this dispatch, and "
                   "no cached_rank_prefix_matrix", fn);
  }
  b->notified = 0;
  /* this rank's sends agree with the counts */
  int32_t *cnt = b->itr_count;
  memset(cnt, 0, sizeof(int32_t) * (size_t)R);
  for (int t = 0; t < N; t++)
    for (int r = 0; r < R; r++) cnt[r] += !!a->is_token_in_rank[(size_t)t * R + r];
  for (int r = 0; r < R; r++)
    if (cnt[r] != counts[me * R + r])
      return INVALID("%s: is_token_in_rank sends rank %d %d tokens; the "
                     "%s says %d", fn, r, cnt[r],
                     rpm ? "cached rank_prefix_matrix" : "notify's counts",
                     counts[me * R + r]);
  uint64_t dmsg =
      mep__epn_dmsg_bytes(a->hidden, a->x_elem_size, a->num_scales, K);
  int rc = check_capacity(recv_of(b, counts), a->recv_capacity, fn);
  if (!rc) rc = check_pairs(b, counts, dmsg, fn, "tokens");
  if (rc) return rc;

  int32_t *act = call_active(b, a->active_ranks);
  int64_t tmo = call_timeout(b, a->timeout_us);
  if ((rc = mep__ep_flush(b->comm, tmo, fn))) return rc;
  uint64_t seq = ++b->dseq;
  int half = (int)(seq & 1);
  char *mem = b->mem;
  uint64_t P = b->lay.pair;

  /* send: each token's message is built once and copied into the stage
   * of every rank that takes it, at that rank's next slot (the stage holds
   * R pair areas, as the receive area does), then one put per rank */
  memset(cnt, 0, sizeof(int32_t) * (size_t)R);
  for (int t = 0; t < N; t++) {
    const uint8_t *in = a->is_token_in_rank + (size_t)t * R;
    const char *first = NULL;
    for (int r = 0; r < R; r++) {
      int32_t *head = a->send_head ? a->send_head + (size_t)t * R + r : NULL;
      if (!in[r]) {
        if (head) *head = -1;
        continue;
      }
      int32_t pos = cnt[r]++;
      if (head) {
        int32_t before = 0;
        for (int s = 0; s < me; s++) before += counts[s * R + r];
        *head = act[r] ? before + pos : -1;
      }
      if (!act[r]) continue;
      char *m = mem + b->lay.dstage + (uint64_t)r * P + (uint64_t)pos * dmsg;
      if (first) {
        memcpy(m, first, dmsg);
      } else {
        build_dmsg(a, t, m);
        first = m;
      }
    }
  }
  for (int r = 0; r < R; r++) {
    uint64_t n = (uint64_t)(uint32_t)counts[me * R + r];
    if (!act[r] || !n) continue;
    rc = mep_put(b->comm, r, b->region, b->lay.dstage + (uint64_t)r * P,
                 b->region, b->lay.drecv + ((uint64_t)half * R + me) * P,
                 (size_t)(n * dmsg));
    if (rc && (rc = mep__ep_peer_error(act, r, rc)))
      return mep_set_error(rc, 1, "%s: sending %llu tokens to rank %d", fn,
                           (unsigned long long)n, r);
  }
  for (int r = 0; r < R; r++) {
    if (!act[r]) continue;
    rc = mep_signal(b->comm, r, b->region,
                    b->lay.dsig + ((uint64_t)half * R + me) * 8,
                    mep__ep_word(seq, (uint32_t)counts[me * R + r]),
                    MEP_SIGNAL_SET);
    if (rc && (rc = mep__ep_peer_error(act, r, rc)))
      return mep_set_error(rc, 1, "%s: signalling rank %d", fn, r);
  }

  /* receive: source by source in rank order, each in its token order */
  uint64_t deadline = mep__ep_now_us() + (uint64_t)tmo;
  int L = K > 0 ? E / R : 1;
  int C = rpm ? 0 : a->num_channels;
  for (int s = 0; s < R; s++) {
    uint32_t n = (uint32_t)counts[s * R + me], got = 0;
    if (!act[s]) continue;
    rc = wait_word(b, act, b->lay.dsig + ((uint64_t)half * R + s) * 8, seq,
                   deadline, s, &got, fn, "tokens");
    if (rc < 0) return rc;
    if (rc && got != n)
      return mep_set_error(MEP_ERR_PROTOCOL, 0, "%s: rank %d sent %u "
                           "tokens, the counts say %u (a cached matrix "
                           "of another dispatch?)", fn, s, got, n);
  }
  if ((rc = agree(b, act, fn, "dispatch"))) return rc;
  size_t j = 0;
  for (int s = 0; s < R; s++) {
    uint32_t n = (uint32_t)counts[s * R + me];
    int ok = act[s];
    size_t first = j;
    const char *area = mem + b->lay.drecv + ((uint64_t)half * R + s) * P;
    for (uint32_t i = 0; i < n; i++, j++)
      unpack_dmsg(a, me, L, j, ok ? area + (uint64_t)i * dmsg : NULL);
    if (C > 0 && a->recv_channel_prefix_matrix) {
      /* where source s's channel c starts here: DeepEP's channels are
       * contiguous ranges of ceil(num_tokens / C) of the source's tokens */
      int Ns = b->src_tokens[s], per = (Ns + C - 1) / C;
      size_t i = 0;
      for (int c = 0; c < C; c++) {
        int lo = per * c < Ns ? per * c : Ns;
        if (ok)
          while (i < n) {
            int32_t t;
            memcpy(&t, area + i * dmsg, 4);
            if (t >= lo) break;
            i++;
          }
        a->recv_channel_prefix_matrix[s * C + c] = (int32_t)(first + i);
      }
    }
  }
  return 0;
}

/* ------------------------------------------------------------ combine */

int mep_ep_normal_combine(mep_ep_normal_t *b,
                          const mep_ep_normal_combine_args_t *a) {
  const char *fn = "mep_ep_normal_combine";
  if (!b || !a) return INVALID("%s: %s is NULL", fn, !b ? "buf" : "args");
  /* send_head came later: a struct without it is still taken */
  size_t least = offsetof(mep_ep_normal_combine_args_t, send_head);
  if (a->struct_size < least)
    return INVALID("%s: args->struct_size %zu is less than %zu (the fields "
                   "up to stream of mep_ep_normal_combine_args_t)", fn,
                   a->struct_size, least);
  int R = b->size, me = b->rank, N = a->num_tokens, M = a->num_recv_tokens;
  int K = a->num_topk, H = a->hidden;
  if (N < 0 || M < 0)
    return INVALID("%s: num_tokens %d or num_recv_tokens %d is negative", fn,
                   N, M);
  if (H < 8 || H % 8)
    return INVALID("%s: hidden %d is not a positive multiple of 8 (16 bytes "
                   "of bf16)", fn, H);
  if (K < 0 || K > MEP_EP_NORMAL_MAX_TOPK)
    return INVALID("%s: num_topk %d is outside 0..%d", fn, K,
                   MEP_EP_NORMAL_MAX_TOPK);
  NEED(a->rank_prefix_matrix, "rank_prefix_matrix");
  if (M > 0) NEED(a->x, "x");
  if (M > 0 && K > 0) NEED(a->topk_weights, "topk_weights (num_topk > 0)");
  if (N > 0) {
    if (!b->cuda) NEED(a->is_token_in_rank, "is_token_in_rank");
    NEED(a->combined_x, "combined_x");
    if (K) NEED(a->combined_topk_weights, "combined_topk_weights");
  }
#ifdef MEP_HAVE_CUDA
  if (b->cuda) {
    if (N > 0 && a->struct_size < offsetof(mep_ep_normal_combine_args_t,
                                           send_head) + sizeof a->send_head)
      return INVALID("%s: args->struct_size %zu has no send_head, which the "
                     "CUDA path needs", fn, a->struct_size);
    if (N > 0) NEED(a->send_head, "send_head (the CUDA path's positions)");
    int channels = a->struct_size >= offsetof(mep_ep_normal_combine_args_t,
                                              num_channels) + sizeof(int)
                       ? a->num_channels
                       : 0;
    return mep__epn_cuda_combine(b, a, channels,
                                 call_active_dev(b, a->active_ranks),
                                 call_timeout(b, a->timeout_us));
  }
#endif
  const int32_t *rpm = a->rank_prefix_matrix;
  int32_t *counts = b->work;
  for (int r = 0; r < R; r++)
    for (int s = 0; s < R; s++) {
      int32_t v = rpm[s * R + r] - (s ? rpm[(s - 1) * R + r] : 0);
      if (v < 0)
        return INVALID("%s: rank_prefix_matrix column %d falls at row %d: "
                       "not a dispatch's matrix", fn, r, s);
      counts[s * R + r] = v;
    }
  if (rpm[(R - 1) * R + me] != M)
    return INVALID("%s: x has %d rows; the dispatch delivered %d "
                   "(rank_prefix_matrix)", fn, M, rpm[(R - 1) * R + me]);
  int32_t *cnt = b->itr_count;
  memset(cnt, 0, sizeof(int32_t) * (size_t)R);
  for (int t = 0; t < N; t++)
    for (int r = 0; r < R; r++) cnt[r] += !!a->is_token_in_rank[(size_t)t * R + r];
  for (int r = 0; r < R; r++)
    if (cnt[r] != counts[me * R + r])
      return INVALID("%s: is_token_in_rank sent rank %d %d tokens; "
                     "rank_prefix_matrix says %d", fn, r, cnt[r],
                     counts[me * R + r]);
  uint64_t cmsg = mep__epn_cmsg_bytes(H, K);
  int rc = check_pairs(b, counts, cmsg, fn, "rows");
  if (rc) return rc;

  int32_t *act = call_active(b, a->active_ranks);
  int64_t tmo = call_timeout(b, a->timeout_us);
  if ((rc = mep__ep_flush(b->comm, tmo, fn))) return rc;
  uint64_t seq = ++b->cseq;
  int half = (int)(seq & 1);
  char *mem = b->mem;
  uint64_t P = b->lay.pair;
  size_t rb = 2 * (size_t)H;

  /* send: source s's rows, in the order they came, as one block */
  size_t j = 0;
  for (int s = 0; s < R; s++) {
    uint32_t n = (uint32_t)counts[s * R + me];
    uint64_t stage = b->lay.cstage + (uint64_t)j * cmsg;
    if (act[s]) {
      for (uint32_t i = 0; i < n; i++) {
        char *m = mem + stage + (uint64_t)i * cmsg;
        memcpy(m, (const char *)a->x + (j + i) * rb, rb);
        if (K) memcpy(m + rb, a->topk_weights + (j + i) * (size_t)K,
                      4 * (size_t)K);
      }
      rc = n ? mep_put(b->comm, s, b->region, stage, b->region,
                       b->lay.crecv + ((uint64_t)half * R + me) * P,
                       (size_t)n * cmsg)
             : 0;
      if (!rc)
        rc = mep_signal(b->comm, s, b->region,
                        b->lay.csig + ((uint64_t)half * R + me) * 8,
                        mep__ep_word(seq, n), MEP_SIGNAL_SET);
      if (rc && (rc = mep__ep_peer_error(act, s, rc)))
        return mep_set_error(rc, 1, "%s: sending rank %d its rows", fn, s);
    }
    j += n;
  }

  /* receive every active rank's rows, then sum */
  uint64_t deadline = mep__ep_now_us() + (uint64_t)tmo;
  for (int r = 0; r < R; r++) {
    if (!act[r]) continue;
    uint32_t got = 0, n = (uint32_t)counts[me * R + r];
    rc = wait_word(b, act, b->lay.csig + ((uint64_t)half * R + r) * 8, seq,
                   deadline, r, &got, fn, "rows");
    if (rc < 0) return rc;
    if (rc && got != n)
      return mep_set_error(MEP_ERR_PROTOCOL, 0, "%s: rank %d sent back %u "
                           "rows; this rank sent it %u tokens", fn, r, got,
                           n);
  }
  if ((rc = agree(b, act, fn, "combine"))) return rc;
  float *acc = malloc(sizeof(float) * ((size_t)H + (size_t)K));
  if (!acc) return mep_set_error(MEP_ERR_NOMEM, 0, "%s: no memory", fn);
  memset(cnt, 0, sizeof(int32_t) * (size_t)R);
  const uint16_t *b0 = a->bias_0, *b1 = a->bias_1;
  uint16_t *out = a->combined_x;
  for (int t = 0; t < N; t++) {
    size_t o = (size_t)t * (size_t)H;
    for (int i = 0; i < H; i++)
      acc[i] = (b0 ? mep__ep_bf16_to_float(b0[o + i]) : 0.0f) +
               (b1 ? mep__ep_bf16_to_float(b1[o + i]) : 0.0f);
    for (int k = 0; k < K; k++) acc[H + k] = 0.0f;
    for (int r = 0; r < R; r++) {
      if (!a->is_token_in_rank[(size_t)t * R + r]) continue;
      int32_t pos = cnt[r]++;
      if (!act[r]) continue;
      const char *m = mem + b->lay.crecv + ((uint64_t)half * R + r) * P +
                      (uint64_t)pos * cmsg;
      const uint16_t *row = (const uint16_t *)m;
      for (int i = 0; i < H; i++) acc[i] += mep__ep_bf16_to_float(row[i]);
      for (int k = 0; k < K; k++) {
        float w;
        memcpy(&w, m + rb + 4 * (size_t)k, 4);
        acc[H + k] += w;
      }
    }
    for (int i = 0; i < H; i++) out[o + i] = mep__ep_float_to_bf16(acc[i]);
    for (int k = 0; k < K; k++)
      a->combined_topk_weights[(size_t)t * K + k] = acc[H + k];
  }
  free(acc);
  return 0;
}
