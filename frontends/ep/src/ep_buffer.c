/* ep_buffer.c - the C API of ep.h: checks every argument (the messages name
 * the parameter and the limit), resolves the call's phases, active ranks
 * and timeout, and hands the call to the CPU path or the CUDA path. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ep_impl.h"

#define INVALID(...) mep_set_error(MEP_ERR_INVALID, 0, __VA_ARGS__)

/* Byte counts beyond this are refused rather than risking overflow. */
#define EP_MAX_BYTES ((uint64_t)1 << 50)

/* The parameters' checks, shared by the size hint (quiet: fn NULL) and
 * create (messages prefixed with fn). */
static int check_params(const char *fn, int tokens, int hidden, int ranks,
                        int experts) {
#define BAD(...) (fn ? INVALID(__VA_ARGS__) : MEP_ERR_INVALID)
  if (ranks < 1) return BAD("%s: the communicator has %d ranks", fn, ranks);
  if (tokens < 1)
    return BAD("%s: max_tokens_per_rank %d is less than 1", fn, tokens);
  if (hidden < 128 || hidden % 128)
    return BAD("%s: hidden %d is not a positive multiple of 128", fn, hidden);
  if (experts < ranks || experts % ranks)
    return BAD("%s: num_experts %d is not a positive multiple of the %d "
               "ranks", fn, experts, ranks);
  if (experts / ranks > MEP_EP_MAX_LOCAL_EXPERTS)
    return BAD("%s: num_experts %d gives %d experts per rank, more than "
               "MEP_EP_MAX_LOCAL_EXPERTS (%d)", fn, experts, experts / ranks,
               MEP_EP_MAX_LOCAL_EXPERTS);
  /* rows of an expert (size * max_tokens) are counted in 32 bits */
  if ((int64_t)tokens * ranks > INT32_MAX)
    return BAD("%s: max_tokens_per_rank %d times %d ranks is more than "
               "2^31 - 1 rows per expert", fn, tokens, ranks);
  double bytes = 2.0 * experts * tokens * (16.0 + 2.0 * hidden) * 3;
  if (bytes > (double)EP_MAX_BYTES)
    return BAD("%s: max_tokens_per_rank %d, hidden %d and num_experts %d "
               "need about %.3g bytes per rank, more than 2^50", fn, tokens,
               hidden, experts, bytes);
  return 0;
#undef BAD
}

size_t mep_ep_size_hint(int max_tokens_per_rank, int hidden, int num_ranks,
                        int num_experts) {
  if (check_params(NULL, max_tokens_per_rank, hidden, num_ranks,
                   num_experts))
    return 0;
  mep__ep_layout_t l;
  mep__ep_layout(&l, num_ranks, max_tokens_per_rank, hidden, num_experts);
  return (size_t)l.total;
}

static int check_config(const mep_comm_t *comm, const mep_ep_config_t *cfg) {
  const char *fn = "mep_ep_buffer_create";
  if (cfg->struct_size < sizeof(mep_ep_config_t))
    return INVALID("%s: cfg->struct_size %zu is less than "
                   "sizeof(mep_ep_config_t) (%zu)", fn, cfg->struct_size,
                   sizeof(mep_ep_config_t));
  unsigned mem = cfg->flags & (MEP_EP_HOST | MEP_EP_CUDA);
  if (cfg->flags & ~(MEP_EP_HOST | MEP_EP_CUDA))
    return INVALID("%s: flags 0x%x has unknown bits 0x%x", fn, cfg->flags,
                   cfg->flags & ~(MEP_EP_HOST | MEP_EP_CUDA));
  if (mem != MEP_EP_HOST && mem != MEP_EP_CUDA)
    return INVALID("%s: flags 0x%x must hold exactly one of MEP_EP_HOST "
                   "and MEP_EP_CUDA", fn, cfg->flags);
  return check_params(fn, cfg->max_tokens_per_rank, cfg->hidden,
                      mep_comm_size(comm), cfg->num_experts);
}

