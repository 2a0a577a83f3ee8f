/* ep_cuda.c - the CUDA path of ep.h, host side: the buffer's device window
 * and state, and the launches of each call (kernels in ep_dispatch_*.cu,
 * ep_combine_*.cu and ep_reduce_*.cu, shared definitions in ep_cuda.h).
 *
 * A call only fills kernel arguments and queues kernels on its stream: no
 * host synchronisation, no allocation, no memset, no read of device state,
 * so calls can be captured in CUDA graphs. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_cuda.h"
#include "ep_impl.h"
#include "ep_util.h"

/* Threads of the kernels that spread a row over a block. */
#define EP_ROW_THREADS_MIN 64
#define EP_ROW_THREADS_MAX 512
/* Threads of the kernels that work a warp per row. */
#define EP_WARP_KERNEL_THREADS MEP__EP_WARP_THREADS
/* Most blocks on one (expert, source) pair or one expert. */
#define EP_MAX_SPLIT 32
/* (expert, source) pairs of a dispatch receive's group of experts: on 2
 * H200s, 8 measured best at hidden 7168, 2 (one expert) at 4096 by less;
 * 256 (every block polls every count word) took 1.5 times as long
 * (docs/perf.md) */
#define EP_RECV_PAIRS 8

struct mep__ep_cuda {
  mep_devwin_t *win;
  const mep_dev_win_t *dwin; /* device */
  int has_proxy, has_mlx5;
  int sms;
  int early_recv;            /* receive kernels may start early (sm_90+) */
  int pull;                  /* zero-copy combines may pull (ep_cuda.h) */
  int partial_bf16;          /* MEP_EP_COMBINE_PARTIAL=bf16 (ep_cuda.h) */
  int reduce;                /* combines may reduce (ep_cuda.h): 1 by
                              * the rule, 2 always */
  int cs_resident;           /* combine send blocks the GPU holds at once */
  int dr_resident;           /* dispatch receive blocks, the same */
  void *mem;                 /* one allocation for the four below */
  mep__ep_dstate_t *st;
  int *slots;                /* [2][experts] */
  unsigned int *pair_done;   /* [local][ranks] */
  unsigned int *red_done;    /* [ranks] */
  uint64_t *seen;            /* [MEP__EP_KINDS][ranks] */
  uint8_t *comb_buf;         /* the device part's combine stage */
  mep__ep_trace_t trace;
};

int mep__ep_env_off(const char *name) {
  const char *v = getenv(name);
  return v && strcmp(v, "0") == 0;
}

static int cuda_fail(int code, cudaError_t e, const char *what, int rank) {
  return mep_set_error(code, 0, "mep_ep (CUDA path) on rank %d: %s: %s",
                       rank, what, cudaGetErrorString(e));
}

/* The state's allocation: dstate, slots, pair_done, red_done, seen. */
static int alloc_state(mep_ep_buffer_t *b, struct mep__ep_cuda *cu) {
  const mep__ep_layout_t *l = &b->lay;
  size_t o_slots = mep__ep_round16(sizeof(mep__ep_dstate_t));
  size_t o_pair =
      o_slots + mep__ep_round16(2 * (size_t)l->experts * sizeof(int));
  size_t o_red = o_pair + mep__ep_round16((size_t)l->local * l->ranks * 4);
  size_t o_seen = o_red + mep__ep_round16((size_t)l->ranks * 4);
  size_t bytes = o_seen + (size_t)MEP__EP_KINDS * l->ranks * 8;
  void *mem = NULL;
  cudaError_t e = cudaMalloc(&mem, bytes);
  if (e != cudaSuccess)
    return cuda_fail(MEP_ERR_NOMEM, e, "allocating the kernels' state",
                     b->rank);
  cu->mem = mem;
  e = cudaMemset(cu->mem, 0, bytes);
  if (e != cudaSuccess)
    return cuda_fail(MEP_ERR_SYSTEM, e, "zeroing the kernels' state",
                     b->rank);
  uint8_t *m = cu->mem;
  cu->st = (mep__ep_dstate_t *)m;
  cu->slots = (int *)(m + o_slots);
  cu->pair_done = (unsigned int *)(m + o_pair);
  cu->red_done = (unsigned int *)(m + o_red);
  cu->seen = (uint64_t *)(m + o_seen);
  return 0;
}