int mep_ep_buffer_create(mep_comm_t *comm, const mep_ep_config_t *cfg,
                         mep_ep_buffer_t **out) {
  if (!comm || !cfg || !out)
    return INVALID("mep_ep_buffer_create: %s is NULL",
                   !comm ? "comm" : !cfg ? "cfg" : "out");
  *out = NULL;
  int rc = check_config(comm, cfg);
  if (rc) return rc;
#ifndef MEP_HAVE_CUDA
  if (cfg->flags & MEP_EP_CUDA)
    return mep_set_error(MEP_ERR_UNSUPPORTED, 0, "mep_ep_buffer_create: "
                         "MEP_EP_CUDA needs libmep-ep built with CUDA; this "
                         "one was built without it (MEP_EP_HOST works)");
#endif
  mep_ep_buffer_t *b = calloc(1, sizeof *b);
  if (!b)
    return mep_set_error(MEP_ERR_NOMEM, 0, "mep_ep_buffer_create: no memory "
                         "for the buffer object");
  b->comm = comm;
  b->cfg = *cfg;
  b->cfg.struct_size = sizeof(mep_ep_config_t);
  b->rank = mep_comm_rank(comm);
  b->size = mep_comm_size(comm);
  mep__ep_layout(&b->lay, b->size, cfg->max_tokens_per_rank, cfg->hidden,
                 cfg->num_experts);
  b->timeout_us = cfg->timeout_us > 0
                      ? cfg->timeout_us
                      : (int64_t)mep_comm_timeout_ms(comm) * 1000;
#ifdef MEP_HAVE_CUDA
  if (cfg->flags & MEP_EP_CUDA)
    rc = mep__ep_cuda_create(b);
  else
#endif
    rc = mep__ep_host_create(b);
  if (rc) {
    free(b);
    return rc;
  }
  *out = b;
  return 0;
}

int mep_ep_buffer_destroy(mep_ep_buffer_t *buf) {
  if (!buf) return 0;
#ifdef MEP_HAVE_CUDA
  if (buf->cuda) mep__ep_cuda_destroy(buf);
#endif
  if (buf->host) mep__ep_host_destroy(buf);
  free(buf);
  return 0;
}

int32_t *mep_ep_active_ranks(mep_ep_buffer_t *buf) {
  return buf ? buf->active : NULL;
}

void *mep_ep_combine_buffer(mep_ep_buffer_t *buf) {
  if (!buf) return NULL;
#ifdef MEP_HAVE_CUDA
  if (buf->cuda) return mep__ep_cuda_combine_buffer(buf);
#endif
  return mep__ep_host_combine_buffer(buf);
}

/* Phases, token count and top-k, common to both calls. */
static int check_common(const char *fn, const mep_ep_buffer_t *b,
                        unsigned flags, unsigned allowed, int num_tokens,
                        int num_topk, mep__ep_call_t *c) {
  if (flags & ~allowed)
    return INVALID("%s: flags 0x%x has bits 0x%x this call does not take",
                   fn, flags, flags & ~allowed);
  if (num_tokens < 0 || num_tokens > b->cfg.max_tokens_per_rank)
    return INVALID("%s: num_tokens %d is outside 0..max_tokens_per_rank "
                   "(%d)", fn, num_tokens, b->cfg.max_tokens_per_rank);
  if (num_topk < 1)
    return INVALID("%s: num_topk %d is less than 1", fn, num_topk);
  if (num_topk > MEP_EP_MAX_TOPK)
    return INVALID("%s: num_topk %d is more than MEP_EP_MAX_TOPK (%d)", fn,
                   num_topk, MEP_EP_MAX_TOPK);
  c->phases = (flags & MEP_EP_SEND ? 1 : 0) | (flags & MEP_EP_RECV ? 2 : 0);
  if (c->phases == 0) c->phases = 3;
  return 0;
}

static void resolve(const mep_ep_buffer_t *b, int32_t *active,
                    int64_t timeout_us, mep__ep_call_t *c) {
  c->active = active ? active : b->active;
  c->timeout_us = timeout_us > 0 ? timeout_us : b->timeout_us;
}

/* Host pointers are checked here; device pointers by the CUDA path. */
static int check_topk(const char *fn, const mep_ep_buffer_t *b,
                      const int64_t *idx, int n, int k) {
  if (!b->host || !idx) return 0;
  for (int t = 0; t < n; t++)
    for (int j = 0; j < k; j++) {
      int64_t e = idx[(size_t)t * k + j];
      if (e >= b->cfg.num_experts)
        return INVALID("%s: topk_idx[%d][%d] is %lld, not below num_experts "
                       "(%d)", fn, t, j, (long long)e, b->cfg.num_experts);
    }
  return 0;
}

#define NEED(p, what)                                                         \
  do {                                                                        \
    if (!(p)) return INVALID("%s: %s is NULL", fn, what);                     \
  } while (0)