static int alloc_active(mep_ep_buffer_t *b) {
  size_t bytes = (size_t)b->size * sizeof(int32_t);
  int32_t *first = malloc(bytes);
  if (!first)
    return mep_set_error(MEP_ERR_NOMEM, 0, "mep_ep_buffer_create: no memory "
                         "for %d active-rank flags", b->size);
  int rc = mep__ep_initial_active(b, first);
  if (rc) {
    free(first);
    return rc;
  }
  void *dev = NULL;
  cudaError_t e = cudaMalloc(&dev, bytes);
  if (e == cudaSuccess) {
    b->active = dev;
    e = cudaMemcpy(dev, first, bytes, cudaMemcpyHostToDevice);
  }
  free(first);
  if (e != cudaSuccess)
    return cuda_fail(MEP_ERR_SYSTEM, e, "the active-rank array", b->rank);
  return 0;
}

static void free_all(mep_ep_buffer_t *b, struct mep__ep_cuda *cu) {
  if (cu->trace.host) {
    (void)cudaDeviceSynchronize(); /* the last call's stamps are in */
    mep__ep_trace_report(&cu->trace, b->rank);
  }
  if (cu->win) mep_devwin_destroy(cu->win);
  if (cu->mem) cudaFree(cu->mem);
  if (b->active) cudaFree(b->active);
  b->active = NULL;
  free(cu);
}

int mep__ep_win_has_mlx5(const mep_devwin_t *win, int size) {
  for (int p = 0; p < size; p++)
    if (mep_devwin_kind(win, p) == MEP_DEV_MLX5) return 1;
  return 0;
}

/* Reduce mode (ep_cuda.h) takes mapped and proxied peers: a proxied
 * one's sums and weights wait in the host part's combine stage, which
 * needs 3 local experts or more (layout.h). Not with MEP_DEV_MLX5 peers,
 * whose kernels post their own requests: not written for them. It
 * changes what every rank sends, so the ranks agree: the layout, the
 * environment and whether the group has a host part are alike on every
 * rank, but only a rank with a MEP_DEV_MLX5 peer knows it has one (a
 * minimum over the group, when there is a host part at all).
 * MEP_EP_COMBINE_REDUCE: 0 never, 1 always, unset by the rule in
 * mep__ep_cuda_combine. Clears cu->reduce where it cannot be. */
static int may_reduce(mep_ep_buffer_t *b, struct mep__ep_cuda *cu) {
  if (!cu->reduce || !cu->has_proxy) return 0;
  const char *no = NULL;
  if (!mep__ep_red_stage_fits(&b->lay)) {
    no = "some pair of ranks goes through the proxy, which needs 3 local "
         "experts or more";
  } else {
    int32_t mine = !cu->has_mlx5, all = 0;
    int rc = mep_allreduce(b->comm, &mine, &all, 1, MEP_INT32, MEP_MIN, NULL);
    if (rc < 0)
      return mep_set_error(rc, 1, "mep_ep_buffer_create on rank %d: "
                           "agreeing on the combine's mode", b->rank);
    if (!all) no = "some pair of ranks goes through ibgda (MEP_DEV_MLX5)";
  }
  if (!no) return 0;
  if (cu->reduce == 2 && mep_log_get_level() >= MEP_LOG_WARN)
    fprintf(stderr, "mep_ep_buffer_create on rank %d: "
            "MEP_EP_COMBINE_REDUCE=1 is ignored: %s\n", b->rank, no);
  cu->reduce = 0;
  return 0;
}

int mep__ep_cuda_create(mep_ep_buffer_t *b) {
  struct mep__ep_cuda *cu = calloc(1, sizeof *cu);
  if (!cu)
    return mep_set_error(MEP_ERR_NOMEM, 0, "mep_ep_buffer_create: no memory "
                         "for the CUDA state");
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  int major = 0;
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&cu->sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e != cudaSuccess) {
    free(cu);
    return cuda_fail(MEP_ERR_UNSUPPORTED, e, "no usable CUDA device",
                     b->rank);
  }
  if (cu->sms < 1) cu->sms = 1;
  cu->early_recv = major >= 9 && !mep__ep_env_off("MEP_EP_EARLY_RECV");
  cu->pull = !mep__ep_env_off("MEP_EP_COMBINE_PULL");
  const char *part = getenv("MEP_EP_COMBINE_PARTIAL");
  if (part && *part && strcmp(part, "float") && strcmp(part, "bf16")) {
    free(cu);
    return mep_set_error(MEP_ERR_INVALID, 0, "mep_ep_buffer_create on rank "
                         "%d: MEP_EP_COMBINE_PARTIAL=%s: expected float or "
                         "bf16", b->rank, part);
  }
  cu->partial_bf16 = part && strcmp(part, "bf16") == 0;
  cu->dr_resident =
      cu->sms * mep__ep_dispatch_recv_per_sm(EP_WARP_KERNEL_THREADS);
  int rc = mep_devwin_create(b->comm, (size_t)b->lay.total, &cu->win);
  if (rc) {
    free(cu);
    return mep_set_error(rc, 1, "mep_ep_buffer_create: the device window "
                         "of %llu bytes on rank %d",
                         (unsigned long long)b->lay.total, b->rank);
  }
  cu->dwin = mep_devwin_device(cu->win);
  cu->has_proxy = mep_devwin_host_base(cu->win) != NULL;
  cu->has_mlx5 = mep__ep_win_has_mlx5(cu->win, b->size);
  cu->cs_resident = cu->sms * mep__ep_combine_send_per_sm(
                                  EP_WARP_KERNEL_THREADS, cu->has_mlx5);
  /* Where a peer is reached through the host part, a receive kernel
   * launched early polls it over PCIe while the send kernel stages rows
   * there (for the proxy) or posts a NIC's requests (MEP_DEV_MLX5): that
   * made a combine 30 times slower over the model of the NIC
   * (docs/ibgda.md) and 1.2 to 3 times slower through the proxy over
   * tcp (docs/perf.md, "No early receive through the proxy"). No early
   * receive then. */
  if (cu->has_proxy) cu->early_recv = 0;
  const char *red = getenv("MEP_EP_COMBINE_REDUCE");
  cu->reduce = mep__ep_env_off("MEP_EP_COMBINE_REDUCE") ? 0
               : red && strcmp(red, "1") == 0  ? 2
                                               : 1;
  rc = may_reduce(b, cu);
  cu->comb_buf = (uint8_t *)mep_devwin_dev_base(cu->win) + b->lay.comb_stage;
  (void)mep__ep_trace_init(&cu->trace);
  if (!rc) rc = alloc_state(b, cu);
  if (!rc) rc = alloc_active(b);
  /* the state's memset ran on the legacy stream, which the caller's
   * non-blocking streams do not wait for */
  if (!rc && (e = cudaDeviceSynchronize()) != cudaSuccess)
    rc = cuda_fail(MEP_ERR_SYSTEM, e, "setting up the buffer", b->rank);
  if (rc) {
    free_all(b, cu);
    return rc;
  }
  b->cuda = cu;
  return 0;
}

void mep__ep_devwin_leave(mep_comm_t *comm, mep_devwin_t *win,
                          const char *fn, int rank) {
  if (!win || !mep_devwin_host_base(win)) return;
  int rc = mep_devwin_drain(win);
  mep_req_t *req = NULL;
  if (!rc) rc = mep_barrier(comm, &req);
  if (!rc && req) rc = mep_req_wait(req, mep_comm_timeout_ms(comm));
  mep_req_free(req);
  if (rc < 0 && mep_log_get_level() >= MEP_LOG_WARN)
    fprintf(stderr, "%s on rank %d: the ranks did not leave in step (%s); "
            "a peer may still send to this buffer\n", fn, rank,
            mep_last_error());
}