int mep_ep_dispatch(mep_ep_buffer_t *buf, const mep_ep_dispatch_args_t *a) {
  const char *fn = "mep_ep_dispatch";
  if (!buf || !a) return INVALID("%s: %s is NULL", fn, !buf ? "buf" : "args");
  /* callers built before recv_stats was added pass the size up to stream */
  const size_t v1 = offsetof(mep_ep_dispatch_args_t, recv_stats);
  if (a->struct_size < v1)
    return INVALID("%s: args->struct_size %zu is less than %zu (the "
                   "arguments up to stream)", fn, a->struct_size, v1);
  mep__ep_call_t c = {0};
  unsigned allowed = MEP_EP_FP8 | MEP_EP_ROUND_SCALE | MEP_EP_UE8M0 |
                     MEP_EP_SEND | MEP_EP_RECV;
  int rc = check_common(fn, buf, a->flags, allowed, a->num_tokens,
                        a->num_topk, &c);
  if (rc) return rc;
  unsigned f = a->flags;
  if ((f & (MEP_EP_ROUND_SCALE | MEP_EP_UE8M0)) && !(f & MEP_EP_FP8))
    return INVALID("%s: flags MEP_EP_ROUND_SCALE and MEP_EP_UE8M0 need "
                   "MEP_EP_FP8", fn);
  if ((f & MEP_EP_UE8M0) && !(f & MEP_EP_ROUND_SCALE))
    return INVALID("%s: flag MEP_EP_UE8M0 needs MEP_EP_ROUND_SCALE", fn);
  if ((f & MEP_EP_UE8M0) && buf->cfg.hidden % 512)
    return INVALID("%s: flag MEP_EP_UE8M0 needs hidden %% 512 == 0; hidden "
                   "is %d", fn, buf->cfg.hidden);
  if ((c.phases & 1) && a->num_tokens > 0) {
    NEED(a->x, "x");
    NEED(a->topk_idx, "topk_idx");
  }
  if (c.phases & 2) {
    NEED(a->recv_x, "recv_x");
    if (f & MEP_EP_FP8) NEED(a->recv_scales, "recv_scales (MEP_EP_FP8)");
    NEED(a->recv_src_info, "recv_src_info");
    NEED(a->recv_layout_range, "recv_layout_range");
    NEED(a->recv_count, "recv_count");
  }
  if (c.phases & 1) {
    rc = check_topk(fn, buf, a->topk_idx, a->num_tokens, a->num_topk);
    if (rc) return rc;
  }
  resolve(buf, a->active_ranks, a->timeout_us, &c);
  c.recv_stats = a->struct_size >= v1 + sizeof a->recv_stats ? a->recv_stats
                                                              : NULL;
#ifdef MEP_HAVE_CUDA
  if (buf->cuda) return mep__ep_cuda_dispatch(buf, a, &c);
#endif
  return mep__ep_host_dispatch(buf, a, &c);
}

int mep_ep_combine(mep_ep_buffer_t *buf, const mep_ep_combine_args_t *a) {
  const char *fn = "mep_ep_combine";
  if (!buf || !a) return INVALID("%s: %s is NULL", fn, !buf ? "buf" : "args");
  if (a->struct_size < sizeof(mep_ep_combine_args_t))
    return INVALID("%s: args->struct_size %zu is less than "
                   "sizeof(mep_ep_combine_args_t) (%zu)", fn, a->struct_size,
                   sizeof(mep_ep_combine_args_t));
  mep__ep_call_t c = {0};
  unsigned allowed = MEP_EP_ZERO_COPY | MEP_EP_SEND | MEP_EP_RECV;
  int rc = check_common(fn, buf, a->flags, allowed, a->num_tokens,
                        a->num_topk, &c);
  if (rc) return rc;
  if (c.phases & 1) {
    if (!(a->flags & MEP_EP_ZERO_COPY)) NEED(a->x, "x");
    NEED(a->src_info, "src_info");
    NEED(a->layout_range, "layout_range");
  }
  if ((c.phases & 2) && a->num_tokens > 0) {
    NEED(a->topk_idx, "topk_idx");
    NEED(a->topk_weights, "topk_weights");
    NEED(a->out, "out");
    rc = check_topk(fn, buf, a->topk_idx, a->num_tokens, a->num_topk);
    if (rc) return rc;
  }
  resolve(buf, a->active_ranks, a->timeout_us, &c);
#ifdef MEP_HAVE_CUDA
  if (buf->cuda) return mep__ep_cuda_combine(buf, a, &c);
#endif
  return mep__ep_host_combine(buf, a, &c);
}