void mep__ep_cuda_destroy(mep_ep_buffer_t *b) {
  if (!b->cuda) return;
  mep__ep_devwin_leave(b->comm, b->cuda->win, "mep_ep_buffer_destroy",
                       b->rank);
  free_all(b, b->cuda);
  b->cuda = NULL;
}

/* The device part's combine stage: device memory the experts write
 * directly; the send kernel copies from it like from any x (to a mapped
 * peer, or to the host-part stage of a proxied one). */
void *mep__ep_cuda_combine_buffer(mep_ep_buffer_t *b) {
  return b->cuda ? b->cuda->comb_buf : NULL;
}

static int misaligned(const void *p, uintptr_t a) {
  return p && ((uintptr_t)p & (a - 1)) != 0;
}

int mep__ep_check_align(const char *fn, const char *what, const void *p,
                       uintptr_t a) {
  if (!misaligned(p, a)) return 0;
  return mep_set_error(MEP_ERR_INVALID, 0, "%s: %s (%p) is not aligned to "
                       "%u bytes, which the CUDA kernels' vector accesses "
                       "need", fn, what, p, (unsigned)a);
}

static void fill_common(mep_ep_buffer_t *b, const mep__ep_call_t *c,
                        mep__ep_kcommon_t *k) {
  k->win = b->cuda->dwin;
  k->lay = b->lay;
  k->rank = b->rank;
  k->has_proxy = b->cuda->has_proxy;
  k->has_mlx5 = b->cuda->has_mlx5;
  k->st = b->cuda->st;
  k->active = c->active;
  /* 2^62 ns is beyond any deadline that matters, and cannot overflow */
  k->early_recv = b->cuda->early_recv && c->phases == 3;
  k->trace = b->cuda->trace.dev;
  k->seen = b->cuda->seen;
  k->timeout_ns = c->timeout_us >= ((int64_t)1 << 62) / 1000
                      ? (uint64_t)1 << 62
                      : (uint64_t)c->timeout_us * 1000u;
}

/* Threads for a block that spreads `units` 16-byte units of a row. */
static int row_threads(int units) {
  int t = (units + 31) / 32 * 32;
  if (t < EP_ROW_THREADS_MIN) t = EP_ROW_THREADS_MIN;
  if (t > EP_ROW_THREADS_MAX) t = EP_ROW_THREADS_MAX;
  return t;
}

static int clampi(int v, int lo, int hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

static int launched(mep_ep_buffer_t *b, int err, const char *what) {
  if (!err) return 0;
  return cuda_fail(MEP_ERR_SYSTEM, (cudaError_t)err, what, b->rank);
}

int mep__ep_cuda_dispatch(mep_ep_buffer_t *b, const mep_ep_dispatch_args_t *a,
                          const mep__ep_call_t *c) {
  const char *fn = "mep_ep_dispatch";
  struct mep__ep_cuda *cu = b->cuda;
  const mep__ep_layout_t *l = &b->lay;
  int rc = 0;
  if (c->phases & 1)
    rc = mep__ep_check_align(fn, "x", a->x, 16);
  if (!rc && (c->phases & 2)) {
    rc = mep__ep_check_align(fn, "recv_x", a->recv_x, 16);
    if (!rc) rc = mep__ep_check_align(fn, "recv_scales", a->recv_scales, 4);
    if (!rc) rc = mep__ep_check_align(fn, "recv_src_info", a->recv_src_info, 4);
    if (!rc) rc = mep__ep_check_align(fn, "recv_layout_range", a->recv_layout_range, 8);
    if (!rc) rc = mep__ep_check_align(fn, "recv_count", a->recv_count, 4);
    if (!rc) rc = mep__ep_check_align(fn, "recv_stats", c->recv_stats, 4);
  }
  if (rc) return rc;
  mep__ep_kdisp_t k = {0};
  fill_common(b, c, &k.c);
  k.slots = cu->slots;
  k.x = a->x;
  k.topk_idx = a->topk_idx;
  k.num_tokens = a->num_tokens;
  k.num_topk = a->num_topk;
  k.fp8 = (a->flags & MEP_EP_FP8) != 0;
  k.round_scale = (a->flags & MEP_EP_ROUND_SCALE) != 0;
  k.ue8m0 = (a->flags & MEP_EP_UE8M0) != 0;
  k.recv_x = a->recv_x;
  k.recv_scales = a->recv_scales;
  k.src_info = a->recv_src_info;
  k.layout_range = a->recv_layout_range;
  k.recv_count = a->recv_count;
  k.recv_stats = c->recv_stats;
  /* send: a block per token (the last one also sends every count) */
  k.send_threads = row_threads(k.fp8 ? l->hidden / 16 : l->hidden / 8);
  k.send_blocks = clampi(a->num_tokens, 1, 4 * cu->sms);
  /* receive: groups of experts whose blocks share the rows out, as many
   * as make EP_RECV_PAIRS (expert, source) pairs, whose count words each
   * block polls (ep_dispatch_recv.cu). Enough blocks per group to fill
   * the GPU (one wave: see there), not more than one warp per (message,
   * chunk) would use. */
  int warps = EP_WARP_KERNEL_THREADS / 32;
  int g = clampi(EP_RECV_PAIRS / l->ranks, 1, l->local);
  int groups = (l->local + g - 1) / g;
  int64_t rows = (int64_t)g * l->ranks * l->tokens;
  int64_t units = k.fp8 ? l->hidden / 16 : l->hidden / 8;
  int64_t chunks = (units + MEP__EP_CHUNK_UNITS - 1) / MEP__EP_CHUNK_UNITS;
  int64_t need = (rows * chunks + warps - 1) / warps;
  int64_t split = cu->dr_resident > 0 ? cu->dr_resident / groups
                                      : (2 * cu->sms + groups - 1) / groups;
  if (split > need) split = need;
  k.recv_group = g;
  k.recv_split = clampi((int)split, 1, EP_MAX_SPLIT * g);
  k.recv_threads = EP_WARP_KERNEL_THREADS;

  if (c->phases & 1) {
    cu->trace.blocks[MEP__EP_DS] = k.send_blocks;
    rc = launched(b, mep__ep_launch_dispatch_send(&k, a->stream),
                  "mep_ep_dispatch: launching the send kernel");
    if (rc) return rc;
  }
  cu->trace.blocks[MEP__EP_DR] = k.recv_split * groups;
  if (c->phases & 2)
    rc = launched(b, mep__ep_launch_dispatch_recv(&k, a->stream),
                  "mep_ep_dispatch: launching the receive kernel");
  return rc;
}

int mep__ep_cuda_combine(mep_ep_buffer_t *b, const mep_ep_combine_args_t *a,
                         const mep__ep_call_t *c) {
  const char *fn = "mep_ep_combine";
  struct mep__ep_cuda *cu = b->cuda;
  const mep__ep_layout_t *l = &b->lay;
  const void *x = (a->flags & MEP_EP_ZERO_COPY) ? cu->comb_buf : a->x;
  int rc = 0;
  if (c->phases & 1) {
    rc = mep__ep_check_align(fn, "x", x, 16);
    if (!rc) rc = mep__ep_check_align(fn, "src_info", a->src_info, 4);
    if (!rc) rc = mep__ep_check_align(fn, "layout_range", a->layout_range, 8);
  }
  if (!rc && (c->phases & 2)) {
    rc = mep__ep_check_align(fn, "out", a->out, 16);
    if (!rc) rc = mep__ep_check_align(fn, "topk_idx", a->topk_idx, 8);
    if (!rc) rc = mep__ep_check_align(fn, "topk_weights", a->topk_weights, 4);
  }
  if (rc) return rc;
  mep__ep_kcomb_t k = {0};
  fill_common(b, c, &k.c);
  k.pair_done = cu->pair_done;
  k.red_done = cu->red_done;
  /* Reduce mode sends one float row per (token, rank) instead of one
   * bf16 row per (token, expert): half the bytes or fewer when a token
   * has more than two experts per rank on average, for one more hop (the
   * weights). It measured faster at top-8 on 2 ranks, hidden 4096 and
   * 7168 (docs/perf.md). The rule uses only what every rank's call has
   * alike (top-k, ranks). */
  k.reduce = cu->reduce == 2 || (cu->reduce && a->num_topk > 2 * l->ranks);
  /* Only a zero-copy call with both phases pulls: its rows are already
   * where peers can read them. Without zero-copy they would first be
   * copied there, which measured slower than pushing them (49.0 against
   * 46.0 us, docs/perf.md); a two-phase call's receive, in the hook, only
   * waits. */
  k.partial_bf16 = cu->partial_bf16;
  k.pull = !k.reduce && cu->pull && c->phases == 3 && x == cu->comb_buf;
  k.x = x;
  k.src_info = a->src_info;
  k.layout_range = a->layout_range;
  k.topk_idx = a->topk_idx;
  k.topk_weights = a->topk_weights;
  k.out = a->out;
  k.num_tokens = a->num_tokens;
  k.num_topk = a->num_topk;
  /* send: enough blocks per (expert, source) pair to fill the GPU twice,
   * not more than one warp per (row, chunk) of a full pair would use
   * (chunks of MEP__EP_CHUNK_UNITS 16-byte units: ep_combine_send.cu) */
  int warps = EP_WARP_KERNEL_THREADS / 32;
  int64_t pairs = (int64_t)l->local * l->ranks;
  int64_t chunks =
      (l->hidden / 8 + MEP__EP_CHUNK_UNITS - 1) / MEP__EP_CHUNK_UNITS;
  int64_t split = (2 * (int64_t)cu->sms + pairs - 1) / pairs;
  int64_t need = ((int64_t)l->tokens * chunks + warps - 1) / warps;
  if (split > need) split = need;
  /* one wave: a block ends only once its remote stores are acknowledged
   * (the fence before its signal), so blocks of a second wave would
   * start late and leave the link idle meanwhile */
  if (cu->cs_resident > 0 && split * pairs > cu->cs_resident)
    split = cu->cs_resident / pairs;
  k.send_split = clampi((int)split, 1, EP_MAX_SPLIT);
  k.send_threads = EP_WARP_KERNEL_THREADS;
  /* receive: a block per token */
  k.recv_threads = row_threads(l->hidden / 8);
  k.recv_blocks = clampi(a->num_tokens, 1, 4 * cu->sms);
  int send_blocks = k.send_split * l->local * l->ranks;
  if (k.reduce) {
    /* a block per token of a source, as many as fill the GPU twice */
    k.send_split = clampi((2 * cu->sms + l->ranks - 1) / l->ranks, 1,
                          l->tokens);
    send_blocks = k.send_split * l->ranks;
  }

  if (c->phases & 1) {
    cu->trace.blocks[MEP__EP_CS] = send_blocks;
    rc = launched(b, k.reduce ? mep__ep_launch_reduce_send(&k, a->stream)
                              : mep__ep_launch_combine_send(&k, a->stream),
                  "mep_ep_combine: launching the send kernel");
    if (rc) return rc;
  }
  cu->trace.blocks[MEP__EP_CR] = k.recv_blocks;
  if (c->phases & 2)
    rc = launched(b, k.reduce ? mep__ep_launch_reduce_recv(&k, a->stream)
                              : mep__ep_launch_combine_recv(&k, a->stream),
                  "mep_ep_combine: launching the receive kernel");
  return rc;
}
